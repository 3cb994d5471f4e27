//! Augmentation: geometry and colour against hand-computed cases.
use image::{Rgb, RgbImage};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use yolo9::data::augment::*;

/// A grey image with one coloured rectangle [x1,y1,x2,y2) and its label.
fn with_box(w: u32, h: u32, b: [u32; 4], color: [u8; 3], cls: u32) -> SourceImage {
    let mut image = RgbImage::from_pixel(w, h, Rgb([40, 40, 40]));
    for y in b[1]..b[3] {
        for x in b[0]..b[2] {
            image.put_pixel(x, y, Rgb(color));
        }
    }
    let (wf, hf) = (w as f32, h as f32);
    let l = [
        (b[0] + b[2]) as f32 / 2.0 / wf,
        (b[1] + b[3]) as f32 / 2.0 / hf,
        (b[2] - b[0]) as f32 / wf,
        (b[3] - b[1]) as f32 / hf,
    ];
    SourceImage {
        image,
        labels: vec![(cls, l)],
    }
}

#[test]
fn hsv_conversion_round_trips() {
    for r in (0..=255).step_by(15) {
        for g in (0..=255).step_by(17) {
            for b in (0..=255).step_by(51) {
                let back = hsv8_to_rgb(rgb_to_hsv8([r as u8, g as u8, b as u8]));
                for (x, y) in back.iter().zip([r, g, b]) {
                    // 8-bit HSV quantizes hue to 2 degrees: a few levels of error, as OpenCV.
                    assert!((*x as i32 - y).abs() <= 6, "{r},{g},{b} -> {back:?}");
                }
            }
        }
    }
    assert_eq!(rgb_to_hsv8([255, 0, 0]), [0, 255, 255]);
    assert_eq!(rgb_to_hsv8([0, 255, 0]), [60, 255, 255]);
    assert_eq!(rgb_to_hsv8([0, 0, 255]), [120, 255, 255]);
    assert_eq!(rgb_to_hsv8([114, 114, 114]), [0, 0, 114]);
}

#[test]
fn box_candidates_official_rules() {
    let b = [0.0, 0.0, 100.0, 100.0];
    assert!(box_candidates(&b, &[0.0, 0.0, 50.0, 50.0], 0.1)); // area ratio 0.25
    assert!(!box_candidates(&b, &[0.0, 0.0, 30.0, 30.0], 0.1)); // 0.09
    assert!(!box_candidates(&b, &[0.0, 0.0, 2.0, 90.0], 0.1)); // width not > 2 px
    assert!(!box_candidates(
        &[0.0, 0.0, 1.0, 1.0],
        &[0.0, 0.0, 300.0, 2.5],
        0.1
    )); // height 2.5 ok, ar 120
}

#[test]
fn xyxy_xywhn_round_trip_and_clip() {
    let l = [0.25, 0.5, 0.2, 0.4];
    let b = xywhn_to_xyxy(&l, 200.0, 100.0, 10.0, 0.0);
    for (x, y) in b.iter().zip([40.0, 30.0, 80.0, 70.0]) {
        assert!((x - y).abs() < 1e-4, "{b:?}");
    }
    let back = xyxy_to_xywhn(&[30.0, 30.0, 70.0, 70.0], 200.0, 100.0);
    assert!((back[0] - 0.25).abs() < 1e-6 && (back[3] - 0.4).abs() < 1e-6);
    let clipped = xyxy_to_xywhn(&[-10.0, -5.0, 250.0, 50.0], 200.0, 100.0);
    assert!(clipped[0] - clipped[2] / 2.0 >= 0.0 && clipped[0] + clipped[2] / 2.0 < 1.0);
}

#[test]
fn warp_identity_and_translation() {
    let src = with_box(64, 48, [10, 10, 20, 30], [200, 10, 10], 0);
    let id = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]];
    assert_eq!(warp_affine(&src.image, &id, 64, 48), src.image);
    let t = [[1.0, 0.0, 5.0], [0.0, 1.0, -3.0]];
    let out = warp_affine(&src.image, &t, 64, 48);
    assert_eq!(out.get_pixel(15, 7).0, [200, 10, 10]); // (10,10) moved to (15,7)
    assert_eq!(out.get_pixel(10, 2).0, [40, 40, 40]);
    assert_eq!(out.get_pixel(2, 2).0, [PAD_GREY; 3]); // from x = -3
    assert_eq!(out.get_pixel(63, 47).0, [PAD_GREY; 3]); // from outside the source
    let b = PixelBox {
        cls: 3,
        xyxy: [10.0, 10.0, 20.0, 30.0],
    };
    let moved = warp_boxes(&[b], &t, 1.0, 64, 48);
    assert_eq!(moved[0].xyxy, [15.0, 7.0, 25.0, 27.0]);
    // A box pushed out of the image is dropped.
    let far = [[1.0, 0.0, 60.0], [0.0, 1.0, 0.0]];
    assert!(warp_boxes(&[b], &far, 1.0, 64, 48).is_empty());
}

#[test]
fn mosaic_places_tiles_and_labels() {
    let s = 64;
    let tiles = [
        with_box(64, 64, [8, 8, 24, 24], [255, 0, 0], 0),
        with_box(64, 32, [8, 8, 24, 24], [0, 255, 0], 1),
        with_box(32, 64, [8, 8, 24, 24], [0, 0, 255], 2),
        with_box(64, 64, [40, 40, 56, 56], [255, 255, 0], 0),
    ];
    let (canvas, boxes) = mosaic4([&tiles[0], &tiles[1], &tiles[2], &tiles[3]], s, (64, 64));
    assert_eq!(canvas.dimensions(), (128, 128));
    assert_eq!(boxes.len(), 4);
    // Every label's box centre has its tile's colour on the canvas.
    let colours = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]];
    for (b, c) in boxes.iter().zip(colours) {
        let cx = ((b.xyxy[0] + b.xyxy[2]) / 2.0) as u32;
        let cy = ((b.xyxy[1] + b.xyxy[3]) / 2.0) as u32;
        assert_eq!(canvas.get_pixel(cx, cy).0, c, "{b:?}");
        assert!((b.xyxy[2] - b.xyxy[0] - 16.0).abs() < 1e-4);
    }
    // Tile 0 (64x64) ends exactly at the centre: its box is at [8,8,24,24] shifted by (0,0).
    assert_eq!(boxes[0].xyxy, [8.0, 8.0, 24.0, 24.0]);
    // Tile 3 starts at the centre (64,64).
    assert_eq!(boxes[3].xyxy, [104.0, 104.0, 120.0, 120.0]);
}

#[test]
fn augment_sample_is_seeded_and_labels_valid() {
    let data: Vec<SourceImage> = (0..5)
        .map(|i| with_box(96, 80, [10 + i * 5, 12, 60, 70], [200, 30 * i as u8, 90], i))
        .collect();
    let load = |i: usize| {
        Some(SourceImage {
            image: resize_long_side(&data[i].image, 64),
            labels: data[i].labels.clone(),
        })
    };
    let cfg = AugmentConfig {
        mixup: 0.5,
        ..Default::default()
    };
    let mut total = 0;
    for seed in 0..20u64 {
        let a = augment_sample(
            &cfg,
            64,
            seed as usize % 5,
            5,
            &load,
            &mut ChaCha8Rng::seed_from_u64(seed),
        )
        .unwrap();
        let b = augment_sample(
            &cfg,
            64,
            seed as usize % 5,
            5,
            &load,
            &mut ChaCha8Rng::seed_from_u64(seed),
        )
        .unwrap();
        assert_eq!(a.image, b.image);
        assert_eq!(a.labels, b.labels);
        assert_eq!(a.image.dimensions(), (64, 64));
        for (_, l) in &a.labels {
            assert!(l.iter().all(|v| (0.0..=1.0).contains(v)), "{l:?}");
            assert!(l[0] - l[2] / 2.0 >= -1e-6 && l[0] + l[2] / 2.0 <= 1.0 + 1e-6);
            assert!(l[2] > 2.0 / 64.0 && l[3] > 2.0 / 64.0);
        }
        total += a.labels.len();
    }
    assert!(total > 10, "augmentation kept too few boxes: {total}");
}

#[test]
fn letterbox_square_centres() {
    let src = with_box(100, 50, [0, 0, 100, 50], [9, 9, 9], 0);
    let (img, boxes) = letterbox_square(&src, 64);
    assert_eq!(img.dimensions(), (64, 64));
    // 100x50 -> 64x32, padded 16 top and bottom.
    assert_eq!(boxes[0].xyxy, [0.0, 16.0, 64.0, 48.0]);
    assert_eq!(img.get_pixel(5, 5).0, [PAD_GREY; 3]);
    assert_eq!(img.get_pixel(5, 30).0, [9, 9, 9]);
}
