//! All box geometry of the crate, on plain boxes (the loss's CIoU on tensors stays with the
//! loss): the IoU variants — the official metrics' [`box_iou`] (validation's true positives,
//! the confusion matrix), [`iou_eps`] (the official `bbox_iou` with a chosen `eps`; 0 is
//! torchvision's NMS semantics), [`iou_f64`] (the MOT metrics), [`coco_iou`] (pycocotools, `xywh`,
//! crowd) — the [`intersection`] and [`area`] they are made of, the conversions between `xyxy`
//! pixels, `cxcywh` and normalized YOLO labels, and clipping to an image.

/// IoU of two `[x1, y1, x2, y2]` boxes (pixels or any common unit), in f32 with the official
/// operation order of `utils.metrics.box_iou`: `inter / (area1 + area2 - inter + 1e-7)`.
pub fn box_iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let inter = intersection(a, b);
    inter / (area(a) + area(b) - inter + 1e-7f32)
}

/// The area of the intersection of two `[x1, y1, x2, y2, ..]` boxes (the first four values;
/// 0 when they do not overlap).
pub fn intersection(a: &[f32], b: &[f32]) -> f32 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    iw * ih
}

/// The area `(x2 - x1) · (y2 - y1)` of an `[x1, y1, x2, y2, ..]` box (the first four values).
pub fn area(b: &[f32]) -> f32 {
    (b[2] - b[0]) * (b[3] - b[1])
}

/// Clamps a box `[x1, y1, x2, y2]` to the image: x to `[0, w]`, y to `[0, h]` (official
/// `clip_boxes`). `hw` is `(h, w)` in pixels. NaN coordinates become 0.
pub fn clip_box(b: &mut [f32; 4], hw: (u32, u32)) {
    let (h, w) = (hw.0 as f32, hw.1 as f32);
    let cl = |v: f32, hi: f32| if v.is_nan() { 0.0 } else { v.clamp(0.0, hi) };
    b[0] = cl(b[0], w);
    b[2] = cl(b[2], w);
    b[1] = cl(b[1], h);
    b[3] = cl(b[3], h);
}

/// Decoded YOLO `(cx, cy, w, h)` → `(x1, y1, x2, y2)` (official `xywh2xyxy`, f32).
pub fn xywh2xyxy(b: [f32; 4]) -> [f32; 4] {
    [
        b[0] - b[2] / 2.0,
        b[1] - b[3] / 2.0,
        b[0] + b[2] / 2.0,
        b[1] + b[3] / 2.0,
    ]
}

/// `(x1, y1, x2, y2)` in pixels → normalized YOLO label `(cx, cy, w, h)` for an image of `w x h`
/// pixels (official `xyxy2xywh(...) / gn`).
pub fn xyxy_to_yolo(b: [f32; 4], w: u32, h: u32) -> [f32; 4] {
    let (wf, hf) = (w as f32, h as f32);
    [
        (b[0] + b[2]) / 2.0 / wf,
        (b[1] + b[3]) / 2.0 / hf,
        (b[2] - b[0]) / wf,
        (b[3] - b[1]) / hf,
    ]
}

/// Normalized `cx cy w h` → pixel `xyxy` for an image of `w × h` placed at offset `(padw, padh)`
/// (official `xywhn2xyxy`).
pub fn xywhn_to_xyxy(l: &[f32; 4], w: f32, h: f32, padw: f32, padh: f32) -> [f32; 4] {
    [
        w * (l[0] - l[2] / 2.0) + padw,
        h * (l[1] - l[3] / 2.0) + padh,
        w * (l[0] + l[2] / 2.0) + padw,
        h * (l[1] + l[3] / 2.0) + padh,
    ]
}

/// Pixel `xyxy` → normalized `cx cy w h`, clipping the corners to `[0, w − eps] × [0, h − eps]`
/// first with `eps = 1e-3` (official `xyxy2xywhn(..., clip=True, eps=1e-3)`).
pub fn xyxy_to_xywhn(b: &[f32; 4], w: f32, h: f32) -> [f32; 4] {
    let eps = 1e-3;
    let x1 = b[0].clamp(0.0, w - eps);
    let y1 = b[1].clamp(0.0, h - eps);
    let x2 = b[2].clamp(0.0, w - eps);
    let y2 = b[3].clamp(0.0, h - eps);
    [
        (x1 + x2) / 2.0 / w,
        (y1 + y2) / 2.0 / h,
        (x2 - x1) / w,
        (y2 - y1) / h,
    ]
}

/// IoU of two `[x1, y1, x2, y2]` boxes (no +1), in f64; 0 for empty unions (the MOT metrics,
/// `track::mot`).
pub fn iou_f64(a: &[f32; 4], b: &[f32; 4]) -> f64 {
    let [a0, a1, a2, a3] = a.map(|v| v as f64);
    let [b0, b1, b2, b3] = b.map(|v| v as f64);
    let iw = (a2.min(b2) - a0.max(b0)).max(0.0);
    let ih = (a3.min(b3) - a1.max(b1)).max(0.0);
    let inter = iw * ih;
    let union = (a2 - a0) * (a3 - a1) + (b2 - b0) * (b3 - b1) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// Plain IoU of two xyxy boxes: `inter / (area_a + area_b - inter + eps)`.
///
/// With `eps = 0` this is torchvision `box_iou` / `nms` semantics (two zero-area boxes give
/// `0/0 = NaN`); with `eps = 1e-7` it is the official `utils/metrics.py box_iou`.
/// Boxes with `x2 < x1` or `y2 < y1` have negative area and are not rejected (callers validate).
pub fn iou_eps(a: [f32; 4], b: [f32; 4], eps: f32) -> f32 {
    let area_a = (a[2] - a[0]) * (a[3] - a[1]);
    let area_b = (b[2] - b[0]) * (b[3] - b[1]);
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    inter / (area_a + area_b - inter + eps)
}

/// IoU of boxes `d` and `g` (`[x, y, w, h]`), pycocotools `maskUtils.iou` for boxes: the
/// union is the detection's area when `crowd`.
pub fn coco_iou(d: &[f64; 4], g: &[f64; 4], crowd: bool) -> f64 {
    let w = (d[0] + d[2]).min(g[0] + g[2]) - d[0].max(g[0]);
    if w <= 0.0 {
        return 0.0;
    }
    let h = (d[1] + d[3]).min(g[1] + g[3]) - d[1].max(g[1]);
    if h <= 0.0 {
        return 0.0;
    }
    let i = w * h;
    let da = d[2] * d[3];
    let u = if crowd { da } else { da + g[2] * g[3] - i };
    i / u
}
