//! Parity of every official YOLOv9 size with the official code on the same weights. Needs files
//! made on the GPU machine by the official code (`.device/gen_arch.py` in the session's device
//! scripts: each model built from its official yaml with seeded random weights, saved as an
//! official checkpoint, with its eval forward on a seeded input and its state_dict summary), so
//! it is `#[ignore]`d and run there with `YOLO9_ARCH_DIR=<folder> cargo test --test model arch_parity
//! -- --ignored --nocapture`. On a `cuda` build it checks the GPU forward too (strict f32).

use crate::common;

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use yolo9::internals::model::keys;
use yolo9::model::{YoloV9, YoloV9Train};
use yolo9::Weights;

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    common::max_abs(a, b) / common::abs_max(b).max(1e-30)
}

fn check(name: &str, dir: &std::path::Path, summary: &serde_json::Value, dev: &Device) {
    let w = Weights::load(dir.join(format!("{name}.pt"))).unwrap();
    assert_eq!(w.meta.arch.name, name, "model recognised from the keys");
    let s = &summary[name];
    let want = common::state_dict_entries_json(&s["entries"]);
    let ours = keys::state_dict_entries(&w.meta.arch, w.meta.nc).unwrap();
    assert_eq!(ours, want, "{name}: state_dict names, shapes and order");
    assert_eq!(
        w.parameter_count() as u64,
        s["parameters"].as_u64().unwrap(),
        "{name}: parameters"
    );
    let t: HashMap<String, Tensor> =
        candle_core::safetensors::load(dir.join(format!("{name}.forward.safetensors")), dev)
            .unwrap();
    let m = YoloV9::load(&w, dev).unwrap();
    let raw = m.forward_raw(&t["x"]).unwrap();
    let mut worst_raw = 0f64;
    for (i, r) in raw.iter().enumerate() {
        worst_raw = worst_raw.max(rel(r, &t[&format!("raw_main_{i}")]));
    }
    let y = m.forward(&t["x"]).unwrap();
    let ym = &t["y_main"];
    let nc = w.meta.nc;
    let boxes = common::max_abs(&y.narrow(1, 0, 4).unwrap(), &ym.narrow(1, 0, 4).unwrap());
    let scores = common::max_abs(&y.narrow(1, 4, nc).unwrap(), &ym.narrow(1, 4, nc).unwrap());
    let mut aux = f64::NAN;
    if w.meta.arch.is_dual() {
        let tr = YoloV9Train::from_weights(&w, dev).unwrap();
        let (ya, ymain) = tr.forward_eval_decoded(&t["x"]).unwrap();
        aux = common::max_abs(&ya, &t["y_aux"]);
        let d = common::max_abs(&ymain, ym);
        assert!(
            d < 1e-2,
            "{name}: training graph main branch differs by {d}"
        );
    }
    println!(
        "{name} on {dev:?}: {} parameters, {} entries; raw head rel {worst_raw:.2e}, boxes {boxes:.2e} px, scores {scores:.2e}, aux decoded {aux:.2e}",
        w.parameter_count(),
        ours.len()
    );
    assert!(
        worst_raw <= 1e-4,
        "{name}: raw head outputs rel {worst_raw:.2e}"
    );
    assert!(boxes <= 1e-2, "{name}: boxes {boxes:.2e} px");
    assert!(scores <= 1e-5, "{name}: scores {scores:.2e}");
    assert!(aux.is_nan() || aux <= 1e-2, "{name}: aux {aux:.2e}");
}

#[test]
#[ignore = "needs YOLO9_ARCH_DIR with files made by the official code on the GPU machine"]
fn every_size_equals_the_official_code() {
    let dir = std::path::PathBuf::from(
        std::env::var("YOLO9_ARCH_DIR").expect("set YOLO9_ARCH_DIR to the folder of gen_arch.py"),
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    #[allow(unused_mut)]
    let mut devices = vec![Device::Cpu];
    #[cfg(feature = "cuda")]
    {
        yolo9::internals::cuda::conv::set_strict_fp32(true);
        devices.push(Device::new_cuda(0).unwrap());
    }
    for dev in &devices {
        for name in [
            "yolov9-t", "yolov9-s", "yolov9-m", "yolov9-c", "yolov9-e", "gelan-t", "gelan-s",
            "gelan-m", "gelan-c", "gelan-e",
        ] {
            check(name, &dir, &summary, dev);
        }
    }
}
