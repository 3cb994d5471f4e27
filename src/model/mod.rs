//! The YOLOv9 model: layers, the YOLOv9-s graph (training and inference), head, weights.

pub mod weights;
