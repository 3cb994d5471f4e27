//! Data: image decoding, dataset description, labels, augmentation, loading.

pub mod image;
