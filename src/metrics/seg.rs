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
        let iou = if labels.is_empty() || detections.is_empty() {
            Vec::new()
        } else {
            mask_iou(gt_masks, pred_masks, pixels)
        };
        add_masks(&mut self.masks, detections, labels, &iou);
    }

    /// `(box, mask)` metrics for `nc` classes (official `ap_per_class_box_and_mask`).
    pub fn metrics(&self, nc: usize) -> (ValMetrics, ValMetrics) {
        (self.boxes.metrics(nc), self.masks.metrics(nc))
    }
}

/// The mask half of [`SegValStats::add_image`] (official `process_batch(..., masks=True)`): one
/// image's detections matched into `m` by the label-major mask IoU matrix `iou` ([`mask_iou`], [`mask_iou_overlap`]; may be empty when
/// there are no labels or no detections).
pub fn add_masks(m: &mut ValStats, detections: &[[f32; 6]], labels: &[[f32; 5]], iou: &[Vec<f32>]) {
    m.seen += 1;
    m.target_cls.extend(labels.iter().map(|l| l[0] as u32));
    if detections.is_empty() {
        return;
    }
    m.tp.extend(if labels.is_empty() {
        vec![[false; N_IOU]; detections.len()]
    } else {
        match_by_iou(iou, detections, labels)
    });
    m.conf.extend(detections.iter().map(|d| d[4]));
    m.pred_cls.extend(detections.iter().map(|d| d[5] as u32));
}

/// [`mask_iou`] when the ground truth is one overlap mask (`overlap` of `pixels` values, value
/// `k + 1` where label `k` is): the same f32 values, from one pass over each prediction's
/// pixels (a histogram of the labels under it) instead of one per label and prediction.
pub fn mask_iou_overlap(
    overlap: &[u32],
    labels: usize,
    pred: &[u8],
    pixels: usize,
) -> Vec<Vec<f32>> {
    let mut gt_area = vec![0usize; labels + 1];
    for &v in overlap {
        if let Some(a) = gt_area.get_mut(v as usize) {
            *a += 1;
        }
    }
    let mut iou = vec![Vec::new(); labels];
    for p in pred.chunks_exact(pixels.max(1)) {
        let mut inter = vec![0usize; labels + 1];
        let mut area = 0usize;
        for (&v, &g) in p.iter().zip(overlap) {
            if v != 0 {
                area += 1;
                if let Some(c) = inter.get_mut(g as usize) {
                    *c += 1;
                }
            }
        }
        for (k, row) in iou.iter_mut().enumerate() {
            let (i, ga, pa) = (inter[k + 1] as f32, gt_area[k + 1] as f32, area as f32);
            row.push(i / ((ga + pa - i) + 1e-7));
        }
    }
    iou
}

/// Official `process_mask(protos, masks_in, bboxes, shape, upsample=False)` for one detection:
/// `sigmoid(coeffs · protos)` at the prototypes' `h × w`, zero outside the box
/// `[x1, y1, x2, y2]` (input pixels of an `input_hw` network input, scaled by `w / iw`,
/// `h / ih`; a pixel `(x, y)` is inside when `x1' ≤ x < x2'` and `y1' ≤ y < y2'`, official
/// `crop_mask`), then `> 0.5`. Returns `h · w` 0/1 values, row-major.
pub fn proto_mask(
    protos: crate::detect::masks::Protos,
    coeffs: &[f32],
    bbox: [f32; 4],
    input_hw: (usize, usize),
) -> Vec<u8> {
    let (h, w) = (protos.h, protos.w);
    let (sx, sy) = (w as f32 / input_hw.1 as f32, h as f32 / input_hw.0 as f32);
    let [x1, y1, x2, y2] = [bbox[0] * sx, bbox[1] * sy, bbox[2] * sx, bbox[3] * sy];
    let mut out = vec![0u8; h * w];
    for y in 0..h {
        let yf = y as f32;
        if yf < y1 || yf >= y2 {
            continue;
        }
        for x in 0..w {
            let xf = x as f32;
            if xf < x1 || xf >= x2 {
                continue;
            }
            let logit: f32 = coeffs
                .iter()
                .enumerate()
                .map(|(k, c)| c * protos.data[k * h * w + y * w + x])
                .sum();
            let v = 1.0 / (1.0 + (-logit).exp());
            out[y * w + x] = u8::from(v > 0.5);
        }
    }
    out
}

/// The official `segment/val.py` table: `Class Images Instances Box(P R mAP50 mAP50-95)
/// Mask(P R mAP50 mAP50-95)`, the row `all`, then (more than one class) one row per class with
/// statistics, numbers as `%11.3g`. `names[i]` names class `i`.
pub fn seg_table(boxes: &ValMetrics, masks: &ValMetrics, names: &[String]) -> String {
    use super::ap::fmt_g3;
    use std::fmt::Write;
    let mut s = format!("{:>22}", "Class");
    for h in [
        "Images",
        "Instances",
        "Box(P",
        "R",
        "mAP50",
        "mAP50-95)",
        "Mask(P",
        "R",
        "mAP50",
        "mAP50-95)",
    ] {
        let _ = write!(s, "{h:>11}");
    }
    s.push('\n');
    let mut row = |name: &str, n: usize, b: [f64; 4], m: [f64; 4]| {
        let _ = write!(s, "{name:>22}{:>11}{n:>11}", boxes.seen);
        for v in b.iter().chain(&m) {
            let _ = write!(s, "{:>11}", fmt_g3(*v));
        }
        s.push('\n');
    };
    let all = |v: &ValMetrics| [v.mp, v.mr, v.map50, v.map50_95];
    row("all", boxes.nt.iter().sum(), all(boxes), all(masks));
    if boxes.nt.len() > 1 {
        let class = |v: &ValMetrics, c: usize| -> [f64; 4] {
            match v.per_class.classes.iter().position(|&k| k == c) {
                Some(i) => [v.per_class.p[i], v.per_class.r[i], v.ap50[i], v.ap50_95[i]],
                None => [0.0; 4],
            }
        };
        for &c in &boxes.per_class.classes {
            let name = names.get(c).cloned().unwrap_or_else(|| c.to_string());
            let n = boxes.nt.get(c).copied().unwrap_or(0);
            row(&name, n, class(boxes, c), class(masks, c));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_mask_crops_to_the_scaled_box_and_thresholds_the_sigmoid() {
        // One 4 × 4 prototype, coefficient 2: logits 2·p. The box [4, 4, 14, 12] of a 16 × 16
        // input scales by 4/16 to [1, 1, 3.5, 3]: columns 1..=3, rows 1..=2 (crop_mask keeps
        // x1 ≤ x < x2, y1 ≤ y < y2).
        let p: Vec<f32> = (0..16)
            .map(|i| if i % 3 == 0 { -1.0 } else { 0.5 })
            .collect();
        let protos = crate::detect::masks::Protos {
            data: &p,
            nm: 1,
            h: 4,
            w: 4,
        };
        let m = proto_mask(protos, &[2.0], [4.0, 4.0, 14.0, 12.0], (16, 16));
        let want: Vec<u8> = (0..16)
            .map(|i| {
                let (x, y) = (i % 4, i / 4);
                u8::from((1..=3).contains(&x) && (1..=2).contains(&y) && i % 3 != 0)
            })
            .collect();
        assert_eq!(m, want);
        // A zero logit is sigmoid 0.5, not above it.
        let z = vec![0.0f32; 16];
        let protos = crate::detect::masks::Protos {
            data: &z,
            nm: 1,
            h: 4,
            w: 4,
        };
        assert!(proto_mask(protos, &[1.0], [0.0, 0.0, 16.0, 16.0], (16, 16))
            .iter()
            .all(|&v| v == 0));
    }

    #[test]
    fn overlap_iou_equals_the_dense_mask_iou() {
        // A 12 × 10 overlap mask of three labels and five predictions, pseudo-random.
        let px = 120;
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        let overlap: Vec<u32> = (0..px).map(|_| next() % 4).collect();
        let pred: Vec<u8> = (0..5 * px).map(|_| u8::from(next() % 3 == 0)).collect();
        let dense: Vec<u8> = (1..=3u32)
            .flat_map(|k| overlap.iter().map(move |&v| u8::from(v == k)))
            .collect();
        let want = mask_iou(&dense, &pred, px);
        let got = mask_iou_overlap(&overlap, 3, &pred, px);
        assert_eq!(got, want);
        assert!(want.iter().flatten().any(|&v| v > 0.1));
    }

    #[test]
    fn the_table_has_box_and_mask_columns_and_class_rows() {
        let mut st = SegValStats::default();
        // Image 1: two labels of classes 0 and 1 (2 × 2 masks); one detection per label, the
        // first right in box and mask, the second right in box, wrong in mask.
        let labels = [[0.0, 0.0, 0.0, 10.0, 10.0], [1.0, 20.0, 20.0, 30.0, 30.0]];
        let dets = [
            [0.0, 0.0, 10.0, 10.0, 0.9, 0.0],
            [20.0, 20.0, 30.0, 30.0, 0.8, 1.0],
        ];
        let gt = [1, 1, 0, 0, 0, 0, 1, 1];
        let pred = [1, 1, 0, 0, 1, 1, 0, 0];
        st.add_image(&dets, &labels, &pred, &gt, 4);
        let (b, m) = st.metrics(2);
        let names = vec!["a".to_string(), "b".to_string()];
        let t = seg_table(&b, &m, &names);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(lines[0].contains("Box(P") && lines[0].contains("Mask(P"));
        let cols = |l: &str| -> Vec<String> { l.split_whitespace().map(String::from).collect() };
        // all: box P = R = 1, mask P = R = 0.5.
        assert_eq!(cols(lines[1])[..5], ["all", "1", "2", "1", "1"]);
        assert_eq!(cols(lines[1])[7..9], ["0.5", "0.5"]);
        // class b: box right, mask wrong.
        assert_eq!(cols(lines[3])[..4], ["b", "1", "1", "1"]);
        assert_eq!(cols(lines[3])[7..], ["0", "0", "0", "0"]);
    }
}
