//! The outline of a bit mask: the largest 8-connected part's pixel boundary as a polygon, what a
//! detection's mask is written as (`detect::masks`) and what a COCO RLE `segmentation` becomes
//! (`data::coco_json`); the official code's `masks2segments` (OpenCV `findContours`, the largest
//! part kept).

/// The outline of the largest 8-connected part of a `w × h` bit map, as the corner points of
/// its pixel boundary (vertex coordinates), clockwise, with collinear points removed (what
/// `cv2.CHAIN_APPROX_SIMPLE` keeps); empty for an empty map.
pub(crate) fn largest_outline(bits: &[u8], w: usize, h: usize) -> Vec<[i32; 2]> {
    // Label the parts (8-connected) and keep the one with the most pixels.
    let mut label = vec![0u32; w * h];
    let mut best = (0usize, 0usize); // (pixels, first pixel index)
    let mut next = 0u32;
    let mut stack = Vec::new();
    for start in 0..w * h {
        if bits[start] == 0 || label[start] != 0 {
            continue;
        }
        next += 1;
        label[start] = next;
        stack.push(start);
        let mut n = 0usize;
        while let Some(p) = stack.pop() {
            n += 1;
            let (px, py) = ((p % w) as i64, (p / w) as i64);
            for dy in -1..=1i64 {
                for dx in -1..=1i64 {
                    let (qx, qy) = (px + dx, py + dy);
                    if qx < 0 || qy < 0 || qx >= w as i64 || qy >= h as i64 {
                        continue;
                    }
                    let q = qy as usize * w + qx as usize;
                    if bits[q] != 0 && label[q] == 0 {
                        label[q] = next;
                        stack.push(q);
                    }
                }
            }
        }
        if n > best.0 {
            best = (n, start);
        }
    }
    if best.0 == 0 {
        return Vec::new();
    }
    let part = label[best.1];
    let inside = |x: i32, y: i32| -> bool {
        x >= 0
            && y >= 0
            && (x as usize) < w
            && (y as usize) < h
            && label[y as usize * w + x as usize] == part
    };
    // Walk the boundary between the part and the rest along pixel edges, keeping the part on
    // the right (clockwise in image coordinates), starting at the top-left corner of the first
    // pixel (row-major), which lies on the outer boundary.
    let (sx, sy) = ((best.1 % w) as i32, (best.1 / w) as i32);
    let mut pts: Vec<[i32; 2]> = Vec::new();
    let (mut x, mut y) = (sx, sy);
    // Directions: 0 right, 1 down, 2 left, 3 up (vertex moves).
    let mut d = 0usize;
    let step = |d: usize| -> (i32, i32) { [(1, 0), (0, 1), (-1, 0), (0, -1)][d] };
    // The pixels left and right of a move from vertex (x, y) in direction d.
    let sides = |x: i32, y: i32, d: usize| -> (bool, bool) {
        match d {
            0 => (inside(x, y - 1), inside(x, y)),
            1 => (inside(x, y), inside(x - 1, y)),
            2 => (inside(x - 1, y), inside(x - 1, y - 1)),
            _ => (inside(x - 1, y - 1), inside(x, y - 1)),
        }
    };
    let limit = 4 * (w + 1) * (h + 1) + 4;
    for _ in 0..limit {
        pts.push([x, y]);
        let (dx, dy) = step(d);
        x += dx;
        y += dy;
        if x == sx && y == sy {
            break;
        }
        // Prefer turning left (part stays on the right), then straight, then right: at a
        // diagonal contact this joins the two pixels (8-connectivity).
        for turn in [3usize, 0, 1, 2] {
            let nd = (d + turn) % 4;
            let (l, r) = sides(x, y, nd);
            if r && !l {
                d = nd;
                break;
            }
        }
    }
    // Drop the vertices where the direction does not change.
    let n = pts.len();
    if n < 3 {
        return pts;
    }
    let dir = |a: [i32; 2], b: [i32; 2]| [(b[0] - a[0]).signum(), (b[1] - a[1]).signum()];
    (0..n)
        .filter(|&i| dir(pts[(i + n - 1) % n], pts[i]) != dir(pts[i], pts[(i + 1) % n]))
        .map(|i| pts[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outline_of_a_square_a_notch_and_two_parts() {
        // A 2x2 square at (1,1): corners (1,1) (3,1) (3,3) (1,3), clockwise in image coordinates.
        let mut b = vec![0u8; 5 * 5];
        for (x, y) in [(1, 1), (2, 1), (1, 2), (2, 2)] {
            b[y * 5 + x] = 1;
        }
        assert_eq!(
            largest_outline(&b, 5, 5),
            vec![[1, 1], [3, 1], [3, 3], [1, 3]]
        );
        // An L: the 2x2 square without its bottom-right pixel: six corners.
        b[2 * 5 + 2] = 0;
        assert_eq!(
            largest_outline(&b, 5, 5),
            vec![[1, 1], [3, 1], [3, 2], [2, 2], [2, 3], [1, 3]]
        );
        // A single pixel far away is a smaller part and is not the outline.
        b[4 * 5 + 4] = 1;
        assert_eq!(largest_outline(&b, 5, 5).len(), 6);
        assert!(largest_outline(&[0u8; 4], 2, 2).is_empty());
        // Two pixels touching diagonally are one part (8-connectivity).
        let d = [1u8, 0, 0, 1];
        let o = largest_outline(&d, 2, 2);
        assert!(o.contains(&[0, 0]) && o.contains(&[2, 2]), "{o:?}");
    }
}
