//! The training forward and backward of one micro-batch, which the step ([`crate::train::step`])
//! and its CUDA-graph replay ([`crate::train::graphed`]) both run: the taped forward and the
//! tape's backward where the tape runs ([`crate::model::tape::enabled_for`]: CUDA), candle's
//! autograd graph elsewhere.

use crate::model::yolov9::YoloV9Train;
use anyhow::Result;
use candle_core::backprop::GradStore;
use candle_core::Tensor;

/// The train-mode forward of a micro-batch `x` (B, 3, H, W) f32: taped on devices where
/// [`crate::model::tape::enabled_for`] says so (then the tape comes back for
/// [`train_backward`]), candle's autograd graph elsewhere.
pub fn train_forward(
    model: &YoloV9Train,
    x: &Tensor,
) -> Result<(crate::model::DualRaw, Option<crate::model::tape::Tape>)> {
    if crate::model::tape::enabled_for(x.device()) {
        let (raw, tape) = model.forward_taped(x)?;
        Ok((raw, Some(tape)))
    } else {
        Ok((model.forward(x, true)?, None))
    }
}

/// The gradients of the loss `total` from a [`train_forward`]: candle's backward of the loss,
/// then the tape's backward when there is one. `raw` (the head outputs) is dropped before the
/// tape's backward, so its memory is free for it. Returns the parameter gradients (and, without
/// a tape, every other gradient of candle's graph).
pub fn train_backward(
    total: &Tensor,
    raw: crate::model::DualRaw,
    tape: Option<crate::model::tape::Tape>,
) -> Result<GradStore> {
    let mut g = total.backward()?;
    drop(raw);
    match tape {
        Some(t) => t.backward(&mut g),
        None => Ok(g),
    }
}
