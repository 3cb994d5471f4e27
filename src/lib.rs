//! # yolo9 — YOLOv9 object detection and training in pure Rust on Candle
//!
//! One model definition (the official model descriptions of WongKinYiu/yolov9: yolov9-t/s/m/c/e
//! and gelan-t/s/m/c/e) serves three users: the `yolo9` command line (`detect`, `train`, `val`,
//! `check`, `convert`, `export`, `plot`, `serve`), Rust programs embedding [`Detector`] (configured
//! by a [`DetectorConfig`]), and services built on `yolo9::serve`.
//!
//! Public modules (what an embedder uses; the default build exposes at most 450 top-level items,
//! held by `tests/project/architecture.rs`):
//! - [`detect`]: the public [`Detector`] and its options [`DetectorConfig`], the jobs of
//!   `yolo9 detect` (`detect::job`), sliced inference (`detect::tile`), sources, video and stream
//!   readers, drawing and output sinks.
//! - [`model`]: the model names and descriptions (`model::arch`) and [`Weights`] I/O.
//! - [`hub`]: weights by name (the official release's checkpoints, downloaded once, verified and
//!   cached; feature `download`) and the built-in BCCD weights (feature `builtin-weights`).
//! - [`data`]: image decoding (`data::image`: EXIF, colour modes, decoding-bomb guards).
//! - [`track`]: multi-object tracking (ByteTrack, the tracker file, MOT metrics, the tracking job).
//! - `train` (feature `train`): `train::trainer::train`, `TrainOptions`, the observer.
//! - `metrics` (feature `train`): validation (`metrics::validate`, the `val` job).
//! - [`convert`]: official `.pt` checkpoints → safetensors; `export` (feature `export`): ONNX.
//! - `serve` (feature `serve`, on by default): the HTTP detection service of `yolo9 serve`.
//! - [`device`]: `--device` values, parsed and opened the same way everywhere; [`cancel`]
//!   (feature `media`): cooperative cancellation of jobs; [`boxes`]: box geometry; [`error`]: the
//!   library's [`Error`].
//!
//! Everything else (the loss, the layers and graphs, the training engine, the `.pt` reader, the
//! CLI, memory probes and budgets, the writers and bounded readers, the switches) is
//! `pub(crate)`; the crate's own tests, benches and binaries reach it through the hidden
//! `internals` module, which promises nothing to anyone else.
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
//! - internally, with feature `cuda`: cuDNN convolutions, CUDA kernels and CUDA-graph replay as
//!   candle custom ops.
#![warn(missing_docs)]

pub(crate) mod bounded;
pub mod boxes;
pub(crate) mod budget;
#[cfg(feature = "media")]
pub mod cancel;
#[cfg(feature = "cli")]
pub(crate) mod cli;
pub mod convert;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub mod data;
pub mod detect;
pub mod device;
pub mod error;
#[cfg(feature = "export")]
pub mod export;
pub(crate) mod footprint;
pub mod hub;
#[doc(hidden)]
pub mod internals;
#[cfg(all(unix, feature = "cli"))]
pub(crate) mod launcher;
#[cfg(feature = "train")]
pub(crate) mod loss;
pub(crate) mod memory;
#[cfg(feature = "train")]
pub mod metrics;
pub mod model;
pub(crate) mod op_args;
pub(crate) mod outfile;
pub(crate) mod parse;
#[cfg(any(feature = "train", feature = "download"))]
pub(crate) mod progress;
pub(crate) mod pt;
#[cfg(feature = "media")]
pub(crate) mod runs;
#[cfg(feature = "serve")]
pub mod serve;
pub(crate) mod switches;
pub(crate) mod text;
pub mod track;
#[cfg(feature = "train")]
pub mod train;

pub use detect::config::DetectorConfig;
pub use detect::detector::{Detection, Detector};
pub use error::Error;
pub use model::weights::{Graph, ModelMeta, Weights};
