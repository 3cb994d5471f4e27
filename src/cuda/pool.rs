//! Launches of the SPPELAN max-pool kernels (`kernels/pool.cu`) for the candle ops of
//! [`crate::model::pool`]: `MaxPool2d(k, 1, k/2)` forward and backward on contiguous NCHW f32 or
//! bf16 tensors, one launch forward and two backward (the window argmax, then the gather of the
//! output gradients), where the composite of candle ops took about 170 launches per pool with
//! its backward.

use crate::op_args::geometry;
use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/pool.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/pool.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_pool";

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("max pool (CUDA): {msg}"))
}

fn cfg(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (total.div_ceil(256).clamp(1, 65_535 * 8) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn suffix(d: DType) -> Result<&'static str> {
    match d {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        d => Err(err(format!("dtype {d:?}; f32 and bf16 are supported"))),
    }
}

/// (planes, H, W) of a contiguous NCHW layout, checked to fit the kernels' ints.
fn dims(l: &Layout, k: usize) -> Result<(usize, i32, i32, (usize, usize))> {
    let ((n, c, hw), r) = geometry(l, "x")?;
    let (_, _, h, w) = l.shape().dims4()?;
    if k == 0 || k.is_multiple_of(2) || k * k > 255 || h * w != hw {
        return Err(err(format!("kernel {k} must be odd and at most 15")));
    }
    let h = i32::try_from(h).map_err(|_| err("H does not fit in i32"))?;
    let w = i32::try_from(w).map_err(|_| err("W does not fit in i32"))?;
    Ok((n * c, h, w, r))
}

/// `y = MaxPool2d(k, 1, k/2)(x)`.
pub fn forward(s: &CudaStorage, l: &Layout, k: usize) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::BF16 => forward_t::<half::bf16>(s, l, k),
        _ => forward_t::<f32>(s, l, k),
    }
}

fn forward_t<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    l: &Layout,
    k: usize,
) -> Result<(CudaStorage, Shape)> {
    let suf = suffix(s.dtype())?;
    let (planes, h, w, (a, b)) = dims(l, k)?;
    let dev = s.device().clone();
    let x = s.as_cuda_slice::<T>()?.slice(a..b);
    let total = b - a;
    let mut y = unsafe { dev.alloc::<T>(total)? };
    let (planes_, k_) = (planes as i64, k as i32);
    let f = dev.get_or_load_custom_func(&format!("maxpool_same_fwd_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&x)
        .arg(&mut y)
        .arg(&planes_)
        .arg(&h)
        .arg(&w)
        .arg(&k_);
    unsafe { bld.launch(cfg(total)) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), l.shape().clone()))
}

/// `dx` of `MaxPool2d(k, 1, k/2)` at `x` for the output gradient `dy` (same shape and dtype).
pub fn backward(
    (sx, lx): (&CudaStorage, &Layout),
    (sd, ld): (&CudaStorage, &Layout),
    k: usize,
) -> Result<(CudaStorage, Shape)> {
    if lx.shape() != ld.shape() || sx.dtype() != sd.dtype() {
        return Err(err("x and dy differ in shape or dtype"));
    }
    match sx.dtype() {
        DType::BF16 => backward_t::<half::bf16>((sx, lx), (sd, ld), k),
        _ => backward_t::<f32>((sx, lx), (sd, ld), k),
    }
}

fn backward_t<T: CudaDType + DeviceRepr>(
    (sx, lx): (&CudaStorage, &Layout),
    (sd, ld): (&CudaStorage, &Layout),
    k: usize,
) -> Result<(CudaStorage, Shape)> {
    let suf = suffix(sx.dtype())?;
    let (planes, h, w, (a, b)) = dims(lx, k)?;
    let (_, _, _, (da, db)) = dims(ld, k)?;
    let dev = sx.device().clone();
    let x = sx.as_cuda_slice::<T>()?.slice(a..b);
    let dy = sd.as_cuda_slice::<T>()?.slice(da..db);
    let total = b - a;
    let mut arg = unsafe { dev.alloc::<u8>(total)? };
    let mut dx = unsafe { dev.alloc::<T>(total)? };
    let (planes_, k_) = (planes as i64, k as i32);
    let f = dev.get_or_load_custom_func(&format!("maxpool_same_arg_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&x)
        .arg(&mut arg)
        .arg(&planes_)
        .arg(&h)
        .arg(&w)
        .arg(&k_);
    unsafe { bld.launch(cfg(total)) }.w()?;
    let f = dev.get_or_load_custom_func(&format!("maxpool_same_bwd_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&arg)
        .arg(&dy)
        .arg(&mut dx)
        .arg(&planes_)
        .arg(&h)
        .arg(&w)
        .arg(&k_);
    unsafe { bld.launch(cfg(total)) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(dx, dev), lx.shape().clone()))
}
