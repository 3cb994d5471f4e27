//! NMS and post-processing parity with the official code (torchvision nms, utils/general.py
//! non_max_suppression, scale_boxes) on the oracle files.
#![allow(clippy::needless_range_loop)]
use crate::common;

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use yolo9::internals::detect::device_nms;
use yolo9::internals::detect::nms::{batched_nms, nms, nms_image, NmsOptions, Row};
use yolo9::internals::detect::postprocess::{
    filtered_candidates, host_candidates, non_max_suppression, scale_boxes,
};

fn load(name: &str) -> HashMap<String, Tensor> {
    let p = common::reference(name);
    candle_core::safetensors::load(&p, &Device::Cpu)
        .unwrap_or_else(|e| panic!("cannot load {}: {e}", p.display()))
}

fn boxes(t: &Tensor) -> Vec<[f32; 4]> {
    t.to_vec2::<f32>()
        .unwrap()
        .into_iter()
        .map(|r| [r[0], r[1], r[2], r[3]])
        .collect()
}

fn idx(t: &Tensor) -> Vec<usize> {
    t.to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|v| v as usize)
        .collect()
}

fn rows(t: &Tensor) -> Vec<Row> {
    t.to_vec2::<f32>()
        .unwrap()
        .into_iter()
        .map(|r| [r[0], r[1], r[2], r[3], r[4], r[5]])
        .collect()
}

#[test]
fn nms_case1_ties_exact_threshold_zero_area() {
    let t = load("nms_cases.safetensors");
    let b = boxes(&t["case1_boxes"]);
    let s = t["case1_scores"].to_vec1::<f32>().unwrap();
    let thr = t["case1_iou_threshold"].to_scalar::<f64>().unwrap();
    assert_eq!(thr, 0.5);
    assert_eq!(nms(&b, &s, thr), idx(&t["case1_keep"]));
    assert_eq!(nms(&b, &s, thr), vec![5, 6, 0, 3, 8, 2, 9]);
    assert_eq!(nms(&b, &s, 0.3), idx(&t["case1_keep_thr_0_3"]));
}

#[test]
fn nms_case2_many_ties() {
    let t = load("nms_cases.safetensors");
    let b = boxes(&t["case2_boxes"]);
    let s = t["case2_scores"].to_vec1::<f32>().unwrap();
    let k45 = nms(&b, &s, 0.45);
    assert_eq!(k45.len(), 21);
    assert_eq!(k45, idx(&t["case2_keep_iou_0_45"]));
    let k7 = nms(&b, &s, 0.7);
    assert_eq!(k7.len(), 106);
    assert_eq!(k7, idx(&t["case2_keep_iou_0_7"]));
}

#[test]
fn nms_case3_batched_offset_agnostic() {
    let t = load("nms_cases.safetensors");
    let b = boxes(&t["case3_boxes"]);
    let s = t["case3_scores"].to_vec1::<f32>().unwrap();
    let c = idx(&t["case3_idxs"]);
    let kb = batched_nms(&b, &s, &c, 0.6);
    assert_eq!(kb.len(), 146);
    assert_eq!(kb, idx(&t["case3_keep_batched_iou_0_6"]));
    assert_eq!(kb, idx(&t["case3_keep_offset_trick_iou_0_6"]));
    let ka = nms(&b, &s, 0.6);
    assert_eq!(ka.len(), 90);
    assert_eq!(ka, idx(&t["case3_keep_agnostic_iou_0_6"]));
}

fn assert_rows_equal(got: &[Row], want: &[Row], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: row count");
    let mut max = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g[5], w[5], "{what}: class of row {i}");
        for k in 0..5 {
            max = max.max((g[k] - w[k]).abs());
        }
    }
    println!("{what}: {} rows, max abs diff {max:e}", got.len());
    assert!(max == 0.0, "{what}: rows differ by {max}");
}

fn y_main() -> (Tensor, HashMap<String, Tensor>) {
    let t = load("forward_horses.safetensors");
    (t["y_main"].clone(), t)
}

#[test]
fn official_nms_on_y_main_val() {
    let (y, t) = y_main();
    let opts = NmsOptions {
        conf_thres: 0.001,
        iou_thres: 0.7,
        max_det: 300,
        ..Default::default()
    };
    let got = non_max_suppression(&y, &opts).unwrap();
    assert_eq!(got.len(), 1);
    assert_rows_equal(&got[0], &rows(&t["nms_val_det"]), "nms_val_det");
}

#[test]
fn official_nms_on_y_main_val_multilabel_30000_cut() {
    let (y, t) = y_main();
    let opts = NmsOptions {
        conf_thres: 0.001,
        iou_thres: 0.7,
        max_det: 300,
        multi_label: true,
        ..Default::default()
    };
    let got = non_max_suppression(&y, &opts).unwrap();
    assert_rows_equal(&got[0], &rows(&t["nms_val_ml_det"]), "nms_val_ml_det");
}

#[test]
fn official_nms_on_y_main_detect_defaults() {
    let (y, t) = y_main();
    let got = non_max_suppression(&y, &NmsOptions::default()).unwrap();
    let want = rows(&t["nms_detect_det"]);
    assert_eq!(want.len(), 44);
    assert_rows_equal(&got[0], &want, "nms_detect_det");
    let mut classes: Vec<u32> = got[0].iter().map(|r| r[5] as u32).collect();
    classes.sort();
    classes.dedup();
    assert_eq!(classes, vec![0, 16, 19, 45]);
}

#[test]
fn class_filter_and_agnostic() {
    let (y, _) = y_main();
    let all = non_max_suppression(&y, &NmsOptions::default())
        .unwrap()
        .remove(0);
    let only = non_max_suppression(
        &y,
        &NmsOptions {
            classes: Some(vec![16, 45]),
            ..Default::default()
        },
    )
    .unwrap()
    .remove(0);
    let expect: Vec<Row> = all
        .iter()
        .copied()
        .filter(|r| r[5] == 16.0 || r[5] == 45.0)
        .collect();
    assert_eq!(only, expect);
    assert_eq!(only.len(), 12); // 7 dogs + 5 bowls
    let agn = non_max_suppression(
        &y,
        &NmsOptions {
            agnostic: true,
            ..Default::default()
        },
    )
    .unwrap()
    .remove(0);
    assert!(!agn.is_empty() && agn.len() <= all.len());
    let capped = non_max_suppression(
        &y,
        &NmsOptions {
            max_det: 5,
            ..Default::default()
        },
    )
    .unwrap()
    .remove(0);
    assert_eq!(capped, all[..5].to_vec());
}

#[test]
fn scale_boxes_matches_official_orig() {
    let (_, t) = y_main();
    for name in ["nms_detect_det", "nms_val_det", "nms_val_ml_det"] {
        let det = rows(&t[name]);
        let want = rows(&t[&format!("{name}_orig")]);
        let mut b: Vec<[f32; 4]> = det.iter().map(|r| [r[0], r[1], r[2], r[3]]).collect();
        scale_boxes((448, 640), &mut b, (512, 773));
        let mut max = 0f32;
        for (g, w) in b.iter().zip(&want) {
            for k in 0..4 {
                max = max.max((g[k] - w[k]).abs());
            }
        }
        println!("{name}_orig: max abs diff {max:e} px");
        assert!(max < 1e-3, "{name}_orig differs by {max} px");
        if name == "nms_detect_det" {
            let round = rows(&t["nms_detect_det_orig_round"]);
            for (g, w) in b.iter().zip(&round) {
                for k in 0..4 {
                    assert_eq!(g[k].round_ties_even(), w[k]);
                }
            }
        }
    }
}

#[test]
fn hand_computed_nms_edges() {
    // IoU exactly 0.5 is kept at threshold 0.5 and suppressed at 0.49.
    let b = [[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 20.0]];
    assert_eq!(nms(&b, &[0.9, 0.8], 0.5), vec![0, 1]);
    assert_eq!(nms(&b, &[0.9, 0.8], 0.49), vec![0]);
    // Equal scores: lower index first and wins.
    assert_eq!(nms(&b, &[0.5, 0.5], 0.3), vec![0]);
    assert_eq!(nms(&[b[1], b[0]], &[0.5, 0.5], 0.3), vec![0]);
    // Zero-area duplicates survive.
    let z = [[5.0, 5.0, 5.0, 9.0], [5.0, 5.0, 5.0, 9.0]];
    assert_eq!(nms(&z, &[0.9, 0.8], 0.1), vec![0, 1]);
    // iou 1 keeps duplicates, iou 0 keeps one per touching group.
    let d = [
        [0.0, 0.0, 4.0, 4.0],
        [0.0, 0.0, 4.0, 4.0],
        [3.0, 3.0, 8.0, 8.0],
    ];
    assert_eq!(nms(&d, &[0.9, 0.8, 0.7], 1.0), vec![0, 1, 2]);
    assert_eq!(nms(&d, &[0.9, 0.8, 0.7], 0.0), vec![0]);
    assert!(nms(&[], &[], 0.5).is_empty());
}

/// The device-side candidate filter (what a CUDA detector copies to the host) gives exactly the
/// official rows on the oracle output, for the detect and val settings, and keeps far fewer
/// columns than the 8400 anchors at the detect threshold.
#[test]
fn candidate_filter_gives_the_official_rows() {
    let (y, t) = y_main();
    let a = y.dim(2).unwrap();
    let full = host_candidates(&y, 0.25).unwrap();
    assert_eq!((full.len(), full[0].len), (1, a));
    let cases = [
        (NmsOptions::default(), "nms_detect_det"),
        (
            NmsOptions {
                conf_thres: 0.001,
                iou_thres: 0.7,
                max_det: 300,
                ..Default::default()
            },
            "nms_val_det",
        ),
        (
            NmsOptions {
                conf_thres: 0.001,
                iou_thres: 0.7,
                max_det: 300,
                multi_label: true,
                ..Default::default()
            },
            "nms_val_ml_det",
        ),
    ];
    for (opts, key) in cases {
        let c = filtered_candidates(&y, opts.conf_thres).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].data.len(), c[0].len * 84);
        let got = nms_image(&c[0].data, 80, c[0].len, &opts);
        assert_rows_equal(&got, &rows(&t[key]), key);
        if key == "nms_detect_det" {
            println!("candidates at conf 0.25: {} of {a}", c[0].len);
            assert!(
                c[0].len > 44 && c[0].len < a / 10,
                "{} candidates",
                c[0].len
            );
        }
    }
}

/// Hand-built batch of two images (nc = 2, 4 anchors): per-image candidate sets of different
/// sizes, an image with none, a NaN score next to a real one, and the strict `>` threshold.
#[test]
fn candidate_filter_batch_nan_and_threshold() {
    let nan = f32::NAN;
    // Rows cx, cy, w, h, s0, s1; columns = anchors.
    let img0 = [
        [10.0, 50.0, 90.0, 10.0],
        [10.0, 50.0, 90.0, 10.0],
        [4.0, 4.0, 4.0, 4.0],
        [4.0, 4.0, 4.0, 4.0],
        [0.5, 0.25, 0.1, nan],
        [0.1, 0.2, 0.9, 0.7],
    ];
    let img1 = [
        [10.0, 50.0, 90.0, 10.0],
        [10.0, 50.0, 90.0, 10.0],
        [4.0, 4.0, 4.0, 4.0],
        [4.0, 4.0, 4.0, 4.0],
        [0.25, 0.1, 0.0, 0.2],
        [0.0, 0.25, 0.1, 0.2],
    ];
    let flat: Vec<f32> = img0.iter().chain(img1.iter()).flatten().copied().collect();
    let y = Tensor::from_vec(flat.clone(), (2, 6, 4), &Device::Cpu).unwrap();
    let c = filtered_candidates(&y, 0.25).unwrap();
    // Image 0: anchor 1 has best 0.25 (not > 0.25) and is dropped; anchor 3's NaN is kept
    // for nms_image to judge. Image 1: nothing above 0.25.
    assert_eq!(c[0].len, 3, "{:?}", c[0]);
    assert_eq!(c[1].len, 0);
    assert!(c[1].data.is_empty());
    for multi_label in [false, true] {
        let opts = NmsOptions {
            multi_label,
            ..Default::default()
        };
        for (i, cand) in c.iter().enumerate() {
            let all = nms_image(&flat[i * 24..(i + 1) * 24], 2, 4, &opts);
            let got = nms_image(&cand.data, 2, cand.len, &opts);
            assert_eq!(got.len(), all.len());
            for (g, w) in got.iter().zip(&all) {
                assert_eq!(g.map(f32::to_bits), w.map(f32::to_bits));
            }
        }
    }
    let d0 = nms_image(&c[0].data, 2, c[0].len, &NmsOptions::default());
    let confs: Vec<f32> = d0.iter().map(|r| r[4]).collect();
    assert_eq!(confs, vec![0.9, 0.7, 0.5]);
}

/// The anchors (columns) of the kept rows of image 0 of a packed batch-NMS output.
fn kept_anchors(packed: &Tensor) -> Vec<usize> {
    device_nms::unpack(packed).unwrap()[0]
        .iter()
        .map(|r| r[6] as usize)
        .collect()
}

#[test]
fn batch_op_on_box_lists_equals_torchvision_cases() {
    let t = load("nms_cases.safetensors");
    let all = |thr: f64, agnostic: bool| NmsOptions {
        conf_thres: f32::NEG_INFINITY,
        iou_thres: thr,
        agnostic,
        max_det: 1000,
        ..Default::default()
    };
    let run = |b: &str, s: &str, c: Option<&[usize]>, o: NmsOptions| {
        let out = common::box_list_output(&boxes(&t[b]), &t[s].to_vec1::<f32>().unwrap(), c);
        kept_anchors(&device_nms::batch_nms_packed(&out, &o, true).unwrap())
    };
    assert_eq!(
        run("case1_boxes", "case1_scores", None, all(0.5, false)),
        vec![5, 6, 0, 3, 8, 2, 9]
    );
    assert_eq!(
        run("case1_boxes", "case1_scores", None, all(0.3, false)),
        idx(&t["case1_keep_thr_0_3"])
    );
    for (thr, key) in [(0.45, "case2_keep_iou_0_45"), (0.7, "case2_keep_iou_0_7")] {
        assert_eq!(
            run("case2_boxes", "case2_scores", None, all(thr, false)),
            idx(&t[key])
        );
    }
    let c = idx(&t["case3_idxs"]);
    assert_eq!(
        run("case3_boxes", "case3_scores", Some(&c), all(0.6, false)),
        idx(&t["case3_keep_batched_iou_0_6"])
    );
    assert_eq!(
        run("case3_boxes", "case3_scores", Some(&c), all(0.6, true)),
        idx(&t["case3_keep_agnostic_iou_0_6"])
    );
}

#[test]
fn batch_op_on_the_cpu_equals_the_host_nms_per_image() {
    // Two images: the official output and a random one with many ties; three option sets.
    let (y, t) = y_main();
    let r = common::random_output(1, 80, y.dim(2).unwrap(), 7);
    let batch = Tensor::cat(&[&y, &r], 0).unwrap();
    let val_ml = NmsOptions {
        conf_thres: 0.001,
        iou_thres: 0.7,
        max_det: 300,
        multi_label: true,
        ..Default::default()
    };
    let filtered = NmsOptions {
        classes: Some(vec![0, 17, 45]),
        agnostic: true,
        max_det: 7,
        ..Default::default()
    };
    for (name, o) in [
        ("detect", NmsOptions::default()),
        ("val multi-label", val_ml),
        ("classes, agnostic, max_det 7", filtered),
    ] {
        let got = device_nms::batch_nms(&batch, &o).unwrap();
        assert_eq!(got.len(), 2);
        for (i, g) in got.iter().enumerate() {
            let want = non_max_suppression(&batch.get(i).unwrap().unsqueeze(0).unwrap(), &o)
                .unwrap()
                .remove(0);
            assert_rows_equal(g, &want, &format!("{name}, image {i}"));
        }
        if name == "val multi-label" {
            assert_rows_equal(&got[0], &rows(&t["nms_val_ml_det"]), "nms_val_ml_det");
        }
    }
}
