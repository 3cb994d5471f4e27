//! Box geometry shared by the crate's parts: the IoU of two `[x1, y1, x2, y2]` boxes as the
//! official metrics compute it (validation's true positives and the confusion matrix), and the
//! intersection and area it is made of (also the merge of tiles, `detect::tile`).

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
