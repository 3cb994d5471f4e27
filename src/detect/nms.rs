//! Non-maximum suppression with the semantics of `torchvision.ops.nms` (CPU kernel) as used by
//! the official `utils/general.py non_max_suppression`.
//!
//! * boxes are `[x1, y1, x2, y2]` (any unit, continuous coordinates, area `(x2-x1)*(y2-y1)`);
//! * order: scores descending by a **stable** sort, so of equal scores the lower index wins;
//! * a box is suppressed when its IoU with a kept box is **strictly** greater than the
//!   threshold; the IoU is computed in f32 and compared with the threshold in f64, as torchvision
//!   does;
//! * a zero-area box has IoU `0/0 = NaN` with an identical box, so it neither suppresses nor is
//!   suppressed.

/// Greedy NMS. `boxes[i]` is `[x1, y1, x2, y2]`, `scores[i]` its score; returns the kept indices
/// in order of decreasing score (ties: lower index first).
///
/// `boxes` and `scores` must have the same length (extra entries of the longer one are ignored).
pub fn nms(boxes: &[[f32; 4]], scores: &[f32], iou_thres: f64) -> Vec<usize> {
    let n = boxes.len().min(scores.len());
    let mut order: Vec<usize> = (0..n).collect();
    // Stable descending sort; NaN scores sort last.
    order.sort_by(|&a, &b| {
        scores[b]
            .partial_cmp(&scores[a])
            .unwrap_or_else(|| scores[a].is_nan().cmp(&scores[b].is_nan()))
    });
    let areas: Vec<f32> = boxes[..n]
        .iter()
        .map(|b| (b[2] - b[0]) * (b[3] - b[1]))
        .collect();
    let mut suppressed = vec![false; n];
    let mut keep = Vec::new();
    for (oi, &i) in order.iter().enumerate() {
        if suppressed[i] {
            continue;
        }
        keep.push(i);
        let bi = boxes[i];
        for &j in &order[oi + 1..] {
            if suppressed[j] {
                continue;
            }
            let bj = boxes[j];
            let w = (bi[2].min(bj[2]) - bi[0].max(bj[0])).max(0.0);
            let h = (bi[3].min(bj[3]) - bi[1].max(bj[1])).max(0.0);
            let inter = w * h;
            let ovr = inter / (areas[i] + areas[j] - inter);
            if f64::from(ovr) > iou_thres {
                suppressed[j] = true;
            }
        }
    }
    keep
}

/// Batched NMS: boxes of different `classes` never suppress each other. Implemented like the
/// official code, by offsetting each box by `class * 7680` px (`max_wh`) before [`nms`], which
/// equals torchvision's `batched_nms` for boxes inside 0..7680.
pub fn batched_nms(
    boxes: &[[f32; 4]],
    scores: &[f32],
    classes: &[usize],
    iou_thres: f64,
) -> Vec<usize> {
    let shifted: Vec<[f32; 4]> = boxes
        .iter()
        .zip(classes)
        .map(|(b, &c)| {
            let o = c as f32 * MAX_WH;
            [b[0] + o, b[1] + o, b[2] + o, b[3] + o]
        })
        .collect();
    nms(&shifted, scores, iou_thres)
}

/// The class offset of the official NMS (`max_wh`, pixels).
pub const MAX_WH: f32 = 7680.0;
