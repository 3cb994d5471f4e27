//! Validation metrics: matching and AP as the official `ap_per_class`.

pub mod ap;
pub mod validate;

pub use ap::{ap_per_class, fitness, process_batch, ApPerClass, ValMetrics, ValStats};
