//! Layout changes of channels-last inference, one pass each on CUDA (`kernels/layout.cu`):
//! the network's f32 NCHW input to NHWC in the run's dtype, the head's NHWC outputs to NCHW f32,
//! and the nearest 2× upsampling of an NHWC tensor, materialised. Elsewhere (the CPU, other
//! dtypes) the same values come from candle's ops: `to_dtype`, `permute`, `contiguous`.

use anyhow::Result;
use candle_core::{DType, Tensor};

/// Whether the one-pass kernels run for `x`: a CUDA tensor of f32, f16 or bf16.
fn on_cuda(x: &Tensor) -> bool {
    cfg!(feature = "cuda")
        && x.device().is_cuda()
        && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// `x` (B, C, H, W) f32 → (B, H, W, C) in `dtype`, contiguous (each value rounded once).
pub fn nhwc_from_nchw(x: &Tensor, dtype: DType) -> Result<Tensor> {
    x.dims4()?;
    if on_cuda(x) && x.dtype() == DType::F32 && matches!(dtype, DType::F16 | DType::BF16) {
        #[cfg(feature = "cuda")]
        return Ok(x.contiguous()?.apply_op1_no_bwd(&ops::ToNhwc(dtype))?);
    }
    Ok(x.to_dtype(dtype)?.permute((0, 2, 3, 1))?.contiguous()?)
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
    let (b, h, w, c) = x.dims4()?;
    if on_cuda(x) {
        #[cfg(feature = "cuda")]
        return Ok(x.contiguous()?.apply_op1_no_bwd(&ops::Up2Nhwc)?);
    }
    Ok(x.reshape((b, h, 1, w, 1, c))?
        .broadcast_as((b, h, 2, w, 2, c))?
        .reshape((b, 2 * h, 2 * w, c))?)
}

#[cfg(feature = "cuda")]
mod ops {
    use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape};

    fn cpu(name: &str) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("{name}: CUDA only (the CPU takes candle's ops)")
    }

    /// The op of [`super::nhwc_from_nchw`] on CUDA.
    pub struct ToNhwc(pub DType);
    /// The op of [`super::nchw_f32_from_nhwc`] on CUDA.
    pub struct ToNchwF32;
    /// The op of [`super::upsample2_nhwc`] on CUDA.
    pub struct Up2Nhwc;

    impl CustomOp1 for ToNhwc {
        fn name(&self) -> &'static str {
            "nchw-f32-to-nhwc"
        }
        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            cpu(self.name())
        }
        fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            crate::cuda::layout::nhwc_from_nchw(s, l, self.0)
        }
    }

    impl CustomOp1 for ToNchwF32 {
        fn name(&self) -> &'static str {
            "nhwc-to-nchw-f32"
        }
        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            cpu(self.name())
        }
        fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            crate::cuda::layout::nchw_f32_from_nhwc(s, l)
        }
    }

    impl CustomOp1 for Up2Nhwc {
        fn name(&self) -> &'static str {
            "upsample2-nhwc"
        }
        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            cpu(self.name())
        }
        fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            crate::cuda::layout::upsample2_nhwc(s, l)
        }
    }
}
