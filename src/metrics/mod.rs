//! Validation metrics: matching and AP as the official `ap_per_class` ([`ap`]), the confusion
//! matrix ([`confusion`]) and its pictures ([`plots`]), and the validation loop ([`validate`]).

pub mod ap;
pub mod confusion;
pub mod plots;
pub mod validate;

pub use ap::{ap_per_class, fitness, process_batch, ApPerClass, ValMetrics, ValStats};
