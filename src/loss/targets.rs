//! The targets of the TAL loss: an [`Assignment`] as its foreground rows (one row per assigned
//! anchor, built on the host) expanded over every anchor into dense planes on the head's device
//! ([`DenseTargets`], by the op [`DenseTargetsOp`]: a CUDA kernel on a GPU, [`expand_fg_rows`]
//! on the CPU), and the DFL target distances ([`bbox2dist`]). The assigner's device op
//! (`super::assign_op`) writes the same planes.

use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};

use super::anchors::Anchors;
use super::assigner::Assignment;

/// Upper clamp of DFL target distances (`reg_max - 1 - 0.01`, in grid units).
pub const DFL_TARGET_MAX: f32 = 14.99;

/// An assignment as dense constant tensors on the head's device (no gradient).
pub(super) struct DenseTargets {
    /// Target score per anchor `(B, A)`, 0 for background.
    pub(super) weight: Tensor,
    /// Assigned class per anchor `(B, 1, A)` f32 (0 for background, where the weight is 0).
    pub(super) label: Tensor,
    /// Target boxes `(B * A, 4)` xyxy in grid units; a unit box around the anchor for
    /// background (finite CIoU, weight 0).
    pub(super) boxes: Tensor,
    /// DFL target distances `(B, 4, A)` in grid units, clamped to `[0, 14.99]`; 0 for
    /// background.
    pub(super) ltrb: Tensor,
    /// All of the above as the planes `(10, B, A)` of [`DenseTargetsOp`].
    pub(super) planes: Tensor,
    /// Anchor centres `(A, 2)` in grid units.
    pub(super) anchors: Tensor,
}

impl DenseTargets {
    /// The foreground rows of `asg` (built on the host: a few thousand) expanded to dense
    /// tensors on `dev` by [`DenseTargetsOp`] (a CUDA kernel on a GPU).
    pub(super) fn new(asg: &Assignment, anchors: &Anchors, dev: &Device) -> Result<Self> {
        let (bs, na) = (asg.batch, asg.num_anchors);
        let fg = fg_rows(asg, anchors);
        ensure!(
            bs * na < (1 << 24),
            "loss: {bs} x {na} anchors is too many for one batch; use a smaller batch"
        );
        let nfg = fg.len() / 11;
        let fg = Tensor::from_vec(fg, (nfg, 11), dev)?;
        let anc: Vec<f32> = anchors.points.iter().flatten().copied().collect();
        let anc = Tensor::from_vec(anc, (na, 2), dev)?;
        let planes = fg.apply_op2_no_bwd(&anc, &DenseTargetsOp { batch: bs })?; // (10, B, A)
        Ok(DenseTargets {
            weight: planes.get(0)?,
            label: planes.get(1)?.unsqueeze(1)?,
            boxes: planes.narrow(0, 2, 4)?.reshape((4, bs * na))?.t()?,
            ltrb: planes.narrow(0, 6, 4)?.permute((1, 0, 2))?,
            planes,
            anchors: anc,
        })
    }
}

/// The foreground rows of `asg`, `(nfg, 11)` row-major: `[b * A + a, weight, label, box xyxy,
/// l, t, r, b]` with the box and the DFL distances ([`bbox2dist`]) in grid units of the anchor's
/// level; what [`DenseTargetsOp`] expands.
pub(crate) fn fg_rows(asg: &Assignment, anchors: &Anchors) -> Vec<f32> {
    let (bs, na) = (asg.batch, asg.num_anchors);
    let mut fg = Vec::new();
    for i in (0..bs * na).filter(|&i| asg.fg_mask[i]) {
        let a = i % na;
        let st = anchors.strides[a];
        let tb = asg.target_bboxes[i].map(|v| v / st);
        let d = bbox2dist(anchors.points[a], tb);
        fg.extend_from_slice(&[i as f32, asg.target_score[i], asg.target_labels[i] as f32]);
        fg.extend_from_slice(&tb);
        fg.extend_from_slice(&d);
    }
    fg
}

/// The CPU expansion of [`DenseTargetsOp`]: foreground rows ([`fg_rows`]) over the anchors `anc`
/// (`A × 2`, grid units, row-major) into the planes `(10, batch, A)`, with the background
/// defaults of [`DenseTargets`] (the layout of `kernels/tal.cu`).
pub(crate) fn expand_fg_rows(fg: &[f32], anc: &[f32], batch: usize) -> Vec<f32> {
    let na = anc.len() / 2;
    let ba = batch * na;
    let mut out = vec![0f32; 10 * ba];
    for i in 0..ba {
        let a = i % na;
        let (ax, ay) = (anc[2 * a], anc[2 * a + 1]);
        out[2 * ba + i] = ax - 1.0;
        out[3 * ba + i] = ay - 1.0;
        out[4 * ba + i] = ax + 1.0;
        out[5 * ba + i] = ay + 1.0;
    }
    for row in fg.chunks_exact(11) {
        let i = row[0] as usize;
        if i < ba {
            for k in 0..10 {
                out[k * ba + i] = row[1 + k];
            }
        }
    }
    out
}

/// Expands foreground rows `(nfg, 11)` = `[b * A + a, weight, label, box xyxy (grid), l, t, r,
/// b]` over anchors `(A, 2)` (grid units) into planes `(10, B, A)`: weight, label, box, DFL
/// distances, with the background defaults of [`DenseTargets`]. Same layout on the CPU and in
/// `kernels/tal.cu`.
struct DenseTargetsOp {
    batch: usize,
}

impl candle_core::CustomOp2 for DenseTargetsOp {
    fn name(&self) -> &'static str {
        "tal-dense-targets"
    }

    fn cpu_fwd(
        &self,
        s1: &candle_core::CpuStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CpuStorage,
        l2: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let bad = |w: &str| candle_core::Error::Msg(format!("dense targets: {w}"));
        let (fa, fb) = l1
            .contiguous_offsets()
            .ok_or_else(|| bad("fg not contiguous"))?;
        let (aa, ab) = l2
            .contiguous_offsets()
            .ok_or_else(|| bad("anchors not contiguous"))?;
        let fg = &s1.as_slice::<f32>()?[fa..fb];
        let anc = &s2.as_slice::<f32>()?[aa..ab];
        let na = anc.len() / 2;
        let out = expand_fg_rows(fg, anc, self.batch);
        Ok((
            candle_core::CpuStorage::F32(out),
            candle_core::Shape::from((10, self.batch, na)),
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &candle_core::Layout,
        s2: &candle_core::CudaStorage,
        l2: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        crate::cuda::tal::dense_targets((s1, l1), (s2, l2), self.batch)
    }
}

/// Target distances `(l, t, r, b)` from an anchor to a box, both in grid units, clamped to
/// `[0, 14.99]` (official `bbox2dist(anchor, bbox, reg_max - 1)`).
pub fn bbox2dist(anchor: [f32; 2], xyxy: [f32; 4]) -> [f32; 4] {
    let c = |v: f32| v.clamp(0.0, DFL_TARGET_MAX);
    [
        c(anchor[0] - xyxy[0]),
        c(anchor[1] - xyxy[1]),
        c(xyxy[2] - anchor[0]),
        c(xyxy[3] - anchor[1]),
    ]
}
