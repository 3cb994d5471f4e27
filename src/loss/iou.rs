//! IoU and CIoU of axis-aligned boxes, on plain `f32` boxes and on Candle tensors.
//!
//! All boxes are `x1, y1, x2, y2` (xyxy) in one consistent unit (pixels or grid cells); the
//! formulas are scale-free except for the small `eps` terms. They follow the official
//! `utils/metrics.py bbox_iou(box1, box2, xywh=False, CIoU=True, eps=1e-7)` of WongKinYiu/yolov9
//! operation by operation (same `eps` placement, same f32 evaluation order), so that the
//! TaskAlignedAssigner reproduces the official `overlaps` to float rounding:
//!
//! - `w = x2 - x1`, `h = y2 - y1 + eps` (the eps goes on the height only);
//! - `inter = max(min(x2) - max(x1), 0) * max(min(y2) - max(y1), 0)`;
//! - `union = w1*h1 + w2*h2 - inter + eps`, `iou = inter / union`;
//! - `c2 = cw^2 + ch^2 + eps` (enclosing box diagonal), `rho2` = squared centre distance;
//! - `v = 4/pi^2 * (atan(w2/h2) - atan(w1/h1))^2`, `alpha = v / (v - iou + 1 + eps)`
//!   (alpha is a constant for autograd, as the official `torch.no_grad()` block);
//! - `CIoU = iou - (rho2/c2 + v*alpha)`, in `(-1.5, 1]` (CIoU paper, Zheng et al. 2020, eq. 10).

use anyhow::{bail, Context, Result};
use candle_core::backend::BackendStorage;
use candle_core::Tensor;

/// The official `bbox_iou` epsilon.
pub const IOU_EPS: f32 = 1e-7;

/// `4 / pi^2`, the CIoU aspect-ratio constant, rounded to f32 as PyTorch does for a
/// Python-float scalar multiplying an f32 tensor.
const FOUR_OVER_PI2: f32 = (4.0 / (std::f64::consts::PI * std::f64::consts::PI)) as f32;

/// An xyxy box with the per-box parts of CIoU precomputed (`w`, `h + eps`, `atan(w/h)`).
///
/// The TaskAlignedAssigner compares every GT with many predictions; preparing each box once
/// gives bit-identical results to [`ciou_xyxy`] at a fraction of the cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CiouBox {
    /// Corners `x1, y1, x2, y2`.
    pub xyxy: [f32; 4],
    /// `x2 - x1`.
    pub w: f32,
    /// `y2 - y1 + IOU_EPS`.
    pub h: f32,
    /// `atan(w / h)`.
    pub atan_wh: f32,
}

impl CiouBox {
    /// Prepare an xyxy box (any unit).
    pub fn new(xyxy: [f32; 4]) -> Self {
        let w = xyxy[2] - xyxy[0];
        let h = xyxy[3] - xyxy[1] + IOU_EPS;
        CiouBox {
            xyxy,
            w,
            h,
            atan_wh: (w / h).atan(),
        }
    }
}

/// CIoU of two prepared boxes (`box1`, `box2` in the official argument order).
///
/// The result is symmetric up to float rounding; the order only matters for bit-exactness
/// with the official code (the assigner calls it with `box1` = GT, `box2` = prediction).
pub fn ciou_prepared(b1: &CiouBox, b2: &CiouBox) -> f32 {
    let [b1_x1, b1_y1, b1_x2, b1_y2] = b1.xyxy;
    let [b2_x1, b2_y1, b2_x2, b2_y2] = b2.xyxy;
    let inter = (b1_x2.min(b2_x2) - b1_x1.max(b2_x1)).max(0.0)
        * (b1_y2.min(b2_y2) - b1_y1.max(b2_y1)).max(0.0);
    let union = b1.w * b1.h + b2.w * b2.h - inter + IOU_EPS;
    let iou = inter / union;
    let cw = b1_x2.max(b2_x2) - b1_x1.min(b2_x1);
    let ch = b1_y2.max(b2_y2) - b1_y1.min(b2_y1);
    let c2 = cw * cw + ch * ch + IOU_EPS;
    let dx = b2_x1 + b2_x2 - b1_x1 - b1_x2;
    let dy = b2_y1 + b2_y2 - b1_y1 - b1_y2;
    let rho2 = (dx * dx + dy * dy) / 4.0;
    let d = b2.atan_wh - b1.atan_wh;
    let v = FOUR_OVER_PI2 * (d * d);
    let alpha = v / (v - iou + (1.0 + IOU_EPS));
    iou - (rho2 / c2 + v * alpha)
}

/// CIoU of two xyxy boxes, official `bbox_iou(box1, box2, xywh=False, CIoU=True)`.
/// Identical boxes give `1 - O(eps)`; disjoint far boxes go towards `-1`.
pub fn ciou_xyxy(box1: [f32; 4], box2: [f32; 4]) -> f32 {
    ciou_prepared(&CiouBox::new(box1), &CiouBox::new(box2))
}

/// `atan(r)` with its gradient `1 / (1 + r²)`, element-wise, as one autograd node.
///
/// Candle has no `atan` op, so this is a custom op: the value is computed in f64 and rounded to
/// the tensor dtype, on the CPU by Rust's `f64::atan` and on CUDA by a kernel
/// (`kernels/atan.cu`), without copying the tensor between devices. `r`: any shape, f32 or f64,
/// any device; the result has the same shape, dtype and device.
pub fn atan_with_grad(r: &Tensor) -> Result<Tensor> {
    Ok(r.contiguous()?.apply_op1(Atan)?)
}

/// The op of [`atan_with_grad`].
struct Atan;

impl candle_core::CustomOp1 for Atan {
    fn name(&self) -> &'static str {
        "atan"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::CpuStorage;
        let (a, b) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("atan: input is not contiguous".into()))?;
        let out = match s {
            CpuStorage::F32(v) => {
                CpuStorage::F32(v[a..b].iter().map(|&x| (x as f64).atan() as f32).collect())
            }
            CpuStorage::F64(v) => CpuStorage::F64(v[a..b].iter().map(|x| x.atan()).collect()),
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "atan: dtype {:?}; f32 and f64 are supported",
                    s.dtype()
                )))
            }
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        crate::cuda::atan::atan(s, l)
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let slope = (arg.detach().sqr()? + 1.0)?.recip()?;
        Ok(Some(grad_res.mul(&slope)?))
    }
}

/// CIoU of matching rows of two box tensors, differentiable (official `bbox_iou(...,
/// xywh=False, CIoU=True)` used by `BboxLoss`).
///
/// `box1`, `box2`: `(N, 4)` xyxy, same float dtype and device (usually `box1` = predictions,
/// `box2` = constant targets, both in grid units). Returns `(N,)`. Gradients flow to both
/// inputs except through `alpha`, which is detached as in the official code. `N = 0` gives an
/// empty tensor.
///
/// Errors: shapes other than `(N, 4)` or mismatched `N`.
pub fn ciou_tensor(box1: &Tensor, box2: &Tensor) -> Result<Tensor> {
    let (n1, c1) = box1.dims2().context("ciou_tensor: box1 must be (N, 4)")?;
    let (n2, c2) = box2.dims2().context("ciou_tensor: box2 must be (N, 4)")?;
    if c1 != 4 || c2 != 4 || n1 != n2 {
        bail!(
            "ciou_tensor: expected two (N, 4) xyxy tensors, got {:?} and {:?}",
            box1.dims(),
            box2.dims()
        );
    }
    let eps = IOU_EPS as f64;
    let col = |t: &Tensor, i: usize| t.narrow(1, i, 1);
    let (b1_x1, b1_y1, b1_x2, b1_y2) = (col(box1, 0)?, col(box1, 1)?, col(box1, 2)?, col(box1, 3)?);
    let (b2_x1, b2_y1, b2_x2, b2_y2) = (col(box2, 0)?, col(box2, 1)?, col(box2, 2)?, col(box2, 3)?);
    let w1 = b1_x2.sub(&b1_x1)?;
    let h1 = (b1_y2.sub(&b1_y1)? + eps)?;
    let w2 = b2_x2.sub(&b2_x1)?;
    let h2 = (b2_y2.sub(&b2_y1)? + eps)?;

    let iw = b1_x2
        .minimum(&b2_x2)?
        .sub(&b1_x1.maximum(&b2_x1)?)?
        .relu()?;
    let ih = b1_y2
        .minimum(&b2_y2)?
        .sub(&b1_y1.maximum(&b2_y1)?)?
        .relu()?;
    let inter = iw.mul(&ih)?;
    let union = (w1.mul(&h1)?.add(&w2.mul(&h2)?)?.sub(&inter)? + eps)?;
    let iou = inter.div(&union)?;

    let cw = b1_x2.maximum(&b2_x2)?.sub(&b1_x1.minimum(&b2_x1)?)?;
    let ch = b1_y2.maximum(&b2_y2)?.sub(&b1_y1.minimum(&b2_y1)?)?;
    let c2 = (cw.sqr()?.add(&ch.sqr()?)? + eps)?;
    let dx = b2_x1.add(&b2_x2)?.sub(&b1_x1)?.sub(&b1_x2)?;
    let dy = b2_y1.add(&b2_y2)?.sub(&b1_y1)?.sub(&b1_y2)?;
    let rho2 = (dx.sqr()?.add(&dy.sqr()?)? / 4.0)?;

    let d = atan_with_grad(&w2.div(&h2)?)?.sub(&atan_with_grad(&w1.div(&h1)?)?)?;
    let v = (d.sqr()? * FOUR_OVER_PI2 as f64)?;
    let alpha = v.div(&(v.sub(&iou)? + (1.0 + IOU_EPS) as f64)?)?.detach();
    let ciou = iou.sub(&rho2.div(&c2)?.add(&v.mul(&alpha)?)?)?;
    Ok(ciou.squeeze(1)?)
}
