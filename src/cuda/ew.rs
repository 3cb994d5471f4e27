//! CUDA launches of the row-strided element-wise kernels (`kernels/ew.cu`) for the candle ops of
//! [`crate::model::ew`]: `a + b` and a contiguous copy, where each operand is `rows` rows of
//! `len` contiguous elements `stride` apart (a contiguous tensor, or a channel slice of one).
//! f32, f16 and bf16; the output is a new contiguous tensor of the operands' shape.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{
    CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Result, Shape};

/// The PTX of `kernels/ew.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/ew.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_ew";
/// Threads per block.
const BLOCK: u32 = 256;
/// Elements per thread the grid is sized for (one 16-byte vector of bf16).
const PER_THREAD: usize = 8;

/// One operand: its storage and its row layout (see [`crate::op_args::Rows`]).
pub type Operand<'a> = (&'a CudaStorage, crate::op_args::Rows);

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("ew (CUDA): {msg}"))
}

/// The elements an operand's rows span, from its first element.
fn view<'a, T: CudaDType>((s, r): Operand<'a>, rows: usize, len: usize) -> Result<CudaView<'a, T>> {
    let span = if rows == 0 {
        0
    } else {
        (rows - 1) * r.stride + len
    };
    s.as_cuda_slice::<T>()?
        .try_slice(r.start..r.start + span)
        .ok_or_else(|| err("storage is shorter than its layout"))
}

fn cfg(rows: usize, len: usize) -> LaunchConfig {
    let x = len.div_ceil(BLOCK as usize * PER_THREAD).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (x, rows.clamp(1, 65_535) as u32, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `a + b` for two operands of `rows` rows of `len` elements; returns `shape`'s contiguous tensor.
pub fn add(
    a: Operand,
    b: Operand,
    rows: usize,
    len: usize,
    shape: &Shape,
) -> Result<(CudaStorage, Shape)> {
    if a.0.dtype() != b.0.dtype() {
        return Err(err(format!(
            "dtypes {:?} and {:?} differ",
            a.0.dtype(),
            b.0.dtype()
        )));
    }
    run(a, Some(b), rows, len, shape)
}

/// A contiguous copy of an operand of `rows` rows of `len` elements, as `shape`.
pub fn copy(a: Operand, rows: usize, len: usize, shape: &Shape) -> Result<(CudaStorage, Shape)> {
    run(a, None, rows, len, shape)
}

/// `ew_add_rows` (with `b`) or `ew_copy_rows` (without) in `a`'s dtype.
fn run(
    a: Operand,
    b: Option<Operand>,
    rows: usize,
    len: usize,
    shape: &Shape,
) -> Result<(CudaStorage, Shape)> {
    match a.0.dtype() {
        DType::F32 => run_t::<f32>(a, b, rows, len, shape),
        DType::F16 => run_t::<half::f16>(a, b, rows, len, shape),
        DType::BF16 => run_t::<half::bf16>(a, b, rows, len, shape),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn run_t<T: CudaDType + DeviceRepr>(
    a: Operand,
    b: Option<Operand>,
    rows: usize,
    len: usize,
    shape: &Shape,
) -> Result<(CudaStorage, Shape)> {
    let dev = a.0.device().clone();
    let suf = super::kernel_suffix(a.0.dtype()).ok_or_else(|| err("dtype"))?;
    let sa = a.1.stride as i64;
    let va = view::<T>(a, rows, len)?;
    let vb = b.map(|b| view::<T>(b, rows, len)).transpose()?;
    let sb = b.map_or(0, |b| b.1.stride as i64);
    let mut y = unsafe { dev.alloc::<T>(rows * len)? };
    let (r, l) = (rows as i64, len as i64);
    let name = if vb.is_some() { "add" } else { "copy" };
    let f = dev.get_or_load_custom_func(&format!("ew_{name}_rows_{suf}"), MODULE, PTX)?;
    let mut k = f.builder();
    k.arg(&va).arg(&sa);
    if let Some(vb) = &vb {
        k.arg(vb).arg(&sb);
    }
    k.arg(&mut y).arg(&r).arg(&l);
    // SAFETY: the views hold `rows` rows of `len` elements `stride` apart, y `rows * len`
    // elements; the arguments match the kernel.
    unsafe { k.launch(cfg(rows, len)) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), shape.clone()))
}
