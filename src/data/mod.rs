//! Data: image decoding (always), and with the `train` feature the dataset side: dataset
//! description, labels, COCO JSON, the label scan, augmentation and loading.

#[cfg(feature = "train")]
pub mod augment;
#[cfg(feature = "train")]
pub mod coco_json;
#[cfg(feature = "train")]
pub mod compose;
pub mod fsio;
pub mod image;
#[cfg(feature = "train")]
pub mod labels;
#[cfg(feature = "train")]
pub mod loader;
#[cfg(feature = "train")]
pub mod scan;
#[cfg(feature = "train")]
pub mod warp;
#[cfg(feature = "train")]
pub mod yaml;
