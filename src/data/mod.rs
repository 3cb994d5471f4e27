//! Data: image decoding, dataset description, labels, augmentation, loading.

pub mod labels;
pub mod scan;
pub mod yaml;
