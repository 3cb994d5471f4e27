//! Box and mask metrics of a segmentation model, as the official `segment/val.py` computes them:
//! each prediction matched to the labels twice, by box IoU and by mask IoU (`process_batch(...,
//! masks=True)`, official `utils/segment/general.py mask_iou`), the same matching rule
//! ([`super::ap::match_by_iou`]), then `ap_per_class` for each (`ap_per_class_box_and_mask`):
//! Box P, R, mAP50, mAP50-95 and Mask P, R, mAP50, mAP50-95.

use super::ap::{match_by_iou, ValMetrics, ValStats, N_IOU};

/// Official `mask_iou(gt, pred)`: `gt` M masks and `pred` N masks of `pixels` 0/1 values each
/// (row-major, one mask after another) → `iou[m][n] = |gt ∩ pred| / (|gt ∪ pred| + 1e-7)` in f32
/// (the official float32 arithmetic: the counts are exact below 2^24 pixels).
pub fn mask_iou(gt: &[u8], pred: &[u8], pixels: usize) -> Vec<Vec<f32>> {
    let area = |m: &[u8]| m.iter().filter(|&&v| v != 0).count() as f32;
    let gts: Vec<&[u8]> = gt.chunks_exact(pixels.max(1)).collect();
    let preds: Vec<&[u8]> = pred.chunks_exact(pixels.max(1)).collect();
    let pred_area: Vec<f32> = preds.iter().map(|p| area(p)).collect();
    gts.iter()
        .map(|g| {
            let ga = area(g);
            preds
                .iter()
                .zip(&pred_area)
                .map(|(p, &pa)| {
                    let inter = g
                        .iter()
                        .zip(p.iter())
                        .filter(|(a, b)| **a != 0 && **b != 0)
                        .count() as f32;
                    inter / ((ga + pa - inter) + 1e-7)
                })
                .collect()
        })
        .collect()
}

/// Official `process_batch(..., masks=True)` with masks already at one resolution: which
/// detections are true positives by mask IoU at each threshold. `gt_masks` one 0/1 mask per
/// label (for overlap masks, `k + 1` pixels of the image's mask → label `k`), `pred_masks` one
/// per detection, each of `pixels` values.
pub fn process_batch_masks(
    detections: &[[f32; 6]],
    labels: &[[f32; 5]],
    gt_masks: &[u8],
    pred_masks: &[u8],
    pixels: usize,
) -> Vec<[bool; N_IOU]> {
    if labels.is_empty() || detections.is_empty() {
        return vec![[false; N_IOU]; detections.len()];
    }
    match_by_iou(&mask_iou(gt_masks, pred_masks, pixels), detections, labels)
}

/// Box and mask statistics accumulated over images (official `segment/val.py run`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SegValStats {
    /// Matched by box IoU.
    pub boxes: ValStats,
    /// Matched by mask IoU (same predictions, confidences and classes).
    pub masks: ValStats,
}

impl SegValStats {
    /// Adds one image: `detections` `[x1, y1, x2, y2, conf, cls]` and `labels`
    /// `[cls, x1, y1, x2, y2]` in one pixel space, `pred_masks` / `gt_masks` one 0/1 mask of
    /// `pixels` values per detection / label, all at one resolution.
    pub fn add_image(
        &mut self,
        detections: &[[f32; 6]],
        labels: &[[f32; 5]],
        pred_masks: &[u8],
        gt_masks: &[u8],
        pixels: usize,
    ) {
        self.boxes.add_image(detections, labels);
        let m = &mut self.masks;
        m.seen += 1;
        m.target_cls.extend(labels.iter().map(|l| l[0] as u32));
        if detections.is_empty() {
            return;
        }
        m.tp.extend(process_batch_masks(
            detections, labels, gt_masks, pred_masks, pixels,
        ));
        m.conf.extend(detections.iter().map(|d| d[4]));
        m.pred_cls.extend(detections.iter().map(|d| d[5] as u32));
    }

    /// `(box, mask)` metrics for `nc` classes (official `ap_per_class_box_and_mask`).
    pub fn metrics(&self, nc: usize) -> (ValMetrics, ValMetrics) {
        (self.boxes.metrics(nc), self.masks.metrics(nc))
    }
}
