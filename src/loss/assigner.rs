//! TaskAlignedAssigner (TOOD, Feng et al. 2021, §3.2; official `utils/tal/assigner.py`).
//!
//! The assigner picks, for every ground-truth box (GT), the anchors that will learn it, and the
//! soft class targets they learn. It is not differentiated, so it runs on host `f32` arrays,
//! reproducing the official PyTorch operations in the same order:
//!
//! 1. `overlaps[b, j, a] = max(CIoU(gt_j, pred_a), 0)` and
//!    `align_metric = score(a, label_j)^alpha * overlaps^beta` (alpha 0.5, beta 6).
//! 2. Candidates of GT j: anchors whose centre lies strictly inside it (all four distances
//!    `> eps = 1e-9`). The positives are the `topk` (10) anchors of largest alignment metric over
//!    the metric row masked to candidates, intersected with the candidates (`mask_pos_pre`).
//!    Padded GTs (`mask_gt = false`) get no positives.
//! 3. An anchor claimed by several GTs keeps only the GT of highest `overlaps` among **all** the
//!    image's GT rows (official `select_highest_overlaps`; ties: the lowest GT index).
//! 4. Targets: the label and box of the assigned GT, and the target score
//!    `align * max_overlap(GT) / (max_align(GT) + eps)` on the assigned class (0 elsewhere).
//!
//! Ties in `torch.topk` are implementation-defined in PyTorch. Here ties are broken by the lowest
//! anchor index (a stable top-k over the whole masked row, where anchors outside the GT count as
//! metric 0). This only matters when a GT has fewer than `topk` candidates with a positive metric
//! and more candidates with metric exactly 0; the oracle cases avoid that situation.
//!
//! Why one file: it is one algorithm, the official `TaskAlignedAssigner.forward`, written step by
//! step in the official order, with the positives-only path next to the reference path it is tested
//! against.

use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Tensor};
use rayon::prelude::*;

use super::iou::{ciou_prepared, CiouBox};

/// Strict-inside margin of `select_candidates_in_gts`.
const IN_GT_EPS: f32 = 1e-9;

/// Whether an anchor centre `p` lies strictly inside the xyxy box `gt` (all four distances
/// `> 1e-9`, official `select_candidates_in_gts`), both in pixels: the assigner's candidates.
pub(crate) fn inside_gt(p: [f32; 2], gt: [f32; 4]) -> bool {
    let [x1, y1, x2, y2] = gt;
    (p[0] - x1).min(p[1] - y1).min(x2 - p[0]).min(y2 - p[1]) > IN_GT_EPS
}

/// Ground-truth boxes of a batch, padded to `n_max_boxes` per image (official
/// `ComputeLoss.preprocess` layout `(B, n_max_boxes, ·)`, flattened row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct GtBatch {
    /// Batch size B.
    pub batch: usize,
    /// Padded number of GT rows per image (max over images; 0 when the batch has no targets).
    pub n_max_boxes: usize,
    /// Class index per row, length `B * n_max_boxes`; padded rows hold 0.
    pub labels: Vec<i64>,
    /// xyxy **pixel** boxes per row, length `B * n_max_boxes`; padded rows are all-zero.
    pub bboxes: Vec<[f32; 4]>,
    /// Valid-row mask (official `mask_gt = gt_bboxes.sum(-1) > 0`), length `B * n_max_boxes`.
    pub mask: Vec<bool>,
}

impl GtBatch {
    /// Group official-format targets by image (official `ComputeLoss.preprocess`).
    ///
    /// `rows`: `[img_idx, cls, cx, cy, w, h]` with the box **normalized** to the image
    /// (`img_hw = (height, width)` in pixels). Row order is kept within each image. Boxes become
    /// xyxy pixels: `cx*W - w*W/2, ...`. A row whose pixel box sums to `<= 0` is masked out,
    /// exactly as the official `mask_gt`.
    ///
    /// Errors (naming the row): non-finite values, `img_idx` not an integer in `0..batch`, `cls`
    /// not an integer in `0..num_classes`, negative `w` or `h`.
    pub fn from_targets(
        rows: &[[f32; 6]],
        batch: usize,
        img_hw: (usize, usize),
        num_classes: usize,
    ) -> Result<GtBatch> {
        let mut per_image: Vec<Vec<usize>> = vec![Vec::new(); batch];
        for (r, row) in rows.iter().enumerate() {
            ensure!(
                row.iter().all(|v| v.is_finite()),
                "targets row {r} {row:?} has a non-finite value; every target must be finite \
                 [img_idx, cls, cx, cy, w, h]"
            );
            let (img, cls) = (row[0], row[1]);
            ensure!(
                img >= 0.0 && img.fract() == 0.0 && (img as usize) < batch,
                "targets row {r}: image index {img} is not an integer in 0..{batch} (batch size); \
                 column 0 must index the image in the batch"
            );
            ensure!(
                cls >= 0.0 && cls.fract() == 0.0 && (cls as usize) < num_classes,
                "targets row {r}: class {cls} is not an integer in 0..{num_classes}; check the \
                 dataset labels against the model's class count (nc)"
            );
            ensure!(
                row[4] >= 0.0 && row[5] >= 0.0,
                "targets row {r}: negative box size w={} h={}; boxes are [cx, cy, w, h] \
                 normalized to the image",
                row[4],
                row[5]
            );
            per_image[img as usize].push(r);
        }
        let n_max = per_image.iter().map(Vec::len).max().unwrap_or(0);
        let (ih, iw) = (img_hw.0 as f32, img_hw.1 as f32);
        let mut labels = vec![0i64; batch * n_max];
        let mut bboxes = vec![[0f32; 4]; batch * n_max];
        let mut mask = vec![false; batch * n_max];
        for (b, idxs) in per_image.iter().enumerate() {
            for (j, &r) in idxs.iter().enumerate() {
                let row = rows[r];
                let (cx, cy, w, h) = (row[2] * iw, row[3] * ih, row[4] * iw, row[5] * ih);
                let bb = [cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0];
                labels[b * n_max + j] = row[1] as i64;
                bboxes[b * n_max + j] = bb;
                mask[b * n_max + j] = bb[0] + bb[1] + bb[2] + bb[3] > 0.0;
            }
        }
        Ok(GtBatch {
            batch,
            n_max_boxes: n_max,
            labels,
            bboxes,
            mask,
        })
    }

    /// Build from the official assigner inputs: `gt_labels (B, n, 1)` (any numeric dtype, class
    /// ids), `gt_bboxes (B, n, 4)` xyxy pixels, `mask_gt (B, n, 1)` (non-zero = valid).
    ///
    /// Errors: wrong ranks or mismatched shapes, non-finite boxes, labels that are not integers
    /// in `0..num_classes`.
    pub fn from_tensors(
        gt_labels: &Tensor,
        gt_bboxes: &Tensor,
        mask_gt: &Tensor,
        num_classes: usize,
    ) -> Result<GtBatch> {
        let (b, n, four) = gt_bboxes
            .dims3()
            .context("gt_bboxes must be (B, n_max_boxes, 4)")?;
        ensure!(
            four == 4,
            "gt_bboxes must be (B, n, 4) xyxy, got {:?}",
            gt_bboxes.dims()
        );
        ensure!(
            gt_labels.dims() == [b, n, 1] && mask_gt.dims() == [b, n, 1],
            "gt_labels {:?} and mask_gt {:?} must both be (B, n, 1) = [{b}, {n}, 1]",
            gt_labels.dims(),
            mask_gt.dims()
        );
        let labels_f: Vec<f64> = gt_labels.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
        let boxes: Vec<f32> = gt_bboxes.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let mask_f: Vec<f64> = mask_gt.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
        ensure!(
            boxes.iter().all(|v| v.is_finite()),
            "gt_bboxes contains non-finite values"
        );
        let mut labels = Vec::with_capacity(b * n);
        for (i, &l) in labels_f.iter().enumerate() {
            ensure!(
                l >= 0.0 && l.fract() == 0.0 && (l as usize) < num_classes,
                "gt_labels[{}] = {l} is not an integer class in 0..{num_classes}",
                i
            );
            labels.push(l as i64);
        }
        Ok(GtBatch {
            batch: b,
            n_max_boxes: n,
            labels,
            bboxes: boxes
                .chunks_exact(4)
                .map(|c| [c[0], c[1], c[2], c[3]])
                .collect(),
            mask: mask_f.iter().map(|&m| m != 0.0).collect(),
        })
    }
}

/// Predicted class scores as the assigner reads them.
#[derive(Debug, Clone, Copy)]
pub enum Scores<'a> {
    /// Probabilities (already sigmoided), `(B, A, nc)` row-major: the official `pd_scores`.
    Probs(&'a [f32]),
    /// Raw logits in the head's channel-first layout `(B, channels, A)` row-major, class `c` at
    /// channel `offset + c`; the sigmoid `1 / (1 + exp(-x))` is applied on read.
    HeadLogits {
        /// The data, length `B * channels * A`.
        data: &'a [f32],
        /// Channels per anchor (`64 + nc` for the YOLOv9 head).
        channels: usize,
        /// Channel of class 0 (64 for the YOLOv9 head).
        offset: usize,
    },
}

/// Inputs of one assignment (official `TaskAlignedAssigner.forward` arguments).
#[derive(Debug, Clone, Copy)]
pub struct AssignerInput<'a> {
    /// Predicted scores of B images over A anchors and `num_classes` classes.
    pub scores: Scores<'a>,
    /// Predicted boxes, xyxy **pixels**, `(B, A)` row-major (length `B * A`).
    pub pd_bboxes: &'a [[f32; 4]],
    /// Anchor centres in **pixels**, length A (see [`super::anchors::Anchors::points_px`]).
    pub anc_points: &'a [[f32; 2]],
    /// Ground truth, `gt.batch` = B.
    pub gt: &'a GtBatch,
}

/// The assigner's result for a batch (official `target_labels, target_bboxes, target_scores,
/// fg_mask` plus `target_gt_idx`), all `(B, A)` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Batch size B.
    pub batch: usize,
    /// Anchors per image A.
    pub num_anchors: usize,
    /// Number of classes (the background index when there are no GTs).
    pub num_classes: usize,
    /// Assigned class. Only meaningful where `fg_mask`: elsewhere it is the label of GT row 0
    /// (official behaviour), or `num_classes` when the batch has no GT rows at all.
    pub target_labels: Vec<i64>,
    /// Assigned GT box, xyxy pixels (GT row 0's box for background anchors; zeros without GTs).
    pub target_bboxes: Vec<[f32; 4]>,
    /// Target score on the assigned class: the normalized alignment metric; 0 for background.
    /// The dense official `target_scores[b, a, c]` is this value where `c == target_labels`.
    pub target_score: Vec<f32>,
    /// Foreground anchors.
    pub fg_mask: Vec<bool>,
    /// Index of the assigned GT row (0 for background anchors).
    pub target_gt_idx: Vec<usize>,
}

impl Assignment {
    /// The dense official `target_scores`, `(B, A, num_classes)` row-major.
    pub fn target_scores_dense(&self) -> Vec<f32> {
        let nc = self.num_classes;
        let mut out = vec![0f32; self.target_score.len() * nc];
        for (i, (&s, &fg)) in self.target_score.iter().zip(&self.fg_mask).enumerate() {
            if fg {
                out[i * nc + self.target_labels[i] as usize] = s;
            }
        }
        out
    }

    /// Sum of all target scores (before the official `max(sum, 1)` clamp), accumulated in f64.
    pub fn target_scores_sum(&self) -> f32 {
        self.target_score.iter().map(|&v| v as f64).sum::<f64>() as f32
    }

    /// Flat indices `b * A + a` of the foreground anchors, ascending.
    pub fn fg_indices(&self) -> Vec<usize> {
        self.fg_mask
            .iter()
            .enumerate()
            .filter_map(|(i, &f)| f.then_some(i))
            .collect()
    }
}

/// Intermediate arrays of the assignment, all `(B, n_max_boxes, A)` row-major, as the official
/// `get_pos_mask` / `select_highest_overlaps` produce them (for testing and debugging).
#[derive(Debug, Clone, PartialEq)]
pub struct AssignerDiagnostics {
    /// `max(CIoU(gt, pred), 0)` for every GT row (padded ones included) and anchor.
    pub overlaps: Vec<f32>,
    /// `score^alpha * overlaps^beta` (the score of the GT row's class).
    pub align_metric: Vec<f32>,
    /// top-k ∩ inside-GT ∩ valid GT, before de-duplication.
    pub mask_pos_pre: Vec<bool>,
    /// After de-duplication (each anchor has at most one GT).
    pub mask_pos: Vec<bool>,
}

/// TaskAlignedAssigner hyper-parameters (official `TaskAlignedAssigner(topk, num_classes,
/// alpha, beta, eps)`); `ComputeLoss` uses topk 10, alpha 0.5, beta 6.0, eps 1e-9.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskAlignedAssigner {
    /// Positives per GT at most.
    pub topk: usize,
    /// Number of classes; also the background label when there is no GT.
    pub num_classes: usize,
    /// Exponent of the class score in the alignment metric.
    pub alpha: f32,
    /// Exponent of the CIoU overlap in the alignment metric.
    pub beta: f32,
    /// Guard in the score normalisation.
    pub eps: f32,
}

impl TaskAlignedAssigner {
    /// The `ComputeLoss` configuration: topk 10, alpha 0.5, beta 6.0, eps 1e-9.
    pub fn new(num_classes: usize) -> Self {
        TaskAlignedAssigner {
            topk: 10,
            num_classes,
            alpha: 0.5,
            beta: 6.0,
            eps: 1e-9,
        }
    }

    /// Assign targets (official `forward`). See the module documentation for the rules.
    ///
    /// Errors: inconsistent lengths between scores, boxes, anchors and GTs, or GT labels outside
    /// `0..num_classes`.
    pub fn assign(&self, input: &AssignerInput) -> Result<Assignment> {
        Ok(self.run(input, false)?.0)
    }

    /// [`Self::assign`] plus the full intermediate arrays. Computes CIoU for every
    /// (GT, anchor) pair, so it is slower; use it for tests.
    pub fn assign_with_diagnostics(
        &self,
        input: &AssignerInput,
    ) -> Result<(Assignment, AssignerDiagnostics)> {
        let (a, d) = self.run(input, true)?;
        let d = d.context("assigner: diagnostics were not produced (internal error)")?;
        Ok((a, d))
    }

    fn run(
        &self,
        input: &AssignerInput,
        full: bool,
    ) -> Result<(Assignment, Option<AssignerDiagnostics>)> {
        self.check(input)?;
        let gt = input.gt;
        let (bs, na, m, nc) = (
            gt.batch,
            input.anc_points.len(),
            gt.n_max_boxes,
            self.num_classes,
        );
        if m == 0 {
            // Official early return: background label everywhere, nothing assigned.
            let out = Assignment {
                batch: bs,
                num_anchors: na,
                num_classes: nc,
                target_labels: vec![nc as i64; bs * na],
                target_bboxes: vec![[0.0; 4]; bs * na],
                target_score: vec![0.0; bs * na],
                fg_mask: vec![false; bs * na],
                target_gt_idx: vec![0; bs * na],
            };
            let diag = full.then(|| AssignerDiagnostics {
                overlaps: vec![],
                align_metric: vec![],
                mask_pos_pre: vec![],
                mask_pos: vec![],
            });
            return Ok((out, diag));
        }
        // Images are independent, so they run in parallel. The positives-only path is what
        // `assign` runs; the reference path, which also fills the full diagnostic arrays, is what
        // `tests/loss/assigner.rs` compares it with.
        let image = |b: usize| Image::new(self, input, b);
        let images: Vec<(Assignment, Option<AssignerDiagnostics>)> = if full {
            (0..bs)
                .into_par_iter()
                .map(|b| {
                    let (o, d) = image(b).reference();
                    (o, Some(d))
                })
                .collect()
        } else {
            (0..bs)
                .into_par_iter()
                .map(|b| (image(b).positives_only(), None))
                .collect()
        };
        Ok(concat_images(images, bs, na, nc, m, full))
    }

    /// The input checks of [`Self::run`]: consistent lengths of scores, boxes, anchors and GTs,
    /// `topk >= 1`, GT labels in `0..num_classes`.
    fn check(&self, input: &AssignerInput) -> Result<()> {
        let gt = input.gt;
        let (bs, na, m, nc) = (
            gt.batch,
            input.anc_points.len(),
            gt.n_max_boxes,
            self.num_classes,
        );
        ensure!(self.topk > 0, "assigner: topk must be at least 1");
        ensure!(
            input.pd_bboxes.len() == bs * na,
            "assigner: {} predicted boxes for batch {bs} x {na} anchors",
            input.pd_bboxes.len()
        );
        ensure!(
            gt.labels.len() == bs * m && gt.bboxes.len() == bs * m && gt.mask.len() == bs * m,
            "assigner: GT arrays must have batch x n_max_boxes = {} rows",
            bs * m
        );
        match input.scores {
            Scores::Probs(d) => ensure!(
                d.len() == bs * na * nc,
                "assigner: {} scores for batch {bs} x {na} anchors x {nc} classes",
                d.len()
            ),
            Scores::HeadLogits {
                data,
                channels,
                offset,
            } => ensure!(
                offset + nc <= channels && data.len() == bs * channels * na,
                "assigner: head logits of {} values do not fit batch {bs} x {channels} channels x \
                 {na} anchors with classes at channels {offset}..{}",
                data.len(),
                offset + nc
            ),
        }
        if let Some((i, l)) = gt
            .labels
            .iter()
            .enumerate()
            .find(|(_, &l)| l < 0 || l as usize >= nc)
        {
            bail!("assigner: GT row {i} has label {l}, outside 0..{nc}");
        }
        Ok(())
    }
}

/// One image of a checked, non-empty batch (`n_max_boxes > 0`): its GT rows prepared for CIoU,
/// and the overlap and alignment metric of a (GT row, anchor) pair.
struct Image<'a> {
    cfg: &'a TaskAlignedAssigner,
    input: &'a AssignerInput<'a>,
    /// Image index in the batch.
    b: usize,
    /// Anchors A.
    na: usize,
    /// GT rows per image (`n_max_boxes`).
    m: usize,
    /// Positives per GT at most: `min(topk, A)`.
    k: usize,
    /// The image's GT rows, prepared for CIoU.
    gts: Vec<CiouBox>,
    /// The image's GT labels.
    labels: &'a [i64],
    /// The image's predicted boxes, xyxy pixels, length A.
    pd: &'a [[f32; 4]],
}

impl<'a> Image<'a> {
    fn new(cfg: &'a TaskAlignedAssigner, input: &'a AssignerInput<'a>, b: usize) -> Self {
        let gt = input.gt;
        let (na, m) = (input.anc_points.len(), gt.n_max_boxes);
        Image {
            cfg,
            input,
            b,
            na,
            m,
            k: cfg.topk.min(na),
            gts: gt.bboxes[b * m..(b + 1) * m]
                .iter()
                .map(|&g| CiouBox::new(g))
                .collect(),
            labels: &gt.labels[b * m..(b + 1) * m],
            pd: &input.pd_bboxes[b * na..(b + 1) * na],
        }
    }

    /// The predicted score of anchor `a` for class `c` (sigmoided when read from head logits).
    fn score(&self, a: usize, c: usize) -> f32 {
        let (b, na, nc) = (self.b, self.na, self.cfg.num_classes);
        match self.input.scores {
            Scores::Probs(d) => d[(b * na + a) * nc + c],
            Scores::HeadLogits {
                data,
                channels,
                offset,
            } => sigmoid(data[(b * channels + offset + c) * na + a]),
        }
    }

    /// `max(CIoU(gt_j, p), 0)`.
    fn overlap(&self, j: usize, p: &CiouBox) -> f32 {
        clamp0(ciou_prepared(&self.gts[j], p))
    }

    /// `score(a, label_j)^alpha * ov^beta`.
    fn metric(&self, j: usize, a: usize, ov: f32) -> f32 {
        pow_like_torch(self.score(a, self.labels[j] as usize), self.cfg.alpha)
            * pow_like_torch(ov, self.cfg.beta)
    }

    /// Whether GT row `j` is a real box (official `mask_gt`).
    fn valid(&self, j: usize) -> bool {
        self.input.gt.mask[self.b * self.m + j]
    }

    /// The xyxy pixel box of GT row `j`.
    fn gt_box(&self, j: usize) -> [f32; 4] {
        self.input.gt.bboxes[self.b * self.m + j]
    }

    /// The GT row of highest overlap with `p` among all the image's rows (ties and NaN as the
    /// official `argmax`: the lowest index, NaN wins): `select_highest_overlaps` for an anchor
    /// claimed by several GTs.
    fn highest_overlap(&self, p: &CiouBox) -> usize {
        let mut best = 0usize;
        let mut best_ov = self.overlap(0, p);
        for j in 1..self.m {
            let ov = self.overlap(j, p);
            if !best_ov.is_nan() && (ov > best_ov || ov.is_nan()) {
                best = j;
                best_ov = ov;
            }
        }
        best
    }

    /// The reference path: every array of the official code, `(n_max_boxes, A)` masks included.
    fn reference(&self) -> (Assignment, AssignerDiagnostics) {
        let (na, m) = (self.na, self.m);
        let preds: Vec<CiouBox> = self.pd.iter().map(|&p| CiouBox::new(p)).collect();
        let mut diag = AssignerDiagnostics {
            overlaps: vec![0.0; m * na],
            align_metric: vec![0.0; m * na],
            mask_pos_pre: vec![false; m * na],
            mask_pos: vec![false; m * na],
        };
        for j in 0..m {
            for (a, p) in preds.iter().enumerate() {
                let ov = self.overlap(j, p);
                diag.overlaps[j * na + a] = ov;
                diag.align_metric[j * na + a] = self.metric(j, a, ov);
            }
        }
        let mut mask_pos = self.get_pos_mask_reference(&preds);
        diag.mask_pos_pre.copy_from_slice(&mask_pos);
        self.select_highest_overlaps_reference(&preds, &mut mask_pos);
        diag.mask_pos.copy_from_slice(&mask_pos);
        (self.get_targets_reference(&preds, &mask_pos), diag)
    }

    /// Official `get_pos_mask`: top-k of the in-GT-masked alignment metric, per valid GT;
    /// `(n_max_boxes, A)`.
    fn get_pos_mask_reference(&self, preds: &[CiouBox]) -> Vec<bool> {
        let (na, m, k) = (self.na, self.m, self.k);
        let mut mask_pos = vec![false; m * na];
        // 0 outside GT, 1 inside with metric 0, 2 inside with metric != 0
        let mut state = vec![0u8; na];
        let mut cands: Vec<(usize, f32)> = Vec::new();
        for j in 0..m {
            if !self.valid(j) {
                continue;
            }
            cands.clear();
            for (a, &p) in self.input.anc_points.iter().enumerate() {
                if inside_gt(p, self.gts[j].xyxy) {
                    let ov = self.overlap(j, &preds[a]);
                    let am = self.metric(j, a, ov);
                    state[a] = if am == 0.0 { 1 } else { 2 };
                    cands.push((a, am));
                } else {
                    state[a] = 0;
                }
            }
            let row = &mut mask_pos[j * na..(j + 1) * na];
            let mut nonzero: Vec<(usize, f32)> =
                cands.iter().copied().filter(|&(_, v)| v != 0.0).collect();
            // Descending metric (NaN first, as torch.topk), ties by ascending anchor index.
            nonzero.sort_by(|x, y| desc_nan_first(x.1, y.1).then(x.0.cmp(&y.0)));
            for &(a, _) in nonzero.iter().take(k) {
                row[a] = true;
            }
            if nonzero.len() < k {
                // The remaining slots go to metric-0 entries of the masked row in index order;
                // only those inside the GT become positives.
                let mut left = k - nonzero.len();
                for (a, &st) in state.iter().enumerate() {
                    if left == 0 {
                        break;
                    }
                    if st != 2 {
                        left -= 1;
                        if st == 1 {
                            row[a] = true;
                        }
                    }
                }
            }
        }
        mask_pos
    }

    /// Official `select_highest_overlaps`: an anchor claimed by several GTs keeps the GT of
    /// highest overlap among all GT rows of the image.
    fn select_highest_overlaps_reference(&self, preds: &[CiouBox], mask_pos: &mut [bool]) {
        let (na, m) = (self.na, self.m);
        for (a, p) in preds.iter().enumerate() {
            let claims = (0..m).filter(|&j| mask_pos[j * na + a]).count();
            if claims > 1 {
                let best = self.highest_overlap(p);
                for j in 0..m {
                    mask_pos[j * na + a] = j == best;
                }
            }
        }
    }

    /// Official `get_targets` and the score normalisation of `forward`: the label and box of
    /// the assigned GT, `align * max_overlap(GT) / (max_align(GT) + eps)`.
    fn get_targets_reference(&self, preds: &[CiouBox], mask_pos: &[bool]) -> Assignment {
        let (na, m) = (self.na, self.m);
        // Per-GT maxima of the positive alignment metrics and overlaps.
        let mut pos_align = vec![0f32; m];
        let mut pos_ov = vec![0f32; m];
        for j in 0..m {
            for a in 0..na {
                if mask_pos[j * na + a] {
                    let ov = self.overlap(j, &preds[a]);
                    let am = self.metric(j, a, ov);
                    pos_align[j] = max_nan(pos_align[j], am);
                    pos_ov[j] = max_nan(pos_ov[j], ov);
                }
            }
        }
        let mut out = Assignment {
            batch: 1,
            num_anchors: na,
            num_classes: self.cfg.num_classes,
            target_labels: vec![0; na],
            target_bboxes: vec![[0.0; 4]; na],
            target_score: vec![0.0; na],
            fg_mask: vec![false; na],
            target_gt_idx: vec![0; na],
        };
        for a in 0..na {
            let j = (0..m).find(|&j| mask_pos[j * na + a]);
            let jj = j.unwrap_or(0);
            out.target_gt_idx[a] = jj;
            out.target_labels[a] = self.labels[jj];
            out.target_bboxes[a] = self.gt_box(jj);
            if let Some(j) = j {
                let ov = self.overlap(j, &preds[a]);
                let am = self.metric(j, a, ov);
                out.fg_mask[a] = true;
                out.target_score[a] = am * pos_ov[j] / (pos_align[j] + self.cfg.eps);
            }
        }
        out
    }

    /// The same rules on the positives only (no (GT x anchor) mask, predicted boxes prepared
    /// only where a CIoU is needed): what `assign` runs.
    fn positives_only(&self) -> Assignment {
        let (pos, claims) = self.get_pos_mask_positives();
        let owner = self.select_highest_overlaps_positives(&pos, &claims);
        self.get_targets_positives(&owner)
    }

    /// `get_pos_mask` as lists: the positive anchors of each GT row before de-duplication
    /// (top-k ∩ inside GT), and how many rows claim each anchor.
    fn get_pos_mask_positives(&self) -> (Vec<Vec<usize>>, Vec<u8>) {
        let (na, k) = (self.na, self.k);
        let mut pos: Vec<Vec<usize>> = vec![Vec::new(); self.m];
        let mut claims = vec![0u8; na];
        let mut cands: Vec<(usize, f32)> = Vec::new();
        for (j, row) in pos.iter_mut().enumerate() {
            if !self.valid(j) {
                continue;
            }
            cands.clear();
            for (a, &p) in self.input.anc_points.iter().enumerate() {
                if inside_gt(p, self.gts[j].xyxy) {
                    let ov = self.overlap(j, &CiouBox::new(self.pd[a]));
                    cands.push((a, self.metric(j, a, ov)));
                }
            }
            let mut nonzero: Vec<(usize, f32)> =
                cands.iter().copied().filter(|&(_, v)| v != 0.0).collect();
            nonzero.sort_by(|x, y| desc_nan_first(x.1, y.1).then(x.0.cmp(&y.0)));
            row.extend(nonzero.iter().take(k).map(|&(a, _)| a));
            if nonzero.len() < k {
                // Remaining slots: metric-0 entries of the masked row in index order (anchors
                // outside the GT count as metric 0 but are not positives).
                let mut left = k - nonzero.len();
                let zero: std::collections::HashSet<usize> = cands
                    .iter()
                    .filter(|&&(_, v)| v == 0.0)
                    .map(|&(a, _)| a)
                    .collect();
                let metric_nonzero: std::collections::HashSet<usize> =
                    nonzero.iter().map(|&(a, _)| a).collect();
                for a in 0..na {
                    if left == 0 {
                        break;
                    }
                    if !metric_nonzero.contains(&a) {
                        left -= 1;
                        if zero.contains(&a) {
                            row.push(a);
                        }
                    }
                }
            }
            for &a in row.iter() {
                claims[a] = claims[a].saturating_add(1);
            }
        }
        (pos, claims)
    }

    /// `select_highest_overlaps` on the lists: the one GT row of each anchor (`usize::MAX` for
    /// background).
    fn select_highest_overlaps_positives(&self, pos: &[Vec<usize>], claims: &[u8]) -> Vec<usize> {
        let mut owner = vec![usize::MAX; self.na];
        for (j, row) in pos.iter().enumerate() {
            for &a in row {
                if claims[a] == 1 {
                    owner[a] = j;
                } else if owner[a] == usize::MAX {
                    owner[a] = self.highest_overlap(&CiouBox::new(self.pd[a]));
                }
            }
        }
        owner
    }

    /// `get_targets` and the score normalisation for the anchors that have an `owner`.
    fn get_targets_positives(&self, owner: &[usize]) -> Assignment {
        let (na, m) = (self.na, self.m);
        let fg: Vec<usize> = (0..na).filter(|&a| owner[a] != usize::MAX).collect();
        // Per-GT maxima of the positive alignment metrics and overlaps.
        let mut pos_align = vec![0f32; m];
        let mut pos_ov = vec![0f32; m];
        let mut fg_vals = Vec::with_capacity(fg.len());
        for &a in &fg {
            let j = owner[a];
            let ov = self.overlap(j, &CiouBox::new(self.pd[a]));
            let am = self.metric(j, a, ov);
            pos_align[j] = max_nan(pos_align[j], am);
            pos_ov[j] = max_nan(pos_ov[j], ov);
            fg_vals.push(am);
        }
        let mut out = Assignment {
            batch: 1,
            num_anchors: na,
            num_classes: self.cfg.num_classes,
            target_labels: vec![self.labels[0]; na],
            target_bboxes: vec![self.gt_box(0); na],
            target_score: vec![0.0; na],
            fg_mask: vec![false; na],
            target_gt_idx: vec![0; na],
        };
        for (&a, &am) in fg.iter().zip(&fg_vals) {
            let j = owner[a];
            out.target_gt_idx[a] = j;
            out.target_labels[a] = self.labels[j];
            out.target_bboxes[a] = self.gt_box(j);
            out.fg_mask[a] = true;
            out.target_score[a] = am * pos_ov[j] / (pos_align[j] + self.cfg.eps);
        }
        out
    }
}

/// The per-image results of a batch of `bs` images concatenated in image order.
fn concat_images(
    images: Vec<(Assignment, Option<AssignerDiagnostics>)>,
    bs: usize,
    na: usize,
    nc: usize,
    m: usize,
    full: bool,
) -> (Assignment, Option<AssignerDiagnostics>) {
    let mut out = Assignment {
        batch: bs,
        num_anchors: na,
        num_classes: nc,
        target_labels: Vec::with_capacity(bs * na),
        target_bboxes: Vec::with_capacity(bs * na),
        target_score: Vec::with_capacity(bs * na),
        fg_mask: Vec::with_capacity(bs * na),
        target_gt_idx: Vec::with_capacity(bs * na),
    };
    let mut diag = full.then(|| AssignerDiagnostics {
        overlaps: Vec::with_capacity(bs * m * na),
        align_metric: Vec::with_capacity(bs * m * na),
        mask_pos_pre: Vec::with_capacity(bs * m * na),
        mask_pos: Vec::with_capacity(bs * m * na),
    });
    for (o, d) in images {
        out.target_labels.extend(o.target_labels);
        out.target_bboxes.extend(o.target_bboxes);
        out.target_score.extend(o.target_score);
        out.fg_mask.extend(o.fg_mask);
        out.target_gt_idx.extend(o.target_gt_idx);
        if let (Some(all), Some(d)) = (diag.as_mut(), d) {
            all.overlaps.extend(d.overlaps);
            all.align_metric.extend(d.align_metric);
            all.mask_pos_pre.extend(d.mask_pos_pre);
            all.mask_pos.extend(d.mask_pos);
        }
    }
    (out, diag)
}

/// `1 / (1 + exp(-x))` in f32 (PyTorch's `sigmoid`).
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `clamp(min=0)` that keeps NaN (as `torch.clamp`).
fn clamp0(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// `max` that propagates NaN (as `torch.amax`).
fn max_nan(acc: f32, x: f32) -> f32 {
    if acc.is_nan() || x.is_nan() {
        f32::NAN
    } else {
        acc.max(x)
    }
}

/// `x.pow(e)` with PyTorch's CPU special cases (0.5 → sqrt, 2 → x*x, 3 → x*x*x).
fn pow_like_torch(x: f32, e: f32) -> f32 {
    if e == 0.5 {
        x.sqrt()
    } else if e == 1.0 {
        x
    } else if e == 2.0 {
        x * x
    } else if e == 3.0 {
        x * x * x
    } else {
        x.powf(e)
    }
}

/// Order for a descending sort where NaN counts as the largest value.
fn desc_nan_first(a: f32, b: f32) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
    }
}
