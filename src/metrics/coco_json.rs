//! COCO JSON files and `yolo9 val --save-json`: the results list
//! `[{image_id, category_id, bbox: [x, y, w, h], score}]` ([`CocoResult`]), the annotations file
//! `{images, annotations, categories}` ([`CocoDataset`]), the conversion of validation output to
//! both (official `val_dual.py save_one_json`), and their evaluation with [`crate::metrics::coco`].
//!
//! Ids written by `--save-json` ([`val_image_ids`], [`val_results`]):
//! - `image_id`: for a split read from COCO JSON files, the dataset's own `images[].id`
//!   ([`dataset_image_ids`]); otherwise the file stem when the stems of **all** validated images are numeric and
//!   distinct (COCO's `000000000139.jpg` → 139, as the official `int(path.stem)`); otherwise the
//!   image's 0-based position in the scanned split (sorted paths), for every image — stable for a
//!   given split, never a mix of the two. (The official code writes a non-numeric stem as a
//!   string id; this format keeps ids numeric.)
//! - `category_id` ([`category_ids`]): for a dataset whose split is a COCO JSON file, the
//!   original category id of the class (so the file can be scored against that JSON); for a
//!   dataset of COCO's 80 classes (the names of [`COCO80_NAMES`], in order), COCO's 91-category
//!   id ([`COCO80_TO_91`], the official `coco80_to_91_class_map`; the official val maps only when
//!   `val` ends in `coco/val2017.txt`); else the class index (0-based), as the official val does.

use crate::metrics::coco::{evaluate, CocoDt, CocoEval, CocoGt};
use crate::metrics::validate::{ImageDetections, ValImage};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The 80 class names of COCO (`data/coco.yaml`), in class order.
pub const COCO80_NAMES: [&str; 80] = [
    "person",
    "bicycle",
    "car",
    "motorcycle",
    "airplane",
    "bus",
    "train",
    "truck",
    "boat",
    "traffic light",
    "fire hydrant",
    "stop sign",
    "parking meter",
    "bench",
    "bird",
    "cat",
    "dog",
    "horse",
    "sheep",
    "cow",
    "elephant",
    "bear",
    "zebra",
    "giraffe",
    "backpack",
    "umbrella",
    "handbag",
    "tie",
    "suitcase",
    "frisbee",
    "skis",
    "snowboard",
    "sports ball",
    "kite",
    "baseball bat",
    "baseball glove",
    "skateboard",
    "surfboard",
    "tennis racket",
    "bottle",
    "wine glass",
    "cup",
    "fork",
    "knife",
    "spoon",
    "bowl",
    "banana",
    "apple",
    "sandwich",
    "orange",
    "broccoli",
    "carrot",
    "hot dog",
    "pizza",
    "donut",
    "cake",
    "chair",
    "couch",
    "potted plant",
    "bed",
    "dining table",
    "toilet",
    "tv",
    "laptop",
    "mouse",
    "remote",
    "keyboard",
    "cell phone",
    "microwave",
    "oven",
    "toaster",
    "sink",
    "refrigerator",
    "book",
    "clock",
    "vase",
    "scissors",
    "teddy bear",
    "hair drier",
    "toothbrush",
];

/// COCO's category id of each of the 80 classes: the ids 1..=90 that `instances_*.json` uses,
/// i.e. all but the ten ids of categories COCO never annotated (12 street sign, 26 hat, 29 shoe,
/// 30 eye glasses, 45 plate, 66 mirror, 68 window, 69 desk, 71 door, 83 blender) — the
/// official `coco80_to_91_class_map`.
pub const COCO80_TO_91: [u64; 80] = {
    const UNUSED: [u64; 10] = [12, 26, 29, 30, 45, 66, 68, 69, 71, 83];
    let mut out = [0u64; 80];
    let (mut id, mut k) = (1u64, 0usize);
    while k < 80 {
        let mut skip = false;
        let mut j = 0;
        while j < UNUSED.len() {
            if UNUSED[j] == id {
                skip = true;
            }
            j += 1;
        }
        if !skip {
            out[k] = id;
            k += 1;
        }
        id += 1;
    }
    out
};

/// The `category_id` written for each class (see the module doc): `coco` (the class → category
/// ids of a COCO JSON dataset, [`crate::data::coco_json::CocoClasses::ids`]) when given; else
/// [`COCO80_TO_91`] when `names` are COCO's 80 names in order; else `0..names.len()`.
pub fn category_ids(names: &[String], coco: Option<&[u64]>) -> Vec<u64> {
    if let Some(ids) = coco.filter(|ids| ids.len() == names.len()) {
        return ids.to_vec();
    }
    if names.len() == 80 && names.iter().zip(COCO80_NAMES).all(|(a, b)| a == b) {
        return COCO80_TO_91.to_vec();
    }
    (0..names.len() as u64).collect()
}

/// One entry of a COCO results file (`predictions.json`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CocoResult {
    /// Image id.
    pub image_id: u64,
    /// Category id.
    pub category_id: u64,
    /// `[x, y, w, h]`, top-left corner and size, in original-image pixels.
    pub bbox: [f64; 4],
    /// Confidence.
    pub score: f64,
}

/// `images[]` entry of a COCO annotations file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CocoImage {
    /// Image id.
    pub id: u64,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// File name (relative), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
}

/// `annotations[]` entry of a COCO annotations file (boxes only; other keys are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CocoAnnotation {
    /// Annotation id.
    pub id: u64,
    /// Image id.
    pub image_id: u64,
    /// Category id.
    pub category_id: u64,
    /// `[x, y, w, h]` in pixels.
    pub bbox: [f64; 4],
    /// Area in pixels² (COCO: the segment's area; here `w · h` for converted labels).
    pub area: f64,
    /// 1 for a crowd region (absent = 0).
    #[serde(default)]
    pub iscrowd: u8,
}

/// `categories[]` entry of a COCO annotations file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CocoCategory {
    /// Category id.
    pub id: u64,
    /// Name.
    pub name: String,
}

/// A COCO annotations file `{images, annotations, categories}` (the parts bbox evaluation uses).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CocoDataset {
    /// Images.
    pub images: Vec<CocoImage>,
    /// Box annotations.
    pub annotations: Vec<CocoAnnotation>,
    /// Categories.
    pub categories: Vec<CocoCategory>,
}

impl From<&CocoResult> for CocoDt {
    fn from(r: &CocoResult) -> CocoDt {
        CocoDt {
            image_id: r.image_id,
            category_id: r.category_id,
            bbox: r.bbox,
            score: r.score,
        }
    }
}

impl From<&CocoAnnotation> for CocoGt {
    fn from(a: &CocoAnnotation) -> CocoGt {
        CocoGt {
            image_id: a.image_id,
            category_id: a.category_id,
            bbox: a.bbox,
            area: a.area,
            iscrowd: a.iscrowd != 0,
        }
    }
}

impl CocoDataset {
    /// Reads an annotations file. Errors name the file (and serde's line/column).
    pub fn load(path: &Path) -> Result<CocoDataset> {
        let text = crate::bounded::read_text_capped(path, crate::bounded::FileKind::CocoJson)
            .with_context(|| {
                format!("cannot read COCO annotations {}", crate::text::path(&path))
            })?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a COCO annotations file", crate::text::path(&path)))
    }

    /// Evaluates `results` against this ground truth over all its images and categories
    /// (pycocotools `COCOeval(gt, gt.loadRes(results), 'bbox')`). Errors as [`evaluate`].
    pub fn evaluate(&self, results: &[CocoResult]) -> Result<CocoEval> {
        let imgs: Vec<u64> = self.images.iter().map(|i| i.id).collect();
        let cats: Vec<u64> = self.categories.iter().map(|c| c.id).collect();
        let gts: Vec<CocoGt> = self.annotations.iter().map(CocoGt::from).collect();
        let dts: Vec<CocoDt> = results.iter().map(CocoDt::from).collect();
        evaluate(&imgs, &cats, &gts, &dts)
    }
}

/// Reads a results file (`predictions.json`). Errors name the file.
pub fn read_results(path: &Path) -> Result<Vec<CocoResult>> {
    let text = crate::bounded::read_text_capped(path, crate::bounded::FileKind::CocoJson)
        .with_context(|| format!("cannot read COCO results {}", crate::text::path(&path)))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not a COCO results list", crate::text::path(&path)))
}

/// Writes a results file as compact JSON (as the official `json.dump`), atomically
/// ([`crate::outfile::write`]: only over a regular file).
pub fn write_results(path: &Path, results: &[CocoResult]) -> Result<()> {
    let text = serde_json::to_string(results).context("serializing COCO results")?;
    crate::outfile::write(path, text.as_bytes(), &crate::outfile::Inputs::none())
}

/// `x` rounded to `digits` decimals as Python's `round(x, digits)` (correctly rounded from the
/// exact binary value, ties to even).
fn py_round(x: f64, digits: usize) -> f64 {
    format!("{x:.digits$}").parse().unwrap_or(x)
}

/// The `image_id` of each of `images` (see the module doc): numeric stems when all are numeric
/// and distinct, else the index.
pub fn val_image_ids(images: &[ValImage]) -> Vec<u64> {
    let stems: Option<Vec<u64>> = images
        .iter()
        .map(|im| {
            let s = im.path.file_stem()?.to_str()?;
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
                s.parse().ok()
            } else {
                None
            }
        })
        .collect();
    match stems {
        Some(ids) if ids.iter().collect::<std::collections::BTreeSet<_>>().len() == ids.len() => {
            ids
        }
        _ => (0..images.len() as u64).collect(),
    }
}

/// The `image_id` of each of `images` for `--save-json`: for a COCO JSON split, the dataset's own
/// `images[].id` (`coco`: image path → id, [`crate::data::scan::SplitScan::coco_ids`]) when every
/// validated image has one and they are distinct, so the file scores against that JSON; else
/// [`val_image_ids`]. Also returns a notice when `coco` has ids but they could not be used.
pub fn dataset_image_ids(
    images: &[ValImage],
    coco: &std::collections::HashMap<std::path::PathBuf, u64>,
) -> (Vec<u64>, Option<String>) {
    if coco.is_empty() {
        return (val_image_ids(images), None);
    }
    let ids: Option<Vec<u64>> = images
        .iter()
        .map(|im| coco.get(&im.path).copied())
        .collect();
    let why = match ids {
        Some(ids) if ids.iter().collect::<std::collections::BTreeSet<_>>().len() == ids.len() => {
            return (ids, None)
        }
        Some(_) => "two images of the split share a COCO id (several JSON files)",
        None => "some images of the split are not from a COCO JSON file",
    };
    (
        val_image_ids(images),
        Some(format!(
            "note: --save-json: {why}; image_id is the file stem or the image's position instead"
        )),
    )
}

/// COCO results of validated images (official `save_one_json`): each detection
/// `[x1, y1, x2, y2, conf, cls]` (original pixels) becomes `bbox` = `[x1', y1', w, h]` computed
/// in f32 as `xyxy2xywh` then `xy -= wh / 2`, each rounded to 3 decimals, `score` = conf rounded
/// to 5 decimals, `category_id` = `cats[class]` ([`category_ids`]; the class index when `cats`
/// has no entry for it), `image_id` = `ids[image]`. In the order of `dets`.
pub fn val_results(dets: &[ImageDetections], ids: &[u64], cats: &[u64]) -> Vec<CocoResult> {
    let mut out = Vec::new();
    for im in dets {
        let Some(&image_id) = ids.get(im.image) else {
            continue;
        };
        for d in &im.dets {
            let (cx, cy) = ((d[0] + d[2]) / 2.0, (d[1] + d[3]) / 2.0);
            let (w, h) = (d[2] - d[0], d[3] - d[1]);
            let b = [cx - w / 2.0, cy - h / 2.0, w, h];
            out.push(CocoResult {
                image_id,
                category_id: cats.get(d[5] as usize).copied().unwrap_or(d[5] as u64),
                bbox: b.map(|v| py_round(v as f64, 3)),
                score: py_round(d[4] as f64, 5),
            });
        }
    }
    out
}

/// The dataset's own labels of the validated images as COCO ground truth: one image per entry of
/// `dets` (skipped images are left out, as in the official table), labels `[cls, x1, y1, x2, y2]`
/// (original pixels, as matched for the table) → `bbox` xywh, `area` = `w · h` in pixels,
/// `iscrowd` 0, annotation ids from 1; category of class `i` = `cats[i]` (as [`val_results`]).
pub fn val_ground_truth(
    images: &[ValImage],
    dets: &[ImageDetections],
    ids: &[u64],
    names: &[String],
    cats: &[u64],
) -> CocoDataset {
    let cat = |c: usize| cats.get(c).copied().unwrap_or(c as u64);
    let mut ds = CocoDataset {
        categories: names
            .iter()
            .enumerate()
            .map(|(i, n)| CocoCategory {
                id: cat(i),
                name: n.clone(),
            })
            .collect(),
        ..CocoDataset::default()
    };
    let mut order: Vec<&ImageDetections> = dets.iter().collect();
    order.sort_by_key(|d| d.image);
    for im in order {
        let (Some(&id), Some(vi)) = (ids.get(im.image), images.get(im.image)) else {
            continue;
        };
        ds.images.push(CocoImage {
            id,
            width: vi.width,
            height: vi.height,
            file_name: vi
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned()),
        });
        for l in &im.labels {
            let (w, h) = ((l[3] - l[1]) as f64, (l[4] - l[2]) as f64);
            ds.annotations.push(CocoAnnotation {
                id: ds.annotations.len() as u64 + 1,
                image_id: id,
                category_id: cat(l[0] as usize),
                bbox: [l[1] as f64, l[2] as f64, w, h],
                area: w * h,
                iscrowd: 0,
            });
        }
    }
    ds
}

/// `--save-json`: writes `dir/predictions.json` from the collected validation output, evaluates
/// it (as read back from the file) against the labels converted by [`val_ground_truth`], and
/// returns the file's path and the evaluation. `ids`: the image id of each of `images`
/// ([`dataset_image_ids`] or [`val_image_ids`]); `cats`: the category id of each class
/// ([`category_ids`]).
pub fn save_and_evaluate(
    dir: &Path,
    images: &[ValImage],
    dets: &[ImageDetections],
    names: &[String],
    ids: &[u64],
    cats: &[u64],
) -> Result<(std::path::PathBuf, CocoEval)> {
    let results = val_results(dets, ids, cats);
    let path = dir.join("predictions.json");
    write_results(&path, &results)?;
    let back = read_results(&path)?;
    let gt = val_ground_truth(images, dets, ids, names, cats);
    let ev = gt
        .evaluate(&back)
        .with_context(|| format!("evaluating {}", crate::text::path(&path)))?;
    Ok((path, ev))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(name: &str) -> ValImage {
        ValImage {
            path: std::path::PathBuf::from("/d/images").join(name),
            width: 640,
            height: 480,
            labels: vec![(1, [0.5, 0.5, 0.25, 0.5])],
            outlines: vec![],
        }
    }

    #[test]
    fn image_ids_are_numeric_stems_or_indices() {
        let num = [image("000000000139.jpg"), image("42.png")];
        assert_eq!(val_image_ids(&num), vec![139, 42]);
        let mixed = [image("000000000139.jpg"), image("a42.png")];
        assert_eq!(val_image_ids(&mixed), vec![0, 1]);
        let dup = [image("7.jpg"), image("007.png")];
        assert_eq!(val_image_ids(&dup), vec![0, 1]);
    }

    #[test]
    fn results_and_ground_truth_as_save_one_json() {
        let imgs = [image("5.jpg"), image("9.jpg")];
        let dets = [ImageDetections {
            image: 1,
            dets: vec![[10.12345, 20.0, 50.5, 80.25, 0.876543, 2.0]],
            labels: vec![[1.0, 240.0, 120.0, 400.0, 360.0]],
        }];
        let ids = val_image_ids(&imgs);
        let names = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let cats = category_ids(&names, None);
        assert_eq!(cats, vec![0, 1, 2]);
        let r = val_results(&dets, &ids, &cats);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].image_id, 9);
        assert_eq!(r[0].category_id, 2);
        assert_eq!(r[0].bbox, [10.123, 20.0, 40.377, 60.25]);
        assert_eq!(r[0].score, 0.87654);
        let gt = val_ground_truth(&imgs, &dets, &ids, &names, &cats);
        assert_eq!(gt.images.len(), 1, "only validated images");
        assert_eq!(gt.images[0].id, 9);
        assert_eq!(gt.categories.len(), 3);
        assert_eq!(gt.annotations[0].bbox, [240.0, 120.0, 160.0, 240.0]);
        assert_eq!(gt.annotations[0].area, 160.0 * 240.0);
        assert_eq!(gt.annotations[0].id, 1);
        assert_eq!(py_round(0.125, 2), 0.12);
        assert_eq!(py_round(2.675, 2), 2.67);
    }

    #[test]
    fn category_ids_coco91_and_original_ids() {
        // The official coco80_to_91_class_map, spelled out.
        let official: [u64; 80] = [
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
            27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51,
            52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77,
            78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90,
        ];
        assert_eq!(COCO80_TO_91, official);
        let coco: Vec<String> = COCO80_NAMES.iter().map(|s| s.to_string()).collect();
        let cats = category_ids(&coco, None);
        assert_eq!(
            (cats[0], cats[11], cats[79]),
            (1, 13, 90),
            "person, stop sign, toothbrush"
        );
        // 80 classes with other names: class indices
        let mut other = coco.clone();
        other[5] = "coach".into();
        assert_eq!(category_ids(&other, None)[79], 79);
        // a COCO JSON dataset: its own ids, written back and used for the ground truth
        let names = vec!["RBC".to_string(), "WBC".to_string()];
        let cats = category_ids(&names, Some(&[5, 7]));
        assert_eq!(cats, vec![5, 7]);
        let imgs = [image("3.jpg")];
        let dets = [ImageDetections {
            image: 0,
            dets: vec![[1.0, 2.0, 3.0, 4.0, 0.5, 1.0]],
            labels: vec![[0.0, 1.0, 2.0, 3.0, 4.0]],
        }];
        let ids = val_image_ids(&imgs);
        assert_eq!(val_results(&dets, &ids, &cats)[0].category_id, 7);
        let gt = val_ground_truth(&imgs, &dets, &ids, &names, &cats);
        assert_eq!(gt.annotations[0].category_id, 5);
        assert_eq!(
            gt.categories.iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![5, 7]
        );
    }
}
