//! Validation pieces: multi-label NMS against the official oracle, rectangular batch shapes,
//! the val letterbox, box mapping, and an end-to-end val on two BCCD test images with the real
//! weights (fused inference graph vs the training graph in eval mode, plus val losses).

use crate::common;

use candle_core::{Device, Tensor};
use yolo9::metrics::validate::{
    letterbox_to, nms_multilabel, rect_batches, scale_box_back, validate, ValConfig, ValImage,
    ValModel,
};
use yolo9::metrics::ValStats;

fn load(name: &str) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(common::reference(name), &Device::Cpu)
        .unwrap_or_else(|e| panic!("cannot read {name}: {e}"))
}

#[test]
fn nms_multilabel_matches_official_val_nms() {
    let t = load("forward_horses.safetensors");
    let y: Vec<f32> = t["y_main"].flatten_all().unwrap().to_vec1().unwrap();
    let want: Vec<Vec<f32>> = t["nms_val_ml_det"].to_vec2().unwrap();
    let got = nms_multilabel(&y, 80, 0.001, 0.7, 300);
    assert_eq!(got.len(), want.len(), "detections kept");
    let mut max_box = 0f32;
    let mut max_conf = 0f32;
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g[5], w[5], "class of a kept detection");
        for k in 0..4 {
            max_box = max_box.max((g[k] - w[k]).abs());
        }
        max_conf = max_conf.max((g[4] - w[4]).abs());
    }
    assert!(max_box < 1e-3, "box diff {max_box}");
    assert_eq!(max_conf, 0.0, "conf diff");
    // The same without multi-label (official detect-style call with val thresholds).
    let want1: Vec<Vec<f32>> = t["nms_val_det"].to_vec2().unwrap();
    let mut single = y.clone();
    // Force single-label by keeping only each anchor's best class score.
    let a = 5880;
    for k in 0..a {
        let best = (0..80)
            .max_by(|&i, &j| y[(4 + i) * a + k].total_cmp(&y[(4 + j) * a + k]))
            .unwrap();
        for j in 0..80 {
            if j != best {
                single[(4 + j) * a + k] = 0.0;
            }
        }
    }
    let got1 = nms_multilabel(&single, 80, 0.001, 0.7, 300);
    assert_eq!(got1.len(), want1.len());
    for (g, w) in got1.iter().zip(&want1) {
        assert_eq!(g[5], w[5]);
        assert!((g[4] - w[4]).abs() == 0.0 && (g[0] - w[0]).abs() < 1e-3);
    }
}

#[test]
fn nms_hand_cases() {
    // 2 classes, 3 anchors: boxes (cx, cy, w, h) rows then scores rows.
    // anchors 0 and 1 overlap with IoU 0.8 (same size, shifted 2/18 of width); anchor 2 far away.
    let a = 3;
    let mut p = vec![0f32; 6 * a];
    let boxes = [
        [10.0, 10.0, 10.0, 10.0],
        [11.0, 10.0, 10.0, 10.0],
        [50.0, 50.0, 4.0, 4.0],
    ];
    for (k, b) in boxes.iter().enumerate() {
        for r in 0..4 {
            p[r * a + k] = b[r];
        }
    }
    // class 0 scores, class 1 scores
    let s0 = [0.9, 0.8, 0.0005];
    let s1 = [0.1, 0.7, 0.3];
    for k in 0..a {
        p[4 * a + k] = s0[k];
        p[5 * a + k] = s1[k];
    }
    // IoU of anchors 0/1: inter 9*10=90, union 110 → 0.818 > 0.7: anchor 1 class 0 suppressed.
    let d = nms_multilabel(&p, 2, 0.001, 0.7, 300);
    let got: Vec<(f32, f32)> = d.iter().map(|r| (r[4], r[5])).collect();
    assert_eq!(got, vec![(0.9, 0.0), (0.7, 1.0), (0.3, 1.0)]);
    assert_eq!(d[0][..4], [5.0, 5.0, 15.0, 15.0]);
    // IoU threshold above 0.818 keeps both class-0 boxes.
    let d = nms_multilabel(&p, 2, 0.001, 0.82, 300);
    assert_eq!(d.len(), 5);
    // max_det cut.
    assert_eq!(nms_multilabel(&p, 2, 0.001, 0.7, 2).len(), 2);
    // Strict confidence threshold: 0.3 is not > 0.3.
    let d = nms_multilabel(&p, 2, 0.3, 0.7, 300);
    assert_eq!(d.len(), 2);
}

#[test]
fn rect_batch_shapes_by_hand() {
    // BCCD: 640x480 at img 640 → ceil(0.75*20 + 0.5)*32 = 512, ceil(20.5)*32 = 672.
    let (order, shapes) = rect_batches(&[(640, 480); 5], 32, 640, 32, 0.5);
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
    assert_eq!(shapes, vec![(512, 672)]);
    // Mixed: tall 300x600 (ar 2), square 500x500, wide 800x400 (ar 0.5), batch 1 at img 320.
    let (order, shapes) = rect_batches(&[(300, 600), (500, 500), (800, 400)], 1, 320, 32, 0.5);
    assert_eq!(order, vec![2, 1, 0]);
    // wide: [0.5, 1] → ceil(5.5)*32 = 192, ceil(10.5)*32 = 352; square: 352x352; tall: 352x192.
    assert_eq!(shapes, vec![(192, 352), (352, 352), (352, 192)]);
    // A batch mixing wide and tall gets [1, 1].
    let (_, shapes) = rect_batches(&[(300, 600), (800, 400)], 2, 320, 32, 0.5);
    assert_eq!(shapes, vec![(352, 352)]);
}

#[test]
fn letterbox_and_mapping_back() {
    let mut img = image::RgbImage::from_pixel(640, 480, image::Rgb([10, 20, 30]));
    img.put_pixel(0, 0, image::Rgb([200, 100, 50]));
    let (lb, r, pad) = letterbox_to(&img, (512, 672), false).unwrap();
    assert_eq!(lb.dimensions(), (672, 512));
    assert_eq!(r, 1.0);
    assert_eq!(pad, (16.0, 16.0));
    assert_eq!(lb.get_pixel(15, 15).0, [114, 114, 114]);
    assert_eq!(lb.get_pixel(16, 16).0, [200, 100, 50]);
    assert_eq!(lb.get_pixel(17, 17).0, [10, 20, 30]);
    assert_eq!(lb.get_pixel(656, 496).0, [114, 114, 114]);
    // A box in input pixels maps back by removing the pad, then clipping to the image.
    let b = scale_box_back([10.0, 26.0, 116.0, 600.0], 1.0, pad, 640, 480);
    assert_eq!(b, [0.0, 10.0, 100.0, 480.0]);
    let b = scale_box_back([26.0, 26.0, 66.0, 46.0], 0.5, pad, 640, 480);
    assert_eq!(b, [20.0, 20.0, 100.0, 60.0]);
}

/// The BCCD data config and its scanned test split.
fn bccd_test_split() -> (yolo9::internals::data::yaml::DataConfig, Vec<ValImage>) {
    common::val_split(
        &common::shared_dir().join("datasets/bccd/data.yaml"),
        yolo9::internals::data::yaml::Split::Test,
    )
}

fn two_test_images() -> Vec<ValImage> {
    let (_, mut imgs) = bccd_test_split();
    imgs.sort_by(|a, b| a.path.cmp(&b.path));
    imgs.truncate(2);
    imgs
}

#[test]
fn val_two_bccd_images_fused_vs_training_graph() {
    let images = two_test_images();
    let n_labels: usize = images.iter().map(|i| i.labels.len()).sum();
    let w = yolo9::Weights::load(common::reference("bccd-official-best.pt")).unwrap();
    let dev = Device::Cpu;
    let cfg = ValConfig {
        img: 320,
        batch: 2,
        ..ValConfig::default()
    };
    let fused = yolo9::internals::model::yolov9::YoloV9::load(&w, &dev).unwrap();
    let r1 = validate(ValModel::Infer(&fused), &images, &cfg).unwrap();
    assert_eq!(r1.metrics.seen, 2);
    assert_eq!(r1.metrics.nt.iter().sum::<usize>(), n_labels);
    assert!(r1.losses.is_none());
    let tm = yolo9::internals::model::yolov9::YoloV9Train::from_weights(&w, &dev).unwrap();
    let loss = yolo9::internals::loss::DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let r2 = validate(
        ValModel::Train {
            model: &tm,
            loss: &loss,
        },
        &images,
        &cfg,
    )
    .unwrap();
    let (m1, m2) = (&r1.metrics, &r2.metrics);
    for (a, b) in [
        (m1.mp, m2.mp),
        (m1.mr, m2.mr),
        (m1.map50, m2.map50),
        (m1.map50_95, m2.map50_95),
    ] {
        assert!((a - b).abs() < 2e-3, "fused {a} vs training graph {b}");
    }
    // A trained model finds the cells even at half resolution.
    assert!(m1.map50 > 0.5, "mAP50 {}", m1.map50);
    let l = r2.losses.expect("val losses of the training graph");
    assert!(
        l.iter().all(|v| v.is_finite() && *v > 0.0),
        "val losses {l:?}"
    );
    // Perfect predictions from the labels give mAP 1 through the same stats path.
    let mut st = ValStats::default();
    for im in &images {
        let (w0, h0) = (im.width as f32, im.height as f32);
        let lab: Vec<[f32; 5]> = im
            .labels
            .iter()
            .map(|(c, l)| {
                [
                    *c as f32,
                    (l[0] - l[2] / 2.0) * w0,
                    (l[1] - l[3] / 2.0) * h0,
                    (l[0] + l[2] / 2.0) * w0,
                    (l[1] + l[3] / 2.0) * h0,
                ]
            })
            .collect();
        let det: Vec<[f32; 6]> = lab
            .iter()
            .enumerate()
            .map(|(k, l)| [l[1], l[2], l[3], l[4], 0.9 - k as f32 * 1e-3, l[0]])
            .collect();
        st.add_image(&det, &lab);
    }
    let m = st.metrics(3);
    assert!(m.map50_95 > 0.99 && m.mp > 0.99 && m.mr > 0.99, "{m:?}");
}

/// Acceptance: official val_dual.py on the BCCD test split (reference README §8). Slow on CPU.
#[test]
#[ignore]
fn val_bccd_test_split_matches_official_table() {
    let (cfg, images) = bccd_test_split();
    let w = yolo9::Weights::load(common::reference("bccd-official-best.pt")).unwrap();
    let m = yolo9::internals::model::yolov9::YoloV9::load(&w, &Device::Cpu).unwrap();
    let r = validate(ValModel::Infer(&m), &images, &ValConfig::default()).unwrap();
    let t = &r.metrics;
    println!("{}", t.table(&cfg.names));
    assert_eq!(t.seen, 72);
    assert_eq!(t.nt.iter().sum::<usize>(), 945);
    for (got, want) in [
        (t.mp, 0.805),
        (t.mr, 0.827),
        (t.map50, 0.866),
        (t.map50_95, 0.524),
    ] {
        // The printed table (3 decimals) is the official one.
        assert!((got - want).abs() < 0.0005, "got {got}, official {want}");
    }
}

/// Acceptance of the shipped default weights (yolo9's own 50-epoch BCCD run, weights/README.md):
/// on the BCCD test split, mAP50 ≥ 0.85 and mAP50-95 ≥ 0.51 (the official 50-epoch result is
/// 0.866 / 0.524). Measured: 0.869 / 0.529. Slow on CPU (about a minute in release).
#[test]
#[ignore]
fn shipped_weights_reach_the_acceptance_map() {
    let (cfg, images) = bccd_test_split();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let w = yolo9::Weights::load(&path).unwrap();
    let m = yolo9::internals::model::yolov9::YoloV9::load(&w, &Device::Cpu).unwrap();
    let r = validate(ValModel::Infer(&m), &images, &ValConfig::default()).unwrap();
    let t = &r.metrics;
    println!("{}", t.table(&cfg.names));
    assert_eq!((t.seen, t.nt.iter().sum::<usize>()), (72, 945));
    assert!(t.map50 >= 0.85 && t.map50_95 >= 0.51, "{t:?}");
}

/// INT8 (`yolo9 convert --int8`): the shipped weights calibrated on BCCD's 87 val images keep
/// their test mAP50-95 within 0.005 of f32 (measured: 0.529 both, mAP50 0.866 against 0.869)
/// and their mAP50 within 0.01. Slow on CPU (about a minute in release).
#[test]
#[ignore]
fn int8_keeps_the_shipped_weights_map() {
    let (cfg, images) = bccd_test_split();
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors");
    let w = yolo9::Weights::load(&path).unwrap();
    let val = common::shared_dir().join("datasets/bccd/images/val");
    let mut calib: Vec<_> = std::fs::read_dir(val)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    calib.sort();
    let (c, report) = yolo9::convert::int8::calibrate(&w, &calib, 640, 0).unwrap();
    assert_eq!((report.used, report.skipped.len()), (87, 0));
    let mut wq = w.clone();
    wq.meta.int8 = Some(std::sync::Arc::new(c));
    let mut maps = Vec::new();
    for w in [&w, &wq] {
        let m = yolo9::internals::model::yolov9::YoloV9::load(w, &Device::Cpu).unwrap();
        let r = validate(ValModel::Infer(&m), &images, &ValConfig::default()).unwrap();
        println!("{}", r.metrics.table(&cfg.names));
        maps.push((r.metrics.map50, r.metrics.map50_95));
    }
    let (f, q) = (maps[0], maps[1]);
    assert!(
        (f.1 - q.1).abs() <= 0.005 && (f.0 - q.0).abs() <= 0.01,
        "f32 {f:?} int8 {q:?}"
    );
}

/// The JPEG decoder used by detect, train and validation against OpenCV's `imread` (oracle
/// `orig_bgr_u8` of horses.jpg): libjpeg (mozjpeg) gives the same pixels, bit for bit.
#[test]
fn jpeg_decode_equals_opencv() {
    let t = load("forward_horses.safetensors");
    let bgr: Vec<u8> = t["orig_bgr_u8"].flatten_all().unwrap().to_vec1().unwrap();
    let img = yolo9::data::image::load_rgb8(&common::reference("horses.jpg")).unwrap();
    assert_eq!(img.dimensions(), (773, 512));
    let mut max = 0i32;
    let mut sum = 0f64;
    let mut exact = 0usize;
    for (i, p) in img.pixels().enumerate() {
        for c in 0..3 {
            let d = (p[c] as i32 - bgr[i * 3 + (2 - c)] as i32).abs();
            max = max.max(d);
            sum += d as f64;
            exact += (d == 0) as usize;
        }
    }
    let n = bgr.len() as f64;
    eprintln!(
        "decode vs OpenCV: max {max}, mean {:.4}, exact {:.4}",
        sum / n,
        exact as f64 / n
    );
    assert_eq!(max, 0, "mean abs diff {}", sum / n);
}
