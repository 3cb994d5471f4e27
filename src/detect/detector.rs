//! The public embeddable detector.

/// One detected object, in original-image pixels.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Detection {
    /// Class index into the model's `names`.
    pub class_id: usize,
    /// Class name from the weights' metadata.
    pub class_name: String,
    /// Confidence in 0..1 (sigmoid class score of the chosen class).
    pub confidence: f32,
    /// Box `[x1, y1, x2, y2]` in original-image pixels, clipped to the image.
    pub bbox: [f32; 4],
}

/// A loaded YOLOv9 model ready for inference (stub; see the detect module).
pub struct Detector {}
