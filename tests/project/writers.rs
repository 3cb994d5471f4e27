//! Writers never destroy input (issue 36, "writers"): every output goes through
//! `yolo9::internals::outfile`, so an output that is one of the command's inputs (by file identity: the same
//! path, a hard link, a symlink), a FIFO, a device or a directory is refused with an error naming
//! it, before any work and without blocking; a user's file that happens to carry the name of an
//! old temporary (`W.onnx.partial`) survives; and no temporary is left behind.
use crate::common;

use common::tmpdir;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use yolo9::internals::outfile::{self, Inputs};

fn shipped_weights() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors")
}

/// A copy of the shipped weights in `dir` (the test may be wrong; the shipped file must not be).
fn weights_copy(dir: &Path) -> PathBuf {
    let w = dir.join("w.safetensors");
    std::fs::copy(shipped_weights(), &w).unwrap();
    w
}

fn mkfifo(p: &Path) {
    let st = Command::new("mkfifo").arg(p).status().expect("mkfifo");
    assert!(st.success(), "mkfifo {}", p.display());
}

/// Runs yolo9 with `args`, killed after `limit` (a writer that opens a FIFO would block for
/// ever): `(exit code, stderr, elapsed)`.
fn yolo9_bounded(args: &[&str], limit: Duration) -> (i32, String, Duration) {
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (st.code().unwrap_or(-1), err, t0.elapsed());
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("yolo9 {args:?} still running after {limit:?} (blocked on a FIFO?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `export -o W` where W is the input weights (itself, a hard link, a symlink): refused, exit
/// non-zero, the weights byte-identical (before: destroyed, exit 0).
#[test]
fn export_onto_its_own_weights_is_refused_and_they_are_kept() {
    let d = tmpdir("export-self");
    let w = weights_copy(&d);
    let before = std::fs::read(&w).unwrap();
    let hard = d.join("hard.safetensors");
    std::fs::hard_link(&w, &hard).unwrap();
    let soft = d.join("soft.onnx");
    std::os::unix::fs::symlink(&w, &soft).unwrap();
    let dotted = d.join(".").join("w.safetensors");
    for out in [&w, &hard, &soft, &dotted] {
        let (code, err, _) = yolo9_bounded(
            &[
                "export",
                "--weights",
                w.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(120),
        );
        assert_ne!(code, 0, "-o {}: {err}", out.display());
        assert!(
            err.contains("an input of this command") && err.contains(&out.display().to_string()),
            "-o {}: {err}",
            out.display()
        );
        assert_eq!(std::fs::read(&w).unwrap(), before, "-o {}", out.display());
    }
    assert_eq!(
        entries(&d),
        ["hard.safetensors", "soft.onnx", "w.safetensors"],
        "no temporary left"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `export -o FIFO` and `convert -o FIFO`, `-o /dev/null`, `-o DIR`: refused quickly (no open,
/// so no block), naming the path and what it is; the FIFO is still a FIFO.
#[test]
fn export_and_convert_refuse_fifos_devices_and_directories_without_blocking() {
    use std::os::unix::fs::FileTypeExt;
    let d = tmpdir("export-fifo");
    let w = weights_copy(&d);
    let fifo = d.join("out.onnx");
    mkfifo(&fifo);
    let sub = d.join("folder.onnx");
    std::fs::create_dir(&sub).unwrap();
    let cases: [(&Path, &str); 3] = [
        (&fifo, "a FIFO"),
        (Path::new("/dev/null"), "a device"),
        (&sub, "a directory"),
    ];
    for (out, what) in cases {
        for cmd in ["export", "convert"] {
            let args: Vec<&str> = if cmd == "export" {
                vec![
                    "export",
                    "--weights",
                    w.to_str().unwrap(),
                    "-o",
                    out.to_str().unwrap(),
                ]
            } else {
                vec!["convert", w.to_str().unwrap(), "-o", out.to_str().unwrap()]
            };
            let (code, err, took) = yolo9_bounded(&args, Duration::from_secs(120));
            assert_ne!(code, 0, "{cmd} -o {}: {err}", out.display());
            assert!(
                err.contains(what)
                    && err.contains("not a regular file")
                    && err.contains(&out.display().to_string()),
                "{cmd} -o {}: {err}",
                out.display()
            );
            assert!(took < Duration::from_secs(60), "{cmd}: {took:?}");
        }
    }
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    assert_eq!(
        entries(&d),
        ["folder.onnx", "out.onnx", "w.safetensors"],
        "no temporary left"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `convert IN -o LINK` where LINK is a hard link to IN (the canonical paths differ): refused,
/// the input byte-identical.
#[test]
fn convert_onto_a_hard_link_of_its_input_is_refused() {
    let d = tmpdir("convert-link");
    let w = weights_copy(&d);
    let before = std::fs::read(&w).unwrap();
    let hard = d.join("other-name.safetensors");
    std::fs::hard_link(&w, &hard).unwrap();
    let (code, err, _) = yolo9_bounded(
        &["convert", w.to_str().unwrap(), "-o", hard.to_str().unwrap()],
        Duration::from_secs(120),
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("an input of this command"), "{err}");
    assert_eq!(std::fs::read(&w).unwrap(), before);
    let _ = std::fs::remove_dir_all(&d);
}

/// The ONNX writer's temporary file is unique and created exclusively: a user's `W.onnx.partial`
/// (the fixed name used before) and any file beside the output survive a successful export, the
/// output holds the model and nothing else is left in the folder.
#[test]
fn a_users_partial_file_survives_and_no_temporary_is_left() {
    use prost::Message;
    let d = tmpdir("export-partial");
    let out = d.join("W.onnx");
    let partial = d.join("W.onnx.partial");
    std::fs::write(&partial, b"the user's own file").unwrap();
    let model = yolo9::internals::export::onnx_pb::ModelProto {
        ir_version: 8,
        producer_name: "writers-test".into(),
        ..Default::default()
    };
    for _ in 0..2 {
        let n = yolo9::export::write(&model, &out, &Inputs::none()).unwrap();
        assert_eq!(n as usize, model.encode_to_vec().len());
    }
    assert_eq!(std::fs::read(&out).unwrap(), model.encode_to_vec());
    assert_eq!(std::fs::read(&partial).unwrap(), b"the user's own file");
    assert_eq!(entries(&d), ["W.onnx", "W.onnx.partial"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// The one writer, per kind of destination: a FIFO (refused without blocking, whoever reads it),
/// a symlink to an input, a device; a regular file is replaced whole and its old content never
/// torn by a failing write; the image writer and the video temporary take the same path.
#[test]
fn the_writer_refuses_each_kind_and_replaces_regular_files_whole() {
    let d = tmpdir("outfile-kinds");
    let input = d.join("in.txt");
    std::fs::write(&input, b"input").unwrap();
    let inputs = Inputs::of([&input]);
    assert_eq!(inputs.len(), 1);

    let fifo = d.join("pipe.json");
    mkfifo(&fifo);
    let t0 = Instant::now();
    let e = format!("{:#}", outfile::write(&fifo, b"x", &inputs).unwrap_err());
    assert!(
        e.contains("pipe.json") && e.contains("a FIFO (named pipe)"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    let img = image::RgbImage::new(4, 4);
    assert!(outfile::save_image(&img, &fifo, &Inputs::none()).is_err());
    assert!(outfile::create_stream(&fifo, &Inputs::none()).is_err());
    assert!(outfile::temp_beside(&fifo, ".mp4", &Inputs::none()).is_err());

    let link = d.join("link.txt");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    let e = format!("{:#}", outfile::write(&link, b"x", &inputs).unwrap_err());
    assert!(e.contains("in.txt") && e.contains("an input"), "{e}");
    assert_eq!(std::fs::read(&input).unwrap(), b"input");

    let e = format!(
        "{:#}",
        outfile::write(Path::new("/dev/null"), b"x", &inputs).unwrap_err()
    );
    assert!(e.contains("/dev/null") && e.contains("a device"), "{e}");

    let out = d.join("out.png");
    outfile::save_image(&img, &out, &inputs).unwrap();
    assert_eq!(image::open(&out).unwrap().width(), 4);
    std::fs::write(d.join("keep.txt"), b"old").unwrap();
    let e = outfile::write_with(&d.join("keep.txt"), &inputs, |w| {
        use std::io::Write;
        w.write_all(b"half")?;
        anyhow::bail!("the writer failed half way")
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("half way"));
    assert_eq!(std::fs::read(d.join("keep.txt")).unwrap(), b"old");

    let tmp = outfile::temp_beside(&d.join("v.mp4"), ".mp4", &inputs).unwrap();
    assert!(tmp.to_str().unwrap().ends_with(".mp4") && tmp != d.join("v.mp4"));
    std::fs::write(&tmp, b"video").unwrap();
    outfile::commit(&tmp, &d.join("v.mp4"), &inputs).unwrap();
    assert_eq!(std::fs::read(d.join("v.mp4")).unwrap(), b"video");
    assert_eq!(
        entries(&d),
        [
            "in.txt",
            "keep.txt",
            "link.txt",
            "out.png",
            "pipe.json",
            "v.mp4"
        ]
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `detect --exist-ok` into a folder where the annotated image's name is a FIFO and the label
/// file's name is a folder: refused with the path and its kind, no hang (before: the encoder
/// opened the FIFO and blocked until a reader came).
#[test]
fn detect_outputs_refuse_a_fifo_in_the_reused_run_folder() {
    let d = tmpdir("detect-fifo");
    let src = common::shared_dir().join("datasets/bccd/images/test/BloodImage_00007.jpg");
    let img = d.join("in/BloodImage_00007.jpg");
    std::fs::create_dir_all(img.parent().unwrap()).unwrap();
    std::fs::copy(&src, &img).unwrap();
    let run = d.join("runs/exp");
    std::fs::create_dir_all(&run).unwrap();
    let fifo = run.join("BloodImage_00007.jpg");
    mkfifo(&fifo);
    let w = shipped_weights();
    let (code, err, _) = yolo9_bounded(
        &[
            "detect",
            "--weights",
            w.to_str().unwrap(),
            "--source",
            img.to_str().unwrap(),
            "--img",
            "320",
            "--device",
            "cpu",
            "--project",
            d.join("runs").to_str().unwrap(),
            "--name",
            "exp",
            "--exist-ok",
        ],
        Duration::from_secs(300),
    );
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains(&fifo.display().to_string()) && err.contains("a FIFO"),
        "{err}"
    );
    assert_eq!(entries(&run), ["BloodImage_00007.jpg"], "no temporary left");
    let _ = std::fs::remove_dir_all(&d);
}

/// A replaced file keeps its permissions; a symlink destination (not an input) is replaced by
/// the new file and the file it pointed to is left as it was.
#[test]
fn replacing_keeps_permissions_and_never_writes_through_a_symlink() {
    use std::os::unix::fs::PermissionsExt;
    let d = tmpdir("outfile-perms");
    let p = d.join("private.json");
    std::fs::write(&p, b"old").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    outfile::write(&p, b"new", &Inputs::none()).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"new");
    let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let target = d.join("elsewhere.txt");
    std::fs::write(&target, b"keep").unwrap();
    let link = d.join("out.txt");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    outfile::write(&link, b"written", &Inputs::none()).unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert!(!std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(&link).unwrap(), b"written");
    let _ = std::fs::remove_dir_all(&d);
}

/// `plot -o` onto the results.csv it reads: refused, the file byte-identical.
#[test]
fn plot_onto_its_own_results_csv_is_refused() {
    let d = tmpdir("plot-self");
    let csv = d.join("results.csv");
    let text = "epoch,train/box_loss,metrics/mAP50\n0,1.5,0.1\n1,1.2,0.3\n";
    std::fs::write(&csv, text).unwrap();
    let (code, err, _) = yolo9_bounded(
        &["plot", csv.to_str().unwrap(), "-o", csv.to_str().unwrap()],
        Duration::from_secs(120),
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("an input of this command"), "{err}");
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), text);
    let _ = std::fs::remove_dir_all(&d);
}

/// Every `src/` file (path relative to `src/`, text without its trailing `#[cfg(test)] mod`
/// block, which rustfmt keeps last) with its code lines: comments dropped.
fn src_code() -> Vec<(String, Vec<(usize, String)>)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let lines: Vec<(usize, String)> = text
                .lines()
                .enumerate()
                .take_while(|(i, l)| {
                    !(l.trim() == "#[cfg(test)]"
                        && text
                            .lines()
                            .nth(i + 1)
                            .is_some_and(|n| n.trim_start().starts_with("mod tests")))
                })
                .filter(|(_, l)| !l.trim_start().starts_with("//"))
                .map(|(i, l)| (i + 1, l.to_string()))
                .collect();
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (rel, lines)
        })
        .collect()
}

/// Files that open files for writing themselves rather than through `yolo9::internals::outfile`, and why.
const RAW_WRITERS_ALLOWED: &[(&str, &str)] = &[
    ("outfile.rs", "the one writer"),
    (
        "runs.rs",
        "the run folder's lock file (O_NOFOLLOW, locked, never replaced)",
    ),
    (
        "hub/cache.rs",
        "new files of the cache's own unique names (create_new: an existing file or link is \
         never opened), renamed into place",
    ),
    (
        "hub/download.rs",
        "the download's .part file, a new file of a unique name (create_new)",
    ),
    (
        "launcher.rs",
        "writes nothing (compiled alone into the cuda launcher)",
    ),
];

/// Issue 51, "writers that follow links", for its whole kind: no code of `src/` outside the
/// writers above opens a file for writing (`File::create`, `fs::write`, `OpenOptions` with
/// write, append, create or truncate); each of them goes through `yolo9::internals::outfile`, which refuses
/// inputs and replaces links instead of writing through them.
#[test]
fn every_file_written_goes_through_the_one_writer() {
    let patterns = [
        "File::create(",
        "fs::write(",
        ".append(true)",
        ".truncate(true)",
        ".create(true)",
        ".write(true)",
        "create_new(true)",
    ];
    let mut bad = Vec::new();
    let mut seen_allowed = std::collections::BTreeSet::new();
    for (rel, lines) in src_code() {
        for (n, l) in &lines {
            if let Some(p) = patterns.iter().find(|p| l.contains(*p)) {
                if RAW_WRITERS_ALLOWED.iter().any(|a| a.0 == rel) {
                    seen_allowed.insert(rel.clone());
                } else {
                    bad.push(format!("src/{rel}:{n}: {p}"));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "files opened for writing outside yolo9::internals::outfile: {bad:#?}"
    );
    // The scan finds what it should: each allowed writer (but the launcher) is one.
    for (f, _) in RAW_WRITERS_ALLOWED {
        assert!(
            seen_allowed.contains(*f) || *f == "launcher.rs",
            "{f} is allowed but writes nothing: drop it from the list"
        );
    }
}

/// Files that read a file whole or open it themselves rather than through
/// `yolo9::internals::bounded::read_capped`/`open_regular`, and why.
const RAW_READERS_ALLOWED: &[(&str, &str)] = &[
    ("bounded.rs", "the one reader"),
    (
        "memory.rs",
        "the kernel's /proc/self/status and /proc/meminfo (small, not user files)",
    ),
    (
        "hub/cache.rs",
        "hashes a cached checkpoint in 1 MiB blocks (never held whole)",
    ),
    (
        "pt/checkpoint.rs",
        "a checkpoint zip read record by record, each record's declared size capped",
    ),
    (
        "convert/mod.rs",
        "opens the checkpoint for the zip reader (records capped by pt/checkpoint.rs)",
    ),
    ("launcher.rs", "reads nothing but its own program's path"),
    (
        "outfile.rs",
        "opens what it wrote, and the folder, to fsync them",
    ),
    ("hub/mod.rs", "opens the cache folder to fsync it"),
    (
        "model/weights.rs",
        "reads a weights file only after its header's sizes were checked against the file's \
         size (a regular file, opened by bounded::open_regular)",
    ),
];

/// Issue 51, "unbounded reads", for its whole kind: no code of `src/` outside the readers above
/// reads a file whole (`fs::read`, `read_to_string`) or opens one with `File::open`: every other
/// read goes through `bounded::read_capped` (regular files only, a cap per kind), so a link to
/// `/dev/zero`, a FIFO or a huge sparse file costs nothing.
#[test]
fn every_file_read_whole_goes_through_the_capped_reader() {
    let patterns = [
        "fs::read(",
        "fs::read_to_string(",
        "File::open(",
        "read_to_end(",
    ];
    let mut bad = Vec::new();
    for (rel, lines) in src_code() {
        if RAW_READERS_ALLOWED.iter().any(|a| a.0 == rel) {
            continue;
        }
        for (n, l) in &lines {
            if let Some(p) = patterns.iter().find(|p| l.contains(*p)) {
                // A reader bounded on the line itself (`.take(N)`) is fine.
                if !l.contains(".take(") {
                    bad.push(format!("src/{rel}:{n}: {p}"));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "files read outside yolo9::internals::bounded (use bounded::read_capped with a FileKind): {bad:#?}"
    );
}

/// Issue 51, "writers that follow links", end to end: with `--exist-ok`, a `predictions.jsonl`
/// in the reused run folder that is a symlink to the weights (or a hard link of them) is
/// replaced by the new file; the weights stay byte-identical (before: truncated to the JSON).
#[test]
fn detect_json_replaces_a_link_to_the_weights_and_keeps_them() {
    let d = tmpdir("detect-json-link");
    let w = weights_copy(&d);
    let before = std::fs::read(&w).unwrap();
    let src = common::shared_dir().join("datasets/bccd/images/test/BloodImage_00007.jpg");
    let img = d.join("in/BloodImage_00007.jpg");
    std::fs::create_dir_all(img.parent().unwrap()).unwrap();
    std::fs::copy(&src, &img).unwrap();
    let run = d.join("runs/exp");
    std::fs::create_dir_all(&run).unwrap();
    let jsonl = run.join("predictions.jsonl");
    std::os::unix::fs::symlink(&w, &jsonl).unwrap();
    let project = d.join("runs");
    let args = [
        "detect",
        "--weights",
        w.to_str().unwrap(),
        img.to_str().unwrap(),
        "--img",
        "320",
        "--device",
        "cpu",
        "--json",
        "--nosave",
        "--project",
        project.to_str().unwrap(),
        "--name",
        "exp",
        "--exist-ok",
    ];
    let (code, err, _) = yolo9_bounded(&args, Duration::from_secs(300));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read(&w).unwrap(),
        before,
        "the weights were written through the link"
    );
    let meta = std::fs::symlink_metadata(&jsonl).unwrap();
    assert!(
        meta.file_type().is_file(),
        "predictions.jsonl is a new regular file"
    );
    let text = std::fs::read_to_string(&jsonl).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(first.get("image").is_some(), "{first}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Issue 51, "a command line that scripts can trust": `yolo9 detect … | head -1` — a stdout
/// whose reader is gone ends the command quietly (no panic, no message; ended by SIGPIPE as
/// Unix tools are, or exit 0), where `println!` panicked with exit 101.
#[test]
fn a_closed_stdout_ends_detect_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let d = tmpdir("detect-epipe");
    let mut child = Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .args([
            "detect",
            "--weights",
            shipped_weights().to_str().unwrap(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/images"),
            "--img",
            "320",
            "--device",
            "cpu",
            "--nosave",
            "--project",
            d.join("runs").to_str().unwrap(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the first line is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        out.status.signal() == Some(13) || out.status.code() == Some(0),
        "{:?}: {err}",
        out.status
    );
    assert_ne!(out.status.code(), Some(101), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}
