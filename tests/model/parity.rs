//! Acceptance: the Candle YOLOv9-s equals the official PyTorch model on the stored oracle
//! (`forward_horses.safetensors`, weights `yolov9-s.pt` and the gelan-s `yolov9-s-converted.pt`).

use crate::common;

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use yolo9::model::{YoloV9, YoloV9Train};
use yolo9::Weights;

fn oracle() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        common::reference("forward_horses.safetensors"),
        &Device::Cpu,
    )
    .expect("loading forward_horses.safetensors")
}

/// (box max abs err in px, score max abs err) of a decoded (1, 84, A) output.
fn decoded_errors(y: &Tensor, want: &Tensor) -> (f64, f64) {
    assert_eq!(y.dims(), want.dims());
    let eb = common::max_abs(&y.narrow(1, 0, 4).unwrap(), &want.narrow(1, 0, 4).unwrap());
    let es = common::max_abs(
        &y.narrow(1, 4, 80).unwrap(),
        &want.narrow(1, 4, 80).unwrap(),
    );
    (eb, es)
}

#[test]
fn yolov9_s_matches_official_forward() {
    let t = oracle();
    let w = Weights::load(common::reference("yolov9-s.pt")).expect("loading yolov9-s.pt");
    assert_eq!(w.meta.nc, 80);
    let m = YoloV9::load(&w, &Device::Cpu).expect("building YoloV9");
    let x = &t["input"];
    assert_eq!(x.dims(), &[1, 3, 448, 640]);

    let start = std::time::Instant::now();
    let feats = m.forward_features(x).unwrap();
    for (f, name) in feats
        .iter()
        .zip(["feat_main_p3", "feat_main_p4", "feat_main_p5"])
    {
        let r = common::max_abs(f, &t[name]) / common::abs_max(&t[name]);
        println!("{name}: max abs err / absmax = {r:.2e}");
        assert!(r <= 1e-4, "{name}: {r}");
    }
    let y = m.forward(x).unwrap();
    println!(
        "YoloV9 forward 448x640 (features + full): {:?}",
        start.elapsed()
    );
    let (eb, es) = decoded_errors(&y, &t["y_main"]);
    println!("y_main (fused YoloV9): box {eb:.2e} px, score {es:.2e}");
    assert!(eb <= 1e-2 && es <= 1e-5, "box {eb} score {es}");

    // The training graph in eval mode gives both branches.
    let tm = YoloV9Train::from_weights(&w, &Device::Cpu).expect("building YoloV9Train");
    assert!(tm.initialized().is_empty(), "{:?}", tm.initialized());
    let (ya, ym) = tm.forward_eval_decoded(x).unwrap();
    let (eb, es) = decoded_errors(&ya, &t["y_aux"]);
    println!("y_aux (training graph, eval): box {eb:.2e} px, score {es:.2e}");
    assert!(eb <= 1e-2 && es <= 1e-5, "aux box {eb} score {es}");
    let (eb, es) = decoded_errors(&ym, &t["y_main"]);
    println!("y_main (training graph, eval): box {eb:.2e} px, score {es:.2e}");
    assert!(eb <= 1e-2 && es <= 1e-5, "main box {eb} score {es}");

    // Export → reload gives the same fused model.
    let w2 = tm.to_weights().unwrap();
    w2.validate("exported training graph")
        .expect("export must be a complete official state_dict");
    let m2 = YoloV9::load(&w2, &Device::Cpu).unwrap();
    let y2 = m2.forward(x).unwrap();
    assert_eq!(common::max_abs(&y, &y2), 0.0);
}

#[test]
fn converted_gelan_s_gives_the_same_y_main() {
    let t = oracle();
    let w = Weights::load(common::reference("yolov9-s-converted.pt"))
        .expect("loading yolov9-s-converted.pt");
    assert_eq!(w.meta.graph, yolo9::Graph::Infer);
    let m = YoloV9::load(&w, &Device::Cpu).expect("building YoloV9 from gelan-s weights");
    let y = m.forward(&t["input"]).unwrap();
    let (eb, es) = decoded_errors(&y, &t["y_main"]);
    println!("y_main (gelan-s converted): box {eb:.2e} px, score {es:.2e}");
    assert!(eb <= 1e-2 && es <= 1e-5, "box {eb} score {es}");
}
