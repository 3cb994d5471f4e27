//! Model weights in safetensors: a flat state_dict (official key names) plus metadata.

use candle_core::Tensor;
use std::collections::HashMap;
use std::path::Path;

/// Which graph a set of weights describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Graph {
    /// The training graph of `yolov9-s.yaml`: layers 0–28 and `DualDDetect` (layer 29).
    Train,
    /// The inference graph (gelan-s): layers 0–21 and `DDetect` (layer 22).
    Infer,
}

/// Metadata stored with the weights.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelMeta {
    /// Number of classes.
    pub nc: usize,
    /// Class names, `names[class_id]`.
    pub names: Vec<String>,
    /// Head strides in pixels, `[8, 16, 32]`.
    pub strides: Vec<u32>,
    /// Which graph the tensors describe.
    pub graph: Graph,
}

/// A flat state_dict with official names (`model.N....`), all tensors f32 on the CPU,
/// plus metadata.
pub struct Weights {
    /// Tensors by official state_dict name.
    pub tensors: HashMap<String, Tensor>,
    /// Metadata.
    pub meta: ModelMeta,
}

impl Weights {
    /// Loads weights from a safetensors file written by `yolo9 convert` (or an official `.pt`).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        anyhow::bail!("{}: weight loading not implemented yet", path.display())
    }
}
