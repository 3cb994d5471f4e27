//! The three loss terms of one branch (official `ComputeLoss`: CIoU box loss, DFL, BCE class
//! loss) as one op with a closed-form backward, over every anchor at once.
//!
//! [`branch_terms`] takes the branch's head output `flat` `(B, 64 + nc, A)` and the dense
//! targets `(10, B, A)` of the assignment (weight, label, box xyxy, DFL distances; see
//! `DenseTargets` in [`super::targets`]) and returns the sums `(3,)`
//! `[Σ (1 − CIoU)·w, Σ softplus(x) − x·t, Σ DFL·w]` over all anchors (and classes), in f64, as
//! f32; the caller divides by the target-score sum. Per anchor (`w` the target score, `t` the
//! one-hot label times `w`):
//!
//! - the predicted box: for each side `s` (l, t, r, b), `p = softmax(L_s)` over its 16 bins and
//!   the distance `d_s = Σ_k p_k·k`; box `(ax − d_l, ay − d_t, ax + d_r, ay + d_b)` in grid units
//!   (official `bbox_decode`);
//! - box: `(1 − CIoU(pred, target))·w` with CIoU's α held constant, as the official
//!   `bbox_iou(..., CIoU=True)` computes it under `torch.no_grad()`;
//! - DFL: `−¼ Σ_s Σ_k log p_k · max(0, 1 − |k − t_s|)`, times `w` (official `_df_loss`);
//! - class: `Σ_c softplus(x_c) − x_c·t_c` (`BCEWithLogits` summed).
//!
//! The backward is the closed form of each: `σ(x) − t` for the class logits;
//! `−¼·w·(ω_k − p_k·Σω)` for DFL; and for the box, the CIoU gradient with respect to the four
//! predicted coordinates (IoU, centre distance over the enclosing diagonal, aspect term; ties of
//! `min`/`max` split the gradient in half and `relu` passes it at 0, as candle's autograd does)
//! chained through `∂d_s/∂L_k = p_k·(k − d_s)`. The composite of candle ops it replaces
//! ([`super::tal_loss`] with `YOLO9_FUSED_LOSS=0`) took about 260 launches per loss forward and
//! more for its backward; this is one kernel forward (plus a reduction) and one backward on CUDA
//! (`kernels/tal_terms.cu`), and the same arithmetic on the CPU. `tests/loss/batch.rs` checks it
//! against the composite and against the official reference.

use super::iou::IOU_EPS;
use crate::model::head::REG_MAX;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `4 / π²` of the CIoU aspect term.
const FOUR_OVER_PI2: f32 = (4.0 / (std::f64::consts::PI * std::f64::consts::PI)) as f32;

/// The three sums of one branch, `(3,)` f32 `[box, cls, dfl]` before the division by the
/// target-score sum. `flat` `(B, 64 + nc, A)` f32 (differentiable), `planes` `(10, B, A)` f32 and
/// `anchors` `(A, 2)` f32 in grid units, on the device of `flat`; `nc` classes.
///
/// Errors: shapes that do not match, non-f32 tensors.
pub fn branch_terms(flat: &Tensor, planes: &Tensor, anchors: &Tensor, nc: usize) -> Result<Tensor> {
    let (b, c, a) = flat.dims3()?;
    if c != 4 * REG_MAX + nc || planes.dims() != [10, b, a] || anchors.dims() != [a, 2] {
        candle_core::bail!(
            "loss terms: head {:?} (expected 64 + {nc} channels), targets {:?}, anchors {:?}",
            flat.dims(),
            planes.dims(),
            anchors.dims()
        );
    }
    if flat.dtype() != DType::F32 || planes.dtype() != DType::F32 || anchors.dtype() != DType::F32 {
        candle_core::bail!("loss terms: f32 tensors expected");
    }
    flat.contiguous()?.apply_op1(TalTerms {
        planes: planes.contiguous()?.detach(),
        anchors: anchors.contiguous()?.detach(),
        nc,
    })
}

/// The op of [`branch_terms`] (argument `flat`; the targets and anchors are held, detached).
#[derive(Debug, Clone)]
pub struct TalTerms {
    /// `(10, B, A)` dense targets.
    pub planes: Tensor,
    /// `(A, 2)` anchor centres in grid units.
    pub anchors: Tensor,
    /// Classes.
    pub nc: usize,
}

/// The backward op: arguments `flat` and the output gradient `g` `(3,)`; result `d flat`.
#[derive(Debug, Clone)]
pub struct TalTermsGrad(pub TalTerms);

/// One anchor's inputs, read from the strided layouts.
struct AnchorIn {
    l: [[f32; REG_MAX]; 4],
    w: f32,
    label: f32,
    tb: [f32; 4],
    t: [f32; 4],
    ax: f32,
    ay: f32,
}

/// The softmax of one side's bins and its expected distance, in the composite's op order
/// (`d = L − max`, `logp = d − log Σ exp d`, `p = exp logp`, `Σ p_k·k`).
fn side(l: &[f32; REG_MAX]) -> ([f32; REG_MAX], [f32; REG_MAX], f32) {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0f32;
    for &v in l {
        s += (v - m).exp();
    }
    let lse = s.ln();
    let mut logp = [0f32; REG_MAX];
    let mut p = [0f32; REG_MAX];
    let mut dist = 0f32;
    for k in 0..REG_MAX {
        logp[k] = (l[k] - m) - lse;
        p[k] = logp[k].exp();
        dist += p[k] * k as f32;
    }
    (logp, p, dist)
}

/// `log1p(exp(−|x|))` as the composite computes it (`u = 1 + e`, `log u + (e − (u − 1))/u`).
fn log1p_exp_neg_abs(x: f32) -> f32 {
    let e = (-x.abs()).exp();
    let u = e + 1.0;
    u.ln() + (e - (u - 1.0)) / u
}

/// `d min(a, b)/da` with candle's tie rule (half each).
fn dmin(a: f32, b: f32) -> f32 {
    if a < b {
        1.0
    } else if a == b {
        0.5
    } else {
        0.0
    }
}

/// `d max(a, b)/da` with candle's tie rule.
fn dmax(a: f32, b: f32) -> f32 {
    dmin(b, a)
}

/// CIoU of `b1` (predicted) and `b2` (target), xyxy, and its gradient with respect to `b1`
/// (α constant). Same formula and op order as [`super::iou::ciou_tensor`].
fn ciou_and_grad(b1: [f32; 4], b2: [f32; 4]) -> (f32, [f32; 4]) {
    let eps = IOU_EPS;
    let [x1, y1, x2, y2] = b1;
    let [bx1, by1, bx2, by2] = b2;
    let w1 = x2 - x1;
    let h1 = y2 - y1 + eps;
    let w2 = bx2 - bx1;
    let h2 = by2 - by1 + eps;
    let ix = x2.min(bx2) - x1.max(bx1);
    let iy = y2.min(by2) - y1.max(by1);
    let iw = ix.max(0.0);
    let ih = iy.max(0.0);
    let inter = iw * ih;
    let union = w1 * h1 + w2 * h2 - inter + eps;
    let iou = inter / union;
    let cw = x2.max(bx2) - x1.min(bx1);
    let ch = y2.max(by2) - y1.min(by1);
    let c2 = cw * cw + ch * ch + eps;
    let dx = bx1 + bx2 - x1 - x2;
    let dy = by1 + by2 - y1 - y2;
    let rho2 = (dx * dx + dy * dy) / 4.0;
    let r1 = w1 / h1;
    let a1 = (r1 as f64).atan() as f32;
    let a2 = ((w2 / h2) as f64).atan() as f32;
    let d = a2 - a1;
    let v = d * d * FOUR_OVER_PI2;
    let alpha = v / (v - iou + (1.0 + eps));
    let ciou = iou - (rho2 / c2 + v * alpha);

    // ∂ of each piece with respect to (x1, y1, x2, y2).
    let rx = if ix >= 0.0 { 1.0 } else { 0.0 };
    let ry = if iy >= 0.0 { 1.0 } else { 0.0 };
    let diw = [-rx * dmax(x1, bx1), 0.0, rx * dmin(x2, bx2), 0.0];
    let dih = [0.0, -ry * dmax(y1, by1), 0.0, ry * dmin(y2, by2)];
    let dwh1 = [-h1, -w1, h1, w1];
    let dcw = [-dmin(x1, bx1), 0.0, dmax(x2, bx2), 0.0];
    let dch = [0.0, -dmin(y1, by1), 0.0, dmax(y2, by2)];
    let drho = [-dx / 2.0, -dy / 2.0, -dx / 2.0, -dy / 2.0];
    let dr1 = [-1.0 / h1, w1 / (h1 * h1), 1.0 / h1, -w1 / (h1 * h1)];
    let datan = 1.0 / (1.0 + r1 * r1);
    let mut g = [0f32; 4];
    for q in 0..4 {
        let di = ih * diw[q] + iw * dih[q];
        let du = dwh1[q] - di;
        let diou = (di * union - inter * du) / (union * union);
        let dc2 = 2.0 * cw * dcw[q] + 2.0 * ch * dch[q];
        let drc = (drho[q] * c2 - rho2 * dc2) / (c2 * c2);
        let dv = FOUR_OVER_PI2 * 2.0 * d * (-datan * dr1[q]);
        g[q] = diou - drc - alpha * dv;
    }
    (ciou, g)
}

/// The predicted box (grid units) and, per side, the log-probabilities, probabilities and
/// distance.
type Decoded = ([f32; 4], [[f32; REG_MAX]; 4], [[f32; REG_MAX]; 4], [f32; 4]);

fn decode(a: &AnchorIn) -> Decoded {
    let mut logp = [[0f32; REG_MAX]; 4];
    let mut p = [[0f32; REG_MAX]; 4];
    let mut dist = [0f32; 4];
    for s in 0..4 {
        (logp[s], p[s], dist[s]) = side(&a.l[s]);
    }
    let pb = [
        -dist[0] + a.ax,
        -dist[1] + a.ay,
        dist[2] + a.ax,
        dist[3] + a.ay,
    ];
    (pb, logp, p, dist)
}

/// DFL bin weights `max(0, 1 − |k − t|)` of a side with target distance `t`.
fn dfl_weights(t: f32) -> [f32; REG_MAX] {
    let mut w = [0f32; REG_MAX];
    for (k, wk) in w.iter_mut().enumerate() {
        *wk = (-(k as f32 - t).abs() + 1.0).max(0.0);
    }
    w
}

/// Forward of one anchor: `[(1 − CIoU)·w, Σ_c softplus − x·t, DFL·w]` in f64.
fn anchor_forward(a: &AnchorIn, x: &[f32]) -> [f64; 3] {
    let (pb, logp, _, _) = decode(a);
    let (ciou, _) = ciou_and_grad(pb, a.tb);
    let bx = (-ciou + 1.0) * a.w;
    let mut ce = 0f32;
    for (lp, &t) in logp.iter().zip(&a.t) {
        let wt = dfl_weights(t);
        let mut cs = 0f32;
        for (l, w) in lp.iter().zip(&wt) {
            cs += l * w;
        }
        ce += cs;
    }
    let dfl = (ce * -0.25) * a.w;
    let (mut sp, mut xt) = (0f64, 0f64);
    for (c, &xc) in x.iter().enumerate() {
        sp += (xc.max(0.0) + log1p_exp_neg_abs(xc)) as f64;
        if a.label == c as f32 {
            xt += (xc * a.w) as f64;
        }
    }
    [bx as f64, sp - xt, dfl as f64]
}

/// Backward of one anchor for the output gradient `g` = (box, cls, dfl): the gradients of the
/// 64 box logits (side-major) and of the class logits.
fn anchor_backward(
    a: &AnchorIn,
    x: &[f32],
    g: [f32; 3],
    dl: &mut [f32; 4 * REG_MAX],
    dx: &mut [f32],
) {
    let (pb, _, p, dist) = decode(a);
    let (_, dc) = ciou_and_grad(pb, a.tb);
    // ∂(1 − CIoU)·w/∂pbox, and pbox = (ax − d_l, ay − d_t, ax + d_r, ay + d_b).
    let sign = [-1f32, -1.0, 1.0, 1.0];
    for s in 0..4 {
        let wt = dfl_weights(a.t[s]);
        let swt: f32 = wt.iter().sum();
        let gbox = g[0] * -a.w * dc[s] * sign[s];
        for k in 0..REG_MAX {
            let ddist = p[s][k] * (k as f32 - dist[s]);
            let ddfl = -0.25 * a.w * (wt[k] - p[s][k] * swt);
            dl[s * REG_MAX + k] = gbox * ddist + g[2] * ddfl;
        }
    }
    for (c, (&xc, d)) in x.iter().zip(dx.iter_mut()).enumerate() {
        let t = if a.label == c as f32 { a.w } else { 0.0 };
        let sig = 1.0 / (1.0 + (-xc).exp());
        *d = g[1] * (sig - t);
    }
}

fn slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("loss terms: {what} not contiguous")))?;
    Ok(&s.as_slice::<f32>()?[a..b])
}

/// Runs `f` with the CPU slices of the held targets and anchors.
fn with_held<R>(op: &TalTerms, f: impl FnOnce(&[f32], &[f32]) -> Result<R>) -> Result<R> {
    let (sp, lp) = op.planes.storage_and_layout();
    let (sa, la) = op.anchors.storage_and_layout();
    match (&*sp, &*sa) {
        (candle_core::Storage::Cpu(p), candle_core::Storage::Cpu(a)) => {
            f(slice(p, lp, "targets")?, slice(a, la, "anchors")?)
        }
        _ => candle_core::bail!("loss terms: targets and anchors must be on the CPU"),
    }
}

/// Reads anchor `(b, a)` of `flat` `(B, C, A)` and the targets.
fn anchor_in(
    flat: &[f32],
    planes: &[f32],
    anc: &[f32],
    (bs, c, na): (usize, usize, usize),
    b: usize,
    a: usize,
) -> (AnchorIn, Vec<f32>) {
    let base = b * c * na;
    let mut l = [[0f32; REG_MAX]; 4];
    for (s, ls) in l.iter_mut().enumerate() {
        for (k, v) in ls.iter_mut().enumerate() {
            *v = flat[base + (s * REG_MAX + k) * na + a];
        }
    }
    let x: Vec<f32> = (4 * REG_MAX..c)
        .map(|ch| flat[base + ch * na + a])
        .collect();
    let ba = bs * na;
    let i = b * na + a;
    let pl = |k: usize| planes[k * ba + i];
    (
        AnchorIn {
            l,
            w: pl(0),
            label: pl(1),
            tb: [pl(2), pl(3), pl(4), pl(5)],
            t: [pl(6), pl(7), pl(8), pl(9)],
            ax: anc[2 * a],
            ay: anc[2 * a + 1],
        },
        x,
    )
}

impl CustomOp1 for TalTerms {
    fn name(&self) -> &'static str {
        "tal-loss-terms"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = l.shape().dims3()?;
        let flat = slice(s, l, "head output")?;
        let (bs, _, na) = dims;
        let sums = with_held(self, |planes, anc| {
            // Per image in order, anchors in order: deterministic.
            let per: Vec<[f64; 3]> = (0..bs)
                .into_par_iter()
                .map(|b| {
                    let mut acc = [0f64; 3];
                    for a in 0..na {
                        let (ai, x) = anchor_in(flat, planes, anc, dims, b, a);
                        let t = anchor_forward(&ai, &x);
                        for k in 0..3 {
                            acc[k] += t[k];
                        }
                    }
                    acc
                })
                .collect();
            let mut tot = [0f64; 3];
            for p in per {
                for k in 0..3 {
                    tot[k] += p[k];
                }
            }
            Ok(tot)
        })?;
        Ok((
            CpuStorage::F32(sums.iter().map(|&v| v as f32).collect()),
            Shape::from(3),
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::tal::terms_forward((&self.planes, &self.anchors), (s, l))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(arg.apply_op2_no_bwd(
            &grad_res.contiguous()?,
            &TalTermsGrad(self.clone()),
        )?))
    }
}

impl CustomOp2 for TalTermsGrad {
    fn name(&self) -> &'static str {
        "tal-loss-terms-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dims = l1.shape().dims3()?;
        let (bs, c, na) = dims;
        let flat = slice(s1, l1, "head output")?;
        let gv = slice(s2, l2, "gradient")?;
        if gv.len() != 3 {
            candle_core::bail!("loss terms: gradient of {} values, expected 3", gv.len());
        }
        let g = [gv[0], gv[1], gv[2]];
        let mut out = vec![0f32; bs * c * na];
        with_held(&self.0, |planes, anc| {
            out.par_chunks_mut(c * na).enumerate().for_each(|(b, ob)| {
                let mut dl = [0f32; 4 * REG_MAX];
                let mut dx = vec![0f32; c - 4 * REG_MAX];
                for a in 0..na {
                    let (ai, x) = anchor_in(flat, planes, anc, dims, b, a);
                    anchor_backward(&ai, &x, g, &mut dl, &mut dx);
                    for (k, v) in dl.iter().enumerate() {
                        ob[k * na + a] = *v;
                    }
                    for (k, v) in dx.iter().enumerate() {
                        ob[(4 * REG_MAX + k) * na + a] = *v;
                    }
                }
            });
            Ok(())
        })?;
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::tal::terms_backward((&self.0.planes, &self.0.anchors), (s1, l1), (s2, l2))
    }
}
