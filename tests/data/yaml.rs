//! data.yaml resolution (case yaml_relative_path, from several working directories through the
//! `yolo9 check` binary), hand-made yaml variants, label-row rules by hand, and the label path rule.
use crate::common;

use common::{case_dir, tmpdir};

use std::path::{Path, PathBuf};
use std::process::Command;
use yolo9::internals::data::labels::{parse_labels, IssueKind, LabelBox};
use yolo9::internals::data::scan::label_path_for;
use yolo9::internals::data::yaml::{DataConfig, Split};

fn yolo9_check(yaml: &Path, cwd: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .args(["check", "--no-cache", "--data"])
        .arg(yaml)
        .current_dir(cwd)
        .output()
        .expect("run yolo9");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn yaml_relative_path_from_any_cwd() {
    let case = case_dir("yaml_relative_path");
    for yaml in ["configs/data.yaml", "dataset/data_nopath.yaml"] {
        let cfg = DataConfig::load(&case.join(yaml)).unwrap();
        assert_eq!(cfg.root, case.join("dataset"), "{yaml}");
        assert_eq!(cfg.list_images(Split::Train).unwrap().len(), 4, "{yaml}");
        assert_eq!(cfg.list_images(Split::Val).unwrap().len(), 2, "{yaml}");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/".into());
    for cwd in [PathBuf::from("/"), home, case.clone()] {
        let (ok, text) = yolo9_check(&case.join("configs/data.yaml"), &cwd);
        assert!(ok, "from {}: {text}", cwd.display());
        assert!(text.contains("train: 4 images: 4 labelled"), "{text}");
        assert!(text.contains("val: 2 images: 2 labelled"), "{text}");
    }
    // a relative --data from the case folder works too
    let (ok, text) = yolo9_check(Path::new("dataset/data_nopath.yaml"), &case);
    assert!(ok, "{text}");

    let err = DataConfig::load(&case.join("configs/data_missing.yaml")).unwrap_err();
    let msg = format!("{err:#}");
    let resolved = case.join("does_not_exist");
    assert!(
        msg.contains("`path`") && msg.contains(&resolved.display().to_string()),
        "{msg}"
    );
    let (ok, text) = yolo9_check(&case.join("configs/data_missing.yaml"), Path::new("/"));
    assert!(
        !ok && text.contains(&resolved.display().to_string()),
        "{text}"
    );
}

#[test]
fn check_exit_code_only_fails_when_nothing_is_trainable() {
    // a dataset full of problems still checks OK
    let (ok, text) = yolo9_check(
        &case_dir("coords_invalid").join("data.yaml"),
        Path::new("/"),
    );
    assert!(ok, "{text}");
    assert!(
        text.contains("img_000.txt:2: x=1.2 → row dropped"),
        "{text}"
    );
    // every train label invalid → non-zero
    let d = tmpdir("untrainable");
    std::fs::create_dir_all(d.join("images/train")).unwrap();
    std::fs::create_dir_all(d.join("labels/train")).unwrap();
    let img = case_dir("coords_invalid").join("images/train/img_000.jpg");
    std::fs::copy(&img, d.join("images/train/a.jpg")).unwrap();
    std::fs::write(d.join("labels/train/a.txt"), "5 0.5 0.5 0.1 0.1\n").unwrap();
    std::fs::write(
        d.join("data.yaml"),
        "train: images/train\nval: images/train\nnames: [a]\n",
    )
    .unwrap();
    let (ok, text) = yolo9_check(&d.join("data.yaml"), Path::new("/"));
    assert!(!ok, "{text}");
    assert!(
        text.contains("nothing is trainable") && text.contains("a.txt:1: class 5"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn yaml_variants() {
    let d = tmpdir("variants");
    for sub in ["a/images", "b/images", "lists"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    let img = case_dir("coords_invalid").join("images/train/img_000.jpg");
    std::fs::copy(&img, d.join("a/images/x.JPG")).unwrap();
    std::fs::copy(&img, d.join("b/images/y.jpeg")).unwrap();
    std::fs::write(d.join("a/images/notes.md"), "not an image").unwrap();
    // a .txt list with entries relative to the list itself, a blank line and an absolute entry
    std::fs::write(
        d.join("lists/val.txt"),
        format!(
            "../a/images/x.JPG\n\n{}\n",
            d.join("b/images/y.jpeg").display()
        ),
    )
    .unwrap();
    let yaml = d.join("data.yaml");
    let load = |text: &str| {
        std::fs::write(&yaml, text).unwrap();
        DataConfig::load(&yaml)
    };
    let cfg =
        load("train: [a/images, b/images]\nval: lists/val.txt\nnames: {0: cat, 1: dog}\nnc: 2\n")
            .unwrap();
    assert_eq!(cfg.names, vec!["cat", "dog"]);
    assert_eq!(
        cfg.list_images(Split::Train).unwrap(),
        vec![d.join("a/images/x.JPG"), d.join("b/images/y.jpeg")]
    );
    assert_eq!(
        cfg.list_images(Split::Val).unwrap(),
        vec![d.join("a/images/x.JPG"), d.join("b/images/y.jpeg")]
    );
    assert!(cfg.test.is_empty());
    // nc only: generated names
    let cfg = load("train: a/images\nval: a/images\nnc: 3\n").unwrap();
    assert_eq!(cfg.names, vec!["class0", "class1", "class2"]);
    // errors name the key and the resolved path
    let e = format!(
        "{:#}",
        load("train: a/images\nval: nope\nnames: [a]\n").unwrap_err()
    );
    assert!(
        e.contains("`val`") && e.contains(&d.join("nope").display().to_string()),
        "{e}"
    );
    let e = format!("{:#}", load("train: a/images\nnames: [a]\n").unwrap_err());
    assert!(e.contains("`val` is missing"), "{e}");
    let e = format!(
        "{:#}",
        load("train: a/images\nval: a/images\nnames: [a, b]\nnc: 3\n").unwrap_err()
    );
    assert!(e.contains("nc: 3") && e.contains("2 entries"), "{e}");
    let e = format!(
        "{:#}",
        load("train: a/images\nval: a/images\nnames: {0: a, 2: b}\n").unwrap_err()
    );
    assert!(e.contains("key 1 is missing"), "{e}");
    let e = format!("{:#}", load("train: [a/images\n").unwrap_err());
    assert!(e.contains("not valid YAML"), "{e}");
    let e = format!(
        "{:#}",
        DataConfig::load(&d.join("absent.yaml")).unwrap_err()
    );
    assert!(
        e.contains(&d.join("absent.yaml").display().to_string()),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn label_path_rule_swaps_only_the_last_images_folder() {
    assert_eq!(
        label_path_for(Path::new("/d/images/proj/images/train/a.b.JPG")),
        PathBuf::from("/d/images/proj/labels/train/a.b.txt")
    );
    assert_eq!(
        label_path_for(Path::new("/d/sidecar/x.png")),
        PathBuf::from("/d/sidecar/x.txt")
    );
    // a file named "images" is not a folder to swap
    assert_eq!(
        label_path_for(Path::new("/d/images/images")),
        PathBuf::from("/d/labels/images.txt")
    );
}

#[test]
fn label_rows_by_hand() {
    let p = Path::new("l.txt");
    let r = parse_labels("0 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2\nx 0.5 0.5 0.2 0.2\n1.0 0.1 0.1 0.1 0.1\n0 nan 0.5 0.1 0.1\n1 0.2 0.2 0.6 0.2 0.4 0.6\n", 2, p);
    assert_eq!(r.boxes.len(), 3, "{:?}", r.boxes);
    assert_eq!(
        r.boxes[1],
        LabelBox {
            cls: 1,
            cx: 0.1,
            cy: 0.1,
            w: 0.1,
            h: 0.1
        }
    );
    // polygon (0.2,0.2) (0.6,0.2) (0.4,0.6) → x 0.2..0.6, y 0.2..0.6
    let b = r.boxes[2];
    assert!(
        (b.cx - 0.4).abs() < 1e-7
            && (b.cy - 0.4).abs() < 1e-7
            && (b.w - 0.4).abs() < 1e-7
            && (b.h - 0.4).abs() < 1e-7
    );
    assert_eq!(r.polygons, 1);
    let lines: Vec<Option<usize>> = r.issues.iter().map(|i| i.line).collect();
    assert_eq!(lines, vec![Some(2), Some(3), Some(5)]);
    assert!(r.issues.iter().all(|i| i.kind == IssueKind::RowDropped));
    assert_eq!(r.issues[0].to_string(), "l.txt:2: 4 values → row dropped: expected 5 (cls cx cy w h) or a class and 3 or more x y pairs");
    // BOM, tiny float noise silently clipped, box with no area after clipping dropped
    let r = parse_labels(
        "\u{feff}0 0.5 0.5 1.0000001 0.5\n0 1.0005 0.5 0.0002 0.1\n",
        1,
        p,
    );
    assert_eq!(r.boxes.len(), 1);
    assert!(
        r.boxes[0].w <= 1.0 && r.issues.len() == 1 && r.issues[0].line == Some(2),
        "{:?}",
        r.issues
    );
}

/// A hostile class count is refused at once with the value and the limit (before: `nc:
/// 1000000000` with no names built a billion names, 18.7 GB, and never returned); the limit
/// itself is accepted.
#[test]
fn class_count_is_bounded() {
    let d = tmpdir("nc-bound");
    std::fs::create_dir_all(d.join("images")).unwrap();
    let yaml = d.join("data.yaml");
    let t0 = std::time::Instant::now();
    for nc in ["1000000000", "100001"] {
        std::fs::write(&yaml, format!("train: images\nval: images\nnc: {nc}\n")).unwrap();
        let e = format!("{:#}", DataConfig::load(&yaml).unwrap_err());
        assert!(e.contains(nc) && e.contains("100000"), "{e}");
    }
    assert!(
        t0.elapsed().as_secs_f64() < 5.0,
        "refused without building names"
    );
    std::fs::write(&yaml, "train: images\nval: images\nnc: 100000\n").unwrap();
    let cfg = DataConfig::load(&yaml).unwrap();
    assert_eq!(cfg.nc, yolo9::model::weights::MAX_CLASSES);
    assert_eq!(cfg.names[99_999], "class99999");
}

/// A Roboflow export: `data.yaml` beside `train/images` and `valid/images`, naming them
/// `../train/images` and `../valid/images`. Those do not exist relative to the yaml's folder, so
/// the loader uses them without the `../`, says so in one notice naming the path, and the scan
/// finds every image with its labels.
#[test]
fn roboflow_dot_dot_paths() {
    let dir = tmpdir("roboflow");
    let src = common::shared_dir().join("datasets/bccd");
    let mut names: Vec<_> = std::fs::read_dir(src.join("images/train"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    let mut n_boxes = [0usize; 2];
    for (k, (split, take)) in [("train", &names[..3]), ("valid", &names[3..5])]
        .into_iter()
        .enumerate()
    {
        std::fs::create_dir_all(dir.join(split).join("images")).unwrap();
        std::fs::create_dir_all(dir.join(split).join("labels")).unwrap();
        for n in take {
            std::fs::copy(
                src.join("images/train").join(n),
                dir.join(split).join("images").join(n),
            )
            .unwrap();
            let stem = Path::new(n).with_extension("txt");
            let text = std::fs::read_to_string(src.join("labels/train").join(&stem)).unwrap();
            n_boxes[k] += text.lines().filter(|l| !l.trim().is_empty()).count();
            std::fs::write(dir.join(split).join("labels").join(&stem), text).unwrap();
        }
    }
    std::fs::write(
        dir.join("data.yaml"),
        "train: ../train/images\nval: ../valid/images\nnc: 3\nnames: [RBC, WBC, Platelets]\n",
    )
    .unwrap();
    let cfg = DataConfig::load(&dir.join("data.yaml")).unwrap();
    let root = yolo9::internals::data::fsio::normalize(&dir);
    assert_eq!(cfg.train, vec![root.join("train/images")]);
    assert_eq!(cfg.val, vec![root.join("valid/images")]);
    assert_eq!(cfg.notices.len(), 2, "{:?}", cfg.notices);
    assert!(
        cfg.notices[0].contains("../train/images")
            && cfg.notices[0].contains(&root.join("train/images").display().to_string()),
        "{}",
        cfg.notices[0]
    );
    assert!(cfg.notices[1].contains(&root.join("valid/images").display().to_string()));
    let opts = yolo9::internals::data::scan::ScanOptions {
        use_cache: false,
        print: false,
        ..Default::default()
    };
    for (split, n_img, n_box) in [(Split::Train, 3, n_boxes[0]), (Split::Val, 2, n_boxes[1])] {
        let scan = yolo9::internals::data::scan::scan_split(&cfg, split, &opts).unwrap();
        assert_eq!(scan.records.len(), n_img, "{split}");
        let boxes: usize = scan.records.iter().map(|r| r.boxes.len()).sum();
        assert_eq!(boxes, n_box, "{split}");
        assert!(n_box > 0);
    }
    // A `../` path that exists as written is used as written, with no notice.
    let nested = dir.join("nested");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(
        nested.join("data.yaml"),
        "train: ../train/images\nval: ../valid/images\nnames: [a, b, c]\n",
    )
    .unwrap();
    let cfg = DataConfig::load(&nested.join("data.yaml")).unwrap();
    assert_eq!(cfg.train, vec![root.join("train/images")]);
    assert!(cfg.notices.is_empty(), "{:?}", cfg.notices);
    // Neither exists: the error names the path as written.
    std::fs::write(
        dir.join("bad.yaml"),
        "train: ../nope/images\nval: ../valid/images\nnames: [a, b, c]\n",
    )
    .unwrap();
    let e = format!("{:#}", DataConfig::load(&dir.join("bad.yaml")).unwrap_err());
    assert!(e.contains("../nope/images"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
