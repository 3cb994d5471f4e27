//! Heads: one detection branch (official `models/yolo.py::DDetect`, or the plain `Detect` that
//! `Segment` inherits; `DualDDetect` is two of them), the mask branch of the segmentation heads
//! ([`MaskHead`]: `Segment`, `DSegment`, `DualDSegment`), the DFL decode (`DFL`, `dist2bbox`)
//! and anchor generation (`make_anchors`).

use super::conv::{Conv, ConvSpec};
use super::params::Builder;
use super::tape::Ctx;
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};

/// DFL bins per box side (`reg_max`).
pub const REG_MAX: usize = 16;

/// One detection branch over three pyramid levels: per level a box tower
/// (`Conv(c,c2,3)`, `Conv(c2,c2,3,g=4)`, `Conv2d(c2,64,1,g=4)` for `DDetect`; ungrouped for
/// `Detect`) and a class tower (`Conv(c,c3,3)`, `Conv(c3,c3,3)`, `Conv2d(c3,nc,1)`).
///
/// Named `{box_prefix}.{level}.{0,1,2}` and `{cls_prefix}.{level}.{0,1,2}`, e.g. `model.29.cv4.0.1`.
pub struct DetectHead {
    /// Box towers per level; the last conv outputs 4·16 DFL logits, side-major (l, t, r, b).
    pub boxes: Vec<[Conv; 3]>,
    /// Class towers per level; the last conv outputs `nc` logits.
    pub classes: Vec<[Conv; 3]>,
    /// Number of classes.
    pub nc: usize,
}

impl DetectHead {
    /// `ch`: input channels per level; `strides` only drive the official `bias_init` of freshly
    /// initialized class biases (`ln(5 / nc / (640 / s)^2)`); box biases start at 1.0.
    /// `grouped`: the `DDetect` box tower (groups 4, `c2` a multiple of 4), else `Detect`'s.
    pub fn load(
        b: &mut Builder,
        box_prefix: &str,
        cls_prefix: &str,
        ch: &[usize],
        nc: usize,
        strides: &[u32],
        grouped: bool,
    ) -> Result<Self> {
        let c2 = (ch[0] / 4).max(REG_MAX * 4).max(16);
        let (c2, g) = if grouped {
            (c2.div_ceil(4) * 4, 4)
        } else {
            (c2, 1)
        };
        let c3 = ch[0].max((nc * 2).min(128));
        let mut boxes = Vec::new();
        let mut classes = Vec::new();
        // All box levels, then all class levels: the official state_dict order.
        for (i, &c) in ch.iter().enumerate() {
            let bp = format!("{box_prefix}.{i}");
            boxes.push([
                Conv::load(b, &format!("{bp}.0"), ConvSpec::new(c, c2, 3, 1))?,
                Conv::load(b, &format!("{bp}.1"), ConvSpec::new(c2, c2, 3, 1).groups(g))?,
                Conv::load_plain(
                    b,
                    &format!("{bp}.2"),
                    ConvSpec::new(c2, 4 * REG_MAX, 1, 1).groups(g),
                    Some(1.0),
                )?,
            ]);
        }
        for (i, (&c, &s)) in ch.iter().zip(strides).enumerate() {
            let cp = format!("{cls_prefix}.{i}");
            let cls_bias = (5.0 / nc as f64 / (640.0 / s as f64).powi(2)).ln() as f32;
            classes.push([
                Conv::load(b, &format!("{cp}.0"), ConvSpec::new(c, c3, 3, 1))?,
                Conv::load(b, &format!("{cp}.1"), ConvSpec::new(c3, c3, 3, 1))?,
                Conv::load_plain(
                    b,
                    &format!("{cp}.2"),
                    ConvSpec::new(c3, nc, 1, 1),
                    Some(cls_bias),
                )?,
            ]);
        }
        Ok(Self { boxes, classes, nc })
    }

    /// Raw head outputs: for each level i, feats[i] (B, ch[i], H_i, W_i) →
    /// (B, 64 + nc, H_i, W_i) = cat(box DFL logits (side-major l,t,r,b × 16 bins), class logits).
    pub fn forward_raw(&self, feats: &[Tensor], train: bool) -> Result<Vec<Tensor>> {
        self.run_raw(feats, Ctx::plain(train))
    }

    /// [`Self::forward_raw`] under a [`Ctx`] (taped or plain).
    pub fn run_raw(&self, feats: &[Tensor], cx: Ctx) -> Result<Vec<Tensor>> {
        self.run_parts(feats, cx)?
            .iter()
            .map(|(bx, kx)| cx.cat(&[bx, kx], 1))
            .collect()
    }

    /// The box branch's and the class branch's outputs of each level, before
    /// [`Self::run_raw`] joins them: `(B, 64, H/s, W/s)` and `(B, nc, H/s, W/s)` in the context's
    /// layout.
    pub fn run_parts(&self, feats: &[Tensor], cx: Ctx) -> Result<Vec<(Tensor, Tensor)>> {
        ensure!(
            feats.len() == self.boxes.len(),
            "head: got {} feature maps, expected {}",
            feats.len(),
            self.boxes.len()
        );
        feats
            .iter()
            .zip(self.boxes.iter().zip(&self.classes))
            .map(|(x, (bt, ct))| {
                let mut bx = x.clone();
                for c in bt {
                    bx = c.run(&bx, cx)?;
                }
                let mut kx = x.clone();
                for c in ct {
                    kx = c.run(&kx, cx)?;
                }
                Ok((bx, kx))
            })
            .collect()
    }
}

/// The prototype branch of a segmentation head: official `Proto(c1, npr, nm)` (`Segment`: 3×3
/// `Conv(c1, npr)`, nearest ×2 upsample, 3×3 `Conv(npr, npr)`, 1×1 `Conv(npr, nm)`, every conv
/// with BN + SiLU) or a 1×1 `Conv(c, nm)` (`DSegment`, `DualDSegment`).
pub enum Proto {
    /// `Proto`: `cv1`, (upsample), `cv2`, `cv3`.
    Full(Box<[Conv; 3]>),
    /// One 1×1 `Conv`.
    Conv(Box<Conv>),
}

impl Proto {
    /// `Proto(c1, npr, nm)` named `{prefix}.cv1/cv2/cv3`.
    pub fn load_full(
        b: &mut Builder,
        prefix: &str,
        c1: usize,
        npr: usize,
        nm: usize,
    ) -> Result<Self> {
        Ok(Self::Full(Box::new([
            Conv::load(b, &format!("{prefix}.cv1"), ConvSpec::new(c1, npr, 3, 1))?,
            Conv::load(b, &format!("{prefix}.cv2"), ConvSpec::new(npr, npr, 3, 1))?,
            Conv::load(b, &format!("{prefix}.cv3"), ConvSpec::new(npr, nm, 1, 1))?,
        ])))
    }

    /// `Conv(c1, nm, 1)` named `{prefix}`.
    pub fn load_conv(b: &mut Builder, prefix: &str, c1: usize, nm: usize) -> Result<Self> {
        Ok(Self::Conv(Box::new(Conv::load(
            b,
            prefix,
            ConvSpec::new(c1, nm, 1, 1),
        )?)))
    }

    /// x (B, c1, H, W) → prototypes (B, nm, 2H, 2W) for `Full`, (B, nm, H, W) for `Conv`.
    pub fn run(&self, x: &Tensor, cx: Ctx) -> Result<Tensor> {
        match self {
            Self::Full(c) => {
                let y = c[0].run(x, cx)?;
                let y = cx.upsample_nearest_2x(&y)?;
                let y = c[1].run(&y, cx)?;
                c[2].run(&y, cx)
            }
            Self::Conv(c) => c.run(x, cx),
        }
    }
}

/// The mask branch of one head branch (official `Segment.cv4` + `proto`, `DSegment.cv4` +
/// `proto`, `DualDSegment.cv6` + `proto` / `cv7` + `proto2`): per level a mask-coefficient tower
/// (`Conv(c, c4, 3)`, `Conv(c4, c4, 3)`, `Conv2d(c4, nm, 1)`, `c4 = max(c_P3 / 4, nm)`) and the
/// prototypes.
pub struct MaskHead {
    /// Coefficient towers per level; the last conv outputs `nm` raw (linear) coefficients.
    pub coeffs: Vec<[Conv; 3]>,
    /// The prototype branch.
    pub proto: Proto,
    /// Number of prototypes (= coefficients per anchor).
    pub nm: usize,
}

impl MaskHead {
    /// Coefficient towers named `{prefix}.{level}.{0,1,2}` over inputs of `ch` channels.
    pub fn load_coeffs(
        b: &mut Builder,
        prefix: &str,
        ch: &[usize],
        nm: usize,
    ) -> Result<Vec<[Conv; 3]>> {
        let c4 = (ch[0] / 4).max(nm);
        ch.iter()
            .enumerate()
            .map(|(i, &c)| {
                let p = format!("{prefix}.{i}");
                Ok([
                    Conv::load(b, &format!("{p}.0"), ConvSpec::new(c, c4, 3, 1))?,
                    Conv::load(b, &format!("{p}.1"), ConvSpec::new(c4, c4, 3, 1))?,
                    Conv::load_plain(b, &format!("{p}.2"), ConvSpec::new(c4, nm, 1, 1), None)?,
                ])
            })
            .collect()
    }

    /// Mask-coefficient maps per level: feats[i] (B, ch[i], H_i, W_i) → (B, nm, H_i, W_i) in
    /// the context's layout (what a taped training forward returns as graph outputs).
    pub fn run_coeff_levels(&self, feats: &[Tensor], cx: Ctx) -> Result<Vec<Tensor>> {
        ensure!(
            feats.len() == self.coeffs.len(),
            "mask head: got {} feature maps, expected {}",
            feats.len(),
            self.coeffs.len()
        );
        feats
            .iter()
            .zip(&self.coeffs)
            .map(|(x, tower)| {
                let mut y = x.clone();
                for c in tower {
                    y = c.run(&y, cx)?;
                }
                Ok(y)
            })
            .collect()
    }

    /// Mask coefficients: feats[i] (B, ch[i], H_i, W_i) → (B, nm, A) in the feature dtype,
    /// anchors P3, P4, P5 row-major (official `torch.cat([cv4[i](x[i]).view(bs, nm, -1)], 2)`).
    /// For a plain (untaped) context; channels-last maps are transposed back.
    pub fn run_coeffs(&self, feats: &[Tensor], cx: Ctx) -> Result<Tensor> {
        let levels = self.run_coeff_levels(feats, cx)?;
        let levels = levels
            .into_iter()
            .map(|y| {
                if cx.nhwc {
                    Ok(y.permute((0, 3, 1, 2))?.contiguous()?)
                } else {
                    Ok(y)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        flatten_levels(&levels)
    }

    /// Prototypes of `x` (the prototype input), (B, nm, Hp, Wp) NCHW.
    pub fn run_proto(&self, x: &Tensor, cx: Ctx) -> Result<Tensor> {
        let p = self.proto.run(x, cx)?;
        if cx.nhwc {
            return Ok(p.permute((0, 3, 1, 2))?.contiguous()?);
        }
        Ok(p)
    }
}

/// Per-level maps (B, C, H_i, W_i) → (B, C, Σ H_i·W_i), levels in order, row-major within a
/// level (the anchor order of [`decode`]); differentiable (candle ops).
pub fn flatten_levels(levels: &[Tensor]) -> Result<Tensor> {
    let flat = levels
        .iter()
        .map(|y| {
            let (b, n, h, w) = y.dims4()?;
            Ok(y.reshape((b, n, h * w))?)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&flat, 2)?)
}

/// Anchor centres and strides for feature maps of sizes `sizes[i] = (H_i, W_i)` and `strides[i]`
/// (official `make_anchors(feats, strides, 0.5)`): returns `(points (A, 2) f32 = (x+0.5, y+0.5)` in
/// **grid units** of each level, `stride_tensor (A, 1) f32)`; order P3, P4, P5, row-major (y outer).
pub fn make_anchors(
    sizes: &[(usize, usize)],
    strides: &[u32],
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    ensure!(
        sizes.len() == strides.len(),
        "make_anchors: {} sizes but {} strides",
        sizes.len(),
        strides.len()
    );
    let total: usize = sizes.iter().map(|(h, w)| h * w).sum();
    let mut pts = Vec::with_capacity(total * 2);
    let mut st = Vec::with_capacity(total);
    for (&(h, w), &s) in sizes.iter().zip(strides) {
        for y in 0..h {
            for x in 0..w {
                pts.push(x as f32 + 0.5);
                pts.push(y as f32 + 0.5);
                st.push(s as f32);
            }
        }
    }
    Ok((
        Tensor::from_vec(pts, (total, 2), device)?,
        Tensor::from_vec(st, (total, 1), device)?,
    ))
}

/// Anchor rows of [`make_anchors`] as decode uses them, `(1, 2, A)` points and `(1, 1, A)`
/// strides, contiguous, in `dtype`, built once per (sizes, strides, device, dtype) and kept in a
/// small process-wide cache (at most 16 entries): an inference forward then uploads nothing, which
/// a CUDA graph capture requires ([`crate::cuda::graph`]).
fn anchor_rows(
    sizes: &[(usize, usize)],
    strides: &[u32],
    device: &Device,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    type Key = (
        Vec<(usize, usize)>,
        Vec<u32>,
        candle_core::DeviceLocation,
        DType,
    );
    type Cache = std::sync::Mutex<Vec<(Key, (Tensor, Tensor))>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let key: Key = (sizes.to_vec(), strides.to_vec(), device.location(), dtype);
    let cache = CACHE.get_or_init(Default::default);
    if let Some((_, v)) = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(k, _)| *k == key)
    {
        return Ok(v.clone());
    }
    let (pts, st) = make_anchors(sizes, strides, device)?;
    let pts = pts.t()?.unsqueeze(0)?.to_dtype(dtype)?.contiguous()?;
    let st = st.t()?.unsqueeze(0)?.to_dtype(dtype)?.contiguous()?;
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    if c.len() >= 16 {
        c.remove(0);
    }
    c.push((key, (pts.clone(), st.clone())));
    Ok((pts, st))
}

/// DFL expectation (official `DFL`): logits (B, 64, A), side-major (side·16 + bin) →
/// distances (B, 4, A) = Σ_bin softmax(bin logits)·bin, in grid units, sides (l, t, r, b).
///
/// On CUDA one launch ([`crate::cuda::dfl`], the logits read in place through their strides;
/// no backward, so not for a graph that is differentiated); elsewhere softmax, multiply and sum.
pub fn dfl(box_logits: &Tensor) -> Result<Tensor> {
    let (b, c, a) = box_logits.dims3()?;
    ensure!(
        c == 4 * REG_MAX,
        "dfl: expected {} channels, got {c}",
        4 * REG_MAX
    );
    #[cfg(feature = "cuda")]
    if box_logits.device().is_cuda()
        && matches!(box_logits.dtype(), DType::F32 | DType::F16 | DType::BF16)
    {
        return Ok(box_logits.apply_op1_no_bwd(&DflOp)?);
    }
    let x = box_logits.reshape((b, 4, REG_MAX, a))?;
    let p = candle_nn::ops::softmax(&x, 2)?;
    let bins = Tensor::arange(0f32, REG_MAX as f32, x.device())?
        .to_dtype(x.dtype())?
        .reshape((1, 1, REG_MAX, 1))?;
    Ok(p.broadcast_mul(&bins)?.sum(2)?)
}

/// Decodes raw head outputs (one per level, (B, 64+nc, H_i, W_i)) into (B, 4+nc, A) f32:
/// rows 0..4 = cx, cy, w, h in input pixels (`dist2bbox(..., xywh=True) * stride`), rows 4.. =
/// sigmoid class scores. Anchors are ordered P3, P4, P5, row-major within a level.
pub fn decode(raw: &[Tensor], strides: &[u32]) -> Result<Tensor> {
    ensure!(
        !raw.is_empty() && raw.len() == strides.len(),
        "decode: {} levels but {} strides",
        raw.len(),
        strides.len()
    );
    let (b, no, _, _) = raw[0].dims4()?;
    ensure!(
        no > 4 * REG_MAX,
        "decode: head output has {no} channels, expected 64 + nc"
    );
    let nc = no - 4 * REG_MAX;
    let mut sizes = Vec::with_capacity(raw.len());
    let mut flat = Vec::with_capacity(raw.len());
    for r in raw {
        let (bb, n, h, w) = r.dims4()?;
        ensure!(
            bb == b && n == no,
            "decode: level shapes disagree ({:?} vs {:?})",
            r.dims(),
            raw[0].dims()
        );
        sizes.push((h, w));
        flat.push(r.reshape((b, no, h * w))?);
    }
    let flat = Tensor::cat(&flat, 2)?;
    let device = flat.device();
    let (pts, st) = anchor_rows(&sizes, strides, device, flat.dtype())?;
    let d = dfl(&flat.narrow(1, 0, 4 * REG_MAX)?)?; // (B, 4, A)
    let lt = d.narrow(1, 0, 2)?;
    let rb = d.narrow(1, 2, 2)?;
    let x1y1 = pts.broadcast_sub(&lt)?;
    let x2y2 = pts.broadcast_add(&rb)?;
    let cxy = ((&x1y1 + &x2y2)? / 2.0)?;
    let wh = (x2y2 - x1y1)?;
    let dbox = Tensor::cat(&[&cxy, &wh], 1)?.broadcast_mul(&st)?;
    let cls = candle_nn::ops::sigmoid(&flat.narrow(1, 4 * REG_MAX, nc)?)?;
    Tensor::cat(&[&dbox, &cls], 1)
        .context("decode: concatenating boxes and scores")
        .and_then(|t| Ok(t.to_dtype(DType::F32)?))
}

/// [`decode`] of channels-last head outputs given as [`Head::run_parts`] returns them
/// (`(B, H_i, W_i, 64)` box and `(B, H_i, W_i, nc)` class logits per level), in one launch on
/// CUDA for up to 4 levels ([`crate::cuda::dfl::decode_levels`]: the same values as transposing,
/// joining and decoding); `None` elsewhere (the caller joins the parts and runs [`decode`]).
pub fn decode_nhwc(parts: &[(Tensor, Tensor)], strides: &[u32]) -> Result<Option<Tensor>> {
    ensure!(
        parts.len() == strides.len(),
        "decode: {} levels but {} strides",
        parts.len(),
        strides.len()
    );
    #[cfg(feature = "cuda")]
    if parts.len() <= 4
        && parts.iter().all(|(b, c)| {
            b.device().is_cuda()
                && crate::cuda::gemm::row_stride(b.layout()).is_some()
                && crate::cuda::gemm::row_stride(c.layout()).is_some()
        })
    {
        let levels: Vec<_> = parts
            .iter()
            .zip(strides)
            .map(|((boxes, classes), &s)| crate::cuda::dfl::Level {
                boxes,
                classes,
                stride: s as f32,
            })
            .collect();
        return Ok(Some(crate::cuda::dfl::decode_levels(&levels)?));
    }
    Ok(None)
}

/// The CUDA DFL of [`dfl`] as a candle op (no CPU form: the CPU runs the composite).
#[cfg(feature = "cuda")]
struct DflOp;

#[cfg(feature = "cuda")]
impl candle_core::CustomOp1 for DflOp {
    fn name(&self) -> &'static str {
        "dfl"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        candle_core::bail!("dfl op: CUDA only (the CPU runs the composite)")
    }

    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        crate::cuda::dfl::dfl(s, l)
    }
}
