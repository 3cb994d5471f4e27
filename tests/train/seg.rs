//! A tiny CPU segmentation training run: two BCCD images whose boxes are given as 12-point
//! ellipse outlines, the tiny-seg graph of the official oracle (`Segment` head), 64 px, 3
//! epochs. The loader rasterises the overlap masks, the step trains through the mask loss, and
//! the run reports it: `results.csv` gains the `train/seg_loss` and `val/seg_loss` columns,
//! finite and positive, and the weights reload as a segmentation model that gives masks. The val
//! losses do not depend on the order of an image's labels (targets follow the overlap mask's
//! order, as the official loader reorders them).

use crate::common;
use yolo9::train::trainer::{train, RESULTS_HEADER, SEG_COLUMNS};

/// Rewrites every label file under `dir/labels` so each box row becomes the 12-point ellipse
/// inscribed in the box (normalized, clipped to the image).
fn boxes_to_ellipses(dir: &std::path::Path) {
    for split in ["train", "val"] {
        for e in std::fs::read_dir(dir.join("labels").join(split)).unwrap() {
            let p = e.unwrap().path();
            let text = std::fs::read_to_string(&p).unwrap();
            let mut out = String::new();
            for line in text.lines() {
                let v: Vec<f32> = line
                    .split_whitespace()
                    .map(|t| t.parse().unwrap())
                    .collect();
                if v.len() != 5 {
                    continue;
                }
                out.push_str(&format!("{}", v[0] as u32));
                for k in 0..12 {
                    let a = k as f32 / 12.0 * std::f32::consts::TAU;
                    let x = (v[1] + v[3] / 2.0 * a.cos()).clamp(0.0, 1.0);
                    let y = (v[2] + v[4] / 2.0 * a.sin()).clamp(0.0, 1.0);
                    out.push_str(&format!(" {x:.5} {y:.5}"));
                }
                out.push('\n');
            }
            std::fs::write(&p, out).unwrap();
        }
    }
}

#[test]
fn tiny_segmentation_run_trains_the_mask_loss_and_reloads() {
    let tmp = common::tmpdir("segrun");
    common::tiny_dataset(&tmp, 2);
    boxes_to_ellipses(&tmp);
    let mut o = common::tiny_run_options(&tmp, "seg");
    o.cfg = Some(
        common::seg_oracle("tiny-seg.yaml")
            .to_string_lossy()
            .into_owned(),
    );
    o.batch = 2;
    let s = train(&o).unwrap();
    assert_eq!(s.epochs.len(), 3);
    let seg: Vec<f32> = s.epochs.iter().map(|e| e.seg_loss.unwrap()).collect();
    println!("seg loss per epoch: {seg:?}");
    assert!(seg.iter().all(|v| v.is_finite() && *v > 0.0), "{seg:?}");
    let csv = std::fs::read_to_string(s.run_dir.join("results.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], format!("{RESULTS_HEADER},{SEG_COLUMNS}"));
    let last: Vec<&str> = lines[3].split(',').collect();
    let n = RESULTS_HEADER.split(',').count();
    assert_eq!(last.len(), n + 6);
    let logged: f32 = last[n].parse().unwrap();
    assert!((logged - seg[2]).abs() < 1e-4, "{logged} vs {}", seg[2]);
    // The final epoch validated the EMA's boxes and masks.
    let masks = s.epochs[2].mask_metrics.expect("mask metrics");
    assert!(s.epochs[2].validated && masks.iter().all(|v| (0.0..=1.0).contains(v)));
    for (k, v) in masks.iter().enumerate() {
        let logged: f64 = last[n + 1 + k].parse().unwrap();
        assert!((logged - v).abs() < 1e-5);
    }
    // The val losses of the final epoch: finite, positive, logged.
    let e = &s.epochs[2];
    let val_seg = e.val_seg_loss.expect("a val mask loss");
    println!("val losses: box/cls/dfl {:?}, seg {val_seg}", e.val_loss);
    assert!(val_seg.is_finite() && val_seg > 0.0, "{val_seg}");
    assert!(
        e.val_loss.iter().all(|v| v.is_finite() && *v > 0.0),
        "{:?}",
        e.val_loss
    );
    let logged: f32 = last[n + 5].parse().unwrap();
    assert!((logged - val_seg).abs() < 1e-4, "{logged} vs {val_seg}");
    // The weights are a segmentation model's.
    let w = yolo9::Weights::load(&s.last).unwrap();
    let m = yolo9::internals::model::yolov9::YoloV9::load(&w, &candle_core::Device::Cpu).unwrap();
    assert!(m.is_seg());
    // Validation of a segmentation model reports box and mask statistics of the same labels.
    use yolo9::metrics::seg_val::{validate_seg, SegValModel};
    use yolo9::metrics::validate::ValConfig;
    let (_, images) = common::val_split(
        &tmp.join("data.yaml"),
        yolo9::internals::data::yaml::Split::Val,
    );
    assert!(images[0].outlines.iter().all(|o| o.len() == 12));
    let cfg = ValConfig {
        img: 64,
        ..ValConfig::default()
    };
    let cfg = ValConfig {
        collect: true,
        ..cfg
    };
    let r = validate_seg(SegValModel::Infer(&m), &images, &cfg).unwrap();
    // The checks and the skipping of detection validation: --img not a multiple of 32 is an
    // error, a batch whose every image fails to decode is skipped, not run.
    let bad = ValConfig {
        img: 70,
        ..cfg.clone()
    };
    let err = validate_seg(SegValModel::Infer(&m), &images, &bad).unwrap_err();
    assert!(format!("{err:#}").contains("multiple of 32"), "{err:#}");
    let broken = tmp.join("broken.jpg");
    std::fs::write(&broken, b"not a jpeg").unwrap();
    let mut two = vec![images[0].clone(), images[0].clone()];
    two[1].path = broken;
    two[1].width = 100; // its own aspect ratio: a batch of its own at batch 1
    let one = ValConfig {
        batch: 1,
        ..cfg.clone()
    };
    let rb = validate_seg(SegValModel::Infer(&m), &two, &one).unwrap();
    assert_eq!((rb.skipped.len(), rb.metrics.seen), (1, 1));
    // The training graph's outputs validate to the same detections as the fused graph's.
    let arch = yolo9::model::Arch::from_yaml(
        &std::fs::read_to_string(common::seg_oracle("tiny-seg.yaml")).unwrap(),
        "tiny-seg",
    )
    .unwrap();
    let names = w.meta.names.clone();
    let tm = yolo9::internals::model::yolov9::YoloV9Train::build(
        &arch,
        Some(&w),
        3,
        names,
        &candle_core::Device::Cpu,
        0,
    )
    .unwrap();
    let rt = validate_seg(
        SegValModel::Train {
            model: &tm,
            loss: None,
        },
        &images,
        &cfg,
    )
    .unwrap();
    assert!(rt.losses.is_none() && rt.seg_loss.is_none());
    // With the loss: val losses, the same whatever the order of the image's labels (each
    // label's outline goes with it); labels in another order than the overlap mask's would
    // give each anchor another object's mask.
    let loss = yolo9::internals::loss::DualTalLoss::new(3, &[8, 16, 32]).unwrap();
    let with_loss = |images: &[yolo9::metrics::validate::ValImage]| {
        let m = SegValModel::Train {
            model: &tm,
            loss: Some(&loss),
        };
        let r = validate_seg(m, images, &cfg).unwrap();
        (r.losses.unwrap(), r.seg_loss.unwrap())
    };
    let (l0, s0) = with_loss(&images);
    let mut reversed = images.clone();
    assert!(reversed[0].labels.len() >= 2);
    reversed[0].labels.reverse();
    reversed[0].outlines.reverse();
    let (l1, s1) = with_loss(&reversed);
    println!("val losses {l0:?} seg {s0}; labels reversed {l1:?} seg {s1}");
    assert!(s0.is_finite() && s0 > 0.0);
    for (a, b) in l0.iter().chain([&s0]).zip(l1.iter().chain([&s1])) {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "{l0:?} {s0} vs {l1:?} {s1}"
        );
    }
    let (a, b) = (
        r.detections.as_ref().unwrap(),
        rt.detections.as_ref().unwrap(),
    );
    assert_eq!(a.len(), 1);
    assert!(!a[0].dets.is_empty());
    let close = a[0].dets.len().min(b[0].dets.len()).min(20);
    for (x, y) in a[0].dets[..close].iter().zip(&b[0].dets[..close]) {
        assert!((0..6).all(|k| (x[k] - y[k]).abs() < 1e-2), "{x:?} vs {y:?}");
    }
    let masks = r.masks.expect("mask metrics of a segmentation model");
    assert_eq!((r.metrics.seen, masks.seen), (1, 1));
    assert_eq!(masks.nt, r.metrics.nt);
    assert_eq!(r.metrics.nt.iter().sum::<usize>(), images[0].labels.len());
    let _ = std::fs::remove_dir_all(&tmp);
}
