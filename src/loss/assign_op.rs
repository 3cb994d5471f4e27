//! The TaskAlignedAssigner as one candle op on the head's device: predicted boxes and class
//! scores in, the dense loss targets out, with nothing copied to the host.
//!
//! On CUDA the op runs `kernels/tal_assign.cu` (four launches, see there); on the CPU it runs
//! [`TaskAlignedAssigner::assign`] and lays its result out the same way, so the CPU version is
//! the reference the GPU one is tested against (`tests/gpu_parity.rs`) and the rules are written
//! once, in [`super::assigner`].
//!
//! The output, `(11, B, A)` f32 ("planes"), is what the loss terms read ([`super::terms`]):
//! - 0: target score (the normalized alignment metric; 0 for background);
//! - 1: assigned class (0 for background);
//! - 2..6: assigned GT box xyxy in **grid units** of the anchor's level (a unit box around the
//!   anchor for background);
//! - 6..10: DFL target distances l, t, r, b in grid units, clamped to `[0, 14.99]` (0 for
//!   background; official `bbox2dist(anchor, box, reg_max - 1)`);
//! - 10: the assigned GT row (`target_gt_idx`), -1 for background (`fg_mask` is `>= 0`).

use anyhow::{ensure, Context, Result};
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Shape, Tensor};

use super::anchors::Anchors;
use super::assigner::{AssignerInput, Assignment, GtBatch, Scores, TaskAlignedAssigner};
use super::device_gt::DeviceGt;
use super::targets::{expand_fg_rows, fg_rows};

/// Number of planes of the op's output.
pub const PLANES: usize = 11;

/// Where the class scores are in the scores tensor given to [`assign_dense`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScoreLayout {
    /// Probabilities `(B, A, nc)` (the official `pd_scores`).
    Probs,
    /// Logits in the head's layout `(B, channels, A)`, class `c` at channel `offset + c`
    /// (`64 + nc` channels, offset 64, for the YOLOv9 head); the sigmoid is applied on read.
    HeadLogits {
        /// Channels per anchor.
        channels: usize,
        /// Channel of class 0.
        offset: usize,
    },
}

/// Runs `assigner` on the device of `pbox` and returns the `(11, B, A)` planes described in the
/// module documentation (no gradient).
///
/// - `pbox`: predicted boxes `(B, 4, A)` xyxy in grid units of each anchor's level, f32;
/// - `scores`: f32, `(B, A, nc)` or `(B, channels, A)` as `layout` says;
/// - `anchors`: the head's anchors (grid units and strides), A of them;
/// - `gt`: the batch's GT rows (pixels).
///
/// Errors: shapes that do not agree, labels outside the classes, a CUDA launch failure.
pub fn assign_dense(
    assigner: &TaskAlignedAssigner,
    pbox: &Tensor,
    scores: &Tensor,
    layout: ScoreLayout,
    anchors: &Anchors,
    gt: &GtBatch,
) -> Result<Tensor> {
    let (bs, four, na) = pbox.dims3().context("assigner: boxes must be (B, 4, A)")?;
    let nc = assigner.num_classes;
    ensure!(
        four == 4 && bs == gt.batch && na == anchors.len(),
        "assigner: boxes {:?} for a batch of {} and {} anchors",
        pbox.dims(),
        gt.batch,
        anchors.len()
    );
    let dg = DeviceGt::new(anchors.clone(), gt, gt.n_max_boxes, nc, pbox.device())?;
    assign_device(assigner, pbox, scores, layout, &dg)
}

/// [`assign_dense`] with the GT rows and anchors already on the device ([`DeviceGt`]: what a
/// CUDA-graph capture reads at fixed addresses). `pbox` and `scores` as there, for `dg`'s
/// batch and anchors.
///
/// Errors: shapes that do not agree with `dg`, a CUDA launch failure.
pub fn assign_device(
    assigner: &TaskAlignedAssigner,
    pbox: &Tensor,
    scores: &Tensor,
    layout: ScoreLayout,
    dg: &DeviceGt,
) -> Result<Tensor> {
    let (bs, four, na) = pbox.dims3().context("assigner: boxes must be (B, 4, A)")?;
    ensure!(
        four == 4 && bs == dg.batch() && na == dg.anchors().len(),
        "assigner: boxes {:?} for GT rows of a batch of {} and {} anchors",
        pbox.dims(),
        dg.batch(),
        dg.anchors().len()
    );
    let nc = assigner.num_classes;
    let want: Vec<usize> = match layout {
        ScoreLayout::Probs => vec![bs, na, nc],
        ScoreLayout::HeadLogits { channels, offset } => {
            ensure!(
                offset + nc <= channels,
                "assigner: classes at channels {offset}..{} of {channels}",
                offset + nc
            );
            vec![bs, channels, na]
        }
    };
    ensure!(
        scores.dims() == want.as_slice(),
        "assigner: scores {:?}, expected {want:?}",
        scores.dims()
    );
    let op = AssignOp {
        assigner: assigner.clone(),
        layout,
        rows: dg.per_image(),
        gt: dg.rows().clone(),
        anchors: dg.anchors_xys().clone(),
    };
    let pbox = pbox.to_dtype(DType::F32)?.contiguous()?;
    let scores = scores.to_dtype(DType::F32)?.contiguous()?;
    Ok(pbox.apply_op2_no_bwd(&scores, &op)?)
}

/// The host [`Assignment`] of `planes` (the output of [`assign_dense`] for `gt`): reads the
/// planes back (a device synchronisation; for tests and diagnostics). Background anchors get the
/// official placeholders (the label and box of the image's GT row 0, or `num_classes` and zeros
/// without GT rows).
///
/// Errors: planes that are not `(11, B, A)` for `gt`'s batch, an assigned row outside `gt`.
pub fn planes_to_assignment(
    planes: &Tensor,
    gt: &GtBatch,
    num_classes: usize,
) -> Result<Assignment> {
    let (p, bs, na) = planes.dims3()?;
    ensure!(
        p == PLANES && bs == gt.batch,
        "assigner planes {:?} for a batch of {}",
        planes.dims(),
        gt.batch
    );
    let score: Vec<f32> = planes.get(0)?.flatten_all()?.to_vec1()?;
    let owner: Vec<f32> = planes.get(10)?.flatten_all()?.to_vec1()?;
    let m = gt.n_max_boxes;
    let mut out = Assignment {
        batch: bs,
        num_anchors: na,
        num_classes,
        target_labels: Vec::with_capacity(bs * na),
        target_bboxes: Vec::with_capacity(bs * na),
        target_score: score,
        fg_mask: owner.iter().map(|&o| o >= 0.0).collect(),
        target_gt_idx: Vec::with_capacity(bs * na),
    };
    for (i, &o) in owner.iter().enumerate() {
        let b = i / na;
        let j = if o >= 0.0 { o as usize } else { 0 };
        ensure!(
            o < 0.0 || j < m,
            "assigner planes: anchor {i} assigned to GT row {j} of {m}"
        );
        out.target_gt_idx.push(j);
        if m == 0 {
            out.target_labels.push(num_classes as i64);
            out.target_bboxes.push([0.0; 4]);
        } else {
            out.target_labels.push(gt.labels[b * m + j]);
            out.target_bboxes.push(gt.bboxes[b * m + j]);
        }
    }
    Ok(out)
}

/// The op of [`assign_dense`]: inputs `pbox (B, 4, A)` and the scores, both contiguous f32; it
/// holds the GT rows `(B * M, 6)` = `[x1, y1, x2, y2, class, valid]` (pixels) and the anchors
/// `(A, 3)` = `[x, y, stride]` (grid units, pixels) on the same device.
struct AssignOp {
    assigner: TaskAlignedAssigner,
    layout: ScoreLayout,
    rows: usize,
    gt: Tensor,
    anchors: Tensor,
}

impl AssignOp {
    /// The CPU version: the host assigner, laid out as planes.
    fn host(&self, pbox: &[f32], scores: &[f32], bs: usize, na: usize) -> Result<Vec<f32>> {
        let m = self.rows;
        let rows: Vec<f32> = self.gt.flatten_all()?.to_vec1()?;
        let anc: Vec<f32> = self.anchors.flatten_all()?.to_vec1()?;
        let valid: Vec<bool> = rows.chunks_exact(6).map(|r| r[5] != 0.0).collect();
        // Without any valid row the official early return applies (n_max_boxes = 0).
        let gt = if valid.iter().any(|&v| v) {
            GtBatch {
                batch: bs,
                n_max_boxes: m,
                labels: rows.chunks_exact(6).map(|r| r[4] as i64).collect(),
                bboxes: rows
                    .chunks_exact(6)
                    .map(|r| [r[0], r[1], r[2], r[3]])
                    .collect(),
                mask: valid,
            }
        } else {
            GtBatch {
                batch: bs,
                n_max_boxes: 0,
                labels: vec![],
                bboxes: vec![],
                mask: vec![],
            }
        };
        let grid = Anchors {
            points: anc.chunks_exact(3).map(|c| [c[0], c[1]]).collect(),
            strides: anc.chunks_exact(3).map(|c| c[2]).collect(),
        };
        let px = grid.points_px();
        let mut pd = Vec::with_capacity(bs * na);
        for b in 0..bs {
            for a in 0..na {
                let s = anc[3 * a + 2];
                let at = |c: usize| pbox[(b * 4 + c) * na + a] * s;
                pd.push([at(0), at(1), at(2), at(3)]);
            }
        }
        let sc = match self.layout {
            ScoreLayout::Probs => Scores::Probs(scores),
            ScoreLayout::HeadLogits { channels, offset } => Scores::HeadLogits {
                data: scores,
                channels,
                offset,
            },
        };
        let asg = self.assigner.assign(&AssignerInput {
            scores: sc,
            pd_bboxes: &pd,
            anc_points: &px,
            gt: &gt,
        })?;
        // The planes of the loss's host path (the same code), then the owner row.
        let anc_xy: Vec<f32> = grid.points.iter().flatten().copied().collect();
        let mut out = expand_fg_rows(&fg_rows(&asg, &grid), &anc_xy, bs);
        out.extend(asg.fg_mask.iter().zip(&asg.target_gt_idx).map(|(&fg, &j)| {
            if fg {
                j as f32
            } else {
                -1.0
            }
        }));
        Ok(out)
    }

    /// `(element offset, stride of b, of c, of a)` of the scores.
    #[cfg(feature = "cuda")]
    fn score_at(&self, bs_stride: usize, na: usize, nc: usize) -> [i64; 4] {
        match self.layout {
            ScoreLayout::Probs => [0, bs_stride as i64, 1, nc as i64],
            ScoreLayout::HeadLogits { channels, offset } => {
                [(offset * na) as i64, (channels * na) as i64, na as i64, 1]
            }
        }
    }
}

impl CustomOp2 for AssignOp {
    fn name(&self) -> &'static str {
        "tal-assign"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let bad = |w: &str| candle_core::Error::Msg(format!("TAL assigner: {w}"));
        let (pa, pb) = l1
            .contiguous_offsets()
            .ok_or_else(|| bad("boxes not contiguous"))?;
        let (sa, sb) = l2
            .contiguous_offsets()
            .ok_or_else(|| bad("scores not contiguous"))?;
        let (bs, _, na) = l1.shape().dims3()?;
        let out = self
            .host(
                &s1.as_slice::<f32>()?[pa..pb],
                &s2.as_slice::<f32>()?[sa..sb],
                bs,
                na,
            )
            .map_err(|e| candle_core::Error::Msg(format!("{e:#}")))?;
        Ok((CpuStorage::F32(out), Shape::from((PLANES, bs, na))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (bs, _, na) = l1.shape().dims3()?;
        let nc = self.assigner.num_classes;
        let sh = crate::cuda::tal::AssignShape {
            batch: bs,
            anchors: na,
            rows: self.rows,
            topk: self.assigner.topk.min(na),
            alpha: self.assigner.alpha,
            beta: self.assigner.beta,
            eps: self.assigner.eps,
            score_at: self.score_at(na * nc, na, nc),
            logits: matches!(self.layout, ScoreLayout::HeadLogits { .. }),
        };
        crate::cuda::tal::assign((s1, l1), (s2, l2), (&self.gt, &self.anchors), &sh)
    }
}
