//! COCO JSON annotations as a dataset split: a `train:`/`val:`/`test:` entry of `data.yaml` may
//! name a COCO annotations file (`{images, annotations, categories}`: a Roboflow COCO export's
//! `train/_annotations.coco.json`, or COCO's `annotations/instances_train2017.json`). The scan
//! ([`super::scan`]) reads its images and boxes from here instead of from `labels/*.txt`, then
//! judges every image exactly as for a YOLO layout (decode check, counts, label cache).
//!
//! Rules:
//! - **Classes**: the categories of every COCO JSON file named in the yaml, merged by id, sorted
//!   by id, become the contiguous classes `0..nc` ([`CocoClasses`]; the same id with two names is
//!   an error). A category that is only a parent (another category names it as its
//!   `supercategory`) and has no annotation in any file is left out, with a notice: Roboflow
//!   exports write such a category (id 0, e.g. `cells`) above the real ones.
//! - **Images**: `file_name` is resolved against the JSON's folder, then `images/` beside the
//!   JSON, then `../images/` and `../images/<json stem without "instances_">/` (COCO's
//!   `annotations/instances_val2017.json` beside `images/val2017/`); the first that exists is used.
//!   An image listed with no (non-crowd) annotation is a background image.
//! - **Boxes**: `bbox` `[x, y, w, h]` in pixels (top-left corner) → normalized centre format,
//!   relative to the `width`/`height` the JSON gives for the image (the decoded size when it gives
//!   none); a box crossing the image edge is clipped, one left without area is dropped (as label
//!   rows, [`super::labels`]). `iscrowd: 1` boxes are ignored, as COCO training does (one notice
//!   per file with the count).
//! - **Outlines** (segmentation): an annotation's polygon `segmentation` (`[[x1, y1, …], …]`,
//!   pixels) becomes its box's outline, several polygons joined into one as the Ultralytics COCO
//!   converter does ([`crate::data::polygons::merge_polygons`]), normalized and clipped like the
//!   box; an RLE `segmentation` (`{counts, size: [h, w]}`, the counts a list of runs or
//!   pycocotools' compressed string) is decoded into its mask (column-major, as pycocotools) and
//!   becomes the outline of the mask's largest 8-connected part
//!   ([`crate::data::outline::largest_outline`]: the pixel boundary's corners, as Ultralytics'
//!   `masks2segments` keeps the largest). An RLE that cannot be decoded (bad characters, runs
//!   that do not cover `h·w` pixels, a size that does not fit) is reported, and the box stands
//!   for its outline. Crowd annotations (RLE, mostly) are ignored with their box.
//! - **Bad records** never stop the scan: each is an [`Issue`] naming the file, the record
//!   (`annotations[17] (id 42)`) and the value, and is skipped and counted: an image that is not
//!   found or has no usable `id`/`file_name` (counted as a skipped image), an annotation with a
//!   bbox that is not four finite numbers or has a zero or negative width or height, an unknown
//!   `category_id` or `image_id` (counted as dropped rows).
//! - **Whole-file errors** (the split cannot be used): the file cannot be read, is not JSON or is
//!   truncated (the error names the file, line and column), or its top level is not an object with
//!   an `images` list.
//!
//! Why one file (about 570 lines of code, then its unit tests): reading a COCO JSON split, its
//! class mapping and the per-image rows are one format's reader.

use super::labels::{Issue, IssueKind, LabelBox, EDGE_TOL};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// True when `p` names a COCO JSON file (extension `.json`, any case).
pub fn is_coco_json(p: &Path) -> bool {
    p.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// The classes of the COCO JSON files of a dataset: class `i` is category `ids[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CocoClasses {
    /// Category id of each class, ascending (index = class).
    pub ids: Vec<u64>,
    /// Category name of each class.
    pub names: Vec<String>,
    /// What the user should see about the mapping (left-out parent categories, skipped
    /// category records).
    pub notices: Vec<String>,
}

impl CocoClasses {
    /// The class of category `id`, if it is one of the classes.
    pub fn class_of(&self, id: u64) -> Option<u32> {
        self.ids.binary_search(&id).ok().map(|i| i as u32)
    }

    /// `COCO categories → classes: 0: RBC (id 1), 1: WBC (id 2)` with the dataset's `names`
    /// (which may differ from the categories', see [`super::yaml`]).
    pub fn mapping_line(&self, names: &[String]) -> String {
        let pairs: Vec<String> = self
            .ids
            .iter()
            .zip(&self.names)
            .enumerate()
            .map(|(c, (id, n))| match names.get(c) {
                Some(m) if m != n => format!("{c}: {m} (id {id} {n:?})"),
                _ => format!("{c}: {n} (id {id})"),
            })
            .collect();
        format!("COCO categories → classes: {}", pairs.join(", "))
    }

    /// `0: RBC (id 1), 1: WBC (id 2)`: the mapping as one line.
    pub fn describe(&self) -> String {
        self.ids
            .iter()
            .zip(&self.names)
            .enumerate()
            .map(|(c, (id, n))| format!("{c}: {n} (id {id})"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One annotation kept for an image: class and `[x, y, w, h]` in pixels (`w, h > 0`, finite).
#[derive(Debug, Clone, PartialEq)]
pub struct PixelBox {
    /// Class index.
    pub cls: u32,
    /// `[x, y, w, h]`, top-left corner and size, in pixels.
    pub xywh: [f64; 4],
    /// The instance outline from its `segmentation`, in pixels (several polygons joined by
    /// [`crate::data::polygons::merge_polygons`], or an RLE mask's largest part); empty without
    /// one (no polygon of three points, an RLE that cannot be decoded).
    pub outline: Vec<[f64; 2]>,
    /// Why the annotation's `segmentation` gave no outline, when it should have (a bad RLE).
    pub outline_issue: Option<String>,
    /// The record, e.g. `annotations[17] (id 42)`, for reports.
    pub record: String,
}

/// One image of a COCO JSON file, resolved to a file.
#[derive(Debug, Clone, PartialEq)]
pub struct CocoImage {
    /// Its `id` in the JSON file.
    pub id: u64,
    /// The image file (absolute).
    pub image: PathBuf,
    /// The JSON file that lists it.
    pub json: PathBuf,
    /// Its `images[]` record, e.g. `images[3] (id 7)`.
    pub record: String,
    /// `(width, height)` as the JSON gives them, when it does.
    pub size: Option<(u32, u32)>,
    /// Its annotations (crowd ones left out).
    pub boxes: Vec<PixelBox>,
}

/// What one COCO JSON file holds for the scan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CocoSplit {
    /// The usable images, in file order.
    pub images: Vec<CocoImage>,
    /// Bad records (each skipped) and notices.
    pub issues: Vec<Issue>,
    /// `images[]` records skipped (image not found, no id or file name, repeated).
    pub images_skipped: usize,
    /// `annotations[]` records skipped as bad (not counting crowd ones).
    pub annotations_skipped: usize,
    /// Crowd annotations ignored.
    pub crowd: usize,
}

#[derive(Deserialize)]
struct RawFile {
    images: Option<Vec<Value>>,
    #[serde(default)]
    annotations: Vec<RawAnnotation>,
    #[serde(default)]
    categories: Vec<Value>,
}

/// An `annotations[]` entry: only the keys used are kept. A record that is not an object
/// becomes `Other`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawAnnotation {
    Object {
        id: Option<Value>,
        image_id: Option<Value>,
        category_id: Option<Value>,
        bbox: Option<Value>,
        iscrowd: Option<Value>,
        #[serde(default)]
        segmentation: Option<Box<RawSegmentation>>,
    },
    Other(serde::de::IgnoredAny),
}

/// An annotation's `segmentation`: polygons `[[x1, y1, x2, y2, …], …]` in pixels, a run-length
/// encoded mask `{counts, size: [h, w]}`, or anything else (not kept).
#[derive(Deserialize)]
#[serde(untagged)]
enum RawSegmentation {
    Polygons(Vec<Vec<f64>>),
    Rle { counts: RleCounts, size: Value },
    Other(serde::de::IgnoredAny),
}

/// The `counts` of an RLE: the runs as numbers (COCO's uncompressed RLE), or pycocotools'
/// compressed string.
#[derive(Deserialize)]
#[serde(untagged)]
enum RleCounts {
    Runs(Vec<Value>),
    Compressed(String),
}

/// Most pixels of an RLE mask decoded for its outline (a 16k × 16k image).
const MAX_RLE_PIXELS: u64 = 1 << 28;

/// The outline of a `segmentation`, in pixels: polygons of at least three finite points joined
/// into one ([`crate::data::polygons::merge_polygons`]), or the largest part of an RLE mask;
/// empty when there is none. `Err` says why an RLE could not be decoded.
fn outline_of(seg: Option<&RawSegmentation>) -> std::result::Result<Vec<[f64; 2]>, String> {
    match seg {
        Some(RawSegmentation::Polygons(polys)) => {
            let polys: Vec<Vec<[f64; 2]>> = polys
                .iter()
                .filter(|p| p.len() >= 6 && p.len() % 2 == 0 && p.iter().all(|v| v.is_finite()))
                .map(|p| p.chunks_exact(2).map(|c| [c[0], c[1]]).collect())
                .collect();
            Ok(crate::data::polygons::merge_polygons(&polys))
        }
        Some(RawSegmentation::Rle { counts, size }) => {
            let (h, w) = rle_size(size)?;
            let bits = rle_decode(counts, h, w)?;
            Ok(crate::data::outline::largest_outline(&bits, w, h)
                .into_iter()
                .map(|[x, y]| [x as f64, y as f64])
                .collect())
        }
        Some(RawSegmentation::Other(_)) | None => Ok(Vec::new()),
    }
}

/// An RLE's `size` `[h, w]`: two positive integers of at most [`MAX_RLE_PIXELS`] pixels.
fn rle_size(size: &Value) -> std::result::Result<(usize, usize), String> {
    let hw: Option<Vec<u64>> = size
        .as_array()
        .filter(|a| a.len() == 2)
        .and_then(|a| a.iter().map(Value::as_u64).collect());
    match hw.as_deref() {
        Some(&[h, w]) if h > 0 && w > 0 && h.saturating_mul(w) <= MAX_RLE_PIXELS => {
            Ok((h as usize, w as usize))
        }
        _ => Err(format!(
            "RLE size {} is not [height, width] of at most {MAX_RLE_PIXELS} pixels",
            show(Some(size))
        )),
    }
}

/// The `h × w` mask of an RLE, row-major, one byte per pixel (1 inside). The runs alternate
/// 0s and 1s, starting with 0s, over the pixels in column-major order (pycocotools'
/// `rleDecode`); the compressed string is pycocotools' `rleFrString`: each run in 5-bit groups,
/// least significant first, as characters `48 + group` with bit 5 set while more follow and bit
/// 4 of the last group its sign, runs from the third on stored as the difference from the run
/// two before. Errors: a character outside that alphabet, a negative run, runs that do not add
/// up to `h·w`.
fn rle_decode(counts: &RleCounts, h: usize, w: usize) -> std::result::Result<Vec<u8>, String> {
    let total = (h * w) as u64;
    let runs: Vec<u64> = match counts {
        RleCounts::Runs(v) => v
            .iter()
            .map(|r| {
                r.as_u64()
                    .ok_or_else(|| format!("RLE run {r} is not a non-negative integer"))
            })
            .collect::<std::result::Result<_, _>>()?,
        RleCounts::Compressed(s) => {
            let mut runs: Vec<i64> = Vec::new();
            let bytes = s.as_bytes();
            let mut p = 0;
            while p < bytes.len() {
                let (mut x, mut k, mut more) = (0i64, 0u32, true);
                while more {
                    let Some(&ch) = bytes.get(p) else {
                        return Err("compressed RLE ends inside a run".into());
                    };
                    if !(48..48 + 64).contains(&ch) || k > 12 {
                        return Err(format!(
                            "compressed RLE: character {:?} at {p} is not a run's",
                            ch as char
                        ));
                    }
                    let c = (ch - 48) as i64;
                    x |= (c & 0x1f) << (5 * k);
                    more = c & 0x20 != 0;
                    p += 1;
                    k += 1;
                    if !more && c & 0x10 != 0 {
                        x |= -1i64 << (5 * k);
                    }
                }
                if runs.len() > 2 {
                    x += runs[runs.len() - 2];
                }
                runs.push(x);
            }
            runs.into_iter()
                .map(|r| u64::try_from(r).map_err(|_| format!("RLE run {r} is negative")))
                .collect::<std::result::Result<_, _>>()?
        }
    };
    let sum = runs
        .iter()
        .try_fold(0u64, |a, &r| a.checked_add(r))
        .unwrap_or(u64::MAX);
    if sum != total {
        return Err(format!(
            "RLE runs cover {sum} pixels, its size {h}x{w} has {total}"
        ));
    }
    let mut bits = vec![0u8; h * w];
    let mut at = 0usize;
    for (i, &r) in runs.iter().enumerate() {
        let r = r as usize;
        if i % 2 == 1 {
            for q in at..at + r {
                // Column-major index q: row q % h, column q / h.
                bits[(q % h) * w + q / h] = 1;
            }
        }
        at += r;
    }
    Ok(bits)
}

/// Reads and parses `path`. Errors name the file, and the line and column for bad JSON.
fn read_file(path: &Path) -> Result<RawFile> {
    let bytes = super::fsio::read_regular(path, crate::bounded::FileKind::CocoJson)
        .with_context(|| format!("cannot read COCO annotations {}", crate::text::path(&path)))?;
    let raw: RawFile = serde_json::from_slice(&bytes).map_err(|e| {
        let what = if e.is_eof() {
            "the file is truncated"
        } else {
            "it is not a valid COCO annotations file"
        };
        anyhow::anyhow!(
            "{}:{}:{}: {e} ({what}; export or download it again)",
            crate::text::path(&path),
            e.line(),
            e.column()
        )
    })?;
    if raw.images.is_none() {
        bail!(
            "{}: no `images` list (a COCO annotations file has `images`, `annotations` and \
             `categories`; a results file, a plain list, cannot be a dataset split)",
            crate::text::path(&path)
        );
    }
    Ok(raw)
}

/// A JSON value as a non-negative integer id (`7`, `7.0`; strings are not ids).
fn as_id(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 9.0e15)
            .map(|f| f as u64)
    })
}

/// A short text of a JSON value for reports (at most 80 characters).
fn show(v: Option<&Value>) -> String {
    match v {
        None => "missing".into(),
        Some(v) => {
            let s = v.to_string();
            if s.chars().count() > 80 {
                format!("{}…", s.chars().take(80).collect::<String>())
            } else {
                s
            }
        }
    }
}

/// `images[3] (id 7)` / `annotations[17]`.
fn record(list: &str, i: usize, id: Option<&Value>) -> String {
    match id {
        Some(v) if !v.is_null() => format!("{list}[{i}] (id {v})"),
        _ => format!("{list}[{i}]"),
    }
}

/// The classes of the COCO JSON files `files` (see the module doc). Errors: a file cannot be
/// read or parsed, the same category id has two names, or no category is left.
pub fn read_classes(files: &[PathBuf]) -> Result<CocoClasses> {
    let mut cats: BTreeMap<u64, (String, PathBuf)> = BTreeMap::new();
    let mut parents: Vec<String> = Vec::new();
    let mut used: std::collections::HashSet<u64> = Default::default();
    let mut notices = Vec::new();
    for f in files {
        let raw = read_file(f)?;
        for (i, c) in raw.categories.iter().enumerate() {
            let rec = record("categories", i, c.get("id"));
            let Some(id) = as_id(c.get("id")) else {
                notices.push(format!(
                    "{}: {rec}: id {} is not a non-negative integer → category skipped",
                    crate::text::path(&f),
                    show(c.get("id"))
                ));
                continue;
            };
            let Some(name) = c.get("name").and_then(Value::as_str) else {
                notices.push(format!(
                    "{}: {rec}: name {} is not a string → category skipped",
                    crate::text::path(&f),
                    show(c.get("name"))
                ));
                continue;
            };
            if let Some(sup) = c.get("supercategory").and_then(Value::as_str) {
                parents.push(sup.to_string());
            }
            match cats.get(&id) {
                Some((n, other)) if n != name => bail!(
                    "category id {id} is {n:?} in {} but {name:?} in {} (the COCO JSON files of \
                     one dataset must agree on their categories)",
                    crate::text::path(&other),
                    crate::text::path(&f)
                ),
                Some(_) => {}
                None => {
                    cats.insert(id, (name.to_string(), f.clone()));
                }
            }
        }
        for a in &raw.annotations {
            if let RawAnnotation::Object { category_id, .. } = a {
                if let Some(id) = as_id(category_id.as_ref()) {
                    used.insert(id);
                }
            }
        }
    }
    let mut ids = Vec::new();
    let mut names = Vec::new();
    for (id, (name, f)) in cats {
        if !used.contains(&id) && parents.contains(&name) {
            notices.push(format!(
                "{}: category {name:?} (id {id}) is only the supercategory of others and has no \
                 annotation → not a class (as in Roboflow exports)",
                crate::text::path(&f)
            ));
            continue;
        }
        ids.push(id);
        names.push(name);
    }
    if ids.is_empty() {
        bail!(
            "{}: no usable category in `categories` (a COCO annotations file lists its classes \
             as {{\"id\": 1, \"name\": \"...\"}})",
            files
                .iter()
                .map(|f| crate::text::path(&f).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(CocoClasses {
        ids,
        names,
        notices,
    })
}

/// Where `file_name` of an image listed in `json` may be (see the module doc), in the order tried.
pub fn image_candidates(json: &Path, file_name: &str) -> Vec<PathBuf> {
    let dir = json.parent().unwrap_or(Path::new("/"));
    let mut out = vec![dir.join(file_name), dir.join("images").join(file_name)];
    if let Some(up) = dir.parent() {
        out.push(up.join("images").join(file_name));
        if let Some(stem) = json.file_stem().and_then(|s| s.to_str()) {
            let split = stem.strip_prefix("instances_").unwrap_or(stem);
            out.push(up.join("images").join(split).join(file_name));
        }
    }
    out.into_iter()
        .map(|p| super::fsio::normalize(&p))
        .collect()
}

/// Reads the images and boxes of one COCO JSON split file with the dataset's `classes`. Errors
/// only for whole-file problems (see the module doc); every bad record is an issue.
pub fn read_split(json: &Path, classes: &CocoClasses) -> Result<CocoSplit> {
    let raw = read_file(json)?;
    let mut out = CocoSplit::default();
    let issue = |value: String, action: &str, kind| Issue {
        path: json.to_path_buf(),
        line: None,
        value,
        action: action.to_string(),
        kind,
    };
    // image id → index in out.images
    let mut by_id: HashMap<u64, usize> = HashMap::new();
    let mut seen_files: HashMap<PathBuf, String> = HashMap::new();
    let images = raw.images.unwrap_or_default();
    for (i, im) in images.iter().enumerate() {
        match image_record(json, i, im, &by_id, &seen_files) {
            Ok(img) => {
                seen_files.insert(img.image.clone(), img.record.clone());
                by_id.insert(img.id, out.images.len());
                out.images.push(img);
            }
            Err(value) => {
                out.issues
                    .push(issue(value, "image skipped", IssueKind::ImageSkipped));
                out.images_skipped += 1;
            }
        }
    }
    for (i, a) in raw.annotations.iter().enumerate() {
        match annotation_box(i, a, &by_id, classes) {
            Ok(Some((k, b))) => out.images[k].boxes.push(b),
            Ok(None) => out.crowd += 1,
            Err(value) => {
                out.issues
                    .push(issue(value, "annotation skipped", IssueKind::RowDropped));
                out.annotations_skipped += 1;
            }
        }
    }
    if out.crowd > 0 {
        out.issues.push(issue(
            format!("{} crowd annotations (iscrowd: 1)", out.crowd),
            "ignored, as COCO training does",
            IssueKind::CrowdIgnored,
        ));
    }
    Ok(out)
}

/// Record `images[i]` = `im` of `json` resolved to its file (no boxes yet), or why it is
/// skipped: no usable id or file name, an id already in `by_id`, a file not found or already
/// listed (`seen_files`: file → record).
fn image_record(
    json: &Path,
    i: usize,
    im: &Value,
    by_id: &HashMap<u64, usize>,
    seen_files: &HashMap<PathBuf, String>,
) -> std::result::Result<CocoImage, String> {
    let rec = record("images", i, im.get("id"));
    let Some(id) = as_id(im.get("id")) else {
        return Err(format!(
            "{rec}: id {} is not a non-negative integer",
            show(im.get("id"))
        ));
    };
    if by_id.contains_key(&id) {
        return Err(format!("{rec}: id {id} repeats an earlier image's id"));
    }
    let Some(name) = im
        .get("file_name")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    else {
        return Err(format!(
            "{rec}: file_name {} is not a file name",
            show(im.get("file_name"))
        ));
    };
    let tried = image_candidates(json, name);
    let Some(path) = tried.iter().find(|p| p.is_file()).cloned() else {
        return Err(format!(
            "{rec}: file_name {name:?} not found (tried {})",
            tried
                .iter()
                .map(|p| crate::text::path(&p).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    if let Some(first) = seen_files.get(&path) {
        return Err(format!(
            "{rec}: file_name {name:?} is the same file as {first}"
        ));
    }
    let dim = |k: &str| as_id(im.get(k)).filter(|v| *v > 0 && *v <= u32::MAX as u64);
    let size = match (dim("width"), dim("height")) {
        (Some(w), Some(h)) => Some((w as u32, h as u32)),
        _ => None,
    };
    Ok(CocoImage {
        id,
        image: path,
        json: json.to_path_buf(),
        record: rec,
        size,
        boxes: Vec::new(),
    })
}

/// Record `annotations[i]` = `a`: `Some((index of its image in by_id, box))`, `None` for a crowd
/// annotation (ignored), or why it is skipped (not an object, an unknown image or category, a
/// bbox that is not four finite numbers with a positive size).
fn annotation_box(
    i: usize,
    a: &RawAnnotation,
    by_id: &HashMap<u64, usize>,
    classes: &CocoClasses,
) -> std::result::Result<Option<(usize, PixelBox)>, String> {
    let RawAnnotation::Object {
        id,
        image_id,
        category_id,
        bbox,
        iscrowd,
        segmentation,
    } = a
    else {
        return Err(format!("annotations[{i}]: not an object"));
    };
    let rec = record("annotations", i, id.as_ref());
    let crowd = match iscrowd {
        None | Some(Value::Null) => false,
        Some(v) => v.as_f64().is_some_and(|x| x != 0.0) || v.as_bool() == Some(true),
    };
    if crowd {
        return Ok(None);
    }
    let Some(img) = as_id(image_id.as_ref()) else {
        return Err(format!(
            "{rec}: image_id {} is not a non-negative integer",
            show(image_id.as_ref())
        ));
    };
    let Some(&k) = by_id.get(&img) else {
        return Err(format!(
            "{rec}: image_id {img} is not a usable image of `images`"
        ));
    };
    let cls = match as_id(category_id.as_ref()) {
        None => {
            return Err(format!(
                "{rec}: category_id {} is not a non-negative integer",
                show(category_id.as_ref())
            ))
        }
        Some(c) => classes.class_of(c).ok_or_else(|| {
            format!(
                "{rec}: category_id {c} is not a category (known ids {:?})",
                classes.ids
            )
        })?,
    };
    let b: Option<Vec<f64>> = bbox
        .as_ref()
        .and_then(Value::as_array)
        .filter(|a| a.len() == 4)
        .and_then(|a| a.iter().map(Value::as_f64).collect());
    let Some(b) = b.filter(|b| b.iter().all(|v| v.is_finite())) else {
        return Err(format!(
            "{rec}: bbox {} is not four numbers [x, y, w, h]",
            show(bbox.as_ref())
        ));
    };
    if b[2] <= 0.0 || b[3] <= 0.0 {
        return Err(format!(
            "{rec}: bbox {} has width {} and height {} (both must be positive)",
            show(bbox.as_ref()),
            b[2],
            b[3]
        ));
    }
    let (outline, outline_issue) = match outline_of(segmentation.as_deref()) {
        Ok(o) => (o, None),
        Err(why) => (Vec::new(), Some(why)),
    };
    Ok(Some((
        k,
        PixelBox {
            cls,
            xywh: [b[0], b[1], b[2], b[3]],
            outline,
            outline_issue,
            record: rec,
        },
    )))
}

/// The boxes of `img` normalized to centre format on a `w × h` image (the JSON's size when it
/// gives one, else the decoded `decoded` size): clipped to the image, a box left without area
/// dropped, each clip or drop an issue naming the annotation. Also a note when the JSON's size
/// differs from the decoded one. With them, the outlines of the kept boxes normalized and
/// clipped to `[0, 1]` (as [`crate::data::scan::ImageRecord::segments`]: empty when no
/// annotation of the image has a polygon, else one per box, empty for a box without).
pub fn normalize_boxes(
    img: &CocoImage,
    decoded: (u32, u32),
) -> (Vec<LabelBox>, Vec<Vec<[f32; 2]>>, Vec<Issue>) {
    let mut issues = Vec::new();
    let issue = |value: String, action: &str, kind| Issue {
        path: img.json.clone(),
        line: None,
        value,
        action: action.to_string(),
        kind,
    };
    let (w, h) = match img.size {
        Some(s) => {
            if s != decoded {
                issues.push(issue(
                    format!(
                        "{}: width x height {}x{} but {} decodes to {}x{}",
                        img.record,
                        s.0,
                        s.1,
                        crate::text::path(&img.image),
                        decoded.0,
                        decoded.1
                    ),
                    "boxes normalized to the JSON's size",
                    IssueKind::ImageNote,
                ));
            }
            s
        }
        None => decoded,
    };
    let (w, h) = (w as f64, h as f64);
    let mut out = Vec::new();
    let mut outlines = Vec::new();
    for b in &img.boxes {
        let [x, y, bw, bh] = b.xywh;
        let raw = [x / w, y / h, (x + bw) / w, (y + bh) / h];
        let c = raw.map(|v| v.clamp(0.0, 1.0));
        if c[2] - c[0] <= 0.0 || c[3] - c[1] <= 0.0 {
            issues.push(issue(
                format!(
                    "{}: bbox [{x}, {y}, {bw}, {bh}] lies outside the {w}x{h} image",
                    b.record
                ),
                "annotation skipped",
                IssueKind::RowDropped,
            ));
            continue;
        }
        if raw.iter().zip(&c).any(|(r, c)| (r - c).abs() > 1e-6) {
            let far = raw.iter().zip(&c).any(|(r, c)| (r - c).abs() > EDGE_TOL);
            if far {
                issues.push(issue(
                    format!(
                        "{}: bbox [{x}, {y}, {bw}, {bh}] crosses the edge of the {w}x{h} image",
                        b.record
                    ),
                    "clipped to the image",
                    IssueKind::RowClipped,
                ));
            }
        }
        if let Some(why) = &b.outline_issue {
            issues.push(issue(
                format!("{}: segmentation: {why}", b.record),
                "box kept without an outline",
                IssueKind::PolygonOdd,
            ));
        }
        outlines.push(
            b.outline
                .iter()
                .map(|p| {
                    [
                        (p[0] / w).clamp(0.0, 1.0) as f32,
                        (p[1] / h).clamp(0.0, 1.0) as f32,
                    ]
                })
                .collect::<Vec<_>>(),
        );
        out.push(LabelBox {
            cls: b.cls,
            cx: ((c[0] + c[2]) / 2.0) as f32,
            cy: ((c[1] + c[3]) / 2.0) as f32,
            w: (c[2] - c[0]) as f32,
            h: (c[3] - c[1]) as f32,
        });
    }
    if outlines.iter().all(|o| o.is_empty()) {
        outlines.clear();
    }
    (out, outlines, issues)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("yolo9-cocojson-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn classes_sorted_by_id_roboflow_parent_left_out() {
        let d = tmp("classes");
        let j = d.join("_annotations.coco.json");
        std::fs::write(
            &j,
            r#"{"images": [], "annotations": [{"id": 1, "image_id": 0, "category_id": 7, "bbox": [0,0,1,1]}],
                "categories": [{"id": 7, "name": "WBC", "supercategory": "cells"},
                               {"id": 0, "name": "cells", "supercategory": "none"},
                               {"id": 3, "name": "RBC", "supercategory": "cells"},
                               {"id": "x", "name": "bad"}]}"#,
        )
        .unwrap();
        let c = read_classes(std::slice::from_ref(&j)).unwrap();
        assert_eq!(c.ids, vec![3, 7]);
        assert_eq!(c.names, vec!["RBC", "WBC"]);
        assert_eq!(c.class_of(7), Some(1));
        assert_eq!(c.class_of(0), None);
        assert_eq!(c.notices.len(), 2, "{:?}", c.notices);
        assert!(c.notices.iter().any(|n| n.contains("categories[3]")));
        assert!(c.notices.iter().any(|n| n.contains("\"cells\" (id 0)")));
    }

    #[test]
    fn boxes_normalized_clipped_and_dropped() {
        let img = CocoImage {
            id: 1,
            image: PathBuf::from("/d/a.jpg"),
            json: PathBuf::from("/d/a.json"),
            record: "images[0] (id 1)".into(),
            size: Some((200, 100)),
            boxes: vec![
                PixelBox {
                    cls: 2,
                    xywh: [20.0, 10.0, 40.0, 50.0],
                    // A triangle, its last point outside the image.
                    outline: vec![[20.0, 10.0], [60.0, 10.0], [40.0, 120.0]],
                    outline_issue: None,
                    record: "annotations[0]".into(),
                },
                PixelBox {
                    cls: 0,
                    xywh: [-10.0, 90.0, 30.0, 20.0],
                    outline: Vec::new(),
                    outline_issue: Some("RLE runs cover 3 pixels".into()),
                    record: "annotations[1]".into(),
                },
                PixelBox {
                    cls: 0,
                    xywh: [300.0, 10.0, 5.0, 5.0],
                    outline: vec![[300.0, 10.0], [305.0, 10.0], [305.0, 15.0]],
                    outline_issue: None,
                    record: "annotations[2]".into(),
                },
            ],
        };
        let (b, outlines, iss) = normalize_boxes(&img, (200, 100));
        assert_eq!(b.len(), 2);
        // One outline per kept box (the dropped box's with it), normalized and clipped.
        assert_eq!(
            outlines,
            vec![vec![[0.1, 0.1], [0.3, 0.1], [0.2, 1.0]], Vec::new()]
        );
        assert_eq!(b[0].cls, 2);
        assert!((b[0].cx - 0.2).abs() < 1e-6 && (b[0].cy - 0.35).abs() < 1e-6);
        assert!((b[0].w - 0.2).abs() < 1e-6 && (b[0].h - 0.5).abs() < 1e-6);
        // clipped to x 0..20, y 90..100
        assert!((b[1].cx - 0.05).abs() < 1e-6 && (b[1].w - 0.1).abs() < 1e-6);
        assert!((b[1].cy - 0.95).abs() < 1e-6 && (b[1].h - 0.1).abs() < 1e-6);
        assert_eq!(iss.len(), 3, "{iss:?}");
        assert_eq!(iss[0].kind, IssueKind::RowClipped);
        // The box whose RLE could not be decoded is kept, without an outline, and reported.
        assert_eq!(iss[1].kind, IssueKind::PolygonOdd);
        assert_eq!(
            (iss[1].value.as_str(), iss[1].action.as_str()),
            (
                "annotations[1]: segmentation: RLE runs cover 3 pixels",
                "box kept without an outline"
            )
        );
        assert!(
            iss[2].value.starts_with("annotations[2]"),
            "{}",
            iss[2].value
        );
        // the JSON's size differs from the decoded one: a note, boxes on the JSON's size
        let (_, _, iss) = normalize_boxes(&img, (100, 200));
        assert_eq!(iss[0].kind, IssueKind::ImageNote);
    }

    #[test]
    fn polygon_and_rle_segmentations_become_outlines() {
        let json = r#"{"images": [], "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 2],
             "segmentation": [[0, 0, 2, 0, 2, 2, 0, 2], [4, 0, 6, 0, 6, 2]]},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 2],
             "segmentation": {"counts": [0, 4, 12], "size": [4, 4]}},
            {"id": 3, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 2],
             "segmentation": [[0, 0, 1, 1]]},
            {"id": 4, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 2],
             "segmentation": {"counts": [0, 4, 11], "size": [4, 4]}},
            {"id": 5, "image_id": 1, "category_id": 1, "bbox": [0, 0, 4, 2],
             "segmentation": {"counts": "?4300M~", "size": [7, 9]}}
        ], "categories": []}"#;
        let raw: RawFile = serde_json::from_str(json).unwrap();
        let outlines: Vec<_> = raw
            .annotations
            .iter()
            .map(|a| match a {
                RawAnnotation::Object { segmentation, .. } => outline_of(segmentation.as_deref()),
                RawAnnotation::Other(_) => panic!("an object"),
            })
            .collect();
        // Two polygons joined (merge_polygons); a two-point polygon gives none.
        let o0 = outlines[0].as_ref().unwrap();
        assert_eq!(o0.len(), 4 + 1 + 3 + 1);
        assert_eq!(o0[0], [2.0, 0.0]);
        // Runs [0, 4, 12] over a 4x4 mask: the first column (column-major) is inside, a 1x4
        // strip whose pixel boundary has the corners (0, 0), (1, 0), (1, 4), (0, 4).
        let mut o1 = outlines[1].clone().unwrap();
        o1.sort_by(|a, b| a.partial_cmp(b).unwrap());
        assert_eq!(o1, vec![[0.0, 0.0], [0.0, 4.0], [1.0, 0.0], [1.0, 4.0]]);
        assert!(outlines[2].as_ref().unwrap().is_empty());
        // Runs short of the size, and a character outside the alphabet: errors saying so.
        let e = outlines[3].as_ref().unwrap_err();
        assert!(e.contains("15 pixels") && e.contains("4x4 has 16"), "{e}");
        let e = outlines[4].as_ref().unwrap_err();
        assert!(e.contains("'~'"), "{e}");
    }

    /// pycocotools' compressed RLE (`mask.encode` of Fortran-ordered masks, pycocotools 2.0,
    /// 2026-12-07) decodes to the mask it encoded: a 7x9 mask with a 4x4 square holding a
    /// one-pixel hole and a lone pixel apart, and a 40x50 mask whose runs need several 5-bit
    /// groups and the differences from the run two before; the outline is the square's.
    #[test]
    fn compressed_rle_decodes_as_pycocotools() {
        let small = rle_decode(&RleCounts::Compressed("?4300MN122;MJ".into()), 7, 9).unwrap();
        let mut want = vec![0u8; 7 * 9];
        for y in 1..5 {
            for x in 2..6 {
                want[y * 9 + x] = 1;
            }
        }
        want[2 * 9 + 4] = 0;
        want[5 * 9 + 7] = 1;
        assert_eq!(small, want);
        // The same mask as uncompressed runs (counted from it by hand, column-major).
        let runs = [15, 4, 3, 4, 3, 1, 1, 2, 3, 4, 14, 1, 8].map(|r| Value::from(r as u64));
        assert_eq!(
            rle_decode(&RleCounts::Runs(runs.to_vec()), 7, 9).unwrap(),
            want
        );
        let big =
            "[6R1600000000000000000000000000000000000000000000000000000000000000000000000000000U6";
        let big = rle_decode(&RleCounts::Compressed(big.into()), 40, 50).unwrap();
        assert_eq!(big.iter().map(|&b| b as usize).sum::<usize>(), 1360);
        for y in 0..40 {
            for x in 0..50 {
                let inside = (3..37).contains(&y) && (5..45).contains(&x);
                assert_eq!(big[y * 50 + x], inside as u8, "({x}, {y})");
            }
        }
        let seg = RawSegmentation::Rle {
            counts: RleCounts::Compressed("?4300MN122;MJ".into()),
            size: serde_json::json!([7, 9]),
        };
        let mut o = outline_of(Some(&seg)).unwrap();
        o.sort_by(|a, b| a.partial_cmp(b).unwrap());
        assert_eq!(o, vec![[2.0, 1.0], [2.0, 5.0], [6.0, 1.0], [6.0, 5.0]]);
        // A size that is not two positive integers, or too large.
        for size in [
            serde_json::json!([7]),
            serde_json::json!([0, 9]),
            serde_json::json!([1 << 20, 1 << 20]),
        ] {
            let seg = RawSegmentation::Rle {
                counts: RleCounts::Runs(vec![]),
                size,
            };
            assert!(outline_of(Some(&seg)).unwrap_err().contains("RLE size"));
        }
    }

    #[test]
    fn candidates_in_order() {
        let c = image_candidates(Path::new("/c/annotations/instances_val2017.json"), "1.jpg");
        let c: Vec<String> = c
            .iter()
            .map(|p| crate::text::path(&p).to_string())
            .collect();
        assert_eq!(
            c,
            [
                "/c/annotations/1.jpg",
                "/c/annotations/images/1.jpg",
                "/c/images/1.jpg",
                "/c/images/val2017/1.jpg"
            ]
        );
    }
}
