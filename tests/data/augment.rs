//! Augmentation: geometry and colour against hand-computed cases.
use image::{Rgb, RgbImage};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use yolo9::boxes::{xywhn_to_xyxy, xyxy_to_xywhn};
use yolo9::internals::data::augment::*;
use yolo9::internals::data::warp::PAD_GREY;

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
        outlines: Vec::new(),
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
            outlines: Vec::new(),
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

/// A deterministic textured image: gradients, hard edges and noise (every grey level occurs).
fn textured(w: u32, h: u32, seed: u64) -> RgbImage {
    use rand::Rng;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    RgbImage::from_fn(w, h, |x, y| {
        let n: u8 = rng.random();
        let edge = if (x / 7 + y / 5) % 2 == 0 { 255 } else { 0 };
        Rgb([
            ((x * 255) / w.max(1)) as u8,
            edge,
            n.wrapping_add((y * 3) as u8),
        ])
    })
}

fn labelled(w: u32, h: u32, seed: u64) -> SourceImage {
    SourceImage {
        image: textured(w, h, seed),
        labels: vec![
            (seed as u32 % 3, [0.5, 0.5, 0.4, 0.3]),
            (1, [0.2, 0.7, 0.1, 0.2]),
            (2, [0.9, 0.1, 0.15, 0.15]),
        ],
        outlines: Vec::new(),
    }
}

/// Largest per-byte difference and the number of differing bytes.
fn diff(a: &RgbImage, b: &RgbImage) -> (u8, usize) {
    assert_eq!(a.dimensions(), b.dimensions());
    let mut max = 0;
    let mut n = 0;
    for (x, y) in a.as_raw().iter().zip(b.as_raw()) {
        let d = x.abs_diff(*y);
        max = max.max(d);
        n += (d > 0) as usize;
    }
    (max, n)
}

/// The one-pass warp (`warp_tiles`) against the f64 reference (`mosaic4` canvas +
/// `warp_affine`) on fixed seeds: tiles of mixed sizes (grey gaps and seams), scales from 0.1
/// to 1.9, translations, and rotation/shear: at most 1 grey level everywhere.
#[test]
fn fast_mosaic_warp_matches_f64_reference() {
    use rand::Rng;
    use yolo9::internals::data::warp::{mosaic_placements, warp_tiles, CanvasTile};
    let s = 96u32;
    let mut worst = 0u8;
    let (mut differing, mut total) = (0usize, 0usize);
    for seed in 0..40u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let sizes = [(96, 72), (60, 96), (96, 96), (33, 17)];
        let imgs: Vec<SourceImage> = (0..4)
            .map(|k| {
                let (w, h) = sizes[(k + seed as usize) % 4];
                labelled(w, h, seed * 4 + k as u64)
            })
            .collect();
        let refs = [&imgs[0], &imgs[1], &imgs[2], &imgs[3]];
        let centre = (
            rng.random_range(48..144) as i64,
            rng.random_range(48..144) as i64,
        );
        let cfg = AugmentConfig {
            degrees: if seed % 3 == 0 { 30.0 } else { 0.0 },
            shear: if seed % 5 == 0 { 10.0 } else { 0.0 },
            ..Default::default()
        };
        let (m, _) = random_affine(&cfg, 2 * s, 2 * s, -(s as i64) / 2, &mut rng);
        let (canvas, _) = mosaic4(refs, s, centre);
        let reference = warp_affine(&canvas, &m, s, s);
        let places = mosaic_placements(refs.map(|i| i.image.dimensions()), s, centre);
        let tiles: [CanvasTile; 4] = std::array::from_fn(|k| CanvasTile {
            image: &refs[k].image,
            place: places[k],
        });
        let mut fast = RgbImage::new(s, s);
        warp_tiles(&tiles, &m, &mut fast);
        let (d, n) = diff(&fast, &reference);
        worst = worst.max(d);
        differing += n;
        total += fast.as_raw().len();
        assert!(d <= 1, "seed {seed}: max difference {d} grey levels");
    }
    // Most bytes are identical; the rest differ by the fixed-point rounding only.
    assert!(
        differing * 20 < total,
        "{differing} of {total} bytes differ"
    );
    eprintln!("fast warp vs f64: max {worst} level, {differing}/{total} bytes differ");
}

/// Near-degenerate and degenerate affines: the fixed-point range guard falls back to f64 and
/// matches the reference; a singular matrix gives grey; nothing panics.
#[test]
fn fast_warp_degenerate_affines() {
    use yolo9::internals::data::warp::{warp_tiles, CanvasTile, Placement};
    let img = textured(40, 30, 3);
    let tile = CanvasTile {
        image: &img,
        place: Placement {
            canvas: [5, 5, 45, 35],
            src: [0, 0],
        },
    };
    for m in [
        [[1e-7, 0.0, 10.0], [0.0, 1e-7, 10.0]],
        [[0.0, 0.0, 3.0], [0.0, 0.0, 1.0]],
        [[-1.0, 0.0, 40.0], [0.0, -1.0, 40.0]],
    ] {
        let mut canvas = RgbImage::from_pixel(60, 60, Rgb([PAD_GREY; 3]));
        image::imageops::overlay(&mut canvas, &img, 5, 5);
        let reference = warp_affine(&canvas, &m, 50, 50);
        let mut fast = RgbImage::new(50, 50);
        warp_tiles(&[tile], &m, &mut fast);
        assert!(diff(&fast, &reference).0 <= 1, "{m:?}");
    }
    // A non-finite matrix gives grey (the reference turns NaN into 0s).
    let mut out = RgbImage::new(50, 50);
    warp_tiles(&[tile], &[[1.0, 0.0, f64::NAN], [0.0, 1.0, 0.0]], &mut out);
    assert!(out.as_raw().iter().all(|&v| v == PAD_GREY));
    // A placement reaching outside its image is clipped, not read out of bounds.
    let bad = CanvasTile {
        image: &img,
        place: Placement {
            canvas: [-100, -100, 500, 500],
            src: [7, 7],
        },
    };
    let mut out = RgbImage::new(32, 32);
    warp_tiles(&[bad], &[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], &mut out);
}

/// The integer HSV conversions equal the f64 ones for every input.
#[test]
fn integer_hsv_equals_f64_everywhere() {
    for r in 0..=255u8 {
        for g in 0..=255u8 {
            for b in 0..=255u8 {
                let p = [r, g, b];
                assert_eq!(rgb_to_hsv8_int(p), rgb_to_hsv8(p), "{p:?}");
            }
        }
    }
    for h in 0..=255u8 {
        for s in 0..=255u8 {
            for v in 0..=255u8 {
                let p = [h, s, v];
                assert_eq!(hsv8_to_rgb_int(p), hsv8_to_rgb(p), "{p:?}");
            }
        }
    }
}

#[test]
fn lut_hsv_equals_reference() {
    for seed in 0..5 {
        let mut img = textured(64, 48, seed);
        // Runs of one colour (the fast path reuses the last result there).
        for x in 0..40 {
            img.put_pixel(x, 7, Rgb([PAD_GREY; 3]));
            img.put_pixel(x, 9, Rgb([200, 30, 90]));
        }
        let (mut a, mut b) = (img.clone(), img);
        augment_hsv(
            &mut a,
            0.015,
            0.7,
            0.4,
            &mut ChaCha8Rng::seed_from_u64(seed),
        );
        augment_hsv_reference(
            &mut b,
            0.015,
            0.7,
            0.4,
            &mut ChaCha8Rng::seed_from_u64(seed),
        );
        assert_eq!(a, b);
    }
}

/// Whole samples (mosaic, mixup, letterbox, flips) against the reference path on fixed seeds:
/// the same labels exactly; without HSV every pixel within 1 grey level; with HSV (which maps a
/// 1-level input difference through the 8-bit HSV round trip) nearly all bytes equal.
#[test]
fn augment_sample_matches_reference() {
    let s = 64;
    let data: Vec<SourceImage> = (0..6)
        .map(|i| {
            let (w, h) = [(64, 48), (48, 64), (64, 64)][i % 3];
            labelled(w, h, i as u64)
        })
        .collect();
    let load = |i: usize| data.get(i).cloned();
    for (mosaic, hsv) in [(1.0, false), (0.0, false), (1.0, true), (0.0, true)] {
        let cfg = AugmentConfig {
            mosaic,
            mixup: 0.5,
            hsv_h: if hsv { 0.015 } else { 0.0 },
            hsv_s: if hsv { 0.7 } else { 0.0 },
            hsv_v: if hsv { 0.4 } else { 0.0 },
            ..Default::default()
        };
        let (mut differing, mut total, mut worst) = (0, 0, 0);
        for seed in 0..24u64 {
            let i = seed as usize % data.len();
            let mut r1 = ChaCha8Rng::seed_from_u64(seed);
            let mut r2 = ChaCha8Rng::seed_from_u64(seed);
            let a = augment_sample(&cfg, s, i, data.len(), &load, &mut r1).unwrap();
            let b = augment_sample_reference(&cfg, s, i, data.len(), &load, &mut r2).unwrap();
            assert_eq!(a.labels, b.labels, "seed {seed}");
            let (d, n) = diff(&a.image, &b.image);
            if !hsv {
                assert!(d <= 1, "seed {seed} mosaic {mosaic}: {d} levels");
            }
            worst = worst.max(d);
            differing += n;
            total += a.image.as_raw().len();
        }
        assert!(
            differing * 20 < total,
            "{differing} of {total} bytes differ"
        );
        eprintln!("mosaic {mosaic} hsv {hsv}: max {worst}, {differing}/{total} bytes differ");
    }
}

#[test]
fn outline_resampling_and_boxes_as_official() {
    // numpy: resample_segments([[[0,0],[4,0],[4,3]]], n=7)
    let got = resample_outline(&[[0.0, 0.0], [4.0, 0.0], [4.0, 3.0]], 7);
    let want = [
        [0.0, 0.0],
        [2.0, 0.0],
        [4.0, 0.0],
        [4.0, 1.5],
        [4.0, 3.0],
        [2.0, 1.5],
        [0.0, 0.0],
    ];
    assert_eq!(got.len(), 7);
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g[0] - w[0]).abs() < 1e-12 && (g[1] - w[1]).abs() < 1e-12,
            "{got:?}"
        );
    }
    // segment2box: only the points inside [0, 6]² count; none with x != 0 gives zeros.
    let pts = [[-1.0, 2.0], [3.0, 5.0], [7.0, 1.0], [2.5, -3.0]];
    assert_eq!(outline_box(&pts, 6.0, 6.0), [3.0, 5.0, 3.0, 5.0]);
    assert_eq!(
        outline_box(&[[0.0, 2.0], [0.0, 5.0], [-7.0, 1.0]], 6.0, 6.0),
        [0.0; 4]
    );
}

/// A disk of `r` pixels around `(cx, cy)` as a 24-point outline, normalized to `w × h`.
fn disk(cx: f32, cy: f32, r: f32, w: f32, h: f32) -> Vec<[f32; 2]> {
    (0..24)
        .map(|k| {
            let a = k as f32 / 24.0 * std::f32::consts::TAU;
            [(cx + r * a.cos()) / w, (cy + r * a.sin()) / h]
        })
        .collect()
}

/// An image with two filled disks, colour `COLOURS[cls]`, labelled with their outlines.
fn with_disks(w: u32, h: u32, seed: u64) -> SourceImage {
    let mut image = RgbImage::from_pixel(w, h, Rgb([60, 60, 60]));
    let (wf, hf) = (w as f32, h as f32);
    let disks = [
        (0u32, wf * 0.3, hf * 0.35, wf.min(hf) * 0.2),
        (
            1 + (seed % 2) as u32,
            wf * 0.68,
            hf * 0.62,
            wf.min(hf) * 0.25,
        ),
    ];
    let mut labels = Vec::new();
    let mut outlines = Vec::new();
    for (cls, cx, cy, r) in disks {
        for y in 0..h {
            for x in 0..w {
                let (dx, dy) = (x as f32 + 0.5 - cx, y as f32 + 0.5 - cy);
                if dx * dx + dy * dy <= r * r {
                    image.put_pixel(x, y, Rgb(COLOURS[cls as usize]));
                }
            }
        }
        labels.push((cls, [cx / wf, cy / hf, 2.0 * r / wf, 2.0 * r / hf]));
        outlines.push(disk(cx, cy, r, wf, hf));
    }
    SourceImage {
        image,
        labels,
        outlines,
    }
}

const COLOURS: [[u8; 3]; 3] = [[230, 20, 20], [20, 220, 30], [30, 40, 240]];

/// The class whose colour is nearest `p` (`None`: nearer the background or the padding grey).
fn nearest(p: [u8; 3]) -> Option<usize> {
    let d = |c: [u8; 3]| -> i32 { (0..3).map(|i| (p[i] as i32 - c[i] as i32).pow(2)).sum() };
    let bg = d([60; 3]).min(d([PAD_GREY; 3]));
    (0..3)
        .min_by_key(|&k| d(COLOURS[k]))
        .filter(|&k| d(COLOURS[k]) < bg)
}

#[test]
fn outlines_follow_the_pixels_through_mosaic_affine_and_flips() {
    let s = 128u32;
    let data: Vec<SourceImage> = (0..6)
        .map(|i| {
            let src = with_disks(160 + 16 * i as u32, 120, i);
            SourceImage {
                image: resize_long_side(&src.image, s),
                ..src
            }
        })
        .collect();
    let load = |i: usize| Some(data[i].clone());
    let cfg = AugmentConfig {
        hsv_h: 0.0,
        hsv_s: 0.0,
        hsv_v: 0.0,
        mixup: 0.0,
        flipud: 0.5,
        degrees: 10.0,
        ..AugmentConfig::default()
    };
    let (mut agree, mut total, mut objects, mut flips) = (0usize, 0usize, 0usize, [0usize; 2]);
    for seed in 0..24u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = augment_sample(&cfg, s, seed as usize % 6, 6, &load, &mut rng).unwrap();
        assert_eq!(a.outlines.len(), a.labels.len(), "one outline per label");
        flips[0] += a.flipped[0] as usize;
        flips[1] += a.flipped[1] as usize;
        let (mask, order) = a.overlap_mask(4);
        let m = (s / 4) as usize;
        assert_eq!(mask.len(), m * m);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..a.labels.len()).collect::<Vec<_>>());
        objects += a.labels.len();
        for my in 0..m {
            for mx in 0..m {
                let v = mask[my * m + mx] as usize;
                // Interior mask pixels: the edges blend colours (bilinear resize and warp).
                let interior = my > 0
                    && mx > 0
                    && my + 1 < m
                    && mx + 1 < m
                    && [(0, 1), (2, 1), (1, 0), (1, 2)]
                        .iter()
                        .all(|&(dx, dy)| mask[(my + dy - 1) * m + mx + dx - 1] as usize == v);
                if v == 0 || !interior {
                    continue;
                }
                assert!(v <= order.len());
                let (cls, b) = a.labels[order[v - 1]];
                let p = a.image.get_pixel(4 * mx as u32 + 2, 4 * my as u32 + 2).0;
                total += 1;
                agree += usize::from(nearest(p) == Some(cls as usize));
                // The pixel lies in its object's (flipped) box, within a mask pixel.
                let [x1, y1, x2, y2] = xywhn_to_xyxy(&b, s as f32, s as f32, 0.0, 0.0);
                let (px, py) = (4.0 * mx as f32 + 2.0, 4.0 * my as f32 + 2.0);
                assert!(px > x1 - 4.0 && px < x2 + 4.0 && py > y1 - 4.0 && py < y2 + 4.0);
            }
        }
    }
    println!("{agree} of {total} mask pixels show their object's colour ({objects} objects)");
    assert!(objects > 24 && total > 1000);
    assert!(flips[0] > 0 && flips[1] > 0 && flips[0] < 24 && flips[1] < 24);
    assert!(agree as f64 > 0.99 * total as f64);
    // Mixup concatenates the outlines of both mosaics with their labels.
    let cfg = AugmentConfig { mixup: 1.0, ..cfg };
    let mut most = 0;
    for seed in 0..8u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = augment_sample(&cfg, s, 0, 6, &load, &mut rng).unwrap();
        assert_eq!(a.outlines.len(), a.labels.len());
        most = most.max(a.labels.len());
    }
    assert!(most > 8, "two mosaics' objects: {most}");
}

#[test]
fn letterboxed_outline_with_identity_affine_is_flipped_with_the_mask() {
    let src = with_disks(64, 64, 0);
    let cfg = AugmentConfig {
        hsv_h: 0.0,
        hsv_s: 0.0,
        hsv_v: 0.0,
        mosaic: 0.0,
        scale: 0.0,
        translate: 0.0,
        fliplr: 1.0,
        ..AugmentConfig::default()
    };
    let load = |_: usize| Some(src.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let a = augment_sample(&cfg, 64, 0, 1, &load, &mut rng).unwrap();
    assert_eq!(a.flipped, [false, true]);
    // The identity affine: the outlines are the source's in pixels, resampled.
    let first: Vec<[f64; 2]> = src.outlines[0]
        .iter()
        .map(|p| [f64::from(p[0] * 64.0), f64::from(p[1] * 64.0)])
        .collect();
    let want = resample_outline(&first, OUTLINE_POINTS);
    for (g, w) in a.outlines[0].iter().zip(&want) {
        assert!((g[0] - w[0]).abs() < 1e-9 && (g[1] - w[1]).abs() < 1e-9);
    }
    let (mask, order) = a.overlap_mask(1);
    assert_eq!(order, vec![1, 0], "the larger disk first");
    let unflipped = yolo9::internals::data::polygons::polygon_mask(&want, 64, 64, 1);
    for y in 0..64 {
        for x in 0..64 {
            let m = mask[y * 64 + 63 - x] == 2;
            assert_eq!(m, unflipped[y * 64 + x] == 1, "pixel ({x}, {y})");
        }
    }
    // The small disk (cx 0.3 · 64, r 12.8) moved to 1 − 0.3 by the flip.
    let l = a.labels[0].1;
    assert!(
        (l[0] - 0.7).abs() < 0.01 && (l[2] - 0.4).abs() < 0.02,
        "{l:?}"
    );
}
