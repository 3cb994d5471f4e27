//! Detection tests: letterbox, NMS, the pipeline end to end, crops, video and streams, the
//! `detect` command line, the library's errors, the up-front size check and `yolo9 serve` (one
//! test binary; the files are in `tests/detect/`).
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
    mod track_cli;
    mod track_oracle;
    mod track_synthetic;
    mod video;
}
