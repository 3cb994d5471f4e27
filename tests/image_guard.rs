//! The decoding-bomb guard counts the 8-bit RGB buffer yolo9 builds, not the file's native
//! pixels (`yolo9::data::image::size_guard`), and the dataset scan (`yolo9 check`, `train`)
//! applies the same guard as the decoder. The images are PNG headers written here (a huge IHDR,
//! a token IDAT, IEND), so nothing large is ever allocated.

use yolo9::data::image::{decode_rgb8, decoded_need, size_guard, MAX_DECODE_BYTES};
use yolo9::data::scan::probe_image;

fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut v = (data.len() as u32).to_be_bytes().to_vec();
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    v.extend_from_slice(&body);
    v.extend_from_slice(&crc32(&body).to_be_bytes());
    v
}

/// A PNG of `w`×`h` with `bit_depth` and `color_type` (0 grey, 4 grey+alpha, 2 RGB) whose pixel
/// data is a token.
fn png_header(w: u32, h: u32, bit_depth: u8, color_type: u8) -> Vec<u8> {
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[bit_depth, color_type, 0, 0, 0]);
    let mut v = vec![0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];
    v.extend(chunk(b"IHDR", &ihdr));
    v.extend(chunk(
        b"IDAT",
        &[0x78, 0x9C, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    v.extend(chunk(b"IEND", &[]));
    v
}

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
    // A picture that fits as RGB passes the scan's probe (its header is all the probe reads).
    let p = dir.join("fits.png");
    std::fs::write(&p, png_header(8_000, 8_000, 1, 0)).unwrap();
    let probe = probe_image(&p).unwrap();
    assert_eq!((probe.width, probe.height), (8_000, 8_000));
}
