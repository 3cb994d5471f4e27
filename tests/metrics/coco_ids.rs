//! `val --save-json` on a COCO JSON split writes the dataset's own ids (issue 36, "COCO ids"):
//! a split of 4 BCCD test images whose `images[].id` are large, unsorted and non-contiguous and
//! whose category ids are 5, 17 and 42 gives a `predictions.json` with exactly those ids, and
//! scoring that file against the split's own JSON with the project's pycocotools-compatible
//! evaluator gives the AP that `val` printed (before: positional image ids, AP near 0).
use crate::common;

use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use yolo9::metrics::coco_json::{read_results, CocoDataset};

const IMAGES: [(&str, u64); 4] = [
    ("BloodImage_00007", 90_017),
    ("BloodImage_00011", 513),
    ("BloodImage_00015", 1_000_003),
    ("BloodImage_00016", 42),
];
const CATEGORIES: [(u64, &str); 3] = [(5, "RBC"), (17, "WBC"), (42, "Platelets")];

/// The number after `= ` on the printed COCO summary line that contains `key`.
fn printed(out: &str, key: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.starts_with(" Average Precision") && l.contains(key))
        .unwrap_or_else(|| panic!("no `{key}` line in\n{out}"));
    line.rsplit("= ").next().unwrap().trim().parse().unwrap()
}

#[test]
fn save_json_on_a_coco_split_writes_its_own_ids_and_scores_against_it() {
    let src = common::shared_dir().join("datasets/bccd");
    let dir = common::tmpdir("coco-ids");
    let valid = dir.join("valid");
    std::fs::create_dir_all(&valid).unwrap();
    let (mut images, mut anns) = (Vec::new(), Vec::new());
    for (name, id) in IMAGES {
        let img = src.join("images/test").join(format!("{name}.jpg"));
        std::fs::copy(&img, valid.join(format!("{name}.jpg"))).unwrap();
        let (w, h) = image::image_dimensions(&img).unwrap();
        images.push(json!({"id": id, "file_name": format!("{name}.jpg"), "width": w, "height": h}));
        let text =
            std::fs::read_to_string(src.join("labels/test").join(format!("{name}.txt"))).unwrap();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Vec<f64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            let (fw, fh) = (f64::from(w), f64::from(h));
            let x1 = ((v[1] - v[3] / 2.0) * fw).clamp(0.0, fw);
            let y1 = ((v[2] - v[4] / 2.0) * fh).clamp(0.0, fh);
            let x2 = ((v[1] + v[3] / 2.0) * fw).clamp(0.0, fw);
            let y2 = ((v[2] + v[4] / 2.0) * fh).clamp(0.0, fh);
            anns.push(json!({
                "id": 7 * anns.len() + 3, "image_id": id,
                "category_id": CATEGORIES[v[0] as usize].0,
                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0
            }));
        }
    }
    let cats: Vec<_> = CATEGORIES
        .iter()
        .map(|(id, n)| json!({"id": id, "name": n}))
        .collect();
    let gt_path = valid.join("_annotations.coco.json");
    std::fs::write(
        &gt_path,
        json!({"images": images, "annotations": anns, "categories": cats}).to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.join("data.yaml"),
        "train: valid/_annotations.coco.json\nval: valid/_annotations.coco.json\n",
    )
    .unwrap();

    let weights = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let (code, out, err) = common::yolo9(&[
        "val",
        "--data",
        dir.join("data.yaml").to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "--img",
        "320",
        "--device",
        "cpu",
        "--noplots",
        "--save-json",
        "--project",
        dir.join("runs").to_str().unwrap(),
        "--name",
        "coco",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!err.contains("note: --save-json"), "{err}");

    let preds = read_results(&dir.join("runs/coco/predictions.json")).unwrap();
    assert!(preds.len() > 20, "{} predictions", preds.len());
    let image_ids: BTreeSet<u64> = preds.iter().map(|p| p.image_id).collect();
    let want: BTreeSet<u64> = IMAGES.iter().map(|i| i.1).collect();
    assert_eq!(image_ids, want, "every image's own id, and only those");
    let cat_ids: BTreeSet<u64> = preds.iter().map(|p| p.category_id).collect();
    assert!(
        cat_ids.is_subset(&CATEGORIES.iter().map(|c| c.0).collect()),
        "{cat_ids:?}"
    );
    assert!(cat_ids.contains(&5), "RBC is category 5: {cat_ids:?}");

    // Scored against the split's own JSON (as pycocotools would be): the printed AP.
    let ev = CocoDataset::load(&gt_path)
        .unwrap()
        .evaluate(&preds)
        .unwrap();
    let ap = printed(&out, "IoU=0.50:0.95 | area=   all | maxDets=100");
    let ap50 = printed(&out, "IoU=0.50      |");
    assert!(ap > 0.3, "AP {ap}\n{out}");
    assert!((ev.stats[0] - ap).abs() <= 0.001, "{} vs {ap}", ev.stats[0]);
    assert!(
        (ev.stats[1] - ap50).abs() <= 0.001,
        "{} vs {ap50}",
        ev.stats[1]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
