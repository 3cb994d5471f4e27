//! The library's error kinds at its public boundary (`yolo9::Error`): what a service embedding
//! the detector, or a program calling the trainer, can match on.

use crate::common;

use candle_core::Device;
use yolo9::{Detector, Error};

fn shipped() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors")
}

#[test]
fn a_missing_or_damaged_weights_file_is_a_weights_error_naming_it() {
    let missing = std::path::Path::new("/nonexistent/yolo9/w.safetensors");
    match Detector::load(missing, Device::Cpu) {
        Err(Error::Weights { path, message }) => {
            assert_eq!(path, missing);
            assert!(
                message.contains("/nonexistent/yolo9/w.safetensors"),
                "{message}"
            );
        }
        other => panic!("expected Error::Weights, got {other:?}"),
    }
    let dir = common::tmpdir("liberr-weights");
    let bad = dir.join("w.safetensors");
    std::fs::write(&bad, b"not a weights file at all").unwrap();
    match yolo9::Weights::load(&bad) {
        Err(Error::Weights { path, .. }) => assert_eq!(path, bad),
        other => panic!("expected Error::Weights, got {other:?}"),
    }
}

#[test]
fn a_corrupt_image_and_a_bad_option_are_told_apart() {
    let det = Detector::load(shipped(), Device::Cpu).unwrap();
    let dir = common::tmpdir("liberr-image");
    let img = dir.join("photo.jpg");
    std::fs::write(&img, b"\xff\xd8\xff\xe0 this is not really a JPEG").unwrap();
    match det.detect_file(&img) {
        Err(Error::Image { path, message }) => {
            assert_eq!(path, img);
            assert!(message.contains("photo.jpg"), "{message}");
        }
        other => panic!("expected Error::Image, got {other:?}"),
    }
    let good = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/images/BloodImage_00007.jpg");
    // A bad option is refused when the detector is configured, once, not at each image.
    let bad = yolo9::DetectorConfig {
        conf: 1.5,
        ..Default::default()
    };
    match det.with_config(bad.clone()) {
        Err(Error::InvalidOption(m)) => assert!(m.contains("1.5"), "{m}"),
        other => panic!("expected Error::InvalidOption, got {other:?}"),
    }
    match Detector::new(shipped(), Device::Cpu, bad) {
        Err(Error::InvalidOption(m)) => assert!(m.contains("1.5"), "{m}"),
        other => panic!("expected Error::InvalidOption, got {other:?}"),
    }
    let det = Detector::load(shipped(), Device::Cpu).unwrap();
    assert!(!det.detect_file(&good).unwrap().is_empty());
    #[cfg(not(feature = "cuda"))]
    match yolo9::device::select(yolo9::device::DeviceSpec::Cuda(0)) {
        Err(Error::Device(m)) => assert!(m.contains("--features cuda"), "{m}"),
        other => panic!("expected Error::Device, got {other:?}"),
    }
}

#[test]
fn an_out_of_memory_training_run_is_an_out_of_memory_error() {
    use yolo9::internals::train::guard::Faults;
    use yolo9::train::trainer::train;
    let dir = common::tmpdir("liberr-oom");
    let mut o = common::tiny_run_options(&dir, "exp");
    o.epochs = 1;
    // Every micro-batch (even of one image) runs out of memory after its forward pass: the
    // recovery halves down to 1 and then gives up with the typed error.
    o.faults = Faults {
        oom_above: Some(0),
        ..Faults::default()
    };
    match train(&o) {
        Err(e @ Error::OutOfMemory(_)) => {
            let m = e.to_string();
            assert!(m.contains("micro-batch of 1"), "{m}");
            assert!(e.is_out_of_memory());
        }
        other => panic!(
            "expected Error::OutOfMemory, got {:?}",
            other.map(|s| s.epochs.len())
        ),
    }
}
