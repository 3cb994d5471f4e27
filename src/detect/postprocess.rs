//! Decoded model output → detections: candidate selection and NMS (official
//! `utils/general.py non_max_suppression`), then `scale_boxes` / `clip_boxes` back to original
//! pixels.
//!
//! A detection row is `[x1, y1, x2, y2, conf, cls]` (`cls` as f32, like the official tensor), in
//! **letterbox-input pixels** after NMS and in **original-image pixels** after [`scale_boxes`].
use super::letterbox::LetterboxInfo;
use super::nms::{nms_image, NmsOptions, Row};
use crate::boxes::clip_box;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};

/// Runs the official NMS on a decoded model output `pred` of shape `(B, 4+nc, A)` f32 (rows
/// `cx, cy, w, h` in input pixels, then class scores 0..1), any device. Returns, per image, the
/// kept rows sorted by decreasing confidence.
///
/// On the CPU this is [`nms_image`] per image. On another device (CUDA) the whole batch runs
/// there in one launch ([`super::device_nms::batch_nms`]) and only the kept rows are copied;
/// `YOLO9_GPU_NMS=0` instead copies the candidates ([`host_candidates`]) and runs the host NMS.
/// Both give the same rows.
///
/// Errors: `pred` not 3-D, fewer than 5 rows, or not convertible to f32.
pub fn non_max_suppression(pred: &Tensor, opts: &NmsOptions) -> Result<Vec<Vec<Row>>> {
    if device_nms_enabled(pred.device()) && pred.rank() == 3 && pred.dim(1)? >= 5 {
        return super::device_nms::batch_nms(pred, opts).context("NMS on the device");
    }
    let cands = host_candidates(pred, opts.conf_thres)?;
    // host_candidates checked the shape: (B, 4+nc, A) with nc ≥ 1.
    let nc = pred.dim(1)? - 4;
    Ok(cands
        .iter()
        .map(|c| nms_image(&c.data, nc, c.len, opts))
        .collect())
}

/// Whether NMS of an output on `device` runs there ([`super::device_nms`]): on every device but
/// the CPU, unless `YOLO9_GPU_NMS=0`.
pub fn device_nms_enabled(device: &candle_core::Device) -> bool {
    !device.is_cpu() && !crate::switches::off("YOLO9_GPU_NMS")
}

/// The columns of one image's decoded output that can become detections, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    /// Row-major `(4+nc, len)` f32: the chosen columns of `pred[b]`, in anchor order.
    pub data: Vec<f32>,
    /// Number of columns (anchors) kept.
    pub len: usize,
}

/// Copies to the host, per image, what [`nms_image`] needs from a decoded output `pred`
/// `(B, 4+nc, A)` (any float dtype, any device).
///
/// On the CPU that is every column. On another device (CUDA) the candidate filter runs there:
/// the best class score of each anchor is reduced on the device, only that `(B, A)` vector is
/// copied, and the columns whose best score is `> conf_thres` (or NaN, which [`nms_image`] then
/// judges itself) are gathered on the device and copied. The full `(B, 4+nc, A)` tensor never
/// crosses to the host; [`nms_image`] on the candidates gives the same rows as on all columns,
/// because the candidates keep their anchor order and every other column fails its own
/// `score > conf_thres` test.
///
/// Errors: `pred` not 3-D with at least 5 rows, or a failed device operation.
pub fn host_candidates(pred: &Tensor, conf_thres: f32) -> Result<Vec<Candidates>> {
    let (b, rows, a) = pred
        .dims3()
        .with_context(|| format!("NMS expects (B, 4+nc, A), got {:?}", pred.shape()))?;
    if rows < 5 {
        bail!("NMS expects at least 5 rows (4 box + classes), got {rows}");
    }
    let pred = pred.to_dtype(DType::F32)?;
    if pred.device().is_cpu() {
        // One copy per image, straight into its own vector.
        return (0..b)
            .map(|i| {
                Ok(Candidates {
                    data: pred.get(i)?.flatten_all()?.to_vec1()?,
                    len: a,
                })
            })
            .collect();
    }
    filtered_candidates(&pred, conf_thres).context("NMS: reading the candidates from the device")
}

/// The device-side candidate filter of [`host_candidates`], on any device (the CPU path of
/// [`host_candidates`] skips it; tests call it there to check it against the full columns).
/// `pred` is `(B, 4+nc, A)` f32.
pub fn filtered_candidates(pred: &Tensor, conf_thres: f32) -> Result<Vec<Candidates>> {
    let (b, rows, _) = pred.dims3()?;
    let best: Vec<Vec<f32>> = pred.narrow(1, 4, rows - 4)?.max(1)?.to_vec2()?;
    let mut out = Vec::with_capacity(b);
    for (i, best) in best.iter().enumerate() {
        // Above the threshold, or NaN: nms_image then decides on it exactly as on all columns.
        let idx: Vec<u32> = (0..best.len() as u32)
            .filter(|&j| {
                let s = best[j as usize];
                s > conf_thres || s.is_nan()
            })
            .collect();
        if idx.is_empty() {
            out.push(Candidates {
                data: Vec::new(),
                len: 0,
            });
            continue;
        }
        let len = idx.len();
        let ids = Tensor::from_vec(idx, len, pred.device())?;
        let data: Vec<f32> = pred
            .get(i)?
            .index_select(&ids, 1)?
            .flatten_all()?
            .to_vec1()?;
        out.push(Candidates { data, len });
    }
    Ok(out)
}

/// Maps boxes `[x1, y1, x2, y2]` from letterbox-input pixels back to original-image pixels and
/// clips them, exactly as the official `scale_boxes(img1_shape, boxes, img0_shape)` without
/// `ratio_pad`: `gain = min(in_h/orig_h, in_w/orig_w)`, `pad = ((in_w - orig_w*gain)/2,
/// (in_h - orig_h*gain)/2)` (recomputed, **not rounded**, so it can differ from the letterbox pad
/// by a fraction of a pixel), `x = (x - pad_x) / gain`, then [`crate::boxes::clip_box`].
/// `in_hw` is the network input `(H, W)`, `orig_hw` the original `(h, w)`.
pub fn scale_boxes(in_hw: (u32, u32), boxes: &mut [[f32; 4]], orig_hw: (u32, u32)) {
    let (ih, iw) = (f64::from(in_hw.0), f64::from(in_hw.1));
    let (oh, ow) = (f64::from(orig_hw.0), f64::from(orig_hw.1));
    let gain = (ih / oh).min(iw / ow);
    let pad_x = ((iw - ow * gain) / 2.0) as f32;
    let pad_y = ((ih - oh * gain) / 2.0) as f32;
    let g = gain as f32;
    for b in boxes.iter_mut() {
        b[0] = (b[0] - pad_x) / g;
        b[2] = (b[2] - pad_x) / g;
        b[1] = (b[1] - pad_y) / g;
        b[3] = (b[3] - pad_y) / g;
        clip_box(b, orig_hw);
    }
}

/// [`scale_boxes`] for the rows of a letterboxed image described by `info`.
pub fn scale_rows(rows: &mut [Row], info: &LetterboxInfo) {
    let mut boxes: Vec<[f32; 4]> = rows.iter().map(|r| [r[0], r[1], r[2], r[3]]).collect();
    scale_boxes(
        (info.out_h(), info.out_w()),
        &mut boxes,
        (info.orig_h, info.orig_w),
    );
    for (r, b) in rows.iter_mut().zip(boxes) {
        r[..4].copy_from_slice(&b);
    }
}
