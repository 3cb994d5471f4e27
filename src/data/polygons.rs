//! Instance outlines (polygons) rasterised into the ground-truth masks of segmentation training,
//! as the official `utils/segment/dataloaders.py` makes them: `polygon2mask` (the outline's
//! points truncated to whole pixels, `cv2.fillPoly` at the image size, then `cv2.resize` to
//! `1 / downsample_ratio` of it, linear interpolation) and `polygons2masks_overlap` (one mask per
//! image whose pixel value `k + 1` is the `k`-th object by decreasing area, smaller objects over
//! larger ones).
//!
//! The fill follows OpenCV's rule for a polygon with integer vertices (8-connected lines along
//! every edge, then each scanline filled between pairs of edge crossings, from the crossing
//! rounded up to the crossing rounded down, in 16.16 fixed point); on outlines inside the image
//! it gives OpenCV's pixels exactly (`tests/model/seg.rs`, against `cv2.fillPoly`). An edge that
//! leaves the image is drawn from its own end points, where OpenCV first clips it to the image
//! (which can move its pixels by one along that edge). The linear resize of a 0/1 mask by an
//! integer ratio `r` is exact: for even `r` a mask pixel is 1 when at least two of the four
//! source pixels at rows and columns `r·i + r/2 − 1` and `r·i + r/2` are; for odd `r` it is the
//! source pixel `r·i + (r−1)/2`.

/// The official training's mask downsample ratio (`segment/train.py --mask-ratio`, 4): the
/// ground-truth masks are rasterised at `1 / 4` of the network input, the prototypes' size.
pub const MASK_RATIO: usize = 4;

/// Fixed-point fraction bits of the scanline fill (OpenCV's `XY_SHIFT`).
const SHIFT: u32 = 16;
const ONE: i64 = 1 << SHIFT;

/// Sets to `value` the pixels of a `w × h` row-major mask covered by the polygon `pts` (integer
/// pixel coordinates, any order, may leave the image): its edges and its inside.
pub fn fill_polygon(mask: &mut [u8], w: usize, h: usize, pts: &[[i64; 2]], value: u8) {
    let n = pts.len();
    if n == 0 || mask.len() < w * h {
        return;
    }
    let mut put = |x: i64, y: i64| {
        if x >= 0 && y >= 0 && (x as usize) < w && (y as usize) < h {
            mask[y as usize * w + x as usize] = value;
        }
    };
    // [y0, y1, x (16.16) at y0, dx per row (16.16)], y0 < y1.
    let mut edges: Vec<[i64; 4]> = Vec::with_capacity(n);
    for i in 0..n {
        let p0 = pts[(i + n - 1) % n];
        let p1 = pts[i];
        line(p0, p1, &mut put);
        if p0[1] == p1[1] {
            continue;
        }
        let (top, bottom) = if p0[1] < p1[1] { (p0, p1) } else { (p1, p0) };
        // C integer division (truncates toward zero), as OpenCV's.
        let dx = ((p1[0] - p0[0]) << SHIFT) / (p1[1] - p0[1]);
        edges.push([top[1], bottom[1], top[0] << SHIFT, dx]);
    }
    if edges.len() < 2 {
        return;
    }
    edges.sort_by_key(|e| (e[0], e[2], e[3]));
    let y_min = edges[0][0];
    let y_max = edges.iter().map(|e| e[1]).max().unwrap_or(0).min(h as i64);
    let mut active: Vec<[i64; 4]> = Vec::new();
    let mut next = 0;
    for y in y_min..y_max {
        // An edge leaves the active list on the row of its lower end.
        active.retain(|e| e[1] != y);
        while next < edges.len() && edges[next][0] == y {
            active.push(edges[next]);
            next += 1;
        }
        active.sort_by_key(|e| e[2]);
        for pair in active.chunks_exact_mut(2) {
            if y >= 0 {
                let (l, r) = if pair[0][2] > pair[1][2] {
                    (pair[1][2], pair[0][2])
                } else {
                    (pair[0][2], pair[1][2])
                };
                let x1 = ((l + ONE - 1) >> SHIFT).max(0);
                let x2 = (r >> SHIFT).min(w as i64 - 1);
                for x in x1..=x2 {
                    mask[y as usize * w + x as usize] = value;
                }
            }
            pair[0][2] += pair[0][3];
            pair[1][2] += pair[1][3];
        }
    }
}

/// The pixels of the 8-connected line from `a` to `b` (drawn left to right; at an exact half
/// step the minor coordinate stays), given to `put`.
fn line(a: [i64; 2], b: [i64; 2], put: &mut impl FnMut(i64, i64)) {
    let (a, b) = if b[0] < a[0] { (b, a) } else { (a, b) };
    let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
    let sy = if dy < 0 { -1 } else { 1 };
    let ady = dy.abs();
    // Rounded offset of the minor axis at step k of n, ties down.
    let off = |k: i64, num: i64, n: i64| -> i64 {
        let (q, r) = (k * num / n, (k * num) % n);
        q + i64::from(2 * r > n)
    };
    if ady > dx {
        for k in 0..=ady {
            put(a[0] + off(k, dx, ady), a[1] + sy * k);
        }
    } else if dx == 0 {
        put(a[0], a[1]);
    } else {
        for k in 0..=dx {
            put(a[0] + k, a[1] + sy * off(k, ady, dx));
        }
    }
}

/// A `w × h` 0/1 mask downsampled by the integer `ratio` as `cv2.resize(mask, (w / ratio,
/// h / ratio))` (linear) does it: `(h / ratio) × (w / ratio)` row-major.
pub fn downsample(mask: &[u8], w: usize, h: usize, ratio: usize) -> Vec<u8> {
    let r = ratio.max(1);
    if r == 1 {
        return mask.to_vec();
    }
    let (ow, oh) = (w / r, h / r);
    let mut out = vec![0u8; ow * oh];
    let at = |x: usize, y: usize| u32::from(mask[y.min(h - 1) * w + x.min(w - 1)] != 0);
    for y in 0..oh {
        for x in 0..ow {
            out[y * ow + x] = if r.is_multiple_of(2) {
                let (sx, sy) = (r * x + r / 2 - 1, r * y + r / 2 - 1);
                let s = at(sx, sy) + at(sx + 1, sy) + at(sx, sy + 1) + at(sx + 1, sy + 1);
                u8::from(s >= 2)
            } else {
                at(r * x + (r - 1) / 2, r * y + (r - 1) / 2) as u8
            };
        }
    }
    out
}

/// Official `polygon2mask(img_size, [polygon], color=1, downsample_ratio)`: `points` in pixels
/// of a `w × h` image (truncated toward zero, as `astype(np.int32)`) → a `(h / ratio) ×
/// (w / ratio)` 0/1 mask.
pub fn polygon_mask(points: &[[f64; 2]], w: usize, h: usize, ratio: usize) -> Vec<u8> {
    let mut full = vec![0u8; w * h];
    let pts: Vec<[i64; 2]> = points
        .iter()
        .map(|p| [p[0].trunc() as i64, p[1].trunc() as i64])
        .collect();
    fill_polygon(&mut full, w, h, &pts, 1);
    downsample(&full, w, h, ratio)
}

/// Official `polygons2masks_overlap(img_size, segments, downsample_ratio)`: the outlines of one
/// image (pixels of `w × h`) → `(mask, order)`: `mask` `(h / ratio) × (w / ratio)` with value
/// `k + 1` where the `k`-th object of `order` is (objects sorted by decreasing mask area, ties
/// in input order; a smaller object is drawn over a larger one), 0 elsewhere; `order[k]` is the
/// input index of that object (the labels are reordered alike).
pub fn overlap_mask(
    outlines: &[Vec<[f64; 2]>],
    w: usize,
    h: usize,
    ratio: usize,
) -> (Vec<u32>, Vec<usize>) {
    let masks: Vec<Vec<u8>> = outlines
        .iter()
        .map(|p| polygon_mask(p, w, h, ratio))
        .collect();
    let areas: Vec<usize> = masks
        .iter()
        .map(|m| m.iter().filter(|&&v| v != 0).count())
        .collect();
    let mut order: Vec<usize> = (0..outlines.len()).collect();
    order.sort_by(|&a, &b| areas[b].cmp(&areas[a]));
    let len = (w / ratio.max(1)) * (h / ratio.max(1));
    let mut out = vec![0u32; len];
    for (k, &i) in order.iter().enumerate() {
        for (o, &m) in out.iter_mut().zip(&masks[i]) {
            if m != 0 {
                *o = k as u32 + 1;
            }
        }
    }
    (out, order)
}

/// The outlines of an image's labels in pixels: each label's normalized outline (`outlines[k]`;
/// a label without one, or `outlines` empty, takes its box's four corners), mapped by
/// `(x·w + padw, y·h + padh)` in f32 (official `xyn2xy`). `labels` are normalized `cx cy w h`.
pub fn outlines_in_pixels(
    labels: &[(u32, [f32; 4])],
    outlines: &[Vec<[f32; 2]>],
    (w, h): (f32, f32),
    (padw, padh): (f32, f32),
) -> Vec<Vec<[f64; 2]>> {
    labels
        .iter()
        .enumerate()
        .map(|(k, (_, l))| {
            let pts: Vec<[f32; 2]> = match outlines.get(k).filter(|o| !o.is_empty()) {
                Some(o) => o.clone(),
                None => {
                    let [x1, y1, x2, y2] = crate::boxes::xywhn_to_xyxy(l, 1.0, 1.0, 0.0, 0.0);
                    vec![[x1, y1], [x2, y1], [x2, y2], [x1, y2]]
                }
            };
            pts.iter()
                .map(|p| [f64::from(w * p[0] + padw), f64::from(h * p[1] + padh)])
                .collect()
        })
        .collect()
}

/// The indices `(i, j)` of the closest pair of points `a[i]`, `b[j]` (squared distance; the
/// first such pair in row-major order).
fn closest_pair(a: &[[f64; 2]], b: &[[f64; 2]]) -> (usize, usize) {
    let mut best = (f64::INFINITY, 0, 0);
    for (i, p) in a.iter().enumerate() {
        for (j, q) in b.iter().enumerate() {
            let d = (p[0] - q[0]).powi(2) + (p[1] - q[1]).powi(2);
            if d < best.0 {
                best = (d, i, j);
            }
        }
    }
    (best.1, best.2)
}

/// One outline from the several polygons of one object (a COCO `segmentation` list), as the
/// Ultralytics COCO converter joins them (`merge_multi_segment`): consecutive polygons are linked
/// at their closest points, and the outline walks every polygon forward from its first link and
/// back along the middle ones, so that the one path visits each part (the links are drawn twice,
/// enclosing no area). One polygon is returned as it is.
pub fn merge_polygons(polys: &[Vec<[f64; 2]>]) -> Vec<[f64; 2]> {
    let n = polys.len();
    if n <= 1 {
        return polys.first().cloned().unwrap_or_default();
    }
    let mut links: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in 1..n {
        let (a, b) = closest_pair(&polys[i - 1], &polys[i]);
        links[i - 1].push(a);
        links[i].push(b);
    }
    let mut segs: Vec<Vec<[f64; 2]>> = polys.to_vec();
    let mut out: Vec<[f64; 2]> = Vec::new();
    for (i, link) in links.iter().enumerate() {
        let mut idx = link.clone();
        // A middle polygon's two links in increasing order; its points reversed alike (as the
        // converter does, which keeps the indices' values).
        if idx.len() == 2 && idx[0] > idx[1] {
            idx.swap(0, 1);
            segs[i].reverse();
        }
        let len = segs[i].len();
        let start = idx[0] % len.max(1);
        let mut rolled: Vec<[f64; 2]> = (0..len).map(|j| segs[i][(j + start) % len]).collect();
        rolled.push(rolled[0]);
        segs[i] = rolled;
        if i == 0 || i == n - 1 {
            out.extend_from_slice(&segs[i]);
        } else {
            let end = (idx[1] - idx[0]).min(segs[i].len() - 1);
            out.extend_from_slice(&segs[i][..=end]);
        }
    }
    for i in (1..n - 1).rev() {
        let skip = links[i][1].abs_diff(links[i][0]).min(segs[i].len());
        out.extend_from_slice(&segs[i][skip..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_square_fills_its_edges_and_inside() {
        let mut m = vec![0u8; 8 * 8];
        fill_polygon(&mut m, 8, 8, &[[1, 1], [4, 1], [4, 3], [1, 3]], 1);
        let set: Vec<(usize, usize)> = (0..64)
            .filter(|&i| m[i] != 0)
            .map(|i| (i % 8, i / 8))
            .collect();
        // Columns 1..=4, rows 1..=3: the closed square, edges included.
        assert_eq!(set.len(), 4 * 3);
        assert!(set
            .iter()
            .all(|&(x, y)| (1..=4).contains(&x) && (1..=3).contains(&y)));
    }

    #[test]
    fn downsampling_by_four_needs_two_of_the_four_middle_pixels() {
        let mut m = vec![0u8; 8 * 4];
        // Block 0: pixels (1,1) and (2,2) of the middle 2x2 → 1; block 1: only (5,1) → 0.
        m[8 + 1] = 1;
        m[2 * 8 + 2] = 1;
        m[8 + 5] = 1;
        m[0] = 1; // outside the middle 2x2: ignored
        assert_eq!(downsample(&m, 8, 4, 4), vec![1, 0]);
    }

    #[test]
    fn polygons_merge_as_the_ultralytics_converter() {
        // numpy/Ultralytics merge_multi_segment of three squares in a row.
        let sq = |x: f64| vec![[x, 0.0], [x + 2.0, 0.0], [x + 2.0, 2.0], [x, 2.0]];
        let got = merge_polygons(&[sq(0.0), sq(4.0), sq(8.0)]);
        let want: Vec<[f64; 2]> = vec![
            [2.0, 0.0],
            [2.0, 2.0],
            [0.0, 2.0],
            [0.0, 0.0],
            [2.0, 0.0],
            [4.0, 0.0],
            [6.0, 0.0],
            [8.0, 0.0],
            [10.0, 0.0],
            [10.0, 2.0],
            [8.0, 2.0],
            [8.0, 0.0],
            [6.0, 0.0],
            [6.0, 2.0],
            [4.0, 2.0],
            [4.0, 0.0],
        ];
        assert_eq!(got, want);
        assert_eq!(merge_polygons(&[sq(1.0)]), sq(1.0));
        // A middle polygon whose links come in decreasing order: reversed, indices kept.
        let a = sq(0.0);
        let b = vec![[6.0, 2.0], [4.0, 2.0], [4.0, 0.0], [5.0, -1.0], [6.0, 0.0]];
        let c = vec![[8.0, 1.0], [10.0, 0.0], [10.0, 2.0]];
        let want: Vec<[f64; 2]> = vec![
            [2.0, 0.0],
            [2.0, 2.0],
            [0.0, 2.0],
            [0.0, 0.0],
            [2.0, 0.0],
            [6.0, 0.0],
            [5.0, -1.0],
            [4.0, 0.0],
            [8.0, 1.0],
            [10.0, 0.0],
            [10.0, 2.0],
            [8.0, 1.0],
            [4.0, 0.0],
            [4.0, 2.0],
            [6.0, 2.0],
            [6.0, 0.0],
        ];
        assert_eq!(merge_polygons(&[a, b, c]), want);
    }

    #[test]
    fn overlapping_objects_smaller_on_top() {
        let big = vec![[0.0, 0.0], [15.0, 0.0], [15.0, 15.0], [0.0, 15.0]];
        let small = vec![[4.0, 4.0], [8.0, 4.0], [8.0, 8.0], [4.0, 8.0]];
        let (m, order) = overlap_mask(&[small, big], 16, 16, 1);
        assert_eq!(order, vec![1, 0], "the larger first");
        assert_eq!(m[6 * 16 + 6], 2, "the smaller object over the larger one");
        assert_eq!(m[12 * 16 + 12], 1);
    }
}
