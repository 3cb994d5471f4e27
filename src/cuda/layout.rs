//! Launches of the channels-last layout kernels (`kernels/layout.cu`) for
//! [`crate::model::layout`]: the f32 NCHW input to NHWC in the run's dtype, a head output from
//! NHWC to NCHW f32, and the nearest 2× upsampling of an NHWC tensor. Inputs are contiguous;
//! outputs are new contiguous tensors.

use candle_core::backend::BackendStorage;
use candle_core::cuda::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{
    CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaStorage, DType, Error, Layout, Result, Shape, Tensor};

/// The PTX of `kernels/layout.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/layout.ptx"));
/// Module name under which candle caches the loaded PTX.
const MODULE: &str = "yolo9_layout";
/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;

/// An uninitialised contiguous tensor of `shape` and `dtype` on `dev` (its elements are written
/// before they are read: a concatenation built in place, [`crate::model::layout::concat_buffer`]).
pub fn uninit(dev: &candle_core::CudaDevice, shape: &Shape, dtype: DType) -> Result<Tensor> {
    let n = shape.elem_count();
    // SAFETY (each arm): the caller writes every element before reading it.
    let s = match dtype {
        DType::F16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::f16>(n)? }, dev.clone())
        }
        DType::BF16 => {
            CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(n)? }, dev.clone())
        }
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(n)? }, dev.clone()),
        d => return Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    };
    Ok(Tensor::from_storage(
        candle_core::Storage::Cuda(s),
        shape.clone(),
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("layout (CUDA): {msg}"))
}

fn flat(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            total.div_ceil(BLOCK as usize).clamp(1, 1 << 20) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| err("input is not contiguous"))?;
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{what} = {v} does not fit in i32")))
}

/// `x` f32 (N, C, H, W) → (N, H, W, Cp) in `dtype` (f32, f16 or bf16), channels C .. Cp zero
/// (`Cp ≥ C`).
pub fn nhwc_from_nchw(
    s: &CudaStorage,
    l: &Layout,
    dtype: DType,
    cp: usize,
) -> Result<(CudaStorage, Shape)> {
    match dtype {
        DType::F32 => nhwc_t::<f32>(s, l, "f32", cp),
        DType::F16 => nhwc_t::<half::f16>(s, l, "f16", cp),
        DType::BF16 => nhwc_t::<half::bf16>(s, l, "bf16", cp),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn nhwc_t<T: CudaDType + DeviceRepr>(
    s: &CudaStorage,
    l: &Layout,
    suf: &str,
    cp: usize,
) -> Result<(CudaStorage, Shape)> {
    let (n, c, h, w) = l.shape().dims4()?;
    if cp < c {
        return Err(err(format!("{cp} channels for an input of {c}")));
    }
    let x = view::<f32>(s, l)?;
    let dev = s.device().clone();
    let pixels = n * h * w;
    // SAFETY: every element is written by the kernel (one thread per pixel, all Cp channels).
    let mut y = unsafe { dev.alloc::<T>(pixels * cp)? };
    let f = dev.get_or_load_custom_func(&format!("nchw_to_nhwc_f32_{suf}"), MODULE, PTX)?;
    let (pixels_, c_, cp_, hw) = (
        pixels as i64,
        i32_of(c, "C")?,
        i32_of(cp, "Cp")?,
        (h * w) as i64,
    );
    let mut k = f.builder();
    k.arg(&x)
        .arg(&mut y)
        .arg(&pixels_)
        .arg(&c_)
        .arg(&cp_)
        .arg(&hw);
    // SAFETY: x holds N·C·H·W f32, y N·H·W·Cp T; the arguments match the kernel's
    // (x, y, pixels, C, Cp, HW).
    unsafe { k.launch(flat(pixels)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(y, dev),
        Shape::from((n, h, w, cp)),
    ))
}

/// `x` (N, H, W, C) in f32, f16 or bf16 → (N, C, H, W) f32.
pub fn nchw_f32_from_nhwc(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::F32 => nchw_t::<f32>(s, l),
        DType::F16 => nchw_t::<half::f16>(s, l),
        DType::BF16 => nchw_t::<half::bf16>(s, l),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn nchw_t<T: CudaDType + DeviceRepr>(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let (n, h, w, c) = l.shape().dims4()?;
    let x = view::<T>(s, l)?;
    let dev = s.device().clone();
    let hw = h * w;
    // SAFETY: every element is written by the kernel.
    let mut y = unsafe { dev.alloc::<f32>(n * c * hw)? };
    let suf = super::kernel_suffix(s.dtype()).ok_or_else(|| err("dtype"))?;
    let f = dev.get_or_load_custom_func(&format!("nhwc_to_nchw_{suf}_f32"), MODULE, PTX)?;
    let (c_, hw_) = (i32_of(c, "C")?, hw as i64);
    let cfg = LaunchConfig {
        grid_dim: (
            u32::try_from(hw.div_ceil(32)).map_err(|_| err("H·W too large"))?,
            c.div_ceil(32) as u32,
            u32::try_from(n.clamp(1, 65_535)).map_err(|_| err("batch"))?,
        ),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    if n > 65_535 {
        return Err(err(format!("batch {n} over 65535")));
    }
    let mut k = f.builder();
    k.arg(&x).arg(&mut y).arg(&c_).arg(&hw_);
    // SAFETY: x holds N·H·W·C elements, y as many f32; the arguments match the kernel.
    unsafe { k.launch(cfg) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(y, dev),
        Shape::from((n, c, h, w)),
    ))
}

/// `x` (N, H, W, C) → (N, 2H, 2W, C), each pixel repeated 2×2 (any dtype: a copy).
pub fn upsample2_nhwc(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    match s.dtype() {
        DType::F32 => up_t::<f32>(s, l),
        DType::F16 => up_t::<half::f16>(s, l),
        DType::BF16 => up_t::<half::bf16>(s, l),
        d => Err(err(format!("dtype {d:?}; f32, f16 and bf16 are supported"))),
    }
}

fn up_t<T: CudaDType + DeviceRepr>(s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
    let (n, h, w, c) = l.shape().dims4()?;
    let x = view::<T>(s, l)?;
    let dev = s.device().clone();
    let size = std::mem::size_of::<T>();
    let bytes = c * size;
    let start = l.start_offset() * size;
    // Units of 16 bytes where a pixel's channels and the start allow, else single elements.
    let (unit, name) = if bytes.is_multiple_of(16) && start.is_multiple_of(16) {
        (16, "upsample2_nhwc_b16")
    } else if size == 4 {
        (4, "upsample2_nhwc_b4")
    } else {
        (2, "upsample2_nhwc_b2")
    };
    let cu = bytes / unit;
    let total = n * 4 * h * w * cu;
    // SAFETY: every element is written by the kernel.
    let mut y = unsafe { dev.alloc::<T>(n * 4 * h * w * c)? };
    let f = dev.get_or_load_custom_func(name, MODULE, PTX)?;
    let (total_, h_, w_, cu_) = (
        total as i64,
        i32_of(h, "H")?,
        i32_of(w, "W")?,
        i32_of(cu, "C")?,
    );
    let mut k = f.builder();
    k.arg(&x)
        .arg(&mut y)
        .arg(&total_)
        .arg(&h_)
        .arg(&w_)
        .arg(&cu_);
    // SAFETY: x holds N·H·W·C elements (N·H·W·CU units), y four times as many; the arguments
    // match the kernel.
    unsafe { k.launch(flat(total)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(y, dev),
        Shape::from((n, 2 * h, 2 * w, c)),
    ))
}

/// Letterboxed images `x` (N, H, W, C) u8 on the GPU (uploaded bytes) → the network's input
/// (N, C, H, W) f32 in 0..1 (each value / 255), one launch in place of candle's cast, division
/// and transposition (the same values: IEEE f32 division). Errors: `x` not a 4-D u8 CUDA tensor.
pub fn images_to_nchw_f32(x: &Tensor) -> Result<Tensor> {
    let (n, h, w, c) = x.dims4()?;
    if x.dtype() != DType::U8 {
        return Err(err(format!("images of {:?}; u8 expected", x.dtype())));
    }
    let (s, l) = x.storage_and_layout();
    let candle_core::Storage::Cuda(s) = &*s else {
        return Err(err("images not on the GPU"));
    };
    let xs = view::<u8>(s, l)?;
    let dev = s.device().clone();
    let pixels = n * h * w;
    // SAFETY: every element is written by the kernel (each pixel's C channels).
    let mut y = unsafe { dev.alloc::<f32>(pixels * c)? };
    if pixels > 0 {
        let f = dev.get_or_load_custom_func("images_u8_to_nchw_f32", MODULE, PTX)?;
        let (pixels_, c_, hw) = (pixels as i64, i32_of(c, "C")?, (h * w) as i64);
        let mut k = f.builder();
        k.arg(&xs).arg(&mut y).arg(&pixels_).arg(&c_).arg(&hw);
        // SAFETY: x holds N·H·W·C bytes, y as many f32; the arguments match the kernel's
        // (x, y, pixels, C, HW).
        unsafe { k.launch(flat(pixels)) }.w()?;
    }
    Ok(Tensor::from_storage(
        candle_core::Storage::Cuda(CudaStorage::wrap_cuda_slice(y, dev)),
        Shape::from((n, c, h, w)),
        candle_core::op::BackpropOp::none(),
        false,
    ))
}
