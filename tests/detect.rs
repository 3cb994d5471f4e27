//! Detection and validation tests, one test binary: letterbox, NMS, the pipeline end to end,
//! crops, video and streams, tracking, the `detect` command line, the library's errors, the
//! up-front size check and `yolo9 serve` (`tests/detect/`); AP and mAP, the confusion matrix and
//! plots, COCO evaluation and JSON, `yolo9 val` (`tests/metrics/`).
mod common;

mod detect {
    mod cli;
    mod crops;
    mod e2e;
    mod letterbox;
    mod library_errors;
    mod nms;
    mod pipeline;
    #[cfg(feature = "serve")]
    mod serve;
    #[cfg(feature = "serve")]
    mod serve_limits;
    mod size_check;
    mod stream;
    mod tiles;
    mod track_cli;
    mod track_occlusion;
    mod track_oracle;
    mod track_synthetic;
    mod video;
}

// `#[path]` names the folder for rustfmt, which otherwise looks for these files in the
// folder of the first module above (rustc finds them either way).
#[path = "metrics"]
mod metrics {
    mod coco;
    mod coco_ids;
    mod confusion;
    mod map_case;
    mod val_coco;
    mod val_metrics;
}
