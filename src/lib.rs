//! # yolo9 — YOLOv9 object detection and training in pure Rust on Candle
//!
//! One model definition (the official YOLOv9-s, WongKinYiu/yolov9 `models/detect/yolov9-s.yaml`)
//! serves three users: the `yolo9` command line (`detect`, `train`, `val`, `convert`, `check`),
//! and Rust programs embedding [`Detector`].
//!
//! Module map (the pipeline, one concept per module):
//! - [`model`]: layers, the YOLOv9-s graph (training and inference), head, weights I/O.
//! - [`convert`]: official PyTorch `.pt` checkpoints → safetensors, parsed without Python.
//! - [`data`]: image decoding (EXIF, colour modes), dataset yaml, labels, augmentation, loader.
//! - [`detect`]: letterbox, NMS, post-processing, drawing, the public [`Detector`].
//! - [`loss`]: IoU/CIoU, the TaskAlignedAssigner, the dual-branch TAL loss.
//! - [`metrics`]: mAP (official `ap_per_class`), validation reports.
//! - [`train`]: optimizer, EMA, schedules, memory budget, checkpoints, the training loop.
//! - `serve` (feature `serve`, on by default): the HTTP detection service of `yolo9 serve`.
//! - [`cli`]: the `yolo9` subcommands (thin wrappers around the library).
//!
//! Features: `cli` (the command line; implies `train`) and `serve` are on by default; `train`
//! holds [`train`], [`loss`] and [`metrics`]. An embedder of [`Detector`] alone depends on
//! `yolo9 = { default-features = false }` and compiles neither clap, indicatif, plotters nor the
//! training code.
//! - `cuda` (feature `cuda`): cuDNN convolution forward/backward as candle custom ops.
#![warn(missing_docs)]

pub mod budget;
pub mod cancel;
#[cfg(feature = "cli")]
pub mod cli;
pub mod convert;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod detect;
pub mod device;
pub mod error;
#[cfg(feature = "export")]
pub mod export;
pub mod footprint;
#[cfg(unix)]
pub mod launcher;
#[cfg(feature = "train")]
pub mod loss;
pub mod memory;
#[cfg(feature = "train")]
pub mod metrics;
pub mod model;
pub mod op_args;
pub mod parse;
pub mod pt;
pub mod runs;
#[cfg(feature = "serve")]
pub mod serve;
#[cfg(feature = "train")]
pub mod train;

pub use detect::config::DetectorConfig;
pub use detect::detector::{Detection, Detector};
pub use error::Error;
pub use model::weights::{Graph, ModelMeta, Weights};
