//! Launches of the pooling kernels (`kernels/pool.cu`) for the candle ops of
//! [`crate::model::pool`]: SPPELAN's `MaxPool2d(k, 1, k/2)` forward and backward on contiguous
//! NCHW f32 or bf16 tensors (forward also f16), one launch forward and two backward (the window
//! argmax, then the gather of the output gradients), where the composite of candle ops took
//! about 170 launches per pool with its backward; and the inference forms: the same max pool on
//! channels-last tensors and ADown's `avg_pool2d(2, 1)` on NCHW and channels-last tensors
//! (f32, f16, bf16), one launch each.

use crate::op_args::{geometry, InferPool};
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

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{what} = {v} does not fit in i32")))
}

fn suffix(d: DType) -> Result<&'static str> {
    super::kernel_suffix(d)
        .ok_or_else(|| err(format!("dtype {d:?}; f32, f16 and bf16 are supported")))
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
        DType::F16 => forward_t::<half::f16>(s, l, k),
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
        DType::F32 => backward_t::<f32>((sx, lx), (sd, ld), k),
        d => Err(err(format!(
            "backward in {d:?}; f32 and bf16 are supported"
        ))),
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

/// Runs the inference pool `p` on the contiguous `x` (f32, f16 or bf16).
pub fn infer(s: &CudaStorage, l: &Layout, p: InferPool) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::F32 => infer_t::<f32>(s, l, p),
        DType::F16 => infer_t::<half::f16>(s, l, p),
        DType::BF16 => infer_t::<half::bf16>(s, l, p),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn infer_t<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    l: &Layout,
    p: InferPool,
) -> Result<(CudaStorage, Shape)> {
    let suf = suffix(s.dtype())?;
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| err("x is not contiguous"))?;
    let (d0, d1, d2, d3) = l.shape().dims4()?;
    let dev = s.device().clone();
    let x = s.as_cuda_slice::<T>()?.slice(a..b);
    let (shape, name) = match p {
        InferPool::MaxSameNhwc(k) => {
            if k == 0 || k.is_multiple_of(2) || k > 15 {
                return Err(err(format!("kernel {k} must be odd and at most 15")));
            }
            (l.shape().clone(), "maxpool_same_nhwc_fwd")
        }
        InferPool::Avg2Nchw | InferPool::Avg2Nhwc => {
            let (h, w) = if p == InferPool::Avg2Nchw {
                (d2, d3)
            } else {
                (d1, d2)
            };
            if h < 2 || w < 2 {
                return Err(err(format!(
                    "avg pool 2x2: input {h}x{w} is smaller than the window"
                )));
            }
            let shape = if p == InferPool::Avg2Nchw {
                Shape::from((d0, d1, d2 - 1, d3 - 1))
            } else {
                Shape::from((d0, d1 - 1, d2 - 1, d3))
            };
            let name = if p == InferPool::Avg2Nchw {
                "avgpool2_nchw"
            } else {
                "avgpool2_nhwc"
            };
            (shape, name)
        }
    };
    let total = shape.elem_count();
    // SAFETY: every element is written by the kernel before it is read.
    let mut y = unsafe { dev.alloc::<T>(total)? };
    if total == 0 {
        return Ok((CudaStorage::wrap_cuda_slice(y, dev), shape));
    }
    let f = dev.get_or_load_custom_func(&format!("{name}_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&x).arg(&mut y);
    let total_ = total as i64;
    let planes = (d0 * d1) as i64;
    let (h1, h2, h3) = (
        i32_of(d1, "dim 1")?,
        i32_of(d2, "dim 2")?,
        i32_of(d3, "dim 3")?,
    );
    let k_ = match p {
        InferPool::MaxSameNhwc(k) => k as i32,
        _ => 0,
    };
    match p {
        // (total, H, W, C, k)
        InferPool::MaxSameNhwc(_) => {
            bld.arg(&total_).arg(&h1).arg(&h2).arg(&h3).arg(&k_);
        }
        // (planes, H, W)
        InferPool::Avg2Nchw => {
            bld.arg(&planes).arg(&h2).arg(&h3);
        }
        // (total out, H, W, C)
        InferPool::Avg2Nhwc => {
            bld.arg(&total_).arg(&h1).arg(&h2).arg(&h3);
        }
    }
    // The channels-last pools run on 16-byte vectors where the channels allow (the kernels check
    // again and fall back to elements; their loops stride over the grid).
    let per_thread = match p {
        InferPool::Avg2Nhwc | InferPool::MaxSameNhwc(_)
            if d3.is_multiple_of(16 / std::mem::size_of::<T>()) =>
        {
            16 / std::mem::size_of::<T>()
        }
        _ => 1,
    };
    // SAFETY: x holds the input's elements, y the output's; the arguments match the kernel.
    unsafe { bld.launch(cfg(total.div_ceil(per_thread))) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), shape))
}

/// The input gradient of `avg_pool2d(2, stride 1)` on NCHW: the contiguous `dy` (N, C, H−1, W−1)
/// (f32, f16 or bf16) → `dx` (N, C, H, W), each output gradient spread as a quarter over its 2×2
/// window (`avgpool2_bwd_nchw` in `kernels/pool.cu`).
pub fn avg2_backward(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::F32 => avg2_backward_t::<f32>(s, l),
        DType::F16 => avg2_backward_t::<half::f16>(s, l),
        DType::BF16 => avg2_backward_t::<half::bf16>(s, l),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn avg2_backward_t<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    l: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let suf = suffix(s.dtype())?;
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| err("dy is not contiguous"))?;
    let (n, c, ho, wo) = l.shape().dims4()?;
    let (h, w) = (ho + 1, wo + 1);
    let (h_, w_) = (i32_of(h, "H")?, i32_of(w, "W")?);
    let dev = s.device().clone();
    let dy = s.as_cuda_slice::<T>()?.slice(a..b);
    let total = n * c * h * w;
    let shape = Shape::from((n, c, h, w));
    // SAFETY: every element is written by the kernel before it is read.
    let mut dx = unsafe { dev.alloc::<T>(total)? };
    if total == 0 {
        return Ok((CudaStorage::wrap_cuda_slice(dx, dev), shape));
    }
    let planes = (n * c) as i64;
    let f = dev.get_or_load_custom_func(&format!("avgpool2_bwd_nchw_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&dy).arg(&mut dx).arg(&planes).arg(&h_).arg(&w_);
    // SAFETY: dy holds the gradient's elements, dx the input's; the arguments match the kernel.
    unsafe { bld.launch(cfg(total)) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(dx, dev), shape))
}
