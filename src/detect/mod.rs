//! Detection pipeline: letterbox → model → decode → NMS → scale to original pixels → sinks.
//!
//! - [`letterbox`]: official letterbox (resize + stride padding) and the input tensor.
//! - [`nms`]: torchvision-compatible greedy NMS.
//! - [`postprocess`]: candidates, official `non_max_suppression`, `scale_boxes`, clipping.
//! - [`device_nms`]: the NMS of a whole batch as one op on the output's device (a CUDA kernel).
//! - [`masks`]: instance masks of a segmentation model (prototypes × coefficients → mask,
//!   outline polygon).
//! - [`tile`]: sliced inference (SAHI): tiles of a large image and the merging of their boxes.
//! - [`detector`]: the public [`detector::Detector`]; [`config`]: its options.
//!
//! With the `media` feature (on with `cli`), the sources and sinks of `yolo9 detect`:
//! - `draw`: annotated images.
//! - `source`: expanding files, directories and globs.
//! - `video`: video files read and written through the `ffmpeg` program.
//! - `stream`: webcams and network streams (the newest frame, reopened when they break).
//! - `output`: what detection writes per image (label lines, names, crops).

pub mod config;
pub mod detector;
pub(crate) mod device_nms;
#[cfg(feature = "media")]
pub mod draw;
#[cfg(feature = "media")]
pub(crate) mod frames;
#[cfg(feature = "media")]
pub mod job;
pub(crate) mod letterbox;
pub mod masks;
pub(crate) mod nms;
#[cfg(feature = "media")]
pub mod output;
pub(crate) mod postprocess;
#[cfg(feature = "media")]
pub mod source;
#[cfg(feature = "media")]
pub mod stream;
pub mod tile;
#[cfg(feature = "media")]
pub mod video;
