//! The decoding-bomb guard counts the 8-bit RGB buffer yolo9 builds, not the file's native
//! pixels (`yolo9::data::image::size_guard`), and the dataset scan (`yolo9 check`, `train`)
//! applies the same guard as the decoder. The refused images are PNG headers
//! (`common::png_header`: a huge IHDR, an empty IDAT, IEND), so nothing large is ever allocated.

use crate::common;

use common::png_header;
use yolo9::data::image::{decode_rgb8, decoded_need, size_guard, MAX_DECODE_BYTES};
use yolo9::internals::data::scan::probe_image;

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

/// A progressive JPEG of `w`×`h` (mozjpeg's encoder, its default scan script).
fn progressive_jpeg(w: usize, h: usize) -> Vec<u8> {
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
    let mut c = mozjpeg::Compress::new(mozjpeg::ColorSpace::JCS_RGB);
    c.set_size(w, h);
    c.set_progressive_mode();
    let mut started = c.start_compress(Vec::new()).unwrap();
    started.write_scanlines(&px).unwrap();
    started.finish().unwrap()
}

/// Issue 51, "decode budgets": what a progressive JPEG's decoder holds (the coefficient buffer,
/// 2 bytes per coefficient of every block of every component) is counted, by hand here.
#[test]
fn a_progressive_jpeg_counts_its_coefficient_buffer() {
    use yolo9::data::image::{declared_need, jpeg_info};
    let (w, h) = (64usize, 48usize);
    let bytes = progressive_jpeg(w, h);
    let j = jpeg_info(&bytes).unwrap();
    assert!(j.progressive);
    assert!(j.scans > 1, "{j:?}");
    assert_eq!(j.size, (64, 48));
    // mozjpeg's default sampling, 4:2:0: MCUs of 16x16, 4 x 3 of them; Y has 2x2 blocks per MCU.
    assert_eq!(j.sampling, [(2, 2), (1, 1), (1, 1)]);
    let blocks = 4 * 3 * (4 + 1 + 1);
    assert_eq!(j.coefficient_bytes(), blocks * 64 * 2);
    let (dw, dh, need) = declared_need(&bytes).unwrap();
    assert_eq!((dw, dh), (64, 48));
    let base = 3 * 64 * 48 + blocks * 64 * 2;
    assert_eq!(need, base + base / 50);
    // It decodes.
    let img = decode_rgb8(&bytes).unwrap();
    assert_eq!(img.dimensions(), (64, 48));
}

/// Issue 51, "progressive-JPEG scan bombs": a JPEG whose last scan is repeated (a valid file to
/// libjpeg, which only warns) is refused by its scan count before libjpeg decodes it, at once.
#[test]
fn a_jpeg_with_repeated_scans_is_refused_before_decoding() {
    use yolo9::data::image::{jpeg_info, MAX_JPEG_SCANS};
    let bytes = progressive_jpeg(64, 48);
    let scans = jpeg_info(&bytes).unwrap().scans;
    // The last scan: from its SOS marker to the end-of-image marker.
    let sos = (0..bytes.len() - 1)
        .rev()
        .find(|&i| bytes[i] == 0xff && bytes[i + 1] == 0xda)
        .unwrap();
    let eoi = bytes.len() - 2;
    assert_eq!(&bytes[eoi..], [0xff, 0xd9]);
    let last = bytes[sos..eoi].to_vec();
    let mut bomb = bytes[..eoi].to_vec();
    for _ in 0..MAX_JPEG_SCANS {
        bomb.extend_from_slice(&last);
    }
    bomb.extend_from_slice(&[0xff, 0xd9]);
    assert_eq!(jpeg_info(&bomb).unwrap().scans, scans + MAX_JPEG_SCANS);
    let t0 = std::time::Instant::now();
    let e = format!("{:#}", decode_rgb8(&bomb).unwrap_err());
    assert!(
        e.contains(&format!("{} scans", scans + MAX_JPEG_SCANS)) && e.contains("scan limit"),
        "{e}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(2));
    // At the limit it still decodes.
    let mut ok = bytes[..eoi].to_vec();
    for _ in 0..MAX_JPEG_SCANS - scans {
        ok.extend_from_slice(&last);
    }
    ok.extend_from_slice(&[0xff, 0xd9]);
    assert!(decode_rgb8(&ok).is_ok());
}

/// A PNG chunk: length, kind, data, CRC-32.
fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    let mut v = (data.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(&body);
    v.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    v
}

/// `n` zero bytes as a zlib stream (deflated by the zip writer, then framed: header, data,
/// Adler-32, which for zeros is `(n mod 65521) << 16 | 1`).
fn zlib_zeros(n: usize) -> Vec<u8> {
    use std::io::Write;
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let o = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    z.start_file("z", o).unwrap();
    let block = vec![0u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len());
        z.write_all(&block[..k]).unwrap();
        left -= k;
    }
    let buf = z.finish().unwrap().into_inner();
    let mut a = zip::ZipArchive::new(std::io::Cursor::new(&buf)).unwrap();
    let f = a.by_index(0).unwrap();
    let (start, len) = (
        f.data_start().unwrap() as usize,
        f.compressed_size() as usize,
    );
    let mut out = vec![0x78, 0x9c];
    out.extend_from_slice(&buf[start..start + len]);
    out.extend_from_slice(&((((n % 65521) as u32) << 16) | 1).to_be_bytes());
    out
}

/// Issue 51, "decode budgets" (ICC): a PNG whose iCCP chunk inflates to 256 MiB (here; 1 GiB in
/// the sweep) decodes to the same pixels as the PNG without it, and the decoder never sees the
/// chunk (nor compressed text); the 16-bit buffer of a 16-bit PNG is counted in its need.
#[test]
fn compressed_ancillary_png_chunks_are_dropped_and_16_bit_buffers_counted() {
    use yolo9::data::image::{declared_need, png_without_compressed_ancillary};
    let img = image::RgbImage::from_fn(16, 8, |x, y| image::Rgb([x as u8 * 9, y as u8 * 17, 3]));
    let mut plain = Vec::new();
    img.write_to(
        &mut std::io::Cursor::new(&mut plain),
        image::ImageFormat::Png,
    )
    .unwrap();
    assert!(png_without_compressed_ancillary(&plain).is_none());
    let mut iccp = b"bomb\0\0".to_vec();
    iccp.extend_from_slice(&zlib_zeros(256 << 20));
    let iccp = chunk(b"iCCP", &iccp);
    let mut ztxt = b"Comment\0\0".to_vec();
    ztxt.extend_from_slice(&zlib_zeros(1 << 20));
    let ztxt = chunk(b"zTXt", &ztxt);
    // After IHDR (8 + 25 bytes).
    let mut bomb = plain[..33].to_vec();
    bomb.extend_from_slice(&iccp);
    bomb.extend_from_slice(&ztxt);
    bomb.extend_from_slice(&plain[33..]);
    assert!(bomb.len() < 400_000, "{}", bomb.len());
    assert_eq!(png_without_compressed_ancillary(&bomb).unwrap(), plain);
    assert_eq!(decode_rgb8(&bomb).unwrap(), img);
    // 16-bit RGBA: 8 bytes a pixel in the decoder, plus the RGB copy, plus 2%.
    let img16 = image::ImageBuffer::<image::Rgba<u16>, Vec<u16>>::new(100, 50);
    let mut png16 = Vec::new();
    image::DynamicImage::ImageRgba16(img16)
        .write_to(
            &mut std::io::Cursor::new(&mut png16),
            image::ImageFormat::Png,
        )
        .unwrap();
    let base = 100 * 50 * (8 + 3);
    assert_eq!(declared_need(&png16).unwrap(), (100, 50, base + base / 50));
}

/// Issue 51, "abandoned decodes": a decode asked to stop ends at the next scan of a progressive
/// JPEG with `DecodeStopped`, not after the whole picture; never asked, it decodes as before.
#[test]
fn a_progressive_decode_stops_at_the_scan_after_its_stop() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use yolo9::data::image::{decode_rgb8_until, jpeg_info, DecodeStopped};
    let bytes = progressive_jpeg(64, 48);
    let scans = jpeg_info(&bytes).unwrap().scans;
    // Never true: the picture decodes, and the stop was asked at least once per scan.
    let asked = Arc::new(AtomicUsize::new(0));
    let a = asked.clone();
    let img = decode_rgb8_until(&bytes, move || {
        a.fetch_add(1, Ordering::Relaxed);
        false
    })
    .unwrap();
    assert_eq!(img, decode_rgb8(&bytes).unwrap());
    let full = asked.load(Ordering::Relaxed);
    assert!(full > scans, "asked {full} times for {scans} scans");
    // True from the 3rd question on: stopped there, long before the end.
    let asked = Arc::new(AtomicUsize::new(0));
    let a = asked.clone();
    let e =
        decode_rgb8_until(&bytes, move || a.fetch_add(1, Ordering::Relaxed) + 1 >= 3).unwrap_err();
    assert!(e.is::<DecodeStopped>(), "{e:#}");
    assert_eq!(asked.load(Ordering::Relaxed), 3);
    // Already true: nothing is decoded, and the next plain decode on this thread is unaffected.
    assert!(decode_rgb8_until(&bytes, || true)
        .unwrap_err()
        .is::<DecodeStopped>());
    assert_eq!(decode_rgb8(&bytes).unwrap().dimensions(), (64, 48));
}
