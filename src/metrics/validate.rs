//! Validation as the official `val_dual.py run`: letterboxed rectangular batches, no augmentation,
//! multi-label NMS, `process_batch` / `ap_per_class`, and (for the training graph) real val losses.
//!
//! Pipeline per image (official `LoadImagesAndLabels(rect=True, pad=0.5)` + `val_dual.run`):
//! 1. images sorted by aspect ratio `h/w`; consecutive groups of `batch` share one network shape
//!    `ceil(shape · img / 32 + pad) · 32` ([`rect_batches`]);
//! 2. each image is resized so its long side is `img` (only when it differs), then letterboxed
//!    without upscaling into the batch shape, grey 114 ([`letterbox_to`]);
//! 3. the main branch output goes through multi-label NMS ([`nms_multilabel`], conf 0.001,
//!    IoU 0.7, max_det 300);
//! 4. detections and labels are mapped back to original-image pixels (official `scale_boxes` with
//!    the loader's `ratio_pad`, clipped) and matched by `process_batch`.

use crate::data::image::load_rgb8;
use crate::data::scan::SplitScan;
use crate::detect::device_nms::batch_nms;
use crate::detect::letterbox::{apply_letterbox, letterbox_info_scaled};
use crate::detect::nms::{nms_image, NmsOptions};
use crate::detect::postprocess::device_nms_enabled;
use crate::loss::DualTalLoss;
use crate::metrics::ap::{ValMetrics, ValStats};
use crate::model::yolov9::{YoloV9, YoloV9Train};
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use image::RgbImage;
use rayon::prelude::*;
use std::path::PathBuf;

/// Validation settings (official `val_dual.py` defaults).
#[derive(Debug, Clone)]
pub struct ValConfig {
    /// Long side of the network input in pixels (`--img`, multiple of 32).
    pub img: u32,
    /// Images per batch (`--batch`).
    pub batch: usize,
    /// Confidence threshold (strict `>`), default 0.001.
    pub conf_thres: f32,
    /// NMS IoU threshold (suppress when IoU `>` it), default 0.7.
    pub iou_thres: f32,
    /// Detections kept per image, default 300.
    pub max_det: usize,
    /// Rect padding in strides (official 0.5).
    pub pad: f64,
    /// Images per forward pass inside a batch (bounds memory; results per image do not depend
    /// on it; val losses are averaged over these chunks).
    pub forward_chunk: usize,
    /// Show a progress bar.
    pub progress: bool,
    /// Also fill the confusion matrix ([`ValResult::confusion`]).
    pub confusion: bool,
    /// Also keep every image's detections and labels in original pixels
    /// ([`ValResult::detections`]), e.g. for `--save-json`.
    pub collect: bool,
    /// Asked before each batch: a stop request ends validation with
    /// [`crate::cancel::Stopped`] (phase [`VAL_PHASE`]).
    pub cancel: crate::cancel::Cancel,
}

/// The phase name of a validation that was stopped ([`crate::cancel::Stopped::phase`]).
pub const VAL_PHASE: &str = "validation";

impl Default for ValConfig {
    fn default() -> Self {
        ValConfig {
            img: 640,
            batch: 32,
            conf_thres: 0.001,
            iou_thres: 0.7,
            max_det: 300,
            pad: 0.5,
            forward_chunk: 4,
            progress: false,
            confusion: false,
            collect: false,
            cancel: crate::cancel::Cancel::never(),
        }
    }
}

/// One validation image: file, original size (EXIF-corrected, pixels) and labels
/// `(cls, [cx, cy, w, h])` normalized to the original image.
#[derive(Debug, Clone)]
pub struct ValImage {
    /// Image file.
    pub path: PathBuf,
    /// Original width in pixels.
    pub width: u32,
    /// Original height in pixels.
    pub height: u32,
    /// Normalized labels.
    pub labels: Vec<(u32, [f32; 4])>,
    /// Segmentation datasets: one outline per label (normalized points; empty for a box row),
    /// as [`crate::data::scan::ImageRecord::segments`]. Empty for detection.
    pub outlines: Vec<Vec<[f32; 2]>>,
}

/// The usable images of a scanned split (records with a decodable image; missing/empty labels
/// give background images).
pub fn val_images(scan: &SplitScan) -> Vec<ValImage> {
    scan.records
        .iter()
        .map(|r| ValImage {
            path: r.image.clone(),
            width: r.width,
            height: r.height,
            labels: r
                .boxes
                .iter()
                .map(|b| (b.cls, [b.cx, b.cy, b.w, b.h]))
                .collect(),
            outlines: r.segments.clone(),
        })
        .collect()
}

/// The model being validated.
pub enum ValModel<'a> {
    /// Fused inference graph (no val losses).
    Infer(&'a YoloV9),
    /// Training graph in eval mode (e.g. the EMA): main branch for NMS, both branches for the
    /// val losses.
    Train {
        /// The model (BN in eval mode during validation).
        model: &'a YoloV9Train,
        /// The training loss, used to compute val losses.
        loss: &'a DualTalLoss,
    },
}

impl ValModel<'_> {
    fn device(&self) -> &Device {
        match self {
            ValModel::Infer(m) => m.device(),
            ValModel::Train { model, .. } => model.device(),
        }
    }
}

/// Result of [`validate`].
#[derive(Debug, Clone)]
pub struct ValResult {
    /// P, R, mAP50, mAP50-95 overall and per class (of the boxes).
    pub metrics: ValMetrics,
    /// A segmentation model's mask P, R, mAP50, mAP50-95 (matched by mask IoU, official
    /// `segment/val.py`); `None` for a detection model.
    pub masks: Option<ValMetrics>,
    /// Mean val losses `[box, cls, dfl]` over batches (training graph only).
    pub losses: Option<[f32; 3]>,
    /// A segmentation model's mean val mask loss over batches (the `seg` item of
    /// [`crate::loss::seg::seg_loss`]; training graph only).
    pub seg_loss: Option<f32>,
    /// Images that could not be decoded (path, reason); they are left out of the metrics.
    pub skipped: Vec<(PathBuf, String)>,
    /// Wall time in seconds.
    pub seconds: f64,
    /// The confusion matrix (conf 0.25, IoU 0.45), when [`ValConfig::confusion`] asked for it.
    pub confusion: Option<crate::metrics::confusion::ConfusionMatrix>,
    /// Per validated image, in the order validated (by aspect ratio, not input order): its
    /// detections and labels in original pixels, exactly as matched for the table; present when
    /// [`ValConfig::collect`] asked for them. Skipped images have no entry.
    pub detections: Option<Vec<ImageDetections>>,
}

/// One validated image's detections and labels in original-image pixels
/// ([`ValResult::detections`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageDetections {
    /// Index into the `images` given to [`validate`].
    pub image: usize,
    /// Detections `[x1, y1, x2, y2, conf, cls]` (xyxy pixels, clipped), by decreasing conf.
    pub dets: Vec<[f32; 6]>,
    /// Labels `[cls, x1, y1, x2, y2]` (xyxy pixels, clipped to the image).
    pub labels: Vec<[f32; 5]>,
}

/// Rectangular batches (official `rect=True`): returns the image order (sorted by `h/w`, stable)
/// and, for each batch of `batch` consecutive images of that order, the network shape
/// `(height, width)` in pixels = `ceil(shape · img / stride + pad) · stride`, where `shape` is
/// `[maxi, 1]` when every aspect ratio of the batch is below 1, `[1, 1/mini]` when all are above
/// 1, else `[1, 1]`. `sizes` are `(width, height)` of the original images.
pub fn rect_batches(
    sizes: &[(u32, u32)],
    batch: usize,
    img: u32,
    stride: u32,
    pad: f64,
) -> (Vec<usize>, Vec<(u32, u32)>) {
    let batch = batch.max(1);
    let ar: Vec<f64> = sizes
        .iter()
        .map(|&(w, h)| h as f64 / w.max(1) as f64)
        .collect();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| ar[a].total_cmp(&ar[b]));
    let shapes = order
        .chunks(batch)
        .map(|chunk| {
            let mini = chunk.iter().map(|&i| ar[i]).fold(f64::INFINITY, f64::min);
            let maxi = chunk.iter().map(|&i| ar[i]).fold(0.0, f64::max);
            let (sh, sw) = if maxi < 1.0 {
                (maxi, 1.0)
            } else if mini > 1.0 {
                (1.0, 1.0 / mini)
            } else {
                (1.0, 1.0)
            };
            let f = |s: f64| ((s * img as f64 / stride as f64 + pad).ceil() as u32) * stride;
            (f(sh), f(sw))
        })
        .collect();
    (order, shapes)
}

/// Letterbox `img` into `(height, width)` = `shape` (official `letterbox(auto=False)`, with
/// `scaleup` as given): the geometry of [`letterbox_info_scaled`] and the pixels of
/// [`apply_letterbox`], as `yolo9 detect`. Returns the image, the ratio `r` and the float
/// padding `(dw, dh)` per side. Errors on a zero-sized image or shape.
pub fn letterbox_to(
    img: &RgbImage,
    shape: (u32, u32),
    scaleup: bool,
) -> Result<(RgbImage, f64, (f64, f64))> {
    let (th, tw) = shape;
    let info = letterbox_info_scaled(img.width(), img.height(), th, tw, 32, false, scaleup)?;
    Ok((apply_letterbox(img, &info), info.ratio, info.pad()))
}

/// Multi-label NMS of one image as `val_dual.py` runs it (official `non_max_suppression` with
/// `multi_label=True`): `pred` is `(4 + nc) × A` row-major (rows cx, cy, w, h in input pixels,
/// then sigmoid scores). The detect pipeline's [`nms_image`] does the work; rows are
/// `[x1, y1, x2, y2, conf, cls]` in input pixels, by decreasing confidence.
pub fn nms_multilabel(
    pred: &[f32],
    nc: usize,
    conf_thres: f32,
    iou_thres: f32,
    max_det: usize,
) -> Vec<[f32; 6]> {
    let rows = 4 + nc;
    if nc == 0 || !pred.len().is_multiple_of(rows) {
        return Vec::new();
    }
    let opts = multilabel_options(conf_thres, iou_thres, max_det);
    nms_image(pred, nc, pred.len() / rows, &opts)
}

/// The NMS options of validation: multi-label, class-aware, the given thresholds (the IoU
/// threshold widened from f32 as the official code passes it) and `max_det`.
pub(crate) fn multilabel_options(conf_thres: f32, iou_thres: f32, max_det: usize) -> NmsOptions {
    NmsOptions {
        conf_thres,
        iou_thres: iou_thres as f64,
        classes: None,
        agnostic: false,
        multi_label: true,
        max_det,
    }
}

pub(crate) struct Prepared {
    pub(crate) chw: Vec<u8>,
    /// load_image gain (resized / original), as the official `ratio_pad[0][0]`.
    pub(crate) gain: f64,
    pub(crate) pad: (f64, f64),
}

fn prepare(img: &RgbImage, img_size: u32, shape: (u32, u32)) -> Result<Prepared> {
    let h0 = img.height();
    let resized = crate::data::augment::resize_long_side(img, img_size);
    let gain = resized.height() as f64 / h0 as f64;
    let (lb, _r, pad) = letterbox_to(&resized, shape, false)?;
    let (w, h) = lb.dimensions();
    let plane = (w * h) as usize;
    let mut chw = vec![0u8; 3 * plane];
    for (i, p) in lb.pixels().enumerate() {
        chw[i] = p[0];
        chw[plane + i] = p[1];
        chw[2 * plane + i] = p[2];
    }
    Ok(Prepared { chw, gain, pad })
}

/// Maps `[x1, y1, x2, y2]` from network-input pixels to original pixels (official `scale_boxes`
/// with `ratio_pad`), clipped to `(w0, h0)`.
pub fn scale_box_back(b: [f32; 4], gain: f64, pad: (f64, f64), w0: u32, h0: u32) -> [f32; 4] {
    let g = gain as f32;
    let (px, py) = (pad.0 as f32, pad.1 as f32);
    [
        ((b[0] - px) / g).clamp(0.0, w0 as f32),
        ((b[1] - py) / g).clamp(0.0, h0 as f32),
        ((b[2] - px) / g).clamp(0.0, w0 as f32),
        ((b[3] - py) / g).clamp(0.0, h0 as f32),
    ]
}

/// Runs validation over `images` (official `val_dual.run`): the boxes (of a segmentation model
/// too; its masks: [`crate::metrics::seg_val::validate_seg`]). Images that fail to decode are
/// reported in [`ValResult::skipped`] and left out. Errors: empty list, model failures.
pub fn validate(model: ValModel<'_>, images: &[ValImage], cfg: &ValConfig) -> Result<ValResult> {
    let device = model.device().clone();
    let nc = match &model {
        ValModel::Infer(m) => m.meta().nc,
        ValModel::Train { model, .. } => model.meta().nc,
    };
    let mut losses = LossSum::default();
    let run = run_batches(images, cfg, &device, nc, |ok, hw, run| {
        let y = forward(&model, &device, images, ok, hw, &mut losses)?;
        for (i, (detn, labels)) in detections(&y, &device, images, ok, nc, cfg)? {
            run.add(i, detn, labels);
        }
        Ok(())
    })?;
    Ok(run.finish(nc, losses.mean()))
}

/// The loop of a validation run ([`validate`], [`crate::metrics::seg_val::validate_seg`]):
/// checks the list and `--img`, sorts the images into rectangular batches ([`rect_batches`]),
/// decodes and letterboxes each batch (an image that fails is recorded as skipped), and hands
/// `f` the prepared images with their network input `(h, w)`, the CPU in chunks of
/// [`ValConfig::forward_chunk`] (memory), a GPU the whole batch. Returns what `f` collected.
///
/// Errors: an empty list, `--img` not a positive multiple of 32, a stop request, `f`'s.
pub(crate) fn run_batches(
    images: &[ValImage],
    cfg: &ValConfig,
    device: &Device,
    nc: usize,
    mut f: impl FnMut(&[(usize, Prepared)], (usize, usize), &mut Collect) -> Result<()>,
) -> Result<Collect> {
    ensure!(!images.is_empty(), "validation: no images to validate");
    ensure!(
        cfg.img >= 32 && cfg.img.is_multiple_of(32),
        "validation: --img {} must be a positive multiple of 32",
        cfg.img
    );
    let sizes: Vec<(u32, u32)> = images.iter().map(|i| (i.width, i.height)).collect();
    let (order, shapes) = rect_batches(&sizes, cfg.batch, cfg.img, 32, cfg.pad);
    let mut run = Collect::start(cfg, nc, images.len());
    for (bi, chunk) in order.chunks(cfg.batch.max(1)).enumerate() {
        cfg.cancel.check(VAL_PHASE)?;
        let shape = shapes[bi];
        let ok = prepare_batch(images, chunk, cfg.img, shape, &mut run.skipped);
        run.advance(chunk.len());
        if ok.is_empty() {
            continue;
        }
        let hw = (shape.0 as usize, shape.1 as usize);
        let step = if device.is_cpu() {
            cfg.forward_chunk.max(1)
        } else {
            ok.len().max(1)
        };
        for ok in ok.chunks(step) {
            f(ok, hw, &mut run)?;
        }
    }
    Ok(run)
}

/// The prepared images `ok` at `(h, w)` as the network input: `(B, 3, h, w)` f32 RGB in 0..1 on
/// `device`.
pub(crate) fn input_tensor(
    ok: &[(usize, Prepared)],
    (h, w): (usize, usize),
    device: &Device,
) -> Result<Tensor> {
    let mut bytes = Vec::with_capacity(ok.len() * 3 * h * w);
    for (_, p) in ok {
        bytes.extend_from_slice(&p.chw);
    }
    Ok(Tensor::from_vec(bytes, (ok.len(), 3, h, w), device)?
        .to_dtype(DType::F32)?
        .broadcast_div(&Tensor::new(255f32, device)?)?)
}

/// What a validation loop gathers ([`validate`], [`validate_tiled`]): the statistics, the
/// collected detections ([`ValConfig::collect`]), the skipped images, the progress bar and the
/// clock.
pub(crate) struct Collect {
    stats: ValStats,
    collected: Option<Vec<ImageDetections>>,
    pub(crate) skipped: Vec<(PathBuf, String)>,
    pb: Option<indicatif::ProgressBar>,
    t0: std::time::Instant,
}

impl Collect {
    /// Starts the clock and the bar over `n` images, as `cfg` asks.
    pub(crate) fn start(cfg: &ValConfig, nc: usize, n: usize) -> Self {
        Self {
            stats: if cfg.confusion {
                ValStats::with_confusion(nc)
            } else {
                ValStats::default()
            },
            collected: cfg.collect.then(Vec::new),
            skipped: Vec::new(),
            pb: cfg.progress.then(|| progress_bar(n)),
            t0: std::time::Instant::now(),
        }
    }

    /// `n` more images read (validated or skipped).
    pub(crate) fn advance(&mut self, n: usize) {
        if let Some(pb) = &self.pb {
            pb.inc(n as u64);
        }
    }

    /// Image `image`'s detections and labels, in original pixels.
    pub(crate) fn add(&mut self, image: usize, dets: Vec<[f32; 6]>, labels: Vec<[f32; 5]>) {
        self.stats.add_image(&dets, &labels);
        if let Some(c) = self.collected.as_mut() {
            c.push(ImageDetections {
                image,
                dets,
                labels,
            });
        }
    }

    pub(crate) fn finish(mut self, nc: usize, losses: Option<[f32; 3]>) -> ValResult {
        if let Some(pb) = self.pb {
            pb.finish_and_clear();
        }
        ValResult {
            metrics: self.stats.metrics(nc),
            masks: None,
            losses,
            seg_loss: None,
            skipped: self.skipped,
            seconds: self.t0.elapsed().as_secs_f64(),
            confusion: self.stats.confusion.take(),
            detections: self.collected,
        }
    }
}

/// The `validating` progress bar over `n` images.
fn progress_bar(n: usize) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n as u64);
    pb.set_style(crate::progress::style(
        "{msg:>22} {bar:30} {pos}/{len} [{elapsed_precise}<{remaining}]",
        0,
    ));
    pb.set_message("validating");
    pb
}

/// The val losses `[box, cls, dfl]` summed over batches (training graph only).
#[derive(Default)]
struct LossSum {
    sum: [f64; 3],
    batches: usize,
}

impl LossSum {
    /// The mean per batch, `None` when no batch had a loss.
    fn mean(&self) -> Option<[f32; 3]> {
        (self.batches > 0).then(|| {
            let n = self.batches as f64;
            [
                (self.sum[0] / n) as f32,
                (self.sum[1] / n) as f32,
                (self.sum[2] / n) as f32,
            ]
        })
    }
}

/// Decodes and letterboxes the images `chunk` (indices into `images`) to `shape` in parallel;
/// an image that fails is added to `skipped` with its reason and left out.
pub(crate) fn prepare_batch(
    images: &[ValImage],
    chunk: &[usize],
    img_size: u32,
    shape: (u32, u32),
    skipped: &mut Vec<(PathBuf, String)>,
) -> Vec<(usize, Prepared)> {
    let prepared: Vec<(usize, Result<Prepared>)> = chunk
        .par_iter()
        .map(|&i| {
            (
                i,
                load_rgb8(&images[i].path).and_then(|img| prepare(&img, img_size, shape)),
            )
        })
        .collect();
    let mut ok = Vec::new();
    for (i, p) in prepared {
        match p {
            Ok(p) => ok.push((i, p)),
            Err(e) => skipped.push((images[i].path.clone(), format!("{e:#}"))),
        }
    }
    ok
}

/// The forward of the prepared images `ok` at `(h, w)`: the inference output `(B, 4 + nc, A)`;
/// with the training graph also the val losses, added to `losses`.
fn forward(
    model: &ValModel<'_>,
    device: &Device,
    images: &[ValImage],
    ok: &[(usize, Prepared)],
    (h, w): (usize, usize),
    losses: &mut LossSum,
) -> Result<Tensor> {
    let x = input_tensor(ok, (h, w), device)?;
    Ok(match model {
        // `YoloV9::forward` picks its CPU threads itself (the engine's, or candle's pool).
        ValModel::Infer(m) => m.forward(&x)?,
        ValModel::Train { model, loss } => {
            // candle's own CPU pool runs the whole forward (see `YoloV9::forward`).
            let raw = device.with_context(|| model.forward(&x, false))?;
            let rows = letterboxed_targets(images, ok, (h, w));
            let t = crate::loss::tal_loss::targets_tensor(&rows, &Device::Cpu)?;
            let lo = loss
                .compute(&raw.aux, &raw.main, &t, (h, w))
                .context("validation loss")?;
            for (s, v) in losses.sum.iter_mut().zip(lo.items) {
                *s += v as f64;
            }
            losses.batches += 1;
            raw.decode()?.1
        }
    })
}

/// The multi-label NMS of the output `y` of the prepared images `ok`, in original pixels with
/// their labels, in image order: `(index into images, (detections, labels))`.
#[allow(clippy::type_complexity)]
fn detections(
    y: &Tensor,
    device: &Device,
    images: &[ValImage],
    ok: &[(usize, Prepared)],
    nc: usize,
    cfg: &ValConfig,
) -> Result<Vec<(usize, (Vec<[f32; 6]>, Vec<[f32; 5]>))>> {
    if device_nms_enabled(device) {
        // The batch's NMS in one launch on the device; only kept rows come back.
        let kept = batch_nms(
            y,
            &multilabel_options(cfg.conf_thres, cfg.iou_thres, cfg.max_det),
        )?;
        return Ok(ok
            .iter()
            .zip(kept)
            .map(|((i, p), det)| (*i, native_space(&images[*i], &det, p)))
            .collect());
    }
    let y = y.to_device(&Device::Cpu)?.to_dtype(DType::F32)?;
    let per_image = y.dim(1)? * y.dim(2)?;
    let all: Vec<f32> = y.flatten_all()?.to_vec1()?;
    // NMS of the images in parallel, statistics in image order.
    Ok(ok
        .par_iter()
        .enumerate()
        .map(|(k, (i, p))| {
            let flat = &all[k * per_image..(k + 1) * per_image];
            let det = nms_multilabel(flat, nc, cfg.conf_thres, cfg.iou_thres, cfg.max_det);
            (*i, native_space(&images[*i], &det, p))
        })
        .collect())
}

/// Targets `[k, cls, cx, cy, w, h]` normalized to the letterboxed input `(h, w)`, as the official
/// loader builds them.
fn letterboxed_targets(
    images: &[ValImage],
    ok: &[(usize, Prepared)],
    hw: (usize, usize),
) -> Vec<[f32; 6]> {
    let mut rows = Vec::new();
    for (k, (i, p)) in ok.iter().enumerate() {
        rows.extend(image_targets(&images[*i], p, hw, k));
    }
    rows
}

/// The targets of one image, number `k` of its batch, letterboxed by `p` into an `(h, w)` input:
/// rows `[k, cls, cx, cy, w, h]` normalized to the input, in label order.
pub(crate) fn image_targets(
    im: &ValImage,
    p: &Prepared,
    hw: (usize, usize),
    k: usize,
) -> Vec<[f32; 6]> {
    let (h, w) = (hw.0 as f64, hw.1 as f64);
    let rw = im.width as f64 * p.gain;
    let rh = im.height as f64 * p.gain;
    im.labels
        .iter()
        .map(|(c, l)| {
            let cx = (l[0] as f64 * rw + p.pad.0) / w;
            let cy = (l[1] as f64 * rh + p.pad.1) / h;
            let bw = l[2] as f64 * rw / w;
            let bh = l[3] as f64 * rh / h;
            [
                k as f32, *c as f32, cx as f32, cy as f32, bw as f32, bh as f32,
            ]
        })
        .collect()
}

/// Detections (network-input pixels) and labels (normalized) of one image in original pixels:
/// rows `[x1, y1, x2, y2, conf, cls]` and `[cls, x1, y1, x2, y2]`, clipped to the image.
pub(crate) fn native_space(
    im: &ValImage,
    det: &[[f32; 6]],
    p: &Prepared,
) -> (Vec<[f32; 6]>, Vec<[f32; 5]>) {
    let detn = det
        .iter()
        .map(|d| {
            let b = scale_box_back([d[0], d[1], d[2], d[3]], p.gain, p.pad, im.width, im.height);
            [b[0], b[1], b[2], b[3], d[4], d[5]]
        })
        .collect();
    (detn, native_labels(im))
}

/// The labels of `im` as `[cls, x1, y1, x2, y2]` in original pixels, clipped to the image.
fn native_labels(im: &ValImage) -> Vec<[f32; 5]> {
    let (w0, h0) = (im.width as f32, im.height as f32);
    im.labels
        .iter()
        .map(|(c, l)| {
            [
                *c as f32,
                ((l[0] - l[2] / 2.0) * w0).clamp(0.0, w0),
                ((l[1] - l[3] / 2.0) * h0).clamp(0.0, h0),
                ((l[0] + l[2] / 2.0) * w0).clamp(0.0, w0),
                ((l[1] + l[3] / 2.0) * h0).clamp(0.0, h0),
            ]
        })
        .collect()
}

/// Validation with sliced inference ([`crate::detect::tile`]): each image decoded whole and
/// detected by `detector`, whose options ([`crate::detect::config::DetectorConfig::tile`], and for the official
/// protocol conf 0.001, IoU 0.7, max_det 300, multi-label) give the tiles and the NMS; the
/// statistics as [`validate`]'s. Letterboxes are detect's (minimal stride padding per tile), not
/// the rectangular batches of [`validate`]; `cfg.batch` is unused (tiles are batched per image).
/// Errors: empty list, model failures (an image that cannot be decoded is skipped).
pub fn validate_tiled(
    detector: &crate::detect::detector::Detector,
    images: &[ValImage],
    cfg: &ValConfig,
) -> Result<ValResult> {
    ensure!(!images.is_empty(), "validation: no images to validate");
    let nc = detector.names().len();
    let mut run = Collect::start(cfg, nc, images.len());
    for (i, im) in images.iter().enumerate() {
        cfg.cancel.check(VAL_PHASE)?;
        run.advance(1);
        let img = match load_rgb8(&im.path) {
            Ok(img) => img,
            Err(e) => {
                run.skipped.push((im.path.clone(), format!("{e:#}")));
                continue;
            }
        };
        let dets: Vec<[f32; 6]> = detector
            .detect_rgb(&img)?
            .iter()
            .map(|d| {
                let b = d.bbox;
                [b[0], b[1], b[2], b[3], d.confidence, d.class_id as f32]
            })
            .collect();
        run.add(i, dets, native_labels(im));
    }
    Ok(run.finish(nc, None))
}
