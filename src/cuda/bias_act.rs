//! CUDA launch of the inference convolution epilogue `y = act(x + b[c])` (`kernels/bias_act.cu`)
//! for the candle op [`crate::model::bias_act::BiasAct`]. `x` (N, C, H, W) and `b` (C,) are
//! contiguous f32, f16 or bf16 of one dtype; the output is a new tensor like `x`.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{
    CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape};

/// The PTX of `kernels/bias_act.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/bias_act.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_bias_act";
/// Threads per block.
const BLOCK: u32 = 256;
/// Most blocks along the N·C rows (the kernel strides over more).
const MAX_ROW_BLOCKS: usize = 65_535;

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("bias_act (CUDA): {msg}"))
}

fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, T>> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| err(format!("{what} is not contiguous")))?;
    s.as_cuda_slice::<T>()?
        .try_slice(a..b)
        .ok_or_else(|| err(format!("{what} storage is shorter than its layout")))
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{what} = {v} does not fit in i32")))
}

/// `y = silu(x + b)` (or `x + b` without `silu`) for `x` (N, C, H, W), or (N, H, W, C) with
/// `nhwc`, and `b` (C,).
pub fn bias_act(
    (xs, xl): (&CudaStorage, &Layout),
    (bs, bl): (&CudaStorage, &Layout),
    silu: bool,
    nhwc: bool,
) -> Result<(CudaStorage, Shape)> {
    let a = ((xs, xl), (bs, bl), silu, nhwc);
    match xs.dtype() {
        DType::F32 => run::<f32>(a, "f32"),
        DType::F16 => run::<half::f16>(a, "f16"),
        DType::BF16 => run::<half::bf16>(a, "bf16"),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

type Args<'a> = (
    (&'a CudaStorage, &'a Layout),
    (&'a CudaStorage, &'a Layout),
    bool,
    bool,
);

fn run<T: CudaDType + DeviceRepr>(
    ((xs, xl), (bs, bl), silu, nhwc): Args<'_>,
    suf: &str,
) -> Result<(CudaStorage, Shape)> {
    let (n, c, h, w) = if nhwc {
        let (n, h, w, c) = xl.shape().dims4()?;
        (n, c, h, w)
    } else {
        xl.shape().dims4()?
    };
    if bl.shape().elem_count() != c || bs.dtype() != xs.dtype() {
        return Err(err(format!(
            "bias {:?} {:?} for x {:?} {:?}",
            bl.shape().dims(),
            bs.dtype(),
            xl.shape().dims(),
            xs.dtype()
        )));
    }
    let x = view::<T>(xs, xl, "x")?;
    let b = view::<T>(bs, bl, "bias")?;
    let dev = xs.device().clone();
    let rows = n * c;
    let hw = h * w;
    // SAFETY: every element is written by the kernel before it is read.
    let mut y = unsafe { dev.alloc::<T>(rows * hw)? };
    if rows * hw == 0 {
        return Ok((CudaStorage::wrap_cuda_slice(y, dev), xl.shape().clone()));
    }
    if nhwc {
        // 16 bytes per thread where the channels split into whole vectors and x starts on a
        // 16-byte boundary (y is a fresh allocation).
        let vw = 16 / std::mem::size_of::<T>();
        let x_start = xl.start_offset();
        let vec = c.is_multiple_of(vw) && x_start.is_multiple_of(vw);
        let (name, total) = if vec {
            (format!("bias_act_nhwc_vec_{suf}"), rows * hw / vw)
        } else {
            (format!("bias_act_nhwc_{suf}"), rows * hw)
        };
        let total_ = total as i64;
        let (c_, silu_) = (i32_of(c, "C")?, i32::from(silu));
        let f = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
        let mut bld = f.builder();
        bld.arg(&x)
            .arg(&b)
            .arg(&mut y)
            .arg(&total_)
            .arg(&c_)
            .arg(&silu_);
        let cfg = LaunchConfig {
            grid_dim: (total.div_ceil(BLOCK as usize).min(65_535 * 8) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x and y hold rows·hw elements of T (`total` vectors of 16 bytes in the vector
        // form, whose x view starts 16-byte aligned: candle's allocations are), b holds C.
        unsafe { bld.launch(cfg) }.w()?;
        return Ok((CudaStorage::wrap_cuda_slice(y, dev), xl.shape().clone()));
    }
    let cfg = LaunchConfig {
        grid_dim: (
            hw.div_ceil(BLOCK as usize).min(1024) as u32,
            rows.min(MAX_ROW_BLOCKS) as u32,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let (rows_, c_, hw_) = (i32_of(rows, "N*C")?, i32_of(c, "C")?, i32_of(hw, "H*W")?);
    let silu_ = i32::from(silu);
    let f = dev.get_or_load_custom_func(&format!("bias_act_{suf}"), MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&x)
        .arg(&b)
        .arg(&mut y)
        .arg(&rows_)
        .arg(&c_)
        .arg(&hw_)
        .arg(&silu_);
    // SAFETY: x and y hold rows*hw elements of T, b holds C; the kernel's arguments match.
    unsafe { bld.launch(cfg) }.w()?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), xl.shape().clone()))
}
