//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The `shared/` folder beside the repository (oracle files, datasets, bad-input cases).
/// Override with `YOLO9_SHARED`. Panics with a clear message when it is missing: the parity
/// tests must never pass by skipping.
pub fn shared_dir() -> PathBuf {
    let p = match std::env::var_os("YOLO9_SHARED") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    };
    assert!(
        p.join("reference").is_dir(),
        "shared folder not found at {} (set YOLO9_SHARED)",
        p.display()
    );
    p
}

/// `shared/reference/<name>`.
pub fn reference(name: &str) -> PathBuf {
    shared_dir().join("reference").join(name)
}

/// `shared/cases/<name>`.
pub fn case(name: &str) -> PathBuf {
    shared_dir().join("cases").join(name)
}
