//! `yolo9 val --save-json` on 3 BCCD test images with the shipped weights at --img 320 (CPU,
//! seconds): predictions.json in the run folder in COCO results format, its evaluation against
//! the labels (converted here, independently of the library) equals the printed COCO summary,
//! and the official table is the same with and without --save-json.
use crate::common;

use common::yolo9;

use std::path::Path;
use yolo9::internals::metrics::coco::{evaluate, CocoDt, CocoGt};
use yolo9::internals::metrics::coco_json::read_results;

/// The official table: the stdout lines from the header to the last class row.
fn table(out: &str) -> Vec<&str> {
    let start = out
        .lines()
        .position(|l| l.contains("mAP50-95"))
        .unwrap_or_else(|| panic!("no table in\n{out}"));
    out.lines()
        .skip(start)
        .take_while(|l| !l.contains(" images in "))
        .collect()
}

#[test]
fn val_save_json_writes_and_evaluates_coco_results() {
    let dir = common::tmpdir("val-coco");
    let src = common::shared_dir().join("datasets/bccd");
    let names = ["BloodImage_00007", "BloodImage_00011", "BloodImage_00015"];
    std::fs::create_dir_all(dir.join("images/val")).unwrap();
    std::fs::create_dir_all(dir.join("labels/val")).unwrap();
    for n in names {
        std::fs::copy(
            src.join("images/test").join(format!("{n}.jpg")),
            dir.join("images/val").join(format!("{n}.jpg")),
        )
        .unwrap();
        std::fs::copy(
            src.join("labels/test").join(format!("{n}.txt")),
            dir.join("labels/val").join(format!("{n}.txt")),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("data.yaml"),
        "train: images/val\nval: images/val\nnames: [RBC, WBC, Platelets]\n",
    )
    .unwrap();
    let weights = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let data = dir.join("data.yaml");
    let project = dir.join("runs");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "val",
            "--data",
            data.to_str().unwrap(),
            "--weights",
            weights.to_str().unwrap(),
            "--img",
            "320",
            "--device",
            "cpu",
            "--noplots",
            "--project",
            project.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = yolo9(&args);
        assert_eq!(code, 0, "{out}\n{err}");
        out
    };
    let plain = run(&[]);
    assert!(!project.exists(), "--noplots alone makes no run folder");
    let out = run(&["--save-json", "--name", "coco"]);
    assert_eq!(table(&plain), table(&out), "the official table changed");
    let pred = project.join("coco/predictions.json");
    assert!(out.contains(&format!("Saved {}", pred.display())), "{out}");

    // The file: COCO results, ids = indices of the sorted images (stems are not numeric),
    // category = class index, bbox xywh inside the 640x480 images, rounded as save_one_json.
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&pred).unwrap()).unwrap();
    let rows = raw.as_array().unwrap();
    assert!(rows.len() > 20, "{} detections", rows.len());
    for r in rows {
        let mut keys: Vec<&String> = r.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["bbox", "category_id", "image_id", "score"], "{r}");
    }
    let dets = read_results(&pred).unwrap();
    let mut seen = [false; 3];
    for d in &dets {
        assert!(d.image_id < 3 && d.category_id < 3, "{d:?}");
        seen[d.image_id as usize] = true;
        let [x, y, w, h] = d.bbox;
        assert!(x >= 0.0 && y >= 0.0 && w >= 0.0 && h >= 0.0, "{d:?}");
        assert!(x + w <= 640.001 && y + h <= 480.001, "{d:?}");
        for v in d.bbox {
            assert!(
                ((v * 1e3).round() - v * 1e3).abs() < 1e-6,
                "{v} has > 3 decimals"
            );
        }
        assert!(((d.score * 1e5).round() - d.score * 1e5).abs() < 1e-6);
        assert!(d.score > 0.0 && d.score <= 1.0);
    }
    assert_eq!(seen, [true; 3]);

    // The labels as COCO GT, made here from the label files.
    let mut gts = Vec::new();
    for (id, n) in names.iter().enumerate() {
        let text =
            std::fs::read_to_string(dir.join("labels/val").join(format!("{n}.txt"))).unwrap();
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Vec<f64> = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            let x1 = ((v[1] - v[3] / 2.0) * 640.0).clamp(0.0, 640.0);
            let y1 = ((v[2] - v[4] / 2.0) * 480.0).clamp(0.0, 480.0);
            let x2 = ((v[1] + v[3] / 2.0) * 640.0).clamp(0.0, 640.0);
            let y2 = ((v[2] + v[4] / 2.0) * 480.0).clamp(0.0, 480.0);
            gts.push(CocoGt {
                image_id: id as u64,
                category_id: v[0] as u64,
                bbox: [x1, y1, x2 - x1, y2 - y1],
                area: (x2 - x1) * (y2 - y1),
                iscrowd: false,
            });
        }
    }
    let dts: Vec<CocoDt> = dets.iter().map(CocoDt::from).collect();
    let ev = evaluate(&[0, 1, 2], &[0, 1, 2], &gts, &dts).unwrap();
    let printed: Vec<&str> = out.lines().filter(|l| l.starts_with(" Average ")).collect();
    assert_eq!(printed, ev.summary_lines(), "{out}");
    assert!(ev.stats[1] > 0.5, "AP50 {}", ev.stats[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--exist-ok` into the dataset folder whose data file is named `predictions.json` (YAML is a
/// superset of JSON's syntax, so it loads): `--save-json` would replace the input with the
/// results. val refuses before validating, naming the option and the input; nothing changes.
#[test]
fn val_exist_ok_never_writes_over_an_input() {
    let dir = common::tmpdir("val-exist-ok");
    let src = common::shared_dir().join("datasets/bccd");
    std::fs::create_dir_all(dir.join("ds/images/val")).unwrap();
    std::fs::create_dir_all(dir.join("ds/labels/val")).unwrap();
    let n = "BloodImage_00007";
    std::fs::copy(
        src.join(format!("images/test/{n}.jpg")),
        dir.join(format!("ds/images/val/{n}.jpg")),
    )
    .unwrap();
    std::fs::copy(
        src.join(format!("labels/test/{n}.txt")),
        dir.join(format!("ds/labels/val/{n}.txt")),
    )
    .unwrap();
    let data = dir.join("ds/predictions.json");
    let text = "train: images/val\nval: images/val\nnames: [RBC, WBC, Platelets]\n";
    std::fs::write(&data, text).unwrap();
    let weights = Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let (code, out, err) = yolo9(&[
        "val",
        "--data",
        data.to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "--img",
        "320",
        "--device",
        "cpu",
        "--save-json",
        "--project",
        dir.to_str().unwrap(),
        "--name",
        "ds",
        "--exist-ok",
    ]);
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("--exist-ok") && err.contains("predictions.json"),
        "{err}"
    );
    assert!(
        !out.contains("mAP50-95"),
        "refused before validating: {out}"
    );
    assert_eq!(std::fs::read_to_string(&data).unwrap(), text);
    assert!(!dir.join("ds/confusion_matrix.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
