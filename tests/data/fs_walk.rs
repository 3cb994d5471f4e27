//! Folder trees that used to make yolo9 loop or block (`yolo9::internals::data::fsio`): symlink loops, a
//! second link to a folder or file, and FIFOs named like images, for the dataset scan
//! (`check`/`train`), the image decoder and `detect`'s `**` globs. Every case runs under a timeout
//! of its own, so a regression fails instead of hanging the suite.

use crate::common;

use common::tmpdir;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;
use yolo9::internals::data::fsio::walk_files;
use yolo9::internals::data::scan::{scan_split, ScanOptions};
use yolo9::internals::data::yaml::{DataConfig, Split};

/// Runs `f` on another thread and fails the test if it takes longer than `secs`.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not finish within {secs} s"))
}

/// The file names of `files`, in order.
fn file_names(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {}",
        p.display()
    );
}

/// A YOLO-layout dataset with two real images and labels, a symlink loop (`images/train/loop
/// -> .`), a second link to the image folder (`again -> ../train`, from a sibling), a second link
/// to one image, and a FIFO named `stuck.jpg`.
fn hostile_dataset(tag: &str) -> PathBuf {
    let d = tmpdir(tag);
    let (img, lab) = (d.join("images/train"), d.join("labels/train"));
    std::fs::create_dir_all(&img).unwrap();
    std::fs::create_dir_all(&lab).unwrap();
    let ex = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/images");
    for n in ["BloodImage_00007", "BloodImage_00011"] {
        std::fs::copy(ex.join(format!("{n}.jpg")), img.join(format!("{n}.jpg"))).unwrap();
        std::fs::write(lab.join(format!("{n}.txt")), "0 0.5 0.5 0.2 0.2\n").unwrap();
    }
    std::os::unix::fs::symlink(".", img.join("loop")).unwrap();
    std::os::unix::fs::symlink("BloodImage_00007.jpg", img.join("alias.jpg")).unwrap();
    std::fs::create_dir_all(img.join("sub")).unwrap();
    std::os::unix::fs::symlink("../../train", img.join("sub/again")).unwrap();
    mkfifo(&img.join("stuck.jpg"));
    std::fs::write(
        d.join("data.yaml"),
        "train: images/train\nval: images/train\nnc: 1\nnames: [cell]\n",
    )
    .unwrap();
    d
}

#[test]
fn walk_lists_each_real_file_once_and_skips_loops_links_and_fifos() {
    let d = hostile_dataset("walk");
    let root = d.join("images/train");
    let w = within(20, "walk_files", move || {
        walk_files(&root, &|p: &Path| p.extension().is_some_and(|e| e == "jpg")).unwrap()
    });
    assert_eq!(
        file_names(&w.files),
        ["BloodImage_00007.jpg", "BloodImage_00011.jpg"],
        "{w:?}"
    );
    let why = |needle: &str| w.skipped.iter().filter(|(_, r)| r.contains(needle)).count();
    assert_eq!(why("FIFO"), 1, "{:?}", w.skipped);
    assert_eq!(
        why("already listed"),
        2,
        "loop and second folder link: {:?}",
        w.skipped
    );
    assert_eq!(why("the same file"), 1, "the image alias: {:?}", w.skipped);
}

#[test]
fn decoding_a_fifo_is_an_error_not_a_hang() {
    let d = tmpdir("fifo");
    let p = d.join("x.jpg");
    mkfifo(&p);
    let q = p.clone();
    let e = within(10, "load_rgb8 on a FIFO", move || {
        yolo9::data::image::load_rgb8(&q).map(|_| ())
    })
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("x.jpg") && msg.contains("FIFO"), "{msg}");
    let q = p.clone();
    let e = within(10, "probe_dimensions on a FIFO", move || {
        yolo9::data::image::probe_dimensions(&q).map(|_| ())
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("FIFO"), "{e:#}");
}

#[test]
fn check_of_a_hostile_tree_ends_with_the_real_images() {
    let d = hostile_dataset("scan");
    let yaml = d.join("data.yaml");
    let s = within(60, "scan of a tree with a loop and a FIFO", move || {
        let cfg = DataConfig::load(&yaml).unwrap();
        scan_split(
            &cfg,
            Split::Train,
            &ScanOptions {
                use_cache: false,
                print: false,
                ..Default::default()
            },
        )
        .unwrap()
    });
    assert_eq!(s.counts.images, 2, "{:?}", s.counts);
    assert_eq!(s.counts.labelled, 2);
    assert_eq!(s.counts.corrupt, 0);
}

#[test]
fn detect_glob_with_a_symlink_loop_ends() {
    let d = hostile_dataset("glob");
    let pat = PathBuf::from(format!("{}/images/**/*.jpg", d.display()));
    let src = within(20, "detect ** glob over a symlink loop", move || {
        yolo9::detect::source::expand_sources(&[pat]).unwrap()
    });
    assert_eq!(
        file_names(&src.files),
        ["BloodImage_00007.jpg", "BloodImage_00011.jpg"],
        "{src:?}"
    );
    assert!(
        src.skipped
            .iter()
            .any(|(p, r)| p.ends_with("stuck.jpg") && r.contains("FIFO")),
        "{:?}",
        src.skipped
    );
}
