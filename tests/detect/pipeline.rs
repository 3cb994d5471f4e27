//! The Detector and the `yolo9 detect` loop with a stand-in model (the oracle's `y_main` for
//! horses.jpg, synthetic outputs for other sizes): letterbox → output → NMS → original pixels,
//! files written, bad files skipped.
#![allow(clippy::needless_range_loop)]
use crate::common;

use anyhow::Result;
use candle_core::{Device, Tensor};
use clap::Parser;
use std::path::PathBuf;
use yolo9::detect::detector::{Detector, InferenceModel};
use yolo9::{DetectorConfig, Graph, ModelMeta};

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Detector>();
};

struct Fake {
    meta: ModelMeta,
    y_main: Tensor,
}

impl Fake {
    fn new() -> Self {
        let p = common::reference("forward_horses.safetensors");
        let t = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
        let names = (0..80).map(|i| format!("c{i}")).collect();
        Self {
            meta: ModelMeta::yolov9_s(80, names, Graph::Infer),
            y_main: t["y_main"].clone(),
        }
    }
}

impl InferenceModel for Fake {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        assert_eq!(c, 3);
        assert!(
            h % 32 == 0 && w % 32 == 0,
            "input {h}x{w} not a stride multiple"
        );
        if (h, w) == (448, 640) {
            let copies = vec![&self.y_main; b];
            return Ok(Tensor::cat(&copies, 0)?);
        }
        // Synthetic: every 7th anchor carries a box 3 strides wide (class anchor % 3, score 0.9),
        // so boxes reach past the image edges and test clipping.
        let mut cols = Vec::new();
        for s in [8usize, 16, 32] {
            for gy in 0..h / s {
                for gx in 0..w / s {
                    cols.push((
                        (gx as f32 + 0.5) * s as f32,
                        (gy as f32 + 0.5) * s as f32,
                        s,
                    ));
                }
            }
        }
        let a = cols.len();
        let mut data = vec![0.01f32; b * 84 * a];
        for bi in 0..b {
            for (j, &(cx, cy, s)) in cols.iter().enumerate() {
                let base = bi * 84 * a;
                data[base + j] = cx;
                data[base + a + j] = cy;
                data[base + 2 * a + j] = 3.0 * s as f32;
                data[base + 3 * a + j] = 3.0 * s as f32;
                if j % 7 == 0 {
                    data[base + (4 + j % 3) * a + j] = 0.9;
                }
            }
        }
        Ok(Tensor::from_vec(data, (b, 84, a), &Device::Cpu)?)
    }
    fn meta(&self) -> &ModelMeta {
        &self.meta
    }
}

#[test]
fn horses_detections_equal_oracle_orig() {
    let p = common::reference("forward_horses.safetensors");
    let t = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
    let want = t["nms_detect_det_orig"].to_vec2::<f32>().unwrap();
    let det = Detector::from_model(Fake::new(), Device::Cpu);
    let rgb = yolo9::data::image::load_rgb8(&common::reference("horses.jpg")).unwrap();
    let img = image::DynamicImage::ImageRgb8(rgb);
    let got = det.detect(&img).unwrap();
    assert_eq!(got.len(), 44);
    let mut max = 0f32;
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.class_id, w[5] as usize);
        assert_eq!(g.class_name, format!("c{}", w[5] as usize));
        assert_eq!(g.confidence, w[4]);
        for k in 0..4 {
            max = max.max((g.bbox[k] - w[k]).abs());
        }
    }
    println!("Detector on horses.jpg (stand-in model = oracle y_main): 44 boxes, max {max:e} px");
    assert!(max < 1e-3);
    // The batch form gives the same answer, per image, in order.
    let batch = det.detect_batch(&[img.clone(), img.clone()]).unwrap();
    assert_eq!(batch, vec![got.clone(), got.clone()]);
    // Options: a class filter and a higher threshold.
    let det = det
        .with_config(DetectorConfig {
            classes: Some(vec![45]),
            conf: 0.3,
            ..Default::default()
        })
        .unwrap();
    let only = det.detect(&img).unwrap();
    let expect: Vec<_> = got
        .iter()
        .filter(|d| d.class_id == 45 && d.confidence > 0.3)
        .cloned()
        .collect();
    assert_eq!(only, expect);
    // Invalid options are errors when the detector is configured, not panics.
    let bad_class = DetectorConfig {
        classes: Some(vec![80]),
        ..Default::default()
    };
    let det = Detector::from_model(Fake::new(), Device::Cpu);
    assert!(matches!(
        det.with_config(bad_class),
        Err(yolo9::Error::InvalidOption(m)) if m.contains("class filter contains 80")
    ));
    let det = Detector::from_model(Fake::new(), Device::Cpu);
    let bad_conf = DetectorConfig {
        conf: 1.5,
        ..Default::default()
    };
    assert!(det.with_config(bad_conf).is_err());
}

#[test]
fn boxes_stay_inside_odd_sized_images() {
    let det = conf(Detector::from_model(Fake::new(), Device::Cpu), 0.5);
    for (w, h) in [
        (1u32, 1u32),
        (9, 9),
        (33, 17),
        (641, 479),
        (4000, 20),
        (20, 4000),
    ] {
        let img = image::DynamicImage::ImageRgb8(image::RgbImage::new(w, h));
        let d = det.detect(&img).unwrap();
        assert!(!d.is_empty(), "{w}x{h}");
        for x in &d {
            let [x1, y1, x2, y2] = x.bbox;
            assert!(
                0.0 <= x1 && x1 <= x2 && x2 <= w as f32 && 0.0 <= y1 && y1 <= y2 && y2 <= h as f32,
                "{w}x{h}: {:?}",
                x.bbox
            );
        }
    }
    // Grey and 16-bit inputs go through the same colour rule.
    let g = image::DynamicImage::ImageLuma16(image::ImageBuffer::new(50, 40));
    assert!(!det.detect(&g).unwrap().is_empty());
}

/// `det` with confidence threshold `c`.
fn conf(det: Detector, c: f32) -> Detector {
    det.with_config(DetectorConfig {
        conf: c,
        ..Default::default()
    })
    .unwrap()
}

fn parse(args: &[&str]) -> yolo9::internals::cli::detect::DetectArgs {
    let mut v = vec!["yolo9", "detect"];
    v.extend_from_slice(args);
    match yolo9::internals::cli::Cli::try_parse_from(v)
        .unwrap()
        .command
    {
        yolo9::internals::cli::Command::Detect(a) => a,
        _ => unreachable!(),
    }
}

#[test]
fn detect_loop_on_mixed_directory_writes_outputs() {
    let tmp = std::env::temp_dir().join(format!("yolo9-detect-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let inputs = common::case("detect_dir_mixed_files").join("inputs");
    let project = tmp.to_str().unwrap().to_string();
    let args = parse(&[
        inputs.to_str().unwrap(),
        "--project",
        &project,
        "--save-txt",
        "--save-conf",
        "--json",
        "--conf",
        "0.5",
    ]);
    let s = yolo9::detect::source::expand_sources(&args.source).unwrap();
    let det = conf(Detector::from_model(Fake::new(), Device::Cpu), 0.5);
    yolo9::detect::job::run(
        &det,
        &args.job,
        &s.files,
        &s.skipped,
        &[],
        &yolo9::cancel::Cancel::never(),
    )
    .unwrap();
    let run = tmp.join("exp");
    assert!(run.join("a.jpg").is_file());
    assert!(run.join("d.webp.jpg").is_file());
    assert!(run.join("labels/a.txt").is_file());
    let jsonl = std::fs::read_to_string(run.join("predictions.jsonl")).unwrap();
    let mut n = 0;
    for line in jsonl.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["xyxy"].as_array().unwrap().len() == 4);
        assert!(v["confidence"].as_f64().unwrap() > 0.5);
        assert!(v["class_name"].as_str().unwrap().starts_with('c'));
        n += 1;
    }
    assert!(n > 0);
    let label = std::fs::read_to_string(run.join("labels/a.txt")).unwrap();
    for l in label.lines() {
        let f: Vec<f64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
        assert_eq!(f.len(), 6);
        assert!(f[1..5].iter().all(|v| (0.0..=1.0).contains(v)), "{l}");
    }
    // A second run goes to exp2.
    yolo9::detect::job::run(
        &det,
        &args.job,
        &s.files[..1],
        &[],
        &[],
        &yolo9::cancel::Cancel::never(),
    )
    .unwrap();
    assert!(tmp.join("exp2").is_dir());
    // Only bad files: an error, after trying all.
    let bad: Vec<PathBuf> = ["empty.jpg", "notes.txt", "clip.mp4"]
        .iter()
        .map(|f| inputs.join(f))
        .collect();
    let e = yolo9::detect::job::run(
        &det,
        &args.job,
        &bad,
        &[],
        &[],
        &yolo9::cancel::Cancel::never(),
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("3 skipped"), "{e:#}");
    let _ = std::fs::remove_dir_all(&tmp);
}
