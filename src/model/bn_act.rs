//! Train-mode BatchNorm2d fused with the optional SiLU that follows it, as candle custom ops with
//! a closed-form backward pass.
//!
//! `y = act((x − μ) · γ/√(σ² + ε) + β)` where μ and σ² (biased) are the per-channel statistics of
//! `x` over (N, H, W) and `act` is SiLU or the identity. The composite form (mean, subtract,
//! square, mean, …, SiLU as separate candle ops) keeps about eight activation-sized tensors per
//! layer for autograd and makes ~40 passes over memory per layer forward + backward; this op keeps
//! only its input `x` and makes 2 passes forward and 2 backward.
//!
//! The backward pass is the standard batch-norm gradient (PyTorch `batch_norm_backward`, and
//! Ioffe & Szegedy 2015, §3): with `g = dL/dz` (`z` the BN output before the activation) and
//! `x̂ = (x − μ)/√(σ² + ε)`,
//! `dβ = Σg`, `dγ = Σg·x̂`, `dx = γ/√(σ² + ε) · (g − dβ/M − x̂·dγ/M)` with `M = N·H·W`.
//!
//! Sums over a channel are accumulated in f64 on every device (as PyTorch's CPU kernels do), so a
//! reduction over 10⁵–10⁶ elements stays exact to f32 precision. On the CPU every op runs for f32
//! and f64 (rayon over channels); on CUDA (feature `cuda`) for f32 and bf16 activations (f32
//! arithmetic and parameters; bf16 for mixed-precision training) through the kernels in
//! `kernels/bn_act.cu` ([`crate::cuda::bn_act`]). [`bn_act_supported`] says where the fused op runs;
//! the caller keeps a composite path for everything else (e.g. f16, or bf16 on the CPU).
//!
//! Why one file: the forward, the closed-form backward, their CPU kernels and the CUDA launches are
//! one fused op, and the backward's formulas are checked by reading them next to the forward's.

pub use crate::op_args::RunningUpdate;
use crate::op_args::{geometry, params_range, Geometry};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// Whether [`channel_stats`] and [`bn_act_train`] run for tensors of this dtype on this device.
pub fn bn_act_supported(dev: &Device, dtype: DType) -> bool {
    match dev {
        Device::Cpu => matches!(dtype, DType::F32 | DType::F64),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => matches!(dtype, DType::F32 | DType::BF16),
        _ => false,
    }
}

/// Per-channel batch statistics of `x` (N, C, H, W): returns (2, C) of x's dtype (f32 for a bf16
/// `x` on CUDA), row 0 the mean
/// and row 1 the **biased** variance `E[x²] − E[x]²` over the N·H·W elements of each channel
/// (accumulated in f64). Not differentiable; see [`bn_act_train`] for the gradient through them.
///
/// Errors: `x` not 4-D or not contiguous, an unsupported device/dtype ([`bn_act_supported`]).
pub fn channel_stats(x: &Tensor) -> Result<Tensor> {
    x.dims4()?;
    x.contiguous()?.apply_op1_no_bwd(&ChannelStats)
}

/// Train-mode BN + activation: `x` (N, C, H, W), `gamma`/`beta` (C,), `stats` (2, C) from
/// [`channel_stats`] of the same `x`; returns `act((x − μ)·γ/√(σ² + ε) + β)` with `act` SiLU when
/// `silu`, else the identity. Differentiable in `x` (including through μ and σ²), `gamma` and
/// `beta`.
pub fn bn_act_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    stats: &Tensor,
    eps: f64,
    silu: bool,
) -> Result<Tensor> {
    bn_act_train_block(x, gamma, beta, param_block(gamma, beta, stats)?, eps, silu)
}

/// [`bn_act_train`] from a ready parameter block `p` (4, C) = [γ; β; μ; σ²] (from
/// [`stats_block`] or [`param_block`]; detached values of `gamma`/`beta`): the op's inputs are x,
/// γ and β themselves, so autograd sees one node with three arguments (no concatenation to
/// differentiate, no zero gradient for the statistics).
pub fn bn_act_train_block(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    p: Tensor,
    eps: f64,
    silu: bool,
) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        gamma,
        beta,
        BnActTrain {
            op: BnAct { eps, silu },
            p,
        },
    )
}

/// The parameter block (4, C) = [γ; β; μ; σ²] of the fused kernels, from detached copies of
/// `gamma`/`beta` (C,) and `stats` (2, C) of [`channel_stats`].
pub fn param_block(gamma: &Tensor, beta: &Tensor, stats: &Tensor) -> Result<Tensor> {
    let c = gamma.dim(0)?;
    Tensor::cat(
        &[
            &gamma.detach().reshape((1, c))?,
            &beta.detach().reshape((1, c))?,
            &stats.detach(),
        ],
        0,
    )
}

/// The forward of [`bn_act_train`] from a parameter block `p` of [`param_block`], without
/// autograd (the training graph's tape records its own node, `crate::model::tape`).
pub fn bn_act_apply(x: &Tensor, p: &Tensor, eps: f64, silu: bool) -> Result<Tensor> {
    super::ew::contiguous(x)?.apply_op2_no_bwd(p, &BnAct { eps, silu })
}

/// The closed-form backward of [`bn_act_train`] (module docs) at `x` (N, C, H, W) for the output
/// gradient `dy`, with the parameter block `p` of the forward: returns `dx` (when `need_dx`),
/// `dγ = Σg·x̂` (C,) and `dβ = Σg` (C,).
pub fn bn_act_backward(
    x: &Tensor,
    dy: &Tensor,
    p: &Tensor,
    eps: f64,
    silu: bool,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor, Tensor)> {
    let op = BnAct { eps, silu };
    let x = super::ew::contiguous(x)?;
    let dy = super::ew::contiguous(dy)?;
    let q = x.apply_op3_no_bwd(&dy, p, &BnActGradSums(op))?;
    let dx = if need_dx {
        // --sync-bn: dx from the sums over every rank's micro-batch (dγ, dβ stay this rank's).
        let (n, _, h, w) = x.dims4()?;
        let qg = super::bn_sync::global_grad_sums(&q, (n * h * w) as f64)?;
        Some(x.apply_op3_no_bwd(&dy, qg.as_ref().unwrap_or(&q), &BnActGradInput(op))?)
    } else {
        None
    };
    Ok((dx, q.get(5)?, q.get(4)?))
}

/// The autograd node of [`bn_act_train`]: args `x` (N, C, H, W), `γ` (C,), `β` (C,); the kernels
/// read the parameter block `p` (4, C) = [γ; β; μ; σ²] held by the op (same values as the
/// arguments). The forward is [`BnAct`]'s; the backward runs [`BnActGradSums`] and
/// [`BnActGradInput`] and returns `dx`, `dγ = Σg·x̂` and `dβ = Σg` directly.
#[derive(Debug, Clone)]
pub struct BnActTrain {
    /// ε and the activation.
    pub op: BnAct,
    /// [γ; β; μ; σ²], (4, C), detached.
    pub p: Tensor,
}

/// The parameter block `p` (4, C) = [γ; β; μ; σ²] of `x` (N, C, H, W) for the fused kernels, in
/// one op (the statistics as [`channel_stats`], γ and β (C,) copied in): what [`param_block`]
/// builds from three tensors, without the concatenation. Not differentiable.
pub fn stats_block(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<Tensor> {
    x.dims4()?;
    x.contiguous()?.apply_op3_no_bwd(
        &gamma.detach(),
        &beta.detach(),
        &ParamBlock { running: None },
    )
}

/// The gradient of a standalone SiLU: `dy·σ(x)·(1 + x·(1 − σ(x)))` for `x`, `dy` (N, C, H, W)
/// of one dtype (CPU f32/f64, CUDA f32/bf16, as [`bn_act_supported`]), one op (the same
/// derivative as the fused BN + SiLU backward). Not differentiable.
pub fn silu_backward(x: &Tensor, dy: &Tensor) -> Result<Tensor> {
    x.dims4()?;
    super::ew::contiguous(x)?.apply_op2_no_bwd(&super::ew::contiguous(dy)?, &SiluGrad)
}

/// The op of [`silu_backward`]: args `x`, `dy` → `dx`.
#[derive(Debug, Clone, Copy)]
pub struct SiluGrad;

impl CustomOp2 for SiluGrad {
    fn name(&self) -> &'static str {
        "silu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, r1) = geometry(l1, "x")?;
        let (g2, r2) = geometry(l2, "dy")?;
        if g != g2 {
            return Err(bail("silu_backward: x and dy shapes differ".into()));
        }
        fn run<T: Float>(x: &[T], dy: &[T]) -> Vec<T> {
            x.par_iter()
                .zip(dy.par_iter())
                .map(|(&x, &d)| Float::mul(d, silu_grad(x)))
                .collect()
        }
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => {
                CpuStorage::F32(run(slice_of(s1, r1)?, slice_of(s2, r2)?))
            }
            (CpuStorage::F64(_), CpuStorage::F64(_)) => {
                CpuStorage::F64(run(slice_of(s1, r1)?, slice_of(s2, r2)?))
            }
            _ => {
                return Err(bail(format!(
                    "silu_backward: dtypes {:?}/{:?} on the CPU",
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
        crate::cuda::bn_act::silu_grad((s1, l1), (s2, l2))
    }
}

/// [`stats_block`] that also updates the running statistics `rm`, `rv` (C,) f32 in place, in the
/// same kernel, on CUDA: `running = (1 − momentum)·running + momentum·batch` with the variance
/// made unbiased by `unbiased` (the arithmetic of the CPU path's candle ops, rounded op by op).
/// Returns `None` where that does not apply (the CPU, or running statistics that are not
/// contiguous f32 tensors of x's CUDA device); the caller then uses [`stats_block`] and updates
/// them itself.
pub fn stats_block_updating(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    (rm, rv): (&Tensor, &Tensor),
    momentum: f64,
    unbiased: f64,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = x.device() {
        let c = gamma.elem_count();
        if crate::cuda::optim::applies(&[rm, rv]) && rm.elem_count() == c && rv.elem_count() == c {
            let running = RunningUpdate {
                mean: crate::cuda::optim::address(rm, dev)?,
                var: crate::cuda::optim::address(rv, dev)?,
                momentum,
                unbiased,
            };
            x.dims4()?;
            return Ok(Some(x.contiguous()?.apply_op3_no_bwd(
                &gamma.detach(),
                &beta.detach(),
                &ParamBlock {
                    running: Some(running),
                },
            )?));
        }
    }
    let _ = (x, gamma, beta, rm, rv, momentum, unbiased);
    Ok(None)
}

/// The op of [`stats_block`]: args `x`, `γ`, `β` → (4, C); with `running` (CUDA only) it also
/// updates the running statistics in place.
#[derive(Debug, Clone, Copy)]
pub struct ParamBlock {
    /// The in-place running-statistics update, if any.
    pub running: Option<RunningUpdate>,
}

/// Statistics op (see [`channel_stats`]).
#[derive(Debug, Clone, Copy)]
pub struct ChannelStats;

/// The fused forward computation: args `x` (N, C, H, W) and `p` (4, C) = [γ; β; μ; σ²] → `y`
/// like `x` (CPU and CUDA). Not differentiable itself: [`BnActTrain`], the autograd node of
/// [`bn_act_train`], runs it and owns the backward.
#[derive(Debug, Clone, Copy)]
pub struct BnAct {
    /// ε added to σ².
    pub eps: f64,
    /// Apply SiLU after the affine BN.
    pub silu: bool,
}

/// Backward reduction op: args `x`, `dy` (N, C, H, W) and `p` (4, C) → (6, C) = [p; Σg; Σg·x̂]
/// (the block `q` that [`BnActGradInput`] reads).
#[derive(Debug, Clone, Copy)]
pub struct BnActGradSums(pub BnAct);

/// Backward input-gradient op: args `x`, `dy` and `q` (6, C) = [γ; β; μ; σ²; Σg; Σg·x̂] → `dx`.
#[derive(Debug, Clone, Copy)]
pub struct BnActGradInput(pub BnAct);

fn bail(msg: String) -> candle_core::Error {
    candle_core::Error::Msg(msg)
}

/// Float types of the CPU kernels.
trait Float: Copy + Send + Sync + 'static {
    fn to64(self) -> f64;
    fn of64(v: f64) -> Self;
    fn exp_neg(self) -> Self;
    fn sqrt_(self) -> Self;
    fn one() -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
}

macro_rules! float_impl {
    ($t:ty) => {
        impl Float for $t {
            fn to64(self) -> f64 {
                self as f64
            }
            fn of64(v: f64) -> Self {
                v as $t
            }
            fn exp_neg(self) -> Self {
                (-self).exp()
            }
            fn sqrt_(self) -> Self {
                self.sqrt()
            }
            fn one() -> Self {
                1.0
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn div(self, o: Self) -> Self {
                self / o
            }
        }
    };
}
float_impl!(f32);
float_impl!(f64);

/// Per-channel constants of the forward map `z = x·scale + shift` in the element type, computed
/// in the order of the composite BN (`inv = 1/√(σ²+ε)`, `scale = inv·γ`, `z = (x − μ)·scale + β`).
#[derive(Clone, Copy)]
struct ChanConst<T> {
    mean: T,
    inv: T,
    scale: T,
    beta: T,
}

fn chan_consts<T: Float>(p: &[T], c: usize, eps: f64) -> Vec<ChanConst<T>> {
    (0..c)
        .map(|ch| {
            let (g, b, m, v) = (p[ch], p[c + ch], p[2 * c + ch], p[3 * c + ch]);
            let inv = T::one().div(v.add(T::of64(eps)).sqrt_());
            ChanConst {
                mean: m,
                inv,
                scale: inv.mul(g),
                beta: b,
            }
        })
        .collect()
}

/// SiLU `z/(1 + e^{−z})` (candle's formula) and its derivative `s·(1 + z·(1 − s))`.
fn silu<T: Float>(z: T) -> T {
    z.div(T::one().add(z.exp_neg()))
}

fn silu_grad<T: Float>(z: T) -> T {
    let s = T::one().div(T::one().add(z.exp_neg()));
    s.mul(T::one().add(z.mul(T::one().sub(s))))
}

fn cpu_stats<T: Float>(x: &[T], (n, c, hw): Geometry) -> Vec<T> {
    let m = (n * hw) as f64;
    let per: Vec<(f64, f64)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            let (mut s, mut q) = (0f64, 0f64);
            for ni in 0..n {
                let base = (ni * c + ch) * hw;
                for &v in &x[base..base + hw] {
                    let v = v.to64();
                    s += v;
                    q += v * v;
                }
            }
            let mean = s / m;
            (mean, (q / m - mean * mean).max(0.0))
        })
        .collect();
    let mut out: Vec<T> = per.iter().map(|p| T::of64(p.0)).collect();
    out.extend(per.iter().map(|p| T::of64(p.1)));
    out
}

fn cpu_fwd<T: Float>(x: &[T], p: &[T], (_, c, hw): Geometry, op: BnAct) -> Vec<T> {
    let k = chan_consts(p, c, op.eps);
    let mut y = x.to_vec();
    y.par_chunks_mut(hw).enumerate().for_each(|(plane, ys)| {
        let k = k[plane % c];
        for v in ys.iter_mut() {
            let z = v.sub(k.mean).mul(k.scale).add(k.beta);
            *v = if op.silu { silu(z) } else { z };
        }
    });
    y
}

/// `g = dy·act'(z)` of one element.
fn grad_pre<T: Float>(x: T, dy: T, k: &ChanConst<T>, silu: bool) -> T {
    if silu {
        let z = x.sub(k.mean).mul(k.scale).add(k.beta);
        dy.mul(silu_grad(z))
    } else {
        dy
    }
}

fn cpu_grad_sums<T: Float>(x: &[T], dy: &[T], p: &[T], (n, c, hw): Geometry, op: BnAct) -> Vec<T> {
    let k = chan_consts(p, c, op.eps);
    let per: Vec<(f64, f64)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            let kc = &k[ch];
            let (mut sg, mut sgx) = (0f64, 0f64);
            for ni in 0..n {
                let base = (ni * c + ch) * hw;
                for i in base..base + hw {
                    let g = grad_pre(x[i], dy[i], kc, op.silu).to64();
                    let xhat = x[i].sub(kc.mean).mul(kc.inv).to64();
                    sg += g;
                    sgx += g * xhat;
                }
            }
            (sg, sgx)
        })
        .collect();
    let mut out: Vec<T> = per.iter().map(|p| T::of64(p.0)).collect();
    out.extend(per.iter().map(|p| T::of64(p.1)));
    out
}

fn cpu_grad_input<T: Float>(x: &[T], dy: &[T], q: &[T], (n, c, hw): Geometry, op: BnAct) -> Vec<T> {
    let k = chan_consts(q, c, op.eps);
    let m = T::of64((n * hw) as f64);
    let mut dx = vec![T::of64(0.0); x.len()];
    dx.par_chunks_mut(hw).enumerate().for_each(|(plane, out)| {
        let ch = plane % c;
        let kc = &k[ch];
        let mg = q[4 * c + ch].div(m);
        let mgx = q[5 * c + ch].div(m);
        let base = plane * hw;
        for (j, o) in out.iter_mut().enumerate() {
            let i = base + j;
            let g = grad_pre(x[i], dy[i], kc, op.silu);
            let xhat = x[i].sub(kc.mean).mul(kc.inv);
            *o = g.sub(mg).sub(xhat.mul(mgx)).mul(kc.scale);
        }
    });
    dx
}

fn slice_of<T: candle_core::WithDType>(s: &CpuStorage, (a, b): (usize, usize)) -> Result<&[T]> {
    Ok(&s.as_slice::<T>()?[a..b])
}

impl CustomOp1 for ChannelStats {
    fn name(&self) -> &'static str {
        "bn-channel-stats"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (g, r) = geometry(l, "x")?;
        let out = Shape::from((2, g.1));
        match s {
            CpuStorage::F32(_) => Ok((CpuStorage::F32(cpu_stats(slice_of(s, r)?, g)), out)),
            CpuStorage::F64(_) => Ok((CpuStorage::F64(cpu_stats(slice_of(s, r)?, g)), out)),
            _ => Err(bail(format!("bn_act: dtype {:?} on the CPU", s.dtype()))),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::bn_act::stats(s, l)
    }
}

impl CustomOp3 for ParamBlock {
    fn name(&self) -> &'static str {
        "bn-param-block"
    }

    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        sg: &CpuStorage,
        lg: &Layout,
        sb: &CpuStorage,
        lb: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, r) = geometry(l, "x")?;
        let c = g.1;
        let range = |l: &Layout, what: &str| -> Result<(usize, usize)> {
            if l.shape().elem_count() != c {
                return Err(bail(format!("bn_act: {what} does not have {c} elements")));
            }
            l.contiguous_offsets()
                .ok_or_else(|| bail(format!("bn_act: {what} is not contiguous")))
        };
        let (rg, rb) = (range(lg, "gamma")?, range(lb, "beta")?);
        fn build<T: Float + candle_core::WithDType>(
            x: &[T],
            g: &[T],
            b: &[T],
            geo: Geometry,
        ) -> Vec<T> {
            let mut out = g.to_vec();
            out.extend_from_slice(b);
            out.extend(cpu_stats(x, geo));
            out
        }
        let out =
            match (s, sg, sb) {
                (CpuStorage::F32(_), CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(
                    build(slice_of(s, r)?, slice_of(sg, rg)?, slice_of(sb, rb)?, g),
                ),
                (CpuStorage::F64(_), CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(
                    build(slice_of(s, r)?, slice_of(sg, rg)?, slice_of(sb, rb)?, g),
                ),
                _ => {
                    return Err(bail(format!(
                        "bn_act: dtypes {:?}/{:?}/{:?} on the CPU",
                        s.dtype(),
                        sg.dtype(),
                        sb.dtype()
                    )))
                }
            };
        Ok((out, Shape::from((4, c))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
        sg: &candle_core::CudaStorage,
        lg: &Layout,
        sb: &candle_core::CudaStorage,
        lb: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::bn_act::block(s, l, (sg, lg), (sb, lb), self.running)
    }
}

impl CustomOp2 for BnAct {
    fn name(&self) -> &'static str {
        "bn-act-train"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, r) = geometry(l1, "x")?;
        let pr = params_range(l2, 4, g.1, "p")?;
        let shape = l1.shape().clone();
        match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => Ok((
                CpuStorage::F32(cpu_fwd(slice_of(s1, r)?, slice_of(s2, pr)?, g, *self)),
                shape,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => Ok((
                CpuStorage::F64(cpu_fwd(slice_of(s1, r)?, slice_of(s2, pr)?, g, *self)),
                shape,
            )),
            _ => Err(bail(format!(
                "bn_act: dtypes {:?}/{:?} on the CPU",
                s1.dtype(),
                s2.dtype()
            ))),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::bn_act::forward((self.eps, self.silu), s1, l1, s2, l2)
    }
}

impl CustomOp3 for BnActTrain {
    fn name(&self) -> &'static str {
        "bn-act-train"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (st, lp) = self.p.storage_and_layout();
        match &*st {
            candle_core::Storage::Cpu(sp) => self.op.cpu_fwd(s1, l1, sp, lp),
            _ => Err(bail("bn_act: the parameter block is not on the CPU".into())),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (st, lp) = self.p.storage_and_layout();
        match &*st {
            candle_core::Storage::Cuda(sp) => {
                crate::cuda::bn_act::forward((self.op.eps, self.op.silu), s1, l1, sp, lp)
            }
            _ => Err(bail(
                "bn_act: the parameter block is not on the CUDA device".into(),
            )),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dg, db) =
            bn_act_backward(x, dy, &self.p, self.op.eps, self.op.silu, x.track_op())?;
        let dg = if gamma.track_op() {
            Some(dg.reshape(gamma.shape())?)
        } else {
            None
        };
        let db = if beta.track_op() {
            Some(db.reshape(beta.shape())?)
        } else {
            None
        };
        Ok((dx, dg, db))
    }
}

/// The CPU side of the two backward ops: args (x, dy, block of `ROWS` × C).
trait CpuBwd3: CustomOp3 {
    const ROWS: usize;
    fn run<T: Float>(&self, x: &[T], dy: &[T], q: &[T], g: Geometry) -> Vec<T>;
    fn out_shape(&self, g: Geometry, x: &Layout) -> Shape;

    fn dispatch(&self, a1: CpuArg, a2: CpuArg, a3: CpuArg) -> Result<(CpuStorage, Shape)> {
        let ((s1, l1), (s2, l2), (s3, l3)) = (a1, a2, a3);
        let (g, r1) = geometry(l1, "x")?;
        let (g2, r2) = geometry(l2, "dy")?;
        if g2 != g {
            return Err(bail(format!("{}: x and dy shapes differ", self.name())));
        }
        let r3 = params_range(l3, Self::ROWS, g.1, "parameters")?;
        let shape = self.out_shape(g, l1);
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(_), CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(
                self.run(slice_of(s1, r1)?, slice_of(s2, r2)?, slice_of(s3, r3)?, g),
            ),
            (CpuStorage::F64(_), CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(
                self.run(slice_of(s1, r1)?, slice_of(s2, r2)?, slice_of(s3, r3)?, g),
            ),
            _ => {
                return Err(bail(format!(
                    "{}: mixed or unsupported dtypes",
                    self.name()
                )))
            }
        };
        Ok((out, shape))
    }
}

type CpuArg<'a> = (&'a CpuStorage, &'a Layout);

impl CpuBwd3 for BnActGradSums {
    const ROWS: usize = 4;
    fn run<T: Float>(&self, x: &[T], dy: &[T], p: &[T], g: Geometry) -> Vec<T> {
        let mut q = p[..4 * g.1].to_vec();
        q.extend(cpu_grad_sums(x, dy, p, g, self.0));
        q
    }
    fn out_shape(&self, g: Geometry, _: &Layout) -> Shape {
        Shape::from((6, g.1))
    }
}

impl CpuBwd3 for BnActGradInput {
    const ROWS: usize = 6;
    fn run<T: Float>(&self, x: &[T], dy: &[T], q: &[T], g: Geometry) -> Vec<T> {
        cpu_grad_input(x, dy, q, g, self.0)
    }
    fn out_shape(&self, _: Geometry, x: &Layout) -> Shape {
        x.shape().clone()
    }
}

impl CustomOp3 for BnActGradSums {
    fn name(&self) -> &'static str {
        "bn-act-grad-sums"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.dispatch((s1, l1), (s2, l2), (s3, l3))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::bn_act::grad_sums((self.0.eps, self.0.silu), (s1, l1), (s2, l2), (s3, l3))
    }
}

impl CustomOp3 for BnActGradInput {
    fn name(&self) -> &'static str {
        "bn-act-grad-input"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.dispatch((s1, l1), (s2, l2), (s3, l3))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::bn_act::grad_input((self.0.eps, self.0.silu), (s1, l1), (s2, l2), (s3, l3))
    }
}
