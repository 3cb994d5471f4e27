//! Validation metrics: matching and AP as the official `ap_per_class`.
