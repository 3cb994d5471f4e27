//! A recording of the inference forward, op by op, for exporting the graph (`yolo9 export`).
//!
//! A traced forward ([`super::tape::Ctx::tracing`]) is the ordinary eval forward (NCHW, BN folded,
//! `RepConvN` fused) in which every layer op also appends one [`TracedOp`] to a [`Trace`]: the
//! ids of its input and output tensors and, for a convolution, its folded kernel and bias. The
//! ops are in execution order, which is a topological order, so an exporter can emit one node
//! (or a few) per op, naming each value by its tensor id. This is how the graph is exported from
//! the one model definition the detector runs, instead of from a second description of the
//! blocks: whatever [`crate::model::YoloV9`] computes, op for op, is what gets written.
//!
//! What the forward does outside a [`super::tape::Ctx`] op is not recorded; the layer code routes
//! everything that changes values through the context (tensor copies that only change the
//! memory layout are recorded as [`TracedOp::Alias`]).

use candle_core::{Tensor, TensorId};
use std::cell::RefCell;

/// One recorded op; `x`/`y` are the ids of the input and output tensors (NCHW).
#[derive(Debug, Clone)]
pub enum TracedOp {
    /// `y = act(conv2d(x, weight) + bias)`: `weight` (C_out, C_in/groups, k, k) f32 (BN folded),
    /// `bias` (C_out,) f32, zero `padding` on each side, `act` SiLU.
    Conv {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
        /// Folded kernel, f32.
        weight: Tensor,
        /// Folded bias (C_out,), f32.
        bias: Option<Tensor>,
        /// Stride.
        stride: usize,
        /// Zero padding per side.
        padding: usize,
        /// Groups.
        groups: usize,
        /// SiLU after the bias.
        act: bool,
    },
    /// `y = a + b` (same shapes).
    Add {
        /// First input.
        a: TensorId,
        /// Second input.
        b: TensorId,
        /// Output.
        y: TensorId,
    },
    /// Concatenation along `dim`.
    Cat {
        /// Inputs in order.
        xs: Vec<TensorId>,
        /// Output.
        y: TensorId,
        /// NCHW dimension.
        dim: usize,
    },
    /// `y = x.narrow(dim, start, len)`.
    Narrow {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
        /// NCHW dimension.
        dim: usize,
        /// First index kept.
        start: usize,
        /// Number kept.
        len: usize,
    },
    /// `y = x·σ(x)`.
    Silu {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
    },
    /// Nearest upsampling by the integer `factor` on H and W.
    Upsample {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
        /// Scale factor.
        factor: usize,
    },
    /// The even rows and columns (H, W) of x.
    TakeEven {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
    },
    /// `avg_pool2d(2, stride 1)`, no padding: (H, W) → (H−1, W−1).
    AvgPool2x2S1 {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
    },
    /// `MaxPool2d(k, stride 1, padding k/2)`.
    MaxPoolSame {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
        /// Odd kernel size.
        k: usize,
    },
    /// `y` holds the values of `x` (a layout copy).
    Alias {
        /// Input.
        x: TensorId,
        /// Output.
        y: TensorId,
    },
}

/// The ops of one traced forward, in execution order (see the module docs). Not `Send`: a trace
/// lives in the thread that runs the forward.
#[derive(Default)]
pub struct Trace {
    ops: RefCell<Vec<TracedOp>>,
}

impl Trace {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `op`.
    pub fn push(&self, op: TracedOp) {
        self.ops.borrow_mut().push(op);
    }

    /// The recorded ops, in execution order.
    pub fn into_ops(self) -> Vec<TracedOp> {
        self.ops.into_inner()
    }
}
