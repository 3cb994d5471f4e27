//! Annotated images: one box outline per detection plus a filled label `name 0.87`, and a
//! translucent class-coloured fill for a detection with a mask (segmentation models).
//!
//! The label font is DejaVu Sans Mono Bold (Bitstream Vera licence, permissive; the licence text
//! is `assets/fonts/LICENSE-DejaVu.txt`), embedded in the binary with `include_bytes!`.
//!
//! **Huge inputs** ([`DRAW_MAX_SIDE`]): the annotated image of an input whose longer side exceeds
//! 4096 px is drawn on a copy downscaled to 4096 px on the longer side (boxes scaled alike), so
//! `yolo9 detect` never keeps a second full-resolution copy of a 100-MP photo. Detections,
//! labels and JSON are always in original pixels.
use crate::detect::detector::Detection;
use ab_glyph::{FontRef, PxScale};
use anyhow::{Context, Result};
use image::{Rgb, RgbImage};
use imageproc::rect::Rect;

/// The embedded label font.
static FONT_BYTES: &[u8] = include_bytes!("../../assets/fonts/DejaVuSansMono-Bold.ttf");

/// Longest side of a saved annotated image; larger inputs are drawn on a downscaled copy.
pub const DRAW_MAX_SIDE: u32 = 4096;

/// Box outline width of the official detect, pixels.
pub const DEFAULT_LINE_THICKNESS: u32 = 3;

/// Drawing options (official `--line-thickness`, `--hide-labels`, `--hide-conf`; `yolo9 detect`
/// derives these flags from this struct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct DrawOptions {
    /// Box line thickness in pixels (1..=100).
    #[cfg_attr(feature = "cli", arg(long = "line-thickness",
        default_value_t = DEFAULT_LINE_THICKNESS,
        value_parser = clap::value_parser!(u32).range(1..=100)))]
    pub line_thickness: u32,
    /// Do not draw labels (boxes only).
    #[cfg_attr(feature = "cli", arg(long = "hide-labels"))]
    pub hide_labels: bool,
    /// Do not draw confidences.
    #[cfg_attr(feature = "cli", arg(long = "hide-conf"))]
    pub hide_conf: bool,
}

impl Default for DrawOptions {
    fn default() -> Self {
        Self {
            line_thickness: DEFAULT_LINE_THICKNESS,
            hide_labels: false,
            hide_conf: false,
        }
    }
}

/// A distinct, stable colour per class id (golden-ratio hue walk, full saturation).
pub fn class_color(class_id: usize) -> Rgb<u8> {
    let h = (class_id as f32 * 0.618_034 + 0.05).fract() * 6.0;
    let (s, v) = (0.85f32, 0.95f32);
    let c = v * s;
    let x = c * (1.0 - ((h % 2.0) - 1.0).abs());
    let (r, g, b) = crate::data::image::hue_sector(h as u32, c, x, 0.0);
    let m = v - c;
    let to = |f: f32| ((f + m) * 255.0).round() as u8;
    Rgb([to(r), to(g), to(b)])
}

/// The scale factor (≤ 1) applied before drawing an image of `w x h` pixels.
pub fn draw_scale(w: u32, h: u32) -> f64 {
    let m = w.max(h);
    if m > DRAW_MAX_SIDE {
        f64::from(DRAW_MAX_SIDE) / f64::from(m)
    } else {
        1.0
    }
}

/// Returns the canvas to draw `img` on: `img` itself, or a copy scaled by [`draw_scale`]
/// (area averaging, `image::imageops::thumbnail`, no full-size intermediate buffer) when it is
/// larger than [`DRAW_MAX_SIDE`]. The original is dropped.
pub fn canvas_for(img: RgbImage) -> (RgbImage, f64) {
    let s = draw_scale(img.width(), img.height());
    if s >= 1.0 {
        return (img, 1.0);
    }
    let w = ((f64::from(img.width()) * s).round() as u32).max(1);
    let h = ((f64::from(img.height()) * s).round() as u32).max(1);
    let small = image::imageops::thumbnail(&img, w, h);
    (small, s)
}

/// Mask opacity (official `Annotator.masks(alpha=0.5)`).
pub const MASK_ALPHA: f32 = 0.5;

/// Blends `color` at [`MASK_ALPHA`] into the pixels of `canvas` covered by `m` (original
/// pixels times `scale` = canvas pixels; each canvas pixel takes the mask bit at its centre).
pub fn fill_mask(
    canvas: &mut RgbImage,
    m: &crate::detect::masks::Mask,
    color: Rgb<u8>,
    scale: f64,
) {
    let (cw, ch) = (canvas.width(), canvas.height());
    let s = scale.max(1e-9);
    let x0 = (f64::from(m.x) * s).floor() as u32;
    let y0 = (f64::from(m.y) * s).floor() as u32;
    let x1 = ((f64::from(m.x + m.width) * s).ceil() as u32).min(cw);
    let y1 = ((f64::from(m.y + m.height) * s).ceil() as u32).min(ch);
    for cy in y0..y1 {
        let oy = ((f64::from(cy) + 0.5) / s) as u32;
        for cx in x0..x1 {
            let ox = ((f64::from(cx) + 0.5) / s) as u32;
            if m.contains(ox, oy) {
                let p = canvas.get_pixel_mut(cx, cy);
                for k in 0..3 {
                    let v = f32::from(p[k]) * (1.0 - MASK_ALPHA) + f32::from(color[k]) * MASK_ALPHA;
                    p[k] = v.round().clamp(0.0, 255.0) as u8;
                }
            }
        }
    }
}

/// Draws `dets` (boxes in original pixels, multiplied by `scale` to reach `canvas` pixels) on
/// `canvas` in place.
pub fn draw_detections(
    canvas: &mut RgbImage,
    dets: &[Detection],
    scale: f64,
    opts: &DrawOptions,
) -> Result<()> {
    let font = FontRef::try_from_slice(FONT_BYTES).context("embedded font is corrupt")?;
    let (cw, ch) = (canvas.width() as i32, canvas.height() as i32);
    if cw == 0 || ch == 0 {
        return Ok(());
    }
    for d in dets {
        if let Some(m) = &d.mask {
            fill_mask(canvas, m, class_color(d.class_id), scale);
        }
    }
    let lt = opts.line_thickness.max(1) as i32;
    let font_px = (lt as f32 * 5.0 + 6.0).max(10.0);
    for d in dets {
        let color = class_color(d.class_id);
        let s = scale as f32;
        let x1 = ((d.bbox[0] * s).round() as i32).clamp(0, cw - 1);
        let y1 = ((d.bbox[1] * s).round() as i32).clamp(0, ch - 1);
        let x2 = ((d.bbox[2] * s).round() as i32).clamp(0, cw - 1);
        let y2 = ((d.bbox[3] * s).round() as i32).clamp(0, ch - 1);
        for k in 0..lt {
            let (a, b) = (x1 + k, y1 + k);
            let (w, h) = (x2 - x1 - 2 * k + 1, y2 - y1 - 2 * k + 1);
            if w <= 0 || h <= 0 {
                break;
            }
            imageproc::drawing::draw_hollow_rect_mut(
                canvas,
                Rect::at(a, b).of_size(w as u32, h as u32),
                color,
            );
        }
        if opts.hide_labels {
            continue;
        }
        let label = if opts.hide_conf {
            d.class_name.clone()
        } else {
            format!("{} {:.2}", d.class_name, d.confidence)
        };
        let scale_px = PxScale::from(font_px);
        let (tw, th) = imageproc::drawing::text_size(scale_px, &font, &label);
        let (tw, th) = (tw as i32 + 4, th as i32 + 4);
        // Label above the box when it fits, else inside its top edge.
        let ty = if y1 - th >= 0 { y1 - th } else { y1 };
        let tx = x1.min((cw - tw).max(0));
        imageproc::drawing::draw_filled_rect_mut(
            canvas,
            Rect::at(tx, ty).of_size(tw.max(1) as u32, th.max(1) as u32),
            color,
        );
        imageproc::drawing::draw_text_mut(
            canvas,
            Rgb([255, 255, 255]),
            tx + 2,
            ty + 1,
            scale_px,
            &font,
            &label,
        );
    }
    Ok(())
}

/// The crop of one detection as the official `save_one_box(xyxy, im, gain=1.02, pad=10)`: the box
/// widened about its centre to `w * 1.02 + 10` by `h * 1.02 + 10` pixels, the corners truncated
/// to integers and clipped to the image. `None` when nothing is left after clipping.
pub fn crop_box(img: &RgbImage, bbox: [f32; 4]) -> Option<RgbImage> {
    let (cx, cy) = ((bbox[0] + bbox[2]) / 2.0, (bbox[1] + bbox[3]) / 2.0);
    let w = (bbox[2] - bbox[0]) * 1.02 + 10.0;
    let h = (bbox[3] - bbox[1]) * 1.02 + 10.0;
    let clip = |v: f32, hi: u32| (v.trunc().max(0.0) as u32).min(hi);
    let (x1, x2) = (
        clip(cx - w / 2.0, img.width()),
        clip(cx + w / 2.0, img.width()),
    );
    let (y1, y2) = (
        clip(cy - h / 2.0, img.height()),
        clip(cy + h / 2.0, img.height()),
    );
    (x2 > x1 && y2 > y1)
        .then(|| image::imageops::crop_imm(img, x1, y1, x2 - x1, y2 - y1).to_image())
}
