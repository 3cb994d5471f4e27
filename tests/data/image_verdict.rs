//! One judge of "is this image usable": decoding (`yolo9::data::image::decode_rgb8`). The dataset
//! scan (`check`, `train`, `val`: `data::scan::probe_image`) and detect/val/the loader
//! (`load_rgb8`) must give the same verdict on every file. Hostile inputs of the kind built here
//! from real JPEGs (baseline, progressive, CMYK): the complete file, the file without its final
//! end-of-image marker (data complete: usable, same pixels), and the file cut off mid-scan at
//! several points (refused, naming the file and the cut).
use crate::common;

use std::path::{Path, PathBuf};
use yolo9::data::image::{decode_rgb8, load_rgb8};
use yolo9::internals::data::labels::IssueKind;
use yolo9::internals::data::scan::{probe_image, scan_split, ScanOptions};
use yolo9::internals::data::yaml::{DataConfig, Split};

/// A progressive JPEG (mozjpeg) of a real picture.
fn progressive_jpeg() -> Vec<u8> {
    let src = load_rgb8(&bccd_image()).unwrap();
    let (w, h) = src.dimensions();
    let mut c = mozjpeg::Compress::new(mozjpeg::ColorSpace::JCS_RGB);
    c.set_size(w as usize, h as usize);
    c.set_quality(85.0);
    c.set_progressive_mode();
    let mut started = c.start_compress(Vec::new()).unwrap();
    started.write_scanlines(src.as_raw()).unwrap();
    started.finish().unwrap()
}

fn bccd_image() -> PathBuf {
    common::shared_dir().join("datasets/bccd/images/train/BloodImage_00001.jpg")
}

/// `(name, complete JPEG bytes)` of each kind.
fn sources() -> Vec<(&'static str, Vec<u8>)> {
    let cmyk = common::case("cmyk_jpeg").join("images/train/cmyk_000.jpg");
    vec![
        ("baseline", std::fs::read(bccd_image()).unwrap()),
        ("progressive", progressive_jpeg()),
        ("cmyk", std::fs::read(cmyk).unwrap()),
    ]
}

/// The same file without its final `FF D9`.
fn without_eoi(b: &[u8]) -> Vec<u8> {
    assert_eq!(&b[b.len() - 2..], &[0xFF, 0xD9], "source ends with EOI");
    b[..b.len() - 2].to_vec()
}

/// Cut points inside the entropy-coded data: 40 %, 70 % and 40 bytes before the end.
fn cuts(b: &[u8]) -> [usize; 3] {
    [b.len() * 4 / 10, b.len() * 7 / 10, b.len() - 40]
}

#[test]
fn complete_data_without_eoi_is_used_with_the_same_pixels() {
    for (kind, whole) in sources() {
        let full = decode_rgb8(&whole).unwrap();
        let no_eoi = decode_rgb8(&without_eoi(&whole))
            .unwrap_or_else(|e| panic!("{kind}: a JPEG missing only its EOI must decode: {e:#}"));
        assert_eq!(no_eoi.dimensions(), full.dimensions(), "{kind}");
        assert!(
            no_eoi.as_raw() == full.as_raw(),
            "{kind}: pixels differ from the complete file's"
        );
    }
}

#[test]
fn cut_off_mid_scan_is_refused_naming_the_cut() {
    for (kind, whole) in sources() {
        for keep in cuts(&whole) {
            let e = format!("{:#}", decode_rgb8(&whole[..keep]).unwrap_err());
            assert!(!e.contains("  "), "one line of text: {e}");
            assert!(
                e.contains("cut off") && e.contains(&format!("{keep} bytes")),
                "{kind} cut at {keep}/{}: {e}",
                whole.len()
            );
        }
    }
}

/// Every variant written to one dataset: the scan keeps exactly what `load_rgb8` (detect, val,
/// the loader) decodes, and its skips name the file and say "cut off".
#[test]
fn scan_and_detect_agree_on_every_variant() {
    let dir = common::tmpdir("agree");
    let (images, labels) = (dir.join("images/train"), dir.join("labels/train"));
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(&labels).unwrap();
    let mut expect_ok = Vec::new();
    let mut expect_cut = Vec::new();
    for (kind, whole) in sources() {
        let mut files = vec![
            (format!("{kind}_whole.jpg"), whole.clone(), true),
            (format!("{kind}_no_eoi.jpg"), without_eoi(&whole), true),
        ];
        for keep in cuts(&whole) {
            files.push((
                format!("{kind}_cut{keep}.jpg"),
                whole[..keep].to_vec(),
                false,
            ));
        }
        for (name, bytes, ok) in files {
            let p = images.join(&name);
            std::fs::write(&p, &bytes).unwrap();
            std::fs::write(
                labels.join(&name).with_extension("txt"),
                "0 0.5 0.5 0.2 0.2\n",
            )
            .unwrap();
            let (probe, load) = (probe_image(&p), load_rgb8(&p));
            assert_eq!(probe.is_ok(), ok, "{name}: scan verdict {probe:?}");
            assert_eq!(load.is_ok(), ok, "{name}: detect verdict");
            if let (Ok(a), Ok(b)) = (&probe, &load) {
                assert_eq!((a.width, a.height), b.dimensions(), "{name}");
            }
            if let Err(e) = load {
                let e = format!("{e:#}");
                assert!(e.contains(&name) && e.contains("cut off"), "{name}: {e}");
            }
            if ok {
                expect_ok.push(p);
            } else {
                expect_cut.push(name);
            }
        }
    }
    std::fs::write(
        dir.join("data.yaml"),
        format!(
            "path: {}\ntrain: images/train\nval: images/train\nnames: [a]\n",
            dir.display()
        ),
    )
    .unwrap();
    let cfg = DataConfig::load(&dir.join("data.yaml")).unwrap();
    let opts = ScanOptions {
        use_cache: false,
        print: false,
        ..Default::default()
    };
    let s = scan_split(&cfg, Split::Train, &opts).unwrap();
    let kept: Vec<&Path> = s.records.iter().map(|r| r.image.as_path()).collect();
    expect_ok.sort();
    let expect: Vec<PathBuf> = expect_ok
        .iter()
        .map(|p| yolo9::internals::data::fsio::normalize(p))
        .collect();
    assert_eq!(
        kept,
        expect.iter().map(PathBuf::as_path).collect::<Vec<_>>()
    );
    let mut skipped: Vec<String> = s
        .issues
        .iter()
        .filter(|i| i.kind == IssueKind::ImageSkipped)
        .map(|i| {
            assert!(i.value.contains("cut off"), "{:?}", i);
            i.path.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    skipped.sort();
    expect_cut.sort();
    assert_eq!(skipped, expect_cut);
    assert_eq!(s.counts.corrupt, expect_cut.len());
    let _ = std::fs::remove_dir_all(&dir);
}
