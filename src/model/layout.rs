//! Layout changes of channels-last inference, one pass each on CUDA (`kernels/layout.cu`):
//! the network's f32 NCHW input to NHWC in the run's dtype, the head's NHWC outputs to NCHW f32,
//! and the nearest 2× upsampling of an NHWC tensor, materialised. Elsewhere (the CPU, other
//! dtypes) the same values come from candle's ops: `to_dtype`, `permute`, `contiguous`. Also the
//! buffers of concatenations built in place ([`concat_buffer`]): one NHWC tensor whose channel
//! ranges the layers making the parts write.

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// Whether the one-pass kernels run for `x`: a CUDA tensor of f32, f16 or bf16.
fn on_cuda(x: &Tensor) -> bool {
    cfg!(feature = "cuda")
        && x.device().is_cuda()
        && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// `x` (B, C, H, W) f32 → (B, H, W, `channels`) in `dtype`, contiguous (each value rounded
/// once), channels C .. `channels` zero. One kernel on CUDA; candle's ops elsewhere.
///
/// # Errors
/// `channels < C`, or `x` not 4-D.
pub fn nhwc_from_nchw(x: &Tensor, dtype: DType, channels: usize) -> Result<Tensor> {
    let c = x.dims4()?.1;
    ensure!(
        channels >= c,
        "nhwc_from_nchw: {channels} channels for an input of {c}"
    );
    if on_cuda(x) && x.dtype() == DType::F32 && matches!(dtype, DType::F16 | DType::BF16) {
        #[cfg(feature = "cuda")]
        return Ok(x
            .contiguous()?
            .apply_op1_no_bwd(&ops::ToNhwc(dtype, channels))?);
    }
    let y = x.to_dtype(dtype)?.permute((0, 2, 3, 1))?;
    let y = if channels > c {
        y.pad_with_zeros(3, 0, channels - c)?
    } else {
        y
    };
    Ok(y.contiguous()?)
}

/// The channel count [`nhwc_from_nchw`] gives the network's input of `c` channels on `device`
/// in `dtype`: a multiple of 8 on CUDA in f16/bf16, which cuDNN's tensor-core kernels need for
/// the first convolution (whose kernel gets as many zero channels:
/// [`crate::model::conv::Conv`]); `c` elsewhere.
pub fn input_channels(c: usize, device: &candle_core::Device, dtype: DType) -> usize {
    if device.is_cuda() && matches!(dtype, DType::F16 | DType::BF16) {
        c.next_multiple_of(8)
    } else {
        c
    }
}

/// Whether the head's upsampled parts reach the ELAN block that reads their concatenation
/// before the upsampling, so that its `cv1` product is taken at the lower resolution
/// (`YOLO9_LOW_RES_PRODUCTS`, default on; read once): [`crate::model::conv::Conv::run_cat_into`].
pub(crate) fn low_res_products() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::switches::off("YOLO9_LOW_RES_PRODUCTS"))
}

/// Whether the ELAN blocks build their channels-last concatenations in place
/// (`YOLO9_CONCAT_IN_PLACE`, default on; read once).
fn concat_in_place() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::switches::off("YOLO9_CONCAT_IN_PLACE"))
}

/// An uninitialised `(B, H, W, channels)` tensor on `x`'s device in `x`'s dtype, for a
/// concatenation built in place (each part written into its channels by the layer that makes it:
/// [`crate::model::conv::Conv::run_into`]), where that applies: `x` a channels-last f16/bf16
/// CUDA activation `(B, H, W, C)` and the switch on. `None` elsewhere (the caller concatenates
/// as before).
pub fn concat_buffer(x: &Tensor, channels: usize) -> Result<Option<Tensor>> {
    let (b, h, w, _) = x.dims4()?;
    if !concat_in_place() || !matches!(x.dtype(), DType::F16 | DType::BF16) {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = x.device() {
        let shape = candle_core::Shape::from((b, h, w, channels));
        return Ok(Some(crate::cuda::layout::uninit(dev, &shape, x.dtype())?));
    }
    let _ = (b, h, w, channels);
    Ok(None)
}

/// `t` (B, H, W, C) → (B, C, H, W) f32, contiguous (exact).
pub fn nchw_f32_from_nhwc(t: &Tensor) -> Result<Tensor> {
    t.dims4()?;
    if on_cuda(t) {
        #[cfg(feature = "cuda")]
        return Ok(t.contiguous()?.apply_op1_no_bwd(&ops::ToNchwF32)?);
    }
    Ok(t.permute((0, 3, 1, 2))?
        .contiguous()?
        .to_dtype(DType::F32)?)
}

/// `x` (B, H, W, C) → (B, 2H, 2W, C), each pixel repeated 2×2 (`F.interpolate(scale_factor=2,
/// mode='nearest')`), contiguous on CUDA; a broadcast view elsewhere. Not differentiable.
pub fn upsample2_nhwc(x: &Tensor) -> Result<Tensor> {
    x.dims4()?;
    if on_cuda(x) {
        #[cfg(feature = "cuda")]
        return Ok(x.contiguous()?.apply_op1_no_bwd(&ops::Up2Nhwc)?);
    }
    upsample_view_nhwc(x, 2)
}

/// `x` (B, H, W, C) → (B, fH, fW, C), each pixel repeated f×f, as a broadcast view (no copy).
pub fn upsample_view_nhwc(x: &Tensor, f: usize) -> Result<Tensor> {
    let (b, h, w, c) = x.dims4()?;
    Ok(x.reshape((b, h, 1, w, 1, c))?
        .broadcast_as((b, h, f, w, f, c))?
        .reshape((b, f * h, f * w, c))?)
}

#[cfg(feature = "cuda")]
mod ops {
    use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape};

    /// The CUDA ops of this module's functions (`crate::cuda::layout`); the CPU takes candle's
    /// ops instead.
    pub enum Op {
        /// [`super::nhwc_from_nchw`] to this dtype, with this many channels (zeros appended).
        ToNhwc(DType, usize),
        /// [`super::nchw_f32_from_nhwc`].
        ToNchwF32,
        /// [`super::upsample2_nhwc`].
        Up2Nhwc,
    }

    pub use Op::{ToNchwF32, ToNhwc, Up2Nhwc};

    impl CustomOp1 for Op {
        fn name(&self) -> &'static str {
            match self {
                ToNhwc(..) => "nchw-f32-to-nhwc",
                ToNchwF32 => "nhwc-to-nchw-f32",
                Up2Nhwc => "upsample2-nhwc",
            }
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            candle_core::bail!("{}: CUDA only (the CPU takes candle's ops)", self.name())
        }

        fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            match self {
                ToNhwc(dtype, cp) => crate::cuda::layout::nhwc_from_nchw(s, l, *dtype, *cp),
                ToNchwF32 => crate::cuda::layout::nchw_f32_from_nhwc(s, l),
                Up2Nhwc => crate::cuda::layout::upsample2_nhwc(s, l),
            }
        }
    }
}
