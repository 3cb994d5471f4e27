//! Dataset scan: pairs every image of a split with its label file, checks each image's header,
//! parses the labels ([`super::labels`]) and counts what was found. The result is cached next to the
//! labels so that a restart does not rescan.
//!
//! - Label path: the last `/images/` component of the image path becomes `/labels/` and the extension
//!   becomes `.txt` (official `img2label_paths`). When that file does not exist but a `.txt` with the
//!   image's stem sits beside the image, that one is used and the split reports it once.
//! - Missing or empty label file: the image is a background image (kept, no boxes).
//! - Image check: every image is decoded with [`super::image::decode_rgb8`], the function detect,
//!   val and the training loader use, so the scan keeps exactly the images they can use (one judge:
//!   a JPEG cut off mid-scan is skipped, one whose data is complete but whose end-of-image marker is
//!   missing is used; images over the decoding-bomb guard are skipped). The format is sniffed from
//!   the content; an image whose content does not match its extension is used, with a note.
//!   Unreadable, unknown, undecodable or smaller than 10 px images are skipped and counted as
//!   corrupt. The cache keeps a rescan from decoding again.
//! - Label files in a labels folder with no matching image are reported as orphans.
//! - COCO JSON splits ([`super::coco_json`]): the images and boxes of each JSON file named by the
//!   split join the listed images (sorted by path; an image also listed by a folder or `.txt` is
//!   taken from the JSON); each is decoded and counted like the others, its boxes normalized to the
//!   image (an image with no annotation is an `empty` background image). The JSON's bad records
//!   are issues: a skipped `images[]` record counts as a listed, skipped (corrupt) image, a skipped
//!   annotation as a dropped row. The cache of such a split sits beside the first JSON file
//!   (`<stem>.yolo9-cache.json`) and its key also covers the JSON files and the class mapping.
//! - Cache: `<labels folder>.yolo9-cache.json` beside the labels folder of the first image, keyed by a
//!   SHA-256 of the scan rules version, `nc`, and every image's and label candidate's path, size and
//!   modification time. A read-only folder (by permission bits, honoured even for root) or a failed
//!   write only warns. The user's files are never modified.
//!
//! Why one file (about 560 lines of code, then the image probe): one pass over a split (images,
//! labels, COCO JSON rows, orphans) and its counts are read together; the cache is
//! `scan/cache.rs`.

use super::coco_json::CocoImage;
use super::labels::{parse_labels, Issue, IssueKind, LabelBox};
use super::yaml::{DataConfig, Split};
use anyhow::Result;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod cache;
use cache::{cache_path_for, read_cache, scan_key, write_cache, CacheFile};

/// Version of the scan rules; part of the cache key so a rule change invalidates old caches.
/// 4: records keep the instance outlines of polygon rows ([`ImageRecord::segments`]);
/// 5: and of COCO JSON polygon `segmentation`s; 6: and of RLE ones.
pub const SCAN_VERSION: u32 = 6;
/// Smallest accepted image side, in pixels (as the official `verify_image_label`).
pub const MIN_IMAGE_SIDE: u32 = 10;

/// How an image's labels were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LabelStatus {
    /// A label file with at least one valid box.
    Labelled,
    /// A label file with no valid box (empty, whitespace, or every row dropped): background image.
    Empty,
    /// No label file: background image.
    Missing,
}

/// One usable image of a split.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The image file (absolute).
    pub image: PathBuf,
    /// The label file read, if any (the JSON file for an image of a COCO JSON split).
    pub label: Option<PathBuf>,
    /// Width in pixels after EXIF orientation.
    pub width: u32,
    /// Height in pixels after EXIF orientation.
    pub height: u32,
    /// The boxes kept (normalized cxcywh, relative to the oriented image).
    pub boxes: Vec<LabelBox>,
    /// The instance outlines of segmentation labels: empty when no row of the file is a
    /// polygon, else one per box (the polygon's points, normalized and clipped to the image; empty
    /// for a box row). Absent from the cache of a detection dataset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<Vec<[f32; 2]>>,
    /// How the labels were found.
    pub status: LabelStatus,
}

/// Counts of a split scan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScanCounts {
    /// Image files listed by the split.
    pub images: usize,
    /// Images with at least one box.
    pub labelled: usize,
    /// Images without a label file (kept as background).
    pub missing: usize,
    /// Images whose label file holds no valid box (kept as background).
    pub empty: usize,
    /// Images skipped (unreadable, truncated, unknown format, too small).
    pub corrupt: usize,
    /// Boxes kept.
    pub boxes: usize,
    /// Boxes kept per class, `nc` entries.
    pub per_class: Vec<usize>,
    /// Label rows dropped.
    pub rows_dropped: usize,
    /// Label rows clipped to the image.
    pub rows_clipped: usize,
    /// Label rows removed as repeats.
    pub duplicates: usize,
    /// Polygon rows used as their bounding box.
    pub polygons: usize,
    /// Labels read from `.txt` files beside the images.
    pub sidecar: usize,
    /// Label files with no image.
    pub orphans: usize,
}

/// What happened with the label cache.
#[derive(Debug, Clone, PartialEq)]
pub enum CacheStatus {
    /// Caching was turned off.
    Disabled,
    /// A valid cache was found and used (nothing rescanned).
    Loaded(PathBuf),
    /// The split was scanned and the cache written.
    Written(PathBuf),
    /// The split was scanned but the cache could not be written (a warning, not an error).
    NotWritten {
        /// Where the cache would have gone.
        path: PathBuf,
        /// Why it was not written.
        reason: String,
    },
}

/// The result of scanning one split.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitScan {
    /// Which split.
    pub split: Split,
    /// The usable images, sorted by path.
    pub records: Vec<ImageRecord>,
    /// Every problem found, in image order.
    pub issues: Vec<Issue>,
    /// The counts.
    pub counts: ScanCounts,
    /// What happened with the cache.
    pub cache: CacheStatus,
    /// The `images[].id` of each image listed by a COCO JSON file of the split (by image path,
    /// as in [`ImageRecord::image`]); empty for a YOLO layout. `val --save-json` writes these ids.
    pub coco_ids: std::collections::HashMap<PathBuf, u64>,
}

/// Options of [`scan_split`].
#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// Read and write the label cache.
    pub use_cache: bool,
    /// Print the summary, every issue and cache warnings to stderr.
    pub print: bool,
    /// Asked before each image; a stop request ends the scan with
    /// [`crate::cancel::Stopped`] (phase [`SCAN_PHASE`]) and writes no cache.
    pub cancel: crate::cancel::Cancel,
}

/// The phase name of a scan that was stopped ([`crate::cancel::Stopped::phase`]).
pub const SCAN_PHASE: &str = "the dataset scan";

impl Default for ScanOptions {
    fn default() -> Self {
        ScanOptions {
            use_cache: true,
            print: true,
            cancel: crate::cancel::Cancel::never(),
        }
    }
}

/// The official label path of an image: the last `/images/` component replaced by `/labels/`, the
/// extension by `.txt`. An image with no `images` folder in its path gets the `.txt` beside it.
pub fn label_path_for(image: &Path) -> PathBuf {
    let comps: Vec<_> = image.components().collect();
    // the last "images" component that is a folder (not the file name itself)
    let idx = comps[..comps.len().saturating_sub(1)]
        .iter()
        .rposition(|c| c.as_os_str() == "images");
    let mut p: PathBuf = match idx {
        Some(i) => comps
            .iter()
            .enumerate()
            .map(|(k, c)| {
                if k == i {
                    std::ffi::OsStr::new("labels")
                } else {
                    c.as_os_str()
                }
            })
            .collect(),
        None => image.to_path_buf(),
    };
    p.set_extension("txt");
    p
}

/// Scans `split` of `cfg`: lists its images, checks them, reads their labels, finds orphans, and uses
/// or writes the label cache. Errors only when the split cannot be listed (a `.txt` list or folder
/// that cannot be read); every per-file problem is an [`Issue`] instead.
pub fn scan_split(cfg: &DataConfig, split: Split, opts: &ScanOptions) -> Result<SplitScan> {
    let listed = cfg.list_images(split)?;
    // COCO JSON splits: their images (with boxes) and the records they skipped.
    let jsons = cfg.coco_sources(split);
    let mut coco_images: Vec<CocoImage> = Vec::new();
    let mut json_issues = Vec::new();
    let (mut json_images_skipped, mut json_rows_skipped) = (0, 0);
    if let Some(classes) = &cfg.coco {
        for j in &jsons {
            let s = super::coco_json::read_split(j, classes)?;
            coco_images.extend(s.images);
            json_issues.extend(s.issues);
            json_images_skipped += s.images_skipped;
            json_rows_skipped += s.annotations_skipped;
        }
    }
    let mut coco_ids = std::collections::HashMap::new();
    for c in &coco_images {
        coco_ids.entry(c.image.clone()).or_insert(c.id);
    }
    let mut items: Vec<(PathBuf, Option<CocoImage>)> = Vec::new();
    {
        let mut from_json = std::collections::HashMap::new();
        for c in coco_images {
            if !from_json.contains_key(&c.image) {
                from_json.insert(c.image.clone(), c);
            }
        }
        for p in &listed {
            if !from_json.contains_key(p) {
                items.push((p.clone(), None));
            }
        }
        items.extend(from_json.into_iter().map(|(p, c)| (p, Some(c))));
        items.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let images: Vec<PathBuf> = items.iter().map(|i| i.0.clone()).collect();
    let cache_path = match jsons.first() {
        Some(j) => Some(j.with_extension("yolo9-cache.json")),
        None => images
            .first()
            .and_then(|img| cache_path_for(&label_path_for(img))),
    };
    let class_ids = cfg.coco.as_ref().map(|c| c.ids.as_slice()).unwrap_or(&[]);
    let key = scan_key(
        SCAN_VERSION,
        &images,
        cfg.nc,
        &jsons,
        class_ids,
        label_path_for,
    );

    let mut cache_status = CacheStatus::Disabled;
    let mut loaded = None;
    if opts.use_cache {
        if let Some(cp) = &cache_path {
            if let Some(c) = read_cache::<ImageRecord, ScanCounts>(cp, SCAN_VERSION, &key) {
                loaded = Some((c.records, c.issues, c.counts));
                cache_status = CacheStatus::Loaded(cp.clone());
            }
        }
    }
    let (records, issues, mut counts) = match loaded {
        Some(x) => x,
        None => {
            let (records, issues, counts) = scan_images(&items, cfg.nc, &opts.cancel)?;
            if opts.use_cache {
                cache_status = match &cache_path {
                    None => CacheStatus::Disabled,
                    Some(cp) => {
                        let mut cache = CacheFile {
                            version: SCAN_VERSION,
                            key: key.clone(),
                            digest: String::new(),
                            records: records.clone(),
                            issues: issues.clone(),
                            counts: counts.clone(),
                        };
                        match write_cache(cp, &mut cache) {
                            Ok(()) => CacheStatus::Written(cp.clone()),
                            Err(reason) => CacheStatus::NotWritten {
                                path: cp.clone(),
                                reason,
                            },
                        }
                    }
                };
            }
            (records, issues, counts)
        }
    };

    // the JSON files' own records: read fresh every time (the files are parsed anyway)
    counts.images += json_images_skipped;
    counts.corrupt += json_images_skipped;
    counts.rows_dropped += json_rows_skipped;
    let mut issues = {
        json_issues.extend(issues);
        json_issues
    };
    // orphans: never cached (a readdir is cheap, and a new stray file must show up)
    let plain: Vec<PathBuf> = items
        .iter()
        .filter(|i| i.1.is_none())
        .map(|i| i.0.clone())
        .collect();
    let orphans = find_orphans(&plain, &records);
    counts.orphans = orphans.len();
    issues.extend(orphans.into_iter().map(|p| Issue {
        path: p,
        line: None,
        value: "label file with no image of the same stem".to_string(),
        action: "ignored".to_string(),
        kind: IssueKind::OrphanLabel,
    }));

    let scan = SplitScan {
        split,
        records,
        issues,
        counts,
        cache: cache_status,
        coco_ids,
    };
    if opts.print {
        crate::text::err!("{}", scan.report(&cfg.root, &cfg.names));
    }
    Ok(scan)
}

impl SplitScan {
    /// One line: `train: 7 images: 3 labelled, 2 empty (background), 2 missing labels, 0 corrupt
    /// (skipped); 6 boxes; ...`.
    pub fn summary(&self, names: &[String]) -> String {
        let c = &self.counts;
        let mut s = format!(
            "{}: {} images: {} labelled, {} empty (background), {} missing labels (background), {} corrupt (skipped); {} boxes",
            self.split, c.images, c.labelled, c.empty, c.missing, c.corrupt, c.boxes
        );
        if !c.per_class.is_empty() {
            let per: Vec<String> = c
                .per_class
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{} {n}", names.get(i).map(String::as_str).unwrap_or("?")))
                .collect();
            s += &format!(" [{}]", per.join(", "));
        }
        s += &format!(
            "; {} rows dropped, {} clipped, {} duplicates removed, {} polygons as boxes, {} orphan label files",
            c.rows_dropped, c.rows_clipped, c.duplicates, c.polygons, c.orphans
        );
        if c.sidecar > 0 {
            s += &format!(", {} labels from .txt beside the images", c.sidecar);
        }
        s
    }

    /// The full report: every issue (paths relative to `root`), the cache outcome, then the summary.
    pub fn report(&self, root: &Path, names: &[String]) -> String {
        let mut s = String::new();
        for i in &self.issues {
            s += &format!("{}: {}\n", self.split, i.display_relative(root));
        }
        match &self.cache {
            CacheStatus::NotWritten { path, reason } => {
                s += &format!(
                    "{}: warning: label cache {} not written: {reason}\n",
                    self.split,
                    crate::text::path(&path)
                )
            }
            CacheStatus::Loaded(p) => {
                s += &format!(
                    "{}: labels read from cache {}\n",
                    self.split,
                    crate::text::path(&p)
                )
            }
            _ => {}
        }
        s += &self.summary(names);
        s.push('\n');
        s
    }
}

/// Scans every image (in parallel; each worker holds at most one file open at a time), asking
/// `cancel` before each one.
fn scan_images(
    images: &[(PathBuf, Option<CocoImage>)],
    nc: usize,
    cancel: &crate::cancel::Cancel,
) -> Result<(Vec<ImageRecord>, Vec<Issue>, ScanCounts), crate::cancel::Stopped> {
    let results: Vec<OneScan> = images
        .par_iter()
        .map(|(img, coco)| {
            cancel.check(SCAN_PHASE)?;
            Ok(scan_one(img, nc, coco.as_ref()))
        })
        .collect::<Result<_, crate::cancel::Stopped>>()?;
    let mut counts = ScanCounts {
        images: images.len(),
        per_class: vec![0; nc],
        ..Default::default()
    };
    let mut records = Vec::new();
    let mut issues = Vec::new();
    let mut sidecar_dirs = BTreeSet::new();
    for OneScan {
        rec,
        issues: iss,
        polygons,
        duplicates,
        sidecar,
    } in results
    {
        counts.polygons += polygons;
        counts.duplicates += duplicates;
        for i in &iss {
            match i.kind {
                IssueKind::RowDropped => counts.rows_dropped += 1,
                IssueKind::RowClipped => counts.rows_clipped += 1,
                _ => {}
            }
        }
        issues.extend(iss);
        let Some(rec) = rec else {
            counts.corrupt += 1;
            continue;
        };
        if sidecar {
            counts.sidecar += 1;
            if let Some(d) = rec.image.parent() {
                sidecar_dirs.insert(d.to_path_buf());
            }
        }
        match rec.status {
            LabelStatus::Labelled => counts.labelled += 1,
            LabelStatus::Empty => counts.empty += 1,
            LabelStatus::Missing => counts.missing += 1,
        }
        counts.boxes += rec.boxes.len();
        for b in &rec.boxes {
            counts.per_class[b.cls as usize] += 1;
        }
        records.push(rec);
    }
    for d in sidecar_dirs {
        let expected = label_path_for(&d.join("x.jpg"));
        issues.push(Issue {
            path: d.clone(),
            line: None,
            value: format!(
                "no label file at {} but .txt files beside the images",
                crate::text::path(&expected.parent().unwrap_or(&d))
            ),
            action: "used the .txt files beside the images as labels".to_string(),
            kind: IssueKind::SidecarLabels,
        });
    }
    Ok((records, issues, counts))
}

/// What [`scan_one`] found about one image.
struct OneScan {
    /// The record; `None` when the image is skipped.
    rec: Option<ImageRecord>,
    issues: Vec<Issue>,
    polygons: usize,
    duplicates: usize,
    /// The labels came from a `.txt` beside the image.
    sidecar: bool,
}

/// One image: header check, label lookup and parse (or, for an image of a COCO JSON split, its
/// boxes from `coco` normalized to it).
fn scan_one(img: &Path, nc: usize, coco: Option<&CocoImage>) -> OneScan {
    let mut issues = Vec::new();
    let skip = |value: String, issues: &mut Vec<Issue>| {
        issues.push(Issue {
            path: img.to_path_buf(),
            line: None,
            value,
            action: "image skipped".to_string(),
            kind: IssueKind::ImageSkipped,
        });
    };
    let probe = match probe_image(img) {
        Ok(p) => p,
        Err(why) => {
            skip(why, &mut issues);
            return OneScan {
                rec: None,
                issues,
                polygons: 0,
                duplicates: 0,
                sidecar: false,
            };
        }
    };
    if let Some(note) = probe.note {
        issues.push(Issue {
            path: img.to_path_buf(),
            line: None,
            value: note,
            action: "decoded by content".to_string(),
            kind: IssueKind::ImageNote,
        });
    }
    if probe.width < MIN_IMAGE_SIDE || probe.height < MIN_IMAGE_SIDE {
        skip(
            format!(
                "{}x{} pixels, below the {MIN_IMAGE_SIDE} px minimum",
                probe.width, probe.height
            ),
            &mut issues,
        );
        return OneScan {
            rec: None,
            issues,
            polygons: 0,
            duplicates: 0,
            sidecar: false,
        };
    }
    if let Some(c) = coco {
        let (boxes, segments, iss) =
            super::coco_json::normalize_boxes(c, (probe.width, probe.height));
        let polygons = segments.iter().filter(|o| !o.is_empty()).count();
        issues.extend(iss);
        let status = if boxes.is_empty() {
            LabelStatus::Empty
        } else {
            LabelStatus::Labelled
        };
        return OneScan {
            rec: Some(ImageRecord {
                image: img.to_path_buf(),
                label: Some(c.json.clone()),
                width: probe.width,
                height: probe.height,
                boxes,
                segments,
                status,
            }),
            issues,
            polygons,
            duplicates: 0,
            sidecar: false,
        };
    }
    let rule = label_path_for(img);
    let beside = img.with_extension("txt");
    let label = if rule.is_file() {
        Some(rule)
    } else if beside != rule && beside.is_file() {
        Some(beside)
    } else {
        None
    };
    let (mut polygons, mut duplicates) = (0, 0);
    let (boxes, segments, status) = match &label {
        None => (Vec::new(), Vec::new(), LabelStatus::Missing),
        Some(lp) => match super::fsio::read_regular(lp, crate::bounded::FileKind::LabelText) {
            Err(e) => {
                issues.push(Issue {
                    path: lp.clone(),
                    line: None,
                    value: format!("cannot read: {e}"),
                    action: "image used as background".to_string(),
                    kind: IssueKind::LabelUnreadable,
                });
                (Vec::new(), Vec::new(), LabelStatus::Missing)
            }
            Ok(bytes) => {
                let parsed = parse_labels(&String::from_utf8_lossy(&bytes), nc, lp);
                polygons = parsed.polygons;
                duplicates = parsed.duplicates;
                issues.extend(parsed.issues);
                let status = if parsed.boxes.is_empty() {
                    LabelStatus::Empty
                } else {
                    LabelStatus::Labelled
                };
                // Outlines only when the file has a polygon row: a detection dataset's records
                // (and cache) stay as they were.
                let segments = if parsed.segments.iter().any(|p| !p.is_empty()) {
                    parsed.segments
                } else {
                    Vec::new()
                };
                (parsed.boxes, segments, status)
            }
        },
    };
    let rec = ImageRecord {
        image: img.to_path_buf(),
        label,
        width: probe.width,
        height: probe.height,
        boxes,
        segments,
        status,
    };
    let sidecar = rec
        .label
        .as_ref()
        .is_some_and(|l| *l != label_path_for(img));
    OneScan {
        rec: Some(rec),
        issues,
        polygons,
        duplicates,
        sidecar,
    }
}

/// Header facts of an image.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProbe {
    /// Detected format (by content).
    pub format: image::ImageFormat,
    /// Width in pixels after EXIF orientation.
    pub width: u32,
    /// Height in pixels after EXIF orientation.
    pub height: u32,
    /// A remark, e.g. when the content does not match the extension.
    pub note: Option<String>,
}

/// Judges an image the way everything else does: by decoding it with
/// [`super::image::decode_rgb8`], the function detect, val and the training loader use (guard,
/// EXIF orientation and all), so the scan keeps exactly the images they can use (through
/// [`super::image::decode_rgb8_bounded`]: the scan's parallel decodes hold at most
/// [`super::image::BOUNDED_DECODE_BYTES`] of pixels at once). The format is
/// sniffed from the first bytes, for the note on a content/extension mismatch. `Err` holds the
/// reason the image cannot be used, e.g. `JPEG cut off: the image data ends before the last
/// block (12345 bytes; …)`.
pub fn probe_image(path: &Path) -> std::result::Result<ImageProbe, String> {
    // the format comes from the content only (`with_guessed_format` would fall back to the extension)
    let bytes = super::fsio::read_regular(path, crate::bounded::FileKind::Image)
        .map_err(|e| format!("cannot read: {e}"))?;
    let format = image::guess_format(&bytes[..bytes.len().min(64)]).map_err(|_| {
        "unknown image format (content is not JPEG, PNG, BMP, TIFF, WebP or GIF)".to_string()
    })?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let note = (!format
        .extensions_str()
        .iter()
        .any(|x| x.eq_ignore_ascii_case(ext)))
    .then(|| format!("content is {format:?} but the extension is .{ext}"));
    let img = super::image::decode_rgb8_bounded(&bytes).map_err(|e| format!("{e:#}"))?;
    Ok(ImageProbe {
        format,
        width: img.width(),
        height: img.height(),
        note,
    })
}

/// Label files under the labels folders of the split's images that match no image (same stem).
fn find_orphans(images: &[PathBuf], records: &[ImageRecord]) -> Vec<PathBuf> {
    let expected: BTreeSet<PathBuf> = images.iter().map(|i| label_path_for(i)).collect();
    let used: BTreeSet<&PathBuf> = records.iter().filter_map(|r| r.label.as_ref()).collect();
    let image_dirs: BTreeSet<&Path> = images.iter().filter_map(|i| i.parent()).collect();
    let label_dirs: BTreeSet<PathBuf> = expected
        .iter()
        .filter_map(|l| l.parent().map(Path::to_path_buf))
        .filter(|d| !image_dirs.contains(d.as_path()) && d.is_dir())
        .collect();
    let mut out = Vec::new();
    for d in label_dirs {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "txt") && p.is_file())
            .collect();
        files.sort();
        out.extend(
            files
                .into_iter()
                .filter(|p| !expected.contains(p) && !used.contains(&p)),
        );
    }
    out
}
