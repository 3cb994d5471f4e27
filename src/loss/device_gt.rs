//! The loss's inputs other than the head outputs, held on the head's device: the batch's GT rows
//! padded to a fixed count per image, and the anchor tables the device assigner and the fused
//! terms read.
//!
//! The ordinary loss builds one per call ([`super::DualTalLoss::compute`]). The training step
//! replayed from one CUDA graph ([`crate::train::graphed`]) builds one per captured shape and
//! refills its GT rows in place before each replay ([`DeviceGt::set`]): a graph reads its inputs
//! at the addresses it was captured with, and uploads of more than a few bytes cannot be recorded
//! in a capture. Padding rows (`valid = 0`) are ignored by the assigner (official `mask_gt`), so
//! a capacity larger than the batch's largest image gives the same assignment.

use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};

use super::anchors::Anchors;
use super::assigner::GtBatch;

/// Values per GT row: `[x1, y1, x2, y2, class, valid]` (pixels; class as f32; valid 1 or 0).
pub const ROW: usize = 6;

/// A batch's GT rows and the anchor tables on one device (see the module docs).
#[derive(Debug, Clone)]
pub struct DeviceGt {
    anchors: Anchors,
    batch: usize,
    per_image: usize,
    rows: Tensor,
    anc3: Tensor,
    anc2: Tensor,
    anc4: Tensor,
}

impl DeviceGt {
    /// `gt` (B images) for the head's `anchors`, with room for `per_image` rows per image
    /// (at least 1 and at least `gt.n_max_boxes`), on `dev`.
    ///
    /// Errors: `per_image` below what `gt` needs, a label outside `0..nc`.
    pub fn new(
        anchors: Anchors,
        gt: &GtBatch,
        per_image: usize,
        nc: usize,
        dev: &Device,
    ) -> Result<Self> {
        let per_image = per_image.max(1);
        let rows = rows_of(gt, per_image, nc)?;
        let na = anchors.len();
        let mut anc3 = Vec::with_capacity(na * 3);
        for (p, &s) in anchors.points.iter().zip(&anchors.strides) {
            anc3.extend_from_slice(&[p[0], p[1], s]);
        }
        let anc2: Vec<f32> = anchors.points.iter().flatten().copied().collect();
        Ok(DeviceGt {
            rows: Tensor::from_vec(rows, (gt.batch * per_image, ROW), dev)?,
            anc3: Tensor::from_vec(anc3, (na, 3), dev)?,
            anc2: Tensor::from_vec(anc2, (na, 2), dev)?,
            anc4: anc4_of(&anchors, dev)?,
            batch: gt.batch,
            per_image,
            anchors,
        })
    }

    /// Replaces the GT rows with `gt`'s, in place (the same device memory).
    ///
    /// Errors: another batch size, more rows per image than the capacity, a label outside
    /// `0..nc`.
    pub fn set(&self, gt: &GtBatch, nc: usize) -> Result<()> {
        ensure!(
            gt.batch == self.batch,
            "GT rows for a batch of {} given to a buffer of batch {}",
            gt.batch,
            self.batch
        );
        let rows = rows_of(gt, self.per_image, nc)?;
        let t = Tensor::from_vec(rows, self.rows.shape(), self.rows.device())?;
        self.rows.slice_set(&t, 0, 0)?;
        Ok(())
    }

    /// Batch size B.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Rows per image (the capacity M).
    pub fn per_image(&self) -> usize {
        self.per_image
    }

    /// The head's anchors (grid units, strides in pixels).
    pub fn anchors(&self) -> &Anchors {
        &self.anchors
    }

    /// GT rows `(B * M, 6)` f32, see [`ROW`].
    pub fn rows(&self) -> &Tensor {
        &self.rows
    }

    /// `(A, 3)` f32 `[x, y, stride]`: anchor centres in grid units, strides in pixels.
    pub fn anchors_xys(&self) -> &Tensor {
        &self.anc3
    }

    /// `(A, 2)` f32 anchor centres in grid units.
    pub fn anchors_xy(&self) -> &Tensor {
        &self.anc2
    }

    /// `(1, 4, A)` f32 `[ax; ay; ax; ay]` in grid units (the DFL decode's offsets).
    pub fn anchors_xyxy(&self) -> &Tensor {
        &self.anc4
    }
}

/// `(1, 4, A)` f32 `[ax; ay; ax; ay]` of `anchors` in grid units, on `dev`.
pub fn anc4_of(anchors: &Anchors, dev: &Device) -> Result<Tensor> {
    let na = anchors.len();
    let mut anc4 = Vec::with_capacity(4 * na);
    for c in 0..4 {
        anc4.extend(anchors.points.iter().map(|p| p[c % 2]));
    }
    Ok(Tensor::from_vec(anc4, (1, 4, na), dev)?)
}

/// `gt` laid out as `(B * m, 6)` rows (see [`ROW`]); rows past an image's own are padding
/// (all zero, `valid = 0`).
fn rows_of(gt: &GtBatch, m: usize, nc: usize) -> Result<Vec<f32>> {
    ensure!(
        gt.n_max_boxes <= m,
        "{} GT rows per image do not fit a capacity of {m}",
        gt.n_max_boxes
    );
    if let Some((i, l)) = gt
        .labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l < 0 || l as usize >= nc)
    {
        anyhow::bail!("assigner: GT row {i} has label {l}, outside 0..{nc}");
    }
    let mut rows = vec![0f32; gt.batch * m * ROW];
    for b in 0..gt.batch {
        for j in 0..gt.n_max_boxes {
            let r = b * gt.n_max_boxes + j;
            let o = (b * m + j) * ROW;
            rows[o..o + 4].copy_from_slice(&gt.bboxes[r]);
            rows[o + 4] = gt.labels[r] as f32;
            rows[o + 5] = gt.mask[r] as u8 as f32;
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gt() -> GtBatch {
        GtBatch {
            batch: 2,
            n_max_boxes: 2,
            labels: vec![1, 0, 2, 0],
            bboxes: vec![
                [1.0, 2.0, 3.0, 4.0],
                [5.0, 6.0, 7.0, 8.0],
                [9.0, 10.0, 11.0, 12.0],
                [0.0; 4],
            ],
            mask: vec![true, true, true, false],
        }
    }

    #[test]
    fn rows_are_padded_per_image_and_refilled_in_place() {
        let anchors = Anchors::new(&[(1, 2)], &[8]).unwrap();
        let d = DeviceGt::new(anchors, &gt(), 3, 3, &Device::Cpu).unwrap();
        let r: Vec<Vec<f32>> = d.rows().to_vec2().unwrap();
        assert_eq!(r.len(), 6);
        assert_eq!(r[0], [1.0, 2.0, 3.0, 4.0, 1.0, 1.0]);
        assert_eq!(r[1], [5.0, 6.0, 7.0, 8.0, 0.0, 1.0]);
        assert_eq!(r[2], [0.0; 6]);
        assert_eq!(r[3], [9.0, 10.0, 11.0, 12.0, 2.0, 1.0]);
        assert_eq!(r[4], [0.0; 6]);
        assert_eq!(r[5], [0.0; 6]);
        assert_eq!(
            d.anchors_xyxy().to_vec3::<f32>().unwrap(),
            [[[0.5, 1.5], [0.5, 0.5], [0.5, 1.5], [0.5, 0.5]]]
        );
        // A second batch into the same buffer.
        let mut g = gt();
        g.labels = vec![2, 2, 1, 1];
        g.mask = vec![true, false, true, true];
        let alias = d.rows().clone();
        d.set(&g, 3).unwrap();
        let r: Vec<Vec<f32>> = alias.to_vec2().unwrap();
        assert_eq!(r[0], [1.0, 2.0, 3.0, 4.0, 2.0, 1.0]);
        assert_eq!(r[1], [5.0, 6.0, 7.0, 8.0, 2.0, 0.0]);
        assert_eq!(r[4], [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
    }

    #[test]
    fn capacity_batch_and_labels_are_checked() {
        let anchors = Anchors::new(&[(1, 2)], &[8]).unwrap();
        let e = DeviceGt::new(anchors.clone(), &gt(), 1, 3, &Device::Cpu).unwrap_err();
        assert!(format!("{e}").contains("capacity of 1"), "{e}");
        let e = DeviceGt::new(anchors.clone(), &gt(), 2, 2, &Device::Cpu).unwrap_err();
        assert!(format!("{e}").contains("label 2, outside 0..2"), "{e}");
        let d = DeviceGt::new(anchors, &gt(), 2, 3, &Device::Cpu).unwrap();
        let mut g = gt();
        g.batch = 1;
        assert!(d.set(&g, 3).is_err());
    }
}
