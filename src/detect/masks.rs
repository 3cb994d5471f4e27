//! Instance masks of a segmentation model (official `utils/segment/general.py`): the mask of
//! a detection is `sigmoid(coefficients · prototypes)`, cropped to its box, upsampled
//! (bilinear, `align_corners=False`) and thresholded at 0.5 (`process_mask(..., upsample=True)`),
//! then taken back to the original image (`scale_image`), and its outline is the largest outer
//! contour (`masks2segments(strategy='largest')`, `cv2.CHAIN_APPROX_SIMPLE`).
//!
//! Where yolo9 differs, on purpose: the mask is computed once, directly at each original pixel
//! inside the detection's box (the two bilinear resizes of the official code — prototypes →
//! letterbox input, input → original image — composed into one sample of the prototypes), so an
//! instance costs its box's pixels and the outline is traced at the original resolution rather
//! than at the input's. Masks equal the official ones but for pixels on the 0.5 boundary.

use super::letterbox::LetterboxInfo;
use crate::data::outline::largest_outline;

/// The mask of one detected instance, in original-image pixels.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Mask {
    /// Left column of the mask's window (the detection's box, rounded outwards).
    #[serde(skip)]
    pub x: u32,
    /// Top row of the window.
    #[serde(skip)]
    pub y: u32,
    /// Window width in pixels.
    #[serde(skip)]
    pub width: u32,
    /// Window height in pixels.
    #[serde(skip)]
    pub height: u32,
    /// Row-major `width × height` bits, 1 = the instance.
    #[serde(skip)]
    pub bits: Vec<u8>,
    /// Outline of the mask's largest part, `[x, y]` in original-image pixels (vertex
    /// coordinates: pixel `(i, j)` spans `i..i+1`), clockwise in image coordinates; empty when
    /// the mask is empty. What `--save-txt` writes (normalized) and JSON carries.
    pub polygon: Vec<[f32; 2]>,
}

impl Mask {
    /// Whether original pixel `(x, y)` belongs to the instance.
    pub fn contains(&self, x: u32, y: u32) -> bool {
        x >= self.x
            && y >= self.y
            && x - self.x < self.width
            && y - self.y < self.height
            && self.bits[((y - self.y) * self.width + (x - self.x)) as usize] != 0
    }

    /// Pixels of the instance.
    pub fn area(&self) -> usize {
        self.bits.iter().filter(|&&b| b != 0).count()
    }

    /// The mask moved right by `dx` and down by `dy` pixels (a tile's mask into the pixels of
    /// the image the tile was cut from, [`crate::detect::tile`]).
    pub fn shifted(mut self, dx: u32, dy: u32) -> Self {
        self.x += dx;
        self.y += dy;
        for p in &mut self.polygon {
            p[0] += dx as f32;
            p[1] += dy as f32;
        }
        self
    }

    /// The union of `parts` (masks in the pixels of one image) inside the box `b`
    /// `[x1, y1, x2, y2]` (pixels, rounded outwards and clipped to the `w × h` image), as the
    /// instance mask of a box merged from tile pieces ([`crate::detect::tile::merge_groups`]):
    /// the pieces' bits, cropped to the merged box as [`instance_mask`] crops to a detection's
    /// box, and the outline of the union's largest part.
    pub fn union(parts: &[&Mask], b: [f32; 4], (w, h): (u32, u32)) -> Mask {
        let (x, y, width, height) = window(b, (w, h));
        let mut bits = vec![0u8; (width as usize) * (height as usize)];
        for m in parts {
            // The rows and columns where the part and the window meet.
            let (c0, c1) = (m.x.max(x), (m.x + m.width).min(x + width));
            let (r0, r1) = (m.y.max(y), (m.y + m.height).min(y + height));
            for r in r0..r1 {
                let src = ((r - m.y) * m.width) as usize;
                let dst = ((r - y) * width) as usize;
                for c in c0..c1 {
                    bits[dst + (c - x) as usize] |= m.bits[src + (c - m.x) as usize];
                }
            }
        }
        Mask::from_bits(x, y, width, height, bits)
    }

    /// The mask of `bits` (row-major `width × height`, 1 = the instance) whose window starts at
    /// original pixel `(x, y)`, with the outline of its largest part in original pixels.
    fn from_bits(x: u32, y: u32, width: u32, height: u32, bits: Vec<u8>) -> Mask {
        let polygon = largest_outline(&bits, width as usize, height as usize)
            .into_iter()
            .map(|[px, py]| [px as f32 + x as f32, py as f32 + y as f32])
            .collect();
        Mask {
            x,
            y,
            width,
            height,
            bits,
            polygon,
        }
    }
}

/// The window `(x, y, width, height)` of a box `b` `[x1, y1, x2, y2]` in original pixels: rounded
/// outwards and clipped to the `w × h` image.
fn window(b: [f32; 4], (w, h): (u32, u32)) -> (u32, u32, u32, u32) {
    let x = b[0].floor().max(0.0) as u32;
    let y = b[1].floor().max(0.0) as u32;
    let x2 = (b[2].ceil().max(0.0) as u32).min(w);
    let y2 = (b[3].ceil().max(0.0) as u32).min(h);
    (x, y, x2.saturating_sub(x), y2.saturating_sub(y))
}

/// The prototypes of one image: `nm` maps of `h × w`, row-major f32 (`proto[b]` of
/// [`crate::model::YoloV9::forward_seg`]).
#[derive(Debug, Clone, Copy)]
pub struct Protos<'a> {
    /// `nm · h · w` values.
    pub data: &'a [f32],
    /// Number of prototypes.
    pub nm: usize,
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
}

/// The mask of one detection: `coeffs` (nm raw coefficients), `box_in` its box
/// `[x1, y1, x2, y2]` in letterbox-input pixels (before scaling, what NMS kept), `box_orig` the
/// same box in original pixels (clipped), `info` the letterbox of the image.
pub fn instance_mask(
    protos: Protos,
    coeffs: &[f32],
    box_in: [f32; 4],
    box_orig: [f32; 4],
    info: &LetterboxInfo,
) -> Mask {
    let (ih, iw) = (info.out_h() as f32, info.out_w() as f32);
    let (sx, sy) = (protos.w as f32 / iw, protos.h as f32 / ih);
    // The official crop_mask keeps prototype pixels (c, r) with x1 <= c < x2, y1 <= r < y2 of
    // the box scaled to prototype pixels.
    let crop = [
        box_in[0] * sx,
        box_in[1] * sy,
        box_in[2] * sx,
        box_in[3] * sy,
    ];
    let c0 = (crop[0].floor().max(0.0) as usize).saturating_sub(1);
    let r0 = (crop[1].floor().max(0.0) as usize).saturating_sub(1);
    let c1 = ((crop[2].ceil().max(0.0) as usize) + 1).min(protos.w);
    let r1 = ((crop[3].ceil().max(0.0) as usize) + 1).min(protos.h);
    // Cropped sigmoid mask on the window [r0, r1) × [c0, c1) of the prototypes.
    let (pw, ph) = (c1.saturating_sub(c0), r1.saturating_sub(r0));
    let mut m = vec![0f32; pw * ph];
    let plane = protos.h * protos.w;
    for r in r0..r1 {
        for c in c0..c1 {
            let (fc, fr) = (c as f32, r as f32);
            if fc < crop[0] || fc >= crop[2] || fr < crop[1] || fr >= crop[3] {
                continue;
            }
            let mut z = 0f32;
            for (k, &a) in coeffs.iter().enumerate().take(protos.nm) {
                z += a * protos.data[k * plane + r * protos.w + c];
            }
            m[(r - r0) * pw + (c - c0)] = 1.0 / (1.0 + (-z).exp());
        }
    }
    let sample = |py: f32, px: f32| -> f32 {
        // Bilinear sample of the full prototype grid (zero outside the crop), clamped at the
        // border as F.interpolate(align_corners=False) is.
        let py = py.clamp(0.0, (protos.h - 1) as f32);
        let px = px.clamp(0.0, (protos.w - 1) as f32);
        let (y0, x0) = (py.floor() as usize, px.floor() as usize);
        let (y1, x1) = ((y0 + 1).min(protos.h - 1), (x0 + 1).min(protos.w - 1));
        let (fy, fx) = (py - y0 as f32, px - x0 as f32);
        let at = |y: usize, x: usize| -> f32 {
            if y < r0 || y >= r1 || x < c0 || x >= c1 {
                0.0
            } else {
                m[(y - r0) * pw + (x - c0)]
            }
        };
        (at(y0, x0) * (1.0 - fx) + at(y0, x1) * fx) * (1.0 - fy)
            + (at(y1, x0) * (1.0 - fx) + at(y1, x1) * fx) * fy
    };
    let (x, y, width, height) = window(box_orig, (info.orig_w, info.orig_h));
    let gain = info.ratio as f32;
    let (pad_x, pad_y) = info.pad();
    let (pad_x, pad_y) = (pad_x as f32, pad_y as f32);
    let mut bits = vec![0u8; (width * height) as usize];
    if ph > 0 && pw > 0 {
        for j in 0..height {
            // Original pixel centre → input pixel coordinate → prototype coordinate.
            let u = ((y + j) as f32 + 0.5) * gain + pad_y;
            let py = u * sy - 0.5;
            for i in 0..width {
                let v = ((x + i) as f32 + 0.5) * gain + pad_x;
                let px = v * sx - 0.5;
                if sample(py, px) > 0.5 {
                    bits[(j * width + i) as usize] = 1;
                }
            }
        }
    }
    Mask::from_bits(x, y, width, height, bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_of_two_pieces_cropped_to_the_box() {
        // Two 4x2 pieces side by side at (10, 20) and (14, 20), the second shifted there from
        // (4, 0) of a tile at (10, 20); the box crops the first's leftmost column.
        let piece = |x, bits: Vec<u8>| Mask {
            x,
            y: 0,
            width: 4,
            height: 2,
            bits,
            polygon: Vec::new(),
        };
        let a = piece(0, vec![1, 1, 1, 1, 1, 1, 1, 1]).shifted(10, 20);
        let b = piece(4, vec![1, 1, 0, 0, 1, 0, 0, 0]).shifted(10, 20);
        assert_eq!((a.x, a.y, b.x, b.y), (10, 20, 14, 20));
        let u = Mask::union(&[&a, &b], [11.0, 20.0, 17.5, 21.9], (100, 100));
        assert_eq!((u.x, u.y, u.width, u.height), (11, 20, 7, 2));
        assert_eq!(u.bits, [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0]);
        assert_eq!(u.area(), 9);
        assert!(u.contains(15, 20) && !u.contains(15, 21) && !u.contains(10, 20));
        // The outline (vertex coordinates) spans columns 11..16 and rows 20..22.
        let xs = u.polygon.iter().map(|p| p[0]);
        let ys = u.polygon.iter().map(|p| p[1]);
        assert_eq!(xs.clone().fold(f32::MAX, f32::min), 11.0);
        assert_eq!(xs.fold(0.0, f32::max), 16.0);
        assert_eq!(ys.clone().fold(f32::MAX, f32::min), 20.0);
        assert_eq!(ys.fold(0.0, f32::max), 22.0);
        // A box past the image is clipped to it.
        let u = Mask::union(&[&a], [8.0, 19.0, 200.0, 200.0], (12, 21));
        assert_eq!((u.x, u.y, u.width, u.height), (8, 19, 4, 2));
        assert_eq!(u.bits, [0, 0, 0, 0, 0, 0, 1, 1]);
    }

    #[test]
    fn a_box_shaped_prototype_gives_that_box() {
        // One prototype, 8x8, positive inside columns 2..6 and rows 2..6; coefficient 10: the
        // sigmoid is ~1 there and ~0 elsewhere. Input 32x32 (stride 4), original 64x64
        // (ratio 0.5, no padding). The box covers the whole input.
        let mut p = vec![-1f32; 64];
        for r in 2..6 {
            for c in 2..6 {
                p[r * 8 + c] = 1.0;
            }
        }
        let info = LetterboxInfo {
            orig_w: 64,
            orig_h: 64,
            ratio: 0.5,
            unpad_w: 32,
            unpad_h: 32,
            left: 0,
            right: 0,
            top: 0,
            bottom: 0,
        };
        // The one prototype, coefficient 10, for a box in input and in original pixels.
        let mask_of = |box_in: [f32; 4], box_orig: [f32; 4]| {
            let protos = Protos {
                data: &p,
                nm: 1,
                h: 8,
                w: 8,
            };
            instance_mask(protos, &[10.0], box_in, box_orig, &info)
        };
        let m = mask_of([0.0, 0.0, 32.0, 32.0], [0.0, 0.0, 64.0, 64.0]);
        assert_eq!((m.width, m.height), (64, 64));
        // Prototype cells 2..6 span input 8..24, original 16..48; bilinear at the half-way
        // sample: the 0.5 crossing falls on the cell boundary.
        assert!(m.contains(20, 20) && m.contains(40, 40));
        assert!(!m.contains(10, 30) && !m.contains(54, 30));
        let area = m.area() as i64;
        assert!((area - 32 * 32).abs() <= 32, "area {area}");
        // The outline spans 16..48 both ways (bilinear rounds the corners off).
        let xs = m.polygon.iter().map(|p| p[0]);
        let ys = m.polygon.iter().map(|p| p[1]);
        assert_eq!(xs.clone().fold(f32::MAX, f32::min), 16.0);
        assert_eq!(xs.fold(0.0, f32::max), 48.0);
        assert_eq!(ys.clone().fold(f32::MAX, f32::min), 16.0);
        assert_eq!(ys.fold(0.0, f32::max), 48.0);
        // The box crop: the same prototype with a box over the left half only.
        let half = mask_of([0.0, 0.0, 16.0, 32.0], [0.0, 0.0, 32.0, 64.0]);
        assert!(half.contains(20, 20) && !half.contains(40, 40));
        // Cropped at prototype resolution (columns 0..4), then upsampled: input pixel 15
        // samples cells 3 (kept) and 4 (cropped) at 0.625 (in), pixel 16 at 0.375 (out), so the
        // mask ends with original pixel 31 (input 15.75).
        assert!(half.contains(31, 20) && !half.contains(32, 20));
    }
}
