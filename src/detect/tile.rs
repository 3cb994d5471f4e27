//! Sliced (tiled) inference for small objects in large images, after SAHI (Akyon et al., "Slicing
//! Aided Hyper Inference and Fine-tuning for Small Object Detection", ICIP 2022): the image is cut
//! into overlapping square tiles of [`TileOptions::size`] source pixels, each tile is detected at
//! the detector's inference size (one letterbox shape for every tile of an image, so the tiles
//! run as batches), optionally the whole image is detected too (SAHI's "standard prediction"),
//! and the detections, shifted back to image pixels, are merged by [`merge`].
//!
//! - [`grid`]: the tiles of an image (every tile the same size; the last tile of a row or
//!   column is moved back to end at the image border rather than shrunk).
//! - [`cut_sides`]: which sides of a tile's box lie on an inner tile border (where the tile,
//!   not the object, ended).
//! - [`merge`]: class-aware (unless agnostic) merging: a cut piece that another tile saw whole
//!   is dropped, the pieces of an object no tile saw whole are joined side by side (each side
//!   from a piece that saw it), then NMS across tiles.
//!
//! Boxes are `[x1, y1, x2, y2, conf, cls]` rows in image pixels ([`crate::detect::nms::Row`]).

use crate::boxes::{area, intersection};
use crate::detect::nms::{nms, Row};
use serde::{Deserialize, Serialize};

/// The defaults of [`TileOptions`].
pub mod defaults {
    /// Overlap of neighbouring tiles, a fraction of the tile size (SAHI's `overlap_*_ratio`).
    pub const OVERLAP: f32 = 0.2;
    /// The share of a cut piece's (or the smaller piece's) area inside another box above which
    /// they are one object, and the IoU of two pieces in the overlap zone ([`super::merge`]).
    /// SAHI's IoS threshold is 0.5; 0.7 was chosen on the BCCD large-image test
    /// (docs/detect-and-track.md, `benches/tiles.sh`), where 0.5 gave a lower mAP50.
    pub const MATCH: f32 = 0.7;
}

/// Largest overlap fraction accepted (a tile advances at least a tenth of its size).
pub const MAX_OVERLAP: f32 = 0.9;

/// Smallest tile, pixels.
pub const MIN_TILE: u32 = 32;

/// Largest tile, pixels (the largest inference size a detector accepts).
pub const MAX_TILE: u32 = 16_384;

/// Sliced inference settings of a [`crate::Detector`] (and `yolo9 detect`, `track`, `val`,
/// `serve`: `--tile`, `--tile-overlap`, `--tile-full-image`). Off (`size` 0) by default.
///
/// ```
/// let t: yolo9::detect::tile::TileOptions = serde_json::from_str(r#"{"size": 640}"#).unwrap();
/// assert_eq!((t.size, t.overlap, t.full_image), (640, 0.2, false));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TileOptions {
    /// Tiled inference: the side of the square tiles in source pixels (0: off, else at least
    /// 32). Each tile is letterboxed to the inference size (--img; equal sizes detect tiles at
    /// full resolution). An image no larger than a tile is detected whole, as without tiles.
    #[cfg_attr(feature = "cli", arg(id = "tile", long = "tile", value_name = "SIZE", default_value_t = 0,
        value_parser = tile_size))]
    pub size: u32,
    /// Overlap of neighbouring tiles, a fraction of the tile size in [0, 0.9].
    #[cfg_attr(feature = "cli", arg(id = "tile_overlap", long = "tile-overlap", value_name = "F",
        default_value_t = defaults::OVERLAP, value_parser = overlap))]
    pub overlap: f32,
    /// With --tile, also detect the whole image letterboxed (SAHI's standard prediction) and
    /// add its boxes longer than the overlap (objects no tile sees whole) before merging
    /// (true, false). Off by default: on the BCCD large-image test it lowers mAP50.
    #[cfg_attr(feature = "cli", arg(id = "tile_full_image", long = "tile-full-image", value_name = "BOOL",
        default_value_t = false, action = clap::ArgAction::Set))]
    pub full_image: bool,
    /// With --tile, the share of a box cut by a tile border inside another box (of another
    /// tile) above which both are one object, in [0, 1].
    #[cfg_attr(feature = "cli", arg(id = "tile_match", long = "tile-match", value_name = "IOS",
        default_value_t = defaults::MATCH, value_parser = crate::parse::unit_f32))]
    pub match_thresh: f32,
}

impl Default for TileOptions {
    fn default() -> Self {
        Self {
            size: 0,
            overlap: defaults::OVERLAP,
            full_image: false,
            match_thresh: defaults::MATCH,
        }
    }
}

#[cfg(feature = "cli")]
fn tile_size(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(v) if v == 0 || (MIN_TILE..=MAX_TILE).contains(&v) => Ok(v),
        _ => Err(format!(
            "{s}: a tile size in pixels, {MIN_TILE}..={} (0: no tiles)",
            MAX_TILE
        )),
    }
}

#[cfg(feature = "cli")]
fn overlap(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(v) if (0.0..=MAX_OVERLAP).contains(&v) => Ok(v),
        _ => Err(format!("{s}: an overlap fraction in [0, {MAX_OVERLAP}]")),
    }
}

impl TileOptions {
    /// Whether tiles are on.
    pub fn on(&self) -> bool {
        self.size > 0
    }

    /// Checks the values: size 0 or in [`MIN_TILE`]..=16384, overlap in [0, [`MAX_OVERLAP`]],
    /// match threshold in [0, 1]. The error names the option and the value.
    pub fn validate(&self) -> Result<(), String> {
        if self.size != 0 && !(MIN_TILE..=MAX_TILE).contains(&self.size) {
            return Err(format!(
                "tile size {} is outside {MIN_TILE}..={} (0: no tiles)",
                self.size, MAX_TILE
            ));
        }
        if !(0.0..=MAX_OVERLAP).contains(&self.overlap) {
            return Err(format!(
                "tile overlap {} is outside [0, {MAX_OVERLAP}]",
                self.overlap
            ));
        }
        if !(0.0..=1.0).contains(&self.match_thresh) {
            return Err(format!(
                "tile match threshold {} is outside [0, 1]",
                self.match_thresh
            ));
        }
        Ok(())
    }
}

/// The starts of the tiles along one axis of `len` pixels: 0, step, 2·step, … and a last tile
/// ending at `len` (`[0]` when `len <= size`).
fn starts(len: u32, size: u32, step: u32) -> Vec<u32> {
    if len <= size {
        return vec![0];
    }
    let mut v = Vec::new();
    let mut s = 0u32;
    while s + size < len {
        v.push(s);
        s += step;
    }
    v.push(len - size);
    v.dedup();
    v
}

/// The tiles `[x0, y0, x1, y1]` (pixels, end exclusive) of a `w × h` image: squares of `size`
/// (cut to the image where it is smaller), neighbours overlapping by `overlap · size` pixels
/// (rounded down; at least one pixel of advance), in rows from the top left. Every tile has the
/// same size. `size` 0 gives the whole image.
pub fn grid(w: u32, h: u32, size: u32, overlap: f32) -> Vec<[u32; 4]> {
    if size == 0 {
        return vec![[0, 0, w, h]];
    }
    let ov = (size as f64 * overlap.clamp(0.0, MAX_OVERLAP) as f64).floor() as u32;
    let step = size.saturating_sub(ov).max(1);
    let (tw, th) = (size.min(w), size.min(h));
    let xs = starts(w, size, step);
    let ys = starts(h, size, step);
    let mut out = Vec::with_capacity(xs.len() * ys.len());
    for &y in &ys {
        for &x in &xs {
            out.push([x, y, x + tw, y + th]);
        }
    }
    out
}

/// One detection before merging: the row in image pixels, the tile it came from (an index into
/// [`grid`], or `usize::MAX` for the whole-image pass), the region that tile covers, and which of
/// its sides lie on an inner tile border (a border of the tile that is not the image's): such a
/// box may be a piece of a larger one, and those sides are where the tile ended, not where the
/// object does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Piece {
    /// `[x1, y1, x2, y2, conf, cls]`, image pixels.
    pub row: Row,
    /// The tile's index, `usize::MAX` for the whole image.
    pub tile: usize,
    /// The tile `[x0, y0, x1, y1]` in image pixels (the whole image for the whole-image pass):
    /// where the detector looked.
    pub seen: [f32; 4],
    /// Sides `[x1, y1, x2, y2]` on an inner border of the tile ([`cut_sides`]).
    pub cut: [bool; 4],
}

impl Piece {
    /// A box none of whose sides is on an inner tile border, found in the tile `tile` that
    /// covers `seen`.
    pub fn whole(row: Row, tile: usize, seen: [f32; 4]) -> Self {
        Self {
            row,
            tile,
            seen,
            cut: [false; 4],
        }
    }

    fn is_cut(&self) -> bool {
        self.cut.iter().any(|&c| c)
    }
}

/// Which sides `[x1, y1, x2, y2]` of the box `b` (image pixels) lie within `margin` pixels of a
/// border of `tile` that is inside the `w × h` image.
pub fn cut_sides(b: [f32; 4], tile: [u32; 4], (w, h): (u32, u32), margin: f32) -> [bool; 4] {
    let [x0, y0, x1, y1] = tile.map(|v| v as f32);
    [
        tile[0] > 0 && b[0] <= x0 + margin,
        tile[1] > 0 && b[1] <= y0 + margin,
        tile[2] < w && b[2] >= x1 - margin,
        tile[3] < h && b[3] >= y1 - margin,
    ]
}

/// Two pieces of one object as one box, side by side: a side cut in one piece and not in the
/// other is the other's (that tile saw where the object ends); a side both saw is the better
/// piece's (`k`, the first); a side both cut is the outermost. Confidence and class: `k`'s.
fn join(k: Piece, p: Piece) -> Piece {
    let mut out = k;
    out.seen = [
        k.seen[0].min(p.seen[0]),
        k.seen[1].min(p.seen[1]),
        k.seen[2].max(p.seen[2]),
        k.seen[3].max(p.seen[3]),
    ];
    for s in 0..4 {
        let outer = |a: f32, b: f32| if s < 2 { a.min(b) } else { a.max(b) };
        (out.row[s], out.cut[s]) = match (k.cut[s], p.cut[s]) {
            (true, false) => (p.row[s], false),
            (true, true) => (outer(k.row[s], p.row[s]), true),
            _ => (k.row[s], false),
        };
    }
    out
}

/// Whether two cut pieces of different tiles are pieces of one object: the smaller lies inside
/// the other by more than `match_thresh` of its area. Pieces cut on facing sides (one where its
/// tile ends on the right, the other where its tile ends on the left; or top and bottom) whose
/// union is longer across that border than the tiles' overlap (an object no tile could see
/// whole) are compared where both tiles looked (the intersection of their regions, the overlap
/// zone), where both tiles saw the same part of the object, by IoU: such pieces overlap each
/// other only there. Other pieces, and tiles that do not overlap (`--tile-overlap 0`: no zone),
/// are compared whole (on the BCCD large-image test, comparing such pairs in the zone by the
/// share of the smaller lowered mAP50-95 from 0.515 to 0.512).
fn one_object(k: &Piece, p: &Piece, match_thresh: f32) -> bool {
    let zone = [
        k.seen[0].max(p.seen[0]),
        k.seen[1].max(p.seen[1]),
        k.seen[2].min(p.seen[2]),
        k.seen[3].min(p.seen[3]),
    ];
    let (r, q) = (&k.row, &p.row);
    let longer = |lo: usize, hi: usize| r[hi].max(q[hi]) - r[lo].min(q[lo]) > zone[hi] - zone[lo];
    let across_x = ((k.cut[2] && p.cut[0]) || (k.cut[0] && p.cut[2])) && longer(0, 2);
    let across_y = ((k.cut[3] && p.cut[1]) || (k.cut[1] && p.cut[3])) && longer(1, 3);
    if (across_x || across_y) && zone[2] > zone[0] && zone[3] > zone[1] {
        let clip = |r: &Row| -> Row {
            [
                r[0].max(zone[0]),
                r[1].max(zone[1]),
                r[2].min(zone[2]),
                r[3].min(zone[3]),
                r[4],
                r[5],
            ]
        };
        // Both tiles saw the same part: the clipped pieces must agree (IoU, not the share of
        // the smaller, which two neighbouring objects reaching into the zone can also pass).
        let (a, b) = (clip(r), clip(q));
        let (aa, ab) = (area(&a), area(&b));
        let i = intersection(&a, &b);
        return aa > 0.0 && ab > 0.0 && i > match_thresh * (aa + ab - i);
    }
    let (aa, ab) = (area(r), area(q));
    aa > 0.0 && ab > 0.0 && intersection(r, q) > match_thresh * aa.min(ab)
}

/// Merges the detections of the tiles (and of the whole-image pass), class by class (all
/// together when `agnostic`):
/// 1. a piece cut by its tile's inner border that lies inside a whole (uncut) box of another tile
///    (intersection over the piece's area above `match_thresh`) is dropped: that tile saw the
///    object whole;
/// 2. the remaining cut pieces, best first, absorb the cut pieces of other tiles that overlap
///    them by more than `match_thresh` of the smaller box where both tiles looked (`one_object`:
///    the object no tile saw whole; SAHI's greedy non-maximum merging, restricted to cut pieces
///    and measured in the overlap zone), each side of the merged box taken from a piece that saw
///    it (`join`);
/// 3. NMS at `iou_thres` over the whole boxes and the merged pieces (duplicates of the overlap
///    zones and of the whole-image pass).
///
/// Returns at most `max_det` rows by decreasing confidence.
pub fn merge(
    pieces: Vec<Piece>,
    iou_thres: f64,
    match_thresh: f32,
    agnostic: bool,
    max_det: usize,
) -> Vec<Row> {
    merge_groups(&pieces, iou_thres, match_thresh, agnostic, max_det)
        .into_iter()
        .map(|(row, _)| row)
        .collect()
}

/// [`merge`], each kept row with the indices into `pieces` of the pieces it was made of (one
/// for a box a tile saw whole, several for pieces joined in step 2, the best first): what an
/// instance mask of the merged box is the union of ([`crate::detect::masks::Mask::union`]).
pub fn merge_groups(
    pieces: &[Piece],
    iou_thres: f64,
    match_thresh: f32,
    agnostic: bool,
    max_det: usize,
) -> Vec<(Row, Vec<usize>)> {
    let same_class = |a: &Row, b: &Row| agnostic || a[5] == b[5];
    let (whole, cut): (Vec<usize>, Vec<usize>) =
        (0..pieces.len()).partition(|&i| !pieces[i].is_cut());
    // 1. Pieces seen whole by another tile.
    let mut cut: Vec<usize> = cut
        .into_iter()
        .filter(|&i| {
            let p = &pieces[i];
            let ap = area(&p.row);
            !whole.iter().map(|&w| &pieces[w]).any(|w| {
                w.tile != p.tile
                    && same_class(&w.row, &p.row)
                    && intersection(&w.row, &p.row) > match_thresh * ap
            })
        })
        .collect();
    // 2. Pieces of the same object in several tiles (stable: equal confidences keep their order).
    cut.sort_by(|&a, &b| pieces[b].row[4].total_cmp(&pieces[a].row[4]));
    let mut gone = vec![false; cut.len()];
    let mut groups: Vec<(Row, Vec<usize>)> =
        whole.iter().map(|&w| (pieces[w].row, vec![w])).collect();
    for i in 0..cut.len() {
        if gone[i] {
            continue;
        }
        let mut k = pieces[cut[i]];
        let mut members = vec![cut[i]];
        let mut tiles = vec![k.tile];
        for j in i + 1..cut.len() {
            let p = pieces[cut[j]];
            if gone[j] || tiles.contains(&p.tile) || !same_class(&k.row, &p.row) {
                continue;
            }
            if one_object(&k, &p, match_thresh) {
                gone[j] = true;
                tiles.push(p.tile);
                members.push(cut[j]);
                k = join(k, p);
            }
        }
        groups.push((k.row, members));
    }
    // 3. NMS across tiles: the detector's own NMS ([`nms`]) class by class (boxes of a large
    // image can lie beyond the class offset of `batched_nms`).
    let class_of = |r: &Row| if agnostic { 0 } else { r[5] as usize };
    let mut classes: Vec<usize> = groups.iter().map(|g| class_of(&g.0)).collect();
    classes.sort_unstable();
    classes.dedup();
    let mut kept: Vec<usize> = Vec::new();
    for c in classes {
        let of_c: Vec<usize> = (0..groups.len())
            .filter(|&g| class_of(&groups[g].0) == c)
            .collect();
        let boxes: Vec<[f32; 4]> = of_c
            .iter()
            .map(|&g| {
                let r = &groups[g].0;
                [r[0], r[1], r[2], r[3]]
            })
            .collect();
        let scores: Vec<f32> = of_c.iter().map(|&g| groups[g].0[4]).collect();
        kept.extend(nms(&boxes, &scores, iou_thres).into_iter().map(|k| of_c[k]));
    }
    kept.sort_by(|&a, &b| groups[b].0[4].total_cmp(&groups[a].0[4]));
    kept.truncate(max_det);
    let mut groups: Vec<Option<(Row, Vec<usize>)>> = groups.into_iter().map(Some).collect();
    kept.into_iter().filter_map(|g| groups[g].take()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_the_image_with_equal_overlapping_tiles() {
        // 2560 wide, 640 tiles, overlap 0.2 -> step 512: 0, 512, 1024, 1536, then 1920 (end).
        let g = grid(2560, 1920, 640, 0.2);
        let xs: Vec<u32> = g.iter().filter(|t| t[1] == 0).map(|t| t[0]).collect();
        let ys: Vec<u32> = g.iter().filter(|t| t[0] == 0).map(|t| t[1]).collect();
        assert_eq!(xs, [0, 512, 1024, 1536, 1920]);
        assert_eq!(ys, [0, 512, 1024, 1280]);
        assert!(g.iter().all(|t| t[2] - t[0] == 640 && t[3] - t[1] == 640));
        // Smaller than a tile: one tile, the image.
        assert_eq!(grid(500, 300, 640, 0.2), vec![[0, 0, 500, 300]]);
        // One axis larger: tiles as tall as the image.
        assert_eq!(
            grid(1000, 300, 640, 0.0),
            vec![[0, 0, 640, 300], [360, 0, 1000, 300]]
        );
        // Exactly 2 tiles without overlap.
        assert_eq!(grid(1280, 640, 640, 0.0).len(), 2);
    }

    #[test]
    fn merge_recombines_a_cut_box_and_suppresses_duplicates() {
        // The detector's defaults: NMS IoU 0.45, merge above half the smaller box.
        let merge_ = |pieces| merge(pieces, 0.45, 0.5, false, 100);
        // Tile 0 covers 0..640, tile 1 512..1152 (x), both 0..640 (y); the whole image 0..1152.
        let seen = |tile: usize| match tile {
            0 => [0.0, 0.0, 640.0, 640.0],
            1 => [512.0, 0.0, 1152.0, 640.0],
            _ => [0.0, 0.0, 1152.0, 640.0],
        };
        let p = |row: Row, tile, cut: bool| Piece {
            row,
            tile,
            seen: seen(tile),
            cut: if cut {
                [true, false, true, false]
            } else {
                [false; 4]
            },
        };
        // An object 600..700 across the border at x = 640 of tiles 0 (0..640) and 1 (512..1152):
        // tile 0 sees 600..640 (cut), tile 1 sees it whole 600..700.
        let rows = merge_(vec![
            p([600.0, 10.0, 640.0, 60.0, 0.9, 0.0], 0, true),
            p([601.0, 11.0, 700.0, 61.0, 0.8, 0.0], 1, false),
            // Another class at the same place is kept.
            p([600.0, 10.0, 640.0, 60.0, 0.7, 1.0], 0, true),
            // A duplicate of the whole box from the full-image pass is suppressed.
            p([602.0, 10.0, 699.0, 60.0, 0.6, 0.0], usize::MAX, false),
        ]);
        assert_eq!(
            rows,
            vec![
                [601.0, 11.0, 700.0, 61.0, 0.8, 0.0],
                [600.0, 10.0, 640.0, 60.0, 0.7, 1.0]
            ]
        );
        // An object larger than the overlap, cut in both tiles: the pieces become their union.
        let rows = merge_(vec![
            p([500.0, 0.0, 640.0, 100.0, 0.9, 0.0], 0, true),
            p([512.0, 0.0, 700.0, 100.0, 0.8, 0.0], 1, true),
        ]);
        assert_eq!(rows, vec![[500.0, 0.0, 700.0, 100.0, 0.9, 0.0]]);
        // Side by side: tile 0 (0..640) cut the right side, tile 1 (512..) the left; the merged
        // box takes x1 from tile 0, x2 from tile 1, and y from the better piece.
        let piece = |row: Row, tile, cut| Piece {
            row,
            tile,
            seen: seen(tile),
            cut,
        };
        let rows = merge_(vec![
            piece(
                [500.0, 10.0, 640.0, 100.0, 0.9, 0.0],
                0,
                [false, false, true, false],
            ),
            piece(
                [512.0, 12.0, 690.0, 98.0, 0.8, 0.0],
                1,
                [true, false, false, false],
            ),
        ]);
        assert_eq!(rows, vec![[500.0, 10.0, 690.0, 100.0, 0.9, 0.0]]);
        // An object far longer than the overlap (100..1000): the pieces overlap by 128 of 488 px
        // (0.26 of the smaller) but agree where both tiles looked (512..640): one object.
        let (right, left) = ([false, false, true, false], [true, false, false, false]);
        let rows = merge_(vec![
            piece([100.0, 0.0, 640.0, 100.0, 0.9, 0.0], 0, right),
            piece([512.0, 0.0, 1000.0, 100.0, 0.8, 0.0], 1, left),
        ]);
        assert_eq!(rows, vec![[100.0, 0.0, 1000.0, 100.0, 0.9, 0.0]]);
        // Two objects cut at the borders that do not meet in the zone stay two.
        let rows = merge_(vec![
            piece([600.0, 0.0, 640.0, 50.0, 0.9, 0.0], 0, right),
            piece([512.0, 60.0, 700.0, 100.0, 0.8, 0.0], 1, left),
        ]);
        assert_eq!(rows.len(), 2);
        // Two whole boxes (neither cut) overlapping with IoS > 0.5 but IoU < 0.45 stay apart,
        // and a small box inside a whole one of another tile is not merged into it.
        let rows = merge_(vec![
            p([0.0, 0.0, 100.0, 100.0, 0.9, 0.0], 0, false),
            p([50.0, 0.0, 110.0, 60.0, 0.8, 0.0], 1, false),
        ]);
        assert_eq!(rows.len(), 2);
        // A whole box covers a cut piece of another tile: the piece is dropped, the box kept.
        let rows = merge_(vec![
            p([0.0, 0.0, 100.0, 100.0, 0.9, 0.0], 0, false),
            p([60.0, 0.0, 130.0, 100.0, 0.5, 0.0], 1, true),
        ]);
        assert_eq!(rows, vec![[0.0, 0.0, 100.0, 100.0, 0.9, 0.0]]);
        // max_det keeps the best.
        let many: Vec<Piece> = (0..10)
            .map(|i| {
                p(
                    [
                        i as f32 * 50.0,
                        0.0,
                        i as f32 * 50.0 + 10.0,
                        10.0,
                        i as f32 / 10.0,
                        0.0,
                    ],
                    0,
                    false,
                )
            })
            .collect();
        let rows = merge(many, 0.45, 0.5, false, 3);
        assert_eq!(
            rows.iter().map(|r| r[4]).collect::<Vec<_>>(),
            [0.9, 0.8, 0.7]
        );
    }

    #[test]
    fn inner_borders_only() {
        let t = [512, 0, 1152, 640];
        // Left border at 512 is inner; top at 0 is the image's.
        assert_eq!(
            cut_sides([513.0, 0.0, 600.0, 50.0], t, (2000, 2000), 2.0),
            [true, false, false, false]
        );
        assert_eq!(
            cut_sides([520.0, 0.0, 600.0, 640.0], t, (2000, 2000), 2.0),
            [false, false, false, true]
        );
        // Right border at 1152 = image width: not inner.
        assert_eq!(
            cut_sides([1000.0, 10.0, 1152.0, 50.0], t, (1152, 2000), 2.0),
            [false; 4]
        );
        assert_eq!(
            cut_sides([1000.0, 10.0, 1151.0, 50.0], t, (1153, 2000), 2.0),
            [false, false, true, false]
        );
    }
}
