//! End to end with the real model: yolov9-s.pt (official checkpoint, converted in memory) on the
//! oracle input of horses.jpg must reproduce detect_dual.py's detections; the shipped BCCD
//! weights run through `yolo9 detect`.
#![allow(clippy::needless_range_loop)]
use crate::common;

use candle_core::Device;
use yolo9::internals::detect::letterbox::letterbox_info;
use yolo9::Detector;

#[test]
fn horses_yolov9s_matches_detect_dual() {
    let t = candle_core::safetensors::load(
        common::reference("forward_horses.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let want = t["nms_detect_det_orig"].to_vec2::<f32>().unwrap();
    let det = Detector::load(common::reference("yolov9-s.pt"), Device::Cpu).unwrap();
    assert_eq!(det.names()[17], "horse");

    // 1. Forward on the oracle's own input tensor: isolates the model + postprocess.
    let y = det.forward_tensor(&t["input"]).unwrap();
    assert_eq!(y.dims(), &[1, 84, 5880]);
    let info = letterbox_info(773, 512, 640, 640, 32, true).unwrap();
    let got = det.postprocess(&y, &[info]).unwrap().remove(0);
    assert_eq!(got.len(), want.len(), "detection count");
    let (mut dbox, mut dconf) = (0f32, 0f32);
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.class_id, w[5] as usize);
        dconf = dconf.max((g.confidence - w[4]).abs());
        for k in 0..4 {
            dbox = dbox.max((g.bbox[k] - w[k]).abs());
        }
    }
    println!(
        "oracle input: {} boxes, max box diff {dbox:.2e} px, max conf diff {dconf:.2e}",
        got.len()
    );
    assert!(dbox < 0.5, "box diff {dbox} px");
    assert!(dconf < 1e-3, "conf diff {dconf}");

    // 2. The whole pipeline from the JPEG file: libjpeg decoding (as OpenCV) and our resize (at
    //    most 1 level from OpenCV's) give the oracle's detections class for class.
    let rgb = yolo9::data::image::load_rgb8(&common::reference("horses.jpg")).unwrap();
    let full = det.detect(&image::DynamicImage::ImageRgb8(rgb)).unwrap();
    let count = |c: usize, v: &[yolo9::Detection]| v.iter().filter(|d| d.class_id == c).count();
    println!(
        "from horses.jpg: {} boxes: {} person, {} dog, {} cow, {} bowl (oracle 25/7/7/5)",
        full.len(),
        count(0, &full),
        count(16, &full),
        count(19, &full),
        count(45, &full)
    );
    assert_eq!(
        [
            full.len(),
            count(0, &full),
            count(16, &full),
            count(19, &full),
            count(45, &full)
        ],
        [44, 25, 7, 7, 5]
    );
}

#[test]
fn shipped_bccd_weights_detect_cells() {
    let w = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("weights/yolov9-s-bccd.safetensors");
    let det = Detector::load(&w, Device::Cpu).unwrap();
    assert_eq!(det.names(), ["RBC", "WBC", "Platelets"]);
    let dir = common::shared_dir().join("datasets/bccd/images/test");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let img = yolo9::data::image::load_rgb8(&files[0]).unwrap();
    let dets = det
        .detect(&image::DynamicImage::ImageRgb8(img.clone()))
        .unwrap();
    let rbc = dets.iter().filter(|d| d.class_id == 0).count();
    println!(
        "{}: {} detections, {rbc} RBC",
        files[0].display(),
        dets.len()
    );
    // A blood smear has many red cells.
    assert!(rbc >= 3, "{} RBC", rbc);
    for d in &dets {
        assert!(d.bbox[2] <= img.width() as f32 && d.bbox[3] <= img.height() as f32);
    }
}

/// IoU of two `[x1, y1, x2, y2]` boxes.
fn iou(a: &[f32], b: &[f32]) -> f32 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)
}

/// `--half`: the network in f16 (kernels folded in f32, then stored in f16; output decoded in
/// f32) on the oracle input finds the official f32 detections: every official box has an f16
/// box of its class with IoU ≥ 0.9 and vice versa, confidences within 0.02. Runs on the CPU
/// through candle's f16 convolution (the GPU runs the same graph on cuDNN).
#[test]
fn half_precision_detect_keeps_the_official_detections() {
    let t = candle_core::safetensors::load(
        common::reference("forward_horses.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let want = t["nms_detect_det_orig"].to_vec2::<f32>().unwrap();
    let det = Detector::load_dtype(
        common::reference("yolov9-s.pt"),
        Device::Cpu,
        candle_core::DType::F16,
    )
    .unwrap();
    let y = det.forward_tensor(&t["input"]).unwrap();
    assert_eq!(y.dtype(), candle_core::DType::F32);
    // The network really ran in f16: its scores differ from the f32 oracle's by f16 rounding.
    let ds = common::max_abs(
        &y.narrow(1, 4, 80).unwrap(),
        &t["y_main"].narrow(1, 4, 80).unwrap(),
    );
    println!("f16 vs f32 oracle scores: max abs diff {ds:.2e}");
    assert!(ds > 1e-5 && ds < 0.05, "score diff {ds}");
    let info = letterbox_info(773, 512, 640, 640, 32, true).unwrap();
    let got = det.postprocess(&y, &[info]).unwrap().remove(0);
    let best = |b: &[f32], c: usize, pool: &mut dyn Iterator<Item = (usize, Vec<f32>)>| {
        pool.filter(|(pc, _)| *pc == c)
            .map(|(_, pb)| (iou(b, &pb), pb))
            .max_by(|x, y| x.0.total_cmp(&y.0))
    };
    let mut dconf = 0f32;
    let mut worst = 1f32;
    for w in &want {
        let (i, g) = best(
            &w[..4],
            w[5] as usize,
            &mut got
                .iter()
                .map(|d| (d.class_id, [&d.bbox[..], &[d.confidence]].concat())),
        )
        .expect("an f16 detection of the class");
        worst = worst.min(i);
        dconf = dconf.max((g[4] - w[4]).abs());
    }
    for g in &got {
        let (i, _) = best(
            &g.bbox,
            g.class_id,
            &mut want.iter().map(|w| (w[5] as usize, w.clone())),
        )
        .expect("an official detection of the class");
        worst = worst.min(i);
    }
    println!(
        "f16: {} boxes (official {}), worst matched IoU {worst:.4}, max conf diff {dconf:.2e}",
        got.len(),
        want.len()
    );
    assert!(worst >= 0.9, "worst IoU {worst}");
    assert!(dconf <= 0.02, "conf diff {dconf}");
}
