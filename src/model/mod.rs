//! The YOLOv9 model: layers, the YOLOv9-s graph (training and inference), head, weights.
//!
//! - [`conv`]: `Conv` (conv + BN + SiLU), BN folding, train/eval BatchNorm.
//! - [`bn_act`]: train-mode BatchNorm fused with SiLU (custom op with closed-form backward).
//! - [`bias_act`]: the folded-BN inference epilogue `act(x + b)` as one op.
//! - [`cpu_conv`]: the CPU inference convolution (im2col + one GEMM).
//! - [`blocks`]: `RepConvN`, `RepNBottleneck`, `RepNCSP`, `RepNCSPELAN4`, `ELAN1`, `AConv`, `SPPELAN`.
//! - [`pool`]: PyTorch-exact, differentiable avg/max pooling and nearest upsampling.
//! - [`tape`]: the training graph's own reverse mode (one node per layer op) and the forward context [`tape::Ctx`].
//! - [`head`]: `DDetect` branch, DFL, anchors, decode.
//! - [`graphs`]: CUDA-graph replay of the inference forward, per input shape.
//! - [`yolov9`]: the inference graph [`YoloV9`] and the training graph [`YoloV9Train`].
//! - [`params`]: building layers from a state_dict; trainable variables and optimizer groups.
//! - [`weights`]: safetensors I/O.
//! - [`keys`]: the state_dict names of the training (yolov9-s) and inference (gelan-s) graphs and
//!   the official re-parameterization name mapping.

pub mod bias_act;
pub mod blocks;
pub mod bn_act;
pub mod conv;
pub mod cpu_conv;
pub mod graphs;
pub mod head;
pub mod keys;
pub mod params;
pub mod pool;
pub mod tape;
pub mod weights;
pub mod yolov9;

pub use params::{NamedVar, ParamGroup};
pub use yolov9::{DualRaw, YoloV9, YoloV9Train, STRIDES};
