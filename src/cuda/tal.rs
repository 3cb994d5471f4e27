//! Launches of the dense TAL target kernels (`kernels/tal.cu`) for
//! [`crate::loss::tal_loss`]: the dense per-anchor targets are built on the device from the
//! foreground rows, so only those rows (a few thousand) cross from the host instead of several
//! `(B, A)` arrays.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/tal.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/tal.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_tal";

fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `fg` (nfg, 11) and `anc` (A, 2) f32, contiguous → the (10, B, A) planes described in
/// `kernels/tal.cu`.
pub fn dense_targets(
    fg: (&CudaStorage, &Layout),
    anc: (&CudaStorage, &Layout),
    batch: usize,
) -> Result<(CudaStorage, Shape)> {
    let bad = |what: &str| Error::Msg(format!("dense targets (CUDA): {what}"));
    if fg.0.dtype() != DType::F32 || anc.0.dtype() != DType::F32 {
        return Err(bad("inputs must be f32"));
    }
    let (fa, fb) =
        fg.1.contiguous_offsets()
            .ok_or_else(|| bad("fg not contiguous"))?;
    let (aa, ab) = anc
        .1
        .contiguous_offsets()
        .ok_or_else(|| bad("anchors not contiguous"))?;
    let nfg = (fb - fa) / 11;
    let na = (ab - aa) / 2;
    let ba = batch * na;
    let dev = fg.0.device().clone();
    let mut out = unsafe { dev.alloc::<f32>(10 * ba)? };
    let anc_v = anc.0.as_cuda_slice::<f32>()?.slice(aa..ab);
    let (na_, ba_) = (na as i32, ba as i64);
    let f = dev.get_or_load_custom_func("tal_dense_init", MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&anc_v).arg(&mut out).arg(&na_).arg(&ba_);
    unsafe { b.launch(cfg(ba)) }.w()?;
    if nfg > 0 {
        let fg_v = fg.0.as_cuda_slice::<f32>()?.slice(fa..fb);
        let nfg_ = nfg as i32;
        let f = dev.get_or_load_custom_func("tal_dense_fg", MODULE, PTX)?;
        let mut b = f.builder();
        b.arg(&fg_v).arg(&mut out).arg(&nfg_).arg(&ba_);
        unsafe { b.launch(cfg(nfg)) }.w()?;
    }
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((10, batch, na)),
    ))
}
