//! CUDA-only code (built with the `cuda` feature).
//!
//! - [`conv`]: 2-D convolution forward and backward on cuDNN as candle custom ops, so training on a
//!   GPU does not go through candle's own convolution backward (a direct `conv_transpose2d` for the
//!   input gradient and an im2col convolution for the weight gradient).
//! - [`graph`]: a fixed-shape forward captured as a CUDA graph and replayed.
//! - [`algo_cache`]: the cuDNN algorithm choices of [`conv`], persisted in a file across runs.
//! - [`bn_act`]: launches of the fused train-mode BatchNorm + SiLU kernels (`kernels/bn_act.cu`).
//! - [`bias_act`]: the inference convolution epilogue `act(x + b)` in one pass (`kernels/bias_act.cu`).
//! - [`atan`]: the element-wise arctangent of the CIoU loss term (`kernels/atan.cu`).
//! - [`tal`]: the TaskAlignedAssigner (`kernels/tal_assign.cu`), dense TAL loss targets from
//!   foreground rows (`kernels/tal.cu`) and the fused loss terms (`kernels/tal_terms.cu`).
//! - [`nms`]: batched NMS of a decoded output, one launch per batch (`kernels/nms.cu`).
//! - [`pool`]: the SPPELAN max pool forward and backward, and the inference pools on NCHW and
//!   channels-last tensors (`kernels/pool.cu`).
//! - [`dfl`]: the head's DFL expectation in one launch (`kernels/dfl.cu`).
//! - [`ew`]: `a + b` and contiguous copies of row-strided tensors (`kernels/ew.cu`), for
//!   [`crate::model::ew`].
//! - [`first_conv`]: the network's first convolution straight from the f32 NCHW input to a
//!   channels-last half-precision output (`kernels/first_conv.cu`).
//! - [`fused_conv`]: an inference convolution with its folded bias and SiLU as one cuDNN
//!   operation graph (backend API), so the output is written once.
//! - [`gemm`]: 1×1 convolutions of channels-last activations as cuBLAS products reading channel
//!   slices in place and summing over the parts of a concatenation (none is copied).
//! - [`layout`]: the channels-last input, head outputs and 2× upsampling in one launch each
//!   (`kernels/layout.cu`), for [`crate::model::layout`].
//! - [`upload`]: a batch's image bytes uploaded through pinned staging memory, without a host
//!   synchronization (the training loop's upload of the next batch).
//! - [`optim`]: multi-tensor SGD, gradient-norm and EMA kernels (`kernels/optim.cu`): one launch
//!   per optimizer phase for all parameters.
//!
//! Callers normally use [`crate::model::conv::conv2d_any`], which picks this path for CUDA tensors
//! and candle's `Tensor::conv2d` everywhere else.

pub mod algo_cache;
pub mod atan;
pub mod bias_act;
pub mod bn_act;
pub mod conv;
pub mod conv_params;
pub mod dfl;
pub mod ew;
pub mod first_conv;
pub mod fused_conv;
pub mod gemm;
pub mod graph;
pub mod layout;
pub mod nms;
pub mod optim;
pub mod pool;
pub mod tal;
pub mod upload;

/// The kernel-name suffix of an element type the half-precision-capable kernels are compiled for
/// (`_f32`, `_f16`, `_bf16`); `None` for other dtypes.
pub(crate) fn kernel_suffix(d: candle_core::DType) -> Option<&'static str> {
    match d {
        candle_core::DType::F32 => Some("f32"),
        candle_core::DType::F16 => Some("f16"),
        candle_core::DType::BF16 => Some("bf16"),
        _ => None,
    }
}
