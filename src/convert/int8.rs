//! `yolo9 convert --int8`: the INT8 calibration of a model for the CPU engine
//! ([`crate::model::quant`] has the record and the scheme): f32 forwards of calibration images,
//! every convolution's input range taken, stored in the weights' metadata.

#[cfg(feature = "train")]
use super::{convert, ConvertOptions, Report};
#[cfg(feature = "train")]
use crate::data::yaml::{DataConfig, Split};
use crate::model::quant::{ConvRange, Int8Calibration};
use crate::model::weights::Weights;
use anyhow::{ensure, Context, Result};
#[cfg(feature = "train")]
use std::path::Path;
use std::path::PathBuf;

/// INT8 calibration settings of [`quantize_file`] (feature `train`: it reads a dataset yaml) (`yolo9 convert --int8`).
#[cfg(feature = "train")]
#[derive(Debug, Clone)]
pub struct Int8Options {
    /// The dataset yaml whose `val` images (else `train`) calibrate the activations.
    pub data: std::path::PathBuf,
    /// Images to calibrate on, spread evenly over the split (all when fewer).
    pub images: usize,
    /// Letterbox size of the calibration forwards (pixels).
    pub imgsz: u32,
    /// CPU threads (0: all).
    pub threads: usize,
}

/// [`convert`], then an INT8 calibration ([`calibrate`]) on images of `int8.data`, stored in
/// the weights' metadata, then saved to `output` as [`super::convert_file`] does. The report's
/// notes say how many images calibrated and name each one skipped.
///
/// Errors: those of [`super::convert_file`], a dataset yaml that cannot be read, a split
/// without images, a calibration in which no image could be read.
#[cfg(feature = "train")]
pub fn quantize_file(
    input: &Path,
    output: &Path,
    opts: ConvertOptions,
    int8: &Int8Options,
) -> Result<Report> {
    let inputs = crate::outfile::Inputs::of([input, int8.data.as_path()]);
    crate::outfile::check(output, &inputs)?;
    let data = DataConfig::load(&int8.data)?;
    let mut images = data.list_images(Split::Val)?;
    if images.is_empty() {
        images = data.list_images(Split::Train)?;
    }
    ensure!(
        !images.is_empty(),
        "{}: no val or train images to calibrate on",
        crate::text::path(&int8.data)
    );
    let n = int8.images.clamp(1, images.len());
    let picked: Vec<_> = (0..n)
        .map(|i| images[i * images.len() / n].clone())
        .collect();
    let (mut weights, prov, mut report) = convert(input, &opts)?;
    let (calib, read) = calibrate(&weights, &picked, int8.imgsz, int8.threads)?;
    weights.meta.int8 = Some(std::sync::Arc::new(calib));
    crate::outfile::check(output, &inputs)?;
    weights.save_with_provenance(output, opts.half, Some(&prov))?;
    report.notes.push(format!(
        "--int8: calibrated on {} images of {} at {} px ({} skipped); the CPU engine runs it in \
         INT8 on x86-64 CPUs with AVX-512 VNNI, AVX-VNNI or AVX2, elsewhere in f32",
        read.used,
        crate::text::path(&int8.data),
        int8.imgsz,
        read.skipped.len()
    ));
    for (p, e) in &read.skipped {
        report
            .notes
            .push(format!("--int8: skipped {}: {e}", crate::text::path(p)));
    }
    Ok(report)
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
    let model = crate::model::YoloV9::load(weights, &dev)?.with_threads(threads);
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
