//! YOLO label files: one object per line, `cls cx cy w h` normalized to 0..1 (the official
//! `utils/dataloaders.py verify_image_label` format), or a polygon `cls x1 y1 x2 y2 ... xn yn`
//! (n ≥ 3) used as its enclosing box (official `segments2boxes`).
//!
//! Unlike the official loader, which drops the whole image for one bad value, every line is judged
//! on its own and a bad line drops only that line, reported as [`Issue`] `file:line: value → action`.
//! The rules, in order:
//! 1. Blank lines are skipped; fields are split on any ASCII whitespace (so CRLF, tabs and repeated
//!    spaces are fine); numbers follow Rust's `f64` grammar (`7.06250e-1`, `.792188` accepted).
//!    A leading UTF-8 byte-order mark is ignored.
//! 2. 5 fields = box; an odd count ≥ 7 = polygon; anything else drops the line.
//! 3. The class must be a non-negative integer (`2` or `2.0`) below `nc`.
//! 4. Every coordinate must be finite and inside `[0, 1]` give or take [`EDGE_TOL`]; beyond that the
//!    line is dropped. A box needs `w > 0` and `h > 0`.
//! 5. A box (or polygon extent) crossing the image edge is clipped to `[0, 1]`; the clip is reported
//!    when an edge moved by more than 1e-6. A box left with no area after clipping is dropped.
//! 6. Exact repeats of an earlier row (same class and same f32 values) are removed, with one
//!    report per file giving the count.
//! 7. A polygon's points are kept (clipped to `[0, 1]`) for segmentation
//!    ([`ParsedLabels::segments`]); a polygon whose outline crosses itself or that encloses no
//!    area is kept and reported ([`IssueKind::PolygonOdd`]): its mask fills by the even-odd
//!    rule, or is empty.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

/// How far outside `[0, 1]` a normalized value may be before its line is dropped (float noise from
/// exporters, e.g. `1.0000004`, is within it and gets clipped).
pub const EDGE_TOL: f64 = 1e-3;

/// One object: class id and a box in normalized image coordinates (fractions of width/height),
/// centre format. After parsing, `0 < w, h ≤ 1` and the box lies inside `[0, 1]²`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LabelBox {
    /// Class id, `0..nc`.
    pub cls: u32,
    /// Box centre x, normalized.
    pub cx: f32,
    /// Box centre y, normalized.
    pub cy: f32,
    /// Box width, normalized.
    pub w: f32,
    /// Box height, normalized.
    pub h: f32,
}

impl LabelBox {
    /// Corners `[x1, y1, x2, y2]`, normalized.
    pub fn xyxy(&self) -> [f32; 4] {
        [
            self.cx - self.w / 2.0,
            self.cy - self.h / 2.0,
            self.cx + self.w / 2.0,
            self.cy + self.h / 2.0,
        ]
    }
}

/// What kind of problem an [`Issue`] reports (used for counting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IssueKind {
    /// A label line was dropped (the rest of the file is kept).
    RowDropped,
    /// A box crossing the image edge was clipped.
    RowClipped,
    /// Repeated rows in one file were removed.
    DuplicatesRemoved,
    /// An image cannot be used (unreadable, unknown format, truncated, too small) and is skipped.
    ImageSkipped,
    /// An image is used but something about it is odd (e.g. content does not match the extension).
    ImageNote,
    /// A label file with no matching image.
    OrphanLabel,
    /// Labels were taken from `.txt` files beside the images.
    SidecarLabels,
    /// A label file exists but cannot be read; the image is treated as unlabelled.
    LabelUnreadable,
    /// Crowd annotations (`iscrowd: 1`) of a COCO JSON file were ignored
    /// ([`super::coco_json`]).
    CrowdIgnored,
    /// An instance outline is odd: a polygon row kept although its outline crosses itself or
    /// encloses no area, or a COCO JSON RLE `segmentation` that cannot be decoded (its box kept
    /// without an outline).
    PolygonOdd,
}

/// One reported problem: `path[:line]: value → action`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Issue {
    /// The file concerned (absolute).
    pub path: PathBuf,
    /// 1-based line number in a label file, when the problem is one line.
    pub line: Option<usize>,
    /// The offending value, e.g. `class 7` or `x=1.2`.
    pub value: String,
    /// What was done, e.g. `row dropped (valid classes 0..1, nc: 2)`.
    pub action: String,
    /// The category, for counting.
    pub kind: IssueKind,
}

impl Issue {
    /// The issue as text, with `path` shown relative to `root` when it lies under it.
    pub fn display_relative(&self, root: &Path) -> String {
        let p = self.path.strip_prefix(root).unwrap_or(&self.path);
        // Paths, values and COCO file names come from the data: shown escaped.
        let line = match self.line {
            Some(l) => format!(
                "{}:{l}: {} → {}",
                crate::text::path(&p),
                self.value,
                self.action
            ),
            None => format!(
                "{}: {} → {}",
                crate::text::path(&p),
                self.value,
                self.action
            ),
        };
        crate::text::escape(&line).into_owned()
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display_relative(Path::new("")))
    }
}

/// The result of parsing one label file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedLabels {
    /// The boxes kept, in file order (first occurrence of repeated rows).
    pub boxes: Vec<LabelBox>,
    /// Per kept box, its polygon's points `[x, y]` normalized and clipped to `[0, 1]` (a
    /// polygon row), or empty (a box row): the instance outlines of segmentation training.
    pub segments: Vec<Vec<[f32; 2]>>,
    /// Every problem found (dropped lines, clips, one duplicates report).
    pub issues: Vec<Issue>,
    /// Polygon lines converted to their bounding box.
    pub polygons: usize,
    /// Rows removed as exact repeats.
    pub duplicates: usize,
}

/// Parses the text of a label file (`path` is only used in the reports) for a dataset of `nc`
/// classes, applying the rules of the module documentation. Never fails: bad lines become issues.
pub fn parse_labels(text: &str, nc: usize, path: &Path) -> ParsedLabels {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Line ends: `\n`, `\r\n`, and a lone `\r` (classic Mac files, which `lines()` would read as
    // one line and so as one garbage polygon).
    let normalized;
    let text = if text.contains('\r') {
        normalized = text.replace("\r\n", "\n").replace('\r', "\n");
        normalized.as_str()
    } else {
        text
    };
    let mut out = ParsedLabels::default();
    let mut dup_lines = Vec::new();
    let mut seen: std::collections::HashSet<[u32; 5]> = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        if fields.is_empty() {
            continue;
        }
        let lineno = i + 1;
        let issue = |value: String, action: String, kind| Issue {
            path: path.to_path_buf(),
            line: Some(lineno),
            value,
            action,
            kind,
        };
        match parse_row(&fields, nc) {
            Err((value, why)) => out.issues.push(issue(
                value,
                format!("row dropped: {why}"),
                IssueKind::RowDropped,
            )),
            Ok(row) => {
                if row.polygon {
                    out.polygons += 1;
                }
                if let Some((value, action)) = row.clipped {
                    out.issues.push(issue(value, action, IssueKind::RowClipped));
                }
                let b = row.bx;
                let key = [
                    b.cls,
                    b.cx.to_bits(),
                    b.cy.to_bits(),
                    b.w.to_bits(),
                    b.h.to_bits(),
                ];
                if seen.insert(key) {
                    if let Some(why) = polygon_oddity(&row.points) {
                        out.issues.push(issue(
                            format!("polygon of {} points", row.points.len()),
                            format!("kept: {why}"),
                            IssueKind::PolygonOdd,
                        ));
                    }
                    out.boxes.push(b);
                    out.segments.push(row.points);
                } else {
                    dup_lines.push(lineno);
                }
            }
        }
    }
    if !dup_lines.is_empty() {
        out.duplicates = dup_lines.len();
        // The first line numbers, then a count: a file of a million repeats gets one short line.
        const SHOWN: usize = 10;
        let mut lines: Vec<String> = dup_lines
            .iter()
            .take(SHOWN)
            .map(|l| l.to_string())
            .collect();
        if dup_lines.len() > SHOWN {
            lines.push(format!("... and {} more", dup_lines.len() - SHOWN));
        }
        out.issues.push(Issue {
            path: path.to_path_buf(),
            line: None,
            value: format!(
                "{} duplicate row{} (line{} {})",
                dup_lines.len(),
                if dup_lines.len() == 1 { "" } else { "s" },
                if dup_lines.len() == 1 { "" } else { "s" },
                lines.join(", ")
            ),
            action: "removed, first occurrence kept".to_string(),
            kind: IssueKind::DuplicatesRemoved,
        });
    }
    out
}

struct Row {
    bx: LabelBox,
    polygon: bool,
    /// A polygon's points, clipped to `[0, 1]`; empty for a box.
    points: Vec<[f32; 2]>,
    /// (value, action) when the box was clipped.
    clipped: Option<(String, String)>,
}

/// One non-blank line → a box, or (value, reason) for the drop report.
fn parse_row(fields: &[&str], nc: usize) -> Result<Row, (String, String)> {
    let n = fields.len();
    let polygon = n >= 7 && !n.is_multiple_of(2);
    if n != 5 && !polygon {
        return Err((
            format!("{n} values"),
            "expected 5 (cls cx cy w h) or a class and 3 or more x y pairs".to_string(),
        ));
    }
    let cls = match fields[0].parse::<f64>() {
        Ok(c) if c.is_finite() && c >= 0.0 && c.fract() == 0.0 && c < u32::MAX as f64 => c as u32,
        _ => {
            return Err((
                format!("class {:?}", fields[0]),
                "the class must be a non-negative integer".to_string(),
            ))
        }
    };
    if cls as usize >= nc {
        return Err((
            format!("class {cls}"),
            format!("valid classes are 0..{} (nc: {nc} in data.yaml)", nc - 1),
        ));
    }
    let mut vals = Vec::with_capacity(n - 1);
    for (k, f) in fields[1..].iter().enumerate() {
        let name = field_name(polygon, k);
        match f.parse::<f64>() {
            Ok(v) if v.is_finite() => vals.push(v),
            _ => return Err((format!("{name}={f:?}"), "not a finite number".to_string())),
        }
    }
    let out_of_range: Vec<String> = vals
        .iter()
        .enumerate()
        .filter(|&(_, &v)| !(-EDGE_TOL..=1.0 + EDGE_TOL).contains(&v))
        .map(|(k, v)| format!("{}={}", field_name(polygon, k), v))
        .collect();
    if !out_of_range.is_empty() {
        return Err((
            out_of_range.join(" "),
            format!("normalized values must lie in [0, 1] (tolerance {EDGE_TOL})"),
        ));
    }
    // raw corners
    let (x1, y1, x2, y2) = if polygon {
        let xs = vals.iter().step_by(2);
        let ys = vals.iter().skip(1).step_by(2);
        let (mut x1, mut x2) = (f64::INFINITY, f64::NEG_INFINITY);
        for &x in xs {
            x1 = x1.min(x);
            x2 = x2.max(x);
        }
        let (mut y1, mut y2) = (f64::INFINITY, f64::NEG_INFINITY);
        for &y in ys {
            y1 = y1.min(y);
            y2 = y2.max(y);
        }
        (x1, y1, x2, y2)
    } else {
        let (cx, cy, w, h) = (vals[0], vals[1], vals[2], vals[3]);
        if w <= 0.0 || h <= 0.0 {
            let bad: Vec<String> = [("w", w), ("h", h)]
                .iter()
                .filter(|(_, v)| *v <= 0.0)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            return Err((bad.join(" "), "zero or negative size".to_string()));
        }
        (cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0)
    };
    let (cx1, cy1, cx2, cy2) = (
        x1.clamp(0.0, 1.0),
        y1.clamp(0.0, 1.0),
        x2.clamp(0.0, 1.0),
        y2.clamp(0.0, 1.0),
    );
    if cx2 - cx1 <= 0.0 || cy2 - cy1 <= 0.0 {
        return Err((
            format!("box x {x1:.6}..{x2:.6} y {y1:.6}..{y2:.6}"),
            "no area inside the image".to_string(),
        ));
    }
    let moved = [(x1, cx1), (y1, cy1), (x2, cx2), (y2, cy2)]
        .iter()
        .any(|(a, b)| (a - b).abs() > 1e-6);
    let clipped = moved.then(|| {
        (
            format!("box x {x1:.6}..{x2:.6} y {y1:.6}..{y2:.6}"),
            format!("clipped to the image: x {cx1:.6}..{cx2:.6} y {cy1:.6}..{cy2:.6}"),
        )
    });
    let bx = LabelBox {
        cls,
        cx: ((cx1 + cx2) / 2.0) as f32,
        cy: ((cy1 + cy2) / 2.0) as f32,
        w: (cx2 - cx1) as f32,
        h: (cy2 - cy1) as f32,
    };
    // a box that needed no clipping keeps its values exactly as written (no round trip through
    // corners); float noise below 1e-6 is clipped silently
    let inside = (x1, y1, x2, y2) == (cx1, cy1, cx2, cy2);
    let bx = if !polygon && inside {
        LabelBox {
            cls,
            cx: vals[0] as f32,
            cy: vals[1] as f32,
            w: vals[2] as f32,
            h: vals[3] as f32,
        }
    } else {
        bx
    };
    let points = if polygon {
        vals.chunks_exact(2)
            .map(|p| [p[0].clamp(0.0, 1.0) as f32, p[1].clamp(0.0, 1.0) as f32])
            .collect()
    } else {
        Vec::new()
    };
    Ok(Row {
        bx,
        polygon,
        points,
        clipped,
    })
}

/// Most polygon points checked for self-crossing (the check is quadratic); longer outlines are
/// not checked.
pub const MAX_CROSSING_CHECK_POINTS: usize = 2000;

/// Why a polygon is odd: it encloses no area (collinear or repeated points), or two of its
/// non-adjacent edges cross. `None` for a box (no points) and a simple polygon.
pub fn polygon_oddity(points: &[[f32; 2]]) -> Option<String> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let p = |i: usize| -> [f64; 2] { [f64::from(points[i % n][0]), f64::from(points[i % n][1])] };
    let cross = |o: [f64; 2], a: [f64; 2], b: [f64; 2]| -> f64 {
        (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
    };
    let pairs = if n > MAX_CROSSING_CHECK_POINTS { 0 } else { n };
    for i in 0..pairs {
        for j in i + 2..n {
            if i == 0 && j == n - 1 {
                continue; // adjacent through the closing edge
            }
            let (a, b, c, d) = (p(i), p(i + 1), p(j), p(j + 1));
            let (d1, d2) = (cross(a, b, c), cross(a, b, d));
            let (d3, d4) = (cross(c, d, a), cross(c, d, b));
            if d1 * d2 < 0.0 && d3 * d4 < 0.0 {
                return Some(format!(
                    "its outline crosses itself (edges {} and {}; the mask fills by the even-odd \
                     rule)",
                    i + 1,
                    j + 1
                ));
            }
        }
    }
    let twice_area: f64 = (0..n)
        .map(|i| {
            let (a, b) = (p(i), p(i + 1));
            a[0] * b[1] - b[0] * a[1]
        })
        .sum();
    // (A crossing outline, such as a symmetric bow tie, can also sum to 0: reported above.)
    if twice_area.abs() < 1e-12 {
        return Some("it encloses no area (its mask is empty)".into());
    }
    None
}

fn field_name(polygon: bool, k: usize) -> String {
    if polygon {
        format!(
            "{}{}",
            if k.is_multiple_of(2) { "x" } else { "y" },
            k / 2 + 1
        )
    } else {
        ["x", "y", "w", "h"][k].to_string()
    }
}
