//! The mosaic and the random affine of training augmentation as **one inverse warp**: every
//! output pixel is mapped through the inverse affine onto the (virtual) mosaic canvas and
//! sampled bilinearly from whichever placed source image covers it, grey 114 elsewhere.
//!
//! This renders exactly what the official `load_mosaic` + `random_perspective` compute
//! (`cv2.warpAffine(img4, M[:2], dsize=(s, s), borderValue=114)`, bilinear, of a `2s × 2s`
//! canvas on which the four images are pasted over grey 114), but without the canvas: the
//! canvas is a plane of grey 114 carrying up to four disjoint rectangles of image, so a canvas
//! pixel is found by testing those rectangles, and outside the canvas the border value is the
//! same grey. A sample whose 2×2 bilinear neighbourhood straddles two tiles (a seam) or a tile
//! and the grey takes each of its four pixels from the right place, so seams blend exactly as on
//! the canvas; there is no edge difference to document.
//!
//! **Speed.** Per output row the inverse-mapped row is a line on the canvas; for each tile the
//! output span whose whole 2×2 neighbourhood lies inside the tile is found once in exact integer
//! arithmetic, and that span is sampled without any per-pixel test. Only the few pixels of a
//! span's ends (seams, tile borders) go through the per-pixel lookup; pixels touching no tile
//! stay grey. When the affine has no rotation or shear (the `hyp.scratch-*` recipes), each row
//! reads two fixed source rows: they are blended vertically into a per-thread buffer (a plain
//! loop the compiler vectorises) and then horizontally through per-column tables.
//!
//! **Precision.** Canvas coordinates are 32.32 fixed point, rounded to 1/2048 pixel; weights are
//! 11-bit and the bilinear sum is exact in integers then rounded to nearest. Against the f64
//! reference ([`crate::data::augment::warp_affine`] of [`crate::data::augment::mosaic4`]'s
//! canvas) a pixel differs by at most 1 grey level (coordinate error ≤ 2⁻¹² px per axis, so
//! ≤ 0.13 level before rounding). OpenCV itself quantizes to 1/32 pixel with 15-bit weights.

use image::RgbImage;
use std::cell::RefCell;

/// Grey used for padding and for the area outside warped images (official 114).
pub const PAD_GREY: u8 = 114;

/// A 2×3 affine matrix `[a b c; d e f]` mapping source pixels to output pixels.
pub type Affine = [[f64; 3]; 2];

/// Where one source image lands on the mosaic canvas (official `load_mosaic`'s
/// `img4[y1a:y2a, x1a:x2a] = img[y1b:y2b, x1b:x2b]`). All in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The canvas region covered, `[x1a, y1a, x2a, y2a)` (canvas pixels, end exclusive).
    pub canvas: [i64; 4],
    /// The source pixel `(x1b, y1b)` drawn at canvas `(x1a, y1a)`.
    pub src: [i64; 2],
}

impl Placement {
    /// Canvas offset of the source image's pixel `(0, 0)`: `(x1a − x1b, y1a − y1b)` (official
    /// `padw, padh`, used to move the labels).
    pub fn offset(&self) -> (i64, i64) {
        (self.canvas[0] - self.src[0], self.canvas[1] - self.src[1])
    }
}

/// One source image and where it lands on the virtual canvas.
#[derive(Debug, Clone, Copy)]
pub struct CanvasTile<'a> {
    /// The source RGB image.
    pub image: &'a RgbImage,
    /// Its placement.
    pub place: Placement,
}

/// The placements of official `load_mosaic` for four images of `sizes` (`w, h` in pixels,
/// already resized to long side `s`) around the centre `(xc, yc)` of the `2s × 2s` canvas:
/// top-left, top-right, bottom-left, bottom-right. Regions are disjoint and may be empty.
pub fn mosaic_placements(sizes: [(u32, u32); 4], s: u32, centre: (i64, i64)) -> [Placement; 4] {
    let s2 = 2 * s as i64;
    let (xc, yc) = centre;
    std::array::from_fn(|i| {
        let (w, h) = (sizes[i].0 as i64, sizes[i].1 as i64);
        let (x1a, y1a, x2a, y2a, x1b, y1b) = match i {
            0 => {
                let (x1a, y1a) = ((xc - w).max(0), (yc - h).max(0));
                (x1a, y1a, xc, yc, w - (xc - x1a), h - (yc - y1a))
            }
            1 => {
                let (y1a, x2a) = ((yc - h).max(0), (xc + w).min(s2));
                (xc, y1a, x2a, yc, 0, h - (yc - y1a))
            }
            2 => {
                let (x1a, y2a) = ((xc - w).max(0), (yc + h).min(s2));
                (x1a, yc, xc, y2a, w - (xc - x1a), 0)
            }
            _ => (xc, yc, (xc + w).min(s2), (yc + h).min(s2), 0, 0),
        };
        Placement {
            canvas: [x1a, y1a, x2a, y2a],
            src: [x1b, y1b],
        }
    })
}

/// Fractional bits of the canvas coordinates.
const FRAC: u32 = 32;
/// Bits of the bilinear weights.
const WBITS: u32 = 11;
const WONE: u32 = 1 << WBITS;
/// Rounding of the final `(Σ p·wx·wy) >> 2·WBITS`.
const ROUND: u32 = 1 << (2 * WBITS - 1);
/// Largest canvas coordinate (pixels) the fixed-point path takes; beyond, the f64 path.
const MAX_COORD: f64 = (1u64 << 22) as f64;

/// A tile clipped to its image: canvas rectangle and the canvas offset of source `(0, 0)`.
#[derive(Clone, Copy)]
struct Tile<'a> {
    raw: &'a [u8],
    w: i64,
    h: i64,
    /// `[x1, y1, x2, y2)` on the canvas, non-empty and inside the image.
    rect: [i64; 4],
    /// Canvas position of source pixel (0, 0).
    off: (i64, i64),
}

impl<'a> Tile<'a> {
    fn new(t: &CanvasTile<'a>) -> Option<Tile<'a>> {
        let (w, h) = (t.image.width() as i64, t.image.height() as i64);
        let (ox, oy) = t.place.offset();
        // Clip the region to the source image so that no read can leave it.
        let rect = [
            t.place.canvas[0].max(ox),
            t.place.canvas[1].max(oy),
            t.place.canvas[2].min(ox + w),
            t.place.canvas[3].min(oy + h),
        ];
        let raw = t.image.as_raw().as_slice();
        if rect[0] >= rect[2] || rect[1] >= rect[3] || raw.len() < (w * h * 3) as usize {
            return None;
        }
        Some(Tile {
            raw,
            w,
            h,
            rect,
            off: (ox, oy),
        })
    }

    /// The canvas pixel `(x, y)` if this tile covers it.
    #[inline]
    fn get(&self, x: i64, y: i64) -> Option<[u8; 3]> {
        if x < self.rect[0] || x >= self.rect[2] || y < self.rect[1] || y >= self.rect[3] {
            return None;
        }
        let i = (((y - self.off.1) * self.w + (x - self.off.0)) * 3) as usize;
        self.raw.get(i..i + 3).map(|p| [p[0], p[1], p[2]])
    }
}

/// The canvas pixel `(x, y)`: the tile covering it, else grey.
#[inline]
fn canvas_px(tiles: &[Tile], x: i64, y: i64) -> [u32; 3] {
    for t in tiles {
        if let Some(p) = t.get(x, y) {
            return p.map(u32::from);
        }
    }
    [PAD_GREY as u32; 3]
}

/// Per-thread scratch of the separable path (the vertically blended row).
struct Scratch {
    vrow: Vec<u32>,
    cols: Vec<(u32, u32)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch { vrow: Vec::new(), cols: Vec::new() }) };
}

/// `{ox ∈ [0, n) : lo ≤ floor((base + ox·step) / 2³²) ≤ hi}` as `[a, b)` (empty: `a ≥ b`).
fn coord_span(base: i64, step: i64, lo: i64, hi: i64, n: i64) -> (i64, i64) {
    let (base, step) = (base as i128, step as i128);
    // lo·2³² ≤ base + ox·step < (hi + 1)·2³²
    let a = (lo as i128) << FRAC;
    let b = ((hi as i128) + 1) << FRAC;
    let floor_div = |p: i128, q: i128| p.div_euclid(q);
    let ceil_div = |p: i128, q: i128| -((-p).div_euclid(q));
    let (first, end) = if step == 0 {
        if base >= a && base < b {
            (0, n as i128)
        } else {
            (0, 0)
        }
    } else if step > 0 {
        (ceil_div(a - base, step), ceil_div(b - base, step))
    } else {
        (
            floor_div(base - b, -step) + 1,
            floor_div(base - a, -step) + 1,
        )
    };
    let first = first.clamp(0, n as i128) as i64;
    let end = end.clamp(0, n as i128) as i64;
    (first, end)
}

fn intersect(a: (i64, i64), b: (i64, i64)) -> (i64, i64) {
    (a.0.max(b.0), a.1.min(b.1))
}

/// The bilinear sum of four pixels with 11-bit weights, rounded to u8.
#[inline(always)]
fn blend(p00: u32, p01: u32, p10: u32, p11: u32, fx: u32, fy: u32) -> u8 {
    let top = p00 * (WONE - fx) + p01 * fx;
    let bot = p10 * (WONE - fx) + p11 * fx;
    ((top * (WONE - fy) + bot * fy + ROUND) >> (2 * WBITS)) as u8
}

/// One output pixel by looking up each neighbour on the canvas (seams, tile borders).
#[inline]
fn sample_slow(tiles: &[Tile], x: i64, y: i64, out: &mut [u8]) {
    let (x0, y0) = (x >> FRAC, y >> FRAC);
    let fx = ((x >> (FRAC - WBITS)) & (WONE as i64 - 1)) as u32;
    let fy = ((y >> (FRAC - WBITS)) & (WONE as i64 - 1)) as u32;
    let p00 = canvas_px(tiles, x0, y0);
    let p01 = canvas_px(tiles, x0 + 1, y0);
    let p10 = canvas_px(tiles, x0, y0 + 1);
    let p11 = canvas_px(tiles, x0 + 1, y0 + 1);
    for c in 0..3 {
        out[c] = blend(p00[c], p01[c], p10[c], p11[c], fx, fy);
    }
}

/// Warps the virtual canvas carrying `tiles` by the affine `m` (canvas pixels → output pixels)
/// into `out` (its size is the output size), bilinear with grey 114 wherever no tile is, as
/// `cv2.warpAffine(canvas, m, (out_w, out_h), borderValue=(114, 114, 114))`. Tiles must not
/// overlap (those of [`mosaic_placements`] never do); a placement reaching outside its image is
/// clipped to it. Never panics.
pub fn warp_tiles(tiles: &[CanvasTile], m: &Affine, out: &mut RgbImage) {
    let (ow, oh) = (out.width() as i64, out.height() as i64);
    let out_raw: &mut [u8] = out;
    out_raw.fill(PAD_GREY);
    let tiles: Vec<Tile> = tiles.iter().filter_map(Tile::new).collect();
    let [[a, b, c], [d, e, f]] = *m;
    let det = a * e - b * d;
    if tiles.is_empty() || ow == 0 || oh == 0 || !det.is_finite() || det.abs() < 1e-12 {
        return;
    }
    // Inverse affine: canvas = M⁻¹ · output.
    let (ia, ib, id, ie) = (e / det, -b / det, -d / det, a / det);
    let ic = -(ia * c + ib * f);
    let if_ = -(id * c + ie * f);
    let corners = [
        (0.0, 0.0),
        (ow as f64, 0.0),
        (0.0, oh as f64),
        (ow as f64, oh as f64),
    ];
    let fits = corners.iter().all(|&(x, y)| {
        let (sx, sy) = (ia * x + ib * y + ic, id * x + ie * y + if_);
        sx.abs() < MAX_COORD && sy.abs() < MAX_COORD
    });
    if !fits {
        warp_tiles_f64(&tiles, [ia, ib, ic, id, ie, if_], out_raw, ow, oh);
        return;
    }
    let one = (1u64 << FRAC) as f64;
    // Rounding the coordinates to the nearest weight step: add half a step once.
    let half = 1i64 << (FRAC - WBITS - 1);
    let dx = (ia * one).round() as i64;
    let dy = (id * one).round() as i64;
    let row_len = (ow * 3) as usize;
    let axis_aligned = ib == 0.0 && id == 0.0;
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        let scratch = &mut *scratch;
        if axis_aligned {
            // Per-column source x and weight, shared by every row and tile.
            scratch.cols.clear();
            let xr = (ic * one).round() as i64 + half;
            scratch.cols.extend((0..ow).map(|ox| {
                let x = xr + ox * dx;
                (
                    (x >> FRAC) as u32,
                    ((x >> (FRAC - WBITS)) & (WONE as i64 - 1)) as u32,
                )
            }));
        }
        for (oy, row) in out_raw.chunks_exact_mut(row_len).enumerate() {
            let oy = oy as i64;
            let xr = ((ib * oy as f64 + ic) * one).round() as i64 + half;
            let yr = ((ie * oy as f64 + if_) * one).round() as i64 + half;
            for t in &tiles {
                let [x1, y1, x2, y2] = t.rect;
                // Touching the tile: the 2×2 neighbourhood meets it.
                let touch = intersect(
                    coord_span(xr, dx, x1 - 1, x2 - 1, ow),
                    coord_span(yr, dy, y1 - 1, y2 - 1, ow),
                );
                if touch.0 >= touch.1 {
                    continue;
                }
                // Inside the tile: the whole neighbourhood in it.
                let mut inner = intersect(
                    coord_span(xr, dx, x1, x2 - 2, ow),
                    coord_span(yr, dy, y1, y2 - 2, ow),
                );
                if inner.0 < inner.1 {
                    let done = if axis_aligned {
                        span_separable(t, &mut scratch.vrow, &scratch.cols, yr, inner, row)
                    } else {
                        span_general(t, (xr, dx), (yr, dy), inner, row)
                    };
                    if !done {
                        inner = (touch.0, touch.0);
                    }
                } else {
                    inner = (touch.0, touch.0);
                }
                for ox in (touch.0..inner.0).chain(inner.1..touch.1) {
                    let o = (ox * 3) as usize;
                    sample_slow(&tiles, xr + ox * dx, yr + ox * dy, &mut row[o..o + 3]);
                }
            }
        }
    });
}

/// Samples `span` of a row entirely inside tile `t` when the affine has no rotation or shear:
/// the two source rows are blended vertically into `vrow` (vectorised), then horizontally by
/// the column tables. Returns false (nothing written) if the span would read outside the image.
fn span_separable(
    t: &Tile,
    vrow: &mut Vec<u32>,
    cols: &[(u32, u32)],
    yr: i64,
    span: (i64, i64),
    row: &mut [u8],
) -> bool {
    let (a, b) = (span.0 as usize, span.1 as usize);
    let (Some(&(cx_first, _)), Some(&(cx_last, _))) = (cols.get(a), cols.get(b - 1)) else {
        return false;
    };
    let sy = (yr >> FRAC) - t.off.1;
    let fy = ((yr >> (FRAC - WBITS)) & (WONE as i64 - 1)) as u32;
    let (lo, hi) = (cx_first.min(cx_last) as i64, cx_first.max(cx_last) as i64);
    let (sx_lo, sx_hi) = (lo - t.off.0, hi - t.off.0 + 1);
    if sy < 0 || sy + 1 >= t.h || sx_lo < 0 || sx_hi >= t.w || row.len() < b * 3 {
        return false;
    }
    let stride = (t.w * 3) as usize;
    let r0 = (sy as usize) * stride;
    let (x_lo, x_hi) = (sx_lo as usize * 3, (sx_hi as usize + 1) * 3);
    let (Some(top), Some(bot)) = (
        t.raw.get(r0 + x_lo..r0 + x_hi),
        t.raw.get(r0 + stride + x_lo..r0 + stride + x_hi),
    ) else {
        return false;
    };
    vrow.clear();
    vrow.extend(
        top.iter()
            .zip(bot)
            .map(|(&p, &q)| p as u32 * (WONE - fy) + q as u32 * fy),
    );
    let vrow = vrow.as_slice();
    // Every column of the span reads vrow[(x − lo)·3 .. (x − lo)·3 + 6] with lo ≤ x ≤ hi, and
    // vrow holds (hi − lo + 2)·3 values: checked once here instead of per pixel.
    let base = lo as u32;
    let (Some(out), Some(cols)) = (row.get_mut(a * 3..b * 3), cols.get(a..b)) else {
        return false;
    };
    debug_assert!(vrow.len() >= ((hi - lo) as usize + 2) * 3);
    for (o, &(cx, fx)) in out.chunks_exact_mut(3).zip(cols) {
        let i = (cx.wrapping_sub(base) * 3) as usize;
        // SAFETY: the column positions are monotone in ox, so lo ≤ cx ≤ hi for every column of
        // the span (lo, hi are its ends), and vrow holds (hi − lo + 2)·3 values: i + 6 ≤ len.
        let p = unsafe { vrow.get_unchecked(i..i + 6) };
        for ch in 0..3 {
            o[ch] = ((p[ch] * (WONE - fx) + p[ch + 3] * fx + ROUND) >> (2 * WBITS)) as u8;
        }
    }
    true
}

/// Samples `span` of a row entirely inside tile `t` for a general affine (rotation, shear).
/// Returns false (nothing written) if the span would read outside the image.
fn span_general(
    t: &Tile,
    (xr, dx): (i64, i64),
    (yr, dy): (i64, i64),
    span: (i64, i64),
    row: &mut [u8],
) -> bool {
    // Source coordinates are linear in ox: the span's two ends bound every pixel's.
    let src = |ox: i64| ((xr + ox * dx) >> FRAC) - t.off.0;
    let srcy = |ox: i64| ((yr + ox * dy) >> FRAC) - t.off.1;
    for ox in [span.0, span.1 - 1] {
        let (sx, sy) = (src(ox), srcy(ox));
        if sx < 0 || sy < 0 || sx + 1 >= t.w || sy + 1 >= t.h {
            return false;
        }
    }
    if row.len() < (span.1 * 3) as usize {
        return false;
    }
    let stride = (t.w * 3) as usize;
    let raw = t.raw;
    for ox in span.0..span.1 {
        let (x, y) = (xr + ox * dx, yr + ox * dy);
        let (sx, sy) = (
            ((x >> FRAC) - t.off.0) as usize,
            ((y >> FRAC) - t.off.1) as usize,
        );
        let fx = ((x >> (FRAC - WBITS)) & (WONE as i64 - 1)) as u32;
        let fy = ((y >> (FRAC - WBITS)) & (WONE as i64 - 1)) as u32;
        let i = sy * stride + sx * 3;
        let (Some(p), Some(q)) = (raw.get(i..i + 6), raw.get(i + stride..i + stride + 6)) else {
            return false;
        };
        let o = (ox * 3) as usize;
        for ch in 0..3 {
            row[o + ch] = blend(
                p[ch] as u32,
                p[ch + 3] as u32,
                q[ch] as u32,
                q[ch + 3] as u32,
                fx,
                fy,
            );
        }
    }
    true
}

/// The reference semantics in f64 for affines whose coordinates do not fit the fixed point
/// (a near-degenerate scale): per pixel, each neighbour looked up on the canvas.
fn warp_tiles_f64(tiles: &[Tile], inv: [f64; 6], out: &mut [u8], ow: i64, oh: i64) {
    let [ia, ib, ic, id, ie, if_] = inv;
    for oy in 0..oh {
        for ox in 0..ow {
            let sx = ia * ox as f64 + ib * oy as f64 + ic;
            let sy = id * ox as f64 + ie * oy as f64 + if_;
            if !(sx > -1.0 && sy > -1.0 && sx < 1e15 && sy < 1e15) {
                continue;
            }
            let (x0, y0) = (sx.floor() as i64, sy.floor() as i64);
            let (fx, fy) = (sx - x0 as f64, sy - y0 as f64);
            let p = [
                canvas_px(tiles, x0, y0),
                canvas_px(tiles, x0 + 1, y0),
                canvas_px(tiles, x0, y0 + 1),
                canvas_px(tiles, x0 + 1, y0 + 1),
            ];
            let o = ((oy * ow + ox) * 3) as usize;
            let Some(dst) = out.get_mut(o..o + 3) else {
                continue;
            };
            for (ch, px) in dst.iter_mut().enumerate() {
                let v = p[0][ch] as f64 * (1.0 - fx) * (1.0 - fy)
                    + p[1][ch] as f64 * fx * (1.0 - fy)
                    + p[2][ch] as f64 * (1.0 - fx) * fy
                    + p[3][ch] as f64 * fx * fy;
                *px = v.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
}
