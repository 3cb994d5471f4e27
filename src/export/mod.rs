//! `yolo9 export`: the inference graph written as an ONNX model, for ONNX Runtime, TensorRT,
//! OpenVINO or any other ONNX consumer, without Python.
//!
//! The graph is not described a second time: [`crate::model::YoloV9::trace_raw`] runs the
//! detector's own eval forward (BN folded, `RepConvN` fused, NCHW) on a small input and records
//! every layer op ([`crate::model::trace`]); [`onnx`] writes one ONNX node (or a few) per
//! recorded op, then the head's decode ([`crate::model::head::decode`]: DFL, anchors, boxes in
//! input pixels, sigmoid scores) and, with [`NmsExport`], the official NMS as ONNX
//! `NonMaxSuppression` (an end-to-end model). `tests/model/export_onnx.rs` runs the written file in
//! tract (a pure-Rust ONNX runtime) against [`crate::model::YoloV9::forward`].
//!
//! - [`onnx_pb`]: the protobuf messages of `onnx.proto` used (prost does the encoding).
//! - [`onnx`]: [`onnx::export`], the model as an [`onnx_pb::ModelProto`]; [`write`] saves it.

pub mod onnx;
pub(crate) mod onnx_pb;

use anyhow::{ensure, Result};
use std::path::Path;

/// What [`onnx::export`] writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    /// Input height and width in pixels, multiples of 32 (`--img`; the shapes written in a
    /// static model, and the example shape a dynamic one is traced with).
    pub img: (usize, usize),
    /// Batch size of a static model (`--batch`).
    pub batch: usize,
    /// Batch, height and width as symbolic dimensions (`--dynamic`).
    pub dynamic: bool,
    /// Network weights and activations in f16 (`--half`): the input is still f32 in 0..1, cast
    /// on entry, and the head's raw outputs are cast back to f32 before the decode, as
    /// `yolo9 detect --half` runs.
    pub half: bool,
    /// An end-to-end model with NMS (`--nms`).
    pub nms: Option<NmsExport>,
    /// The ONNX operator set, 13 to 21 (`--opset`; default 17).
    pub opset: i64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            img: (640, 640),
            batch: 1,
            dynamic: false,
            half: false,
            nms: None,
            opset: 17,
        }
    }
}

/// The NMS of an end-to-end model (official `non_max_suppression` with `multi_label=False`, as
/// `yolo9 detect` runs it): each anchor's best class, kept above `conf`, class-aware NMS at
/// `iou`, the `max_det` best kept per image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NmsExport {
    /// Confidence threshold, in (0, 1): a box is kept when its score is above it.
    pub conf: f32,
    /// IoU threshold, in [0, 1]: a box is suppressed by a better one of its class overlapping it
    /// by more.
    pub iou: f32,
    /// At most this many detections per image (the padded output length, fewer when the model
    /// has fewer anchors).
    pub max_det: usize,
}

impl Default for NmsExport {
    fn default() -> Self {
        Self {
            conf: 0.25,
            iou: 0.45,
            max_det: 300,
        }
    }
}

impl ExportOptions {
    /// Checks the options; errors name the option (`--img`, `--batch`, …) and the value.
    pub fn validate(&self) -> Result<()> {
        let (h, w) = self.img;
        ensure!(
            h >= 32 && w >= 32 && h % 32 == 0 && w % 32 == 0 && h <= 8192 && w <= 8192,
            "--img {h}x{w}: height and width must be multiples of 32 from 32 to 8192"
        );
        ensure!(
            (1..=1024).contains(&self.batch),
            "--batch {}: must be from 1 to 1024",
            self.batch
        );
        ensure!(
            (13..=21).contains(&self.opset),
            "--opset {}: yolo9 writes operator sets 13 to 21",
            self.opset
        );
        if let Some(n) = &self.nms {
            ensure!(
                n.conf > 0.0 && n.conf < 1.0,
                "--conf {}: must be above 0 and below 1",
                n.conf
            );
            ensure!(
                (0.0..=1.0).contains(&n.iou),
                "--iou {}: must be from 0 to 1",
                n.iou
            );
            ensure!(
                (1..=100_000).contains(&n.max_det),
                "--max-det {}: must be from 1 to 100000",
                n.max_det
            );
        }
        Ok(())
    }
}

/// Writes `model` to `path` atomically ([`crate::outfile::write`]: a unique temporary file
/// beside it, fsync, rename), so an interrupted export never leaves a partial model under the
/// final name, no user's file is taken for the temporary, and `path` is refused when it is one of
/// `inputs` (the weights exported) or not a regular file. Returns the bytes written.
pub fn write(
    model: &onnx_pb::ModelProto,
    path: impl AsRef<Path>,
    inputs: &crate::outfile::Inputs,
) -> Result<u64> {
    use prost::Message;
    let path = path.as_ref();
    let bytes = model.encode_to_vec();
    crate::outfile::write(path, &bytes, inputs)?;
    Ok(bytes.len() as u64)
}
