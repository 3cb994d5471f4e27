//! `yolo9::internals::metrics::coco` against pycocotools `COCOeval(iouType='bbox')` on
//! ../shared/reference/map_case.json (README §7: `pycocotools.gt_json`, `dt_json`, `stats`,
//! per-class AP), plus a case worked out by hand, and the JSON round trip.
use crate::common;

use serde_json::Value;
use yolo9::internals::metrics::coco::{evaluate, CocoDt, CocoGt};
use yolo9::internals::metrics::coco_json::{read_results, write_results, CocoDataset, CocoResult};

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

fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, pycocotools/hand {want} (|diff| {} > {tol})",
        (got - want).abs()
    );
}

#[test]
fn map_case_matches_pycocotools() {
    let case = load_case();
    let pc = &case["pycocotools"];
    let gt: CocoDataset = serde_json::from_value(pc["gt_json"].clone()).expect("gt_json");
    let dt: Vec<CocoResult> = serde_json::from_value(pc["dt_json"].clone()).expect("dt_json");
    assert_eq!(gt.annotations.len(), 64);
    assert_eq!(dt.len(), 86);
    let ev = gt.evaluate(&dt).unwrap();
    let want = f64s(&pc["stats"]);
    assert_eq!(want.len(), 12);
    let names = pc["stats_names"].as_array().unwrap();
    for i in 0..12 {
        assert_close(names[i].as_str().unwrap(), ev.stats[i], want[i], 1e-9);
    }
    let ap = f64s(&pc["per_class_ap50_95"]);
    let ap50 = f64s(&pc["per_class_ap50"]);
    assert_eq!(ev.category_ids, vec![1, 2, 3]);
    for k in 0..3 {
        assert_close(&format!("class {k} AP"), ev.class_ap(k, None), ap[k], 1e-9);
        assert_close(
            &format!("class {k} AP50"),
            ev.class_ap(k, Some(0.5)),
            ap50[k],
            1e-9,
        );
    }
    // The printout, line for line (3 decimals).
    let lines: Vec<String> = pc["summarize_stdout"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(ev.summary_lines(), lines);
}

#[test]
fn results_round_trip_through_a_file() {
    let case = load_case();
    let pc = &case["pycocotools"];
    let gt: CocoDataset = serde_json::from_value(pc["gt_json"].clone()).unwrap();
    let dt: Vec<CocoResult> = serde_json::from_value(pc["dt_json"].clone()).unwrap();
    let dir = common::tmpdir("coco-roundtrip");
    let p = dir.join("predictions.json");
    write_results(&p, &dt).unwrap();
    let back = read_results(&p).unwrap();
    assert_eq!(back, dt);
    assert_eq!(
        gt.evaluate(&back).unwrap().stats,
        gt.evaluate(&dt).unwrap().stats
    );
    // The annotations file too.
    let gp = dir.join("gt.json");
    std::fs::write(&gp, serde_json::to_string(&gt).unwrap()).unwrap();
    assert_eq!(CocoDataset::load(&gp).unwrap(), gt);
    // Bad input is an error naming the file, not a panic.
    std::fs::write(&p, "[{\"image_id\": 1, \"category_id\": 1, \"bbox\": [1, 2").unwrap();
    let e = format!("{:#}", read_results(&p).unwrap_err());
    assert!(e.contains("predictions.json"), "{e}");
    let mut bad = dt.clone();
    bad[0].image_id = 999;
    let e = format!("{:#}", gt.evaluate(&bad).unwrap_err());
    assert!(e.contains("999"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two images, categories 1 and 2.
///
/// Image 1: GT A = [0, 0, 10, 10] (area 100, small), crowd GT C = [50, 50, 100, 100]
/// (area 10000); detections d3 = [200, 200, 10, 10] score 0.95 (matches nothing, area 100),
/// d1 = [0, 0, 10, 10] score 0.9 (IoU 1 with A), d2 = [60, 60, 20, 20] score 0.8 (inside C:
/// crowd IoU = 400 / 400 (detection area) = 1, so it is matched to C and ignored).
/// Image 2: GT B = [0, 0, 40, 40] (area 1600, medium); d4 = [0, 0, 40, 31.2] score 0.6
/// (IoU 1248 / 1600 = 0.78: a TP at the 6 thresholds 0.50..0.75, an FP at 0.80..0.95;
/// area 1248, medium); and a category-2 detection (score 0.95) where category 2 has no GT.
///
/// Category 2 has no GT: -1 everywhere, left out of every mean.
///
/// Area all (npig = 2: A, B; C ignored), by score d3, d1, d2, d4:
/// - t ≤ 0.75: d3 FP (rc 0, pr 0), d1 TP (rc .5, pr .5), d2 ignored (same), d4 TP (rc 1,
///   pr 2/3); the right-to-left envelope makes every precision 2/3, so AP_t = 2/3.
/// - t ≥ 0.80: d4 FP: rc [0, .5, .5, .5], pr [0, .5, .5, 1/3] → envelope [.5, .5, .5, 1/3];
///   recall thresholds 0.00..0.50 (51 of them) read .5, the 50 above 0.5 are past the end → 0:
///   AP_t = 25.5 / 101.
/// - AP = (6 · 2/3 + 4 · 25.5/101) / 10 = 253/505; AP50 = AP75 = 2/3.
/// - recall: 1 at 6 thresholds, .5 at 4 → AR@100 = AR@10 = 0.8.
/// - maxDets 1 keeps the best detection per image and category: d3 (FP) and d4 → recall .5 at
///   t ≤ .75, 0 above → AR@1 = 0.3.
///
/// Small [0, 32²] (npig = 1: A; B ignored as outside, C as crowd): d3 is an FP (area 100 is
/// inside), d1 TP, d2 ignored (crowd), d4 ignored (matches the ignored B, or unmatched with area
/// 1248 outside): pr [0, .5, .5, .5] → envelope .5, recall 1 → AP small = 0.5, AR small = 1.
///
/// Medium [32², 96²] (npig = 1: B): d1 matches A, which is ignored here → ignored; d2 → crowd,
/// ignored; d3 unmatched with area 100 outside → ignored; d4 TP at t ≤ .75 (precision 1 at every
/// recall threshold), FP above (AP 0, recall 0) → AP medium = AR medium = 0.6.
///
/// Large [96², 1e10]: no non-ignored GT (C is crowd) → -1 for AP and AR.
#[test]
fn hand_computed_case() {
    let gt = |image_id, bbox: [f64; 4], iscrowd| CocoGt {
        image_id,
        category_id: 1,
        bbox,
        area: bbox[2] * bbox[3],
        iscrowd,
    };
    let dt = |image_id, category_id, bbox, score| CocoDt {
        image_id,
        category_id,
        bbox,
        score,
    };
    let gts = [
        gt(1, [0.0, 0.0, 10.0, 10.0], false),
        gt(1, [50.0, 50.0, 100.0, 100.0], true),
        gt(2, [0.0, 0.0, 40.0, 40.0], false),
    ];
    let dts = [
        dt(1, 1, [0.0, 0.0, 10.0, 10.0], 0.9),
        dt(1, 1, [60.0, 60.0, 20.0, 20.0], 0.8),
        dt(1, 1, [200.0, 200.0, 10.0, 10.0], 0.95),
        dt(2, 1, [0.0, 0.0, 40.0, 31.2], 0.6),
        dt(2, 2, [0.0, 0.0, 5.0, 5.0], 0.95),
    ];
    let ev = evaluate(&[2, 1], &[2, 1], &gts, &dts).unwrap();
    assert_eq!(ev.image_ids, vec![1, 2]);
    assert_eq!(ev.category_ids, vec![1, 2]);
    let want = [
        253.0 / 505.0,
        2.0 / 3.0,
        2.0 / 3.0,
        0.5,
        0.6,
        -1.0,
        0.3,
        0.8,
        0.8,
        1.0,
        0.6,
        -1.0,
    ];
    for (i, (&g, &w)) in ev.stats.iter().zip(&want).enumerate() {
        assert_close(&format!("stats[{i}]"), g, w, 1e-9);
    }
    assert_close("class 1 AP", ev.class_ap(0, None), 253.0 / 505.0, 1e-9);
    assert_eq!(ev.class_ap(1, None), -1.0);
    assert_eq!(
        ev.summary_lines()[5],
        " Average Precision  (AP) @[ IoU=0.50:0.95 | area= large | maxDets=100 ] = -1.000"
    );
    // Without the crowd flag, d2 (IoU 400/10000 with C) is an FP and C a missed regular GT
    // (area 10000: large), so large is no longer -1 and AP drops.
    let mut no_crowd = gts;
    no_crowd[1].iscrowd = false;
    let ev2 = evaluate(&[1, 2], &[1, 2], &no_crowd, &dts).unwrap();
    assert_eq!(ev2.stats[5], 0.0);
    assert!(ev2.stats[0] < ev.stats[0]);
}
