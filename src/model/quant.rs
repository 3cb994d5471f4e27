//! INT8 post-training static quantization for the CPU engine: the calibration record stored in a
//! weights file, and the calibration that makes it.
//!
//! The scheme is ONNX Runtime's and OpenVINO's static quantization (QDQ, "MinMax" calibration):
//! each convolution's input is quantized per tensor to `u8` over the range its values took on
//! calibration images (an f32 forward of each), and its weights per output channel,
//! symmetrically, to `i8`; the sums are exact in i32 and the bias, SiLU and residual are
//! applied in f32 (`src/model/cpu/int8.rs` has the arithmetic). The convolutions that write the
//! head's outputs (box distribution and class logits) stay f32, and so does everything that is
//! not a convolution (pools, upsampling, the DFL and box decode).
//!
//! A file with a calibration (`yolo9 convert W --int8 --data data.yaml`) keeps its f32 weights,
//! so it loads anywhere like any other: on the CPU the engine quantizes them at load and runs the
//! INT8 kernels (AVX-512 VNNI; elsewhere a portable loop, correct but slow); on a GPU, or with
//! `YOLO9_CPU_ENGINE=0`, the calibration is ignored and the model runs in floating point.

use super::weights::Weights;
use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One convolution's calibrated input range, in the order the traced inference forward runs
/// the convolutions; its shape identifies it (a calibration of another model is refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConvRange {
    /// Output channels.
    pub co: usize,
    /// Input channels.
    pub ci: usize,
    /// Kernel size (square).
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Smallest input value seen (activation units, the f32 forward's).
    pub min: f32,
    /// Largest input value seen.
    pub max: f32,
    /// Run this convolution in f32 all the same (a layer that loses accuracy in INT8).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_f32: bool,
}

/// The INT8 calibration of a model: every convolution's input range ([`ConvRange`]), stored in
/// a weights file's metadata (`"int8"` in the `yolo9` metadata JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Int8Calibration {
    /// How the ranges were taken (`"minmax"`: the extremes over the images).
    pub method: String,
    /// Images the ranges were taken on.
    pub images: usize,
    /// Image size (pixels, the longer side after letterboxing).
    pub imgsz: u32,
    /// Every convolution of the inference forward, in trace order.
    pub convs: Vec<ConvRange>,
}

/// What [`calibrate`] read.
#[derive(Debug, Clone)]
pub struct CalibrationReport {
    /// Images whose ranges were taken.
    pub used: usize,
    /// Images that could not be read or decoded, with the reason (skipped).
    pub skipped: Vec<(PathBuf, String)>,
}

/// Calibrates `weights` for INT8: each image of `images` decoded, letterboxed to `imgsz` (as
/// `yolo9 detect`), run through the f32 CPU engine on `threads` threads (0: all), and every
/// convolution's input range widened to the values seen.
///
/// Errors: weights the CPU engine cannot run, or no image that could be read (a bad image is
/// skipped and reported, not fatal).
pub fn calibrate(
    weights: &Weights,
    images: &[PathBuf],
    imgsz: u32,
    threads: usize,
) -> Result<(Int8Calibration, CalibrationReport)> {
    let dev = candle_core::Device::Cpu;
    let model = super::YoloV9::load(weights, &dev)?.with_threads(threads);
    let engine = model
        .cpu_engine()
        .context("int8 calibration needs the CPU engine, which cannot run this model")?;
    let mut ranges: Option<Vec<ConvRange>> = None;
    let mut report = CalibrationReport {
        used: 0,
        skipped: Vec::new(),
    };
    for path in images {
        let x = match crate::data::image::load_rgb8(path).and_then(|img| {
            let (lb, _) = crate::detect::letterbox::letterbox(&img, imgsz, 32)?;
            crate::detect::letterbox::to_tensor(&[&lb], &dev)
        }) {
            Ok(x) => x,
            Err(e) => {
                report.skipped.push((path.clone(), format!("{e:#}")));
                continue;
            }
        };
        let seen = engine.conv_input_ranges(&x)?;
        match &mut ranges {
            None => ranges = Some(seen),
            Some(r) => {
                for (a, b) in r.iter_mut().zip(seen) {
                    a.min = a.min.min(b.min);
                    a.max = a.max.max(b.max);
                }
            }
        }
        report.used += 1;
    }
    ensure!(
        report.used > 0,
        "int8 calibration: none of the {} images could be read{}",
        images.len(),
        report
            .skipped
            .first()
            .map(|(p, e)| format!(" (first: {}: {e})", crate::text::path(p)))
            .unwrap_or_default()
    );
    Ok((
        Int8Calibration {
            method: "minmax".into(),
            images: report.used,
            imgsz,
            convs: ranges.unwrap_or_default(),
        },
        report,
    ))
}
