//! The dataset scan (`yolo9::internals::data::scan`, what `yolo9 check` and `train` run) against the
//! bad-input cases of ../shared/cases (each test names its case) and the real BCCD dataset. Scans
//! of `../shared` run without the label cache and must leave it untouched, whether it is
//! read-only (CI) or a writable copy (a new user's checkout); the cache, and its fallback on a
//! read-only dataset, are tested on copies in temporary folders.
use crate::common;

use common::case_dir;
use std::path::Path;
use yolo9::internals::data::labels::{parse_labels, IssueKind, LabelBox};
use yolo9::internals::data::scan::{scan_split, CacheStatus, LabelStatus, ScanOptions, SplitScan};
use yolo9::internals::data::yaml::{DataConfig, Split};

/// Scans without the label cache: the case folders in `../shared/cases` may be read-only (CI) or a
/// writable copy (a new user's checkout), and a scan must give the same result in both; the cache
/// itself is tested on temporary copies ([`scan_cached`]).
fn scan(yaml: &Path, split: Split) -> SplitScan {
    scan_with(yaml, split, false)
}

/// Scans with the label cache (only for temporary copies of a case).
fn scan_cached(yaml: &Path, split: Split) -> SplitScan {
    scan_with(yaml, split, true)
}

fn scan_with(yaml: &Path, split: Split, use_cache: bool) -> SplitScan {
    let cfg = DataConfig::load(yaml).unwrap_or_else(|e| panic!("{}: {e:#}", yaml.display()));
    scan_split(
        &cfg,
        split,
        &ScanOptions {
            use_cache,
            print: true,
            ..Default::default()
        },
    )
    .expect("scan")
}

fn name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

fn issues_of(s: &SplitScan, kind: IssueKind) -> Vec<(String, Option<usize>, String)> {
    s.issues
        .iter()
        .filter(|i| i.kind == kind)
        .map(|i| (name(&i.path), i.line, i.value.clone()))
        .collect()
}

fn boxes_of<'a>(s: &'a SplitScan, file: &str) -> &'a [LabelBox] {
    &s.records
        .iter()
        .find(|r| name(&r.image) == file)
        .unwrap_or_else(|| panic!("{file} not scanned"))
        .boxes
}

/// Every file listed in SHA256SUMS still has its hash.
fn assert_unmodified(case: &Path) {
    use sha2::{Digest, Sha256};
    let sums = std::fs::read_to_string(case.join("SHA256SUMS")).expect("SHA256SUMS");
    for line in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (hash, file) = line.split_once("  ").expect("sha256sum format");
        let bytes = std::fs::read(case.join(file.trim_start_matches('*'))).expect("listed file");
        let got: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, hash, "{file} was modified");
    }
}

fn assert_cache_not_written_readonly(s: &SplitScan) {
    match &s.cache {
        CacheStatus::NotWritten { reason, .. } => assert!(reason.contains("read-only"), "{reason}"),
        other => panic!("cache into a read-only case folder: {other:?}"),
    }
}

#[test]
fn missing_and_empty_labels() {
    let case = case_dir("missing_and_empty_labels");
    let t = scan(&case.join("data.yaml"), Split::Train);
    let c = &t.counts;
    assert_eq!(
        (c.images, c.labelled, c.missing, c.empty, c.corrupt),
        (7, 3, 2, 2, 0)
    );
    assert_eq!(c.orphans, 1);
    assert_eq!(issues_of(&t, IssueKind::OrphanLabel)[0].0, "ghost_999.txt");
    for f in ["img_003.jpg", "img_004.jpg"] {
        let r = t.records.iter().find(|r| name(&r.image) == f).unwrap();
        assert_eq!(r.status, LabelStatus::Missing);
    }
    for f in ["img_005.jpg", "img_006.jpg"] {
        let r = t.records.iter().find(|r| name(&r.image) == f).unwrap();
        assert_eq!(r.status, LabelStatus::Empty);
        assert!(r.boxes.is_empty());
    }
    let v = scan(&case.join("data.yaml"), Split::Val);
    assert_eq!(
        (v.counts.images, v.counts.labelled, v.counts.missing),
        (2, 1, 1)
    );
    assert!(t
        .summary(&["square".into(), "circle".into()])
        .contains("3 labelled, 2 empty (background), 2 missing labels"));
    assert_eq!(t.cache, CacheStatus::Disabled);
    assert_unmodified(&case);
}

#[test]
fn class_id_out_of_range() {
    let case = case_dir("class_id_out_of_range");
    let t = scan(&case.join("data.yaml"), Split::Train);
    let dropped = issues_of(&t, IssueKind::RowDropped);
    assert_eq!(
        dropped,
        vec![
            ("img_002.txt".to_string(), Some(3), "class 2".to_string()),
            ("img_004.txt".to_string(), Some(1), "class 7".to_string())
        ]
    );
    let msg = t
        .issues
        .iter()
        .find(|i| i.kind == IssueKind::RowDropped)
        .unwrap()
        .to_string();
    assert!(
        msg.contains("img_002.txt:3: class 2 → row dropped") && msg.contains("0..1"),
        "{msg}"
    );
    // the rest of each file still trains
    assert_eq!(boxes_of(&t, "img_002.jpg").len(), 2);
    assert_eq!(boxes_of(&t, "img_004.jpg").len(), 2);
    assert_eq!(
        (t.counts.labelled, t.counts.boxes, t.counts.rows_dropped),
        (5, 13, 2)
    );
    assert_unmodified(&case);
}

#[test]
fn coords_invalid() {
    let case = case_dir("coords_invalid");
    let t = scan(&case.join("data.yaml"), Split::Train);
    let dropped: Vec<(String, Option<usize>, String)> = issues_of(&t, IssueKind::RowDropped);
    let want = [
        ("img_000.txt", 2, "x=1.2"),
        ("img_001.txt", 1, "w=1.5"),
        ("img_002.txt", 1, "x=-0.05"),
        ("img_003.txt", 1, "w=0"),
        ("img_003.txt", 2, "h=0"),
        ("img_004.txt", 1, "w=-0.2"),
    ];
    assert_eq!(dropped.len(), want.len(), "{dropped:?}");
    for ((f, l, v), (wf, wl, wv)) in dropped.iter().zip(want) {
        assert_eq!((f.as_str(), *l, v.as_str()), (wf, Some(wl), wv));
    }
    let clipped = issues_of(&t, IssueKind::RowClipped);
    assert_eq!(
        clipped
            .iter()
            .map(|(f, l, _)| (f.as_str(), *l))
            .collect::<Vec<_>>(),
        vec![("img_005.txt", Some(1)), ("img_005.txt", Some(2))]
    );
    // every image still trains with its other boxes; nothing of zero size reaches the loss
    assert_eq!(t.counts.labelled, 7);
    for r in &t.records {
        for b in &r.boxes {
            let [x1, y1, x2, y2] = b.xyxy();
            assert!(
                b.w > 0.0
                    && b.h > 0.0
                    && x1 >= -1e-6
                    && y1 >= -1e-6
                    && x2 <= 1.0 + 1e-6
                    && y2 <= 1.0 + 1e-6,
                "{b:?}"
            );
        }
    }
    let b = boxes_of(&t, "img_005.jpg");
    // 1.0000004 ± 0.05 → 0.95..1.0; 0.95 ± 0.15 → 0.80..1.0
    assert!(
        (b[0].cx - 0.975).abs() < 1e-6 && (b[0].w - 0.05).abs() < 1e-6,
        "{:?}",
        b[0]
    );
    assert!(
        (b[1].cx - 0.9).abs() < 1e-6 && (b[1].w - 0.2).abs() < 1e-6,
        "{:?}",
        b[1]
    );
    assert_eq!(boxes_of(&t, "img_006.jpg").len(), 2);
    assert_eq!(
        boxes_of(&t, "img_006.jpg")[0],
        LabelBox {
            cls: 1,
            cx: 0.535937,
            cy: 0.290625,
            w: 0.346875,
            h: 0.275
        }
    );
    assert_unmodified(&case);
}

#[test]
fn mixed_polygon_and_box() {
    let case = case_dir("mixed_polygon_and_box");
    let expected = std::fs::read_to_string(case.join("expected_boxes.txt")).unwrap();
    let t = scan(&case.join("data.yaml"), Split::Train);
    let v = scan(&case.join("data.yaml"), Split::Val);
    let mut current: Option<(String, Vec<Vec<f32>>)> = None;
    let mut files = 0;
    let mut check = |cur: &Option<(String, Vec<Vec<f32>>)>| {
        let Some((key, want)) = cur else { return };
        let (split, stem) = key.split_once('/').unwrap();
        let s = if split == "train" { &t } else { &v };
        let got = boxes_of(s, &stem.replace(".txt", ".jpg"));
        assert_eq!(got.len(), want.len(), "{key}");
        for (g, w) in got.iter().zip(want) {
            let g = [g.cls as f32, g.cx, g.cy, g.w, g.h];
            for k in 0..5 {
                assert!((g[k] - w[k]).abs() < 1e-4, "{key}: {g:?} vs {w:?}");
            }
        }
        files += 1;
    };
    for line in expected.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(k) = line.strip_prefix('[') {
            check(&current);
            current = Some((k.trim_end_matches(']').to_string(), Vec::new()));
        } else {
            let vals: Vec<f32> = line
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            current.as_mut().unwrap().1.push(vals);
        }
    }
    check(&current);
    assert_eq!(files, 8);
    assert_eq!(t.counts.polygons, 7);
    assert_eq!(t.counts.rows_dropped, 0);
}

#[test]
fn label_text_hygiene() {
    let case = case_dir("label_text_hygiene");
    let t = scan(&case.join("data.yaml"), Split::Train);
    for i in 0..5 {
        let want_text =
            std::fs::read_to_string(case.join(format!("expected_labels/img_{i:03}.txt"))).unwrap();
        let want = parse_labels(&want_text, 2, Path::new("expected"));
        assert!(want.issues.is_empty());
        assert_eq!(
            boxes_of(&t, &format!("img_{i:03}.jpg")),
            want.boxes.as_slice(),
            "img_{i:03}"
        );
    }
    // only img_004's repeats are reported, once, with the count
    assert_eq!(t.issues.len(), 1, "{:?}", t.issues);
    let d = &t.issues[0];
    assert_eq!(
        (d.kind, name(&d.path)),
        (IssueKind::DuplicatesRemoved, "img_004.txt".to_string())
    );
    assert!(d.value.starts_with("2 duplicate rows"), "{}", d.value);
    assert_eq!(t.counts.duplicates, 2);
    assert_unmodified(&case);
}

#[test]
fn nested_images_dirname() {
    let case = case_dir("nested_images_dirname");
    let t = scan(&case.join("images/proj/data.yaml"), Split::Train);
    assert_eq!(
        t.counts.per_class,
        vec![10, 0],
        "a circle means the decoy under labels/proj/images was read"
    );
    assert!(t.records.iter().all(|r| r
        .label
        .as_ref()
        .unwrap()
        .starts_with(case.join("images/proj/labels"))));
    let s = scan(&case.join("images/proj/data_sidecar.yaml"), Split::Train);
    assert_eq!(
        (s.counts.images, s.counts.labelled, s.counts.sidecar),
        (3, 3, 3)
    );
    let side = issues_of(&s, IssueKind::SidecarLabels);
    assert_eq!(side.len(), 1, "{side:?}");
    assert_unmodified(&case);
}

#[test]
fn paths_spaces_unicode() {
    let case = case_dir("paths_spaces_unicode");
    let yaml = case.join("data set ünï 数据/data.yaml");
    let t = scan(&yaml, Split::Train);
    let v = scan(&yaml, Split::Val);
    assert_eq!((t.counts.images, t.counts.labelled), (4, 4));
    assert_eq!((v.counts.images, v.counts.labelled), (2, 2));
    let names: Vec<String> = t.records.iter().map(|r| name(&r.image)).collect();
    assert!(
        names.contains(&"写真 2.jpg".to_string()) && names.contains(&"Ærø ø.png".to_string()),
        "{names:?}"
    );
    assert!(v.records.iter().any(|r| name(&r.image) == "sp ace.jpg"));
    assert!(t.issues.is_empty() && v.issues.is_empty());
}

#[test]
fn truncated_jpeg() {
    let case = case_dir("truncated_jpeg");
    let t = scan(&case.join("data.yaml"), Split::Train);
    let v = scan(&case.join("data.yaml"), Split::Val);
    let skipped = issues_of(&t, IssueKind::ImageSkipped);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].0, "img_002.jpg");
    assert!(skipped[0].2.contains("cut off"), "{}", skipped[0].2);
    assert_eq!(
        (t.counts.images, t.counts.corrupt, t.records.len()),
        (5, 1, 4)
    );
    let skipped = issues_of(&v, IssueKind::ImageSkipped);
    assert_eq!(
        skipped.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
        vec!["img_101.jpg"]
    );
    assert_eq!((v.counts.corrupt, v.records.len()), (1, 1));
    assert_unmodified(&case);
}

#[test]
fn many_images_open_files() {
    let case = case_dir("many_images_open_files");
    let fds = || {
        std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = fds();
    let t0 = std::time::Instant::now();
    let t = scan(&case.join("data.yaml"), Split::Train);
    let v = scan(&case.join("data.yaml"), Split::Val);
    println!("scanned 1400 images in {:.2} s", t0.elapsed().as_secs_f64());
    assert_eq!((t.counts.images, t.records.len()), (1200, 1200));
    assert_eq!((v.counts.images, v.records.len()), (200, 200));
    // nothing left open (other tests run in parallel threads, so allow their few files)
    assert!(fds() <= before + 16, "open files {before} → {}", fds());
}

#[test]
fn extensions_case_and_mismatch() {
    let case = case_dir("extensions_case_and_mismatch");
    let t = scan(&case.join("data.yaml"), Split::Train);
    let v = scan(&case.join("data.yaml"), Split::Val);
    assert_eq!(
        (
            t.counts.images,
            t.counts.labelled,
            t.counts.missing,
            t.counts.corrupt
        ),
        (7, 7, 0, 0)
    );
    assert_eq!(
        (v.counts.images, v.counts.labelled, v.counts.missing),
        (2, 2, 0)
    );
    let mut notes: Vec<String> = issues_of(&t, IssueKind::ImageNote)
        .into_iter()
        .map(|n| n.0)
        .collect();
    notes.sort();
    assert_eq!(
        notes,
        vec![
            "jpeg_inside_0006.png",
            "png_inside_0005.jpg",
            "webp_inside_0007.jpg"
        ]
    );
    assert_unmodified(&case);
}

#[test]
fn bccd_real_dataset() {
    let yaml = yolo9::internals::data::fsio::normalize(&common::shared_dir())
        .join("datasets/bccd/data.yaml");
    let cfg = DataConfig::load(&yaml).unwrap();
    assert_eq!(cfg.names, vec!["RBC", "WBC", "Platelets"]);
    let mut all = Vec::new();
    for split in [Split::Train, Split::Val, Split::Test] {
        let s = scan_split(
            &cfg,
            split,
            &ScanOptions {
                use_cache: false,
                print: true,
                ..Default::default()
            },
        )
        .unwrap();
        all.push(s);
    }
    let counts: Vec<(usize, usize)> = all
        .iter()
        .map(|s| (s.counts.images, s.records.len()))
        .collect();
    assert_eq!(counts, vec![(205, 205), (87, 87), (72, 72)]);
    // the test split matches the official val run: 72 images, 945 instances
    assert_eq!(all[2].counts.boxes, 945);
    // the defects left in: two zero-size rows
    let dropped: Vec<(String, Option<usize>)> = all
        .iter()
        .flat_map(|s| issues_of(s, IssueKind::RowDropped))
        .map(|(f, l, _)| (f, l))
        .collect();
    assert_eq!(
        dropped,
        vec![
            ("BloodImage_00343.txt".to_string(), Some(4)),
            ("BloodImage_00338.txt".to_string(), Some(13))
        ]
    );
}

#[test]
fn label_cache_round_trip_and_invalidation() {
    let dir = common::tmpdir("cache");
    common::copy_tree(&case_dir("label_text_hygiene"), &dir);
    let yaml = dir.join("data.yaml");
    let first = scan_cached(&yaml, Split::Train);
    let cache_file = dir.join("labels/train.yolo9-cache.json");
    assert_eq!(first.cache, CacheStatus::Written(cache_file.clone()));
    let second = scan_cached(&yaml, Split::Train);
    assert_eq!(second.cache, CacheStatus::Loaded(cache_file.clone()));
    assert_eq!(
        (&second.records, &second.issues, &second.counts),
        (&first.records, &first.issues, &first.counts)
    );
    // editing a label invalidates the cache
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(dir.join("labels/train/img_000.txt"), "0 0.5 0.5 0.2 0.2\n").unwrap();
    let third = scan_cached(&yaml, Split::Train);
    assert_eq!(third.cache, CacheStatus::Written(cache_file.clone()));
    assert_eq!(
        boxes_of(&third, "img_000.jpg"),
        &[LabelBox {
            cls: 0,
            cx: 0.5,
            cy: 0.5,
            w: 0.2,
            h: 0.2
        }]
    );
    // a cache edited in place (issue 51, "trusted caches": a box's class changed, the key and
    // every source file untouched) is rebuilt, not used
    let text = std::fs::read_to_string(&cache_file).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rec = v["records"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["boxes"].as_array().is_some_and(|a| !a.is_empty()))
        .expect("a record with boxes in the cache");
    let boxes = rec["boxes"].as_array_mut().unwrap();
    let edited = serde_json::to_string(&*boxes).unwrap();
    boxes.push(boxes[0].clone());
    assert_ne!(serde_json::to_string(&*boxes).unwrap(), edited);
    std::fs::write(&cache_file, serde_json::to_string(&v).unwrap()).unwrap();
    let tampered = scan_cached(&yaml, Split::Train);
    assert_eq!(tampered.cache, CacheStatus::Written(cache_file.clone()));
    assert_eq!(tampered.records, third.records);
    // a corrupt cache file is ignored and rewritten
    std::fs::write(&cache_file, "{not json").unwrap();
    let fourth = scan_cached(&yaml, Split::Train);
    assert_eq!(fourth.cache, CacheStatus::Written(cache_file));
    assert_eq!(fourth.records, third.records);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A read-only dataset (its own read-only copy here): the scan works and reports the cache as
/// not written, and `yolo9 check` prints one warning and exits 0.
#[test]
fn label_cache_read_only_folder_only_warns() {
    let dir = common::tmpdir("ro");
    common::copy_tree(&case_dir("missing_and_empty_labels"), &dir);
    let labels = dir.join("labels");
    common::set_writable(&labels, false);
    let t = scan_cached(&dir.join("data.yaml"), Split::Train);
    assert_cache_not_written_readonly(&t);
    assert_eq!(t.counts.labelled, 3);
    let yaml = dir.join("data.yaml");
    let (code, text, err) = common::yolo9(&["check", "--data", yaml.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}\n{err}");
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("warning: label cache"))
        .collect();
    // One warning per split (train and val), each naming the reason.
    assert_eq!(warnings.len(), 2, "{text}");
    assert!(warnings.iter().all(|w| w.contains("read-only")), "{text}");
    assert!(text.contains("train: 7 images: 3 labelled"), "{text}");
    assert!(!labels.join("train.yolo9-cache.json").exists());
    assert!(!labels.join("val.yolo9-cache.json").exists());
    common::set_writable(&labels, true);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `yolo9 val` on a dataset whose label folder is read-only validates, and says once that the
/// label cache was not written and why.
#[test]
fn val_warns_once_when_the_label_cache_cannot_be_written() {
    let dir = common::tmpdir("ro-val");
    let yaml = common::tiny_dataset(&dir, 1);
    let labels = dir.join("labels");
    common::set_writable(&labels, false);
    let (code, text, err) = common::yolo9(&[
        "val",
        "--data",
        yaml.to_str().unwrap(),
        "--img",
        "64",
        "--batch",
        "1",
        "--device",
        "cpu",
        "--noplots",
    ]);
    common::set_writable(&labels, true);
    assert_eq!(code, 0, "{text}\n{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("warning: label cache") && l.contains("not written"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains("read-only"), "{err}");
    assert!(text.contains("mAP50-95"), "{text}");
    assert!(!labels.join("val.yolo9-cache.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn truncation_checks_by_hand() {
    use yolo9::internals::data::scan::probe_image;
    let dir = common::tmpdir("trunc");
    std::fs::create_dir_all(&dir).unwrap();
    let jpg = std::fs::read(case_dir("coords_invalid").join("images/train/img_000.jpg")).unwrap();
    let probe_bytes = |name: &str, b: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        probe_image(&p)
    };
    let whole = probe_bytes("whole.jpg", &jpg).unwrap();
    // data after the EOI marker (some cameras append it) is tolerated
    let mut tail = jpg.clone();
    tail.extend_from_slice(b"\0\0trailing bytes");
    assert_eq!(probe_bytes("tail.jpg", &tail), Ok(whole.clone()));
    // complete data without the final EOI marker decodes: judged by decoding, it is usable
    assert_eq!(probe_bytes("no_eoi.jpg", &jpg[..jpg.len() - 2]), Ok(whole));
    for keep in [jpg.len() / 2, 300] {
        let e = probe_bytes("cut.jpg", &jpg[..keep]).unwrap_err();
        assert!(e.contains("cut off"), "{keep}: {e}");
    }
    assert!(probe_bytes("gif.jpg", b"GIF89a").is_err());

    let png =
        std::fs::read(case_dir("extensions_case_and_mismatch").join("images/train/IMG_0003.PNG"))
            .unwrap();
    let p = dir.join("cut.png");
    std::fs::write(&p, &png[..png.len() * 6 / 10]).unwrap();
    let e = probe_image(&p).unwrap_err();
    assert!(e.contains("PNG cut off"), "{e}");
    // a PNG without its IEND chunk (its data complete) is refused by the decoder, as detect does
    let e = probe_bytes("no_iend.png", &png[..png.len() - 12]).unwrap_err();
    assert!(e.contains("PNG cut off"), "{e}");
    std::fs::write(&p, &png).unwrap();
    let ok = probe_image(&p).unwrap();
    assert_eq!((ok.format, ok.note), (image::ImageFormat::Png, None));
    // a text file named .jpg is refused by content
    std::fs::write(dir.join("x.jpg"), "hello").unwrap();
    let e = probe_image(&dir.join("x.jpg")).unwrap_err();
    assert!(e.contains("unknown image format"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn polygon_rows_keep_their_points_and_odd_polygons_are_reported() {
    let text = "\
0 0.1 0.1 0.5 0.1 0.5 0.5 0.1 0.5
1 0.5 0.5 0.2 0.2
2 0.1 0.1 0.5 0.5 0.5 0.1 0.1 0.5
0 0.2 0.2 0.4 0.4 0.6 0.6
1 0.2 0.2 0.6 0.2 1.0004 0.6
";
    let p = parse_labels(text, 3, Path::new("a.txt"));
    assert_eq!(p.boxes.len(), 5);
    assert_eq!(p.segments.len(), 5);
    assert_eq!(
        p.segments[0],
        vec![[0.1, 0.1], [0.5, 0.1], [0.5, 0.5], [0.1, 0.5]]
    );
    assert!(p.segments[1].is_empty(), "a box row has no outline");
    // A point over the edge (within the tolerance) is clipped like the box.
    assert_eq!(p.segments[4][2], [1.0, 0.6]);
    let odd: Vec<(Option<usize>, &str)> = p
        .issues
        .iter()
        .filter(|i| i.kind == IssueKind::PolygonOdd)
        .map(|i| (i.line, i.action.as_str()))
        .collect();
    assert_eq!(odd.len(), 2, "{odd:?}");
    assert_eq!(odd[0].0, Some(3));
    assert!(
        odd[0].1.contains("crosses itself (edges 1 and 3"),
        "{}",
        odd[0].1
    );
    assert_eq!(odd[1].0, Some(4));
    assert!(odd[1].1.contains("encloses no area"), "{}", odd[1].1);
}

#[test]
fn records_keep_the_outlines_of_polygon_rows_aligned_with_their_boxes() {
    let case = case_dir("mixed_polygon_and_box");
    let t = scan(&case.join("data.yaml"), Split::Train);
    let rec = |file: &str| {
        t.records
            .iter()
            .find(|r| name(&r.image) == file)
            .unwrap_or_else(|| panic!("{file} not scanned"))
    };
    // img_000: two box rows → no outlines kept at all.
    assert!(rec("img_000.jpg").segments.is_empty());
    // img_001: two rectangles given as polygons.
    let r = rec("img_001.jpg");
    assert_eq!(r.segments.len(), r.boxes.len());
    assert_eq!(r.segments[0][2], [0.409375, 0.45]);
    // img_002: a box row and a polygon row: one outline per box, empty for the box.
    let r = rec("img_002.jpg");
    assert_eq!(r.segments.len(), 2);
    assert_eq!(
        r.segments.iter().map(Vec::len).collect::<Vec<_>>(),
        [0, 4],
        "{:?}",
        r.segments
    );
}
