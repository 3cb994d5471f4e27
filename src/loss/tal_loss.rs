//! The YOLOv9 training loss: BCE class loss, CIoU box loss and Distribution Focal Loss over the
//! TaskAlignedAssigner targets, for both branches of the dual head (official
//! `utils/loss_tal_dual.py ComputeLoss` with `BboxLoss(reg_max - 1 = 15, use_dfl=True)`).
//!
//! Per branch (auxiliary and main, each with its own assignment), with
//! `S = max(sum of target scores, 1)` and `w_a` = the target score of foreground anchor `a`:
//! - cls = `sum over all anchors and classes of BCEWithLogits(logit, target_score) / S`;
//! - box = `sum over fg of (1 - CIoU(pred, target)) * w_a / S` (boxes in grid units);
//! - dfl = `sum over fg of mean over the 4 sides of DFL(side) * w_a / S`, where the side target
//!   distance is clamped to `[0, 14.99]` and DFL is the cross-entropy to its two neighbouring
//!   integer bins weighted by proximity (GFL, Li et al. 2020, eq. 6).
//!
//! Then `item = 0.25 * aux + main` for each of box/cls/dfl, the gains 7.5 / 0.5 / 1.5, and
//! `total = (box + cls + dfl) * batch_size`.
//!
//! A single-head model (gelan-*: `DDetect`, no auxiliary branch) is trained by the official
//! `train.py` with `utils/loss_tal.py ComputeLoss`, which is the same computation over its one
//! branch: the same assigner (topk 10, alpha 0.5, beta 6), `S = max(sum, 1)`, `BboxLoss`, gains
//! and batch-size factor, and `item = main`. [`DualTalLoss::compute`] computes it when the
//! auxiliary branch is given empty.
//!
//! Only the predictions are differentiated: the assignment and the targets are constants, as in
//! the official code (`detach()` / `no_grad`). The loss is built from Candle ops on the head
//! outputs, so `total.backward()` gives the parameter gradients on any device; the assigner
//! reads detached host copies of the decoded boxes and the class logits. Each term is a dense
//! sum over all anchors with the assignment as constant weights (0 for background), so no
//! gather of foreground anchors (and no scatter in the backward) is needed.
//!
//! Why one file: the dual-branch loss, the dense targets it builds for the fused terms, and the
//! scalar reference functions the tests compare against (`dfl_loss`, `bce_with_logits`,
//! `bbox2dist`); the fused terms and the device assigner are already in `terms.rs` and
//! `assign_op.rs`.

use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::anchors::Anchors;
use super::assign_op::{assign_device, ScoreLayout};
use super::assigner::{inside_gt, AssignerInput, Assignment, GtBatch, Scores, TaskAlignedAssigner};
use super::device_gt::{anc4_of, DeviceGt};
use super::iou::ciou_tensor;
use super::targets::DenseTargets;

pub use crate::model::head::REG_MAX;
/// Weight of the auxiliary branch in every loss item.
pub const AUX_WEIGHT: f32 = 0.25;
/// Hard-coded official gains of the (box, cls, dfl) items.
pub const GAINS: [f32; 3] = [7.5, 0.5, 1.5];

/// One branch's levels concatenated: `(B, 64 + nc, A)` f32, the level sizes `(H, W)`, and B.
type Flattened = (Tensor, Vec<(usize, usize)>, usize);

/// Every branch's levels concatenated (`[aux, main]`, or `[main]`), the level sizes, and B.
type Branches = (Vec<Tensor>, Vec<(usize, usize)>, usize);

/// Loss of one branch, before the branch weight and the gains (host values), with its assignment.
#[derive(Debug, Clone)]
pub struct BranchLoss {
    /// `sum((1 - CIoU) * w) / S` (0 without foreground).
    pub box_loss: f32,
    /// `sum(BCE) / S`.
    pub cls_loss: f32,
    /// `sum(DFL * w) / S` (0 without foreground).
    pub dfl_loss: f32,
    /// `S = max(sum of target scores, 1)`.
    pub target_scores_sum: f32,
    /// The TaskAlignedAssigner result of this branch (boxes in pixels); `None` when it ran on
    /// the device and stayed there (see [`DualTalLoss::with_device_assigner`]).
    pub assignment: Option<Assignment>,
}

/// Result of [`DualTalLoss::compute`].
#[derive(Debug, Clone)]
pub struct LossOutput {
    /// Scalar f32 tensor `(box + cls + dfl) * batch_size`, differentiable w.r.t. the head
    /// outputs (call `backward()` on it).
    pub total: Tensor,
    /// `[box, cls, dfl]` after branch weighting and gains, before the batch-size factor (the
    /// official `loss.detach()`, what training logs).
    pub items: [f32; 3],
    /// Auxiliary branch details (all zeros, no assignment, for a single-head model).
    pub aux: BranchLoss,
    /// Main branch details.
    pub main: BranchLoss,
}

/// Result of [`DualTalLoss::compute_on_device`]: nothing read back yet.
#[derive(Debug, Clone)]
pub struct DeviceLoss {
    /// As [`LossOutput::total`].
    pub total: Tensor,
    /// `(8,)` f32 (dual head: the aux branch's box, cls, dfl, the main branch's, then both `S`)
    /// or `(4,)` (single head: box, cls, dfl, `S`), detached; read back and given to
    /// [`DualTalLoss::items_of`].
    pub values: Tensor,
}

/// The loss values of [`DualTalLoss`] read back to the host (one device synchronisation).
fn read_values(values: &Tensor) -> Result<Vec<f32>> {
    values.to_vec1().context("loss: reading the loss items")
}

/// The dual-branch TAL loss of YOLOv9 (official `ComputeLoss` of `loss_tal_dual.py`).
#[derive(Debug, Clone)]
pub struct DualTalLoss {
    nc: usize,
    strides: Vec<u32>,
    assigner: TaskAlignedAssigner,
    /// Box, DFL and class terms as one op ([`super::terms`]) or as candle ops.
    fused: bool,
    /// On CUDA, assign on the device ([`super::assign_op`]) instead of on host copies.
    device_assign: bool,
    /// Label smoothing epsilon of the class targets (0 = off).
    label_smoothing: f64,
    /// `S = Σ target scores` unclamped (the segmentation losses), instead of `max(Σ, 1)`.
    raw_normaliser: bool,
}

impl DualTalLoss {
    /// Loss for `nc` classes and head strides (e.g. `[8, 16, 32]`, one per level).
    ///
    /// Errors: `nc == 0`, no strides, or a zero stride.
    pub fn new(nc: usize, strides: &[u32]) -> Result<Self> {
        ensure!(
            nc > 0,
            "loss: the model must have at least one class (nc = 0)"
        );
        ensure!(
            !strides.is_empty(),
            "loss: no head strides given; YOLOv9 uses [8, 16, 32]"
        );
        ensure!(
            strides.iter().all(|&s| s > 0),
            "loss: strides {strides:?} contain 0; strides are pixels per cell"
        );
        Ok(DualTalLoss {
            nc,
            strides: strides.to_vec(),
            assigner: TaskAlignedAssigner::new(nc),
            fused: fused_terms(),
            device_assign: device_assigner(),
            label_smoothing: 0.0,
            raw_normaliser: false,
        })
    }

    /// The same loss with the box, DFL and class terms computed by the fused op (`true`, the
    /// default unless `YOLO9_FUSED_LOSS=0`) or by the composite of candle ops (`false`).
    pub fn with_fused_terms(mut self, fused: bool) -> Self {
        self.fused = fused;
        self
    }

    /// The same loss with the assignment on the device (`true`, the default on CUDA unless
    /// `YOLO9_DEVICE_ASSIGN=0`; [`super::assign_op`]) or on host copies of the head outputs
    /// (`false`, which also returns the [`Assignment`]s in [`BranchLoss::assignment`]). It has no
    /// effect on the CPU, and applies with the fused terms only.
    pub fn with_device_assigner(mut self, on: bool) -> Self {
        self.device_assign = on;
        self
    }

    /// The same loss with label smoothing `eps` (`--label-smoothing`) on the class targets, the
    /// official `smooth_BCE(eps)` targets `cp = 1 − eps/2` for 1 and `cn = eps/2` for 0,
    /// applied to the soft TAL target scores linearly:
    /// `t' = t·(cp − cn) + cn = t·(1 − eps) + eps/2`.
    /// Only the class BCE sees `t'`; the normaliser `S` and the box/DFL weights keep the raw
    /// scores. As the BCE is linear in its target, the branch's class loss becomes
    /// `(1 − eps)·cls + eps·Σ BCE(x, 1/2) / S` over all anchors and classes. (The official
    /// `ComputeLoss` of `loss_tal_dual.py` computes `cp, cn` but does not use them; this applies
    /// them.) `eps = 0` (the default) leaves the loss exactly as without smoothing.
    ///
    /// Errors: `eps` not in `[0, 1)`.
    pub fn with_label_smoothing(mut self, eps: f64) -> Result<Self> {
        ensure!(
            eps.is_finite() && (0.0..1.0).contains(&eps),
            "--label-smoothing {eps}: must be in [0, 1)"
        );
        self.label_smoothing = eps;
        Ok(self)
    }

    /// The same loss normalised as the official segmentation losses are
    /// (`utils/segment/loss_tal.py`, `loss_tal_dual.py`: `target_scores_sum =
    /// target_scores.sum()`, not `max(…, 1)`): `S = Σ target scores`, except 1 for a batch
    /// without any (where the official division by 0 makes the class loss infinite).
    pub fn with_raw_normaliser(mut self, on: bool) -> Self {
        self.raw_normaliser = on;
        self
    }

    /// The label smoothing epsilon (0 = off).
    pub fn label_smoothing(&self) -> f64 {
        self.label_smoothing
    }

    /// Number of classes.
    pub fn num_classes(&self) -> usize {
        self.nc
    }

    /// The assigner used for both branches (topk 10, alpha 0.5, beta 6).
    pub fn assigner(&self) -> &TaskAlignedAssigner {
        &self.assigner
    }

    /// Compute the loss of one training batch.
    ///
    /// - `aux`, `main`: per branch, one raw head output per level (P3, P4, P5), each
    ///   `(B, 64 + nc, H_i, W_i)` of any float dtype on any device: channels `0..64` are DFL
    ///   logits side-major (l, t, r, b) x 16 bins, then `nc` class logits. Both branches must
    ///   have the same shapes. An empty `aux` is a single-head model (gelan-*): the loss is then
    ///   the official single-branch `utils/loss_tal.py ComputeLoss` of `main`
    ///   (`item = main` instead of `0.25 * aux + main`).
    /// - `targets`: `(N, 6)` rows `[img_idx, cls, cx, cy, w, h]`, box normalized to the image
    ///   (official format); `N = 0` is allowed (the loss is then the BCE against all-zero targets).
    /// - `img_hw`: the network input size `(height, width)` in pixels; each level must satisfy
    ///   `H_i * stride_i == height` and `W_i * stride_i == width`.
    ///
    /// Errors: wrong level count, channel count, batch or spatial sizes (naming the tensor),
    /// invalid targets (see [`GtBatch::from_targets`]), non-finite head outputs.
    pub fn compute(
        &self,
        aux: &[Tensor],
        main: &[Tensor],
        targets: &Tensor,
        img_hw: (usize, usize),
    ) -> Result<LossOutput> {
        self.compute_impl(aux, main, targets, img_hw, None)
    }

    /// [`Self::compute`] with the assignments of both branches given (`[aux, main]`; the first is
    /// not read when `aux` is empty) instead of computed: this evaluates the loss functions alone, e.g. against the official assigner's
    /// output, without the assignment's sensitivity to prediction rounding. `targets` are still
    /// validated. Only `fg_mask`, `target_labels`, `target_bboxes` (pixels) and `target_score`
    /// are read.
    ///
    /// Errors: as [`Self::compute`], plus assignments whose batch, anchor or class counts do not
    /// match the head outputs.
    pub fn compute_with_assignments(
        &self,
        aux: &[Tensor],
        main: &[Tensor],
        targets: &Tensor,
        img_hw: (usize, usize),
        assignments: [&Assignment; 2],
    ) -> Result<LossOutput> {
        self.compute_impl(aux, main, targets, img_hw, Some(assignments))
    }

    fn compute_impl(
        &self,
        aux: &[Tensor],
        main: &[Tensor],
        targets: &Tensor,
        img_hw: (usize, usize),
        given: Option<[&Assignment; 2]>,
    ) -> Result<LossOutput> {
        let (flats, hw, bs) = self.flatten_branches(aux, main)?;
        let anchors = self.anchors_for(&hw, img_hw)?;
        let gt = self.gt_batch(targets, bs, img_hw)?;
        let dev = flats[0].device().clone();
        if given.is_none() && self.assigns_on(&dev) {
            let dg = DeviceGt::new(anchors, &gt, gt.n_max_boxes, self.nc, &dev)?;
            let d = self.device_terms(&flats, &dg)?;
            let v = read_values(&d.values)?;
            return Ok(self.output(d.total, &v, vec![None; flats.len()]));
        }
        let anc_px = anchors.points_px();
        let anc4 = anc4_of(&anchors, &dev)?;
        let dual = flats.len() == 2;
        let mut terms = Vec::with_capacity(flats.len());
        let mut asgs = Vec::with_capacity(flats.len());
        for (i, flat) in flats.iter().enumerate() {
            let which = if dual && i == 0 { "aux" } else { "main" };
            let g = given.map(|g| g[if dual { i } else { 1 }]);
            let (t, asg, tss) = self.branch(flat, &anchors, &anc_px, &anc4, &gt, which, g)?;
            terms.push((t, tss));
            asgs.push(asg);
        }
        let (total, values) = self.combine(&flats, terms, bs)?;
        let v = read_values(&values)?;
        Ok(self.output(total, &v, asgs))
    }

    /// The loss of a batch whose GT rows and anchors are already on the head's device
    /// ([`DeviceGt`], e.g. refilled in place for a CUDA-graph replay), computed without any
    /// device synchronisation or upload of more than a few constants: the assignment on the
    /// device, the fused terms. `aux`, `main` and `img_hw` as in [`Self::compute`]; `dg` for the
    /// same batch and the levels' anchors. Returns the differentiable `total` and the unread
    /// values that [`Self::items_of`] turns into the loss items.
    ///
    /// Errors: as [`Self::compute`] for the shapes; a loss that does not run on this device
    /// this way ([`Self::assigns_on`] is false).
    pub fn compute_on_device(
        &self,
        aux: &[Tensor],
        main: &[Tensor],
        dg: &DeviceGt,
        img_hw: (usize, usize),
    ) -> Result<DeviceLoss> {
        let (flats, hw, bs) = self.flatten_branches(aux, main)?;
        let anchors = self.anchors_for(&hw, img_hw)?;
        ensure!(
            &anchors == dg.anchors() && bs == dg.batch(),
            "loss: the head outputs (batch {bs}, {} anchors) do not match the GT buffer (batch \
             {}, {} anchors)",
            anchors.len(),
            dg.batch(),
            dg.anchors().len()
        );
        ensure!(
            self.assigns_on(flats[0].device()),
            "loss: the device-only loss needs the fused terms and the device assigner on CUDA"
        );
        self.device_terms(&flats, dg)
    }

    /// Whether the loss assigns on `dev` itself (the fused terms and the device assigner on a
    /// CUDA device): then [`Self::compute_on_device`] applies.
    pub fn assigns_on(&self, dev: &Device) -> bool {
        self.fused && self.device_assign && dev.is_cuda()
    }

    /// The `[box, cls, dfl]` items (as [`LossOutput::items`]) of the values of a
    /// [`DeviceLoss`] read back: 8 values for the dual head, 4 for a single head.
    pub fn items_of(&self, values: &[f32]) -> [f32; 3] {
        if values.len() == 8 {
            let item = |i: usize| (values[i] * AUX_WEIGHT + values[3 + i]) * GAINS[i];
            [item(0), item(1), item(2)]
        } else {
            [
                values[0] * GAINS[0],
                values[1] * GAINS[1],
                values[2] * GAINS[2],
            ]
        }
    }

    /// The GT rows of `targets` (N, 6) for a batch of `bs` at `img_hw` (validated, see
    /// [`GtBatch::from_targets`]).
    pub fn gt_batch(&self, targets: &Tensor, bs: usize, img_hw: (usize, usize)) -> Result<GtBatch> {
        let (n, six) = targets
            .dims2()
            .with_context(|| format!("loss: targets must be (N, 6), got {:?}", targets.dims()))?;
        ensure!(
            six == 6,
            "loss: targets must be (N, 6) [img_idx, cls, cx, cy, w, h], got {:?}",
            targets.dims()
        );
        let flat_t: Vec<f32> = targets
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1()
            .context("loss: reading targets")?;
        let rows: Vec<[f32; 6]> = (0..n)
            .map(|r| {
                let c = &flat_t[r * 6..r * 6 + 6];
                [c[0], c[1], c[2], c[3], c[4], c[5]]
            })
            .collect();
        GtBatch::from_targets(&rows, bs, img_hw, self.nc)
    }

    /// A [`DeviceGt`] for `gt` with room for `per_image` rows per image, on `dev`, with the
    /// anchors of the head at `img_hw` (levels `img_hw / stride`).
    ///
    /// Errors: an `img_hw` that is not a multiple of every stride; those of [`DeviceGt::new`].
    pub fn device_gt(
        &self,
        gt: &GtBatch,
        per_image: usize,
        img_hw: (usize, usize),
        dev: &Device,
    ) -> Result<DeviceGt> {
        let hw: Vec<(usize, usize)> = self
            .strides
            .iter()
            .map(|&s| (img_hw.0 / s as usize, img_hw.1 / s as usize))
            .collect();
        let anchors = self.anchors_for(&hw, img_hw)?;
        DeviceGt::new(anchors, gt, per_image, self.nc, dev)
    }

    /// Both branches' levels flattened (`[aux, main]`, or `[main]` for a single head), their
    /// level sizes and the batch.
    fn flatten_branches(&self, aux: &[Tensor], main: &[Tensor]) -> Result<Branches> {
        let (flat_main, hw_main, bs_main) = self.flatten_levels(main, "main")?;
        if aux.is_empty() {
            return Ok((vec![flat_main], hw_main, bs_main));
        }
        let (flat_aux, hw_aux, bs) = self.flatten_levels(aux, "aux")?;
        ensure!(
            hw_aux == hw_main && bs == bs_main,
            "loss: aux levels {hw_aux:?} (batch {bs}) and main levels {hw_main:?} (batch \
             {bs_main}) differ; both branches must come from the same forward pass"
        );
        Ok((vec![flat_aux, flat_main], hw_main, bs))
    }

    /// The device path of every branch ([`Self::branch_on_device`]) combined.
    fn device_terms(&self, flats: &[Tensor], dg: &DeviceGt) -> Result<DeviceLoss> {
        let mut terms = Vec::with_capacity(flats.len());
        for (i, flat) in flats.iter().enumerate() {
            let which = if flats.len() == 2 && i == 0 {
                "aux"
            } else {
                "main"
            };
            terms.push(self.branch_on_device(flat, dg, which)?);
        }
        let (total, values) = self.combine(flats, terms, dg.batch())?;
        Ok(DeviceLoss { total, values })
    }

    /// The branches' `[box, cls, dfl]` terms and `S` (label smoothing applied) combined into
    /// `total = (box + cls + dfl) * bs` with the branch weight and gains, and the values to read
    /// back: each branch's three terms, then each branch's `S` (detached).
    fn combine(
        &self,
        flats: &[Tensor],
        mut terms: Vec<([Tensor; 3], Tensor)>,
        bs: usize,
    ) -> Result<(Tensor, Tensor)> {
        if self.label_smoothing > 0.0 {
            for (flat, (t, tss)) in flats.iter().zip(terms.iter_mut()) {
                t[1] = self.smoothed_cls(&t[1], flat, tss)?;
            }
        }
        let parts: Vec<Tensor> = if terms.len() == 2 {
            let (a, m) = (&terms[0].0, &terms[1].0);
            let aw = AUX_WEIGHT as f64;
            (0..3)
                .map(|i| (a[i].affine(aw, 0.0)? + &m[i])? * GAINS[i] as f64)
                .collect::<candle_core::Result<_>>()?
        } else {
            let t = &terms[0].0;
            (0..3)
                .map(|i| t[i].affine(GAINS[i] as f64, 0.0))
                .collect::<candle_core::Result<_>>()?
        };
        let total = ((&parts[0] + &parts[1])? + &parts[2])?.affine(bs as f64, 0.0)?;
        let all: Vec<&Tensor> = terms
            .iter()
            .flat_map(|(t, _)| t.iter())
            .chain(terms.iter().map(|(_, s)| s))
            .collect();
        Ok((total, Tensor::stack(&all, 0)?.detach()))
    }

    /// The [`LossOutput`] of `total` and the values read back (see [`Self::combine`]), with the
    /// branches' assignments (`[aux, main]` or `[main]`).
    fn output(&self, total: Tensor, v: &[f32], asgs: Vec<Option<Assignment>>) -> LossOutput {
        let items = self.items_of(v);
        let mut asgs = asgs.into_iter();
        let branch = |t: &[f32], s: f32, assignment| BranchLoss {
            box_loss: t[0],
            cls_loss: t[1],
            dfl_loss: t[2],
            target_scores_sum: s,
            assignment,
        };
        if v.len() == 8 {
            let (a, m) = (asgs.next().flatten(), asgs.next().flatten());
            LossOutput {
                total,
                items,
                aux: branch(&v[0..3], v[6], a),
                main: branch(&v[3..6], v[7], m),
            }
        } else {
            LossOutput {
                total,
                items,
                aux: branch(&[0.0; 3], 0.0, None),
                main: branch(&v[0..3], v[3], asgs.next().flatten()),
            }
        }
    }

    /// The anchors of levels `hw`, checked against `img_hw` and the strides.
    fn anchors_for(&self, hw: &[(usize, usize)], img_hw: (usize, usize)) -> Result<Anchors> {
        for (i, (&(h, w), &s)) in hw.iter().zip(&self.strides).enumerate() {
            let s = s as usize;
            ensure!(
                h * s == img_hw.0 && w * s == img_hw.1,
                "loss: level {i} is {h}x{w} at stride {s}, which does not cover the input \
                 {}x{} (h x w); pass img_hw = the network input size, a multiple of 32",
                img_hw.0,
                img_hw.1
            );
        }
        Anchors::new(hw, &self.strides)
    }

    /// The class loss `cls` of a branch with label smoothing (see
    /// [`DualTalLoss::with_label_smoothing`]): `(1 − eps)·cls + eps·Σ BCE(x, 1/2) / S`, with `x`
    /// the branch's class logits in `flat` and `S` its `tss`.
    fn smoothed_cls(&self, cls: &Tensor, flat: &Tensor, tss: &Tensor) -> Result<Tensor> {
        let eps = self.label_smoothing;
        let x = flat.narrow(1, 4 * REG_MAX, self.nc)?;
        let half = (bce_with_logits_zero_target(&x)? - (&x * 0.5)?)?
            .to_dtype(DType::F64)?
            .sum_all()?
            .to_dtype(cls.dtype())?
            .broadcast_div(&tss.to_dtype(cls.dtype())?)?;
        Ok(((cls * (1.0 - eps))? + (half * eps)?.reshape(cls.shape())?)?)
    }

    /// Check the levels of one branch and concatenate them to `(B, 64 + nc, A)` f32.
    fn flatten_levels(&self, levels: &[Tensor], which: &str) -> Result<Flattened> {
        ensure!(
            levels.len() == self.strides.len(),
            "loss: the {which} branch has {} levels but the loss has {} strides {:?}",
            levels.len(),
            self.strides.len(),
            self.strides
        );
        let no = 4 * REG_MAX + self.nc;
        let mut hw = Vec::with_capacity(levels.len());
        let mut flat = Vec::with_capacity(levels.len());
        let mut bs = None;
        for (i, x) in levels.iter().enumerate() {
            let (b, c, h, w) = x.dims4().with_context(|| {
                format!(
                    "loss: {which} level {i} must be (B, 64 + nc, H, W), got {:?}",
                    x.dims()
                )
            })?;
            ensure!(
                c == no,
                "loss: {which} level {i} has {c} channels, expected 64 + nc = {no} (nc = {}); \
                 the head and the loss must agree on the class count",
                self.nc
            );
            ensure!(
                b > 0 && h > 0 && w > 0,
                "loss: {which} level {i} is empty: {:?}",
                x.dims()
            );
            if let Some(b0) = bs {
                ensure!(
                    b == b0,
                    "loss: {which} level {i} has batch {b}, level 0 has {b0}"
                );
            }
            bs = Some(b);
            hw.push((h, w));
            flat.push(x.to_dtype(DType::F32)?.reshape((b, c, h * w))?);
        }
        let bs = bs.context("loss: no levels")?;
        Ok((Tensor::cat(&flat, 2)?, hw, bs))
    }

    /// The device path of one branch: the decode, the assignment ([`assign_device`]) and the
    /// fused terms on the head's device, nothing read back. Non-finite head outputs give
    /// non-finite terms (the trainer's NaN guard), not an error. Returns `[box, cls, dfl]` and
    /// `S` (device scalars).
    fn branch_on_device(
        &self,
        flat: &Tensor,
        dg: &DeviceGt,
        which: &str,
    ) -> Result<([Tensor; 3], Tensor)> {
        let mut clock = PhaseClock::new(flat.device(), which);
        let detached = flat.detach();
        let (_, pbox) = decode_flat(&detached, dg.anchors_xyxy())?;
        let planes = assign_device(
            &self.assigner,
            &pbox,
            &detached,
            ScoreLayout::HeadLogits {
                channels: 4 * REG_MAX + self.nc,
                offset: 4 * REG_MAX,
            },
            dg,
        )
        .with_context(|| format!("loss: assigning the {which} branch on the device"))?;
        clock.mark("assign (device)")?;
        let sum = planes.get(0)?.sum_all()?;
        let tss = if self.raw_normaliser {
            // Σ, or 1 where Σ = 0.
            (&sum + sum.eq(0f32)?.to_dtype(sum.dtype())?)?
        } else {
            sum.maximum(1f32)?
        };
        let terms =
            super::terms::branch_terms(flat, &planes.narrow(0, 0, 10)?, dg.anchors_xy(), self.nc)?;
        let part = |i: usize| -> Result<Tensor> { Ok(terms.get(i)?.broadcast_div(&tss)?) };
        let out = [part(0)?, part(1)?, part(2)?];
        clock.mark("loss terms")?;
        Ok((out, tss))
    }

    /// Loss of one branch: `[box, cls, dfl]` scalar tensors before weights and gains, plus the
    /// assignment and `S`.
    ///
    /// Every term is computed densely over all `B x A` anchors on the head's device, with the
    /// assignment as dense constant tensors (target score `w` per anchor, 0 for background;
    /// one-hot class targets; target box and DFL distances, harmless placeholders where
    /// `w = 0`). Nothing is gathered, so the backward is a handful of element-wise kernels
    /// instead of scattering into the head output. The assigner reads host copies of the decoded
    /// boxes and class logits ([`host_copies`]: on a GPU only the anchors inside a GT box).
    #[allow(clippy::too_many_arguments)]
    fn branch(
        &self,
        flat: &Tensor,
        anchors: &Anchors,
        anc_px: &[[f32; 2]],
        anc4: &Tensor,
        gt: &GtBatch,
        which: &str,
        given: Option<&Assignment>,
    ) -> Result<([Tensor; 3], Option<Assignment>, Tensor)> {
        let (bs, _no, na) = flat.dims3()?;
        let nc = self.nc;
        let dev = flat.device().clone();
        let mut clock = PhaseClock::new(&dev, which);
        let fused = self.fused;
        // With the fused terms the decode below only feeds the assigner: no graph.
        let src = if fused { flat.detach() } else { flat.clone() };
        let (logp, pbox) = decode_flat(&src, anc4)?; // pbox (B, 4, A) grid units
        let cls_logits = flat.narrow(1, 4 * REG_MAX, nc)?; // (B, nc, A)

        // Host copies for the assigner: boxes in pixels (B, A, 4) and class logits (B, nc, A).
        let stride = Tensor::from_slice(&anchors.strides, (1, 1, na), &dev)?;
        let pbox_dev = pbox.detach().broadcast_mul(&stride)?.transpose(1, 2)?; // (B, A, 4)
        let (pbox_px, cls_host) = host_copies(&pbox_dev, &cls_logits.detach(), anc_px, gt)
            .with_context(|| format!("loss: copying the {which} head outputs to the host"))?;
        finite_head(which, &pbox_px, &cls_host, na, nc)?;
        clock.mark("decode + host copies")?;
        let pd_bboxes: Vec<[f32; 4]> = pbox_px
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect();

        let asg = match given {
            Some(a) => given_assignment(a, which, bs, na, nc)?,
            None => self.assigner.assign(&AssignerInput {
                scores: Scores::HeadLogits {
                    data: &cls_host,
                    channels: nc,
                    offset: 0,
                },
                pd_bboxes: &pd_bboxes,
                anc_points: anc_px,
                gt,
            })?,
        };
        clock.mark("assign")?;
        let sum = asg.target_scores_sum();
        let tss = match self.raw_normaliser {
            true if sum > 0.0 => sum,
            _ => sum.max(1.0),
        };
        let tss_t = Tensor::new(tss, &dev)?;
        let targets = DenseTargets::new(&asg, anchors, &dev)?;
        clock.mark("dense targets")?;
        if fused {
            let terms = super::terms::branch_terms(flat, &targets.planes, &targets.anchors, nc)?;
            let part = |i: usize| -> Result<Tensor> { Ok((terms.get(i)? / tss as f64)?) };
            let (bx, cls, dfl) = (part(0)?, part(1)?, part(2)?);
            clock.mark("loss terms")?;
            return Ok(([bx, cls, dfl], Some(asg), tss_t));
        }

        // Class loss: dense sum of softplus(x) minus the sum of x * t (t one-hot * score).
        let classes = Tensor::arange(0u32, nc as u32, &dev)?
            .to_dtype(DType::F32)?
            .reshape((1, nc, 1))?;
        let t_cls = classes
            .broadcast_eq(&targets.label)?
            .to_dtype(DType::F32)?
            .broadcast_mul(&targets.weight.unsqueeze(1)?)?; // (B, nc, A)
        let dense = bce_with_logits_zero_target(&cls_logits)?
            .to_dtype(DType::F64)?
            .sum_all()?;
        let xt = cls_logits.mul(&t_cls)?.to_dtype(DType::F64)?.sum_all()?;
        let cls = (dense.sub(&xt)?.to_dtype(DType::F32)? / tss as f64)?;

        // Box loss: (1 - CIoU) weighted by the target score; background weighs 0.
        let pbox_rows = pbox.transpose(1, 2)?.reshape((bs * na, 4))?;
        let iou = ciou_tensor(&pbox_rows, &targets.boxes)?;
        let w = targets.weight.reshape(bs * na)?;
        let bx = (iou.affine(-1.0, 1.0)?.mul(&w)?.sum_all()? / tss as f64)?;

        // DFL per anchor, weighted by the target score.
        let ce = dfl_bins(&logp, &targets.ltrb)?; // (B, A)
        let dfl = (ce.mul(&targets.weight)?.sum_all()? / tss as f64)?;
        clock.mark("loss terms")?;
        Ok(([bx, cls, dfl], Some(asg), tss_t))
    }
}

/// The host copies of a branch's head output (`pbox_px` `(B, A, 4)` pixels, `cls_host`
/// `(B, nc, A)` logits) are finite; else an error naming the first bad value and where it is.
fn finite_head(which: &str, pbox_px: &[f32], cls_host: &[f32], na: usize, nc: usize) -> Result<()> {
    if let Some(i) = pbox_px.iter().position(|v| !v.is_finite()) {
        bail!(
            "loss: the {which} head output has a non-finite box (decoded value {}) at image \
             {}, anchor {}; training diverged or the input is broken (lower the learning \
             rate, check the images)",
            pbox_px[i],
            i / (4 * na),
            (i / 4) % na
        );
    }
    if let Some(i) = cls_host.iter().position(|v| !v.is_finite()) {
        bail!(
            "loss: the {which} head output has a non-finite class logit ({}) at (b, class, \
             anchor) = ({}, {}, {}); training diverged or the input is broken (lower the \
             learning rate, check the images)",
            cls_host[i],
            i / (nc * na),
            (i / na) % nc,
            i % na
        );
    }
    Ok(())
}

/// A caller's assignment ([`TalLoss::compute_with_assignments`]) checked against the head's
/// batch `bs`, anchors `na` and classes `nc`.
fn given_assignment(
    a: &Assignment,
    which: &str,
    bs: usize,
    na: usize,
    nc: usize,
) -> Result<Assignment> {
    ensure!(
        a.batch == bs
            && a.num_anchors == na
            && a.num_classes == nc
            && a.fg_mask.len() == bs * na
            && a.target_labels.len() == bs * na
            && a.target_bboxes.len() == bs * na
            && a.target_score.len() == bs * na,
        "loss: the given {which} assignment is for batch {} x {} anchors x {} classes, \
         the head has {bs} x {na} x {nc}",
        a.batch,
        a.num_anchors,
        a.num_classes,
    );
    if let Some(i) = (0..bs * na)
        .find(|&i| a.fg_mask[i] && (a.target_labels[i] < 0 || a.target_labels[i] as usize >= nc))
    {
        bail!(
            "loss: the given {which} assignment has label {} at anchor {i}",
            a.target_labels[i]
        );
    }
    Ok(a.clone())
}

/// The assigner's inputs on the host: `pbox` `(B, A, 4)` pixels and `cls` `(B, nc, A)` logits,
/// both on the head's device; `anc_px` the anchor centres in pixels. On the CPU they are read whole. On another device only the anchors
/// the assigner reads are copied — those strictly inside at least one valid GT box, the
/// candidates of `select_candidates_in_gts` — gathered there first (a few percent of the data;
/// device-to-host copies of whole head outputs dominated the loss at batch 64); the other
/// entries are left 0 and never read.
fn host_copies(
    pbox: &Tensor,
    cls: &Tensor,
    anc_px: &[[f32; 2]],
    gt: &GtBatch,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (bs, na, _) = pbox.dims3()?;
    let nc = cls.dim(1)?;
    let whole = |pbox: &Tensor, cls: &Tensor| -> Result<(Vec<f32>, Vec<f32>)> {
        Ok((
            pbox.flatten_all()?.to_vec1()?,
            cls.flatten_all()?.to_vec1()?,
        ))
    };
    if pbox.device().is_cpu() {
        return whole(pbox, cls);
    }
    let m = gt.n_max_boxes;
    let cand: Vec<u32> = (0..bs)
        .into_par_iter()
        .flat_map_iter(|b| {
            (0..na).filter_map(move |a| {
                (0..m)
                    .any(|j| gt.mask[b * m + j] && inside_gt(anc_px[a], gt.bboxes[b * m + j]))
                    .then_some((b * na + a) as u32)
            })
        })
        .collect();
    if cand.len() * 2 > bs * na {
        return whole(pbox, cls);
    }
    let mut pbox_h = vec![0f32; bs * na * 4];
    let mut cls_h = vec![0f32; bs * nc * na];
    if cand.is_empty() {
        return Ok((pbox_h, cls_h));
    }
    let idx = Tensor::from_slice(&cand, cand.len(), pbox.device())?;
    let pb: Vec<f32> = pbox
        .reshape((bs * na, 4))?
        .index_select(&idx, 0)?
        .flatten_all()?
        .to_vec1()?;
    let cl: Vec<f32> = cls
        .transpose(1, 2)?
        .reshape((bs * na, nc))?
        .index_select(&idx, 0)?
        .flatten_all()?
        .to_vec1()?;
    for (k, &i) in cand.iter().enumerate() {
        let i = i as usize;
        let (b, a) = (i / na, i % na);
        pbox_h[i * 4..i * 4 + 4].copy_from_slice(&pb[k * 4..k * 4 + 4]);
        for c in 0..nc {
            cls_h[(b * nc + c) * na + a] = cl[k * nc + c];
        }
    }
    Ok((pbox_h, cls_h))
}

/// `log_softmax` over dim 2 (the 16 DFL bins) of `(B, 4, 16, A)`, with the same value as candle's
/// `log_softmax(x, 2)`: `(x − m) − log Σ exp(x − m)` with `m` the per-side maximum. `m` is found by
/// four element-wise maxima over halves of the bins and is a constant for autograd (its gradient
/// cancels exactly), instead of a reduction kernel with one thread block per side and anchor.
fn log_softmax_bins(x: &Tensor) -> Result<Tensor> {
    let mut m = x.detach();
    while m.dim(2)? > 1 {
        let h = m.dim(2)? / 2;
        m = m.narrow(2, 0, h)?.maximum(&m.narrow(2, h, h)?)?;
    }
    let d = x.broadcast_sub(&m)?;
    let lse = d.exp()?.sum_keepdim(2)?.log()?;
    Ok(d.broadcast_sub(&lse)?)
}

/// DFL decode on the bins layout (official `bbox_decode` + `dist2bbox`): `logits` `(B, 4, 16, A)`
/// side-major (l, t, r, b), `anc4` `(1, 4, A)` = `[ax; ay; ax; ay]` in grid units. Returns the
/// log-probabilities of the bins `(B, 4, 16, A)` (for [`dfl_bins`]) and the boxes `(B, 4, A)`
/// xyxy in grid units, `ax − l, ay − t, ax + r, ay + b` with each side the softmax expectation
/// `Σ_k p_k · k`. Differentiable w.r.t. `logits`.
fn decode_bins(logits: &Tensor, anc4: &Tensor) -> Result<(Tensor, Tensor)> {
    let dev = logits.device();
    let logp = log_softmax_bins(logits)?;
    let proj = Tensor::arange(0u32, REG_MAX as u32, dev)?
        .to_dtype(logits.dtype())?
        .reshape((1, 1, REG_MAX, 1))?;
    let dist = logp.exp()?.broadcast_mul(&proj)?.sum(2)?; // (B, 4, A)
    let sign = Tensor::new(&[-1f32, -1.0, 1.0, 1.0], dev)?
        .to_dtype(logits.dtype())?
        .reshape((1, 4, 1))?;
    let pbox = dist.broadcast_mul(&sign)?.broadcast_add(anc4)?;
    Ok((logp, pbox))
}

/// [`decode_bins`] of a branch's flattened head output `(B, 64 + nc, A)`: the bins' log-probabilities
/// `(B, 4, 16, A)` and the boxes `(B, 4, A)` xyxy in grid units.
fn decode_flat(flat: &Tensor, anc4: &Tensor) -> Result<(Tensor, Tensor)> {
    let (bs, _, na) = flat.dims3()?;
    let box_logits = flat
        .narrow(1, 0, 4 * REG_MAX)?
        .reshape((bs, 4, REG_MAX, na))?;
    decode_bins(&box_logits, anc4)
}

/// Distribution Focal Loss on the bins layout (official `BboxLoss._df_loss`): `logp` `(B, 4, 16,
/// A)` from [`decode_bins`], `ltrb` `(B, 4, A)` target distances in `[0, 15)` grid units. For a
/// side with target `t` the cross-entropy to its two neighbouring bins with weights
/// `max(0, 1 − |k − t|)` (`l + 1 − t` at `k = l = ⌊t⌋`, `t − l` at `k = l + 1`); returns the mean
/// over the 4 sides, `(B, A)`. Differentiable w.r.t. `logp`.
fn dfl_bins(logp: &Tensor, ltrb: &Tensor) -> Result<Tensor> {
    let proj = Tensor::arange(0u32, REG_MAX as u32, logp.device())?
        .to_dtype(logp.dtype())?
        .reshape((1, 1, REG_MAX, 1))?;
    let w = proj
        .broadcast_sub(&ltrb.unsqueeze(2)?)?
        .abs()?
        .affine(-1.0, 1.0)?
        .relu()?; // (B, 4, 16, A)
    Ok(logp.mul(&w)?.sum(2)?.sum(1)?.affine(-0.25, 0.0)?)
}

/// Environment variable choosing how the box, DFL and class terms are computed: `1` (default)
/// one op with a closed-form backward ([`super::terms::branch_terms`]), `0` the composite of
/// candle ops differentiated by candle's autograd (the reference the op is tested against).
pub const FUSED_LOSS_ENV: &str = "YOLO9_FUSED_LOSS";

/// Whether [`FUSED_LOSS_ENV`] selects the fused terms (read once).
fn fused_terms() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::switches::off(FUSED_LOSS_ENV))
}

/// Environment variable that turns the device assigner off (`0`); see
/// [`DualTalLoss::with_device_assigner`].
pub const DEVICE_ASSIGN_ENV: &str = "YOLO9_DEVICE_ASSIGN";

fn device_assigner() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::switches::off(DEVICE_ASSIGN_ENV))
}

/// `YOLO9_LOSS_TIMES=1`: each branch prints the seconds of its phases (device-synchronised) to
/// stderr, for profiling. Off (and free) otherwise.
struct PhaseClock<'a> {
    dev: &'a Device,
    which: &'a str,
    last: Option<std::time::Instant>,
}

impl<'a> PhaseClock<'a> {
    fn new(dev: &'a Device, which: &'a str) -> Self {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| crate::switches::one("YOLO9_LOSS_TIMES"));
        PhaseClock {
            dev,
            which,
            last: on.then(std::time::Instant::now),
        }
    }

    fn mark(&mut self, phase: &str) -> Result<()> {
        if let Some(t) = self.last {
            self.dev.synchronize()?;
            let now = std::time::Instant::now();
            crate::text::errln!(
                "loss {} {phase}: {:.2} ms",
                self.which,
                (now - t).as_secs_f64() * 1e3
            );
            self.last = Some(now);
        }
        Ok(())
    }
}

/// Expected distance of one side from its 16 DFL logits: `sum_k softmax(x)_k * k` (f32, the
/// official `bbox_decode`), in grid units, in `[0, 15]`.
pub fn dfl_expectation(bins: &[f32; REG_MAX]) -> f32 {
    let max = bins.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut e = [0f32; REG_MAX];
    let mut sum = 0f32;
    for (ek, &x) in e.iter_mut().zip(bins) {
        *ek = (x - max).exp();
        sum += *ek;
    }
    let mut d = 0f32;
    for (k, ek) in e.iter().enumerate() {
        d += (ek / sum) * k as f32;
    }
    d
}

/// Distribution Focal Loss per anchor (official `BboxLoss._df_loss`).
///
/// `logits`: `(N, 4, 16)`; `targets`: N side distances in grid units, each in `[0, 15)` (use
/// [`super::targets::bbox2dist`]). For a side with target `t`, `l = floor(t)`:
/// `CE(logits, l) * (l + 1 - t) + CE(logits, l + 1) * (t - l)`; the result `(N,)` is the mean
/// over the 4 sides. Differentiable w.r.t. `logits`. The same code as the training loss
/// (`dfl_bins`).
///
/// Errors: shape mismatch, or a target outside `[0, 15)`.
pub fn dfl_loss(logits: &Tensor, targets: &[[f32; 4]]) -> Result<Tensor> {
    let (n, sides, bins) = logits.dims3()?;
    ensure!(
        sides == 4 && bins == REG_MAX && n == targets.len(),
        "dfl_loss: logits {:?} must be (N, 4, 16) with N = {} targets",
        logits.dims(),
        targets.len()
    );
    for (i, t4) in targets.iter().enumerate() {
        for (s, &t) in t4.iter().enumerate() {
            ensure!(
                (0.0..(REG_MAX - 1) as f32).contains(&t),
                "dfl_loss: target distance {t} (anchor {i}, side {s}) is outside [0, 15); clamp \
                 it with bbox2dist"
            );
        }
    }
    // The loss's own implementation, on the bins layout: (N, 4, 16) → (1, 4, 16, N).
    let mut ltrb = vec![0f32; 4 * n];
    for (i, t4) in targets.iter().enumerate() {
        for (s, &t) in t4.iter().enumerate() {
            ltrb[s * n + i] = t;
        }
    }
    let ltrb = Tensor::from_vec(ltrb, (1, 4, n), logits.device())?.to_dtype(logits.dtype())?;
    let logp = log_softmax_bins(&logits.permute((1, 2, 0))?.unsqueeze(0)?)?;
    Ok(dfl_bins(&logp, &ltrb)?.squeeze(0)?)
}

/// Elementwise BCE-with-logits in the stable form
/// `(1 - t) * x + max(-x, 0) + log1p(exp(-|x|))` = `(1 - t) * x - log_sigmoid(x)` (PyTorch
/// `binary_cross_entropy_with_logits`, `pos_weight = 1`). `x`, `t`: same shape and dtype.
/// Gradient w.r.t. `x`: `sigmoid(x) - t`.
pub fn bce_with_logits(x: &Tensor, t: &Tensor) -> Result<Tensor> {
    let e = x.abs()?.neg()?.exp()?;
    let one_minus_t = t.affine(-1.0, 1.0)?;
    Ok(one_minus_t
        .mul(x)?
        .add(&x.neg()?.relu()?)?
        .add(&log1p_unit(&e)?)?)
}

/// [`bce_with_logits`] with target 0: `max(x, 0) + log1p(exp(-|x|))` (softplus of `x`).
pub fn bce_with_logits_zero_target(x: &Tensor) -> Result<Tensor> {
    let e = x.abs()?.neg()?.exp()?;
    Ok(x.relu()?.add(&log1p_unit(&e)?)?)
}

/// `log1p(e)` for `e` in `[0, 1]`, accurate to f32 rounding even for tiny `e` (Candle has no
/// `log1p`): with `u = 1 + e` rounded, `log(u) + (e - (u - 1)) / u` corrects the rounding of
/// `u` to first order. Differentiable (gradient `1 / u`).
fn log1p_unit(e: &Tensor) -> Result<Tensor> {
    let u = (e + 1.0)?;
    let corr = e.sub(&(&u - 1.0)?)?.div(&u)?;
    Ok(u.log()?.add(&corr)?)
}

/// Build the official-format `(N, 6)` f32 targets tensor on `device` from rows
/// `[img_idx, cls, cx, cy, w, h]` (normalized boxes). Convenience for callers and tests. The
/// loss reads targets on the host, so `Device::Cpu` is the cheapest choice for any head device.
pub fn targets_tensor(rows: &[[f32; 6]], device: &Device) -> Result<Tensor> {
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Ok(Tensor::from_vec(flat, (rows.len(), 6), device)?)
}
