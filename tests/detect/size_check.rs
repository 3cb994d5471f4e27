//! Issue 18 item 5: sizes are checked against the memory before any work starts
//! (`yolo9::internals::footprint`). Each command is run as the release user would, with a size that cannot
//! fit (tens to hundreds of GiB on the CPU, or over the given `--budget`); it must end at once
//! (each run has its own timeout: without the check these start and then die or swap) with an
//! error naming the option, the value, the estimate and what is available, and leave nothing
//! behind (no run folder, no scan cache). Normal sizes are not refused (the footprint unit tests,
//! and every other CLI test at 320–640).
use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `yolo9 args`, killing it after `secs` (a panic: it did not stop). Returns (code, stderr).
fn yolo9_within(secs: u64, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run yolo9");
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code().unwrap_or(-1), err);
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "yolo9 {args:?} still running after {secs} s: the size was not checked up front"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn weights() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("weights/yolov9-s-bccd.safetensors")
        .to_string_lossy()
        .into_owned()
}

/// Asserts the refusal names the words given and the estimate/availability phrases.
fn assert_refused(code: i32, err: &str, words: &[&str]) {
    assert_ne!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for w in words {
        assert!(err.contains(w), "missing `{w}` in: {err}");
    }
    assert!(
        err.contains("on the CPU needs about") && err.contains("is available"),
        "{err}"
    );
    assert!(err.contains("lower --img to at most"), "{err}");
}

#[test]
fn train_at_a_size_that_cannot_fit_is_refused_before_the_scan() {
    let dir = common::tmpdir("size-train");
    let yaml = common::tiny_dataset(&dir, 2);
    let project = dir.join("runs");
    let (code, err) = yolo9_within(
        120,
        &[
            "train",
            "--data",
            yaml.to_str().unwrap(),
            "--img",
            "8192",
            "--batch",
            "16",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--project",
            project.to_str().unwrap(),
        ],
    );
    // 2000 B/px/image × 8192² × 16 = 2000 GiB
    assert_refused(
        code,
        &err,
        &["--img 8192 --batch 16", "a training step", "2000.00GiB"],
    );
    // 2000 B/px × 8192² is 125 GiB for one image: only a smaller --img helps.
    assert!(err.contains("use --batch 1 with --img at most"), "{err}");
    assert!(err.contains("free memory"), "{err}");
    assert!(!project.exists(), "no run folder");
    assert!(
        !dir.join("labels/train.yolo9-cache.json").exists(),
        "refused before the scan"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn val_with_a_batch_that_cannot_fit_is_refused_before_loading() {
    let dir = common::tmpdir("size-val");
    let yaml = common::tiny_dataset(&dir, 2);
    let project = dir.join("runs");
    let w = weights();
    let (code, err) = yolo9_within(
        120,
        &[
            "val",
            "--data",
            yaml.to_str().unwrap(),
            "--weights",
            &w,
            "--img",
            "8192",
            "--batch",
            "64",
            "--device",
            "cpu",
            "--project",
            project.to_str().unwrap(),
        ],
    );
    // 128 B/px × 8192² × 64 = 512 GiB
    assert_refused(
        code,
        &err,
        &["--img 8192 --batch 64", "validation", "512.00GiB"],
    );
    assert!(!project.exists());
    assert!(!dir.join("labels/val.yolo9-cache.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// detect's documented maximum `--img 8192` needs more than 8 GiB on the CPU; under `--budget 1GiB`
/// it is refused at once (before: the budget search ran an 8192×8192 forward to find out).
#[test]
fn detect_over_the_budget_is_refused_before_measuring() {
    let dir = common::tmpdir("size-detect");
    let img = common::case("cli_args_edges").join("crowd_640x480.jpg");
    let project = dir.join("runs");
    let w = weights();
    let (code, err) = yolo9_within(
        120,
        &[
            "detect",
            img.to_str().unwrap(),
            "--weights",
            &w,
            "--img",
            "8192",
            "--budget",
            "1GiB",
            "--device",
            "cpu",
            "--project",
            project.to_str().unwrap(),
        ],
    );
    assert_refused(
        code,
        &err,
        &[
            "--budget 1.00GiB is too small: --img 8192:",
            "detect",
            "8.00GiB",
        ],
    );
    // sqrt(1 GiB / 128) = 2896 -> 2880
    assert!(
        err.contains("at most 2880") && err.contains("raise --budget"),
        "{err}"
    );
    assert!(!project.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
