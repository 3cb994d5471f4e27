//! Detection pipeline: letterbox → model → decode → NMS → scale to original pixels → sinks.
//!
//! - [`letterbox`]: official letterbox (resize + stride padding) and the input tensor.
//! - [`nms`]: torchvision-compatible greedy NMS.
//! - [`postprocess`]: candidates, official `non_max_suppression`, `scale_boxes`, clipping.
//! - [`device_nms`]: the NMS of a whole batch as one op on the output's device (a CUDA kernel).
//! - [`draw`]: annotated images.
//! - [`source`]: expanding files, directories and globs.
//! - [`video`]: video files read and written through the `ffmpeg` program.
//! - [`stream`]: webcams and network streams (the newest frame, reopened when they break).
//! - [`output`]: what detection writes per image (label lines, names, crops).
//! - [`detector`]: the public [`detector::Detector`]; [`config`]: its options.

pub mod config;
pub mod detector;
pub mod device_nms;
pub mod draw;
pub mod letterbox;
pub mod nms;
pub mod output;
pub mod postprocess;
pub mod source;
pub mod stream;
pub mod video;
