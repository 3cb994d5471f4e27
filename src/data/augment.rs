//! Training augmentation with the official `hyp.scratch-high.yaml` recipe.
//!
//! Follows the official `utils/dataloaders.py` (`load_image`, `load_mosaic`, `__getitem__`) and
//! `utils/augmentations.py` (`random_perspective`, `augment_hsv`, `mixup`, `box_candidates`):
//!
//! 1. each image is resized so its long side is `img_size` (bilinear);
//! 2. with probability `mosaic`, four images (the sample and three random others) are tiled
//!    around a random centre in a `2s × 2s` canvas filled with grey 114, then a random affine
//!    (scale `1 ± 0.9`, translation `0.5 ± 0.1`, no rotation/shear for scratch-high) crops it back to
//!    `s × s`; with probability `mixup` a second mosaic is blended in with ratio `Beta(32, 32)`;
//!    otherwise the image is letterboxed to `s × s` (no auto padding) and the same affine applied;
//! 3. boxes are warped by their four corners, clipped, and kept only if they pass
//!    [`box_candidates`] (width and height > 2 px, area ratio > 0.1, aspect ratio < 100);
//! 4. HSV gains `1 ± (0.015, 0.7, 0.4)` (OpenCV 8-bit HSV: hue in 0..180), then a horizontal flip
//!    with probability 0.5.
//!
//! The training path ([`augment_sample`]) renders steps 2's mosaic and affine as one inverse warp
//! from the four source images into the `s × s` output in fixed point
//! ([`crate::data::warp::warp_tiles`], within 1 grey level of the f64 canvas path) and step 4's
//! HSV by per-image lookup tables with integer colour conversions (byte-exact); flips are in
//! place. [`augment_sample_reference`] keeps the straightforward f64 path (canvas,
//! [`warp_affine`], [`augment_hsv_reference`]) for tests and benchmarks: both draw the same
//! random numbers and give the same labels.
//!
//! Boxes are `[x1, y1, x2, y2]` in **pixels** of the image they belong to while augmenting; the
//! final labels are normalized `cx, cy, w, h` ([`Augmented::labels`]).
//!
//! **Instance outlines** (segmentation datasets, [`SourceImage::outlines`]) follow the official
//! `utils/segment/dataloaders.py` and `utils/segment/augmentations.py`: they move with their
//! tile into the mosaic (clipped to `[0, 2s]`) or the letterbox, then the affine resamples each to
//! [`OUTLINE_POINTS`] points ([`resample_outline`]), transforms them and takes each object's box
//! from its transformed outline ([`outline_box`]), keeping the objects that pass
//! [`box_candidates`] with area ratio 0.01 (0.1 for boxes alone); mixup concatenates them. The
//! sample's ground-truth mask is rasterised from the outlines before the flips and then flipped
//! with the image ([`Augmented::overlap_mask`]). All randomness comes from
//! the caller's RNG, so a sample is reproducible from its seed whatever thread runs it.

use crate::boxes::{xywhn_to_xyxy, xyxy_to_xywhn};
use crate::data::warp::{mosaic_placements, warp_tiles, Affine, CanvasTile, Placement, PAD_GREY};
use image::{imageops, Rgb, RgbImage};
use rand::Rng;
use rand_distr::{Beta, Distribution};

/// One object box: class and `[x1, y1, x2, y2]` in pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PixelBox {
    /// Class index.
    pub cls: u32,
    /// Corners in pixels.
    pub xyxy: [f32; 4],
}

/// Augmentation hyper-parameters (the keys of `hyp.scratch-high.yaml`; missing keys keep the
/// scratch-high values).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AugmentConfig {
    /// Hue gain (fraction), 0.015.
    pub hsv_h: f32,
    /// Saturation gain, 0.7.
    pub hsv_s: f32,
    /// Value gain, 0.4.
    pub hsv_v: f32,
    /// Rotation in degrees (±), 0.
    pub degrees: f32,
    /// Translation (± fraction), 0.1.
    pub translate: f32,
    /// Scale gain (±), 0.9.
    pub scale: f32,
    /// Shear in degrees (±), 0.
    pub shear: f32,
    /// Up-down flip probability, 0.
    pub flipud: f32,
    /// Left-right flip probability, 0.5.
    pub fliplr: f32,
    /// Mosaic probability, 1.0 (set to 0 for the last `--close-mosaic` epochs).
    pub mosaic: f32,
    /// Mixup probability, 0.15.
    pub mixup: f32,
}

impl Default for AugmentConfig {
    fn default() -> Self {
        AugmentConfig {
            hsv_h: 0.015,
            hsv_s: 0.7,
            hsv_v: 0.4,
            degrees: 0.0,
            translate: 0.1,
            scale: 0.9,
            shear: 0.0,
            flipud: 0.0,
            fliplr: 0.5,
            mosaic: 1.0,
            mixup: 0.15,
        }
    }
}

/// A decoded training image with its labels in normalized `cls cx cy w h` (as in label files).
#[derive(Debug, Clone)]
pub struct SourceImage {
    /// RGB pixels (any size).
    pub image: RgbImage,
    /// `(cls, [cx, cy, w, h])`, normalized to the image size.
    pub labels: Vec<(u32, [f32; 4])>,
    /// Segmentation datasets: one outline per label (points `[x, y]` normalized to the image; an
    /// empty outline stands for the label's box). Empty for a detection dataset: the sample is
    /// augmented as boxes alone.
    pub outlines: Vec<Vec<[f32; 2]>>,
}

/// Points of every outline after the affine ([`resample_outline`], official
/// `resample_segments(n=1000)`).
pub const OUTLINE_POINTS: usize = 1000;

/// An augmented training sample: `s × s` RGB and normalized `cx, cy, w, h` labels.
#[derive(Debug, Clone)]
pub struct Augmented {
    /// RGB pixels, `img_size × img_size`.
    pub image: RgbImage,
    /// `(cls, [cx, cy, w, h])` normalized to the output image, clipped to it.
    pub labels: Vec<(u32, [f32; 4])>,
    /// Segmentation samples: one outline per label, in pixels of the output image **before** the
    /// flips of [`Augmented::flipped`] (they may leave the image). Empty for boxes alone.
    pub outlines: Vec<Vec<[f64; 2]>>,
    /// `[up-down, left-right]` flips applied to the image and labels after the outlines.
    pub flipped: [bool; 2],
}

impl Augmented {
    /// The sample's overlap mask at `1 / ratio` of the image (official
    /// `polygons2masks_overlap(img.shape[:2], segments, downsample_ratio)` then the flips):
    /// `(h / ratio) × (w / ratio)` row-major, value `k + 1` where the object `order[k]` is (see
    /// [`crate::data::polygons::overlap_mask`]). The caller reorders the labels by `order`.
    pub fn overlap_mask(&self, ratio: usize) -> (Vec<u32>, Vec<usize>) {
        let (w, h) = (self.image.width() as usize, self.image.height() as usize);
        let (mut mask, order) = crate::data::polygons::overlap_mask(&self.outlines, w, h, ratio);
        let (mw, mh) = (w / ratio.max(1), h / ratio.max(1));
        if self.flipped[0] {
            for y in 0..mh / 2 {
                for x in 0..mw {
                    mask.swap(y * mw + x, (mh - 1 - y) * mw + x);
                }
            }
        }
        if self.flipped[1] {
            for row in mask.chunks_exact_mut(mw.max(1)) {
                row.reverse();
            }
        }
        (mask, order)
    }
}

/// Official `resample_segments` for one outline: the outline closed (its first point appended)
/// and `n` points interpolated linearly at `np.linspace(0, len, n)` of the point index.
pub fn resample_outline(points: &[[f64; 2]], n: usize) -> Vec<[f64; 2]> {
    if points.is_empty() || n == 0 {
        return Vec::new();
    }
    let mut closed = points.to_vec();
    closed.push(points[0]);
    let last = (closed.len() - 1) as f64;
    let step = if n > 1 { last / (n - 1) as f64 } else { 0.0 };
    (0..n)
        .map(|k| {
            let x = if k + 1 == n && n > 1 {
                last
            } else {
                k as f64 * step
            };
            let j = (x.floor() as usize).min(closed.len().saturating_sub(2));
            let (a, b) = (closed[j], closed[(j + 1).min(closed.len() - 1)]);
            let t = x - j as f64;
            [a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])]
        })
        .collect()
}

/// Official `segment2box(xy, width, height)`: the box `[x1, y1, x2, y2]` of the outline's points
/// inside `[0, width] × [0, height]`, or zeros when none is (or, as the official `any(x)`, when
/// every inside point has `x == 0`).
pub fn outline_box(points: &[[f64; 2]], width: f64, height: f64) -> [f64; 4] {
    let inside = points
        .iter()
        .filter(|p| p[0] >= 0.0 && p[1] >= 0.0 && p[0] <= width && p[1] <= height);
    let mut b = [f64::MAX, f64::MAX, f64::MIN, f64::MIN];
    let mut any = false;
    for p in inside {
        any |= p[0] != 0.0;
        b = [
            b[0].min(p[0]),
            b[1].min(p[1]),
            b[2].max(p[0]),
            b[3].max(p[1]),
        ];
    }
    if any {
        b
    } else {
        [0.0; 4]
    }
}

/// The outlines of `src`'s labels in pixels ([`crate::data::polygons::outlines_in_pixels`]).
fn outlines_px(src: &SourceImage, w: f32, h: f32, pad: (f32, f32)) -> Vec<Vec<[f64; 2]>> {
    crate::data::polygons::outlines_in_pixels(&src.labels, &src.outlines, (w, h), pad)
}

/// The objects of a sample while it is augmented: boxes and, for segmentation, one outline per
/// box (pixels of the same image).
type Objects = (Vec<PixelBox>, Option<Vec<Vec<[f64; 2]>>>);

/// The outline branch of official `random_perspective` (segmentation): each outline resampled
/// to [`OUTLINE_POINTS`] points and transformed by `m`, its object's box taken from it
/// ([`outline_box`] in `out_w × out_h`), and the objects passing [`box_candidates`] against their
/// box before the warp times `s` (area ratio 0.01) kept, with their transformed outlines.
pub fn warp_outlines(
    boxes: &[PixelBox],
    outlines: &[Vec<[f64; 2]>],
    m: &Affine,
    s: f64,
    out_w: u32,
    out_h: u32,
) -> (Vec<PixelBox>, Vec<Vec<[f64; 2]>>) {
    let [[a, b, c], [d, e, f]] = *m;
    let mut kept = (Vec::new(), Vec::new());
    for (bx, o) in boxes.iter().zip(outlines) {
        let xy: Vec<[f64; 2]> = resample_outline(o, OUTLINE_POINTS)
            .into_iter()
            .map(|[x, y]| [a * x + b * y + c, d * x + e * y + f])
            .collect();
        let new = outline_box(&xy, out_w as f64, out_h as f64).map(|v| v as f32);
        let before = bx.xyxy.map(|v| (v as f64 * s) as f32);
        if box_candidates(&before, &new, 0.01) {
            kept.0.push(PixelBox {
                cls: bx.cls,
                xyxy: new,
            });
            kept.1.push(xy);
        }
    }
    kept
}

/// Boxes alone ([`warp_boxes`]) or boxes with outlines ([`warp_outlines`]).
fn warp_objects(objects: &Objects, m: &Affine, s: f64, out_w: u32, out_h: u32) -> Objects {
    match &objects.1 {
        None => (warp_boxes(&objects.0, m, s, out_w, out_h), None),
        Some(o) => {
            let (b, o) = warp_outlines(&objects.0, o, m, s, out_w, out_h);
            (b, Some(o))
        }
    }
}

/// Resizes so the long side equals `img_size` (official `load_image`: `r = s / max(h, w)`,
/// new size `int(w·r) × int(h·r)`, bilinear). Returns the image unchanged when `r == 1`.
pub fn resize_long_side(img: &RgbImage, img_size: u32) -> RgbImage {
    let (w, h) = img.dimensions();
    let r = img_size as f64 / w.max(h) as f64;
    if (r - 1.0).abs() < f64::EPSILON {
        return img.clone();
    }
    let nw = ((w as f64 * r) as u32).max(1);
    let nh = ((h as f64 * r) as u32).max(1);
    imageops::resize(img, nw, nh, imageops::FilterType::Triangle)
}

/// [`resize_long_side`] taking the image: returned as it is (no copy) when its long side is
/// already `img_size`.
pub fn resize_long_side_owned(img: RgbImage, img_size: u32) -> RgbImage {
    let (w, h) = img.dimensions();
    if w.max(h) == img_size {
        return img;
    }
    resize_long_side(&img, img_size)
}

/// Official `box_candidates`: keeps a box warped from `before` to `after` when its width and
/// height exceed `wh_thr` px (2), its area is more than `area_thr` (0.1) of the scaled original,
/// and its aspect ratio is below `ar_thr` (100).
pub fn box_candidates(before: &[f32; 4], after: &[f32; 4], area_thr: f32) -> bool {
    let eps = 1e-16f32;
    let (w1, h1) = (before[2] - before[0], before[3] - before[1]);
    let (w2, h2) = (after[2] - after[0], after[3] - after[1]);
    let ar = (w2 / (h2 + eps)).max(h2 / (w2 + eps));
    w2 > 2.0 && h2 > 2.0 && w2 * h2 / (w1 * h1 + eps) > area_thr && ar < 100.0
}

/// Builds the 4-image mosaic of official `load_mosaic` on a `2s × 2s` grey canvas. `images` are
/// already resized to long side `s`; `centre` is `(xc, yc)` in `[s/2, 3s/2)`. Returns the canvas
/// and the boxes in canvas pixels (xyxy). This is the f64 reference path: training renders the
/// same mosaic without the canvas ([`crate::data::warp::warp_tiles`]).
pub fn mosaic4(images: [&SourceImage; 4], s: u32, centre: (i64, i64)) -> (RgbImage, Vec<PixelBox>) {
    let s2 = 2 * s;
    let mut canvas = RgbImage::from_pixel(s2, s2, Rgb([PAD_GREY; 3]));
    let places = mosaic_placements(images.map(|i| i.image.dimensions()), s, centre);
    for (src, p) in images.iter().zip(&places) {
        let [x1a, y1a, x2a, y2a] = p.canvas;
        let [x1b, y1b] = p.src;
        let (cw, ch) = (x2a - x1a, y2a - y1a);
        if cw > 0 && ch > 0 {
            for y in 0..ch {
                for x in 0..cw {
                    let p = *src.image.get_pixel((x1b + x) as u32, (y1b + y) as u32);
                    canvas.put_pixel((x1a + x) as u32, (y1a + y) as u32, p);
                }
            }
        }
    }
    let boxes = mosaic_boxes(images, &places, s);
    (canvas, boxes)
}

/// The labels of four mosaic tiles moved onto the `2s × 2s` canvas (official `load_mosaic`:
/// `xywhn2xyxy(labels, w, h, padw, padh)` then `np.clip(..., 0, 2s)`), in canvas pixels (xyxy).
pub fn mosaic_boxes(images: [&SourceImage; 4], places: &[Placement; 4], s: u32) -> Vec<PixelBox> {
    let s2 = 2.0 * s as f32;
    let mut boxes = Vec::new();
    for (src, p) in images.iter().zip(places) {
        let (w, h) = (src.image.width() as f32, src.image.height() as f32);
        let (padw, padh) = p.offset();
        for (cls, l) in &src.labels {
            let mut b = xywhn_to_xyxy(l, w, h, padw as f32, padh as f32);
            for v in &mut b {
                *v = v.clamp(0.0, s2);
            }
            boxes.push(PixelBox { cls: *cls, xyxy: b });
        }
    }
    boxes
}

/// Draws the official `random_perspective` affine (without perspective): centre, rotate/scale,
/// shear, translate, for an input of `in_w × in_h` and an output of
/// `(in_w + 2·border) × (in_h + 2·border)`. Returns the matrix and the scale `s` drawn.
pub fn random_affine<R: Rng>(
    cfg: &AugmentConfig,
    in_w: u32,
    in_h: u32,
    border: i64,
    rng: &mut R,
) -> (Affine, f64) {
    let out_w = in_w as f64 + 2.0 * border as f64;
    let out_h = in_h as f64 + 2.0 * border as f64;
    let uni = |rng: &mut R, a: f64, b: f64| if b > a { rng.random_range(a..b) } else { a };
    let deg = cfg.degrees as f64;
    let a = uni(rng, -deg, deg).to_radians();
    let s = uni(rng, 1.0 - cfg.scale as f64, 1.0 + cfg.scale as f64);
    let sh = cfg.shear as f64;
    let shx = uni(rng, -sh, sh).to_radians().tan();
    let shy = uni(rng, -sh, sh).to_radians().tan();
    let t = cfg.translate as f64;
    let tx = uni(rng, 0.5 - t, 0.5 + t) * out_w;
    let ty = uni(rng, 0.5 - t, 0.5 + t) * out_h;
    // C: move the input centre to the origin.
    let c = [
        [1.0, 0.0, -(in_w as f64) / 2.0],
        [0.0, 1.0, -(in_h as f64) / 2.0],
        [0.0, 0.0, 1.0],
    ];
    // R: OpenCV getRotationMatrix2D(angle=a, centre 0, scale s) (counter-clockwise angle).
    let (sin, cos) = a.sin_cos();
    let r = [
        [s * cos, s * sin, 0.0],
        [-s * sin, s * cos, 0.0],
        [0.0, 0.0, 1.0],
    ];
    let shm = [[1.0, shx, 0.0], [shy, 1.0, 0.0], [0.0, 0.0, 1.0]];
    let tm = [[1.0, 0.0, tx], [0.0, 1.0, ty], [0.0, 0.0, 1.0]];
    let m = matmul(&tm, &matmul(&shm, &matmul(&r, &c)));
    ([m[0], m[1]], s)
}

fn matmul(a: &[[f64; 3]; 3], b: &[[f64; 3]; 3]) -> [[f64; 3]; 3] {
    let mut o = [[0.0; 3]; 3];
    for i in 0..3 {
        for j in 0..3 {
            o[i][j] = (0..3).map(|k| a[i][k] * b[k][j]).sum();
        }
    }
    o
}

/// Warps `img` by `m` into an `out_w × out_h` image (bilinear, grey 114 outside), as
/// `cv2.warpAffine(..., borderValue=114)`.
pub fn warp_affine(img: &RgbImage, m: &Affine, out_w: u32, out_h: u32) -> RgbImage {
    let [[a, b, c], [d, e, f]] = *m;
    let det = a * e - b * d;
    let mut out = RgbImage::from_pixel(out_w, out_h, Rgb([PAD_GREY; 3]));
    if det.abs() < 1e-12 {
        return out;
    }
    // Inverse affine: source = M^-1 · destination.
    let (ia, ib, id, ie) = (e / det, -b / det, -d / det, a / det);
    let ic = -(ia * c + ib * f);
    let if_ = -(id * c + ie * f);
    let (w, h) = (img.width() as i64, img.height() as i64);
    let raw = img.as_raw();
    let px = |x: i64, y: i64, ch: usize| -> f64 {
        if x < 0 || y < 0 || x >= w || y >= h {
            PAD_GREY as f64
        } else {
            raw[((y * w + x) * 3) as usize + ch] as f64
        }
    };
    let out_raw: &mut [u8] = &mut out;
    for oy in 0..out_h as i64 {
        for ox in 0..out_w as i64 {
            let sx = ia * ox as f64 + ib * oy as f64 + ic;
            let sy = id * ox as f64 + ie * oy as f64 + if_;
            if sx <= -1.0 || sy <= -1.0 || sx >= w as f64 || sy >= h as f64 {
                continue;
            }
            let (x0, y0) = (sx.floor() as i64, sy.floor() as i64);
            let (fx, fy) = (sx - x0 as f64, sy - y0 as f64);
            let o = ((oy * out_w as i64 + ox) * 3) as usize;
            for ch in 0..3 {
                let v = px(x0, y0, ch) * (1.0 - fx) * (1.0 - fy)
                    + px(x0 + 1, y0, ch) * fx * (1.0 - fy)
                    + px(x0, y0 + 1, ch) * (1.0 - fx) * fy
                    + px(x0 + 1, y0 + 1, ch) * fx * fy;
                out_raw[o + ch] = v.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    out
}

/// Warps boxes by their four corners, clips them to the output and keeps the
/// [`box_candidates`] (official `random_perspective`, box branch). `s` is the drawn scale.
pub fn warp_boxes(boxes: &[PixelBox], m: &Affine, s: f64, out_w: u32, out_h: u32) -> Vec<PixelBox> {
    let [[a, b, c], [d, e, f]] = *m;
    let mut kept = Vec::with_capacity(boxes.len());
    for bx in boxes {
        let [x1, y1, x2, y2] = bx.xyxy.map(|v| v as f64);
        let corners = [(x1, y1), (x2, y2), (x1, y2), (x2, y1)];
        let (mut nx1, mut ny1, mut nx2, mut ny2) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
        for (x, y) in corners {
            let tx = a * x + b * y + c;
            let ty = d * x + e * y + f;
            nx1 = nx1.min(tx);
            ny1 = ny1.min(ty);
            nx2 = nx2.max(tx);
            ny2 = ny2.max(ty);
        }
        let new = [
            nx1.clamp(0.0, out_w as f64) as f32,
            ny1.clamp(0.0, out_h as f64) as f32,
            nx2.clamp(0.0, out_w as f64) as f32,
            ny2.clamp(0.0, out_h as f64) as f32,
        ];
        let before = bx.xyxy.map(|v| (v as f64 * s) as f32);
        if box_candidates(&before, &new, 0.1) {
            kept.push(PixelBox {
                cls: bx.cls,
                xyxy: new,
            });
        }
    }
    kept
}

/// The three official `augment_hsv` lookup tables for random gains `1 + U(-1, 1)·(h, s, v)`:
/// `lut_hue = (x·r₀) % 180`, `lut_sat = clip(x·r₁, 0, 255)`, `lut_val = clip(x·r₂, 0, 255)`.
/// `None` when every gain is 0 (official: the function is skipped and draws nothing).
fn hsv_luts<R: Rng>(hgain: f32, sgain: f32, vgain: f32, rng: &mut R) -> Option<[[u8; 256]; 3]> {
    if hgain == 0.0 && sgain == 0.0 && vgain == 0.0 {
        return None;
    }
    let mut r = [0f64; 3];
    for (ri, g) in r.iter_mut().zip([hgain, sgain, vgain]) {
        *ri = rng.random_range(-1.0..1.0) * g as f64 + 1.0;
    }
    Some(std::array::from_fn(|k| {
        let mut t = [0u8; 256];
        for (x, v) in t.iter_mut().enumerate() {
            let y = x as f64 * r[k];
            *v = if k == 0 {
                (y % 180.0) as u8
            } else {
                y.clamp(0.0, 255.0) as u8
            };
        }
        t
    }))
}

/// Official `augment_hsv` on 8-bit RGB: random gains `1 + U(-1, 1)·(h, s, v)` applied through
/// per-image lookup tables in OpenCV's 8-bit HSV space (hue 0..180 wraps, saturation and value
/// clip). The colour conversions are integer ([`rgb_to_hsv8_int`], [`hsv8_to_rgb_int`]), so
/// the result equals [`augment_hsv_reference`] byte for byte.
pub fn augment_hsv<R: Rng>(img: &mut RgbImage, hgain: f32, sgain: f32, vgain: f32, rng: &mut R) {
    let Some([lh, ls, lv]) = hsv_luts(hgain, sgain, vgain, rng) else {
        return;
    };
    // Per input hue, what the output conversion needs of the new hue: its sector (0..6) and
    // `30 − f` (see [`hsv8_to_rgb_int`]).
    let hue: [(u8, u8); 256] = std::array::from_fn(|h| {
        let h2 = lh[h] as u32;
        (((h2 / 30) % 6) as u8, (h2 % 60).abs_diff(30) as u8)
    });
    let raw: &mut [u8] = img;
    // Runs of one colour (the grey 114 around a mosaic, flat backgrounds) reuse the last result.
    let (mut last_in, mut last_out) = ([PAD_GREY; 3], [0u8; 3]);
    let mut have_last = false;
    for p in raw.chunks_exact_mut(3) {
        let rgb = [p[0], p[1], p[2]];
        if have_last && rgb == last_in {
            p.copy_from_slice(&last_out);
            continue;
        }
        let [h, s, v] = rgb_to_hsv8_int(rgb);
        let (sector, g) = hue[h as usize];
        let (s2, v2) = (ls[s as usize], lv[v as usize]);
        let o = hsv_out(sector, g as u32, s2 as u32, v2 as u32)
            .unwrap_or_else(|| hsv8_to_rgb([lh[h as usize], s2, v2]));
        p.copy_from_slice(&o);
        (last_in, last_out, have_last) = (rgb, o, true);
    }
}

/// Channel order of the values `[v, x, m]` in each hue sector (from [`super::image::hue_sector`]).
const SECTOR_PERM: [[u8; 3]; 8] = {
    let mut t = [[0u8; 3]; 8];
    let mut k = 0;
    while k < 8 {
        // hue_sector(k, c = 0, x = 1, zero = 2), written out for a const context.
        t[k] = match k {
            0 => [0, 1, 2],
            1 => [1, 0, 2],
            2 => [2, 0, 1],
            3 => [2, 1, 0],
            4 => [1, 2, 0],
            _ => [0, 2, 1],
        };
        k += 1;
    }
    t
};

/// The RGB of 8-bit HSV `(sector, 30 − f, s, v)` (see [`hsv8_to_rgb_int`]), or `None` at an
/// exact half of the second-largest channel, where the reference's rounding decides.
#[inline(always)]
fn hsv_out(sector: u8, g: u32, s: u32, v: u32) -> Option<[u8; 3]> {
    let m = (2 * v * (255 - s) + 255) / 510;
    let xn2 = 2 * v * (7650 - s * g) + 7650;
    let x = xn2 / 15300;
    if x * 15300 == xn2 {
        return None;
    }
    let vals = [v as u8, x as u8, m as u8];
    let perm = SECTOR_PERM[(sector & 7) as usize];
    Some([
        vals[perm[0] as usize],
        vals[perm[1] as usize],
        vals[perm[2] as usize],
    ])
}

/// [`augment_hsv`] with the f64 colour conversions ([`rgb_to_hsv8`], [`hsv8_to_rgb`]) per
/// pixel: the reference the fast path is tested against. Draws the same random numbers.
pub fn augment_hsv_reference<R: Rng>(
    img: &mut RgbImage,
    hgain: f32,
    sgain: f32,
    vgain: f32,
    rng: &mut R,
) {
    let Some([lh, ls, lv]) = hsv_luts(hgain, sgain, vgain, rng) else {
        return;
    };
    for p in img.pixels_mut() {
        let [h, s, v] = rgb_to_hsv8(p.0);
        p.0 = hsv8_to_rgb([lh[h as usize], ls[s as usize], lv[v as usize]]);
    }
}

/// `RECIP[d] = ceil(2³² / d)`: `(n · RECIP[d]) >> 32 = floor(n / d)` exactly for `n < 2¹⁷` and
/// `1 ≤ d ≤ 511` (the error term `n · (RECIP[d]·d − 2³²) < 2²⁶` stays below `2³²`).
const RECIP: [u64; 512] = {
    let mut t = [0u64; 512];
    let mut d = 1;
    while d < 512 {
        t[d] = (1u64 << 32).div_ceil(d as u64);
        d += 1;
    }
    t
};

/// `floor(n / d)` for `n < 2¹⁷`, `1 ≤ d ≤ 511`, by multiplication.
#[inline(always)]
fn div_small(n: u32, d: u32) -> u32 {
    ((n as u64 * RECIP[(d & 511) as usize]) >> 32) as u32
}

/// [`rgb_to_hsv8`] in integer arithmetic (the same rounding: half up), equal to it for every
/// input: `h ∈ [0, 180)`, `s, v ∈ [0, 255]`.
#[inline]
pub fn rgb_to_hsv8_int(rgb: [u8; 3]) -> [u8; 3] {
    let [r, g, b] = rgb.map(i32::from);
    let v = r.max(g).max(b);
    let diff = v - r.min(g).min(b);
    // s = round(255·diff / v) (0 when v = 0: RECIP[0] = 0).
    let s = div_small((510 * diff + v) as u32, 2 * v as u32);
    // h/2 = base + 30·n/diff, rounded half up: base + floor((60n + diff) / 2diff), shifted by
    // +30 so the numerator is never negative. Selects rather than branches: the maximum's
    // channel is unpredictable from pixel to pixel.
    let (vr, vg) = (v == r, v != r && v == g);
    let n = if vr {
        g - b
    } else if vg {
        b - r
    } else {
        r - g
    };
    let base = if vr {
        180 * (g < b) as i32
    } else {
        60 + 60 * (!vg) as i32
    };
    let q = div_small((60 * (n + diff) + diff) as u32, 2 * diff as u32) as i32 - 30;
    let h = base + q;
    let h = if diff == 0 || h == 180 { 0 } else { h };
    [h as u8, s as u8, v as u8]
}

/// [`hsv8_to_rgb`] in integer arithmetic, equal to it for every input: the channels are `v`,
/// `round(v·(255 − s)/255)` and `round(v·(7650 − s·(30 − f))/7650)` with
/// `f = 30 − |h mod 60 − 30|`, placed by the hue sector. At an exact half (where the f64
/// reference's rounding depends on its representation error) it defers to the reference.
#[inline]
pub fn hsv8_to_rgb_int(hsv: [u8; 3]) -> [u8; 3] {
    let [h, s, v] = hsv.map(u32::from);
    let sector = ((h / 30) % 6) as u8;
    hsv_out(sector, (h % 60).abs_diff(30), s, v).unwrap_or_else(|| hsv8_to_rgb(hsv))
}

/// OpenCV `COLOR_RGB2HSV` for 8-bit images: `h ∈ [0, 180)`, `s, v ∈ [0, 255]`.
pub fn rgb_to_hsv8(rgb: [u8; 3]) -> [u8; 3] {
    let [r, g, b] = rgb.map(|c| c as f64);
    let v = r.max(g).max(b);
    let min = r.min(g).min(b);
    let diff = v - min;
    let s = if v > 0.0 { diff * 255.0 / v } else { 0.0 };
    let mut h = if diff == 0.0 {
        0.0
    } else if v == r {
        60.0 * (g - b) / diff
    } else if v == g {
        120.0 + 60.0 * (b - r) / diff
    } else {
        240.0 + 60.0 * (r - g) / diff
    };
    if h < 0.0 {
        h += 360.0;
    }
    [
        ((h / 2.0).round() as u32 % 180) as u8,
        s.round().clamp(0.0, 255.0) as u8,
        v as u8,
    ]
}

/// OpenCV `COLOR_HSV2RGB` for 8-bit images (inverse of [`rgb_to_hsv8`]).
pub fn hsv8_to_rgb(hsv: [u8; 3]) -> [u8; 3] {
    let h = hsv[0] as f64 * 2.0;
    let s = hsv[1] as f64 / 255.0;
    let v = hsv[2] as f64;
    let c = v * s;
    let hp = (h / 60.0) % 6.0;
    let x = c * (1.0 - ((hp % 2.0) - 1.0).abs());
    let (r, g, b) = super::image::hue_sector(hp as u32, c, x, 0.0);
    let m = v - c;
    [r + m, g + m, b + m].map(|u| u.round().clamp(0.0, 255.0) as u8)
}

/// Official `mixup`: blends two images with ratio `r ~ Beta(32, 32)` (`im·r + im2·(1−r)`,
/// truncated to u8) and concatenates their boxes.
pub fn mixup<R: Rng>(
    a: (RgbImage, Vec<PixelBox>),
    b: (RgbImage, Vec<PixelBox>),
    rng: &mut R,
) -> (RgbImage, Vec<PixelBox>) {
    let r: f64 = Beta::new(32.0, 32.0).map(|d| d.sample(rng)).unwrap_or(0.5);
    let (mut img, mut boxes) = a;
    let dst: &mut [u8] = &mut img;
    for (p, &q) in dst.iter_mut().zip(b.0.as_raw()) {
        *p = (*p as f64 * r + q as f64 * (1.0 - r)) as u8;
    }
    boxes.extend(b.1);
    (img, boxes)
}

/// The letterbox geometry of official `letterbox(..., auto=False, scaleup=True)` for a `w × h`
/// image into `s × s`: the resized size `(nw, nh)` and the top-left offset `(left, top)`, pixels.
fn letterbox_geometry(w: u32, h: u32, s: u32) -> (u32, u32, i64, i64) {
    let r = (s as f64 / h.max(1) as f64).min(s as f64 / w.max(1) as f64);
    let nw = ((w as f64 * r).round() as u32).clamp(1, s);
    let nh = ((h as f64 * r).round() as u32).clamp(1, s);
    let dw = (s - nw) as f64 / 2.0;
    let dh = (s - nh) as f64 / 2.0;
    (nw, nh, (dw - 0.1).round() as i64, (dh - 0.1).round() as i64)
}

/// The letterboxed image as a tile on an `s × s` canvas without drawing it: the source resized
/// only when its size changes (never for an image already at long side `s`), its placement, and
/// its boxes in output pixels (xyxy).
fn letterbox_tile(src: &SourceImage, s: u32) -> (Option<RgbImage>, Placement, Vec<PixelBox>) {
    let (w, h) = src.image.dimensions();
    let (nw, nh, left, top) = letterbox_geometry(w, h, s);
    let resized = ((nw, nh) != (w, h))
        .then(|| imageops::resize(&src.image, nw, nh, imageops::FilterType::Triangle));
    let place = Placement {
        canvas: [left, top, left + nw as i64, top + nh as i64],
        src: [0, 0],
    };
    let boxes = src
        .labels
        .iter()
        .map(|(cls, l)| PixelBox {
            cls: *cls,
            xyxy: xywhn_to_xyxy(l, nw as f32, nh as f32, left as f32, top as f32),
        })
        .collect();
    (resized, place, boxes)
}

/// Letterboxes to exactly `s × s` (official `letterbox(..., auto=False, scaleup=True)`),
/// returning the image and the boxes moved into it (output pixels, xyxy).
pub fn letterbox_square(src: &SourceImage, s: u32) -> (RgbImage, Vec<PixelBox>) {
    let (resized, place, boxes) = letterbox_tile(src, s);
    let mut out = RgbImage::from_pixel(s, s, Rgb([PAD_GREY; 3]));
    imageops::overlay(
        &mut out,
        resized.as_ref().unwrap_or(&src.image),
        place.canvas[0],
        place.canvas[1],
    );
    (out, boxes)
}

/// One full training sample as the official `__getitem__` with `augment=True`.
///
/// `load(i)` returns dataset image `i` already resized to long side `s` (see
/// [`resize_long_side`]); `n` is the dataset size; `index` the sample. Returns `None` only if
/// `load` fails for the sample itself (the caller skips and counts it).
///
/// The mosaic (or letterbox) and the random affine are rendered as one inverse warp
/// ([`crate::data::warp::warp_tiles`]) and HSV by integer lookups ([`augment_hsv`]): the labels
/// equal [`augment_sample_reference`]'s exactly and each pixel is within 1 grey level of it.
pub fn augment_sample<R, F>(
    cfg: &AugmentConfig,
    s: u32,
    index: usize,
    n: usize,
    load: &F,
    rng: &mut R,
) -> Option<Augmented>
where
    R: Rng,
    F: Fn(usize) -> Option<SourceImage>,
{
    augment_impl(cfg, s, index, n, load, rng, true)
}

/// [`augment_sample`] the straightforward way, in f64: the `2s × 2s` mosaic canvas
/// ([`mosaic4`]), [`warp_affine`] and [`augment_hsv_reference`]. Draws the same random numbers;
/// kept as the reference for tests and benchmarks.
pub fn augment_sample_reference<R, F>(
    cfg: &AugmentConfig,
    s: u32,
    index: usize,
    n: usize,
    load: &F,
    rng: &mut R,
) -> Option<Augmented>
where
    R: Rng,
    F: Fn(usize) -> Option<SourceImage>,
{
    augment_impl(cfg, s, index, n, load, rng, false)
}

fn augment_impl<R, F>(
    cfg: &AugmentConfig,
    s: u32,
    index: usize,
    n: usize,
    load: &F,
    rng: &mut R,
    fast: bool,
) -> Option<Augmented>
where
    R: Rng,
    F: Fn(usize) -> Option<SourceImage>,
{
    let use_mosaic = rng.random::<f32>() < cfg.mosaic;
    let (mut img, (boxes, outlines)) = if use_mosaic {
        let first = build_mosaic(cfg, s, index, n, load, rng, fast)?;
        if rng.random::<f32>() < cfg.mixup {
            let j = rng.random_range(0..n);
            match build_mosaic(cfg, s, j, n, load, rng, fast) {
                Some((im2, (b2, o2))) => {
                    let (im1, (b1, o1)) = first;
                    let (img, boxes) = mixup((im1, b1), (im2, b2), rng);
                    let outlines = o1.map(|mut o| {
                        o.extend(o2.unwrap_or_default());
                        o
                    });
                    (img, (boxes, outlines))
                }
                None => first,
            }
        } else {
            first
        }
    } else {
        let src = load(index)?;
        let (resized, place, boxes) = letterbox_tile(&src, s);
        let [left, top, right, bottom] = place.canvas;
        let objects = (
            boxes,
            (!src.outlines.is_empty()).then(|| {
                let (nw, nh) = ((right - left) as f32, (bottom - top) as f32);
                outlines_px(&src, nw, nh, (left as f32, top as f32))
            }),
        );
        let (m, sc) = random_affine(cfg, s, s, 0, rng);
        let img = if fast {
            let tile = CanvasTile {
                image: resized.as_ref().unwrap_or(&src.image),
                place,
            };
            let mut out = RgbImage::new(s, s);
            warp_tiles(&[tile], &m, &mut out);
            out
        } else {
            let (lb, _) = letterbox_square(&src, s);
            warp_affine(&lb, &m, s, s)
        };
        (img, warp_objects(&objects, &m, sc, s, s))
    };
    if fast {
        augment_hsv(&mut img, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v, rng);
    } else {
        augment_hsv_reference(&mut img, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v, rng);
    }
    let (w, h) = (img.width() as f32, img.height() as f32);
    let mut labels: Vec<(u32, [f32; 4])> = boxes
        .iter()
        .map(|b| (b.cls, xyxy_to_xywhn(&b.xyxy, w, h)))
        .collect();
    let mut flipped = [false; 2];
    if rng.random::<f32>() < cfg.flipud {
        imageops::flip_vertical_in_place(&mut img);
        for l in &mut labels {
            l.1[1] = 1.0 - l.1[1];
        }
        flipped[0] = true;
    }
    if rng.random::<f32>() < cfg.fliplr {
        imageops::flip_horizontal_in_place(&mut img);
        for l in &mut labels {
            l.1[0] = 1.0 - l.1[0];
        }
        flipped[1] = true;
    }
    Some(Augmented {
        image: img,
        labels,
        outlines: outlines.unwrap_or_default(),
        flipped,
    })
}

/// The outlines of four mosaic tiles on the `2s × 2s` canvas (official `load_mosaic`:
/// `xyn2xy(segment, w, h, padw, padh)`, clipped to `[0, 2s]`), in the order of
/// [`mosaic_boxes`]; `None` when no tile has outlines (a detection dataset).
pub fn mosaic_outlines(
    images: [&SourceImage; 4],
    places: &[Placement; 4],
    s: u32,
) -> Option<Vec<Vec<[f64; 2]>>> {
    if images.iter().all(|i| i.outlines.is_empty()) {
        return None;
    }
    let s2 = 2.0 * s as f64;
    let mut out = Vec::new();
    for (src, p) in images.iter().zip(places) {
        let (w, h) = (src.image.width() as f32, src.image.height() as f32);
        let (padw, padh) = p.offset();
        for mut o in outlines_px(src, w, h, (padw as f32, padh as f32)) {
            for q in &mut o {
                *q = q.map(|v| v.clamp(0.0, s2));
            }
            out.push(o);
        }
    }
    Some(out)
}

fn build_mosaic<R, F>(
    cfg: &AugmentConfig,
    s: u32,
    index: usize,
    n: usize,
    load: &F,
    rng: &mut R,
    fast: bool,
) -> Option<(RgbImage, Objects)>
where
    R: Rng,
    F: Fn(usize) -> Option<SourceImage>,
{
    let border = -(s as i64) / 2;
    let lo = -border;
    let hi = 2 * s as i64 + border;
    let yc = rng.random_range(lo..hi);
    let xc = rng.random_range(lo..hi);
    let mut idx = [index, 0, 0, 0];
    for v in idx.iter_mut().skip(1) {
        *v = rng.random_range(0..n);
    }
    // Shuffle the four tiles (official: random.shuffle).
    for i in (1..4).rev() {
        let j = rng.random_range(0..=i);
        idx.swap(i, j);
    }
    let main = load(index)?;
    // A tile other than the sample itself that fails to load is replaced by the sample.
    let others: Vec<Option<SourceImage>> = idx
        .iter()
        .map(|&i| if i == index { None } else { load(i) })
        .collect();
    let tiles: [&SourceImage; 4] = std::array::from_fn(|k| others[k].as_ref().unwrap_or(&main));
    let places = mosaic_placements(tiles.map(|t| t.image.dimensions()), s, (xc, yc));
    let outlines = mosaic_outlines(tiles, &places, s);
    if !fast {
        let (canvas, boxes) = mosaic4(tiles, s, (xc, yc));
        let (m, sc) = random_affine(cfg, 2 * s, 2 * s, border, rng);
        let img = warp_affine(&canvas, &m, s, s);
        return Some((img, warp_objects(&(boxes, outlines), &m, sc, s, s)));
    }
    // Drawn after the mosaic is laid out, as in the reference.
    let (m, sc) = random_affine(cfg, 2 * s, 2 * s, border, rng);
    let boxes = mosaic_boxes(tiles, &places, s);
    let canvas_tiles: [CanvasTile; 4] = std::array::from_fn(|k| CanvasTile {
        image: &tiles[k].image,
        place: places[k],
    });
    let mut img = RgbImage::new(s, s);
    warp_tiles(&canvas_tiles, &m, &mut img);
    Some((img, warp_objects(&(boxes, outlines), &m, sc, s, s)))
}
