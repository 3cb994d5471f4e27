//! # yolo9 — YOLOv9 object detection and training in pure Rust on Candle
//!
//! One model definition (the official model descriptions of WongKinYiu/yolov9: yolov9-t/s/m/c/e
//! and gelan-t/s/m/c/e) serves three users: the `yolo9` command line (`detect`, `train`, `val`,
//! `check`, `convert`, `export`, `plot`, `serve`), Rust programs embedding [`Detector`] (configured
//! by a [`DetectorConfig`]), and services built on `yolo9::serve`.
//!
//! Module map (the pipeline, one concept per module):
//! - [`model`]: layers, the YOLOv9 graphs (training and inference), head, weights I/O.
//! - [`pt`] and [`convert`]: official PyTorch `.pt` checkpoints → safetensors, parsed without
//!   Python.
//! - [`data`]: image decoding (EXIF, colour modes), dataset yaml, labels, augmentation, loader.
//! - [`detect`]: letterbox, NMS, post-processing, drawing, output sinks, the public [`Detector`]
//!   and its options.
//! - [`hub`]: weights by name (the official release's checkpoints, downloaded once, verified and
//!   cached; feature `download`) and the built-in BCCD weights (feature `builtin-weights`).
//! - [`device`] and [`parse`]: `--device` and the other option values, parsed the same way by
//!   every subcommand.
//! - [`bounded`]: the size and nesting limits of every YAML file read, checked before parsing.
//! - [`text`]: data-derived text made safe to print (escapes, URL credentials redacted).
//! - [`outfile`]: every output file, written atomically, never onto an input or a non-regular
//!   file.
//! - [`budget`], [`footprint`], [`memory`]: memory-budget sizing from measured peaks, the up-front
//!   estimate, the probes.
//! - `loss`: IoU/CIoU, the TaskAlignedAssigner, the dual-branch TAL loss.
//! - `metrics`: mAP (official `ap_per_class`), validation, COCO evaluation, plots.
//! - `train`: options, optimizer, EMA, schedules, the training step, checkpoints, the loop.
//! - `export` (feature `export`): the inference graph as ONNX.
//! - `serve` (feature `serve`, on by default): the HTTP detection service of `yolo9 serve`.
//! - [`track`]: multi-object tracking (ByteTrack, its Kalman filter, MOT metrics).
//! - `cli`: the `yolo9` subcommands (thin wrappers around the library).
//!
//! Features: `cli` (the command line; implies `train`, `media`, `export`, `download` and
//! `builtin-weights`) and `serve` are on by default; `media` holds the sources and sinks of
//! `yolo9 detect` (`detect::{source, stream, video, output, draw}`, `runs`); `train` (implies
//! `media`) holds `train`, `loss`, `metrics` and the dataset side of `data` (`yaml`, `labels`,
//! `coco_json`, `scan`, `augment`, `warp`, `loader`).
//!
//! What a service uses (the detector-only build, `yolo9 = { default-features = false }`, adding
//! `features = ["serve"]` for the HTTP service), which compiles no clap, indicatif, plotters,
//! media, dataset or training code:
//! - [`Detector`] (`new` from a path, `from_weights`, `from_model`; `detect`, `detect_file`,
//!   `detect_batch`, and the steps `preprocess`, `infer`, `postprocess`), configured by a
//!   [`DetectorConfig`], giving [`Detection`]s in original pixels;
//! - [`Weights`] (`load`, `from_bytes`) and their [`ModelMeta`]; [`hub`] for checkpoints by
//!   name and the built-in weights;
//! - [`data::image`]: decoding bytes or files to RGB (`decode_rgb8`, `load_rgb8`) with the
//!   EXIF orientation and size guards;
//! - [`device`]: choosing the device; [`convert`]: official `.pt` checkpoints to safetensors;
//! - `serve` (feature `serve`): the HTTP service as an axum `Router`;
//! - [`Error`]: the typed errors of the library.
//! - `cuda` (feature `cuda`): cuDNN convolutions, CUDA kernels and CUDA-graph replay as candle
//!   custom ops.
#![warn(missing_docs)]

pub mod bounded;
pub mod boxes;
pub mod budget;
#[cfg(feature = "media")]
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
pub mod hub;
#[cfg(all(unix, feature = "cli"))]
pub mod launcher;
#[cfg(feature = "train")]
pub mod loss;
pub mod memory;
#[cfg(feature = "train")]
pub mod metrics;
pub mod model;
pub mod op_args;
pub mod outfile;
pub mod parse;
#[cfg(any(feature = "train", feature = "download"))]
pub(crate) mod progress;
pub mod pt;
#[cfg(feature = "media")]
pub mod runs;
#[cfg(feature = "serve")]
pub mod serve;
pub mod switches;
pub mod text;
pub mod track;
#[cfg(feature = "train")]
pub mod train;

pub use detect::config::DetectorConfig;
pub use detect::detector::{Detection, Detector};
pub use error::Error;
pub use model::weights::{Graph, ModelMeta, Weights};
