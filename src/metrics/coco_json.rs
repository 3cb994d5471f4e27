//! COCO JSON files and `yolo9 val --save-json`: the results list
//! `[{image_id, category_id, bbox: [x, y, w, h], score}]` ([`CocoResult`]), the annotations file
//! `{images, annotations, categories}` ([`CocoDataset`]), the conversion of validation output to
//! both (official `val_dual.py save_one_json`), and their evaluation with [`crate::metrics::coco`].
//!
//! Ids written by `--save-json` ([`val_image_ids`], [`val_results`]):
//! - `image_id`: the file stem when the stems of **all** validated images are numeric and
//!   distinct (COCO's `000000000139.jpg` → 139, as the official `int(path.stem)`); otherwise the
//!   image's 0-based position in the scanned split (sorted paths), for every image — stable for a
//!   given split, never a mix of the two. (The official code writes a non-numeric stem as a
//!   string id; this format keeps ids numeric.)
//! - `category_id`: the class index (0-based), as the official val does for every dataset but
//!   COCO itself (it maps COCO's 80 classes to the 91 ids only when `val` ends in
//!   `coco/val2017.txt`; that mapping is not done here).

use crate::metrics::coco::{evaluate, CocoDt, CocoEval, CocoGt};
use crate::metrics::validate::{ImageDetections, ValImage};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

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
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read COCO annotations {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a COCO annotations file", path.display()))
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
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read COCO results {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{}: not a COCO results list", path.display()))
}

/// Writes a results file as compact JSON (as the official `json.dump`).
pub fn write_results(path: &Path, results: &[CocoResult]) -> Result<()> {
    let text = serde_json::to_string(results).context("serializing COCO results")?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
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

/// COCO results of validated images (official `save_one_json`): each detection
/// `[x1, y1, x2, y2, conf, cls]` (original pixels) becomes `bbox` = `[x1', y1', w, h]` computed
/// in f32 as `xyxy2xywh` then `xy -= wh / 2`, each rounded to 3 decimals, `score` = conf rounded
/// to 5 decimals, `category_id` = class index, `image_id` = `ids[image]`. In the order of `dets`.
pub fn val_results(dets: &[ImageDetections], ids: &[u64]) -> Vec<CocoResult> {
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
                category_id: d[5] as u64,
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
/// `iscrowd` 0, annotation ids from 1; categories = class indices `0..names.len()`.
pub fn val_ground_truth(
    images: &[ValImage],
    dets: &[ImageDetections],
    ids: &[u64],
    names: &[String],
) -> CocoDataset {
    let mut ds = CocoDataset {
        categories: names
            .iter()
            .enumerate()
            .map(|(i, n)| CocoCategory {
                id: i as u64,
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
                category_id: l[0] as u64,
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
/// returns the file's path and the evaluation.
pub fn save_and_evaluate(
    dir: &Path,
    images: &[ValImage],
    dets: &[ImageDetections],
    names: &[String],
) -> Result<(std::path::PathBuf, CocoEval)> {
    let ids = val_image_ids(images);
    let results = val_results(dets, &ids);
    let path = dir.join("predictions.json");
    write_results(&path, &results)?;
    let back = read_results(&path)?;
    let gt = val_ground_truth(images, dets, &ids, names);
    let ev = gt
        .evaluate(&back)
        .with_context(|| format!("evaluating {}", path.display()))?;
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
        let r = val_results(&dets, &ids);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].image_id, 9);
        assert_eq!(r[0].category_id, 2);
        assert_eq!(r[0].bbox, [10.123, 20.0, 40.377, 60.25]);
        assert_eq!(r[0].score, 0.87654);
        let names = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let gt = val_ground_truth(&imgs, &dets, &ids, &names);
        assert_eq!(gt.images.len(), 1, "only validated images");
        assert_eq!(gt.images[0].id, 9);
        assert_eq!(gt.categories.len(), 3);
        assert_eq!(gt.annotations[0].bbox, [240.0, 120.0, 160.0, 240.0]);
        assert_eq!(gt.annotations[0].area, 160.0 * 240.0);
        assert_eq!(gt.annotations[0].id, 1);
        assert_eq!(py_round(0.125, 2), 0.12);
        assert_eq!(py_round(2.675, 2), 2.67);
    }
}
