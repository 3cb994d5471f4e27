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
//!
//! Also the official per-image NMS on a decoded output ([`nms_image`], candidates → sorted rows)
//! with its options ([`NmsOptions`] and their [`defaults`]): the one host definition that the
//! batch functions of [`super::postprocess`] and the device op of [`super::device_nms`] share.

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

/// The NMS defaults of the official `detect_dual.py` (also those of [`super::config::DetectorConfig`]).
pub mod defaults {
    /// Confidence threshold (`--conf-thres 0.25`).
    pub const CONF: f32 = 0.25;
    /// NMS IoU threshold (`--iou-thres 0.45`).
    pub const IOU: f64 = 0.45;
    /// Detections kept per image (`--max-det 1000`).
    pub const MAX_DET: usize = 1000;
}

/// Official cap on the boxes given to NMS (`max_nms`).
pub const MAX_NMS: usize = 30_000;

/// One detection row `[x1, y1, x2, y2, conf, cls]`.
pub type Row = [f32; 6];

/// Options of [`super::postprocess::non_max_suppression`]; defaults are those of `detect_dual.py`.
#[derive(Debug, Clone, PartialEq)]
pub struct NmsOptions {
    /// Candidates need a class score strictly greater than this (0..1). Default 0.25.
    pub conf_thres: f32,
    /// A box whose IoU with a better box of the same class is strictly greater is dropped
    /// (0..1). Default 0.45.
    pub iou_thres: f64,
    /// Keep only these class ids (None: all).
    pub classes: Option<Vec<usize>>,
    /// Class-agnostic NMS (boxes of different classes suppress each other).
    pub agnostic: bool,
    /// One candidate per (box, class) with score > conf_thres instead of the best class only
    /// (`val_dual.py` uses this). Ignored when there is a single class, as officially.
    pub multi_label: bool,
    /// Keep at most this many detections per image. Default 1000.
    pub max_det: usize,
}

/// The official defaults ([`defaults`]).
impl Default for NmsOptions {
    fn default() -> Self {
        Self {
            conf_thres: defaults::CONF,
            iou_thres: defaults::IOU,
            classes: None,
            agnostic: false,
            multi_label: false,
            max_det: defaults::MAX_DET,
        }
    }
}

/// NMS for one image. `pred` is the row-major `(4+nc, A)` output of that image (see
/// [`super::postprocess::non_max_suppression`]).
pub fn nms_image(pred: &[f32], nc: usize, a: usize, opts: &NmsOptions) -> Vec<Row> {
    nms_image_anchored(pred, nc, a, opts, false)
        .into_iter()
        .map(|r| [r[0], r[1], r[2], r[3], r[4], r[5]])
        .collect()
}

/// [`nms_image`] with the column (anchor) of each kept row as a seventh value,
/// `[x1, y1, x2, y2, conf, cls, anchor]`; with `xyxy` the box rows of `pred` are taken as
/// `x1, y1, x2, y2` (plain box lists, as torchvision's `nms` takes them) instead of `cx, cy, w, h`.
/// This is the one host definition of the official NMS: [`nms_image`] and the CPU version of
/// [`super::device_nms::BatchNms`] call it, and the CUDA kernel (`kernels/nms.cu`) follows it
/// step by step.
pub fn nms_image_anchored(
    pred: &[f32],
    nc: usize,
    a: usize,
    opts: &NmsOptions,
    xyxy: bool,
) -> Vec<[f32; 7]> {
    let at = |r: usize, j: usize| pred[r * a + j];
    let multi_label = opts.multi_label && nc > 1;
    let thr = opts.conf_thres;
    let mut x: Vec<[f32; 7]> = Vec::new();
    for j in 0..a {
        // xc: max class score > conf_thres (strict).
        let mut best = f32::NEG_INFINITY;
        let mut best_c = 0usize;
        for c in 0..nc {
            let s = at(4 + c, j);
            if s > best {
                best = s;
                best_c = c;
            }
        }
        if best.is_nan() || best <= thr {
            continue;
        }
        let (p0, p1, p2, p3) = (at(0, j), at(1, j), at(2, j), at(3, j));
        let bx = if xyxy {
            [p0, p1, p2, p3]
        } else {
            [p0 - p2 / 2.0, p1 - p3 / 2.0, p0 + p2 / 2.0, p1 + p3 / 2.0]
        };
        let row = |s: f32, c: usize| [bx[0], bx[1], bx[2], bx[3], s, c as f32, j as f32];
        if multi_label {
            for c in 0..nc {
                let s = at(4 + c, j);
                if s > thr {
                    x.push(row(s, c));
                }
            }
        } else {
            x.push(row(best, best_c));
        }
    }
    if let Some(classes) = &opts.classes {
        x.retain(|r| classes.iter().any(|&c| c as f32 == r[5]));
    }
    if x.is_empty() {
        return x;
    }
    // Stable sort by decreasing confidence, then the max_nms cut.
    x.sort_by(|p, q| q[4].partial_cmp(&p[4]).unwrap_or(std::cmp::Ordering::Equal));
    x.truncate(MAX_NMS);
    let off = if opts.agnostic { 0.0 } else { MAX_WH };
    let boxes: Vec<[f32; 4]> = x
        .iter()
        .map(|r| {
            let c = r[5] * off;
            [r[0] + c, r[1] + c, r[2] + c, r[3] + c]
        })
        .collect();
    let scores: Vec<f32> = x.iter().map(|r| r[4]).collect();
    let mut keep = nms(&boxes, &scores, opts.iou_thres);
    keep.truncate(opts.max_det);
    keep.into_iter().map(|i| x[i]).collect()
}
