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
//!    prototypes' resolution ([`crate::metrics::seg::add_masks`]);
//! 5. with the training graph and its loss, the val losses (`loss += compute_loss((train_out,
//!    protos), targets, masks)[1]`): [`crate::loss::seg::seg_loss_of_raw`] of both branches on
//!    the batch's targets (each image's in its overlap mask's order) and overlap masks, averaged
//!    over batches.

use crate::data::polygons::{outlines_in_pixels, overlap_mask, MASK_RATIO};
use crate::detect::masks::Protos;
use crate::loss::seg::{seg_loss_of_raw, GtMasks};
use crate::loss::DualTalLoss;
use crate::metrics::ap::ValStats;
use crate::metrics::seg::{add_masks, mask_iou, mask_iou_overlap, proto_mask};
use crate::metrics::validate::{
    image_targets, input_tensor, multilabel_options, native_space, run_batches, Prepared,
    ValConfig, ValImage, ValResult,
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
    /// coefficients and prototypes; with `loss`, the val losses of both branches.
    Train {
        /// The model (BN in eval mode during validation).
        model: &'a YoloV9Train,
        /// The training loss (its detection part; the mask term is added), for val losses.
        loss: Option<&'a DualTalLoss>,
    },
}

impl SegValModel<'_> {
    fn is_seg(&self) -> bool {
        match self {
            SegValModel::Infer(m) => m.is_seg(),
            SegValModel::Train { model: m, .. } => m.is_seg(),
        }
    }

    fn nc(&self) -> usize {
        match self {
            SegValModel::Infer(m) => m.meta().nc,
            SegValModel::Train { model: m, .. } => m.meta().nc,
        }
    }

    fn device(&self) -> &Device {
        match self {
            SegValModel::Infer(m) => m.device(),
            SegValModel::Train { model: m, .. } => m.device(),
        }
    }

    /// `x` (B, 3, H, W) f32 → predictions `(B, 4 + nc + nm, A)` (boxes cx cy w h in pixels,
    /// sigmoid scores, raw coefficients) and prototypes `(B, nm, H / 4, W / 4)`; with the
    /// training graph and its loss also the loss items `[box, seg, cls, dfl]` of the batch's
    /// `targets` and overlap `masks` `(B, H / 4, W / 4)`.
    fn forward(
        &self,
        x: &Tensor,
        targets: &Tensor,
        masks: impl FnOnce() -> Result<Tensor>,
    ) -> Result<(Tensor, Tensor, Option<[f32; 4]>)> {
        match *self {
            SegValModel::Infer(m) => {
                let (p, q) = m.forward_seg(x)?;
                Ok((p, q, None))
            }
            SegValModel::Train { model: m, loss } => {
                // candle's own CPU pool runs the whole forward (as the detection validation).
                let raw = m.device().with_context(|| m.forward(x, false))?;
                let items = match loss {
                    Some(loss) => {
                        let (_, _, h, w) = x.dims4()?;
                        let masks = masks()?;
                        let lo =
                            seg_loss_of_raw(loss, &raw, targets, GtMasks::Overlap(&masks), (h, w))
                                .context("validation loss")?;
                        Some(lo.items)
                    }
                    None => None,
                };
                let sg = raw
                    .seg
                    .as_ref()
                    .context("the training graph has no mask outputs")?;
                let det = raw.decode()?.1;
                let coeffs = flatten_levels(&sg.main.0)?.to_dtype(det.dtype())?;
                Ok((Tensor::cat(&[&det, &coeffs], 1)?, sg.main.1.clone(), items))
            }
        }
    }
}

/// [`crate::metrics::validate::validate`] of a segmentation model with its masks: the box
/// metrics in [`ValResult::metrics`], the mask metrics in [`ValResult::masks`], and with the
/// training graph and its loss the val losses in [`ValResult::losses`] and
/// [`ValResult::seg_loss`].
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
    let (mut sums, mut batches) = ([0f64; 4], 0usize);
    let run = run_batches(images, cfg, &device, nc, |ok, hw, run| {
        // Each image's ground truth at 1/4 of the input: its overlap mask, the labels in its
        // order (as the official loader reorders them with the masks).
        let gt: Vec<(Vec<u32>, Vec<usize>)> = ok
            .par_iter()
            .map(|(i, prep)| overlap_of(&images[*i], prep, hw))
            .collect();
        let mut rows = Vec::new();
        for (k, ((i, prep), (_, order))) in ok.iter().zip(&gt).enumerate() {
            let t = image_targets(&images[*i], prep, hw, k);
            rows.extend(order.iter().map(|&o| t[o]));
        }
        let targets = crate::loss::tal_loss::targets_tensor(&rows, &Device::Cpu)?;
        let (mh, mw) = (hw.0 / MASK_RATIO, hw.1 / MASK_RATIO);
        let gt_tensor = || -> Result<Tensor> {
            let v: Vec<f32> = gt
                .iter()
                .flat_map(|(m, _)| m.iter().map(|&k| k as f32))
                .collect();
            Ok(Tensor::from_vec(v, (ok.len(), mh, mw), &Device::Cpu)?.to_device(&device)?)
        };
        let (pred, proto, items) =
            model.forward(&input_tensor(ok, hw, &device)?, &targets, gt_tensor)?;
        if let Some(items) = items {
            for (s, v) in sums.iter_mut().zip(items) {
                *s += v as f64;
            }
            batches += 1;
        }
        let host = |t: Tensor| t.to_dtype(DType::F32)?.to_device(&Device::Cpu);
        let (pred, proto) = (host(pred)?, host(proto)?);
        for (i, dets, labels, iou) in
            seg_image_results(&pred, &proto, images, ok, hw, nc, cfg, &gt)?
        {
            add_masks(&mut masks, &dets, &labels, &iou);
            run.add(i, dets, labels);
        }
        Ok(())
    })?;
    // The official order of the items is [box, seg, cls, dfl].
    let mean = |k: usize| (sums[k] / batches as f64) as f32;
    let losses = (batches > 0).then(|| [mean(0), mean(2), mean(3)]);
    let mut r = run.finish(nc, losses);
    r.seg_loss = (batches > 0).then(|| mean(1));
    r.masks = Some(masks.metrics(nc));
    Ok(r)
}

/// One image's detections and labels in original pixels (labels in the overlap mask's order)
/// and the label-major mask IoU of its detections.
type SegImage = (usize, Vec<[f32; 6]>, Vec<[f32; 5]>, Vec<Vec<f32>>);

/// NMS, masks and ground truth (`gt`: each image's overlap mask at 1/4 of the input and its
/// labels' order, [`overlap_of`]) of each prepared image, in image order.
#[allow(clippy::too_many_arguments)]
fn seg_image_results(
    pred: &Tensor,
    proto: &Tensor,
    images: &[ValImage],
    ok: &[(usize, Prepared)],
    hw: (usize, usize),
    nc: usize,
    cfg: &ValConfig,
    gt: &[(Vec<u32>, Vec<usize>)],
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
            let (ov, order) = &gt[k];
            let labels: Vec<[f32; 5]> = order.iter().map(|&o| labels[o]).collect();
            let gt = gt_at(ov, order.len(), hw, (ph, pw));
            let iou = if labels.is_empty() || dets.is_empty() {
                Vec::new()
            } else {
                match gt {
                    Gt::Overlap(ov) => mask_iou_overlap(ov, labels.len(), &pm, ph * pw),
                    Gt::Planes(gm) => mask_iou(&gm, &pm, ph * pw),
                }
            };
            (*i, dets, labels, iou)
        })
        .collect())
}

/// An image's ground-truth masks at the prototypes' resolution.
enum Gt<'a> {
    /// The overlap mask itself (value `k + 1` where label `k` is).
    Overlap(&'a [u32]),
    /// One 0/1 plane per label (prototypes of another size than the mask).
    Planes(Vec<u8>),
}

/// The ground truth of `im` letterboxed by `prep` into an `hw` input: its overlap mask at
/// `1 / 4` of the input ([`overlap_mask`]) and the labels' order in it.
fn overlap_of(im: &ValImage, prep: &Prepared, hw: (usize, usize)) -> (Vec<u32>, Vec<usize>) {
    let rw = (im.width as f64 * prep.gain) as f32;
    let rh = (im.height as f64 * prep.gain) as f32;
    let (padw, padh) = (prep.pad.0 as f32, prep.pad.1 as f32);
    let outlines = outlines_in_pixels(&im.labels, &im.outlines, (rw, rh), (padw, padh));
    overlap_mask(&outlines, hw.1, hw.0, MASK_RATIO)
}

/// The ground-truth masks of `n` labels at the prototypes' resolution `mask_hw`: the overlap
/// mask `ov` at `1 / 4` of the `hw` input itself, or one 0/1 plane per label resampled from it
/// when the prototypes have another size.
fn gt_at(ov: &[u32], n: usize, hw: (usize, usize), mask_hw: (usize, usize)) -> Gt<'_> {
    let (mh, mw) = (hw.0 / MASK_RATIO, hw.1 / MASK_RATIO);
    if (mh, mw) == mask_hw {
        return Gt::Overlap(ov);
    }
    // Prototypes of another size: nearest sampling of the overlap mask.
    let mut planes = Vec::with_capacity(n * mask_hw.0 * mask_hw.1);
    for k in 0..n as u32 {
        for y in 0..mask_hw.0 {
            for x in 0..mask_hw.1 {
                let (sy, sx) = (y * mh / mask_hw.0, x * mw / mask_hw.1);
                planes.push(u8::from(ov[sy * mw + sx] == k + 1));
            }
        }
    }
    Gt::Planes(planes)
}
