//! The decoding-bomb guard counts the 8-bit RGB buffer yolo9 builds, not the file's native
//! pixels (`yolo9::data::image::size_guard`), and the dataset scan (`yolo9 check`, `train`)
//! applies the same guard as the decoder. The refused images are PNG headers
//! (`common::png_header`: a huge IHDR, an empty IDAT, IEND), so nothing large is ever allocated.

use crate::common;

use common::png_header;
use yolo9::data::image::{decode_rgb8, decoded_need, size_guard, MAX_DECODE_BYTES};
use yolo9::data::scan::probe_image;

#[test]
fn need_counts_the_rgb_copy() {
    assert_eq!(decoded_need(10, 10, 300), 300, "RGB8 is decoded in place");
    assert_eq!(
        decoded_need(10, 10, 100),
        400,
        "grey: its buffer plus the RGB copy"
    );
    assert_eq!(decoded_need(10, 10, 400), 700, "RGBA8");
    assert!(size_guard(10, 10, 100).is_ok());
    assert!(size_guard(0, 10, 0).is_err());
}

#[test]
fn small_native_pictures_that_expand_past_the_limit_are_refused_everywhere() {
    let dir = std::env::temp_dir().join(format!("yolo9-image-guard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // (w, h, bit depth, colour type): 1-bit grey, 8-bit grey, grey + alpha; each under the limit
    // in its own format (what the guard counted before), over it as RGB.
    for (w, h, bd, ct) in [
        (20_000u32, 20_000u32, 1u8, 0u8),
        (20_000, 20_000, 8, 0),
        (16_000, 16_000, 8, 4),
    ] {
        let native = u64::from(w) * u64::from(h) * if ct == 4 { 2 } else { 1 };
        assert!(
            native <= MAX_DECODE_BYTES,
            "the case must pass the old guard"
        );
        let bytes = png_header(w, h, bd, ct);
        let e = format!("{:#}", decode_rgb8(&bytes).unwrap_err());
        assert!(
            e.contains("decoding-bomb guard") && e.contains(&format!("{w}x{h}")),
            "{w}x{h} depth {bd} type {ct}: {e}"
        );
        let p = dir.join(format!("big_{w}_{bd}_{ct}.png"));
        std::fs::write(&p, &bytes).unwrap();
        let why = probe_image(&p).unwrap_err();
        assert!(why.contains("decoding-bomb guard"), "scan: {why}");
        assert!(why.contains("MB"), "names the limit: {why}");
    }
    // A real picture that fits as RGB (8000x8000 grey: 256 MB to decode) passes the scan's probe,
    // which decodes it as detect does.
    let p = dir.join("fits.png");
    image::GrayImage::new(8_000, 8_000).save(&p).unwrap();
    let probe = probe_image(&p).unwrap();
    assert_eq!((probe.width, probe.height), (8_000, 8_000));
}
