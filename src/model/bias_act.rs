//! The inference epilogue of a convolution whose BatchNorm is folded into it: `y = act(x + b)`
//! with `b` broadcast over channels, `act` SiLU or identity (official `Conv.forward_fuse`:
//! `act(conv(x))` with the folded bias in the convolution).
//!
//! On CUDA this is one kernel ([`crate::cuda::bias_act`]) where candle's ops take two passes over
//! the activation (a broadcast add, then SiLU). The CPU version is the reference the kernel is
//! tested against; the CPU inference path itself keeps candle's ops.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, DType, Error, Layout, Result, Shape, Tensor};

/// The op: args `x` (N, C, H, W), `b` (C,) of one float dtype → `act(x + b)` like `x`. No
/// backward (inference only).
#[derive(Debug, Clone, Copy)]
pub struct BiasAct {
    /// SiLU after the bias (else identity).
    pub silu: bool,
    /// `x` is channels-last (N, H, W, C).
    pub nhwc: bool,
}

/// `silu(x + b)` (or `x + b`) for `x` (N, C, H, W) and `b` (C,) of the same float dtype, made
/// contiguous first. Errors: other ranks or shapes, mixed dtypes.
pub fn bias_act(x: &Tensor, b: &Tensor, silu: bool) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2_no_bwd(&b.contiguous()?, &BiasAct { silu, nhwc: false })
}

/// [`bias_act`] for a channels-last `x` (N, H, W, C) and `b` (C,).
pub fn bias_act_nhwc(x: &Tensor, b: &Tensor, silu: bool) -> Result<Tensor> {
    x.contiguous()?
        .apply_op2_no_bwd(&b.contiguous()?, &BiasAct { silu, nhwc: true })
}

fn silu_f32(z: f32) -> f32 {
    z / (1.0 + (-z).exp())
}

impl CustomOp2 for BiasAct {
    fn name(&self) -> &'static str {
        "bias-act"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        // Channel of element i: (i / hw) % c; channels-last: i % c.
        let (c, hw) = if self.nhwc {
            (l1.shape().dims4()?.3, 1)
        } else {
            let (_, c, h, w) = l1.shape().dims4()?;
            (c, h * w)
        };
        let (Some((xa, xb)), Some((ba, bb))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            return Err(Error::Msg("bias_act: inputs must be contiguous".into()));
        };
        if bb - ba != c {
            return Err(Error::Msg(format!(
                "bias_act: bias {:?} for {c} channels",
                l2.shape().dims()
            )));
        }
        let silu = self.silu;
        let f = |x: f32, b: f32| {
            let z = x + b;
            if silu {
                silu_f32(z)
            } else {
                z
            }
        };
        // One loop for every dtype: through f32 and back.
        fn run<T: Copy>(
            x: &[T],
            b: &[T],
            (c, hw): (usize, usize),
            f: impl Fn(f32, f32) -> f32,
            to: impl Fn(T) -> f32,
            from: impl Fn(f32) -> T,
        ) -> Vec<T> {
            x.iter()
                .enumerate()
                .map(|(i, &v)| from(f(to(v), to(b[(i / hw) % c]))))
                .collect()
        }
        let g = (c, hw);
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(b)) => {
                CpuStorage::F32(run(&x[xa..xb], &b[ba..bb], g, f, |v| v, |v| v))
            }
            (CpuStorage::F16(x), CpuStorage::F16(b)) => CpuStorage::F16(run(
                &x[xa..xb],
                &b[ba..bb],
                g,
                f,
                half::f16::to_f32,
                half::f16::from_f32,
            )),
            (CpuStorage::BF16(x), CpuStorage::BF16(b)) => CpuStorage::BF16(run(
                &x[xa..xb],
                &b[ba..bb],
                g,
                f,
                half::bf16::to_f32,
                half::bf16::from_f32,
            )),
            _ => {
                return Err(Error::Msg(format!(
                    "bias_act: dtypes {:?}/{:?}",
                    s1.dtype(),
                    s2.dtype()
                )))
            }
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::bias_act::bias_act((s1, l1), (s2, l2), self.silu, self.nhwc)
    }
}

/// Whether [`bias_act`] is the faster path for `x`: a CUDA tensor of a float dtype.
pub fn fused_on(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}
