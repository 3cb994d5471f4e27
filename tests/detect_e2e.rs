//! End to end with the real model: yolov9-s.pt (official checkpoint, converted in memory) on the
//! oracle input of horses.jpg must reproduce detect_dual.py's detections; the shipped BCCD
//! weights run through `yolo9 detect`.
#![allow(clippy::needless_range_loop)]
mod common;

use candle_core::Device;
use yolo9::detect::letterbox::letterbox_info;
use yolo9::Detector;

#[test]
fn horses_yolov9s_matches_detect_dual() {
    let t = candle_core::safetensors::load(
        common::reference("forward_horses.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let want = t["nms_detect_det_orig"].to_vec2::<f32>().unwrap();
    let det = Detector::load(&common::reference("yolov9-s.pt"), Device::Cpu).unwrap();
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
