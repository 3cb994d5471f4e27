//! Validation of a segmentation model (official `segment/val.py run` with its loader
//! `LoadImagesAndLabelsAndMasks(rect=True, pad=0.5, overlap=True, downsample_ratio=4)`):
//!
//! 1. the rectangular batches and letterbox of detection validation
//!    ([`crate::metrics::validate::run_batches`]);
//! 2. each label's outline moved into the letterboxed input as the labels are (official
//!    `xyn2xy(segment, ratio·w, ratio·h, pad)`, no resampling) and rasterised into the image's
//!    overlap mask at `1 / 4` of the input ([`crate::data::polygons::overlap_mask`]); the labels
//!    take the mask's order (by decreasing area);
//! 3. [`YoloV9::forward_seg`], multi-label NMS carrying each kept row's anchor (conf 0.001,
//!    IoU 0.7, max_det 300), and each detection's mask at the prototypes' resolution
//!    ([`crate::metrics::seg::proto_mask`], `process_mask(upsample=False)`);
//! 4. boxes matched in original pixels (as detection), masks matched by mask IoU at the
//!    prototypes' resolution ([`crate::metrics::seg::add_masks`]).

use crate::data::polygons::{outlines_in_pixels, overlap_mask, MASK_RATIO};
use crate::detect::masks::Protos;
use crate::metrics::ap::ValStats;
use crate::metrics::seg::{add_masks, mask_iou, mask_iou_overlap, proto_mask};
use crate::metrics::validate::{
    input_tensor, multilabel_options, native_space, run_batches, Prepared, ValConfig, ValImage,
    ValResult,
};
use crate::model::head::flatten_levels;
use crate::model::yolov9::{YoloV9, YoloV9Train};
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

/// The segmentation model being validated.
#[derive(Clone, Copy)]
pub enum SegValModel<'a> {
    /// The fused inference graph ([`YoloV9::forward_seg`]).
    Infer(&'a YoloV9),
    /// The training graph in eval mode (the EMA during training): its main branch's boxes,
    /// coefficients and prototypes.
    Train(&'a YoloV9Train),
}

impl SegValModel<'_> {
    fn is_seg(&self) -> bool {
        match self {
            SegValModel::Infer(m) => m.is_seg(),
            SegValModel::Train(m) => m.is_seg(),
        }
    }

    fn nc(&self) -> usize {
        match self {
            SegValModel::Infer(m) => m.meta().nc,
            SegValModel::Train(m) => m.meta().nc,
        }
    }

    fn device(&self) -> &Device {
        match self {
            SegValModel::Infer(m) => m.device(),
            SegValModel::Train(m) => m.device(),
        }
    }

    /// `x` (B, 3, H, W) f32 → predictions `(B, 4 + nc + nm, A)` (boxes cx cy w h in pixels,
    /// sigmoid scores, raw coefficients) and prototypes `(B, nm, H / 4, W / 4)`.
    fn forward(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        match self {
            SegValModel::Infer(m) => m.forward_seg(x),
            SegValModel::Train(m) => {
                // candle's own CPU pool runs the whole forward (as the detection validation).
                let raw = m.device().with_context(|| m.forward(x, false))?;
                let sg = raw
                    .seg
                    .as_ref()
                    .context("the training graph has no mask outputs")?;
                let det = raw.decode()?.1;
                let coeffs = flatten_levels(&sg.main.0)?.to_dtype(det.dtype())?;
                Ok((Tensor::cat(&[&det, &coeffs], 1)?, sg.main.1.clone()))
            }
        }
    }
}

/// [`crate::metrics::validate::validate`] of a segmentation model with its masks: the box
/// metrics in [`ValResult::metrics`], the mask metrics in [`ValResult::masks`] (no val losses).
///
/// Errors: an empty list, a model without masks, model failures.
pub fn validate_seg(
    model: SegValModel<'_>,
    images: &[ValImage],
    cfg: &ValConfig,
) -> Result<ValResult> {
    ensure!(model.is_seg(), "a detection model has no masks to validate");
    let device = model.device().clone();
    let nc = model.nc();
    let mut masks = ValStats::default();
    let run = run_batches(images, cfg, &device, nc, |ok, hw, run| {
        let (pred, proto) = model.forward(&input_tensor(ok, hw, &device)?)?;
        let host = |t: Tensor| t.to_dtype(DType::F32)?.to_device(&Device::Cpu);
        let (pred, proto) = (host(pred)?, host(proto)?);
        for (i, dets, labels, iou) in seg_image_results(&pred, &proto, images, ok, hw, nc, cfg)? {
            add_masks(&mut masks, &dets, &labels, &iou);
            run.add(i, dets, labels);
        }
        Ok(())
    })?;
    let mut r = run.finish(nc, None);
    r.masks = Some(masks.metrics(nc));
    Ok(r)
}

/// One image's detections and labels in original pixels (labels in the overlap mask's order)
/// and the label-major mask IoU of its detections.
type SegImage = (usize, Vec<[f32; 6]>, Vec<[f32; 5]>, Vec<Vec<f32>>);

/// NMS, masks and ground truth of each prepared image, in image order.
fn seg_image_results(
    pred: &Tensor,
    proto: &Tensor,
    images: &[ValImage],
    ok: &[(usize, Prepared)],
    hw: (usize, usize),
    nc: usize,
    cfg: &ValConfig,
) -> Result<Vec<SegImage>> {
    let (b, rows, a) = pred.dims3()?;
    let (_, nm, ph, pw) = proto.dims4()?;
    ensure!(
        b == ok.len() && rows == 4 + nc + nm,
        "segmentation output {:?} does not fit {} images of {nc} classes",
        pred.shape(),
        ok.len()
    );
    let p_all: Vec<f32> = pred.flatten_all()?.to_vec1()?;
    let q_all: Vec<f32> = proto.flatten_all()?.to_vec1()?;
    let opts = multilabel_options(cfg.conf_thres, cfg.iou_thres, cfg.max_det);
    Ok(ok
        .par_iter()
        .enumerate()
        .map(|(k, (i, prep))| {
            let p = &p_all[k * rows * a..(k + 1) * rows * a];
            let q = &q_all[k * nm * ph * pw..(k + 1) * nm * ph * pw];
            let kept =
                crate::detect::nms::nms_image_anchored(&p[..(4 + nc) * a], nc, a, &opts, false);
            let rows6: Vec<[f32; 6]> = kept
                .iter()
                .map(|r| [r[0], r[1], r[2], r[3], r[4], r[5]])
                .collect();
            let (dets, labels) = native_space(&images[*i], &rows6, prep);
            let protos = Protos {
                data: q,
                nm,
                h: ph,
                w: pw,
            };
            let mut pm = Vec::with_capacity(kept.len() * ph * pw);
            for r in &kept {
                let anchor = r[6] as usize;
                let coeffs: Vec<f32> = (0..nm).map(|m| p[(4 + nc + m) * a + anchor]).collect();
                pm.extend(proto_mask(protos, &coeffs, [r[0], r[1], r[2], r[3]], hw));
            }
            let (gt, order) = gt_masks(&images[*i], prep, hw, (ph, pw));
            let labels: Vec<[f32; 5]> = order.iter().map(|&o| labels[o]).collect();
            let iou = if labels.is_empty() || dets.is_empty() {
                Vec::new()
            } else {
                match gt {
                    Gt::Overlap(ov) => mask_iou_overlap(&ov, labels.len(), &pm, ph * pw),
                    Gt::Planes(gm) => mask_iou(&gm, &pm, ph * pw),
                }
            };
            (*i, dets, labels, iou)
        })
        .collect())
}

/// An image's ground-truth masks at the prototypes' resolution.
enum Gt {
    /// The overlap mask itself (value `k + 1` where label `k` is).
    Overlap(Vec<u32>),
    /// One 0/1 plane per label (prototypes of another size than the mask).
    Planes(Vec<u8>),
}

/// The ground-truth masks of `im` letterboxed by `prep` into an `hw` input, at `mask_hw` (the
/// overlap mask at `1 / 4`, resampled to one 0/1 plane per label when the prototypes have
/// another size), and the labels' order in them.
fn gt_masks(
    im: &ValImage,
    prep: &Prepared,
    hw: (usize, usize),
    mask_hw: (usize, usize),
) -> (Gt, Vec<usize>) {
    let rw = (im.width as f64 * prep.gain) as f32;
    let rh = (im.height as f64 * prep.gain) as f32;
    let (padw, padh) = (prep.pad.0 as f32, prep.pad.1 as f32);
    let outlines = outlines_in_pixels(&im.labels, &im.outlines, (rw, rh), (padw, padh));
    let (ov, order) = overlap_mask(&outlines, hw.1, hw.0, MASK_RATIO);
    let (mh, mw) = (hw.0 / MASK_RATIO, hw.1 / MASK_RATIO);
    if (mh, mw) == mask_hw {
        return (Gt::Overlap(ov), order);
    }
    // Prototypes of another size: nearest sampling of the overlap mask.
    let mut planes = Vec::with_capacity(order.len() * mask_hw.0 * mask_hw.1);
    for k in 0..order.len() as u32 {
        for y in 0..mask_hw.0 {
            for x in 0..mask_hw.1 {
                let (sy, sx) = (y * mh / mask_hw.0, x * mw / mask_hw.1);
                planes.push(u8::from(ov[sy * mw + sx] == k + 1));
            }
        }
    }
    (Gt::Planes(planes), order)
}
