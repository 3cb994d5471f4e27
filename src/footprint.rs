//! Up-front memory estimate of a run at its requested size, checked against the memory
//! available **before any work starts** (`yolo9 train`, `val`, `detect` on the CPU): a size that
//! cannot fit is refused at once with the option, the value, the estimate, what is available and
//! what to change, instead of starting and then dying or swapping for minutes.
//!
//! The estimate is the activation memory, which grows with the input's pixels and the images
//! processed at once: `bytes_per_pixel · img² · images`. The constants were measured once on the
//! CPU for yolov9-s (process RSS peak above the loaded model, [`crate::memory::MemoryProbe`]):
//!
//! - inference forward: 229, 306, 168 and 196 bytes per input pixel at `--img` 320, 640, 1280 and
//!   1920 (1 image; a second run: 228, 196, 196, 196); [`INFER_BYTES_PER_PIXEL`] = 128 is below
//!   every point by a quarter;
//! - training step (forward of both branches, loss, backward, SGD, EMA; `train::budget::plan`):
//!   159 MiB per image at `--img` 256 and 660 MiB per image at 512 (micro-batches 1, 2, 4), i.e.
//!   2545 and 2638 bytes per pixel per image (a second run: 2638 and 2543);
//!   [`TRAIN_BYTES_PER_PIXEL`] = 2000 is below every point.
//!
//! (2 cores, 23 GiB, 2026-12-02; `cargo test --test memory footprint_floor -- --ignored --nocapture`
//! re-measures them and asserts they are floors.)
//!
//! The check is deliberately conservative: the constants are floors for the smallest model
//! (larger models need more), the image is taken square, and only the activations are counted,
//! so a refused size surely does not fit, while every size the measurements show fitting is
//! accepted (e.g. training at 640 with a batch of 16 estimates 12.2 GiB, detect at 1280
//! 0.20 GiB). On CUDA the device memory is sized by measurement (`--budget`), not here.

use crate::memory::fmt_size;
use anyhow::{bail, Result};

/// Inference activation bytes per input pixel and image (yolov9-s, CPU, f32; a floor of the
/// measurements in the module docs).
pub const INFER_BYTES_PER_PIXEL: u64 = 128;
/// Training-step bytes per input pixel and image of the micro-batch (yolov9-s, CPU, f32; a floor
/// of the measurements in the module docs).
pub const TRAIN_BYTES_PER_PIXEL: u64 = 2000;

/// What is estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Inference (`detect`, `val`): one forward of `images` images.
    Infer,
    /// A training step on a micro-batch of `images` images.
    Train,
}

impl Work {
    fn per_pixel(self) -> u64 {
        match self {
            Work::Infer => INFER_BYTES_PER_PIXEL,
            Work::Train => TRAIN_BYTES_PER_PIXEL,
        }
    }
}

/// The estimated bytes of `work` on `images` square `img`×`img` inputs (saturating).
pub fn estimate(work: Work, img: u32, images: usize) -> u64 {
    let px = u64::from(img) * u64::from(img);
    work.per_pixel()
        .saturating_mul(px)
        .saturating_mul(images as u64)
}

/// The request checked by [`check`]: the command's words for the options, for the error.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// What runs, e.g. `detect` or `a training step`.
    pub what: &'a str,
    /// The kind of work.
    pub work: Work,
    /// `--img`.
    pub img: u32,
    /// Images at once (≥ 1).
    pub images: usize,
    /// The option that sets `images`, e.g. `--batch` (`None` where it is fixed at 1).
    pub batch_option: Option<&'a str>,
    /// An option that splits the batch into smaller steps, e.g. train's `--micro-batch`.
    pub split_option: Option<&'a str>,
}

/// Refuses `req` when its [`estimate`] exceeds `available` bytes (`available_what` says what
/// that is, e.g. `free memory (MemAvailable)` or `--budget 4GiB`). The error names `--img`
/// (and the batch option when more than one image), the estimate, what is available, and the
/// largest `--img` (multiple of 32) and batch that would fit.
pub fn check(req: &Request<'_>, available: u64, available_what: &str) -> Result<()> {
    let images = req.images.max(1);
    let need = estimate(req.work, req.img, images);
    if need <= available {
        return Ok(());
    }
    let per_px = req.work.per_pixel();
    let budget = available_what.starts_with("--budget");
    let side = |n: usize| -> u64 {
        let px = available / per_px.saturating_mul(n as u64).max(1);
        ((px as f64).sqrt() as u64) / 32 * 32
    };
    let batch_words = match req.batch_option {
        Some(opt) if images > 1 => format!(" {opt} {images}"),
        _ => String::new(),
    };
    let mut todo = vec![match side(images) {
        0 => "lower --img".to_string(),
        s => format!("lower --img to at most {s}"),
    }];
    if let Some(opt) = req.batch_option {
        let fit = available / estimate(req.work, req.img, 1).max(1);
        if images > 1 && fit >= 1 {
            todo.push(match req.split_option {
                Some(split) => {
                    format!("lower {opt} to at most {fit} (or keep it and add {split} {fit})")
                }
                None => format!("lower {opt} to at most {fit}"),
            });
        } else if images > 1 {
            todo.push(format!("use {opt} 1 with --img at most {}", side(1)));
        }
    }
    todo.push(if budget {
        "raise --budget".to_string()
    } else {
        "free memory".to_string()
    });
    bail!(
        "{}--img {}{batch_words}: {} on the CPU needs about {} at this size ({} bytes per pixel \
         per image × {images} image(s) of {}x{}, measured for yolov9-s; larger models need \
         more), but {} is available ({available_what}); {}",
        if budget {
            format!("{available_what} is too small: ")
        } else {
            String::new()
        },
        req.img,
        req.what,
        fmt_size(need),
        per_px,
        req.img,
        req.img,
        fmt_size(available),
        todo.join(", or ")
    )
}

/// [`check`] against this machine: on the CPU the free memory (`MemAvailable`), or `budget`
/// when that is smaller; nothing is checked on other devices (sized by measurement there).
pub fn check_device(
    req: &Request<'_>,
    device: &candle_core::Device,
    budget: Option<u64>,
) -> Result<()> {
    if !device.is_cpu() {
        return Ok(());
    }
    let probe = crate::memory::MemoryProbe::new(device)?;
    let free = probe.free_bytes();
    if free == 0 {
        return Ok(()); // unknown: nothing to check against
    }
    match budget {
        Some(b) if b < free => check(req, b, &format!("--budget {}", fmt_size(b))),
        _ => check(req, free, "free memory, MemAvailable"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn req(work: Work, img: u32, images: usize) -> Request<'static> {
        Request {
            what: "test",
            work,
            img,
            images,
            batch_option: Some("--batch"),
            split_option: None,
        }
    }

    #[test]
    fn normal_sizes_pass_on_a_24_gib_machine() {
        // A 24 GiB machine shows about 20 GiB available once the OS and the model are in.
        let avail = 20 * GIB;
        assert!(check(&req(Work::Train, 640, 16), avail, "x").is_ok());
        assert!(check(&req(Work::Infer, 640, 1), avail, "x").is_ok());
        assert!(check(&req(Work::Infer, 1280, 1), avail, "x").is_ok());
        assert!(check(&req(Work::Infer, 640, 32), avail, "x").is_ok());
        assert_eq!(estimate(Work::Train, 640, 16), 2000 * 640 * 640 * 16);
    }

    #[test]
    fn an_oversized_request_names_the_options_the_need_and_the_way_out() {
        let e = format!(
            "{:#}",
            check(&req(Work::Infer, 8192, 1), 4 * GIB, "free").unwrap_err()
        );
        assert!(e.contains("--img 8192:") && e.contains("8.00GiB"), "{e}");
        assert!(e.contains("4.00GiB is available (free)"), "{e}");
        // sqrt(4 GiB / 128) = 5792.6 -> 5792
        assert!(e.contains("at most 5792"), "{e}");
        let e = format!(
            "{:#}",
            check(&req(Work::Train, 640, 64), 20 * GIB, "free").unwrap_err()
        );
        assert!(e.contains("--img 640 --batch 64"), "{e}");
        // 20 GiB / (2000 * 640^2) = 26.2 -> 26
        assert!(e.contains("lower --batch to at most 26"), "{e}");
        let mut r = req(Work::Train, 640, 64);
        r.split_option = Some("--micro-batch");
        let e = format!("{:#}", check(&r, 20 * GIB, "--budget 20GiB").unwrap_err());
        assert!(
            e.contains("(or keep it and add --micro-batch 26)") && e.ends_with("raise --budget"),
            "{e}"
        );
        assert_eq!(estimate(Work::Train, u32::MAX, usize::MAX), u64::MAX);
    }
}
