//! Image decoding shared by `yolo9 detect` and training: one function, [`load_rgb8`], one rule
//! for every colour mode.
//!
//! # The rule (same in detect, train and val)
//!
//! * **Format by content.** The decoder is chosen from the file's first bytes
//!   (`image::ImageReader::with_guessed_format`), never from the extension, so `photo.JPG`,
//!   `x.jpeg` holding PNG bytes, or WebP inside `.jpg` all decode. Multi-frame files (animated
//!   GIF, multi-page TIFF) give their **first frame/page**.
//! * **EXIF orientation** (tags 1–8, JPEG/TIFF/WebP/PNG `eXIf`) is applied, so the returned
//!   pixels are upright as a viewer shows them and labels made on the upright picture line up.
//!   Unreadable EXIF is ignored (orientation 1).
//! * **Colour modes → 8-bit RGB**:
//!   - grey (`L`, `LA`): the grey value is copied to R, G and B;
//!   - **alpha is dropped** (the colour under the alpha is kept as stored, no compositing). This is
//!     exactly what OpenCV's `cv2.imread(path)` does in the official code, so a model trained by the
//!     official trainer sees the same pixels;
//!   - palette: expanded to its RGB(A) entries, then as above;
//!   - 16-bit: `v8 = round(v16 / 257)`. A 16-bit PNG whose `sBIT` chunk declares `s < 16`
//!     significant bits **and** whose samples all fit in `s` bits (written unscaled, e.g. 12-bit
//!     sensor data) is first rescaled to the full range (`v * 65535 / (2^s - 1)`), so it is not
//!     nearly black;
//!   - 32-bit float: clamped to 0..1, times 255, rounded;
//!   - CMYK JPEG (Adobe APP14): converted to RGB by the JPEG decoder (zune-jpeg), not inverted
//!     (checked against `shared/cases/cmyk_jpeg/reference`).
//! * **JPEG pixels as OpenCV decodes them**: YCbCr/grey/RGB JPEGs go through libjpeg (mozjpeg,
//!   built from C without SIMD), bit-identical to `cv2.imread`; others through image-rs.
//! * **Usable means decodable, judged here and only here.** [`decode_rgb8`] is the one judge of
//!   whether an image can be used: the dataset scan (`check`, `train`, `val`) decodes every image
//!   with it (`data::scan::probe_image`), as detect, val and the training loader do, so they all
//!   agree. A JPEG cut off mid-scan is refused (libjpeg's "premature end of data segment": the
//!   rest of the picture would be grey), while a JPEG whose data is complete but whose final
//!   end-of-image marker is missing is used, as OpenCV uses it. A PNG without its data's end is
//!   refused by its decoder.
//! * **Decoding-bomb guard** ([`size_guard`], also applied by the dataset scan of `check` and
//!   `train`): at most [`MAX_SIDE`] pixels per side and [`MAX_DECODE_BYTES`] bytes of decoded
//!   pixels, counted as the decoder's buffer plus the 8-bit RGB copy ([`decoded_need`]: a grey or
//!   1-bit picture triples or more); a larger image is refused with an error that names the file,
//!   its size and the limit, before the pixel buffer is allocated. The bytes are those the
//!   decoder really holds ([`decode_need`]: a progressive JPEG's coefficient buffer, a 16-bit
//!   PNG's 16-bit buffer), the same figure `serve` reserves from its decode budget before it
//!   decodes ([`declared_need`]). A PNG's compressed ancillary chunks (an ICC profile, text) are
//!   dropped before decoding ([`png_without_compressed_ancillary`]), and a JPEG of more than
//!   [`MAX_JPEG_SCANS`] scans (a scan bomb) is refused before libjpeg runs.
use anyhow::{bail, Context, Result};
use image::{DynamicImage, ImageDecoder, ImageReader, Limits, RgbImage};
use std::io::Cursor;
use std::path::Path;

/// Largest accepted width or height in pixels (decoding-bomb guard).
pub const MAX_SIDE: u32 = 32_768;
/// Largest accepted decoded buffer in bytes (decoding-bomb guard): 1 GiB, enough for a 108 MP
/// 8-bit RGB photo (324 MB) or a 60 MP 16-bit RGBA scan.
pub const MAX_DECODE_BYTES: u64 = 1 << 30;

/// Decodes the image file at `path` to 8-bit RGB, upright (EXIF orientation applied), by the
/// module rule above.
///
/// Returns an `RgbImage` of the *displayed* size (width and height swapped for EXIF orientations
/// 5–8).
///
/// Errors (each names the file): unreadable file, empty file, unrecognised content (not an image,
/// e.g. text or video), corrupt or truncated data, an image over the decoding-bomb limits.
pub fn load_rgb8(path: &Path) -> Result<RgbImage> {
    let bytes = super::fsio::read_regular(path, crate::bounded::FileKind::Image)
        .with_context(|| format!("cannot read file {}", crate::text::path(&path)))?;
    decode_rgb8(&bytes).with_context(|| format!("cannot decode image {}", crate::text::path(&path)))
}

/// Like [`load_rgb8`] but from the encoded bytes in memory (for services that receive uploads).
/// Errors do not name a file; callers add that context.
pub fn decode_rgb8(bytes: &[u8]) -> Result<RgbImage> {
    if bytes.is_empty() {
        bail!("the file is empty (0 bytes)");
    }
    // A PNG's compressed ancillary chunks (an ICC profile that inflates to 1 GiB, compressed
    // text) are never used here: the decoder gets the picture without them.
    let stripped = png_without_compressed_ancillary(bytes);
    let bytes: &[u8] = stripped.as_deref().unwrap_or(bytes);
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .context("cannot sniff the image format")?;
    let Some(format) = reader.format() else {
        bail!(
            "not a recognised image (content starts with {:02x?}); supported: JPEG, PNG, BMP, WebP, \
             TIFF, GIF",
            &bytes[..bytes.len().min(8)]
        );
    };
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let mut decoder = reader.into_decoder().map_err(|e| match e {
        image::ImageError::Limits(l) => anyhow::anyhow!(
            "refused by the decoding-bomb guard ({l}; at most {MAX_SIDE} px per side and {} MB \
             decoded); downscale the image first",
            MAX_DECODE_BYTES / 1_000_000
        ),
        e => anyhow::Error::new(e).context(format!(
            "{} cut off or corrupt: cannot read its header ({} bytes)",
            format!("{format:?}").to_uppercase(),
            bytes.len()
        )),
    })?;
    let (w, h) = decoder.dimensions();
    size_guard(w, h, decoder.total_bytes())?;
    let need = decode_need(format, bytes, w, h, decoder.total_bytes());
    if need > MAX_DECODE_BYTES {
        bail!(
            "{w}x{h} {} needs about {:.0} MB to decode (its decoder's buffers and the 8-bit RGB \
             copy), over the decoding-bomb guard's {} MB; downscale it first (or save it as a \
             baseline JPEG / 8-bit PNG)",
            format!("{format:?}").to_uppercase(),
            need as f64 / 1e6,
            MAX_DECODE_BYTES / 1_000_000
        );
    }
    if format == image::ImageFormat::Jpeg {
        jpeg_scan_guard(bytes, w, h)?;
    }
    // A malformed EXIF block must not make a good picture unreadable.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    if format == image::ImageFormat::Jpeg {
        if let Some(mut rgb) = decode_jpeg_libjpeg(bytes, w, h)? {
            apply_orientation(&mut rgb, orientation);
            return Ok(rgb);
        }
    }
    let mut img = DynamicImage::from_decoder(decoder).with_context(|| {
        format!(
            "{} cut off or corrupt ({w}x{h}, {} bytes)",
            format!("{format:?}").to_uppercase(),
            bytes.len()
        )
    })?;
    if format == image::ImageFormat::Png {
        if let Some(bits) = png_sbit(bytes) {
            img = rescale_low_bit_16(img, bits);
        }
    }
    let mut rgb = to_rgb8(img);
    apply_orientation(&mut rgb, orientation);
    Ok(rgb)
}

/// The error of a decode that [`decode_rgb8_until`]'s `stop` ended early.
#[derive(Debug, thiserror::Error)]
#[error("the decode was stopped before it finished (its caller no longer wanted it)")]
pub struct DecodeStopped;

thread_local! {
    /// The `stop` of the [`decode_rgb8_until`] running on this thread, if any.
    static STOP: std::cell::RefCell<Option<std::rc::Rc<dyn Fn() -> bool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Whether the [`decode_rgb8_until`] running on this thread should stop now.
fn stop_requested() -> bool {
    STOP.with(|s| s.borrow().as_ref().is_some_and(|f| f()))
}

/// [`decode_rgb8`] that ends early, with [`DecodeStopped`], once `stop()` returns true: a
/// service's request whose client has gone or whose deadline passed stops burning a core.
/// `stop` is asked before the decode starts and, for a JPEG, at every marker libjpeg reads
/// (each scan of a progressive file begins with one, so a many-scan picture stops within one
/// scan's work); other formats are asked only before they start. Libjpeg's state is freed on
/// the way out.
pub fn decode_rgb8_until(bytes: &[u8], stop: impl Fn() -> bool + 'static) -> Result<RgbImage> {
    if stop() {
        return Err(DecodeStopped.into());
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            STOP.with(|s| s.borrow_mut().take());
        }
    }
    STOP.with(|s| *s.borrow_mut() = Some(std::rc::Rc::new(stop)));
    let _reset = Reset;
    decode_rgb8(bytes)
}

/// Decoded bytes that the decodes of [`decode_rgb8_bounded`] may hold at once, all threads
/// together: 2 GiB (two of the largest pictures the guard lets through).
pub const BOUNDED_DECODE_BYTES: u64 = 2 * MAX_DECODE_BYTES;

/// [`decode_rgb8`] for parallel callers (the dataset scan decodes every image on every core):
/// first waits until this picture's decoded bytes ([`declared_need`], at most
/// [`MAX_DECODE_BYTES`]) fit beside those of the other bounded decodes in progress within
/// [`BOUNDED_DECODE_BYTES`]; one decode always proceeds alone. The verdict is [`decode_rgb8`]'s.
pub fn decode_rgb8_bounded(bytes: &[u8]) -> Result<RgbImage> {
    static GATE: gate::Gate = gate::Gate::new(BOUNDED_DECODE_BYTES);
    let need = declared_need(bytes).map_or(0, |(_, _, n)| n.min(MAX_DECODE_BYTES));
    let _held = GATE.acquire(need);
    decode_rgb8(bytes)
}

/// The size an encoded picture declares in its header and the bytes decoding it may hold (its
/// size as 8-bit RGBA plus the RGB copy, [`decoded_need`]), read without decoding: `(width,
/// height, bytes)`; `None` when the header cannot be read (the decode then says why).
pub fn declared_need(bytes: &[u8]) -> Option<(u32, u32, u64)> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .ok()?;
    let format = reader.format()?;
    let (w, h) = reader.into_dimensions().ok()?;
    let px = u64::from(w) * u64::from(h);
    let native = match format {
        image::ImageFormat::Png => png_native_bytes(bytes, w, h).unwrap_or(4 * px),
        // libjpeg and zune-jpeg both give 8-bit RGB.
        image::ImageFormat::Jpeg => 3 * px,
        _ => 4 * px,
    };
    Some((w, h, decode_need(format, bytes, w, h, native)))
}

/// Bytes decoding `bytes` (a `format` picture of `w`×`h` whose decoder output is `native` bytes)
/// holds at its peak, by what the decoder really keeps:
///
/// - **JPEG** (libjpeg): the 8-bit RGB output (3 B/px; no second copy), plus for a
///   **progressive** file the whole coefficient buffer libjpeg keeps until the last scan
///   (2 bytes per coefficient, one per sample of each component at its sampling factor: 6 B/px
///   at 4:4:4, 3 B/px at 4:2:0), rounded up to whole 8×8 blocks;
/// - **others** (image-rs): the decoder's own buffer (`native`: a 16-bit RGBA PNG is 8 B/px)
///   plus the 8-bit RGB copy ([`decoded_need`]);
///
/// plus a 2% margin (row buffers, block rounding).
pub fn decode_need(format: image::ImageFormat, bytes: &[u8], w: u32, h: u32, native: u64) -> u64 {
    let px = u64::from(w) * u64::from(h);
    let base = match format {
        image::ImageFormat::Jpeg => {
            let coef = match jpeg_info(bytes) {
                Some(j) if j.progressive => j.coefficient_bytes(),
                _ => 0,
            };
            // The libjpeg path's RGB output; a CMYK file goes through image-rs (4 B/px + RGB).
            (3 * px).max(native) + coef + if native > 3 * px { 3 * px } else { 0 }
        }
        _ => decoded_need(w, h, native),
    };
    base + base / 50
}

/// The most scans a JPEG may have. A progressive JPEG from an encoder has at most a few dozen
/// (jpegtran's default script: 10; mozjpeg's: under 20); repeated scans are a known decoding
/// bomb (libjpeg-turbo's tools take `-maxscans` for it), each costing a pass over the picture.
pub const MAX_JPEG_SCANS: usize = 100;

/// The most scan work a JPEG may ask for: scans × pixels (a 12 MP photo of 100 scans is 1.2e9;
/// one scan of the largest picture the guard accepts is 0.36e9).
pub const MAX_JPEG_SCAN_WORK: u64 = 4_000_000_000;

/// Refuses a JPEG of more than [`MAX_JPEG_SCANS`] scans, or whose scans × pixels exceed
/// [`MAX_JPEG_SCAN_WORK`], before libjpeg decodes it.
fn jpeg_scan_guard(bytes: &[u8], w: u32, h: u32) -> Result<()> {
    let Some(j) = jpeg_info(bytes) else {
        return Ok(());
    };
    let work = j.scans as u64 * u64::from(w) * u64::from(h);
    if j.scans > MAX_JPEG_SCANS || work > MAX_JPEG_SCAN_WORK {
        bail!(
            "JPEG of {} scans at {w}x{h}: over the scan limit of the decoding-bomb guard (at most \
             {MAX_JPEG_SCANS} scans and {MAX_JPEG_SCAN_WORK} scans x pixels); a real picture has \
             a few dozen. Re-encode it (e.g. as a baseline JPEG)",
            j.scans
        );
    }
    Ok(())
}

/// What a JPEG's markers declare, read by walking its segments (no decoding).
#[derive(Debug, Clone, PartialEq)]
pub struct JpegInfo {
    /// A progressive frame (SOF2/SOF6/SOF10/SOF14).
    pub progressive: bool,
    /// Start-of-scan markers.
    pub scans: usize,
    /// Width and height of the frame.
    pub size: (u32, u32),
    /// Horizontal and vertical sampling factors of each component.
    pub sampling: Vec<(u8, u8)>,
}

impl JpegInfo {
    /// Bytes of libjpeg's whole-image coefficient buffer (progressive mode): 64 coefficients of
    /// 2 bytes per 8×8 block of each component, in whole MCUs.
    pub fn coefficient_bytes(&self) -> u64 {
        let (w, h) = (u64::from(self.size.0), u64::from(self.size.1));
        let hmax = self
            .sampling
            .iter()
            .map(|s| u64::from(s.0))
            .max()
            .unwrap_or(1)
            .max(1);
        let vmax = self
            .sampling
            .iter()
            .map(|s| u64::from(s.1))
            .max()
            .unwrap_or(1)
            .max(1);
        let (mcux, mcuy) = (w.div_ceil(8 * hmax), h.div_ceil(8 * vmax));
        self.sampling
            .iter()
            .map(|&(hs, vs)| mcux * u64::from(hs) * mcuy * u64::from(vs) * 64 * 2)
            .sum()
    }
}

/// Walks the markers of JPEG `bytes`: the frame header and the number of scans; `None` when it
/// is not a JPEG or has no frame header. The entropy-coded data after each scan header is
/// skipped to the next marker (`FF` followed by neither `00` nor a restart marker).
pub fn jpeg_info(bytes: &[u8]) -> Option<JpegInfo> {
    if !bytes.starts_with(&[0xff, 0xd8]) {
        return None;
    }
    let mut info = JpegInfo {
        progressive: false,
        scans: 0,
        size: (0, 0),
        sampling: Vec::new(),
    };
    let mut frame = false;
    let mut p = 2usize;
    while p + 4 <= bytes.len() {
        if bytes[p] != 0xff {
            p += 1;
            continue;
        }
        let m = bytes[p + 1];
        if m == 0xff || m == 0x00 || (0xd0..=0xd7).contains(&m) || m == 0x01 {
            p += if m == 0xff { 1 } else { 2 };
            continue;
        }
        if m == 0xd9 {
            break;
        }
        let len = usize::from(u16::from_be_bytes([bytes[p + 2], bytes[p + 3]]));
        let seg = bytes.get(p + 4..(p + 2 + len).min(bytes.len()))?;
        match m {
            0xc0..=0xcf if !matches!(m, 0xc4 | 0xc8 | 0xcc) && seg.len() >= 6 => {
                info.progressive = matches!(m, 0xc2 | 0xc6 | 0xca | 0xce);
                let hh = u16::from_be_bytes([seg[1], seg[2]]);
                let ww = u16::from_be_bytes([seg[3], seg[4]]);
                info.size = (u32::from(ww), u32::from(hh));
                let n = usize::from(seg[5]);
                info.sampling = (0..n)
                    .filter_map(|i| seg.get(6 + 3 * i + 1))
                    .map(|s| (s >> 4, s & 0x0f))
                    .collect();
                frame = true;
            }
            0xda => {
                info.scans += 1;
                // Skip the entropy-coded data to the next real marker.
                let mut q = p + 2 + len;
                while q + 1 < bytes.len() {
                    if bytes[q] == 0xff
                        && bytes[q + 1] != 0
                        && !(0xd0..=0xd7).contains(&bytes[q + 1])
                    {
                        break;
                    }
                    q += 1;
                }
                p = q;
                continue;
            }
            _ => {}
        }
        p += 2 + len;
    }
    frame.then_some(info)
}

/// The bytes of the decoder's buffer for PNG `bytes` of `w`×`h` (from `IHDR`: channels × bytes
/// per sample per pixel, as image-rs decodes it: palette expanded to RGB(A), sub-8-bit to 8);
/// `None` for other formats.
fn png_native_bytes(bytes: &[u8], w: u32, h: u32) -> Option<u64> {
    if !bytes.starts_with(b"\x89PNG\r\n\x1a\n") || bytes.len() < 33 || &bytes[12..16] != b"IHDR" {
        return None;
    }
    let (depth, color) = (bytes[24], bytes[25]);
    let channels: u64 = match color {
        0 => 1,
        2 | 3 => 3,
        4 => 2,
        6 => 4,
        _ => 4,
    };
    let channels = if color == 3 && png_has_chunk(bytes, b"tRNS") {
        4
    } else {
        channels
    };
    let sample = if depth == 16 { 2 } else { 1 };
    Some(u64::from(w) * u64::from(h) * channels * sample)
}

/// Whether PNG `bytes` has a chunk of `kind` before its image data.
fn png_has_chunk(bytes: &[u8], kind: &[u8; 4]) -> bool {
    png_chunks(bytes).any(|(k, _)| k == kind)
}

/// The chunks of PNG `bytes` as `(kind, whole chunk with length and CRC)`, up to the first one
/// that is cut off.
fn png_chunks(bytes: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut p = 8usize;
    std::iter::from_fn(move || {
        let len = u32::from_be_bytes(bytes.get(p..p + 4)?.try_into().ok()?) as usize;
        let end = p.checked_add(12)?.checked_add(len)?;
        let chunk = bytes.get(p..end)?;
        p = end;
        Some((&chunk[4..8], chunk))
    })
}

/// PNG `bytes` without its compressed ancillary chunks (`iCCP`, `zTXt`, `iTXt`) and text
/// (`tEXt`), which yolo9 never uses and whose decompression the decoder would otherwise pay (an
/// ICC profile of 1.1 MB can inflate to 1 GiB); `None` when `bytes` is not a PNG or has none.
/// Everything else (and anything after a damaged chunk) is kept byte for byte, so the decoder
/// judges the picture as before.
pub fn png_without_compressed_ancillary(bytes: &[u8]) -> Option<Vec<u8>> {
    const DROP: [&[u8]; 4] = [b"iCCP", b"zTXt", b"iTXt", b"tEXt"];
    if !bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        return None;
    }
    if !png_chunks(bytes).any(|(k, _)| DROP.contains(&k)) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&bytes[..8]);
    let mut used = 8;
    for (k, chunk) in png_chunks(bytes) {
        used += chunk.len();
        if !DROP.contains(&k) {
            out.extend_from_slice(chunk);
        }
    }
    out.extend_from_slice(&bytes[used..]);
    Some(out)
}

/// A byte budget shared by threads: [`Gate::acquire`] blocks while the bytes held plus the
/// request exceed the cap (unless nothing is held), and the returned guard gives them back.
mod gate {
    use std::sync::{Condvar, Mutex};

    /// The shared budget.
    pub(super) struct Gate {
        cap: u64,
        used: Mutex<u64>,
        freed: Condvar,
    }

    /// Bytes held until dropped.
    pub(super) struct Held<'a> {
        gate: &'a Gate,
        bytes: u64,
    }

    impl Gate {
        pub(super) const fn new(cap: u64) -> Gate {
            Gate {
                cap,
                used: Mutex::new(0),
                freed: Condvar::new(),
            }
        }

        pub(super) fn acquire(&self, bytes: u64) -> Held<'_> {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            while *used > 0 && used.saturating_add(bytes) > self.cap {
                used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
            }
            *used += bytes;
            Held { gate: self, bytes }
        }

        #[cfg(test)]
        pub(super) fn used(&self) -> u64 {
            *self.used.lock().unwrap()
        }
    }

    impl Drop for Held<'_> {
        fn drop(&mut self) {
            let mut used = self.gate.used.lock().unwrap_or_else(|e| e.into_inner());
            *used -= self.bytes;
            self.gate.freed.notify_all();
        }
    }
}

/// Decodes a JPEG with libjpeg (mozjpeg, a libjpeg-turbo fork: the library OpenCV's
/// `cv2.imread` uses), giving the same pixels as the official code for YCbCr, greyscale and RGB
/// data: islow IDCT and fancy upsampling, bit for bit (image-rs's decoder differs by a few levels,
/// which moved BCCD test mAP50-95 by 0.004).
///
/// This is also where a JPEG's usability is judged, by decoding: a file whose entropy-coded data
/// ends before the last block (cut off mid-scan; libjpeg would fill the rest with grey) is
/// `Err`, while a file whose data is complete but whose end-of-image marker is missing decodes
/// normally (libjpeg supplies the marker, as for OpenCV). CMYK/YCCK data is decoded to CMYK
/// only to check it is complete, then `Ok(None)` lets image-rs convert it (checked against
/// `shared/cases/cmyk_jpeg/reference`). `Ok(None)` also for a libjpeg error or a size that
/// disagrees with the header: the caller decodes with image-rs, whose errors name the problem.
fn decode_jpeg_libjpeg(bytes: &[u8], w: u32, h: u32) -> Result<Option<RgbImage>> {
    use mozjpeg::ColorSpace as C;
    // libjpeg reports fatal errors, and `jpeg_err::message` data that ran out, by unwinding.
    let decoded = std::panic::catch_unwind(|| -> Option<(usize, usize, Vec<u8>)> {
        let d = mozjpeg::Decompress::with_err(jpeg_err::manager())
            .from_mem(bytes)
            .ok()?;
        match d.color_space() {
            C::JCS_YCbCr | C::JCS_GRAYSCALE | C::JCS_RGB => {
                let mut started = d.rgb().ok()?;
                let (dw, dh) = (started.width(), started.height());
                // One buffer of 3 bytes a pixel (no second, flattened copy).
                let px: Vec<u8> = started.read_scanlines().ok()?;
                started.finish().ok()?;
                Some((dw, dh, px))
            }
            C::JCS_CMYK | C::JCS_YCCK => {
                let mut started = d.to_colorspace(C::JCS_CMYK).ok()?;
                let _: Vec<[u8; 4]> = started.read_scanlines().ok()?;
                started.finish().ok()?;
                None
            }
            _ => None,
        }
    });
    let decoded = match decoded {
        Ok(d) => d,
        Err(payload) if payload.is::<jpeg_err::Stopped>() => return Err(DecodeStopped.into()),
        Err(payload) => match payload.downcast::<jpeg_err::CutOff>() {
            Ok(_) => bail!(
                "JPEG cut off or damaged: its image data ends before the last block ({} bytes; \
                 part of the picture is missing); re-export the file or remove it",
                bytes.len()
            ),
            Err(_) => None,
        },
    };
    let Some((dw, dh, data)) = decoded else {
        return Ok(None);
    };
    if (dw as u32, dh as u32) != (w, h) || data.len() != dw * dh * 3 {
        return Ok(None);
    }
    Ok(RgbImage::from_raw(w, h, data))
}

/// libjpeg's error manager for [`decode_jpeg_libjpeg`]: fatal errors unwind (as mozjpeg's own
/// manager does) and the warning "premature end of data segment" (`JWRN_HIT_MARKER`: the
/// entropy-coded data ran out and libjpeg is about to fill the missing blocks) unwinds with
/// [`CutOff`]. Other warnings are ignored, as OpenCV's decode ignores them.
mod jpeg_err {
    use mozjpeg_sys::{jpeg_common_struct, jpeg_error_mgr, jpeg_std_error, JWRN_HIT_MARKER};
    use std::os::raw::c_int;

    /// Unwinding payload: the image data ran out before the last block.
    pub(super) struct CutOff;

    /// Unwinding payload: the caller's stop was asked for ([`super::decode_rgb8_until`]).
    pub(super) struct Stopped;

    /// Unwinding payload: a libjpeg fatal error.
    struct Fatal;

    /// A fresh error manager with the two handlers.
    pub(super) fn manager() -> jpeg_error_mgr {
        // SAFETY: `jpeg_std_error` fills every field of a zeroed manager (method pointers and
        // pointers to libjpeg's static message tables); nothing in it points into itself, so
        // it may be moved afterwards.
        let mut err: jpeg_error_mgr = unsafe { std::mem::zeroed() };
        unsafe { jpeg_std_error(&mut err) };
        err.error_exit = Some(fatal);
        err.emit_message = Some(message);
        err
    }

    extern "C-unwind" fn fatal(_cinfo: &mut jpeg_common_struct) {
        std::panic::resume_unwind(Box::new(Fatal));
    }

    extern "C-unwind" fn message(cinfo: &mut jpeg_common_struct, level: c_int) {
        // libjpeg traces every marker it reads (each scan starts with one) through here.
        if super::stop_requested() {
            std::panic::resume_unwind(Box::new(Stopped));
        }
        // SAFETY: libjpeg calls this with its own decompressor, whose `err` is this manager.
        let code = unsafe { cinfo.err.as_ref() }.map_or(-1, |e| e.msg_code);
        if level < 0 && code == JWRN_HIT_MARKER {
            std::panic::resume_unwind(Box::new(CutOff));
        }
    }
}

/// Reads only the header of the image at `path` and returns its stored `(width, height)` (before
/// EXIF orientation). Cheap: no pixels are decoded.
pub fn probe_dimensions(path: &Path) -> Result<(u32, u32)> {
    let f = super::fsio::open_regular(path)
        .with_context(|| format!("cannot open {}", crate::text::path(&path)))?;
    ImageReader::new(std::io::BufReader::new(f))
        .with_guessed_format()
        .with_context(|| format!("cannot read {}", crate::text::path(&path)))?
        .into_dimensions()
        .with_context(|| {
            format!(
                "cannot read the image header of {}",
                crate::text::path(&path)
            )
        })
}

/// Bytes that decoding a `w`×`h` image whose decoder buffer is `native` bytes holds at its peak:
/// the decoder's buffer plus the 8-bit RGB image yolo9 converts it to (`3·w·h`; when the native
/// layout already is 8-bit RGB there is no second buffer). A 1-bit or grey picture is small in
/// its own format but not as RGB: this is what [`size_guard`] counts.
pub fn decoded_need(w: u32, h: u32, native: u64) -> u64 {
    let rgb = 3 * u64::from(w) * u64::from(h);
    if native == rgb {
        rgb
    } else {
        rgb.saturating_add(native)
    }
}

/// The decoding-bomb guard, the same for `check`, `train`, `val` and `detect`: at most
/// [`MAX_SIDE`] pixels per side and [`MAX_DECODE_BYTES`] of [`decoded_need`]. The error gives the
/// size, the need and the limits.
pub fn size_guard(w: u32, h: u32, native: u64) -> Result<()> {
    if w == 0 || h == 0 {
        bail!("the image has a zero dimension ({w}x{h})");
    }
    let need = decoded_need(w, h, native);
    if w > MAX_SIDE || h > MAX_SIDE || need > MAX_DECODE_BYTES {
        bail!(
            "{w}x{h} image ({:.0} MB to decode as 8-bit RGB) exceeds the decoding-bomb guard (at \
             most {MAX_SIDE} px per side and {} MB decoded); downscale it first (e.g. `convert \
             in.png -resize 8000x8000 out.png`)",
            need as f64 / 1e6,
            MAX_DECODE_BYTES / 1_000_000
        );
    }
    Ok(())
}

/// Converts any decoded colour mode to 8-bit RGB by the module rule: grey replicated, alpha
/// dropped (no compositing), 16-bit `round(v/257)`, float clamped to 0..1 then `round(v*255)`.
/// An `Rgb8` image is moved, not copied.
pub fn to_rgb8(img: DynamicImage) -> RgbImage {
    // `image`'s own conversions implement exactly this rule: Luma → (l, l, l), Rgba → drop A,
    // u16 → (v + 128) / 257, f32 → clamp and round.
    img.into_rgb8()
}

/// Applies an EXIF orientation (as decoded by `image`) to an RGB image in place.
pub fn apply_orientation(img: &mut RgbImage, orientation: image::metadata::Orientation) {
    use image::imageops;
    use image::metadata::Orientation as O;
    match orientation {
        O::NoTransforms => {}
        O::Rotate90 => *img = imageops::rotate90(img),
        O::Rotate180 => imageops::rotate180_in_place(img),
        O::Rotate270 => *img = imageops::rotate270(img),
        O::FlipHorizontal => imageops::flip_horizontal_in_place(img),
        O::FlipVertical => imageops::flip_vertical_in_place(img),
        O::Rotate90FlipH => {
            let mut r = imageops::rotate90(img);
            imageops::flip_horizontal_in_place(&mut r);
            *img = r;
        }
        O::Rotate270FlipH => {
            let mut r = imageops::rotate270(img);
            imageops::flip_horizontal_in_place(&mut r);
            *img = r;
        }
    }
}

/// Applies the EXIF `Orientation` tag value (1–8) to an RGB image; other values are ignored
/// (treated as 1). Tag meaning (EXIF 2.3, TIFF 6.0): 1 upright, 2 mirrored, 3 rotated 180°,
/// 4 flipped vertically, 5 transposed, 6 needs 90° clockwise, 7 transversed, 8 needs 90°
/// counter-clockwise.
pub fn apply_exif_orientation(img: &mut RgbImage, tag: u8) {
    if let Some(o) = image::metadata::Orientation::from_exif(tag) {
        apply_orientation(img, o);
    }
}

/// The significant-bit count declared by a PNG `sBIT` chunk (largest over channels), if any.
fn png_sbit(bytes: &[u8]) -> Option<u8> {
    let mut p = 8usize;
    while p + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[p..p + 4].try_into().ok()?) as usize;
        let kind = &bytes[p + 4..p + 8];
        let body = bytes.get(p + 8..p + 8 + len)?;
        match kind {
            b"sBIT" => return body.iter().copied().max(),
            b"IDAT" | b"IEND" => return None,
            _ => {}
        }
        p = p.checked_add(12 + len)?;
    }
    None
}

/// Rescales a 16-bit image written with only `bits` significant bits (samples all `< 2^bits`) to
/// the full 16-bit range. Leaves other images unchanged.
fn rescale_low_bit_16(img: DynamicImage, bits: u8) -> DynamicImage {
    if bits == 0 || bits >= 16 {
        return img;
    }
    let top = (1u32 << bits) - 1;
    fn fix(samples: &mut [u16], top: u32) {
        if samples.iter().all(|&v| u32::from(v) <= top) {
            for v in samples.iter_mut() {
                *v = ((u32::from(*v) * 65535 + top / 2) / top) as u16;
            }
        }
    }
    let mut img = img;
    match &mut img {
        DynamicImage::ImageLuma16(b) => fix(b, top),
        DynamicImage::ImageLumaA16(b) => fix(b, top),
        DynamicImage::ImageRgb16(b) => fix(b, top),
        DynamicImage::ImageRgba16(b) => fix(b, top),
        _ => {}
    }
    img
}

/// The (r, g, b) of the standard HSV → RGB conversion before adding `m = v − c`: in hue sector
/// `sector` (0..6, each 60°; larger counts as 5) the chroma `c` and the second-largest component
/// `x` go to the channels that sector orders them in, and the third channel gets `zero`.
pub fn hue_sector<T: Copy>(sector: u32, c: T, x: T, zero: T) -> (T, T, T) {
    match sector {
        0 => (c, x, zero),
        1 => (x, c, zero),
        2 => (zero, c, x),
        3 => (zero, x, c),
        4 => (x, zero, c),
        _ => (c, zero, x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sbit_rescale_maps_full_scale_to_white() {
        let mut b = image::ImageBuffer::<image::Luma<u16>, Vec<u16>>::new(2, 1);
        b.put_pixel(0, 0, image::Luma([4095]));
        b.put_pixel(1, 0, image::Luma([0]));
        let out = to_rgb8(rescale_low_bit_16(DynamicImage::ImageLuma16(b), 12));
        assert_eq!(out.get_pixel(0, 0).0, [255, 255, 255]);
        assert_eq!(out.get_pixel(1, 0).0, [0, 0, 0]);
    }

    #[test]
    fn the_gate_never_holds_more_than_its_cap_and_lets_a_large_one_through_alone() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static G: gate::Gate = gate::Gate::new(100);
        static PEAK: AtomicU64 = AtomicU64::new(0);
        let threads: Vec<_> = (0..16u64)
            .map(|i| {
                std::thread::spawn(move || {
                    // 30..=75 bytes each, and one of 250 (over the cap: alone)
                    let need = if i == 7 { 250 } else { 30 + (i % 4) * 15 };
                    let _h = G.acquire(need);
                    let now = G.used();
                    PEAK.fetch_max(if need > 100 { 0 } else { now }, Ordering::SeqCst);
                    assert!(need > 100 && now == need || now <= 100, "{now}");
                    std::thread::sleep(std::time::Duration::from_millis(5));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(PEAK.load(Ordering::SeqCst) <= 100);
        assert_eq!(G.used(), 0);
    }

    #[test]
    fn sbit_leaves_properly_scaled_data() {
        let mut b = image::ImageBuffer::<image::Luma<u16>, Vec<u16>>::new(1, 1);
        b.put_pixel(0, 0, image::Luma([5000]));
        let out = to_rgb8(rescale_low_bit_16(DynamicImage::ImageLuma16(b), 12));
        // 5000 > 4095: data is not unscaled 12-bit, keep round(5000/257) = 19.
        assert_eq!(out.get_pixel(0, 0).0, [19, 19, 19]);
    }
}
