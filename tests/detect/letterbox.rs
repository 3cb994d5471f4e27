//! Letterbox parity with the official detect pipeline on horses.jpg.
use crate::common;

use candle_core::{Device, Tensor};
use image::RgbImage;
use std::collections::HashMap;
use yolo9::internals::detect::letterbox::{apply_letterbox, letterbox, letterbox_info, to_tensor};

fn oracle() -> HashMap<String, Tensor> {
    let p = common::reference("forward_horses.safetensors");
    candle_core::safetensors::load(&p, &Device::Cpu)
        .unwrap_or_else(|e| panic!("cannot load {}: {e}", p.display()))
}

/// (mean, max) absolute difference in grey levels between our tensor and the oracle `input`.
fn level_diff(ours: &Tensor, want: &Tensor) -> (f64, f64) {
    let a = ours.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let mut sum = 0f64;
    let mut max = 0f64;
    for (x, y) in a.iter().zip(&b) {
        let d = (f64::from(*x) - f64::from(*y)).abs() * 255.0;
        sum += d;
        max = max.max(d);
    }
    (sum / a.len() as f64, max)
}

#[test]
fn horses_letterbox_matches_official_geometry_and_pixels() {
    let t = oracle();
    let want = &t["input"];
    assert_eq!(want.dims(), &[1, 3, 448, 640]);
    let ratio = t["letterbox_ratio"].to_vec1::<f64>().unwrap();
    let pad = t["letterbox_pad"].to_vec1::<f64>().unwrap();

    let img = yolo9::data::image::load_rgb8(&common::reference("horses.jpg")).unwrap();
    assert_eq!(img.dimensions(), (773, 512));
    let (lb, info) = letterbox(&img, 640, 32).unwrap();
    assert_eq!((info.out_h(), info.out_w()), (448, 640));
    assert_eq!(info.ratio, ratio[0]);
    assert_eq!(info.ratio, ratio[1]);
    assert_eq!(info.pad(), (pad[0], pad[1]));
    assert_eq!((info.top, info.bottom), (12, 12));
    let x = to_tensor(&[&lb], &Device::Cpu).unwrap();
    assert_eq!(x.dims(), want.dims());
    let (mean, max) = level_diff(&x, want);
    println!("horses.jpg (our JPEG decoder + resize) vs oracle input: mean {mean:.3} levels, max {max:.0} levels");
    // libjpeg decoding is bit-exact with OpenCV's; only the resize may differ by one level.
    assert!(max <= 1.0 + 1e-4, "max abs diff {max} levels");
    assert!(mean < 0.05, "mean abs diff {mean} levels");
    // The grey border must be exactly 114 in all channels.
    let border = x
        .narrow(2, 0, 12)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert!(border.iter().all(|&v| v == 114.0 / 255.0));
}

#[test]
fn resize_matches_opencv_on_the_same_decoded_pixels() {
    // Feed the oracle's own decoded pixels (cv2.imread, BGR) to isolate the resize.
    let t = oracle();
    let bgr = t["orig_bgr_u8"]
        .flatten_all()
        .unwrap()
        .to_vec1::<u8>()
        .unwrap();
    let mut rgb = Vec::with_capacity(bgr.len());
    for px in bgr.chunks_exact(3) {
        rgb.extend_from_slice(&[px[2], px[1], px[0]]);
    }
    let img = RgbImage::from_raw(773, 512, rgb).unwrap();
    let info = letterbox_info(773, 512, 640, 640, 32, true).unwrap();
    let lb = apply_letterbox(&img, &info);
    let x = to_tensor(&[&lb], &Device::Cpu).unwrap();
    let (mean, max) = level_diff(&x, &t["input"]);
    println!(
        "resize only (oracle pixels) vs oracle input: mean {mean:.4} levels, max {max:.0} levels"
    );
    assert!(max <= 1.0 + 1e-4, "max abs diff {max} levels");
    assert!(mean < 0.05, "mean abs diff {mean} levels");
}

#[test]
fn tensor_layout_is_nchw_rgb_over_255() {
    let img = RgbImage::from_fn(2, 1, |x, _| image::Rgb([x as u8 * 10 + 1, 128, 255]));
    let x = to_tensor(&[&img, &img], &Device::Cpu).unwrap();
    assert_eq!(x.dims(), &[2, 3, 1, 2]);
    let v = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let e = [1.0, 11.0, 128.0, 128.0, 255.0, 255.0].map(|l: f32| l / 255.0);
    assert_eq!(&v[..6], &e);
    assert_eq!(&v[6..], &e);
    let other = RgbImage::new(3, 1);
    assert!(to_tensor(&[&img, &other], &Device::Cpu).is_err());
    assert!(to_tensor(&[], &Device::Cpu).is_err());
}

#[test]
fn odd_sizes_geometry() {
    for (w, h) in [
        (1, 1),
        (9, 9),
        (33, 17),
        (641, 479),
        (4000, 20),
        (20, 4000),
        (12000, 9000),
    ] {
        let i = letterbox_info(w, h, 640, 640, 32, true).unwrap();
        assert_eq!(i.out_w() % 32, 0, "{w}x{h}");
        assert_eq!(i.out_h() % 32, 0, "{w}x{h}");
        assert!(i.out_w() <= 640 && i.out_h() <= 640 && i.unpad_w >= 1 && i.unpad_h >= 1);
        assert!(i.unpad_w == 640 || i.unpad_h == 640, "{w}x{h}: {i:?}");
    }
    assert!(letterbox_info(0, 5, 640, 640, 32, true).is_err());
    // auto=false pads to the full square.
    let i = letterbox_info(773, 512, 640, 640, 32, false).unwrap();
    assert_eq!(
        (i.out_w(), i.out_h(), i.top, i.bottom),
        (640, 640, 108, 108)
    );
}
