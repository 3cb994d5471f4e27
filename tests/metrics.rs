//! Metrics and validation tests: AP and mAP, the confusion matrix and plots, COCO evaluation
//! and JSON, `yolo9 val` (one test binary; the files are in `tests/metrics/`).
mod common;

mod metrics {
    mod coco;
    mod coco_ids;
    mod confusion;
    mod map_case;
    mod val_coco;
    mod val_metrics;
}
