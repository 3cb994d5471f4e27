//! CUDA launch of the batched NMS kernel (`kernels/nms.cu`) for the candle op
//! [`crate::detect::device_nms::BatchNms`]: every image of a `(B, 4+nc, A)` f32 output in one
//! launch, one thread block per image, writing `(B, 1 + max_det*7)` f32 (the kept count, then
//! rows `[x1, y1, x2, y2, conf, cls, anchor]`).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/nms.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/nms.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_nms";
/// Threads per block (`NMS_THREADS` in the kernel).
const THREADS: u32 = 1024;

/// The options the kernel takes (already resolved by the op: multi-label only when nc > 1, the
/// class filter as one flag per class).
#[derive(Debug, Clone)]
pub struct NmsArgs {
    /// Candidates need a score strictly above this.
    pub conf: f32,
    /// Suppress when IoU (f32, compared in f64) is strictly above this.
    pub iou: f64,
    /// One candidate per class above `conf` (else the best class only).
    pub multi_label: bool,
    /// No class offset: boxes of all classes suppress each other.
    pub agnostic: bool,
    /// Rows 0..4 are already `x1, y1, x2, y2` (else `cx, cy, w, h`).
    pub xyxy: bool,
    /// Kept rows per image at most (≥ 1).
    pub max_det: usize,
    /// The `max_nms` cut: candidates kept for NMS, best first.
    pub max_nms: usize,
    /// `nc` flags: 1 where the class may be kept.
    pub class_ok: Vec<u8>,
}

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("NMS (CUDA): {msg}"))
}

/// Runs the kernel on `pred` `(B, 4+nc, A)` f32 (contiguous).
pub fn nms(s: &CudaStorage, l: &Layout, a: &NmsArgs) -> Result<(CudaStorage, Shape)> {
    if s.dtype() != DType::F32 {
        return Err(err(format!(
            "dtype {:?}; the output must be f32",
            s.dtype()
        )));
    }
    let (b, rows, anchors) = l.shape().dims3()?;
    let nc = rows
        .checked_sub(4)
        .filter(|&n| n >= 1)
        .ok_or_else(|| err(format!("{rows} rows: 4 box rows and at least one class")))?;
    if a.class_ok.len() != nc || a.max_det == 0 || a.max_nms == 0 {
        return Err(err("class flags, max_det or max_nms out of range"));
    }
    // Keys hold j*nc + c in 32 bits; anchors travel as f32 (exact below 2^24).
    if anchors
        .checked_mul(nc)
        .is_none_or(|v| v >= u32::MAX as usize)
        || anchors >= 1 << 24
    {
        return Err(err(format!(
            "{anchors} anchors x {nc} classes is too large"
        )));
    }
    let (o0, o1) = l
        .contiguous_offsets()
        .ok_or_else(|| err("the output is not contiguous"))?;
    let dev = s.device().clone();
    let out_w = 1 + a.max_det * 7;
    let cap = anchors * if a.multi_label { nc } else { 1 };
    let kmax = cap.min(a.max_nms).max(1);
    // SAFETY: the kernel writes every key and row slot before reading it, and the count and the
    // kept rows of each image; the host reads only rows below the count.
    let mut keys = unsafe { dev.alloc::<u64>(b * cap.max(1))? };
    let mut det = unsafe { dev.alloc::<f32>(b * kmax * 12)? };
    let mut out = unsafe { dev.alloc::<f32>(b * out_w)? };
    if b == 0 {
        return Ok((
            CudaStorage::wrap_cuda_slice(out, dev),
            Shape::from((0, out_w)),
        ));
    }
    let pred = s.as_cuda_slice::<f32>()?.slice(o0..o1);
    let flags = dev.clone_htod(&a.class_ok)?;
    let f = dev.get_or_load_custom_func("nms_batched", MODULE, PTX)?;
    let to_i32 = |v: usize, what: &str| {
        i32::try_from(v).map_err(|_| err(format!("{what} = {v} does not fit in i32")))
    };
    let (nc_, a_, cap_, kmax_) = (
        to_i32(nc, "nc")?,
        to_i32(anchors, "anchors")?,
        cap as i64,
        to_i32(kmax, "max_nms")?,
    );
    let (multi, agn, xyxy, md) = (
        i32::from(a.multi_label),
        i32::from(a.agnostic),
        i32::from(a.xyxy),
        to_i32(a.max_det, "max_det")?,
    );
    let mut bld = f.builder();
    bld.arg(&pred)
        .arg(&mut keys)
        .arg(&mut det)
        .arg(&mut out)
        .arg(&flags)
        .arg(&nc_)
        .arg(&a_)
        .arg(&cap_)
        .arg(&kmax_)
        .arg(&a.conf)
        .arg(&a.iou)
        .arg(&multi)
        .arg(&agn)
        .arg(&xyxy)
        .arg(&md);
    let cfg = LaunchConfig {
        grid_dim: (to_i32(b, "batch")? as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: argument types and order match `nms_batched`; the buffers have the sizes above.
    unsafe { bld.launch(cfg) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(out, dev),
        Shape::from((b, out_w)),
    ))
}
