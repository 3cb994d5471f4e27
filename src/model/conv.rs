//! `Conv` = Conv2d (no bias) + BatchNorm2d + SiLU (official `models/common.py::Conv`), with BN
//! folding for inference (official `utils/torch_utils.py::fuse_conv_and_bn`), and the plain
//! biased `nn.Conv2d` used as the last layer of each head branch.
//!
//! Why one file: `Conv`, its BatchNorm, the BN folding and the convolution dispatch it calls (own
//! CPU im2col + GEMM, cuDNN NCHW and NHWC, 1x1 as one GEMM) are one layer in every mode, and a
//! backend is added by changing the dispatch beside the layer that uses it.

use super::bn_act;
use super::params::{BuildMode, Builder, Init, ParamGroup};
use super::tape::{self, Ctx, Tape};
use super::trace::TracedOp;
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Tensor, Var};

/// BatchNorm epsilon of every BN layer of YOLOv9 (`initialize_weights` sets 1e-3).
pub const BN_EPS: f64 = 1e-3;
/// BatchNorm momentum (weight of the new batch statistic in the running average).
pub const BN_MOMENTUM: f64 = 0.03;

/// Grouped convolutions of at most this many groups run with a dense, block-diagonal kernel on
/// the channels-last inference path (`Conv::nhwc_weight`).
const DENSE_GROUPS: usize = 8;

/// BatchNorm2d over channels of an NCHW tensor, with train (batch statistics) and eval (running
/// statistics) behaviour identical to `torch.nn.BatchNorm2d(eps=1e-3, momentum=0.03)`.
pub struct BatchNorm2d {
    /// Scale γ, (C,) f32.
    pub weight: Tensor,
    /// Shift β, (C,) f32.
    pub bias: Tensor,
    /// Running mean, (C,) f32 (updated in place by train-mode forwards).
    pub running_mean: Var,
    /// Running **unbiased** variance, (C,) f32.
    pub running_var: Var,
}

/// `n/(n − 1)`, the factor that makes a biased variance over `n` values unbiased (1 for n ≤ 1).
fn unbiased_factor(n: f64) -> f64 {
    if n > 1.0 {
        n / (n - 1.0)
    } else {
        1.0
    }
}

/// Per-channel sum over (N, H, W) of x (B, C, H, W) → (1, C, 1, 1), reduced one axis at a time
/// (W, then H, then N) so f32 rounding stays close to PyTorch's pairwise reductions.
fn channel_sum(x: &Tensor) -> Result<Tensor> {
    Ok(x.sum_keepdim(3)?.sum_keepdim(2)?.sum_keepdim(0)?)
}

impl BatchNorm2d {
    /// Train mode: normalizes with the batch mean and **biased** batch variance over (N, H, W),
    /// then updates `running = 0.97*running + 0.03*batch` with the **unbiased** variance
    /// (`num_batches_tracked` is counted once per forward by the owning model).
    /// Eval mode: `(x - running_mean) / sqrt(running_var + eps) * γ + β`.
    /// x: (B, C, H, W) f32 → same shape.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.forward_act(x, train, false)
    }

    /// [`Self::forward`] followed by SiLU when `silu`. In train mode on a device and dtype where
    /// the fused op runs ([`bn_act::bn_act_supported`]: CPU f32/f64, CUDA f32/bf16) this is one
    /// [`bn_act::bn_act_train`] op; elsewhere it is the composite of candle ops.
    pub fn forward_act(&self, x: &Tensor, train: bool, silu: bool) -> Result<Tensor> {
        let c = self.weight.dim(0)?;
        let shape4 = (1, c, 1, 1);
        if !train {
            // Detached: evaluation records no autograd graph (see `Conv::forward`).
            let (scale, shift) = self.scale_shift()?;
            let (scale, shift) = (
                scale.detach().to_dtype(x.dtype())?,
                shift.detach().to_dtype(x.dtype())?,
            );
            let y = x
                .broadcast_mul(&scale.reshape(shape4)?)?
                .broadcast_add(&shift.reshape(shape4)?)?;
            return Ok(if silu { y.silu()? } else { y });
        }
        if bn_act::bn_act_supported(x.device(), x.dtype()) {
            let p = self.fused_block(x)?;
            return Ok(bn_act::bn_act_train_block(
                x,
                &self.weight,
                &self.bias,
                p,
                BN_EPS,
                silu,
            )?);
        }
        let (b, _, h, w) = x.dims4()?;
        let n = (b * h * w) as f64;
        if super::bn_sync::active() {
            anyhow::bail!(
                "--sync-bn runs on the fused train-mode BN only (f32 on the CPU, f32/bf16 on \
                 CUDA), not {:?} on {:?}",
                x.dtype(),
                x.device()
            );
        }
        let (y, mean, var) = self.train_composite(x, n)?;
        let y = if silu { y.silu()? } else { y };
        self.update_running(
            &mean.detach().flatten_all()?,
            &var.detach().flatten_all()?,
            n,
        )?;
        Ok(y)
    }

    /// The parameter block (4, C) = [γ; β; mean; biased variance] of `x` (B, C, H, W) for the
    /// fused op ([`bn_act::stats_block`], one op), and the running-statistics update with the
    /// batch statistics (rows 2..4; on CUDA in the same kernel, [`bn_act::stats_block_updating`]).
    pub fn fused_block(&self, x: &Tensor) -> Result<Tensor> {
        let (b, _, h, w) = x.dims4()?;
        let n = (b * h * w) as f64;
        if super::bn_sync::active() {
            // --sync-bn: the statistics of every rank's micro-batch together.
            let p = bn_act::stats_block(x, &self.weight, &self.bias)?;
            let (p, n_all) = super::bn_sync::pooled_block(&p, n)?;
            let stats = p.narrow(0, 2, 2)?;
            self.update_running(&stats.get(0)?, &stats.get(1)?, n_all)?;
            return Ok(p);
        }
        if let Some(p) = bn_act::stats_block_updating(
            x,
            &self.weight,
            &self.bias,
            (self.running_mean.as_tensor(), self.running_var.as_tensor()),
            BN_MOMENTUM,
            unbiased_factor(n),
        )? {
            return Ok(p);
        }
        let p = bn_act::stats_block(x, &self.weight, &self.bias)?;
        let stats = p.narrow(0, 2, 2)?;
        self.update_running(&stats.get(0)?, &stats.get(1)?, n)?;
        Ok(p)
    }

    /// `running = 0.97·running + 0.03·batch` from the batch mean and **biased** variance (each
    /// (C,)) over `n` = B·H·W values (the variance made unbiased first). No gradient.
    fn update_running(&self, mean: &Tensor, var: &Tensor, n: f64) -> Result<()> {
        let var = (var * unbiased_factor(n))?;
        let rm = ((self.running_mean.as_tensor() * (1.0 - BN_MOMENTUM))? + (mean * BN_MOMENTUM)?)?;
        let rv = ((self.running_var.as_tensor() * (1.0 - BN_MOMENTUM))? + (var * BN_MOMENTUM)?)?;
        self.running_mean.set(&rm)?;
        self.running_var.set(&rv)?;
        Ok(())
    }

    /// Train-mode BN as a composite of candle ops (any dtype and device; `n` = B·H·W): returns
    /// the normalized output (before any activation) and the batch mean and biased variance,
    /// each (1, C, 1, 1). Running statistics are not touched. Used where the fused op does not
    /// run, and by tests as the reference for it.
    pub fn train_composite(&self, x: &Tensor, n: f64) -> Result<(Tensor, Tensor, Tensor)> {
        let shape4 = (1, self.weight.dim(0)?, 1, 1);
        // Batch statistics: values accumulated in f64 (PyTorch's CPU/GPU reductions are far
        // more accurate than a plain f32 sum over B·H·W elements, and the TAL assigner's
        // CIoU^6 amplifies the difference), gradients through the f32 expressions:
        // `v64 + (v32 - v32.detach())` has the value of `v64` and the gradient of `v32`.
        let x64 = x.detach().to_dtype(DType::F64)?;
        let mean64 = (channel_sum(&x64)? / n)?;
        let var64 = (channel_sum(&x64.broadcast_sub(&mean64)?.sqr()?)? / n)?;
        let mean32 = (channel_sum(x)? / n)?;
        let mean = (mean64.to_dtype(x.dtype())? + (&mean32 - mean32.detach())?)?;
        let xc = x.broadcast_sub(&mean)?;
        let var32 = (channel_sum(&xc.sqr()?)? / n)?;
        let var = (var64.to_dtype(x.dtype())? + (&var32 - var32.detach())?)?;
        let inv = (var.clone() + BN_EPS)?.sqrt()?.recip()?;
        let scale = inv.broadcast_mul(&self.weight.reshape(shape4)?)?;
        let y = xc
            .broadcast_mul(&scale)?
            .broadcast_add(&self.bias.reshape(shape4)?)?;
        Ok((y, mean, var))
    }

    /// Eval-mode affine form `(γ/sqrt(var+eps), β - γ*mean/sqrt(var+eps))`, each (C,), computed
    /// in the order of the official `fuse_conv_and_bn`.
    pub fn scale_shift(&self) -> Result<(Tensor, Tensor)> {
        let std = (self.running_var.as_tensor() + BN_EPS)?.sqrt()?;
        let scale = self.weight.div(&std)?;
        let shift = self
            .bias
            .sub(&self.weight.mul(self.running_mean.as_tensor())?.div(&std)?)?;
        Ok((scale, shift))
    }
}

/// Convolution (+ optional bias / BatchNorm / SiLU).
///
/// In inference builds BN is folded into `weight`/`bias` at load time; in training builds the
/// conv has no bias and a [`BatchNorm2d`].
pub struct Conv {
    /// Kernel (C_out, C_in/groups, k, k) f32.
    pub weight: Tensor,
    /// Bias reshaped to (1, C_out, 1, 1), if any.
    pub bias: Option<Tensor>,
    /// The bias as given, (C_out,) (the training graph's variable; its id keys the gradient).
    bias_var: Option<Tensor>,
    /// BatchNorm (training builds only).
    pub bn: Option<BatchNorm2d>,
    /// Stride.
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
    /// Groups.
    pub groups: usize,
    /// Apply SiLU after BN.
    pub act: bool,
    /// The kernel permuted to (C_out, k, k, C_in/groups) in the activations' dtype, for the
    /// channels-last inference forward ([`Conv::forward_nhwc`]); made on first use. Inference
    /// models never change their weights after loading, so it cannot go stale there.
    nhwc_weight: std::sync::OnceLock<Tensor>,
    /// The kernel as (27, C_out) f32 and the bias (C_out,) f32 of [`Conv::first_nhwc`], made on
    /// first use (inference models only, as `nhwc_weight`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    input_weight: std::sync::OnceLock<(Tensor, Tensor)>,
}

/// Geometry of a convolution.
#[derive(Debug, Clone, Copy)]
pub struct ConvSpec {
    /// Input channels.
    pub c1: usize,
    /// Output channels.
    pub c2: usize,
    /// Square kernel size.
    pub k: usize,
    /// Stride.
    pub s: usize,
    /// Zero padding per side.
    pub p: usize,
    /// Groups.
    pub g: usize,
    /// SiLU after BN.
    pub act: bool,
}

impl ConvSpec {
    /// `Conv(c1, c2, k, s)` with autopad `k/2`, groups 1, SiLU.
    pub fn new(c1: usize, c2: usize, k: usize, s: usize) -> Self {
        Self {
            c1,
            c2,
            k,
            s,
            p: k / 2,
            g: 1,
            act: true,
        }
    }
    /// Grouped convolution with `g` groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.g = g;
        self
    }
    /// No SiLU after the BatchNorm.
    pub fn no_act(mut self) -> Self {
        self.act = false;
        self
    }
    /// Padding `p` instead of `k / 2`.
    pub fn pad(mut self, p: usize) -> Self {
        self.p = p;
        self
    }
    fn wshape(&self) -> [usize; 4] {
        [self.c2, self.c1 / self.g, self.k, self.k]
    }
    fn fan_in(&self) -> f32 {
        ((self.c1 / self.g) * self.k * self.k) as f32
    }
}

/// Loads the raw pieces of an official `Conv` at `prefix` (`prefix.conv.weight`, `prefix.bn.*`).
/// Returns the kernel and the BN.
pub fn load_conv_bn(
    b: &mut Builder,
    prefix: &str,
    spec: ConvSpec,
) -> Result<(Tensor, BatchNorm2d)> {
    let c2 = spec.c2;
    let weight = b.param(
        &format!("{prefix}.conv.weight"),
        &spec.wshape(),
        ParamGroup::ConvWeight,
        Init::Uniform(1.0 / spec.fan_in().sqrt()),
    )?;
    let gamma = b.param(
        &format!("{prefix}.bn.weight"),
        &[c2],
        ParamGroup::BnWeight,
        Init::Const(1.0),
    )?;
    let beta = b.param(
        &format!("{prefix}.bn.bias"),
        &[c2],
        ParamGroup::Bias,
        Init::Const(0.0),
    )?;
    let rm = b.buffer(
        &format!("{prefix}.bn.running_mean"),
        &[c2],
        Init::Const(0.0),
    )?;
    let rv = b.buffer(&format!("{prefix}.bn.running_var"), &[c2], Init::Const(1.0))?;
    let running_mean = Var::from_tensor(&rm)?;
    let running_var = Var::from_tensor(&rv)?;
    if b.mode == BuildMode::Train {
        b.buffers.push((
            format!("{prefix}.bn"),
            running_mean.clone(),
            running_var.clone(),
        ));
    }
    let bn = BatchNorm2d {
        weight: gamma,
        bias: beta,
        running_mean,
        running_var,
    };
    Ok((weight, bn))
}

impl Conv {
    /// Loads an official `Conv` (conv without bias + BN + optional SiLU) at `prefix`.
    /// Inference builds fold the BN: `w' = w·γ/√(var+ε)`, `b' = β − γ·mean/√(var+ε)`.
    pub fn load(b: &mut Builder, prefix: &str, spec: ConvSpec) -> Result<Self> {
        let (weight, bn) =
            load_conv_bn(b, prefix, spec).with_context(|| format!("loading Conv `{prefix}`"))?;
        if b.mode == BuildMode::Fused {
            let (w, bias) = fold_bn(&weight, &bn)?;
            let (w, bias) = b.finish_fused(w, bias)?;
            Ok(Self::from_parts(w, Some(bias), spec))
        } else {
            let mut c = Self::from_parts(weight, None, spec);
            c.bn = Some(bn);
            Ok(c)
        }
    }

    /// Loads a plain biased `nn.Conv2d` (no BN, no activation) at `prefix` (`prefix.weight`,
    /// `prefix.bias`). `bias_init` is used for a missing bias in training builds.
    pub fn load_plain(
        b: &mut Builder,
        prefix: &str,
        spec: ConvSpec,
        bias_init: Option<f32>,
    ) -> Result<Self> {
        let bound = 1.0 / spec.fan_in().sqrt();
        let weight = b.param(
            &format!("{prefix}.weight"),
            &spec.wshape(),
            ParamGroup::ConvWeight,
            Init::Uniform(bound),
        )?;
        let init = match bias_init {
            Some(v) => Init::Const(v),
            None => Init::Uniform(bound),
        };
        let bias = b.param(
            &format!("{prefix}.bias"),
            &[spec.c2],
            ParamGroup::Bias,
            init,
        )?;
        let (weight, bias) = if b.mode == BuildMode::Fused {
            b.finish_fused(weight, bias)?
        } else {
            (weight, bias)
        };
        Ok(Self::from_parts(weight, Some(bias), spec.no_act()))
    }

    /// Builds from a kernel and an optional bias (C_out,).
    pub fn from_parts(weight: Tensor, bias: Option<Tensor>, spec: ConvSpec) -> Self {
        let c2 = spec.c2;
        let bias_var = bias.clone();
        let bias = bias.map(|b| b.reshape((1, c2, 1, 1)).unwrap_or(b));
        Self {
            weight,
            bias,
            bias_var,
            bn: None,
            stride: spec.s,
            padding: spec.p,
            groups: spec.g,
            act: spec.act,
            nhwc_weight: std::sync::OnceLock::new(),
            input_weight: std::sync::OnceLock::new(),
        }
    }

    /// [`Self::forward`] under a [`Ctx`]: taped (one tape node for conv + BN + activation, or
    /// conv + bias) when the context has a tape, the plain forward otherwise.
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Tensor> {
        ensure!(
            c.trace.is_none() || self.bn.is_none(),
            "tracing a convolution with an unfolded BatchNorm (trace an inference model)"
        );
        let y = match c.tape {
            Some(t) if c.train => self.forward_taped(x, t)?,
            _ if c.nhwc => self.forward_nhwc(x)?,
            _ => self.forward(x, c.train)?,
        };
        c.record(|| TracedOp::Conv {
            x: x.id(),
            y: y.id(),
            weight: self.weight.clone(),
            bias: self.bias_var.clone(),
            stride: self.stride,
            padding: self.padding,
            groups: self.groups,
            act: self.act,
        });
        Ok(y)
    }

    /// The eval-mode forward on channels-last tensors: `x` (B, H, W, C_in) → (B, H', W', C_out),
    /// cuDNN's NHWC convolution ([`crate::cuda::conv::conv2d_nhwc`]), or for a 1×1 convolution
    /// one cuBLAS product that reads `x` where it lies (a channel slice too:
    /// [`crate::cuda::gemm`]), then the folded bias and SiLU in one pass
    /// ([`super::bias_act::bias_act_nhwc`]). For inference models (BN folded) on CUDA; errors
    /// elsewhere.
    pub fn forward_nhwc(&self, x: &Tensor) -> Result<Tensor> {
        ensure!(
            self.bn.is_none(),
            "channels-last forward: a convolution with an unfolded BatchNorm"
        );
        let w = self.nhwc_weight(x.dtype(), x.dim(3)?)?;
        if let Some(y) = self.fused_nhwc(x, &w, None)? {
            return Ok(y);
        }
        let y = match self.pointwise_parts(&[x], &w)? {
            Some(y) => y,
            None => match pointwise_gemm(x, &w, (self.padding, self.stride, self.nhwc_groups()))? {
                Some(y) => y,
                None => conv2d_nhwc(x, &w, self.padding, self.stride, self.nhwc_groups())?,
            },
        };
        self.epilogue_nhwc(y)
    }

    /// The network's first convolution on channels-last half-precision CUDA inference, straight
    /// from the f32 NCHW input: `x` (B, 3, H, W) f32 → (B, ⌈H/2⌉, ⌈W/2⌉, C_out) in `dtype`, one
    /// kernel ([`crate::cuda::first_conv`]) in place of the input's cast to padded NHWC and the
    /// cuDNN convolution. Applies to an inference convolution (BN folded, bias present) 3 → C_out,
    /// 3×3, stride 2, padding 1, no groups (the first layer of every YOLOv9 model), C_out a
    /// multiple of 8, f16/bf16, switch `YOLO9_INPUT_CONV` not `0`; `None` elsewhere.
    pub fn first_nhwc(&self, x: &Tensor, dtype: DType) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        {
            static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            let on = *ON.get_or_init(|| !crate::switches::off("YOLO9_INPUT_CONV"));
            let (k, ci, kh, kw) = self.weight.dims4()?;
            let applies = on
                && x.device().is_cuda()
                && x.dtype() == DType::F32
                && x.dims4()?.1 == 3
                && matches!(dtype, DType::F16 | DType::BF16)
                && self.bn.is_none()
                && self.bias.is_some()
                && (ci, kh, kw, self.groups, self.stride, self.padding) == (3, 3, 3, 1, 2, 1)
                && k.is_multiple_of(8)
                && k <= crate::cuda::first_conv::MAX_CHANNELS;
            if !applies {
                return Ok(None);
            }
            let (w, b) = match self.input_weight.get() {
                Some(wb) => wb,
                None => {
                    let w = self.weight.detach().to_dtype(DType::F32)?;
                    let w = w.reshape((k, 27))?.t()?.contiguous()?;
                    let b = self.bias_as(DType::F32)?.context("a bias")?.contiguous()?;
                    self.input_weight.get_or_init(|| (w, b))
                }
            };
            return Ok(Some(crate::cuda::first_conv::first_conv(
                x, w, b, self.act, dtype,
            )?));
        }
        #[allow(unreachable_code)]
        {
            let _ = (x, dtype);
            Ok(None)
        }
    }

    /// [`Conv::run`] of the channel concatenation of `parts` (`cv4(cat[y, a, c])` of the ELAN
    /// blocks). On channels-last inference activations a 1×1 convolution sums one product per
    /// part into its output ([`crate::cuda::gemm::pointwise_parts`]) and the concatenation is
    /// never built; otherwise the concatenation, then [`Conv::run`].
    pub fn run_cat(&self, parts: &[&Tensor], c: Ctx) -> Result<Tensor> {
        if c.is_plain_nhwc() && self.bn.is_none() {
            if let Some(first) = parts.first() {
                let w = self.nhwc_weight(first.dtype(), 0)?;
                if let Some(y) = self.pointwise_parts(parts, &w)? {
                    return self.epilogue_nhwc(y);
                }
            }
        }
        self.run(&c.cat(parts, 1)?, c)
    }

    /// The groups of the channels-last forward: 1 where the kernel is made dense
    /// ([`Self::nhwc_weight`]: a convolution of at most [`DENSE_GROUPS`] groups, such as the box
    /// branch of `DDetect`, `g=4`), `groups` otherwise.
    fn nhwc_groups(&self) -> usize {
        if self.groups <= DENSE_GROUPS {
            1
        } else {
            self.groups
        }
    }

    /// The kernel permuted to (C_out, k, k, C_in/g) in `dtype` with g = [`Self::nhwc_groups`],
    /// made on first use. A grouped kernel made dense is block-diagonal: output channels of group
    /// i see input channels of group i, zero weights elsewhere (the same sums, zero terms added;
    /// cuDNN runs grouped convolutions one group at a time on slower kernels, ~1 ms of the f16
    /// batch-32 forward of yolov9-s on an H100). With zero input channels appended up to `c_in`
    /// where the input has more channels than the kernel (the network's input padded to 8 channels
    /// by `model::layout::nhwc_from_nchw`).
    fn nhwc_weight(&self, dtype: DType, c_in: usize) -> Result<Tensor> {
        let (k, cg, _, _) = self.weight.dims4()?;
        let c = cg * self.groups / self.nhwc_groups();
        let extra = if self.nhwc_groups() == 1 {
            c_in.saturating_sub(c)
        } else {
            0
        };
        if let Some(w) = self.nhwc_weight.get() {
            if w.dtype() == dtype && w.dim(3)? == c + extra {
                return Ok(w.clone());
            }
        }
        let mut w = self
            .weight
            .detach()
            .to_dtype(dtype)?
            .permute((0, 2, 3, 1))?;
        if self.groups > 1 && self.nhwc_groups() == 1 {
            let kg = k / self.groups;
            let blocks = (0..self.groups)
                .map(|g| {
                    w.narrow(0, g * kg, kg)?
                        .pad_with_zeros(3, g * cg, (self.groups - 1 - g) * cg)
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            w = Tensor::cat(&blocks, 0)?;
        }
        if extra > 0 {
            w = w.pad_with_zeros(3, 0, extra)?;
        }
        let w = w.contiguous()?;
        let _ = self.nhwc_weight.set(w.clone());
        Ok(w)
    }

    /// A 1×1 convolution (stride 1, no padding, no groups) of channels-last CUDA `parts` whose
    /// pixels are evenly spaced, by [`crate::cuda::gemm::pointwise_parts`] with the permuted
    /// kernel `w` (C_out, 1, 1, C_in); `None` where it does not apply.
    fn pointwise_parts(&self, parts: &[&Tensor], w: &Tensor) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if let Some(w2) = self.pointwise_weight(parts, w)? {
            return Ok(Some(crate::cuda::gemm::pointwise_parts(parts, &w2)?));
        }
        let _ = (parts, w);
        Ok(None)
    }

    /// The permuted kernel `w` (C_out, 1, 1, C_in) as the (C_out, C_in) matrix of
    /// [`crate::cuda::gemm`]'s products, where they apply: a 1×1 convolution (stride 1, no
    /// padding, no groups) of non-empty CUDA `parts` whose pixels are evenly spaced; `None`
    /// elsewhere.
    #[cfg(feature = "cuda")]
    fn pointwise_weight(&self, parts: &[&Tensor], w: &Tensor) -> Result<Option<Tensor>> {
        let (k, kh, kw, c) = w.dims4()?;
        let pointwise = kh == 1 && kw == 1 && self.stride == 1 && self.padding == 0;
        let fits = pointwise
            && self.nhwc_groups() == 1
            && !parts.is_empty()
            && parts.iter().all(|p| {
                p.device().is_cuda() && crate::cuda::gemm::row_stride(p.layout()).is_some()
            });
        Ok(if fits { Some(w.reshape((k, c))?) } else { None })
    }

    /// The convolution, its folded bias, SiLU and `residual` (added last) as one cuDNN graph
    /// ([`crate::cuda::fused_conv::conv_bias_act_nhwc`]); `None` where that does not apply (no
    /// bias, not f16/bf16 on CUDA, a shape no cuDNN engine runs, builds without `cuda`).
    fn fused_nhwc(
        &self,
        x: &Tensor,
        w: &Tensor,
        residual: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        #[cfg(feature = "cuda")]
        if let Some(b) = self.bias_as(x.dtype())? {
            let geometry = (self.padding, self.stride, self.nhwc_groups());
            return Ok(crate::cuda::fused_conv::conv_bias_act_nhwc(
                x, w, &b, geometry, self.act, residual,
            )?);
        }
        let _ = (x, w, residual);
        Ok(None)
    }

    /// `residual + self.run(x)` (the shortcut of `RepNBottleneck`): on channels-last inference
    /// activations the sum is the last step of the fused convolution
    /// ([`crate::cuda::fused_conv`]); otherwise [`Conv::run`], then the addition.
    pub fn run_add(&self, x: &Tensor, residual: &Tensor, c: Ctx) -> Result<Tensor> {
        if c.is_plain_nhwc() && self.bn.is_none() {
            let w = self.nhwc_weight(x.dtype(), x.dim(3)?)?;
            if let Some(y) = self.fused_nhwc(x, &w, Some(residual))? {
                return Ok(y);
            }
        }
        let y = self.run(x, c)?;
        c.add(residual, &y)
    }

    /// The output channels.
    pub fn out_channels(&self) -> usize {
        self.weight.dims()[0]
    }

    /// [`Conv::run`] (with `residual`: [`Conv::run_add`]) written into channels
    /// `c_off .. c_off + C_out` of `out`, a contiguous `(B, H', W', C_total)` channels-last
    /// tensor (a concatenation built in place: [`super::layout::concat_buffer`]): one fused cuDNN
    /// graph writing there where it applies ([`crate::cuda::fused_conv::conv_bias_act_nhwc_into`]),
    /// otherwise the output made as usual and copied there.
    pub fn run_into(
        &self,
        x: &Tensor,
        residual: Option<&Tensor>,
        c: Ctx,
        (out, c_off): (&Tensor, usize),
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if c.is_plain_nhwc() && self.bn.is_none() {
            if let Some(b) = self.bias_as(x.dtype())? {
                let w = self.nhwc_weight(x.dtype(), x.dim(3)?)?;
                let geometry = (self.padding, self.stride, self.nhwc_groups());
                let (act, slot) = (self.act, (out, c_off));
                if crate::cuda::fused_conv::conv_bias_act_nhwc_into(
                    x, &w, &b, geometry, act, residual, slot,
                )? {
                    return Ok(());
                }
            }
        }
        let y = match residual {
            Some(r) => self.run_add(x, r, c)?,
            None => self.run(x, c)?,
        };
        Ok(out.slice_set(&y.contiguous()?, 3, c_off)?)
    }

    /// [`Conv::run_cat`] written into channels `c_off .. c_off + C_out` of `out` (a
    /// concatenation built in place, [`super::layout::concat_buffer`]) where a 1×1 convolution of
    /// channels-last inference parts applies: the products summed straight into the slot
    /// ([`crate::cuda::gemm::pointwise_parts_into`]), then the folded bias and SiLU in place
    /// ([`crate::cuda::bias_act::bias_act_slot_in_place`]), so the output is never copied.
    ///
    /// `up`: the part that is still at half the others' height and width, to be upsampled 2×
    /// (nearest) first. Its product is taken at its own resolution
    /// ([`crate::cuda::gemm::pointwise_part_at`]: a 1×1 convolution commutes with the
    /// upsampling, on a quarter of the pixels) and upsampled inside the bias + SiLU pass.
    ///
    /// `false` (nothing written) elsewhere: the caller runs [`Conv::run_cat`] (on the upsampled
    /// part) and copies.
    pub fn run_cat_into(
        &self,
        parts: &[&Tensor],
        up: Option<usize>,
        c: Ctx,
        slot: (&Tensor, usize),
    ) -> Result<bool> {
        #[cfg(feature = "cuda")]
        if c.is_plain_nhwc() && self.bn.is_none() {
            let (out, c_off) = slot;
            let full: Vec<&Tensor> = (0..parts.len())
                .filter(|&i| Some(i) != up)
                .map(|i| parts[i])
                .collect();
            let Some(first) = full.first() else {
                return Ok(false);
            };
            let dtype = first.dtype();
            let Some(b) = self.bias_as(dtype)? else {
                return Ok(false);
            };
            let Some(w) = self.pointwise_weight(parts, &self.nhwc_weight(dtype, 0)?)? else {
                return Ok(false);
            };
            let k = w.dim(0)?;
            let (ob, oh, ow, ctot) = out.dims4()?;
            let low_fits = up.is_none_or(|u| {
                parts.get(u).is_some_and(|p| {
                    p.dims()[..3] == [ob, oh / 2, ow / 2] && oh % 2 == 0 && ow % 2 == 0
                })
            });
            let fits = matches!(dtype, DType::F16 | DType::BF16)
                && out.dtype() == dtype
                && out.is_contiguous()
                && out.device().is_cuda()
                && c_off + k <= ctot
                && low_fits
                && [k, c_off, ctot, out.layout().start_offset()]
                    .iter()
                    .all(|v| v.is_multiple_of(8));
            if !fits {
                return Ok(false);
            }
            let low = match up {
                None => {
                    crate::cuda::gemm::pointwise_parts_into(parts, None, &w, slot)?;
                    None
                }
                Some(u) => {
                    // Each part's first column of the kernel, as the concatenation orders them.
                    let mut cols = Vec::with_capacity(parts.len());
                    let mut col = 0;
                    for p in parts {
                        cols.push(col);
                        col += p.dim(3)?;
                    }
                    let low = crate::cuda::gemm::pointwise_part_at(parts[u], cols[u], &w)?;
                    let full_cols: Vec<usize> = (0..parts.len())
                        .filter(|&i| i != u)
                        .map(|i| cols[i])
                        .collect();
                    crate::cuda::gemm::pointwise_parts_into(&full, Some(&full_cols), &w, slot)?;
                    Some(low)
                }
            };
            ensure!(
                crate::cuda::bias_act::bias_act_slot_in_place(
                    out,
                    c_off,
                    &b,
                    self.act,
                    low.as_ref()
                )?,
                "the in-place bias of a {k}-channel slot at {c_off} of {ctot} was refused"
            );
            return Ok(true);
        }
        let _ = (parts, up, c, slot);
        Ok(false)
    }

    /// The channels-last epilogue: the folded bias and SiLU in one pass, or SiLU alone.
    fn epilogue_nhwc(&self, y: Tensor) -> Result<Tensor> {
        match self.bias_as(y.dtype())? {
            Some(b) => Ok(super::bias_act::bias_act_nhwc(&y, &b, self.act)?),
            None if self.act => Ok(y.silu()?),
            None => Ok(y),
        }
    }

    /// The folded bias as a flat `(C_out,)` tensor of `dtype` for the inference epilogues
    /// (detached; a no-op cast when the model already runs in `dtype`). `None`: no bias.
    fn bias_as(&self, dtype: DType) -> Result<Option<Tensor>> {
        self.bias
            .as_ref()
            .map(|b| Ok(b.detach().to_dtype(dtype)?.flatten_all()?))
            .transpose()
    }

    /// The taped train-mode forward: the convolution, then train-mode BN + SiLU
    /// ([`bn_act::bn_act_apply`]) or the bias, on detached parameters; one tape node whose
    /// backward is the fused BN + SiLU backward, then the convolution's input and weight
    /// gradients ([`conv2d_backward_any`]). Mixed precision (a bf16 `x`) casts the kernel to bf16
    /// for the forward and the weight gradient back to the parameter's dtype.
    fn forward_taped(&self, x: &Tensor, tape: &Tape) -> Result<Tensor> {
        let (pad, stride, groups) = (self.padding, self.stride, self.groups);
        let wt = self.weight.dtype();
        let w = self.weight.detach();
        let w = if w.dtype() != x.dtype() {
            w.to_dtype(x.dtype())?
        } else {
            w
        };
        // A channel slice (a `chunk`) is copied by the row kernel, not inside the convolution.
        // The node saves the slice itself and its backward copies it again: keeping the copy
        // would hold one more activation until the backward.
        let z = conv2d_train(&super::ew::contiguous(x)?, &w, pad, stride, groups)?;
        let xs = x.clone();
        if let Some(bn) = &self.bn {
            ensure!(
                bn_act::bn_act_supported(z.device(), z.dtype()),
                "taped training forward: no fused train-mode BN for {:?} on {:?}",
                z.dtype(),
                z.device()
            );
            let p = bn.fused_block(&z)?;
            let silu = self.act;
            let y = bn_act::bn_act_apply(&z, &p, BN_EPS, silu)?;
            tape.record(
                &[x],
                &[&self.weight, &bn.weight, &bn.bias],
                &y,
                move |dy, need| {
                    let (dz, dg, db) = bn_act::bn_act_backward(&z, dy, &p, BN_EPS, silu, true)?;
                    let dz = dz.context("BN backward returned no input gradient")?;
                    let xs = super::ew::contiguous(&xs)?;
                    let (dx, dw) = conv2d_backward_any(&xs, &w, &dz, pad, stride, groups, need[0])?;
                    Ok(vec![dx, Some(dw.to_dtype(wt)?), Some(dg), Some(db)])
                },
            );
            return Ok(y);
        }
        ensure!(
            !self.act,
            "taped training forward: a plain convolution with an activation"
        );
        let (y, bias) = match (&self.bias, &self.bias_var) {
            (Some(b4), Some(bv)) => {
                // On CUDA one pass of the bias kernel instead of candle's broadcast add.
                let y = if z.device().is_cuda() && z.rank() == 4 && bv.rank() == 1 {
                    let b = bv.detach().to_dtype(z.dtype())?;
                    super::bias_act::bias_act(&z, &b, false)?
                } else {
                    z.broadcast_add(&b4.detach().to_dtype(z.dtype())?)?
                };
                (y, Some(bv.clone()))
            }
            _ => (z, None),
        };
        let mut params = vec![self.weight.clone()];
        params.extend(bias.clone());
        let params: Vec<&Tensor> = params.iter().collect();
        tape.record(&[x], &params, &y, move |dy, need| {
            let dy = super::ew::contiguous(dy)?;
            let xs = super::ew::contiguous(&xs)?;
            let (dx, dw) = conv2d_backward_any(&xs, &w, &dy, pad, stride, groups, need[0])?;
            let mut g = vec![dx, Some(dw.to_dtype(wt)?)];
            if let Some(b) = &bias {
                let db = dy
                    .to_dtype(b.dtype())?
                    .sum_keepdim(3)?
                    .sum_keepdim(2)?
                    .sum_keepdim(0)?
                    .reshape(b.shape())?;
                g.push(Some(db));
            }
            Ok(g)
        });
        Ok(y)
    }

    /// x: (B, C_in, H, W) f32 → (B, C_out, H', W') with `H' = (H + 2p − k)/s + 1`.
    ///
    /// In eval mode (`train == false`) the parameters are used detached, so an evaluation of a
    /// training graph (whose parameters are variables) records no autograd graph and frees each
    /// activation as soon as the next layer has used it.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let w = if train {
            self.weight.clone()
        } else {
            self.weight.detach()
        };
        // Mixed precision: a bf16 input runs the convolution in bf16 (differentiable cast).
        let w = if w.dtype() != x.dtype() {
            w.to_dtype(x.dtype())?
        } else {
            w
        };
        let mut y = conv2d_any(x, &w, self.padding, self.stride, self.groups)?;
        if let (Some(b), None, false) = (&self.bias, &self.bn, train) {
            if super::bias_act::fused_on(&y) && b.dtype() == y.dtype() {
                // Inference with BN folded: bias + SiLU in one pass.
                return Ok(super::bias_act::bias_act(&y, &b.detach(), self.act)?);
            }
        }
        if let Some(b) = &self.bias {
            let b = if train { b.clone() } else { b.detach() };
            let b = if b.dtype() != y.dtype() {
                b.to_dtype(y.dtype())?
            } else {
                b
            };
            y = y.broadcast_add(&b)?;
        }
        if let Some(bn) = &self.bn {
            return bn.forward_act(&y, train, self.act);
        }
        if self.act {
            y = y.silu()?;
        }
        Ok(y)
    }
}

/// A channels-last 1×1 convolution (stride 1, no padding, one group) of inference on CUDA as
/// one matrix product (cuBLAS through candle's `matmul`), or `None` where that does not apply
/// (another kernel, the CPU): `x` (B, H, W, C) is the (B·H·W, C)
/// matrix and `w` (K, 1, 1, C) gives (B·H·W, K) = x · wᵀ, already (B, H, W, K). cuDNN's legacy
/// API runs many yolov9 1×1 shapes channels-last on its FMA kernel (`implicit_convolve_sgemm`);
/// on the H200 (yolov9-s, batch 32, 480x640, `benches/detect.rs`, one device command) the f16
/// channels-last forward took 10.0 ms with the product and 12.7 ms without. On NCHW tensors the
/// batched product was slower than cuDNN in f32 (20.5 against 19.3 ms), so NCHW keeps cuDNN.
/// Same values up to summation order; f32 without TF32 (candle's default), as the strict cuDNN
/// path.
pub fn pointwise_gemm(
    x: &Tensor,
    w: &Tensor,
    (pad, stride, groups): (usize, usize, usize),
) -> Result<Option<Tensor>> {
    if !x.device().is_cuda() || pad != 0 || stride != 1 || groups != 1 {
        return Ok(None);
    }
    let (k, kh, kw, c) = w.dims4()?;
    if kh != 1 || kw != 1 {
        return Ok(None);
    }
    let (b, h, wd, cx) = x.dims4()?;
    ensure!(
        cx == c,
        "1x1 convolution: input has {cx} channels, kernel {c}"
    );
    let y = x
        .reshape((b * h * wd, c))?
        .matmul(&w.reshape((k, c))?.t()?)?;
    Ok(Some(y.reshape((b, h, wd, k))?))
}

/// The channels-last convolution of [`Conv::forward_nhwc`] (cuDNN's NHWC format); builds
/// without the `cuda` feature have none.
#[cfg(feature = "cuda")]
fn conv2d_nhwc(x: &Tensor, w: &Tensor, pad: usize, stride: usize, groups: usize) -> Result<Tensor> {
    Ok(crate::cuda::conv::conv2d_nhwc(x, w, pad, stride, groups)?)
}

#[cfg(not(feature = "cuda"))]
fn conv2d_nhwc(_: &Tensor, _: &Tensor, _: usize, _: usize, _: usize) -> Result<Tensor> {
    anyhow::bail!("channels-last convolutions need the cuda feature")
}

/// The one 2-D convolution of the model: `x (N, C_in, H, W) ⊛ w (C_out, C_in/groups, k, k)`,
/// zero `padding` per side, `stride`, dilation 1, `groups`.
///
/// With the `cuda` feature and `x` on a CUDA device (f32/f16/bf16) this is the cuDNN op
/// [`crate::cuda::conv::conv2d`] (forward and backward on cuDNN, f32 without TF32). On the CPU,
/// tensors that need no gradient (inference, validation) go through
/// [`super::cpu_conv::conv2d`] (im2col + one GEMM in the fast orientation; `YOLO9_CPU_CONV=candle`
/// turns it off); everything else through candle's `Tensor::conv2d`.
pub fn conv2d_any(
    x: &Tensor,
    w: &Tensor,
    padding: usize,
    stride: usize,
    groups: usize,
) -> candle_core::Result<Tensor> {
    if super::cpu_conv::applies(x, w, groups) {
        return super::cpu_conv::conv2d(x, w, padding, stride);
    }
    conv2d_train(x, w, padding, stride, groups)
}

/// The convolution of training forwards, tracked or not: cuDNN on CUDA
/// ([`crate::cuda::conv::conv2d`]); on the CPU (f32, groups 1) the CPU convolution as a tracked op
/// ([`super::cpu_conv::conv2d_tracked`], whose backward is GEMMs instead of candle's
/// `conv_transpose2d`); candle's `conv2d` otherwise (and with `YOLO9_CPU_CONV=candle`). A taped
/// forward and an untaped one use the same op, so they compute the same values.
pub fn conv2d_train(
    x: &Tensor,
    w: &Tensor,
    padding: usize,
    stride: usize,
    groups: usize,
) -> candle_core::Result<Tensor> {
    if super::cpu_conv::applies_tracked(x, w, groups) {
        return super::cpu_conv::conv2d_tracked(x, w, padding, stride);
    }
    #[cfg(feature = "cuda")]
    {
        crate::cuda::conv::conv2d(x, w, padding, stride, groups)
    }
    #[cfg(not(feature = "cuda"))]
    {
        x.conv2d(w, padding, stride, 1, groups)
    }
}

/// The gradients of [`conv2d_any`] `y = conv(x, w)` for the output gradient `dy`: `dx` (when
/// `need_dx`) and `dw`, each of its argument's shape and dtype. On CUDA this is cuDNN's
/// backward-data and backward-filter ([`crate::cuda::conv::conv2d_backward`]); on the CPU
/// [`super::cpu_conv::conv2d_backward`] (f32, groups 1); elsewhere candle's own convolution
/// backward through [`tape::vjp`].
pub fn conv2d_backward_any(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    padding: usize,
    stride: usize,
    groups: usize,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor)> {
    #[cfg(feature = "cuda")]
    if let Some(r) = crate::cuda::conv::conv2d_backward(x, w, dy, padding, stride, groups, need_dx)?
    {
        return Ok(r);
    }
    if super::cpu_conv::applies_tracked(x, w, groups) {
        return Ok(super::cpu_conv::conv2d_backward(
            x, w, dy, padding, stride, need_dx,
        )?);
    }
    let mut g = tape::vjp(
        |v| v[0].conv2d(&v[1], padding, stride, 1, groups),
        &[x, w],
        dy,
    )?;
    let dw = g.pop().context("vjp returned no kernel gradient")?;
    let dx = g.pop().filter(|_| need_dx);
    Ok((dx, dw))
}

/// Folds an eval-mode BN into the preceding bias-free conv: returns the kernel (C_out, …) and the
/// bias (C_out,). Follows the official `fuse_conv_and_bn` (f32 arithmetic, ε = 1e-3).
pub fn fold_bn(weight: &Tensor, bn: &BatchNorm2d) -> Result<(Tensor, Tensor)> {
    let (scale, shift) = bn.scale_shift()?;
    let c2 = weight.dim(0)?;
    let w = weight.broadcast_mul(&scale.reshape((c2, 1, 1, 1))?)?;
    Ok((w.contiguous()?, shift.to_dtype(DType::F32)?))
}
