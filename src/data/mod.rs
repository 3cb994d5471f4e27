//! Data: image decoding, dataset description, labels, augmentation, loading.

pub mod augment;
pub mod loader;
