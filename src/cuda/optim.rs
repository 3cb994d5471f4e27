//! Multi-tensor launches of the optimizer kernels (`kernels/optim.cu`): one kernel launch updates
//! every parameter tensor of the model, instead of several candle ops per tensor (about 900
//! tensors for YOLOv9-s, i.e. thousands of launches and allocations per optimizer step).
//!
//! Each call builds a chunk table on the host (tensor index and start of each block of
//! [`CHUNK`] elements), uploads it with the tensors' device addresses, and launches one block
//! per chunk. Tensors must be contiguous f32 CUDA tensors on one device; the kernels write the
//! storage of the tensors named as outputs in place, so callers must own those storages (no other
//! tensor may share them). Used by [`crate::train::optimizer::Sgd`] and
//! [`crate::train::ema::Ema`] when their tensors live on a CUDA device; the CPU path runs the
//! same arithmetic as candle ops.

use candle_core::backend::BackendDevice;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DevicePtr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, DType, Device, Error, Result, Storage, Tensor};

/// The PTX of `kernels/optim.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/optim.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_optim";
/// Threads per block (must equal `BLOCK` in the .cu file).
const BLOCK: u32 = 256;
/// Elements per block.
pub const CHUNK: usize = 32 * 1024;

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("optimizer (CUDA): {msg}"))
}

/// True when every tensor is a contiguous f32 tensor on one CUDA device (the fused path applies).
pub fn applies(ts: &[&Tensor]) -> bool {
    let Some(first) = ts.first() else {
        return false;
    };
    let Device::Cuda(d0) = first.device() else {
        return false;
    };
    ts.iter().all(|t| {
        t.dtype() == DType::F32
            && t.is_contiguous()
            && matches!(t.device(), Device::Cuda(d) if d.same_device(d0))
    })
}

fn cuda_dev(t: &Tensor) -> Result<CudaDevice> {
    match t.device() {
        Device::Cuda(d) => Ok(d.clone()),
        d => Err(err(format!("tensor on {d:?}, expected a CUDA device"))),
    }
}

/// Device address of the first element of a contiguous f32 CUDA tensor.
pub(crate) fn address(t: &Tensor, dev: &CudaDevice) -> Result<u64> {
    if t.dtype() != DType::F32 || !t.is_contiguous() {
        return Err(err(format!(
            "expected a contiguous f32 tensor, got {:?} (contiguous: {})",
            t.dtype(),
            t.is_contiguous()
        )));
    }
    let (st, l) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else {
        return Err(err("tensor is not on a CUDA device"));
    };
    let s = cs.as_cuda_slice::<f32>()?;
    let stream = dev.cuda_stream();
    let (ptr, _sync) = s.device_ptr(&stream);
    Ok(ptr + (l.start_offset() * std::mem::size_of::<f32>()) as u64)
}

/// The uploaded tables of one launch: per tensor sizes, and the chunk table.
struct Tables {
    sizes: CudaSlice<i64>,
    chunk_t: CudaSlice<i64>,
    chunk_s: CudaSlice<i64>,
    chunks: usize,
    /// [`CHUNK`], as the kernels take it.
    chunk: i64,
}

/// The device and the tables of a launch over `ts` (the tensors the chunk table walks); `None`
/// when there is nothing to do (no tensors, or only empty ones).
fn plan(ts: &[&Tensor]) -> Result<Option<(CudaDevice, Tables)>> {
    let Some(first) = ts.first() else {
        return Ok(None);
    };
    let dev = cuda_dev(first)?;
    let sizes: Vec<usize> = ts.iter().map(|t| t.elem_count()).collect();
    let tb = tables(&dev, &sizes)?;
    Ok((tb.chunks > 0).then_some((dev, tb)))
}

fn tables(dev: &CudaDevice, sizes: &[usize]) -> Result<Tables> {
    let mut chunk_t = Vec::new();
    let mut chunk_s = Vec::new();
    for (t, &n) in sizes.iter().enumerate() {
        let mut s = 0;
        while s < n {
            chunk_t.push(t as i64);
            chunk_s.push(s as i64);
            s += CHUNK;
        }
    }
    let sz: Vec<i64> = sizes.iter().map(|&n| n as i64).collect();
    Ok(Tables {
        sizes: dev.clone_htod(&sz)?,
        chunks: chunk_t.len(),
        chunk_t: dev.clone_htod(&chunk_t)?,
        chunk_s: dev.clone_htod(&chunk_s)?,
        chunk: CHUNK as i64,
    })
}

fn cfg(chunks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (chunks as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The device addresses of `ts`, uploaded (the kernels' pointer table).
fn addresses(dev: &CudaDevice, ts: &[&Tensor]) -> Result<CudaSlice<u64>> {
    let a: Vec<u64> = ts.iter().map(|t| address(t, dev)).collect::<Result<_>>()?;
    dev.clone_htod(&a)
}

/// Sum of the squares of all elements of `ts`, accumulated in f64 in a fixed order (the same
/// value on every run). One kernel launch and one small read-back.
pub fn sum_squares(ts: &[&Tensor]) -> Result<f64> {
    let Some((dev, tb)) = plan(ts)? else {
        return Ok(0.0);
    };
    let ptrs = addresses(&dev, ts)?;
    let mut partials = dev.alloc_zeros::<f64>(tb.chunks)?;
    let f = dev.get_or_load_custom_func("mt_sumsq_f32", MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&ptrs)
        .arg(&tb.sizes)
        .arg(&tb.chunk_t)
        .arg(&tb.chunk_s)
        .arg(&tb.chunk)
        .arg(&mut partials);
    unsafe { b.launch(cfg(tb.chunks)) }.w()?;
    let host = dev.clone_dtoh(&partials)?;
    Ok(host.iter().sum())
}

/// Whether the training step copies and sums its parameter gradients with [`sum_new`]
/// (`YOLO9_FUSED_GRADS`, default on; `0`: one candle op per tensor, for comparisons).
pub fn fused_grads() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::switches::off("YOLO9_FUSED_GRADS"))
}

/// For every tensor `i`: `b[i]` (`a` = `None`) or `a[i] + b[i]`, written into one new flat f32
/// buffer on `b`'s device; returns a view of it per tensor, shaped as `b[i]`. One allocation,
/// one memset and one launch for the whole list, instead of one copy or add per tensor (the
/// gradient accumulation of a training step: ~900 tensors for YOLOv9-s, several times a batch).
/// The sums are rounded as candle's add. Errors: lists of different lengths or sizes, a tensor
/// that is not a contiguous f32 CUDA tensor.
pub fn sum_new(a: Option<&[&Tensor]>, b: &[&Tensor]) -> Result<Vec<Tensor>> {
    if let Some(a) = a {
        if a.len() != b.len()
            || a.iter()
                .zip(b)
                .any(|(x, y)| x.elem_count() != y.elem_count())
        {
            return Err(err("sum: lists of different lengths or sizes"));
        }
    }
    let Some(first) = b.first() else {
        return Ok(Vec::new());
    };
    if !applies(b) || a.is_some_and(|a| !applies(a)) {
        return Err(err("sum: an addend is not a contiguous f32 CUDA tensor"));
    }
    let total: usize = b.iter().map(|t| t.elem_count()).sum();
    let flat = Tensor::zeros(total, DType::F32, first.device())?;
    let mut out = Vec::with_capacity(b.len());
    let mut off = 0;
    for t in b {
        let n = t.elem_count();
        out.push(flat.narrow(0, off, n)?.reshape(t.shape())?);
        off += n;
    }
    let Some((dev, tb)) = plan(b)? else {
        return Ok(out);
    };
    let outs: Vec<&Tensor> = out.iter().collect();
    let (op, bp) = (addresses(&dev, &outs)?, addresses(&dev, b)?);
    let ap = a.map(|a| addresses(&dev, a)).transpose()?;
    let f = dev.get_or_load_custom_func("mt_add_f32", MODULE, PTX)?;
    let mut l = f.builder();
    let null: u64 = 0;
    l.arg(&op);
    match &ap {
        Some(ap) => l.arg(ap),
        None => l.arg(&null),
    };
    l.arg(&bp)
        .arg(&tb.sizes)
        .arg(&tb.chunk_t)
        .arg(&tb.chunk_s)
        .arg(&tb.chunk);
    unsafe { l.launch(cfg(tb.chunks)) }.w()?;
    Ok(out)
}

/// In place: every tensor of `ts` times `scale` (f32).
pub fn scale(ts: &[&Tensor], scale: f32) -> Result<()> {
    let Some((dev, tb)) = plan(ts)? else {
        return Ok(());
    };
    let ptrs = addresses(&dev, ts)?;
    let f = dev.get_or_load_custom_func("mt_scale_f32", MODULE, PTX)?;
    let mut b = f.builder();
    b.arg(&ptrs)
        .arg(&tb.sizes)
        .arg(&tb.chunk_t)
        .arg(&tb.chunk_s)
        .arg(&tb.chunk)
        .arg(&scale);
    unsafe { b.launch(cfg(tb.chunks)) }.w()?;
    Ok(())
}

/// In place, for every tensor `i`: SGD with Nesterov momentum (see `kernels/optim.cu`), weights
/// `w[i]` and momentum buffers `b[i]` updated from gradients `g[i]` with learning rate `lr[i]`
/// and weight decay `wd[i]`. All three lists have the same length and matching shapes.
pub fn sgd_nesterov(
    w: &[&Tensor],
    b: &[&Tensor],
    g: &[&Tensor],
    lr: &[f32],
    wd: &[f32],
    momentum: f32,
) -> Result<()> {
    let n = w.len();
    if b.len() != n || g.len() != n || lr.len() != n || wd.len() != n {
        return Err(err("sgd: lists of different lengths"));
    }
    for i in 0..n {
        if w[i].elem_count() != b[i].elem_count() || w[i].elem_count() != g[i].elem_count() {
            return Err(err(format!(
                "sgd: tensor {i}: weight {:?}, buffer {:?}, gradient {:?}",
                w[i].dims(),
                b[i].dims(),
                g[i].dims()
            )));
        }
    }
    let Some((dev, tb)) = plan(w)? else {
        return Ok(());
    };
    let (wp, bp, gp) = (
        addresses(&dev, w)?,
        addresses(&dev, b)?,
        addresses(&dev, g)?,
    );
    let lr_d = dev.clone_htod(lr)?;
    let wd_d = dev.clone_htod(wd)?;
    let f = dev.get_or_load_custom_func("mt_sgd_f32", MODULE, PTX)?;
    let mut l = f.builder();
    l.arg(&wp)
        .arg(&bp)
        .arg(&gp)
        .arg(&tb.sizes)
        .arg(&lr_d)
        .arg(&wd_d)
        .arg(&tb.chunk_t)
        .arg(&tb.chunk_s)
        .arg(&tb.chunk)
        .arg(&momentum);
    unsafe { l.launch(cfg(tb.chunks)) }.w()?;
    Ok(())
}

/// In place, for every tensor `i`: `e[i] = d * e[i] + one_minus_d * m[i]`.
pub fn ema(e: &[&Tensor], m: &[&Tensor], d: f32, one_minus_d: f32) -> Result<()> {
    if e.len() != m.len() {
        return Err(err("ema: lists of different lengths"));
    }
    for (i, (a, b)) in e.iter().zip(m).enumerate() {
        if a.elem_count() != b.elem_count() {
            return Err(err(format!(
                "ema: tensor {i}: {:?} vs {:?}",
                a.dims(),
                b.dims()
            )));
        }
    }
    let Some((dev, tb)) = plan(e)? else {
        return Ok(());
    };
    let (ep, mp) = (addresses(&dev, e)?, addresses(&dev, m)?);
    let f = dev.get_or_load_custom_func("mt_ema_f32", MODULE, PTX)?;
    let mut l = f.builder();
    l.arg(&ep)
        .arg(&mp)
        .arg(&tb.sizes)
        .arg(&tb.chunk_t)
        .arg(&tb.chunk_s)
        .arg(&tb.chunk)
        .arg(&d)
        .arg(&one_minus_d);
    unsafe { l.launch(cfg(tb.chunks)) }.w()?;
    Ok(())
}
