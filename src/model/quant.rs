//! INT8 post-training static quantization for the CPU engine: the calibration record stored in a
//! weights file (made by [`crate::convert::int8::calibrate`]).
//!
//! The scheme is ONNX Runtime's and OpenVINO's static quantization (QDQ, "MinMax" calibration):
//! each convolution's input is quantized per tensor to `u8` over the range its values took on
//! calibration images (an f32 forward of each), and its weights per output channel,
//! symmetrically, to `i8`; the sums are exact in i32 and the bias, SiLU and residual are
//! applied in f32 (`src/model/cpu/int8.rs` has the arithmetic). The convolutions that write the
//! head's outputs (box distribution and class logits) stay f32, and so does everything that is
//! not a convolution (pools, upsampling, the DFL and box decode).
//!
//! A file with a calibration (`yolo9 convert W --int8 --data data.yaml`) keeps its f32 weights,
//! so it loads anywhere like any other: on the CPU the engine quantizes them at load and runs the
//! INT8 kernels (AVX-512 VNNI; elsewhere a portable loop, correct but slow); on a GPU, or with
//! `YOLO9_CPU_ENGINE=0`, the calibration is ignored and the model runs in floating point.

use serde::{Deserialize, Serialize};

/// One convolution's calibrated input range, in the order the traced inference forward runs
/// the convolutions; its shape identifies it (a calibration of another model is refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConvRange {
    /// Output channels.
    pub co: usize,
    /// Input channels.
    pub ci: usize,
    /// Kernel size (square).
    pub k: usize,
    /// Stride.
    pub stride: usize,
    /// Smallest input value seen (activation units, the f32 forward's).
    pub min: f32,
    /// Largest input value seen.
    pub max: f32,
    /// Run this convolution in f32 all the same (a layer that loses accuracy in INT8).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_f32: bool,
}

/// The INT8 calibration of a model: every convolution's input range ([`ConvRange`]), stored in
/// a weights file's metadata (`"int8"` in the `yolo9` metadata JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Int8Calibration {
    /// How the ranges were taken (`"minmax"`: the extremes over the images).
    pub method: String,
    /// Images the ranges were taken on.
    pub images: usize,
    /// Image size (pixels, the longer side after letterboxing).
    pub imgsz: u32,
    /// Every convolution of the inference forward, in trace order.
    pub convs: Vec<ConvRange>,
}
