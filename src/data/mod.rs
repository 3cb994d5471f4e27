//! Data: image decoding and mask outlines (always), and with the `train` feature the dataset side: dataset
//! description, labels, COCO JSON, the label scan, augmentation and loading, and the masks of
//! instance outlines (`polygons`).

#[cfg(feature = "train")]
pub(crate) mod augment;
#[cfg(feature = "train")]
pub(crate) mod coco_json;
#[cfg(feature = "train")]
pub(crate) mod compose;
pub(crate) mod fsio;
pub mod image;
#[cfg(feature = "train")]
pub(crate) mod labels;
#[cfg(feature = "train")]
pub(crate) mod loader;
pub(crate) mod outline;
#[cfg(feature = "train")]
pub(crate) mod polygons;
#[cfg(feature = "train")]
pub(crate) mod scan;
#[cfg(feature = "train")]
pub(crate) mod warp;
#[cfg(feature = "train")]
pub(crate) mod yaml;
