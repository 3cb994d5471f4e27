//! `load_rgb8` on the bad-input cases of ../shared/cases (colour modes, 16-bit, CMYK, EXIF,
//! extensions, unicode paths, odd sizes, mixed directories) and hand-made orientation cases.
use crate::common;

use common::png_header;

use image::RgbImage;
use std::path::{Path, PathBuf};
use yolo9::data::image::{apply_exif_orientation, decode_rgb8, load_rgb8};
use yolo9::detect::source::expand_sources;

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// (mean, max) absolute difference per channel sample, in levels.
fn diff(a: &RgbImage, b: &RgbImage) -> (f64, u8) {
    assert_eq!(a.dimensions(), b.dimensions());
    let mut sum = 0u64;
    let mut max = 0u8;
    for (x, y) in a.as_raw().iter().zip(b.as_raw()) {
        let d = x.abs_diff(*y);
        sum += u64::from(d);
        max = max.max(d);
    }
    (sum as f64 / a.as_raw().len() as f64, max)
}

#[test]
fn png_16bit_matches_reference_within_one_level() {
    let c = common::case("png_16bit");
    for split in ["train", "val"] {
        for p in files(&c.join("images").join(split)) {
            let name = p.file_name().unwrap();
            let r = c.join("reference").join(name);
            let got = load_rgb8(&p).unwrap();
            if !r.exists() {
                continue; // rgb8_003.png has no reference (plain 8-bit)
            }
            let want = load_rgb8(&r).unwrap();
            let (mean, max) = diff(&got, &want);
            println!("{}: mean {mean:.3} max {max}", p.display());
            assert!(max <= 1, "{}: max diff {max} levels", p.display());
        }
    }
}

#[test]
fn cmyk_jpeg_not_inverted() {
    let c = common::case("cmyk_jpeg");
    let mut n = 0;
    for split in ["train", "val"] {
        for p in files(&c.join("images").join(split)) {
            let stem = p.file_stem().unwrap().to_str().unwrap().to_string();
            let r = c.join("reference").join(format!("{stem}.png"));
            let got = load_rgb8(&p).unwrap();
            if r.exists() {
                let want = load_rgb8(&r).unwrap();
                let (mean, max) = diff(&got, &want);
                println!("{}: mean {mean:.3} max {max}", p.display());
                assert!(mean < 4.0, "{}: mean abs diff {mean}", p.display());
                n += 1;
            }
        }
    }
    assert_eq!(n, 3);
}

#[test]
fn exif_orientation_applied() {
    let c = common::case("exif_orientation");
    for (img, r) in [
        ("train/exif6_000.jpg", "exif6_000_upright.jpg"),
        ("train/exif6_001.jpg", "exif6_001_upright.jpg"),
        ("val/exif6_100.jpg", "exif6_100_upright.jpg"),
    ] {
        let got = load_rgb8(&c.join("images").join(img)).unwrap();
        assert_eq!(got.dimensions(), (240, 320), "{img}: portrait after EXIF 6");
        let want = load_rgb8(&c.join("reference").join(r)).unwrap();
        let (mean, max) = diff(&got, &want);
        println!("{img}: mean {mean:.3} max {max} vs upright reference");
        assert!(mean < 3.0, "{img}: mean diff {mean}");
    }
    let plain = load_rgb8(&c.join("images/val/plain_101.jpg")).unwrap();
    assert!(plain.width() > 0);
}

#[test]
fn all_eight_orientations_hand_computed() {
    // Stored 3x2 image with pixels a b c / d e f (values 1..6 in the red channel).
    let stored = RgbImage::from_fn(3, 2, |x, y| image::Rgb([(1 + x + 3 * y) as u8, 0, 0]));
    type Layout = (u32, u32, Vec<u8>);
    let red = |img: &RgbImage| -> Layout {
        (
            img.width(),
            img.height(),
            img.pixels().map(|p| p.0[0]).collect(),
        )
    };
    let expect: [(u8, Layout); 8] = [
        (1, (3, 2, vec![1, 2, 3, 4, 5, 6])),
        (2, (3, 2, vec![3, 2, 1, 6, 5, 4])),
        (3, (3, 2, vec![6, 5, 4, 3, 2, 1])),
        (4, (3, 2, vec![4, 5, 6, 1, 2, 3])),
        (5, (2, 3, vec![1, 4, 2, 5, 3, 6])),
        (6, (2, 3, vec![4, 1, 5, 2, 6, 3])),
        (7, (2, 3, vec![6, 3, 5, 2, 4, 1])),
        (8, (2, 3, vec![3, 6, 2, 5, 1, 4])),
    ];
    for (tag, want) in expect {
        let mut img = stored.clone();
        apply_exif_orientation(&mut img, tag);
        assert_eq!(red(&img), want, "orientation {tag}");
    }
    let mut img = stored.clone();
    apply_exif_orientation(&mut img, 0);
    assert_eq!(img, stored);
}

#[test]
fn color_modes_all_three_channel_alpha_dropped() {
    let c = common::case("color_modes_mixed");
    let mut n = 0;
    for split in ["train", "val"] {
        for p in files(&c.join("images").join(split)) {
            let img = load_rgb8(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
            assert!(img.width() > 0 && img.height() > 0);
            let name = p.file_name().unwrap().to_str().unwrap();
            if name.starts_with("gray") {
                assert!(img.pixels().all(|q| q.0[0] == q.0[1] && q.0[1] == q.0[2]));
            }
            if name.starts_with("rgba_clear_bg") {
                // Transparent background stored as black: alpha is dropped, black stays.
                assert_eq!(img.get_pixel(0, 0).0, [0, 0, 0], "{name}");
            }
            n += 1;
        }
    }
    assert_eq!(n, 7);
}

#[test]
fn extensions_case_and_content_mismatch() {
    let c = common::case("extensions_case_and_mismatch");
    let mut n = 0;
    for split in ["train", "val"] {
        for p in files(&c.join("images").join(split)) {
            load_rgb8(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
            n += 1;
        }
    }
    assert_eq!(n, 9);
}

#[test]
fn paths_with_spaces_and_unicode() {
    let c = common::case("paths_spaces_unicode").join("data set ünï 数据/images");
    let mut n = 0;
    for split in ["train", "val"] {
        for p in files(&c.join(split)) {
            load_rgb8(&p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
            n += 1;
        }
    }
    assert_eq!(n, 6);
    let e = load_rgb8(&c.join("val/missing ñ.jpg")).unwrap_err();
    assert!(format!("{e:#}").contains("missing ñ.jpg"), "{e:#}");
}

#[test]
fn dir_mixed_files_sources_and_reasons() {
    let c = common::case("detect_dir_mixed_files").join("inputs");
    let s = expand_sources(std::slice::from_ref(&c)).unwrap();
    let names: Vec<String> = s
        .files
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert!(!names.contains(&".hidden.jpg".to_string()));
    assert_eq!(s.skipped.len(), 1, "{:?}", s.skipped);
    assert!(s.skipped[0].0.ends_with("sub"));
    assert_eq!(names.len(), 11, "{names:?}");
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for p in &s.files {
        let n = p.file_name().unwrap().to_str().unwrap().to_string();
        match load_rgb8(p) {
            Ok(_) => ok.push(n),
            Err(e) => {
                let msg = format!("{e:#}");
                assert!(msg.contains(&n), "error must name the file: {msg}");
                bad.push((n, msg));
            }
        }
    }
    ok.sort();
    assert_eq!(
        ok,
        [
            "UPPER.JPG",
            "a.jpg",
            "b.png",
            "c.bmp",
            "d.webp",
            "e_two_pages.tif",
            "f_anim.gif",
            "png_named.jpg"
        ]
    );
    for (n, msg) in &bad {
        println!("{n}: {msg}");
        match n.as_str() {
            "empty.jpg" => assert!(msg.contains("empty")),
            "notes.txt" | "clip.mp4" => assert!(msg.contains("not a recognised image")),
            other => panic!("unexpected failure {other}: {msg}"),
        }
    }
    assert_eq!(bad.len(), 3);
    // A glob recurses with **.
    let g = expand_sources(&[c.join("**").join("*.jpg")]).unwrap();
    assert!(g.files.iter().any(|p| p.ends_with("sub/nested.jpg")));
    // Nothing found is an error naming the source.
    let e = expand_sources(&[c.join("nope-*.xyz")]).unwrap_err();
    assert!(format!("{e:#}").contains("nope-"));
}

#[test]
fn odd_small_sizes_decode() {
    let c = common::case("detect_odd_sizes").join("images");
    for (f, w, h) in [
        ("px_1x1.png", 1, 1),
        ("px_9x9.png", 9, 9),
        ("odd_33x17.jpg", 33, 17),
        ("odd_641x479.jpg", 641, 479),
        ("strip_4000x20.png", 4000, 20),
        ("strip_20x4000.png", 20, 4000),
    ] {
        let img = load_rgb8(&c.join(f)).unwrap();
        assert_eq!(img.dimensions(), (w, h), "{f}");
    }
}

#[test]
fn huge_png_decodes_within_the_guard() {
    let p = common::case("detect_odd_sizes").join("images/huge_12000x9000.png");
    let img = load_rgb8(&p).unwrap();
    assert_eq!(img.dimensions(), (12000, 9000));
}

#[test]
fn truncated_jpeg_does_not_panic() {
    let c = common::case("truncated_jpeg").join("images");
    for p in [c.join("train/img_002.jpg"), c.join("val/img_101.jpg")] {
        match load_rgb8(&p) {
            Ok(img) => assert!(img.width() > 0),
            Err(e) => assert!(format!("{e:#}").contains("img_")),
        }
    }
}

#[test]
fn decoding_bomb_guard() {
    for (w, h) in [(40_000, 100), (20_000, 20_000)] {
        let e = decode_rgb8(&png_header(w, h, 8, 2)).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("decoding-bomb guard"), "{w}x{h}: {msg}");
    }
    // A small header with no data is a truncation error, not a panic.
    let e = decode_rgb8(&png_header(10, 10, 8, 2)).unwrap_err();
    println!("{e:#}");
    assert!(decode_rgb8(&[]).is_err());
    assert!(decode_rgb8(b"hello world").is_err());
}
