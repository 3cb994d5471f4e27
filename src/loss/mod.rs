//! Training loss: IoU/CIoU, TaskAlignedAssigner, the dual-branch TAL loss (official `loss_tal_dual`)
//! and its single-branch form for `DDetect` models (official `loss_tal`).
//!
//! - [`iou`]: IoU and CIoU on plain `f32` boxes (shared with NMS and metrics) and on tensors.
//! - [`anchors`]: anchor points of the head levels (official `make_anchors`).
//! - [`assigner`]: the TaskAlignedAssigner on host arrays (official `utils/tal/assigner.py`).
//! - [`assign_op`]: the same assigner as one op on the head's device (a CUDA kernel on a GPU),
//!   producing the dense loss targets without a host round trip.
//! - [`device_gt`]: the batch's GT rows and the anchor tables on the head's device, refillable in
//!   place (what a CUDA-graph replay of the step reads).
//! - [`tal_loss`]: [`DualTalLoss`], the YOLOv9 training loss (official `ComputeLoss`).
//! - [`terms`]: the box (CIoU), DFL and class terms of one branch as one op with a closed-form backward.
//! - [`seg`]: the segmentation loss (official `utils/segment/loss_tal.py`, `loss_tal_dual.py`):
//!   the detection terms plus the mask term.

pub mod anchors;
pub mod assign_op;
pub mod assigner;
pub mod device_gt;
pub mod iou;
pub mod seg;
pub mod tal_loss;
pub mod targets;
pub mod terms;

pub use anchors::Anchors;
pub use assigner::{
    AssignerDiagnostics, AssignerInput, Assignment, GtBatch, Scores, TaskAlignedAssigner,
};
pub use device_gt::DeviceGt;
pub use iou::{ciou_tensor, ciou_xyxy, CiouBox, IOU_EPS};
pub use tal_loss::{BranchLoss, DeviceLoss, DualTalLoss, LossOutput};
