//! Training loss: IoU/CIoU, TaskAlignedAssigner, the dual-branch TAL loss (official `loss_tal_dual`).
