//! Sliced inference (`yolo9::detect::tile`, `--tile`) with the built-in BCCD weights on the CPU:
//! an image no larger than a tile is detected exactly as without tiles; on a large image made
//! of 2x2 BCCD test images (`yolo9::internals::data::compose`, 1280x960) the tiles find the cells that one
//! 640-px letterbox of the whole image shrinks away (mAP50 against the composed labels, 66
//! boxes: 0.589 whole, 0.716 with tiles of 640; about 25 s); the
//! command line reports the tiles and refuses bad values.
use crate::common;

use candle_core::Device;
use yolo9::detect::tile::TileOptions;
use yolo9::internals::data::scan::{scan_split, ScanOptions};
use yolo9::internals::data::yaml::{DataConfig, Split};
use yolo9::metrics::validate::{val_images, validate, validate_tiled, ValConfig, ValModel};
use yolo9::{Detector, DetectorConfig, Weights};

fn tiled(size: u32) -> TileOptions {
    TileOptions {
        size,
        ..TileOptions::default()
    }
}

#[test]
fn a_tile_as_large_as_the_image_changes_nothing() {
    let w = Weights::builtin().unwrap();
    let config = DetectorConfig {
        img_size: 320,
        ..DetectorConfig::default()
    };
    let plain = Detector::with_weights(&w, Device::Cpu, config.clone()).unwrap();
    let with_tiles = Detector::with_weights(
        &w,
        Device::Cpu,
        DetectorConfig {
            tile: tiled(640),
            ..config
        },
    )
    .unwrap();
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/images/BloodImage_00007.jpg"
    );
    let img = yolo9::data::image::load_rgb8(std::path::Path::new(p)).unwrap();
    assert!(img.width() <= 640 && img.height() <= 640);
    let a = plain.detect_rgb(&img).unwrap();
    assert!(!a.is_empty());
    assert_eq!(with_tiles.detect_rgb(&img).unwrap(), a);
    assert_eq!(plain.detect_tiled(&img, &tiled(640)).unwrap(), a);
    // Bad tile options are refused when the detector is built.
    let e = Detector::with_weights(
        &w,
        Device::Cpu,
        DetectorConfig {
            tile: TileOptions {
                overlap: 0.95,
                ..tiled(640)
            },
            ..DetectorConfig::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("tile overlap 0.95"), "{e}");
}

#[test]
fn tiles_find_the_cells_of_a_large_image() {
    let dir = common::tmpdir("tiles");
    let data = common::shared_dir().join("datasets/bccd/data.yaml");
    let c = yolo9::internals::data::compose::compose(&data, Split::Test, &dir, 2, Some(1)).unwrap();
    assert_eq!((c.images, c.size), (1, (1280, 960)));
    let cfg = DataConfig::load(&dir.join("data.yaml")).unwrap();
    let scan = scan_split(&cfg, Split::Test, &ScanOptions::default()).unwrap();
    let images = val_images(&scan);
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].labels.len(), c.boxes);
    let w = Weights::builtin().unwrap();
    let model = yolo9::internals::model::yolov9::YoloV9::load(&w, &Device::Cpu)
        .unwrap()
        .for_validation();
    let vc = ValConfig::default();
    let plain = validate(ValModel::Infer(&model), &images, &vc).unwrap();
    let detector = Detector::from_model(model, Device::Cpu)
        .with_config(DetectorConfig {
            img_size: 640,
            conf: vc.conf_thres,
            iou: vc.iou_thres as f64,
            max_det: vc.max_det,
            multi_label: true,
            tile: tiled(640),
            ..DetectorConfig::default()
        })
        .unwrap();
    let t = validate_tiled(&detector, &images, &vc).unwrap();
    let (m0, m1) = (plain.metrics.map50, t.metrics.map50);
    println!(
        "1280x960, {} boxes: mAP50 whole image {m0:.4}, tiles of 640 {m1:.4}",
        c.boxes
    );
    // Measured: 0.589 whole, 0.716 with tiles.
    assert!(m1 > m0 + 0.08, "whole {m0}, tiles {m1}");
}

#[test]
fn command_line_tiles() {
    let dir = common::tmpdir("tiles-cli");
    let data = common::shared_dir().join("datasets/bccd/data.yaml");
    yolo9::internals::data::compose::compose(&data, Split::Test, &dir, 2, Some(1)).unwrap();
    let img = dir.join("images/test/large_000.jpg");
    let project = dir.join("runs");
    let (code, out, err) = common::yolo9(&[
        "detect",
        img.to_str().unwrap(),
        "--tile",
        "640",
        "--nosave",
        "--project",
        project.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    // 1280x960: tile starts x 0, 512, 640 and y 0, 320.
    assert!(out.contains("1280x960 in 6 tiles of 640"), "{out}");
    for (flag, value) in [
        ("--tile", "16"),
        ("--tile-overlap", "0.95"),
        ("--tile-match", "2"),
    ] {
        let (code, _, err) = common::yolo9(&["detect", img.to_str().unwrap(), flag, value]);
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(flag), "{err}");
    }
}
