//! Detection pipeline: letterbox → model → decode → NMS → scale to original pixels → sinks.

pub mod detector;
