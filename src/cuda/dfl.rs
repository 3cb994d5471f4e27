//! CUDA launch of the detection head's DFL expectation (`kernels/dfl.cu`) for
//! [`crate::model::head::dfl`]: logits (B, 64, A) of f32, f16 or bf16, any strides (a narrow of
//! the concatenated head output is read in place) → distances (B, 4, A), contiguous, same dtype.
//! One launch where the composite (softmax, multiply by the bins, sum) took about a dozen,
//! among them a 16-wide max reduction over every anchor.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/dfl.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/dfl.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_dfl";
/// Bins per box side (the kernel's `BINS`).
pub const BINS: usize = 16;

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("dfl (CUDA): {msg}"))
}

/// Distances (B, 4, A) of the logits `x` (B, 4·[`BINS`], A).
pub fn dfl(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::F32 => run::<f32>(s, l, "f32"),
        DType::F16 => run::<half::f16>(s, l, "f16"),
        DType::BF16 => run::<half::bf16>(s, l, "bf16"),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn run<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    l: &Layout,
    suf: &str,
) -> Result<(CudaStorage, Shape)> {
    let (b, c, a) = l.shape().dims3()?;
    if c != 4 * BINS {
        return Err(err(format!("expected {} channels, got {c}", 4 * BINS)));
    }
    let st = l.stride();
    let x = s.as_cuda_slice::<T>()?.slice(l.start_offset()..);
    let dev = s.device().clone();
    let total = b * 4 * a;
    // SAFETY: every element is written by the kernel before it is read.
    let mut y = unsafe { dev.alloc::<T>(total)? };
    let shape = Shape::from((b, 4, a));
    if total == 0 {
        return Ok((CudaStorage::wrap_cuda_slice(y, dev), shape));
    }
    let a_ = i32::try_from(a).map_err(|_| err("A does not fit in i32"))?;
    let (total_, sb, sc, sa) = (total as i64, st[0] as i64, st[1] as i64, st[2] as i64);
    let f = dev.get_or_load_custom_func(&format!("dfl_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&x)
        .arg(&mut y)
        .arg(&total_)
        .arg(&a_)
        .arg(&sb)
        .arg(&sc)
        .arg(&sa);
    let cfg = LaunchConfig {
        grid_dim: (total.div_ceil(256).min(65_535 * 8) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the view starts at the layout's offset and every element the strides reach lies
    // in the storage (candle's layout invariant); y holds `total` elements.
    unsafe { bld.launch(cfg) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), shape))
}
