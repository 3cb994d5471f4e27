//! The segmentation training loss (official `utils/segment/loss_tal.py ComputeLoss` for one
//! branch, `loss_tal_dual.py ComputeLoss` for `DualDSegment`): the detection terms of
//! [`DualTalLoss`] (box, class, DFL over the same TaskAlignedAssigner targets, normalised by
//! the unclamped `S = Σ target scores`, see [`DualTalLoss::with_raw_normaliser`]) and a mask
//! term per branch.
//!
//! Mask term of one branch, for each image `i` with foreground anchors `F_i` (official
//! `single_mask_loss`): the anchor's mask logits `coeffs_a · proto_i` (`nm` coefficients times
//! the `(nm, Hm, Wm)` prototypes), their BCE-with-logits against the ground-truth mask of the
//! object the anchor is assigned to, zeroed outside that object's box (at mask resolution),
//! averaged over all `Hm·Wm` pixels, divided by the box's normalised area `w·h`, and averaged
//! over `F_i`; the branch's term is the sum over images. Ground-truth masks are either one
//! overlap mask per image (`overlap`: pixel value `k + 1` is the image's `k`-th object, in the
//! order of the target rows) or one mask per target row; masks of another size than the
//! prototypes are resized first (nearest, `F.interpolate(mode='nearest')`).
//!
//! Items `[box, seg, cls, dfl]`: each `0.25·aux + main` (the branch weight, dual heads only),
//! gains 7.5, 2.5 / B, 0.5, 1.5; `total = Σ items · B`.

use super::tal_loss::{bce_with_logits, DualTalLoss, AUX_WEIGHT};
use super::Assignment;
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Tensor};

/// Gain of the mask item (`loss[1] *= 2.5 / batch_size`).
pub const MASK_GAIN: f32 = 2.5;

/// One branch's head outputs: the raw detection levels (`(B, 64 + nc, H_i, W_i)`), the mask
/// coefficients `(B, nm, A)` and the prototypes `(B, nm, Hm, Wm)`.
#[derive(Debug, Clone, Copy)]
pub struct SegBranch<'a> {
    /// Raw detection outputs per level (P3, P4, P5).
    pub levels: &'a [Tensor],
    /// Mask coefficients, anchors in level order.
    pub coeffs: &'a Tensor,
    /// Prototype masks.
    pub proto: &'a Tensor,
}

/// Ground-truth masks of a batch.
#[derive(Debug, Clone, Copy)]
pub enum GtMasks<'a> {
    /// `(B, H, W)`: value `k + 1` where image `b`'s `k`-th target row is, 0 elsewhere
    /// (official `--overlap-mask`, the default).
    Overlap(&'a Tensor),
    /// `(N, H, W)` 0/1, one per target row (official `--no-overlap`).
    PerTarget(&'a Tensor),
}

/// Result of [`seg_loss`].
#[derive(Debug, Clone)]
pub struct SegLossOutput {
    /// `Σ items · B`, differentiable with respect to the head outputs.
    pub total: Tensor,
    /// `[box, seg, cls, dfl]` after branch weights and gains (what training logs).
    pub items: [f32; 4],
}

/// The segmentation loss of one batch: `aux` (dual heads; `None` for `Segment`/`DSegment`) and
/// `main` branches, `targets` `(N, 6)` rows `[img, cls, cx, cy, w, h]` normalised (official
/// format), `masks`, `img_hw` the network input size. `det` is the detection loss of the model
/// (its class count and strides); its assignment runs on host copies.
///
/// Errors: shapes that disagree (naming them), as [`DualTalLoss::compute`] for the detection
/// terms.
pub fn seg_loss(
    det: &DualTalLoss,
    aux: Option<SegBranch>,
    main: SegBranch,
    targets: &Tensor,
    masks: GtMasks,
    img_hw: (usize, usize),
) -> Result<SegLossOutput> {
    let det = det
        .clone()
        .with_raw_normaliser(true)
        .with_device_assigner(false);
    let d = det.compute(
        aux.map(|a| a.levels).unwrap_or(&[]),
        main.levels,
        targets,
        img_hw,
    )?;
    let rows = targets
        .to_dtype(DType::F32)?
        .to_device(&candle_core::Device::Cpu)?;
    let rows: Vec<Vec<f32>> = if rows.dim(0)? == 0 {
        Vec::new()
    } else {
        rows.to_vec2()?
    };
    let mut mask_terms = Vec::new();
    for (branch, asg, weight) in [
        (aux, d.aux.assignment.as_ref(), AUX_WEIGHT),
        (Some(main), d.main.assignment.as_ref(), 1.0),
    ] {
        let Some(branch) = branch else { continue };
        let asg = asg.context("segmentation loss: the detection loss kept no assignment")?;
        let t = mask_term(branch, asg, &rows, masks, img_hw)?;
        mask_terms.push((t * f64::from(weight))?);
    }
    let bs = main.proto.dim(0)?;
    let mut mask = mask_terms[0].clone();
    for t in &mask_terms[1..] {
        mask = (mask + t)?;
    }
    let mask = (mask * f64::from(MASK_GAIN / bs as f32))?;
    let seg_item = mask.to_dtype(DType::F32)?.to_scalar::<f32>()?;
    let total = (d.total + (mask * bs as f64)?.to_dtype(DType::F32)?)?;
    let [bx, cls, dfl] = d.items;
    Ok(SegLossOutput {
        total,
        items: [bx, seg_item, cls, dfl],
    })
}

/// [`seg_loss`] on a segmentation training graph's output ([`crate::model::DualRaw`] with its
/// `seg` maps): the coefficient maps flattened in level order, the auxiliary branch when the
/// graph has one.
///
/// Errors: `raw` without mask outputs (a detection graph), and those of [`seg_loss`].
pub fn seg_loss_of_raw(
    det: &DualTalLoss,
    raw: &crate::model::DualRaw,
    targets: &Tensor,
    masks: GtMasks,
    img_hw: (usize, usize),
) -> Result<SegLossOutput> {
    use crate::model::head::flatten_levels;
    let sg = raw
        .seg
        .as_ref()
        .context("segmentation loss: the model has no mask outputs (a detection model)")?;
    let main_c = flatten_levels(&sg.main.0)?;
    let aux_c = match &sg.aux {
        Some((lv, p)) => Some((flatten_levels(lv)?, p)),
        None => None,
    };
    let aux = aux_c.as_ref().map(|(c, p)| SegBranch {
        levels: &raw.aux,
        coeffs: c,
        proto: p,
    });
    let main = SegBranch {
        levels: &raw.main,
        coeffs: &main_c,
        proto: &sg.main.1,
    };
    seg_loss(det, aux, main, targets, masks, img_hw)
}

/// The mask term of one branch before its weight and gain (`Σ_i single_mask_loss_i`), a scalar
/// differentiable with respect to the coefficients and prototypes.
fn mask_term(
    branch: SegBranch,
    asg: &Assignment,
    rows: &[Vec<f32>],
    masks: GtMasks,
    img_hw: (usize, usize),
) -> Result<Tensor> {
    let (bs, nm, mh, mw) = branch.proto.dims4()?;
    let (cb, cn, a) = branch.coeffs.dims3()?;
    ensure!(
        cb == bs && cn == nm && a == asg.num_anchors && asg.batch == bs,
        "segmentation loss: coefficients {:?}, prototypes {:?} and {} anchors x {} images disagree",
        branch.coeffs.dims(),
        branch.proto.dims(),
        asg.num_anchors,
        asg.batch
    );
    let dev = branch.proto.device().clone();
    let gt = gt_masks_at(masks, mh, mw)?;
    let overlap = matches!(gt, GtPlanes::Overlap(_));
    // Target rows of each image, in order.
    let mut per_image: Vec<Vec<usize>> = vec![Vec::new(); bs];
    for (k, r) in rows.iter().enumerate() {
        let b = r[0] as usize;
        ensure!(
            b < bs,
            "segmentation loss: target row {k} is for image {b} of {bs}"
        );
        per_image[b].push(k);
    }
    let (ih, iw) = (img_hw.0 as f32, img_hw.1 as f32);
    let hw = mh * mw;
    // Pixel coordinates of the prototype grid, for the box crops built on the device.
    let xs = Tensor::arange(0u32, mw as u32, &dev)?
        .to_dtype(DType::F32)?
        .reshape((1, 1, mw))?;
    let ys = Tensor::arange(0u32, mh as u32, &dev)?
        .to_dtype(DType::F32)?
        .reshape((1, mh, 1))?;
    // The ground-truth planes on the device, once: (B or N, Hm·Wm).
    let planes = match &gt {
        GtPlanes::Overlap(m) | GtPlanes::PerTarget(m) => {
            Tensor::from_slice(m, (m.len() / hw.max(1), hw), &dev)?
        }
    };
    let mut total = Tensor::zeros((), branch.proto.dtype(), &dev)?;
    for (i, rows_i) in per_image.iter().enumerate() {
        let fg: Vec<usize> = (0..a).filter(|&j| asg.fg_mask[i * a + j]).collect();
        if fg.is_empty() {
            continue;
        }
        let n = fg.len();
        // Per foreground anchor: its object's index, crop box at mask resolution and weight
        // (mean over the Hm·Wm pixels, / normalised box area, mean over the n anchors).
        let (mut gidx, mut rows_of) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut crop = [
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        ];
        let mut wts = Vec::with_capacity(n);
        for &j in &fg {
            let g = asg.target_gt_idx[i * a + j];
            if !overlap {
                let row = *rows_i
                    .get(g)
                    .with_context(|| format!("segmentation loss: image {i} has no target {g}"))?;
                rows_of.push(row as u32);
            }
            gidx.push((g + 1) as f32);
            let b = asg.target_bboxes[i * a + j];
            let xyxyn = [b[0] / iw, b[1] / ih, b[2] / iw, b[3] / ih];
            let area = (xyxyn[2] - xyxyn[0]) * (xyxyn[3] - xyxyn[1]);
            crop[0].push(xyxyn[0] * mw as f32);
            crop[1].push(xyxyn[1] * mh as f32);
            crop[2].push(xyxyn[2] * mw as f32);
            crop[3].push(xyxyn[3] * mh as f32);
            wts.push(1.0 / ((hw as f32) * area * n as f32));
        }
        let col = |v: Vec<f32>| Tensor::from_vec(v, (n, 1, 1), &dev);
        let [x1, y1, x2, y2] = crop.map(col);
        let inside_x = xs.broadcast_ge(&x1?)?.mul(&xs.broadcast_lt(&x2?)?)?; // (n, 1, mw)
        let inside_y = ys.broadcast_ge(&y1?)?.mul(&ys.broadcast_lt(&y2?)?)?; // (n, mh, 1)
        let weight = inside_x
            .broadcast_mul(&inside_y)?
            .to_dtype(DType::F32)?
            .broadcast_mul(&col(wts)?)?
            .reshape((n, hw))?;
        let target = if overlap {
            let g = Tensor::from_vec(gidx, (n, 1), &dev)?;
            planes
                .narrow(0, i, 1)?
                .broadcast_eq(&g)?
                .to_dtype(DType::F32)?
        } else {
            planes.index_select(&Tensor::from_vec(rows_of, n, &dev)?, 0)?
        };
        let idx = Tensor::from_vec(fg.iter().map(|&j| j as u32).collect::<Vec<_>>(), n, &dev)?;
        let c = branch.coeffs.get(i)?.index_select(&idx, 1)?.t()?; // (n, nm)
        let p = branch.proto.get(i)?.reshape((nm, hw))?;
        let logits = c.contiguous()?.matmul(&p.contiguous()?)?; // (n, Hm·Wm)
        let dt = logits.dtype();
        let l = bce_with_logits(&logits, &target.to_dtype(dt)?)?
            .mul(&weight.to_dtype(dt)?)?
            .sum_all()?;
        total = (total + l)?;
    }
    Ok(total)
}

/// Ground-truth planes on the host at the prototype size.
enum GtPlanes {
    Overlap(Vec<f32>),
    PerTarget(Vec<f32>),
}

/// The masks as host planes of `mh × mw`, resized by nearest neighbour (PyTorch's `nearest`:
/// source index `floor(dst · in / out)`) when they are another size.
fn gt_masks_at(masks: GtMasks, mh: usize, mw: usize) -> Result<GtPlanes> {
    let (t, overlap) = match masks {
        GtMasks::Overlap(t) => (t, true),
        GtMasks::PerTarget(t) => (t, false),
    };
    let (n, h, w) = t
        .dims3()
        .context("segmentation loss: masks must be (N, H, W)")?;
    let v: Vec<f32> = t
        .to_dtype(DType::F32)?
        .to_device(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1()?;
    let out = if (h, w) == (mh, mw) {
        v
    } else {
        let mut o = vec![0f32; n * mh * mw];
        for k in 0..n {
            for y in 0..mh {
                let sy = ((y as f64 * h as f64 / mh as f64).floor() as usize).min(h - 1);
                for x in 0..mw {
                    let sx = ((x as f64 * w as f64 / mw as f64).floor() as usize).min(w - 1);
                    o[(k * mh + y) * mw + x] = v[(k * h + sy) * w + sx];
                }
            }
        }
        o
    };
    Ok(if overlap {
        GtPlanes::Overlap(out)
    } else {
        GtPlanes::PerTarget(out)
    })
}
