//! Launch of the element-wise arctangent (`kernels/atan.cu`) for
//! [`crate::loss::iou::atan_with_grad`]: candle has no `atan`, and computing it on the host
//! would copy every predicted box's aspect ratio to the host and back in each loss evaluation.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/atan.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/atan.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_atan";

/// `atan(x)` of a contiguous f32 or f64 CUDA tensor (f64 arithmetic, rounded to the dtype).
pub fn atan(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let range = l
        .contiguous_offsets()
        .ok_or_else(|| Error::Msg("atan (CUDA): input is not contiguous".into()))?;
    let out = match s.dtype() {
        DType::F32 => launch::<f32>(s, range, "atan_f32")?,
        DType::F64 => launch::<f64>(s, range, "atan_f64")?,
        d => {
            return Err(Error::Msg(format!(
                "atan (CUDA): dtype {d:?}; f32 and f64 are supported"
            )))
        }
    };
    Ok((out, l.shape().clone()))
}

/// Runs kernel `name` over the elements `a..b` of `s` (element type `T`) into a new buffer.
fn launch<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    (a, b): (usize, usize),
    name: &str,
) -> Result<CudaStorage> {
    let dev = s.device().clone();
    let n = b - a;
    let x = s.as_cuda_slice::<T>()?.slice(a..b);
    let mut y = unsafe { dev.alloc::<T>(n)? };
    let n_ = n as i64;
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let f = dev.get_or_load_custom_func(name, MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&x).arg(&mut y).arg(&n_);
    unsafe { bld.launch(cfg) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(y, dev))
}
