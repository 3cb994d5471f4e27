//! Letterbox: resize keeping the aspect ratio, then pad to a stride multiple with grey 114.
//!
//! Follows the official `utils/augmentations.py letterbox` (WongKinYiu/yolov9) as called by
//! `detect_dual.py` (`auto=True`, `scaleup=True`):
//!
//! * `r = min(new_h / h, new_w / w)` (f64), `new_unpad = (round(w r), round(h r))` with Python's
//!   round-half-to-even;
//! * `auto`: the padding is only what is needed to reach a multiple of the stride,
//!   `dw = (new_w - unpad_w) mod stride` (same for `dh`); otherwise it pads up to `new_shape`;
//! * the padding is split `left = round(dw/2 - 0.1)`, `right = round(dw/2 + 0.1)` (same for
//!   top/bottom), so an odd padding puts the extra pixel on the right/bottom;
//! * the resize is OpenCV's `INTER_LINEAR` (half-pixel centres, edge clamping), reproduced here in
//!   its 11-bit fixed-point form, see [`resize_bilinear`];
//! * the pad value is (114, 114, 114).
//!
//! One deviation: a side that would round to 0 pixels (e.g. a 1x10000 strip) is kept at 1 pixel;
//! OpenCV would raise an error there.
use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use image::RgbImage;

/// The network stride used for letterbox padding and size rounding.
pub const STRIDE: u32 = 32;

/// Rounds an image size up to a multiple of [`STRIDE`] (official `check_img_size`); returns
/// `None` for 0.
pub fn round_img_size(size: u32) -> Option<u32> {
    if size == 0 {
        return None;
    }
    size.checked_add(STRIDE - 1).map(|s| s / STRIDE * STRIDE)
}

/// The `--img` actually used (next multiple of 32) and the notice to print when it changed.
pub fn effective_img(img: u32) -> (u32, Option<String>) {
    let r = round_img_size(img).unwrap_or(32);
    let note = (r != img)
        .then(|| format!("note: --img {img} is not a multiple of the stride 32; using --img {r}"));
    (r, note)
}

/// Grey level of the letterbox padding (official value).
pub const PAD_VALUE: u8 = 114;

/// Geometry of one letterbox: how an original `orig_w x orig_h` image maps into the network
/// input `out_w x out_h` (all in pixels).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LetterboxInfo {
    /// Original (upright) image width in pixels.
    pub orig_w: u32,
    /// Original image height in pixels.
    pub orig_h: u32,
    /// Resize ratio `r` (same for x and y), new pixels per original pixel.
    pub ratio: f64,
    /// Resized width before padding, `round(orig_w * r)`.
    pub unpad_w: u32,
    /// Resized height before padding.
    pub unpad_h: u32,
    /// Grey columns added on the left.
    pub left: u32,
    /// Grey columns added on the right.
    pub right: u32,
    /// Grey rows added on top.
    pub top: u32,
    /// Grey rows added at the bottom.
    pub bottom: u32,
}

impl LetterboxInfo {
    /// Network input width in pixels (`unpad_w + left + right`).
    pub fn out_w(&self) -> u32 {
        self.unpad_w + self.left + self.right
    }
    /// Network input height in pixels.
    pub fn out_h(&self) -> u32 {
        self.unpad_h + self.top + self.bottom
    }
    /// The official `pad = (dw, dh)` per side as floats (`dw/2`, `dh/2` before rounding).
    pub fn pad(&self) -> (f64, f64) {
        (
            f64::from(self.left + self.right) / 2.0,
            f64::from(self.top + self.bottom) / 2.0,
        )
    }
}

/// Python 3 `round()` (half to even) on an f64.
fn py_round(x: f64) -> f64 {
    x.round_ties_even()
}

/// Computes the letterbox geometry of an `orig_w x orig_h` image for a target `new_h x new_w`
/// (`detect` passes `--img` for both), `stride` 32 for YOLOv9, `auto` = minimal stride padding.
///
/// Errors: a zero image or target dimension, or a zero stride.
pub fn letterbox_info(
    orig_w: u32,
    orig_h: u32,
    new_h: u32,
    new_w: u32,
    stride: u32,
    auto: bool,
) -> Result<LetterboxInfo> {
    letterbox_info_scaled(orig_w, orig_h, new_h, new_w, stride, auto, true)
}

/// [`letterbox_info`] with the official `scaleup` switch: with `scaleup = false` (validation,
/// `val_dual.py`) the ratio is capped at 1, so small images are padded but never enlarged.
pub fn letterbox_info_scaled(
    orig_w: u32,
    orig_h: u32,
    new_h: u32,
    new_w: u32,
    stride: u32,
    auto: bool,
    scaleup: bool,
) -> Result<LetterboxInfo> {
    if orig_w == 0 || orig_h == 0 || new_w == 0 || new_h == 0 || stride == 0 {
        bail!(
            "letterbox of a {orig_w}x{orig_h} image to {new_w}x{new_h} (stride {stride}): every \
             dimension and the stride must be positive"
        );
    }
    let mut r = (f64::from(new_h) / f64::from(orig_h)).min(f64::from(new_w) / f64::from(orig_w));
    if !scaleup {
        r = r.min(1.0);
    }
    let unpad_w = (py_round(f64::from(orig_w) * r) as u32).clamp(1, new_w);
    let unpad_h = (py_round(f64::from(orig_h) * r) as u32).clamp(1, new_h);
    let (mut dw, mut dh) = (new_w - unpad_w, new_h - unpad_h);
    if auto {
        dw %= stride;
        dh %= stride;
    }
    let (hw, hh) = (f64::from(dw) / 2.0, f64::from(dh) / 2.0);
    Ok(LetterboxInfo {
        orig_w,
        orig_h,
        ratio: r,
        unpad_w,
        unpad_h,
        left: py_round(hw - 0.1) as u32,
        right: py_round(hw + 0.1) as u32,
        top: py_round(hh - 0.1) as u32,
        bottom: py_round(hh + 0.1) as u32,
    })
}

/// Letterboxes `img` to `new_size x new_size` with the official detect settings (`auto=True`,
/// stride padding). Returns the padded RGB image (`info.out_w() x info.out_h()`) and its
/// geometry.
pub fn letterbox(img: &RgbImage, new_size: u32, stride: u32) -> Result<(RgbImage, LetterboxInfo)> {
    let info = letterbox_info(img.width(), img.height(), new_size, new_size, stride, true)?;
    Ok((apply_letterbox(img, &info), info))
}

/// Builds the padded image described by `info` from `img` (which must be `orig_w x orig_h`).
pub fn apply_letterbox(img: &RgbImage, info: &LetterboxInfo) -> RgbImage {
    let mut out = RgbImage::from_pixel(info.out_w(), info.out_h(), image::Rgb([PAD_VALUE; 3]));
    let resized;
    let src = if img.width() == info.unpad_w && img.height() == info.unpad_h {
        img
    } else {
        resized = resize_bilinear(img, info.unpad_w, info.unpad_h);
        &resized
    };
    let (ow, sw) = (info.out_w() as usize * 3, info.unpad_w as usize * 3);
    let dst = out.as_mut();
    for y in 0..info.unpad_h as usize {
        let d0 = (y + info.top as usize) * ow + info.left as usize * 3;
        dst[d0..d0 + sw].copy_from_slice(&src.as_raw()[y * sw..(y + 1) * sw]);
    }
    out
}

const COEF_BITS: u32 = 11;
const COEF_SCALE: f32 = (1 << COEF_BITS) as f32;

/// Source index and the two fixed-point weights (sum ≈ 2048) of each destination coordinate,
/// OpenCV `INTER_LINEAR` style: `f = (d + 0.5) * scale - 0.5` in f32, clamped at both edges.
fn taps(src_len: u32, dst_len: u32) -> Vec<(usize, usize, i32, i32)> {
    let scale = 1.0 / (f64::from(dst_len) / f64::from(src_len));
    (0..dst_len)
        .map(|d| {
            let f = ((f64::from(d) + 0.5) * scale - 0.5) as f32;
            let mut s = f.floor() as i64;
            let mut frac = f - s as f32;
            if s < 0 {
                s = 0;
                frac = 0.0;
            }
            if s >= i64::from(src_len) - 1 {
                s = i64::from(src_len) - 1;
                frac = 0.0;
            }
            let s = s as usize;
            let s1 = (s + 1).min(src_len as usize - 1);
            let a0 = ((1.0 - frac) * COEF_SCALE).round() as i32;
            let a1 = (frac * COEF_SCALE).round() as i32;
            (s, s1, a0, a1)
        })
        .collect()
}

/// Bilinear resize of an RGB8 image, reproducing OpenCV's `cv2.resize(..., INTER_LINEAR)` for
/// 8-bit images: half-pixel-centre mapping, edge clamping, 11-bit fixed-point weights, and the
/// x86 SIMD vertical pass `((s0>>4)*b0 >> 16) + ((s1>>4)*b1 >> 16) + 2 >> 2`.
/// Only the source rows that are needed are read (a 108 MP input costs two row buffers).
/// `new_w` and `new_h` must be positive.
pub fn resize_bilinear(img: &RgbImage, new_w: u32, new_h: u32) -> RgbImage {
    let (w, h) = img.dimensions();
    let xt = taps(w, new_w);
    let yt = taps(h, new_h);
    let src = img.as_raw();
    let row_len = w as usize * 3;
    let hresize = |row: usize, buf: &mut Vec<i32>| {
        buf.clear();
        let r = &src[row * row_len..(row + 1) * row_len];
        for &(s0, s1, a0, a1) in &xt {
            for c in 0..3 {
                buf.push(i32::from(r[s0 * 3 + c]) * a0 + i32::from(r[s1 * 3 + c]) * a1);
            }
        }
    };
    let mut out = RgbImage::new(new_w, new_h);
    let (mut b0, mut b1) = (Vec::new(), Vec::new());
    let (mut r0, mut r1) = (usize::MAX, usize::MAX);
    let dst = out.as_mut();
    let out_row = new_w as usize * 3;
    for (y, &(sy0, sy1, c0, c1)) in yt.iter().enumerate() {
        if r0 != sy0 {
            if r1 == sy0 {
                std::mem::swap(&mut b0, &mut b1);
                std::mem::swap(&mut r0, &mut r1);
            } else {
                hresize(sy0, &mut b0);
                r0 = sy0;
            }
        }
        if r1 != sy1 {
            hresize(sy1, &mut b1);
            r1 = sy1;
        }
        let d = &mut dst[y * out_row..(y + 1) * out_row];
        for (i, px) in d.iter_mut().enumerate() {
            let v = (((b0[i] >> 4) * c0) >> 16) + (((b1[i] >> 4) * c1) >> 16) + 2;
            *px = (v >> 2).clamp(0, 255) as u8;
        }
    }
    out
}

/// Stacks same-sized letterboxed images into the network input: a `(B, 3, H, W)` f32 tensor of
/// RGB values `u8 / 255` (0..1), on `device`. On a CUDA device the bytes are uploaded as they
/// are (a quarter of the f32 planes; through pinned memory with the `cuda` feature) and the
/// device divides and moves the channels first: the same values (an IEEE division by 255 either
/// way).
///
/// Errors: an empty slice, or images of different sizes.
pub fn to_tensor(imgs: &[&RgbImage], device: &Device) -> Result<Tensor> {
    let Some(first) = imgs.first() else {
        bail!("to_tensor: no images");
    };
    let (w, h) = first.dimensions();
    for (b, img) in imgs.iter().enumerate() {
        if img.dimensions() != (w, h) {
            bail!(
                "to_tensor: image {b} is {}x{}, expected {w}x{h} like image 0",
                img.width(),
                img.height()
            );
        }
    }
    if device.is_cuda() {
        let shape = (imgs.len(), h as usize, w as usize, 3);
        #[cfg(feature = "cuda")]
        {
            // Each image copied once, into the pinned staging memory; then one launch: cast,
            // / 255 and transposition.
            let parts: Vec<&[u8]> = imgs.iter().map(|img| img.as_raw().as_slice()).collect();
            let x = crate::cuda::upload::upload_u8_parts(&parts, shape, device)?;
            return Ok(crate::cuda::layout::images_to_nchw_f32(&x)?);
        }
        #[cfg(not(feature = "cuda"))]
        {
            let mut bytes = Vec::with_capacity(imgs.len() * first.as_raw().len());
            for img in imgs {
                bytes.extend_from_slice(img.as_raw());
            }
            let x = Tensor::from_vec(bytes, shape, device)?;
            // 255 made on the device (no upload, no stream synchronization).
            let d = Tensor::ones((), candle_core::DType::F32, device)?.affine(255.0, 0.0)?;
            let x = x.to_dtype(candle_core::DType::F32)?.broadcast_div(&d)?;
            return Ok(x.permute((0, 3, 1, 2))?.contiguous()?);
        }
    }
    let plane = (w * h) as usize;
    let mut data = vec![0f32; imgs.len() * 3 * plane];
    for (b, img) in imgs.iter().enumerate() {
        let base = b * 3 * plane;
        for (i, px) in img.as_raw().chunks_exact(3).enumerate() {
            for c in 0..3 {
                data[base + c * plane + i] = f32::from(px[c]) / 255.0;
            }
        }
    }
    Ok(Tensor::from_vec(
        data,
        (imgs.len(), 3, h as usize, w as usize),
        device,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horses_geometry() {
        let i = letterbox_info(773, 512, 640, 640, 32, true).unwrap();
        assert_eq!((i.unpad_w, i.unpad_h), (640, 424));
        assert_eq!((i.top, i.bottom, i.left, i.right), (12, 12, 0, 0));
        assert_eq!((i.out_w(), i.out_h()), (640, 448));
        assert!((i.ratio - 0.8279430789133247).abs() < 1e-15);
    }

    #[test]
    fn odd_padding_goes_right_and_bottom() {
        // 4000x20: r = 0.16, unpad 640x3, dh = 637 % 32 = 29 -> 14 top, 15 bottom.
        let i = letterbox_info(4000, 20, 640, 640, 32, true).unwrap();
        assert_eq!((i.unpad_w, i.unpad_h, i.top, i.bottom), (640, 3, 14, 15));
        assert_eq!(i.out_h(), 32);
        // 1x1 upscales to the full square.
        let i = letterbox_info(1, 1, 640, 640, 32, true).unwrap();
        assert_eq!((i.out_w(), i.out_h(), i.left, i.top), (640, 640, 0, 0));
        // 1x100000 would round to 0 px wide: kept at 1.
        let i = letterbox_info(1, 100_000, 640, 640, 32, true).unwrap();
        assert_eq!((i.unpad_w, i.out_w() % 32), (1, 0));
    }

    #[test]
    fn resize_identity_and_constant() {
        let img = RgbImage::from_fn(7, 5, |x, y| image::Rgb([x as u8 * 30, y as u8 * 40, 9]));
        assert_eq!(resize_bilinear(&img, 7, 5), img);
        let c = RgbImage::from_pixel(13, 11, image::Rgb([200, 3, 77]));
        let r = resize_bilinear(&c, 29, 4);
        assert!(r.pixels().all(|p| p.0 == [200, 3, 77]));
    }
}
