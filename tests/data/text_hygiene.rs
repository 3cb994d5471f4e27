//! Terminal and log hygiene (issue 36, "hygiene"): file names, paths, class names and COCO
//! `file_name`s carrying control characters are printed escaped (`yolo9::internals::text`), and the
//! credentials of a stream URL never appear in a log line, an error or an output file.
use crate::common;

use common::{tmpdir, yolo9};
use std::path::Path;
use yolo9::detect::stream::StreamSource;
use yolo9::internals::text::{escape, message, redact};

const ESC: char = '\u{1b}';

fn weights() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("weights/yolov9-s-bccd.safetensors")
        .display()
        .to_string()
}

/// `out` + `err` of a successful run: none of the `raw` characters appears, each of `escaped`
/// does (the hostile text as `yolo9::internals::text` shows it).
fn assert_shown_escaped((code, out, err): (i32, String, String), raw: &[char], escaped: &[&str]) {
    let all = format!("{out}{err}");
    assert_eq!(code, 0, "{all}");
    assert!(!all.contains(raw), "{all:?}");
    for e in escaped {
        assert!(all.contains(e), "no {e:?} in {all}");
    }
}

#[test]
fn the_helpers_escape_and_redact() {
    assert_eq!(escape("x\u{1b}]0;pwned\u{7}"), "x\\u{1b}]0;pwned\\u{7}");
    assert_eq!(
        redact("rtsp://admin:hunter2@cam.local:554/h264"),
        "rtsp://admin:***@cam.local:554/h264"
    );
    let m = message("error: rtsp://admin:hunter2@cam/x: refused\n  caused by: a\u{1b}[2Jb");
    assert!(!m.contains("hunter2") && !m.contains(ESC), "{m}");
    assert!(m.contains('\n'), "lines kept: {m}");
    let s = StreamSource::parse("rtsp://admin:hunter2@127.0.0.1:9/live").unwrap();
    assert_eq!(s.name(), "rtsp://admin:***@127.0.0.1:9/live");
    assert!(!s.stem().contains("hunter2"), "{}", s.stem());
}

/// `detect` on image files whose names carry escape sequences (one decodable, one garbage):
/// every line of stdout and stderr shows them escaped, none raw.
#[test]
fn detect_prints_hostile_file_names_escaped() {
    let d = tmpdir("hostile-names");
    let src = common::shared_dir().join("datasets/bccd/images/test/BloodImage_00007.jpg");
    let good = d.join("a\u{1b}[31mred.jpg");
    std::fs::copy(&src, &good).unwrap();
    std::fs::write(d.join("b\u{1b}]0;pwned\u{7}.jpg"), b"not an image").unwrap();
    let run = yolo9(&[
        "detect",
        "--weights",
        &weights(),
        "--source",
        d.to_str().unwrap(),
        "--img",
        "320",
        "--device",
        "cpu",
        "--nosave",
    ]);
    assert_shown_escaped(
        run,
        &[ESC, '\u{7}'],
        &["a\\u{1b}[31mred.jpg", "b\\u{1b}]0;pwned\\u{7}.jpg"],
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `check` on a COCO JSON split whose `file_name`s carry escape sequences (not found, and
/// found): the issues and the report show them escaped.
#[test]
fn check_prints_hostile_coco_file_names_escaped() {
    let d = tmpdir("hostile-coco");
    let valid = d.join("valid");
    std::fs::create_dir_all(&valid).unwrap();
    let src = common::shared_dir().join("datasets/bccd/images/test/BloodImage_00007.jpg");
    let name = "ok\u{1b}[2J.jpg";
    std::fs::copy(&src, valid.join(name)).unwrap();
    let json = serde_json::json!({
        "images": [
            {"id": 1, "file_name": name, "width": 640, "height": 480},
            {"id": 2, "file_name": "gone\u{1b}]0;pwned\u{7}.jpg", "width": 640, "height": 480}
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 50, 50], "area": 2500, "iscrowd": 0}
        ],
        "categories": [{"id": 1, "name": "cell\u{1b}[5m"}]
    });
    std::fs::write(valid.join("_annotations.coco.json"), json.to_string()).unwrap();
    std::fs::write(
        d.join("data.yaml"),
        "train: valid/_annotations.coco.json\nval: valid/_annotations.coco.json\n",
    )
    .unwrap();
    let run = yolo9(&["check", "--data", d.join("data.yaml").to_str().unwrap()]);
    assert_shown_escaped(run, &[ESC, '\u{7}'], &["gone\\u{1b}]0;pwned\\u{7}.jpg"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// A stream URL with credentials that cannot be reached: the password appears nowhere in
/// stdout, stderr (log lines, ffmpeg's message, the error) or the run folder.
#[test]
fn stream_credentials_are_redacted_everywhere() {
    let d = tmpdir("stream-creds");
    let project = d.join("runs");
    let url = "rtsp://admin:hunter2@127.0.0.1:9/live";
    let (_code, out, err) = yolo9(&[
        "detect",
        "--weights",
        &weights(),
        "--source",
        url,
        "--img",
        "320",
        "--device",
        "cpu",
        "--stream-retries",
        "1",
        "--json",
        "--project",
        project.to_str().unwrap(),
    ]);
    let all = format!("{out}{err}");
    assert!(!all.contains("hunter2"), "{all}");
    assert!(all.contains("admin:***@127.0.0.1"), "{all}");
    fn scan(dir: &Path) {
        for e in std::fs::read_dir(dir).into_iter().flatten() {
            let p = e.unwrap().path();
            assert!(!p.to_string_lossy().contains("hunter2"), "{}", p.display());
            if p.is_dir() {
                scan(&p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                assert!(
                    !String::from_utf8_lossy(&bytes).contains("hunter2"),
                    "{}",
                    p.display()
                );
            }
        }
    }
    scan(&project);
    let _ = std::fs::remove_dir_all(&d);
}

/// Class names from a `data.yaml` that carry an escape sequence and a bidirectional override:
/// `val` prints its table, the label mapping and the summary with them escaped (through
/// `yolo9::internals::text`, as every line the commands print).
#[test]
fn val_prints_hostile_class_names_escaped() {
    let d = tmpdir("hostile-classes");
    common::tiny_dataset(&d, 1);
    std::fs::write(
        d.join("data.yaml"),
        "path: .\ntrain: images/train\nval: images/val\n\
         names: [\"RBC\\e[8m\", \"W\\u202eCBW\", Platelets]\n",
    )
    .unwrap();
    let run = yolo9(&[
        "val",
        "--data",
        d.join("data.yaml").to_str().unwrap(),
        "--weights",
        &weights(),
        "--img",
        "320",
        "--device",
        "cpu",
        "--project",
        d.join("runs").to_str().unwrap(),
    ]);
    assert_shown_escaped(run, &[ESC, '\u{202e}'], &["RBC\\u{1b}[8m", "W\\u{202e}CBW"]);
    let _ = std::fs::remove_dir_all(&d);
}
