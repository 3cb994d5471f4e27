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

/// `y ← act(y + b)` in place on channels `c_off .. c_off + C` of `out`, a contiguous
/// `(N, H, W, C_total)` f16/bf16 CUDA tensor (a part of a concatenation built in place, written by
/// [`crate::cuda::gemm::pointwise_parts_into`]), `b` `(C,)` contiguous of `out`'s dtype. One
/// 16-byte vector per thread (`kernels/bias_act.cu`, `bias_act_rows_vec`).
///
/// With `low` `(N, H/2, W/2, C)` (contiguous, `out`'s dtype): `y ← act(y + b + up(low))`, `up`
/// the nearest 2× upsampling (`bias_act_rows_up_vec`): the product of an upsampled part of the
/// concatenation taken at its own resolution ([`crate::model::conv::Conv::run_cat_into`]).
///
/// Returns `false`, doing nothing, where the vectors do not fit (C, `c_off` or C_total not a
/// multiple of 8 elements) or `low` is not of that shape, dtype and layout.
pub fn bias_act_slot_in_place(
    out: &candle_core::Tensor,
    c_off: usize,
    b: &candle_core::Tensor,
    silu: bool,
    low: Option<&candle_core::Tensor>,
) -> Result<bool> {
    let (n, h, w, ctot) = out.dims4()?;
    let c = b.elem_count();
    let start = out.layout().start_offset() + c_off;
    let vw = 8;
    if !matches!(out.dtype(), DType::F16 | DType::BF16)
        || b.dtype() != out.dtype()
        || !out.is_contiguous()
        || !b.is_contiguous()
        || c_off + c > ctot
        || !c.is_multiple_of(vw)
        || !ctot.is_multiple_of(vw)
        || !start.is_multiple_of(vw)
    {
        return Ok(false);
    }
    let low_fits = |l: &candle_core::Tensor| {
        l.dims() == [n, h / 2, w / 2, c]
            && h.is_multiple_of(2)
            && w.is_multiple_of(2)
            && l.dtype() == out.dtype()
            && l.is_contiguous()
            && l.layout().start_offset().is_multiple_of(vw)
    };
    if low.is_some_and(|l| !low_fits(l)) {
        return Ok(false);
    }
    let (os, _) = out.storage_and_layout();
    let (bs, bl) = b.storage_and_layout();
    let (candle_core::Storage::Cuda(os), candle_core::Storage::Cuda(bs)) = (&*os, &*bs) else {
        return Ok(false);
    };
    let held = low.map(|l| l.storage_and_layout());
    let low = match &held {
        Some((ls, ll)) => match &**ls {
            candle_core::Storage::Cuda(ls) => Some((ls, *ll)),
            _ => return Ok(false),
        },
        None => None,
    };
    let shape = Slot {
        start,
        n,
        h,
        w,
        c,
        ctot,
    };
    match out.dtype() {
        DType::F16 => slot_t::<half::f16>(os, (bs, bl), low, shape, silu, "f16")?,
        _ => slot_t::<half::bf16>(os, (bs, bl), low, shape, silu, "bf16")?,
    }
    Ok(true)
}

/// Where a slot lies: its first element in the output's storage, the output's pixels
/// `(n, h, w)`, the slot's channels `c` and the output's `ctot`.
struct Slot {
    start: usize,
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    ctot: usize,
}

fn slot_t<T: CudaDType + DeviceRepr>(
    os: &CudaStorage,
    (bs, bl): (&CudaStorage, &Layout),
    low: Option<(&CudaStorage, &Layout)>,
    s: Slot,
    silu: bool,
    suf: &str,
) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let dev = os.device().clone();
    let stream = dev.cuda_stream();
    let b = view::<T>(bs, bl, "bias")?;
    let nvec = s.n * s.h * s.w * s.c / 8;
    if nvec == 0 {
        return Ok(());
    }
    // The slot is written through a pointer of a shared borrow, as the in-place convolutions do
    // (`fused_conv::conv_bias_act_nhwc_into`): stream order keeps other ops off it meanwhile.
    let (y_ptr, _g) = os.as_cuda_slice::<T>()?.device_ptr(&stream);
    let y_ptr = y_ptr + (s.start * std::mem::size_of::<T>()) as u64;
    let (nvec_, c_, ld_, silu_) = (
        nvec as i64,
        i32_of(s.c, "C")?,
        s.ctot as i64,
        i32::from(silu),
    );
    let (h_, w_) = (i32_of(s.h, "H")?, i32_of(s.w, "W")?);
    let low = low
        .map(|(ls, ll)| view::<T>(ls, ll, "low-resolution term"))
        .transpose()?;
    let name = match low {
        Some(_) => format!("bias_act_rows_up_vec_{suf}"),
        None => format!("bias_act_rows_vec_{suf}"),
    };
    let f = dev.get_or_load_custom_func(&name, MODULE, PTX)?;
    let mut bld = f.builder();
    bld.arg(&y_ptr).arg(&b);
    if let Some(l) = &low {
        bld.arg(l);
    }
    bld.arg(&nvec_).arg(&c_).arg(&ld_);
    if low.is_some() {
        bld.arg(&h_).arg(&w_);
    }
    bld.arg(&silu_);
    let cfg = LaunchConfig {
        grid_dim: (nvec.div_ceil(BLOCK as usize).min(65_535 * 8) as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: y_ptr points at n·h·w rows of `ctot` elements of T (from the slot's start, which
    // leaves c ≤ ctot - c_off channels in each row), 16-byte aligned (candle's allocation plus a
    // multiple of 8 elements); b holds C; low (where given) holds n·(h/2)·(w/2)·C elements from a
    // 16-byte aligned start (checked by the caller); the arguments match the kernel's
    // (y, b, nvec, C, row_ld, silu) or (y, b, low, nvec, C, row_ld, H, W, silu).
    unsafe { bld.launch(cfg) }.w()?;
    Ok(())
}
