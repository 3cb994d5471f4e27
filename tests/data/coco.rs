//! Datasets as people export them (issue 15 item 3): a Roboflow-layout copy of BCCD
//! (`train/images`, `valid/images`, a data.yaml with `../` paths) and a COCO-JSON copy (the YOLO
//! labels converted in the test, with a Roboflow-style parent category) give the same scan counts
//! as the YOLO layout, `yolo9 check` accepts both, and one CPU training epoch (with its final
//! validation) runs on a small subset of each. Bad COCO JSON gives file:record:value reports and
//! skips, or a whole-file error naming the position, never a panic.

use crate::common;

use common::tmpdir;
use serde_json::json;
use std::path::{Path, PathBuf};
use yolo9::internals::data::labels::IssueKind;
use yolo9::internals::data::scan::{scan_split, ScanCounts, ScanOptions, SplitScan};
use yolo9::internals::data::yaml::{DataConfig, Split};

fn opts() -> ScanOptions {
    ScanOptions {
        use_cache: false,
        print: false,
        ..Default::default()
    }
}

fn scan(cfg: &DataConfig, split: Split) -> SplitScan {
    scan_split(cfg, split, &opts()).unwrap()
}

/// The counts compared between layouts.
fn key_counts(c: &ScanCounts) -> (usize, usize, usize, usize, usize, Vec<usize>) {
    (
        c.images,
        c.labelled,
        c.empty + c.missing,
        c.corrupt,
        c.boxes,
        c.per_class.clone(),
    )
}

/// Copies the YOLO images and labels of `scan` into `dir/<split>/images` and `labels`.
fn roboflow_split(scan: &SplitScan, dir: &Path, split: &str, take: usize) {
    std::fs::create_dir_all(dir.join(split).join("images")).unwrap();
    std::fs::create_dir_all(dir.join(split).join("labels")).unwrap();
    for r in scan.records.iter().take(take) {
        let name = r.image.file_name().unwrap();
        std::fs::copy(&r.image, dir.join(split).join("images").join(name)).unwrap();
        if let Some(l) = &r.label {
            std::fs::copy(
                l,
                dir.join(split).join("labels").join(l.file_name().unwrap()),
            )
            .unwrap();
        }
    }
}

/// Writes `dir/<split>/_annotations.coco.json` (Roboflow's COCO export: images beside the JSON,
/// a parent category `cells` with id 0, the classes with ids 1..) from the records of `scan`,
/// their boxes in pixels; copies the images.
fn coco_split(scan: &SplitScan, dir: &Path, split: &str, names: &[String], take: usize) -> PathBuf {
    let d = dir.join(split);
    std::fs::create_dir_all(&d).unwrap();
    let mut images = Vec::new();
    let mut anns = Vec::new();
    for (i, r) in scan.records.iter().take(take).enumerate() {
        let name = r.image.file_name().unwrap().to_string_lossy().into_owned();
        std::fs::copy(&r.image, d.join(&name)).unwrap();
        images.push(json!({"id": i, "file_name": name, "width": r.width, "height": r.height}));
        let (w, h) = (r.width as f64, r.height as f64);
        for b in &r.boxes {
            let (bw, bh) = (b.w as f64 * w, b.h as f64 * h);
            anns.push(json!({
                "id": anns.len(), "image_id": i, "category_id": b.cls + 1,
                "bbox": [b.cx as f64 * w - bw / 2.0, b.cy as f64 * h - bh / 2.0, bw, bh],
                "area": bw * bh, "segmentation": [], "iscrowd": 0
            }));
        }
    }
    let mut cats = vec![json!({"id": 0, "name": "cells", "supercategory": "none"})];
    for (k, n) in names.iter().enumerate() {
        cats.push(json!({"id": k + 1, "name": n, "supercategory": "cells"}));
    }
    let j = d.join("_annotations.coco.json");
    std::fs::write(
        &j,
        serde_json::to_string(&json!({"images": images, "annotations": anns, "categories": cats}))
            .unwrap(),
    )
    .unwrap();
    j
}

fn hyp(dir: &Path) {
    std::fs::write(
        dir.join("hyp.yaml"),
        "lr0: 0.1\nwarmup_bias_lr: 0.1\nlrf: 0.01\nmomentum: 0.937\nweight_decay: 0.0005\nwarmup_epochs: 3.0\n\
         hsv_h: 0\nhsv_s: 0\nhsv_v: 0\ntranslate: 0\nscale: 0\nfliplr: 0\nmosaic: 0\nmixup: 0\n",
    )
    .unwrap();
}

/// One CPU epoch at 64 px on the dataset in `dir` (its data.yaml), validating at the end; with
/// `plots`, `labels.jpg` and the final validation's val_batch pictures are drawn.
fn one_epoch(dir: &Path, plots: bool) {
    hyp(dir);
    let mut o = common::tiny_run_options(dir, "exp");
    o.epochs = 1;
    o.noplots = !plots;
    let s = yolo9::train::trainer::train(&o).unwrap();
    assert_eq!(s.epochs.len(), 1);
    assert!(s.epochs[0].validated);
    assert!(s.epochs[0].train_loss.iter().all(|v| v.is_finite()));
    assert!(s.run_dir.join("weights/last.safetensors").is_file());
    for f in ["labels.jpg", "val_batch0_labels.jpg", "val_batch0_pred.jpg"] {
        assert_eq!(s.run_dir.join(f).is_file(), plots, "{f}");
    }
}

#[test]
fn roboflow_and_coco_json_copies_scan_like_the_yolo_layout_and_train() {
    let t0 = std::time::Instant::now();
    let yolo = DataConfig::load(&common::shared_dir().join("datasets/bccd/data.yaml")).unwrap();
    let (ytrain, yval) = (scan(&yolo, Split::Train), scan(&yolo, Split::Val));
    assert!(ytrain.counts.boxes > 1000, "{:?}", ytrain.counts);
    let tmp = tmpdir("layouts");

    // (a) Roboflow layout, every image.
    let rf = tmp.join("roboflow");
    roboflow_split(&ytrain, &rf, "train", usize::MAX);
    roboflow_split(&yval, &rf, "valid", usize::MAX);
    std::fs::write(
        rf.join("data.yaml"),
        "train: ../train/images\nval: ../valid/images\nnc: 3\nnames: [RBC, WBC, Platelets]\n",
    )
    .unwrap();
    let rcfg = DataConfig::load(&rf.join("data.yaml")).unwrap();
    assert_eq!(rcfg.notices.len(), 2, "{:?}", rcfg.notices);

    // (b) COCO JSON, every image; no `names`: they come from the categories.
    let co = tmp.join("coco");
    coco_split(&ytrain, &co, "train", &yolo.names, usize::MAX);
    coco_split(&yval, &co, "valid", &yolo.names, usize::MAX);
    std::fs::write(
        co.join("data.yaml"),
        "train: train/_annotations.coco.json\nval: valid/_annotations.coco.json\n",
    )
    .unwrap();
    let ccfg = DataConfig::load(&co.join("data.yaml")).unwrap();
    assert_eq!(ccfg.names, yolo.names, "names from the categories");
    let classes = ccfg.coco.as_ref().unwrap();
    assert_eq!(
        classes.ids,
        vec![1, 2, 3],
        "the parent `cells` (id 0) is not a class"
    );
    assert!(
        ccfg.notices.iter().any(|n| n.contains("\"cells\" (id 0)")),
        "{:?}",
        ccfg.notices
    );

    for (split, y) in [(Split::Train, &ytrain), (Split::Val, &yval)] {
        let r = scan(&rcfg, split);
        let c = scan(&ccfg, split);
        assert_eq!(
            key_counts(&r.counts),
            key_counts(&y.counts),
            "roboflow {split}"
        );
        assert_eq!(key_counts(&c.counts), key_counts(&y.counts), "coco {split}");
        assert_eq!(c.counts.rows_dropped, 0, "{:?}", c.issues);
        // the same boxes, image by image (file names are the same; COCO → normalized in f64)
        for (a, b) in y.records.iter().zip(&c.records) {
            assert_eq!(a.image.file_name(), b.image.file_name());
            assert_eq!(a.boxes.len(), b.boxes.len());
            for (p, q) in a.boxes.iter().zip(&b.boxes) {
                assert_eq!(p.cls, q.cls);
                for (u, v) in [(p.cx, q.cx), (p.cy, q.cy), (p.w, q.w), (p.h, q.h)] {
                    assert!((u - v).abs() < 1e-5, "{} {p:?} {q:?}", a.image.display());
                }
            }
        }
    }

    // `yolo9 check` accepts the COCO copy: the mapping line, and the summary the YOLO scan gives.
    let (code, out, err) =
        common::yolo9(&["check", "--data", co.join("data.yaml").to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains(
            "COCO categories → classes: 0: RBC (id 1), 1: WBC (id 2), 2: Platelets (id 3)"
        ),
        "{out}"
    );
    let head = |s: &str| s.split("; ").take(2).collect::<Vec<_>>().join("; ");
    let want = head(&ytrain.summary(&yolo.names));
    assert!(out.lines().any(|l| head(l) == want), "{want}\n{out}");
    // the cache sits beside the JSON and gives the same scan the second time
    assert!(co
        .join("train/_annotations.coco.yolo9-cache.json")
        .is_file());
    let (code, out2, _) =
        common::yolo9(&["check", "--data", co.join("data.yaml").to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out2.contains("labels read from cache"), "{out2}");
    assert!(out2.lines().any(|l| head(l) == want), "{out2}");
    eprintln!("scans: {:.1} s", t0.elapsed().as_secs_f64());

    // One CPU epoch on 3 train images (and 1 val image) of each layout.
    let small_rf = tmp.join("small_roboflow");
    roboflow_split(&ytrain, &small_rf, "train", 3);
    roboflow_split(&yval, &small_rf, "valid", 1);
    std::fs::write(
        small_rf.join("data.yaml"),
        "train: ../train/images\nval: ../valid/images\nnames: [RBC, WBC, Platelets]\n",
    )
    .unwrap();
    one_epoch(&small_rf, false);
    let small_co = tmp.join("small_coco");
    coco_split(&ytrain, &small_co, "train", &yolo.names, 3);
    coco_split(&yval, &small_co, "valid", &yolo.names, 1);
    std::fs::write(
        small_co.join("data.yaml"),
        "train: train/_annotations.coco.json\nval: valid/_annotations.coco.json\n",
    )
    .unwrap();
    one_epoch(&small_co, true);
    eprintln!("total: {:.1} s", t0.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Every kind of bad record in one file: each reported as `file: record: value → action`,
/// skipped and counted; a crowd box ignored; an image with no annotation is a background image.
/// A truncated file is an error naming the file, line and column. `names` disagreeing with the
/// categories: a notice (same count) or an error (other count).
#[test]
fn bad_coco_json_records_are_reported_and_skipped() {
    let dir = tmpdir("bad");
    let src = common::shared_dir().join("datasets/bccd/images/train");
    let mut files: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let d = dir.join("annotations");
    std::fs::create_dir_all(dir.join("images")).unwrap();
    std::fs::create_dir_all(&d).unwrap();
    // images/ beside the annotations folder (COCO's layout)
    for f in &files[..2] {
        std::fs::copy(f, dir.join("images").join(f.file_name().unwrap())).unwrap();
    }
    let (a, b) = (
        files[0].file_name().unwrap().to_str().unwrap(),
        files[1].file_name().unwrap().to_str().unwrap(),
    );
    let (w, h) = image::image_dimensions(&files[0]).unwrap();
    let j = d.join("instances_train.json");
    let text = serde_json::to_string_pretty(&json!({
        "images": [
            {"id": 1, "file_name": a, "width": w, "height": h},
            {"id": 2, "file_name": b},
            {"id": 3, "file_name": "gone.jpg", "width": 10, "height": 10},
            {"id": "x", "file_name": a},
        ],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 5, "bbox": [10, 20, 30, 40]},
            {"id": 11, "image_id": 1, "category_id": 5, "bbox": [10, 20, -30, 40]},
            {"id": 12, "image_id": 1, "category_id": 99, "bbox": [10, 20, 30, 40]},
            {"id": 13, "image_id": 1, "category_id": 7, "bbox": [0, 0, w, h], "iscrowd": 1},
            {"id": 14, "image_id": 3, "category_id": 5, "bbox": [1, 1, 2, 2]},
            {"id": 15, "image_id": 1, "category_id": 7, "bbox": [1, 2, "3"]},
            17,
            {"id": 16, "image_id": 1, "category_id": 7, "bbox": [-10, 0, 20, 10]},
        ],
        "categories": [{"id": 7, "name": "WBC"}, {"id": 5, "name": "RBC"}],
    }))
    .unwrap();
    std::fs::write(&j, &text).unwrap();
    std::fs::write(
        dir.join("data.yaml"),
        "train: annotations/instances_train.json\nval: annotations/instances_train.json\n",
    )
    .unwrap();
    let cfg = DataConfig::load(&dir.join("data.yaml")).unwrap();
    assert_eq!(cfg.names, ["RBC", "WBC"], "sorted by id: 5, 7");
    let s = scan(&cfg, Split::Train);
    let shown: Vec<String> = s.issues.iter().map(|i| i.display_relative(&dir)).collect();
    let has = |pat: &[&str]| {
        assert!(
            shown.iter().any(|l| pat.iter().all(|p| l.contains(p))),
            "{pat:?} not in {shown:#?}"
        )
    };
    let f = "annotations/instances_train.json: ";
    has(&[
        f,
        "images[2] (id 3): file_name \"gone.jpg\" not found",
        "image skipped",
    ]);
    has(&[
        f,
        "images[3] (id \"x\"): id \"x\" is not a non-negative integer",
    ]);
    has(&[
        f,
        "annotations[1] (id 11): bbox [10,20,-30,40] has width -30",
        "annotation skipped",
    ]);
    has(&[
        f,
        "annotations[2] (id 12): category_id 99 is not a category (known ids [5, 7])",
    ]);
    has(&[
        f,
        "annotations[4] (id 14): image_id 3 is not a usable image",
    ]);
    has(&[
        f,
        "annotations[5] (id 15): bbox [1,2,\"3\"] is not four numbers",
    ]);
    has(&[f, "annotations[6]: not an object"]);
    has(&[f, "1 crowd annotations (iscrowd: 1)", "ignored"]);
    has(&[
        f,
        "annotations[7] (id 16): bbox [-10, 0, 20, 10] crosses the edge",
        "clipped",
    ]);
    let c = &s.counts;
    assert_eq!(
        (c.images, c.corrupt),
        (4, 2),
        "two images[] records skipped"
    );
    assert_eq!(
        (c.labelled, c.empty),
        (1, 1),
        "image 2 has no annotation: background"
    );
    assert_eq!(c.boxes, 2, "annotations 10 and 16");
    assert_eq!(c.per_class, vec![1, 1]);
    assert_eq!(
        c.rows_dropped, 5,
        "annotations 11, 12, 14, 15 and the number"
    );
    assert_eq!(c.rows_clipped, 1);
    assert_eq!(
        s.issues
            .iter()
            .filter(|i| i.kind == IssueKind::CrowdIgnored)
            .count(),
        1
    );
    let r = &s.records[0];
    assert_eq!(r.boxes[0].cls, 0);
    assert!((r.boxes[0].cx - 25.0 / w as f32).abs() < 1e-6);
    assert!((r.boxes[0].h - 40.0 / h as f32).abs() < 1e-6);
    // `yolo9 check` prints the same and succeeds (one image has a box)
    let (code, out, err) =
        common::yolo9(&["check", "--data", dir.join("data.yaml").to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("annotations[1] (id 11): bbox [10,20,-30,40]"),
        "{out}"
    );

    // names of the same count that disagree: used, with a notice; another count: an error
    std::fs::write(
        dir.join("named.yaml"),
        "train: annotations/instances_train.json\nval: annotations/instances_train.json\nnames: [a, b]\n",
    )
    .unwrap();
    let n = DataConfig::load(&dir.join("named.yaml")).unwrap();
    assert_eq!(n.names, ["a", "b"]);
    assert!(
        n.notices
            .iter()
            .any(|l| l.contains("disagrees with the COCO category names")),
        "{:?}",
        n.notices
    );
    std::fs::write(
        dir.join("three.yaml"),
        "train: annotations/instances_train.json\nval: annotations/instances_train.json\nnames: [a, b, c]\n",
    )
    .unwrap();
    let e = format!(
        "{:#}",
        DataConfig::load(&dir.join("three.yaml")).unwrap_err()
    );
    assert!(
        e.contains("`names` has 3 entries but the COCO JSON split has 2"),
        "{e}"
    );

    // truncated: an error naming the file and the position
    std::fs::write(&j, &text[..text.len() / 2]).unwrap();
    let e = format!(
        "{:#}",
        DataConfig::load(&dir.join("data.yaml")).unwrap_err()
    );
    assert!(e.contains("instances_train.json:"), "{e}");
    assert!(e.contains("the file is truncated"), "{e}");
    let line = text[..text.len() / 2].matches('\n').count() + 1;
    assert!(
        e.contains(&format!("instances_train.json:{line}:")),
        "line {line}: {e}"
    );
    // not an annotations file (a results list)
    std::fs::write(&j, "[{\"image_id\": 1}]").unwrap();
    let e = format!(
        "{:#}",
        DataConfig::load(&dir.join("data.yaml")).unwrap_err()
    );
    assert!(e.contains("instances_train.json:1:"), "{e}");
    std::fs::write(&j, "{\"annotations\": []}").unwrap();
    let e = format!(
        "{:#}",
        DataConfig::load(&dir.join("data.yaml")).unwrap_err()
    );
    assert!(e.contains("no `images` list"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `yolo9 val` on a COCO JSON split with the official BCCD weights (4 images, 320 px, CPU):
/// `predictions.json` carries the JSON's own category ids (1..3, not the class indices 0..2),
/// `--save-txt --save-conf` writes one `cls cx cy w h conf` line per prediction (as many lines as
/// predictions.json has entries, every value normalized), and the val_batch pictures are drawn.
#[test]
fn val_on_a_coco_json_split_writes_original_ids_labels_and_pictures() {
    let yolo = DataConfig::load(&common::shared_dir().join("datasets/bccd/data.yaml")).unwrap();
    let yval = scan(&yolo, Split::Val);
    let dir = tmpdir("val");
    coco_split(&yval, &dir, "valid", &yolo.names, 4);
    std::fs::write(
        dir.join("data.yaml"),
        "train: valid/_annotations.coco.json\nval: valid/_annotations.coco.json\n",
    )
    .unwrap();
    let weights = common::reference("bccd-official-best.pt");
    let (code, out, err) = common::yolo9(&[
        "val",
        "--data",
        dir.join("data.yaml").to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "--img",
        "320",
        "--batch",
        "4",
        "--device",
        "cpu",
        "--save-json",
        "--save-txt",
        "--save-conf",
        "--project",
        dir.join("runs").to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("COCO categories → classes: 0: RBC (id 1)"),
        "{out}"
    );
    let run = dir.join("runs/exp");
    let preds: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(run.join("predictions.json")).unwrap())
            .unwrap();
    assert!(preds.len() > 20, "{}", preds.len());
    let ids: std::collections::BTreeSet<u64> = preds
        .iter()
        .map(|p| p["category_id"].as_u64().unwrap())
        .collect();
    assert!(ids.iter().all(|i| (1..=3).contains(i)), "{ids:?}");
    assert!(ids.contains(&1), "RBC is category 1: {ids:?}");
    let mut lines = 0;
    for e in std::fs::read_dir(run.join("labels")).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for l in text.lines() {
            let v: Vec<f64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            assert_eq!(v.len(), 6, "{l}");
            assert!(
                v[0] < 3.0 && v[1..].iter().all(|x| (0.0..=1.0).contains(x)),
                "{l}"
            );
            lines += 1;
        }
    }
    assert_eq!(lines, preds.len(), "one label line per prediction");
    for f in [
        "val_batch0_labels.jpg",
        "val_batch0_pred.jpg",
        "confusion_matrix.png",
    ] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    assert!(
        !run.join("val_batch1_labels.jpg").exists(),
        "one batch of 4 images"
    );
}
