//! NMS of a whole batch as one op on the output's device: the official `non_max_suppression`
//! (what [`super::nms::nms_image`] does per image on the host) for every image of a
//! decoded output `(B, 4+nc, A)`, so that on a GPU only the kept rows cross to the host.
//!
//! On CUDA the op is one kernel launch for the batch (`kernels/nms.cu`, one thread block per
//! image: candidates, the `max_nms` cut by radix selection, greedy class-offset NMS up to
//! `max_det`); it gives the host's rows bit for bit (same kept set, order and values). On the
//! CPU the op runs [`nms_image_anchored`] per image, so both devices share the packed output
//! format and the unpacking. [`non_max_suppression`](super::postprocess::non_max_suppression)
//! uses it on
//! every device but the CPU; `YOLO9_GPU_NMS=0` falls back to the host NMS after a device-side
//! candidate filter ([`super::postprocess::host_candidates`]).

use super::nms::{nms_image_anchored, NmsOptions, Row};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Error, Layout, Result, Shape, Tensor};

/// Width of one packed row: `[x1, y1, x2, y2, conf, cls, anchor]`.
const ROW: usize = 7;

/// The op: `pred` `(B, 4+nc, A)` f32 → `(B, 1 + max_det*7)` f32, per image the kept count `k`
/// then `k` rows `[x1, y1, x2, y2, conf, cls, anchor]` (input pixels, by decreasing confidence;
/// `anchor` is the column of `pred` the row came from). Rows past `k` are unspecified. No
/// backward.
#[derive(Debug, Clone)]
pub struct BatchNms {
    /// The NMS options (as [`nms_image_anchored`] takes them).
    pub opts: NmsOptions,
    /// Rows 0..4 of `pred` are `x1, y1, x2, y2` instead of `cx, cy, w, h` (for plain box lists,
    /// as torchvision's `nms`/`batched_nms` take them).
    pub xyxy: bool,
}

/// Kept rows of every image of `pred` `(B, 4+nc, A)` (any float dtype, any device) with the
/// official NMS: on the output's device with one launch, then one copy of the kept rows. Same
/// result as [`super::nms::nms_image`] on each image.
///
/// Errors: `pred` not `(B, 4+nc, A)` with nc ≥ 1, `max_det` 0, or a failed device operation.
pub fn batch_nms(pred: &Tensor, opts: &NmsOptions) -> Result<Vec<Vec<Row>>> {
    let packed = batch_nms_packed(pred, opts, false)?;
    Ok(unpack(&packed)?
        .into_iter()
        .map(|rows| {
            rows.into_iter()
                .map(|r| [r[0], r[1], r[2], r[3], r[4], r[5]])
                .collect()
        })
        .collect())
}

/// The op's packed output for `pred` (see [`BatchNms`]), on `pred`'s device.
pub fn batch_nms_packed(pred: &Tensor, opts: &NmsOptions, xyxy: bool) -> Result<Tensor> {
    let (_, rows, _) = pred.dims3()?;
    if rows < 5 || opts.max_det == 0 {
        return Err(Error::Msg(format!(
            "NMS expects (B, 4+nc, A) with nc ≥ 1 and max_det ≥ 1, got {:?} and max_det {}",
            pred.shape(),
            opts.max_det
        )));
    }
    pred.to_dtype(DType::F32)?
        .contiguous()?
        .apply_op1_no_bwd(&BatchNms {
            opts: opts.clone(),
            xyxy,
        })
}

/// Reads the op's packed `(B, 1 + max_det*7)` output (any device) into rows
/// `[x1, y1, x2, y2, conf, cls, anchor]` per image.
pub fn unpack(packed: &Tensor) -> Result<Vec<Vec<[f32; ROW]>>> {
    let rows: Vec<Vec<f32>> = packed.to_device(&candle_core::Device::Cpu)?.to_vec2()?;
    rows.into_iter()
        .map(|v| {
            let k = v.first().copied().unwrap_or(0.0);
            let cap = (v.len().saturating_sub(1)) / ROW;
            if !(k >= 0.0 && (k as usize) <= cap && k.fract() == 0.0) {
                return Err(Error::Msg(format!("NMS: bad kept count {k}")));
            }
            Ok(v[1..1 + k as usize * ROW]
                .chunks_exact(ROW)
                .map(|r| [r[0], r[1], r[2], r[3], r[4], r[5], r[6]])
                .collect())
        })
        .collect()
}

impl CustomOp1 for BatchNms {
    fn name(&self) -> &'static str {
        "batch-nms"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, rows, a) = l.shape().dims3()?;
        let nc = rows - 4;
        let (o0, o1) = l
            .contiguous_offsets()
            .ok_or_else(|| Error::Msg("NMS: the output is not contiguous".into()))?;
        let CpuStorage::F32(v) = s else {
            return Err(Error::Msg(format!("NMS: dtype {:?}", s.dtype())));
        };
        let v = &v[o0..o1];
        let width = 1 + self.opts.max_det * ROW;
        let mut out = vec![0f32; b * width];
        for (i, o) in out.chunks_exact_mut(width).enumerate() {
            let p = &v[i * rows * a..(i + 1) * rows * a];
            let kept = nms_image_anchored(p, nc, a, &self.opts, self.xyxy);
            o[0] = kept.len() as f32;
            for (k, r) in kept.iter().enumerate() {
                o[1 + k * ROW..1 + (k + 1) * ROW].copy_from_slice(r);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((b, width))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let nc = l.shape().dims3()?.1.saturating_sub(4);
        let o = &self.opts;
        let class_ok = (0..nc)
            .map(|c| match &o.classes {
                None => 1u8,
                Some(cl) => u8::from(cl.contains(&c)),
            })
            .collect();
        let args = crate::cuda::nms::NmsArgs {
            conf: o.conf_thres,
            iou: o.iou_thres,
            multi_label: o.multi_label && nc > 1,
            agnostic: o.agnostic,
            xyxy: self.xyxy,
            max_det: o.max_det,
            max_nms: super::nms::MAX_NMS,
            class_ok,
        };
        crate::cuda::nms::nms(s, l, &args)
    }
}
