//! Data tests: dataset YAML, label scan, COCO/Roboflow layouts, the loader and augmentation,
//! image decoding and its guards, hostile text and folder trees (one test binary; the files are in
//! `tests/data/`).
mod common;

mod data {
    mod augment;
    mod bounded_parse;
    mod coco;
    #[cfg(unix)]
    mod fs_walk;
    mod hostile_text;
    mod image_decode;
    mod image_guard;
    mod image_verdict;
    mod loader;
    mod scan;
    mod text_hygiene;
    mod yaml;
}
