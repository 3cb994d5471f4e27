//! `val --save-json` on a COCO JSON split writes the dataset's own ids (issue 36, "COCO ids"):
//! a split of 4 BCCD test images whose `images[].id` are large, unsorted and non-contiguous and
//! whose category ids are 5, 17 and 42 gives a `predictions.json` with exactly those ids, and
//! scoring that file against the split's own JSON with the project's pycocotools-compatible
//! evaluator gives the AP that `val` printed (before: positional image ids, AP near 0).
use crate::common;

use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use yolo9::internals::metrics::coco_json::{read_results, CocoDataset};

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

/// Writes the COCO split (`dir/valid/_annotations.coco.json` and its images) and `dir/data.yaml`,
/// runs `yolo9 val --save-json` on it and returns (the split's JSON, val's stdout).
fn val_on_a_coco_split(dir: &Path) -> (std::path::PathBuf, String) {
    let src = common::shared_dir().join("datasets/bccd");
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
    (gt_path, out)
}

#[test]
fn save_json_on_a_coco_split_writes_its_own_ids_and_scores_against_it() {
    let dir = common::tmpdir("coco-ids");
    let (gt_path, out) = val_on_a_coco_split(&dir);

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

/// The same `predictions.json` scored by pycocotools itself (`COCOeval`, iouType `bbox`) gives
/// the AP and AP50 that `val` printed, within 0.001. Needs a Python with pycocotools, so it is
/// `#[ignore]`d; run it with
/// `YOLO9_PYTHON=/path/to/python cargo test --test detect pycocotools -- --ignored --nocapture`
/// (`YOLO9_PYTHON` defaults to `python3`; `python3 -m venv /tmp/coco && /tmp/coco/bin/pip install
/// pycocotools` makes one).
#[test]
#[ignore = "needs python3 with pycocotools: YOLO9_PYTHON=... cargo test --test detect pycocotools -- --ignored"]
fn save_json_on_a_coco_split_gives_the_printed_ap_under_pycocotools() {
    let dir = common::tmpdir("coco-ids-pycocotools");
    let (gt_path, out) = val_on_a_coco_split(&dir);
    let preds = dir.join("runs/coco/predictions.json");
    let python = std::env::var("YOLO9_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import sys, contextlib, io\n\
                  from pycocotools.coco import COCO\n\
                  from pycocotools.cocoeval import COCOeval\n\
                  with contextlib.redirect_stdout(io.StringIO()):\n\
                  \x20   gt = COCO(sys.argv[1]); dt = gt.loadRes(sys.argv[2])\n\
                  \x20   e = COCOeval(gt, dt, 'bbox'); e.evaluate(); e.accumulate(); e.summarize()\n\
                  print(' '.join(repr(float(v)) for v in e.stats))\n";
    let run = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(&gt_path)
        .arg(&preds)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (set YOLO9_PYTHON): {e}"));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{python} with pycocotools failed (install pycocotools, or set YOLO9_PYTHON):\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stats: Vec<f64> = stdout
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(stats.len(), 12, "{stdout}");
    let ap = printed(&out, "IoU=0.50:0.95 | area=   all | maxDets=100");
    let ap50 = printed(&out, "IoU=0.50      |");
    let ap75 = printed(&out, "IoU=0.75      |");
    eprintln!(
        "pycocotools AP {:.4} AP50 {:.4} AP75 {:.4}; val printed AP {ap:.3} AP50 {ap50:.3} AP75 \
         {ap75:.3}",
        stats[0], stats[1], stats[2]
    );
    assert!(ap > 0.3, "AP {ap}\n{out}");
    for (k, want) in [(0, ap), (1, ap50), (2, ap75)] {
        assert!(
            (stats[k] - want).abs() <= 0.001,
            "stat {k}: pycocotools {} vs printed {want}",
            stats[k]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
