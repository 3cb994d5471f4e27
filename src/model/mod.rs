//! The YOLOv9 model: model descriptions, layers, the training and inference graphs of every size,
//! head, weights.
//!
//! - [`arch`]: model descriptions (the official model-yaml layer tables) and the main-branch
//!   (re-parameterized) graph of a training graph.
//! - [`net`]: the network of a description, one block per layer row.
//! - [`conv`]: `Conv` (conv + BN + SiLU), BN folding, train/eval BatchNorm.
//! - [`bn_act`]: train-mode BatchNorm fused with SiLU (custom op with closed-form backward).
//! - [`bias_act`]: the folded-BN inference epilogue `act(x + b)` as one op.
//! - [`cpu`]: the CPU inference engine (planned, NHWC, fused, multi-threaded) that runs
//!   [`YoloV9::forward`] on the CPU.
//! - [`cpu_conv`]: the CPU convolution of candle-op forwards (im2col + one GEMM).
//! - [`ew`]: `a + b` and contiguous copies of channel slices in one vectorized pass on CUDA.
//! - [`blocks`]: `RepConvN`, `RepNBottleneck`, `RepNCSP`, `RepNCSPELAN4`, `ELAN1`, `AConv`,
//!   `ADown`, `SPPELAN`, `CBLinear`.
//! - [`pool`]: PyTorch-exact, differentiable avg/max pooling and nearest upsampling.
//! - [`tape`]: the training graph's own reverse mode (one node per layer op) and the forward context [`tape::Ctx`].
//! - [`trace`]: a recording of the inference forward, op by op, for `yolo9 export`.
//! - [`head`]: `DDetect` branch, DFL, anchors, decode.
//! - [`graphs`]: CUDA-graph replay of the inference forward, per input shape.
//! - [`yolov9`]: the inference graph [`YoloV9`] and the training graph [`YoloV9Train`].
//! - [`params`]: building layers from a state_dict; trainable variables and optimizer groups.
//! - [`weights`]: safetensors I/O.
//! - [`quant`]: INT8 calibration for the CPU engine (the ranges a weights file stores).
//! - [`keys`]: the state_dict names of a graph and the official re-parameterization name mapping.

pub mod arch;
pub(crate) mod bias_act;
pub(crate) mod blocks;
pub(crate) mod bn_act;
pub(crate) mod bn_sync;
pub(crate) mod conv;
pub(crate) mod cpu;
pub(crate) mod cpu_conv;
pub(crate) mod ew;
pub(crate) mod graphs;
pub(crate) mod head;
pub(crate) mod keys;
pub(crate) mod layout;
pub(crate) mod net;
pub(crate) mod params;
pub(crate) mod pool;
pub mod quant;
pub(crate) mod rename;
pub(crate) mod tape;
pub(crate) mod trace;
pub mod weights;
pub(crate) mod yolov9;

pub use arch::{Arch, STRIDES};
pub use params::{NamedVar, ParamGroup};
pub use yolov9::{DualRaw, SegRaw, YoloV9, YoloV9Train};
