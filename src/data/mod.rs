//! Data: image decoding, dataset description, labels, augmentation, loading.

pub mod augment;
pub mod coco_json;
pub mod fsio;
pub mod image;
pub mod labels;
pub mod loader;
pub mod scan;
pub mod warp;
pub mod yaml;
