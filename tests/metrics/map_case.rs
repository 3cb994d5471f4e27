//! Parity of `yolo9::internals::metrics::ap` with the official `val_dual.process_batch` + `ap_per_class` on
//! ../shared/reference/map_case.json (README §7), plus hand-computed cases.
use crate::common;

use serde_json::Value;
use yolo9::boxes::box_iou;
use yolo9::internals::metrics::ap::{
    compute_ap, fmt_g3, iou_thresholds, process_batch, smooth, ValStats, N_IOU,
};

fn load_case() -> Value {
    let p = common::reference("map_case.json");
    let text =
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
    serde_json::from_str(&text).expect("map_case.json is JSON")
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

fn rows<const N: usize>(v: &Value) -> Vec<[f32; N]> {
    v.as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            let r = f64s(r);
            assert_eq!(r.len(), N);
            std::array::from_fn(|i| r[i] as f32)
        })
        .collect()
}

/// Runs the case; returns (stats, per-image correct mismatches).
fn run_case(case: &Value) -> (ValStats, usize) {
    let mut stats = ValStats::default();
    let mut mismatches = 0;
    for im in case["images"].as_array().expect("images") {
        let gt: Vec<[f32; 5]> = rows(&im["gt"]);
        let pred: Vec<[f32; 6]> = rows(&im["pred"]);
        let want: Vec<Vec<bool>> = im["correct"]
            .as_array()
            .expect("correct")
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|b| b.as_i64().unwrap() != 0)
                    .collect()
            })
            .collect();
        let got = process_batch(&pred, &gt);
        assert_eq!(got.len(), want.len(), "image {}", im["id"]);
        for (g, w) in got.iter().zip(&want) {
            if g.to_vec() != *w {
                mismatches += 1;
            }
        }
        stats.add_image(&pred, &gt);
    }
    (stats, mismatches)
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn thresholds_match_official_f32() {
    let case = load_case();
    let want = f64s(&case["iou_thresholds"]);
    let got = iou_thresholds();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(*g as f64, *w, "threshold");
    }
}

#[test]
fn process_batch_matches_official_correct_matrices() {
    let case = load_case();
    let (stats, mismatches) = run_case(&case);
    assert_eq!(
        mismatches, 0,
        "rows of `correct` differing from val_dual.process_batch"
    );
    assert_eq!(stats.conf.len(), 86, "86 predictions");
    assert_eq!(stats.target_cls.len(), 64, "64 ground truths");
    assert_eq!(stats.seen, 20);
}

#[test]
fn ap_per_class_matches_official() {
    let case = load_case();
    let off = &case["official_ap_per_class"];
    let (stats, _) = run_case(&case);
    let m = stats.metrics(3);
    let pc = &m.per_class;
    assert_eq!(pc.classes, vec![0, 1, 2]);
    assert_eq!(m.nt, vec![33, 20, 11]);
    let mut worst = 0f64;
    for (name, got) in [
        ("tp", pc.tp.clone()),
        ("fp", pc.fp.clone()),
        ("p", pc.p.clone()),
        ("r", pc.r.clone()),
        ("f1", pc.f1.clone()),
        ("ap50", m.ap50.clone()),
        ("ap50_95", m.ap50_95.clone()),
    ] {
        let d = max_diff(&got, &f64s(&off[name]));
        println!("{name}: max |diff| = {d:.3e}");
        assert!(d <= 1e-6, "{name}: {got:?} vs {:?}", off[name]);
        worst = worst.max(d);
    }
    let ap_off: Vec<Vec<f64>> = off["ap"].as_array().unwrap().iter().map(f64s).collect();
    for (c, row) in pc.ap.iter().enumerate() {
        let d = max_diff(row, &ap_off[c]);
        assert!(d <= 1e-6, "ap[{c}] {row:?} vs {:?}", ap_off[c]);
        worst = worst.max(d);
    }
    for (name, got) in [
        ("mp", m.mp),
        ("mr", m.mr),
        ("map50", m.map50),
        ("map50_95", m.map50_95),
    ] {
        let want = off[name].as_f64().unwrap();
        let d = (got - want).abs();
        println!("{name}: yolo9 {got:.17} official {want:.17} |diff| {d:.3e}");
        assert!(d <= 1e-6, "{name}");
        worst = worst.max(d);
    }
    println!("worst |diff| vs official ap_per_class over all outputs: {worst:.3e}");

    // how far the official YOLO numbers are from pycocotools on the same case (expected to differ)
    let coco = &case["pycocotools"];
    let stats_c = f64s(&coco["stats"]);
    println!(
        "pycocotools AP50 {:.4} vs yolo9 mAP50 {:.4} (diff {:+.4}); AP50-95 {:.4} vs {:.4} (diff {:+.4})",
        stats_c[1],
        m.map50,
        m.map50 - stats_c[1],
        stats_c[0],
        m.map50_95,
        m.map50_95 - stats_c[0]
    );
    let c50 = f64s(&coco["per_class_ap50"]);
    let c5095 = f64s(&coco["per_class_ap50_95"]);
    for c in 0..3 {
        println!(
            "class{c}: AP50 yolo9 {:.4} coco {:.4}; AP50-95 yolo9 {:.4} coco {:.4}",
            m.ap50[c], c50[c], m.ap50_95[c], c5095[c]
        );
    }
    let f = m.fitness();
    assert!(
        (f - (0.1 * off["map50"].as_f64().unwrap() + 0.9 * off["map50_95"].as_f64().unwrap()))
            .abs()
            < 1e-12
    );
    let table = m.table(&["class0".into(), "class1".into(), "class2".into()]);
    println!("{table}");
    let all = table.lines().nth(1).unwrap();
    assert_eq!(
        all.split_whitespace().collect::<Vec<_>>(),
        vec!["all", "20", "64", "0.499", "0.685", "0.57", "0.259"]
    );
    assert_eq!(table.lines().count(), 5, "header, all, 3 classes");
}

#[test]
fn iou_by_hand() {
    // 10x10 at origin and 10x10 shifted by 5 in x: inter 50, union 150
    let v = box_iou(&[0.0, 0.0, 10.0, 10.0], &[5.0, 0.0, 15.0, 10.0]);
    assert!((v - 1.0 / 3.0).abs() < 1e-6, "{v}");
    assert_eq!(box_iou(&[0.0, 0.0, 1.0, 1.0], &[2.0, 2.0, 3.0, 3.0]), 0.0);
}

#[test]
fn matching_ignores_score_and_keeps_lowest_index() {
    // one label; detection 0 has IoU 0.6 and low score, detection 1 has IoU 0.9 and high score.
    // Official: each detection keeps its best label; the label keeps the lowest detection index → det 0.
    let label = [[0.0, 0.0, 0.0, 100.0, 100.0]];
    let dets = [
        [0.0, 0.0, 100.0, 60.0, 0.1, 0.0],
        [0.0, 0.0, 100.0, 90.0, 0.9, 0.0],
    ];
    let c = process_batch(&dets, &label);
    // det 0 IoU 0.6: true at 0.50, 0.55, 0.60; det 1 never (its label was taken by det 0 at those
    // thresholds) except where det 0 no longer qualifies: 0.65..0.90
    assert_eq!(
        c[0],
        [true, true, true, false, false, false, false, false, false, false]
    );
    assert_eq!(
        c[1],
        [false, false, false, true, true, true, true, true, true, false]
    );
    // wrong class never matches
    let c = process_batch(&[[0.0, 0.0, 100.0, 100.0, 0.9, 1.0]], &label);
    assert_eq!(c[0], [false; N_IOU]);
}

#[test]
fn compute_ap_by_hand() {
    // perfect detector: recall reaches 1 at precision 1 → envelope 1 on [0, 1), 0 at recall 1
    // (the official sentinel): trapezoid over 101 points = 1 - 0.01/2
    let ap = compute_ap(&[0.5, 1.0], &[1.0, 1.0]);
    assert!((ap - 0.995).abs() < 1e-12, "{ap}");
    // precision 0.5 from recall 0.5 on: the envelope falls linearly 1 → 0.5 over recall 0..0.5
    // (area 0.375), stays 0.5 to 0.99 (0.245), then drops to the sentinel 0 (0.0025)
    let ap = compute_ap(&[0.5, 1.0], &[0.5, 0.5]);
    assert!((ap - (0.375 + 0.245 + 0.0025)).abs() < 1e-12, "{ap}");
}

#[test]
fn smooth_preserves_constants_and_length() {
    let y = vec![0.25; 1000];
    let s = smooth(&y, 0.1);
    assert_eq!(s.len(), 1000);
    assert!(s.iter().all(|v| (v - 0.25).abs() < 1e-15));
}

#[test]
fn g3_format_like_c() {
    assert_eq!(fmt_g3(0.805), "0.805");
    assert_eq!(fmt_g3(0.5), "0.5");
    assert_eq!(fmt_g3(0.0), "0");
    assert_eq!(fmt_g3(0.12345), "0.123");
    assert_eq!(fmt_g3(0.00012345), "0.000123");
    assert_eq!(fmt_g3(0.000012345), "1.23e-05");
    assert_eq!(fmt_g3(1.0), "1");
}

#[test]
fn no_true_positive_gives_zeros() {
    let mut s = ValStats::default();
    s.add_image(
        &[[0.0, 0.0, 10.0, 10.0, 0.9, 0.0]],
        &[[0.0, 50.0, 50.0, 60.0, 60.0]],
    );
    s.add_image(&[], &[[1.0, 0.0, 0.0, 5.0, 5.0]]);
    let m = s.metrics(2);
    assert_eq!((m.mp, m.mr, m.map50, m.map50_95), (0.0, 0.0, 0.0, 0.0));
    assert_eq!(m.nt, vec![1, 1]);
    assert_eq!(m.seen, 2);
}
