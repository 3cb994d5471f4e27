//! Validation metrics: matching and AP as the official `ap_per_class` ([`ap`]), the confusion
//! matrix ([`confusion`]) and its pictures ([`plots`]), the validation loop ([`validate`]), and
//! COCO bbox evaluation as pycocotools ([`coco`]) with its JSON files ([`coco_json`]), and the
//! box and mask metrics of segmentation models ([`seg`]) with their validation loop ([`seg_val`]).

pub(crate) mod ap;
pub(crate) mod coco;
pub(crate) mod coco_json;
pub(crate) mod confusion;
pub mod job;
pub(crate) mod plots;
pub mod seg;
pub mod seg_val;
pub mod validate;

pub use ap::{ap_per_class, fitness, process_batch, ApPerClass, ValMetrics, ValStats};
