//! The building blocks of YOLOv9-s (official `models/common.py`), each named and laid out like the
//! official modules so the state_dict keys map 1:1 (`{prefix}.cv1.conv.weight`, …).
//!
//! Every `forward(x, train)` takes NCHW f32 and a flag: `train = true` uses batch-statistics BN
//! (training builds only) and differentiable pooling.

use super::conv::{fold_bn, load_conv_bn, Conv, ConvSpec};
use super::params::{BuildMode, Builder};
use super::tape::Ctx;
use anyhow::{Context, Result};
use candle_core::Tensor;

/// `RepConvN(c1, c2, k=3)`: SiLU(BN(conv3x3(x)) + BN(conv1x1(x))), no identity branch.
/// Inference builds fuse both branches into one 3×3 conv: kernel `k3 + pad(k1)`, bias `b3 + b1`
/// (official `RepConvN.fuse_convs`).
pub enum RepConvN {
    /// The two branches fused into one 3×3 conv + SiLU.
    Fused(Conv),
    /// Training form: `conv1` (3×3, BN, no act) and `conv2` (1×1, BN, no act).
    Branches {
        /// 3×3 branch (`{prefix}.conv1`).
        conv1: Conv,
        /// 1×1 branch (`{prefix}.conv2`).
        conv2: Conv,
    },
}

impl RepConvN {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, c1: usize, c2: usize) -> Result<Self> {
        let s3 = ConvSpec::new(c1, c2, 3, 1).no_act();
        let s1 = ConvSpec::new(c1, c2, 1, 1).no_act();
        if b.mode == BuildMode::Fused {
            let (w3, bn3) = load_conv_bn(b, &format!("{prefix}.conv1"), s3)?;
            let (w1, bn1) = load_conv_bn(b, &format!("{prefix}.conv2"), s1)?;
            let (w3, b3) = fold_bn(&w3, &bn3)?;
            let (w1, b1) = fold_bn(&w1, &bn1)?;
            let w1 = w1.pad_with_zeros(2, 1, 1)?.pad_with_zeros(3, 1, 1)?;
            let w = (w3 + w1)?.contiguous()?;
            let (w, bias) = b.finish_fused(w, (b3 + b1)?)?;
            Ok(Self::Fused(Conv::from_parts(
                w,
                Some(bias),
                ConvSpec::new(c1, c2, 3, 1),
            )))
        } else {
            Ok(Self::Branches {
                conv1: Conv::load(b, &format!("{prefix}.conv1"), s3)?,
                conv2: Conv::load(b, &format!("{prefix}.conv2"), s1)?,
            })
        }
    }

    /// x: (B, c1, H, W) → (B, c2, H, W).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.run(x, Ctx::plain(train))
    }

    /// [`Self::forward`] under a [`Ctx`] (taped or plain).
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Tensor> {
        match self {
            Self::Fused(conv) => conv.run(x, c),
            Self::Branches { conv1, conv2 } => {
                c.silu(&c.add(&conv1.run(x, c)?, &conv2.run(x, c)?)?)
            }
        }
    }
}

/// `RepNBottleneck(c, c, shortcut=True, e=1.0)`: `x + cv2(cv1(x))` with `cv1` a [`RepConvN`] and
/// `cv2` a 3×3 [`Conv`].
pub struct RepNBottleneck {
    /// `{prefix}.cv1`.
    pub cv1: RepConvN,
    /// `{prefix}.cv2`.
    pub cv2: Conv,
    /// Residual add (`shortcut and c1 == c2`).
    pub add: bool,
}

impl RepNBottleneck {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, c1: usize, c2: usize) -> Result<Self> {
        Ok(Self {
            cv1: RepConvN::load(b, &format!("{prefix}.cv1"), c1, c2)?,
            cv2: Conv::load(b, &format!("{prefix}.cv2"), ConvSpec::new(c2, c2, 3, 1))?,
            add: c1 == c2,
        })
    }

    /// x: (B, c1, H, W) → (B, c2, H, W).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.run(x, Ctx::plain(train))
    }

    /// [`Self::forward`] under a [`Ctx`] (taped or plain).
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Tensor> {
        let h = self.cv1.run(x, c)?;
        if self.add {
            self.cv2.run_add(&h, x, c)
        } else {
            self.cv2.run(&h, c)
        }
    }

    /// [`Self::run`] written into channels `slot.1 ..` of `slot.0` ([`Conv::run_into`]).
    pub fn run_into(&self, x: &Tensor, c: Ctx, slot: (&Tensor, usize)) -> Result<()> {
        let h = self.cv1.run(x, c)?;
        self.cv2.run_into(&h, self.add.then_some(x), c, slot)
    }
}

/// The buffer of a channels-last concatenation of `channels` built in place, shaped as `x`
/// spatially, on plain channels-last inference activations ([`super::layout::concat_buffer`]).
fn cat_buffer(c: Ctx, x: &Tensor, channels: usize) -> Result<Option<Tensor>> {
    if !c.is_plain_nhwc() {
        return Ok(None);
    }
    super::layout::concat_buffer(x, channels)
}

/// The buffer of a block's concatenation (`channels` wide) with `cv1` of the parts written in
/// its first channels ([`Conv::run_cat_into`], `up` as there); `None` where that does not apply.
fn cv1_parts_in_place(
    cv1: &Conv,
    parts: &[&Tensor],
    up: Option<usize>,
    cx: Ctx,
    channels: usize,
) -> Result<Option<Tensor>> {
    // The buffer has the pixels of the parts at full resolution.
    let Some(full) = (0..parts.len()).find(|&i| Some(i) != up) else {
        return Ok(None);
    };
    match cat_buffer(cx, parts[full], channels)? {
        Some(buf) if cv1.run_cat_into(parts, up, cx, (&buf, 0))? => Ok(Some(buf)),
        _ => Ok(None),
    }
}

/// `cv1` of the unjoined parts of a concatenation, `up` (if any) the part still to be
/// upsampled 2× (nearest) to the others' resolution: upsampled here, then [`Conv::run_cat`].
fn cv1_of_parts(cv1: &Conv, parts: &[&Tensor], up: Option<usize>, cx: Ctx) -> Result<Tensor> {
    let Some(u) = up else {
        return cv1.run_cat(parts, cx);
    };
    let upsampled = cx.upsample_nearest_2x(parts[u])?;
    let mut joined = parts.to_vec();
    joined[u] = &upsampled;
    cv1.run_cat(&joined, cx)
}

/// `RepNCSP(c1, c2, n)`: `cv3(cat(m(cv1(x)), cv2(x)))` with hidden width `c2/2`.
pub struct RepNCSP {
    /// `{prefix}.cv1`: 1×1, c1 → c2/2.
    pub cv1: Conv,
    /// `{prefix}.cv2`: 1×1, c1 → c2/2.
    pub cv2: Conv,
    /// `{prefix}.cv3`: 1×1, c2 → c2.
    pub cv3: Conv,
    /// `{prefix}.m.{i}`.
    pub m: Vec<RepNBottleneck>,
}

impl RepNCSP {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, c1: usize, c2: usize, n: usize) -> Result<Self> {
        let c_ = c2 / 2;
        Ok(Self {
            cv1: Conv::load(b, &format!("{prefix}.cv1"), ConvSpec::new(c1, c_, 1, 1))?,
            cv2: Conv::load(b, &format!("{prefix}.cv2"), ConvSpec::new(c1, c_, 1, 1))?,
            cv3: Conv::load(b, &format!("{prefix}.cv3"), ConvSpec::new(2 * c_, c2, 1, 1))?,
            m: (0..n)
                .map(|i| RepNBottleneck::load(b, &format!("{prefix}.m.{i}"), c_, c_))
                .collect::<Result<_>>()?,
        })
    }

    /// x: (B, c1, H, W) → (B, c2, H, W).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.run(x, Ctx::plain(train))
    }

    /// [`Self::forward`] under a [`Ctx`] (taped or plain).
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Tensor> {
        // Inference: a channel half of the enclosing block (a strided view) is read in place by
        // both 1×1 convolutions on channels-last CUDA activations (`crate::cuda::gemm`), and
        // elsewhere copied once for both, not once by each.
        let in_place = c.nhwc && cfg!(feature = "cuda") && x.device().is_cuda();
        let x = &if in_place {
            x.clone()
        } else {
            c.contiguous_for_eval(x)?
        };
        let c_ = self.cv1.out_channels();
        if let Some(buf) = cat_buffer(c, x, 2 * c_)? {
            // cat(m(cv1(x)), cv2(x)) built in place, then cv3 reads it as one input.
            match self.m.split_last() {
                None => self.cv1.run_into(x, None, c, (&buf, 0))?,
                Some((last, rest)) => {
                    let mut y = self.cv1.run(x, c)?;
                    for m in rest {
                        y = m.run(&y, c)?;
                    }
                    last.run_into(&y, c, (&buf, 0))?;
                }
            }
            self.cv2.run_into(x, None, c, (&buf, c_))?;
            return self.cv3.run(&buf, c);
        }
        let mut y = self.cv1.run(x, c)?;
        for m in &self.m {
            y = m.run(&y, c)?;
        }
        let z = self.cv2.run(x, c)?;
        self.cv3.run_cat(&[&y, &z], c)
    }
}

/// `RepNCSPELAN4(c1, c2, c3, c4, n)`: split `cv1(x)` in two halves, chain
/// `cv2 = RepNCSP + Conv3x3` and `cv3 = RepNCSP + Conv3x3` on the second half, concatenate the
/// four pieces and fuse with `cv4` (1×1).
pub struct RepNCSPELAN4 {
    /// `{prefix}.cv1`: 1×1, c1 → c3.
    pub cv1: Conv,
    /// `{prefix}.cv2.0` (RepNCSP c3/2 → c4) and `{prefix}.cv2.1` (Conv 3×3).
    pub cv2: (RepNCSP, Conv),
    /// `{prefix}.cv3.0` (RepNCSP c4 → c4) and `{prefix}.cv3.1` (Conv 3×3).
    pub cv3: (RepNCSP, Conv),
    /// `{prefix}.cv4`: 1×1, c3 + 2·c4 → c2.
    pub cv4: Conv,
    c: usize,
}

impl RepNCSPELAN4 {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, [c1, c2, c3, c4, n]: [usize; 5]) -> Result<Self> {
        let r = (|| -> Result<Self> {
            Ok(Self {
                cv1: Conv::load(b, &format!("{prefix}.cv1"), ConvSpec::new(c1, c3, 1, 1))?,
                cv2: (
                    RepNCSP::load(b, &format!("{prefix}.cv2.0"), c3 / 2, c4, n)?,
                    Conv::load(b, &format!("{prefix}.cv2.1"), ConvSpec::new(c4, c4, 3, 1))?,
                ),
                cv3: (
                    RepNCSP::load(b, &format!("{prefix}.cv3.0"), c4, c4, n)?,
                    Conv::load(b, &format!("{prefix}.cv3.1"), ConvSpec::new(c4, c4, 3, 1))?,
                ),
                cv4: Conv::load(
                    b,
                    &format!("{prefix}.cv4"),
                    ConvSpec::new(c3 + 2 * c4, c2, 1, 1),
                )?,
                c: c3 / 2,
            })
        })();
        r.with_context(|| format!("loading RepNCSPELAN4 `{prefix}`"))
    }

    /// x: (B, c1, H, W) → (B, c2, H, W).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.run(x, Ctx::plain(train))
    }

    /// [`Self::forward`] under a [`Ctx`] (taped or plain).
    pub fn run(&self, x: &Tensor, cx: Ctx) -> Result<Tensor> {
        if let Some(buf) = cat_buffer(cx, x, self.cat_channels())? {
            self.cv1.run_into(x, None, cx, (&buf, 0))?;
            return self.rest_in_place(&buf, cx);
        }
        self.after_cv1(self.cv1.run(x, cx)?, cx)
    }

    /// [`Self::run`] of the channel concatenation of `parts` (a `Concat` layer read by this
    /// block alone): `cv1` reads the parts without the concatenation ([`Conv::run_cat`]), into
    /// the block's own concatenation where that is built in place ([`Conv::run_cat_into`]).
    /// `up`: the part that is at half the others' height and width, to be upsampled 2× (nearest)
    /// first (the head's `nn.Upsample`, left to this block, which may take `cv1`'s product
    /// before the upsampling).
    pub fn run_cat(&self, parts: &[&Tensor], up: Option<usize>, cx: Ctx) -> Result<Tensor> {
        if let Some(buf) = cv1_parts_in_place(&self.cv1, parts, up, cx, self.cat_channels())? {
            return self.rest_in_place(&buf, cx);
        }
        self.after_cv1(cv1_of_parts(&self.cv1, parts, up, cx)?, cx)
    }

    /// The channels of `cat(cv1(x), a, c)`: c3 + 2·c4.
    fn cat_channels(&self) -> usize {
        self.cv1.out_channels() + self.cv2.1.out_channels() + self.cv3.1.out_channels()
    }

    /// The block after `cv1` on the concatenation built in place: `buf` holds `cv1(x)` in its
    /// first c3 channels; `a` and `c` are written after it; `cv4` reads `buf` as one input.
    fn rest_in_place(&self, buf: &Tensor, cx: Ctx) -> Result<Tensor> {
        let (c3, c4) = (2 * self.c, self.cv2.1.out_channels());
        let a = self.cv2.0.run(&buf.narrow(3, self.c, self.c)?, cx)?;
        self.cv2.1.run_into(&a, None, cx, (buf, c3))?;
        let c = self.cv3.0.run(&buf.narrow(3, c3, c4)?, cx)?;
        self.cv3.1.run_into(&c, None, cx, (buf, c3 + c4))?;
        self.cv4.run(buf, cx)
    }

    fn after_cv1(&self, y: Tensor, cx: Ctx) -> Result<Tensor> {
        if let Some(buf) = cat_buffer(cx, &y, self.cat_channels())? {
            buf.slice_set(&y.contiguous()?, 3, 0)?;
            return self.rest_in_place(&buf, cx);
        }
        let half = cx.narrow(&y, 1, self.c, self.c)?;
        let a = self.cv2.0.run(&half, cx)?;
        let a = self.cv2.1.run(&a, cx)?;
        let c = self.cv3.0.run(&a, cx)?;
        let c = self.cv3.1.run(&c, cx)?;
        self.cv4.run_cat(&[&y, &a, &c], cx)
    }
}

/// `ELAN1(c1, c2, c3, c4)`: like [`RepNCSPELAN4`] with plain 3×3 convs `cv2` (c3/2 → c4) and
/// `cv3` (c4 → c4).
pub struct Elan1 {
    /// `{prefix}.cv1`: 1×1, c1 → c3.
    pub cv1: Conv,
    /// `{prefix}.cv2`: 3×3, c3/2 → c4.
    pub cv2: Conv,
    /// `{prefix}.cv3`: 3×3, c4 → c4.
    pub cv3: Conv,
    /// `{prefix}.cv4`: 1×1, c3 + 2·c4 → c2.
    pub cv4: Conv,
    c: usize,
}

impl Elan1 {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, [c1, c2, c3, c4]: [usize; 4]) -> Result<Self> {
        Ok(Self {
            cv1: Conv::load(b, &format!("{prefix}.cv1"), ConvSpec::new(c1, c3, 1, 1))?,
            cv2: Conv::load(b, &format!("{prefix}.cv2"), ConvSpec::new(c3 / 2, c4, 3, 1))?,
            cv3: Conv::load(b, &format!("{prefix}.cv3"), ConvSpec::new(c4, c4, 3, 1))?,
            cv4: Conv::load(
                b,
                &format!("{prefix}.cv4"),
                ConvSpec::new(c3 + 2 * c4, c2, 1, 1),
            )?,
            c: c3 / 2,
        })
    }

    /// x: (B, c1, H, W) → (B, c2, H, W).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.run(x, Ctx::plain(train))
    }

    /// [`Self::forward`] under a [`Ctx`] (taped or plain).
    pub fn run(&self, x: &Tensor, cx: Ctx) -> Result<Tensor> {
        if let Some(buf) = cat_buffer(cx, x, self.cat_channels())? {
            self.cv1.run_into(x, None, cx, (&buf, 0))?;
            return self.rest_in_place(&buf, cx);
        }
        self.after_cv1(self.cv1.run(x, cx)?, cx)
    }

    /// [`Self::run`] of the channel concatenation of `parts` (as [`RepNCSPELAN4::run_cat`]).
    pub fn run_cat(&self, parts: &[&Tensor], up: Option<usize>, cx: Ctx) -> Result<Tensor> {
        if let Some(buf) = cv1_parts_in_place(&self.cv1, parts, up, cx, self.cat_channels())? {
            return self.rest_in_place(&buf, cx);
        }
        self.after_cv1(cv1_of_parts(&self.cv1, parts, up, cx)?, cx)
    }

    /// The channels of `cat(cv1(x), a, c)`: c3 + 2·c4.
    fn cat_channels(&self) -> usize {
        self.cv1.out_channels() + self.cv2.out_channels() + self.cv3.out_channels()
    }

    /// As [`RepNCSPELAN4`]'s: `cv2` and `cv3` written after `cv1(x)` in `buf`, `cv4` on `buf`.
    fn rest_in_place(&self, buf: &Tensor, cx: Ctx) -> Result<Tensor> {
        let (c3, c4) = (2 * self.c, self.cv2.out_channels());
        self.cv2
            .run_into(&buf.narrow(3, self.c, self.c)?, None, cx, (buf, c3))?;
        self.cv3
            .run_into(&buf.narrow(3, c3, c4)?, None, cx, (buf, c3 + c4))?;
        self.cv4.run(buf, cx)
    }

    fn after_cv1(&self, y: Tensor, cx: Ctx) -> Result<Tensor> {
        if let Some(buf) = cat_buffer(cx, &y, self.cat_channels())? {
            buf.slice_set(&y.contiguous()?, 3, 0)?;
            return self.rest_in_place(&buf, cx);
        }
        let half = cx.narrow(&y, 1, self.c, self.c)?;
        let a = self.cv2.run(&half, cx)?;
        let c = self.cv3.run(&a, cx)?;
        self.cv4.run_cat(&[&y, &a, &c], cx)
    }
}

/// `AConv(c1, c2)`: `avg_pool2d(2, stride 1)` then a 3×3 stride-2 [`Conv`] (padding 1).
pub struct AConv {
    /// `{prefix}.cv1`.
    pub cv1: Conv,
}

impl AConv {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, c1: usize, c2: usize) -> Result<Self> {
        Ok(Self {
            cv1: Conv::load(b, &format!("{prefix}.cv1"), ConvSpec::new(c1, c2, 3, 2))?,
        })
    }

    /// x: (B, c1, H, W) → (B, c2, H/2, W/2) for even H, W.
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.run(x, Ctx::plain(train))
    }

    /// [`Self::forward`] under a [`Ctx`] (taped or plain).
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Tensor> {
        let y = c.avg_pool_2x2_s1(x)?;
        self.cv1.run(&y, c)
    }
}

/// `SPPELAN(c1, c2, c3)`: `y0 = cv1(x)`, then three chained `MaxPool2d(5, 1, 2)`, concatenated and
/// fused by `cv5` (1×1, 4·c3 → c2).
pub struct SppElan {
    /// `{prefix}.cv1`: 1×1, c1 → c3.
    pub cv1: Conv,
    /// `{prefix}.cv5`: 1×1, 4·c3 → c2.
    pub cv5: Conv,
}

impl SppElan {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, [c1, c2, c3]: [usize; 3]) -> Result<Self> {
        Ok(Self {
            cv1: Conv::load(b, &format!("{prefix}.cv1"), ConvSpec::new(c1, c3, 1, 1))?,
            cv5: Conv::load(b, &format!("{prefix}.cv5"), ConvSpec::new(4 * c3, c2, 1, 1))?,
        })
    }

    /// x: (B, c1, H, W) → (B, c2, H, W).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.run(x, Ctx::plain(train))
    }

    /// [`Self::forward`] under a [`Ctx`] (taped or plain).
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Tensor> {
        let y0 = self.cv1.run(x, c)?;
        let y1 = c.max_pool_same(&y0, 5)?;
        let y2 = c.max_pool_same(&y1, 5)?;
        let y3 = c.max_pool_same(&y2, 5)?;
        self.cv5.run_cat(&[&y0, &y1, &y2, &y3], c)
    }
}

/// `ADown(c1, c2)`: `avg_pool2d(2, stride 1)`, split into channel halves; the first through a
/// 3×3 stride-2 [`Conv`] (`cv1`, c1/2 → c2/2), the second through `max_pool2d(3, stride 2,
/// padding 1)` and a 1×1 [`Conv`] (`cv2`, c1/2 → c2/2); concatenated (official
/// `models/common.py::ADown`, the downsampling of yolov9-c/e).
pub struct ADown {
    /// `{prefix}.cv1`.
    pub cv1: Conv,
    /// `{prefix}.cv2`.
    pub cv2: Conv,
    half: usize,
}

impl ADown {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, c1: usize, c2: usize) -> Result<Self> {
        Ok(Self {
            cv1: Conv::load(
                b,
                &format!("{prefix}.cv1"),
                ConvSpec::new(c1 / 2, c2 / 2, 3, 2),
            )?,
            cv2: Conv::load(
                b,
                &format!("{prefix}.cv2"),
                ConvSpec::new(c1 / 2, c2 / 2, 1, 1),
            )?,
            half: c1 / 2,
        })
    }

    /// x: (B, c1, H, W) → (B, c2, H/2, W/2) for even H, W.
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Tensor> {
        let y = c.avg_pool_2x2_s1(x)?;
        let x1 = c.narrow(&y, 1, 0, self.half)?;
        let x2 = c.narrow(&y, 1, self.half, self.half)?;
        let a = self.cv1.run(&x1, c)?;
        let m = c.take_even(&c.max_pool_same(&x2, 3)?)?;
        let m = self.cv2.run(&m, c)?;
        c.cat(&[&a, &m], 1)
    }
}

/// `CBLinear(c1, c2s)`: one biased 1×1 `nn.Conv2d` (`{prefix}.conv`, c1 → Σc2s, no BN, no
/// activation) whose output is split along channels into pieces of `c2s` (official
/// `models/common.py::CBLinear`, the routing of the multi-level reversible auxiliary branch).
pub struct CBLinear {
    /// `{prefix}.conv`.
    pub conv: Conv,
    c2s: Vec<usize>,
}

impl CBLinear {
    /// Loads the block's parameters under `prefix` (official state_dict names) with its
    /// channel arguments, as the official constructor takes them.
    pub fn load(b: &mut Builder, prefix: &str, c1: usize, c2s: &[usize]) -> Result<Self> {
        let total = c2s.iter().sum();
        Ok(Self {
            conv: Conv::load_plain(
                b,
                &format!("{prefix}.conv"),
                ConvSpec::new(c1, total, 1, 1),
                None,
            )?,
            c2s: c2s.to_vec(),
        })
    }

    /// x: (B, c1, H, W) → pieces (B, c2s[i], H, W).
    pub fn run(&self, x: &Tensor, c: Ctx) -> Result<Vec<Tensor>> {
        let y = self.conv.run(x, c)?;
        let mut off = 0;
        let mut out = Vec::with_capacity(self.c2s.len());
        for &n in &self.c2s {
            out.push(c.narrow(&y, 1, off, n)?);
            off += n;
        }
        Ok(out)
    }
}
