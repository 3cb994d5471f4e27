//! `yolo9 detect VIDEO` (`yolo9::detect::video`, through the `ffmpeg`/`ffprobe` programs, which
//! `.ci/run` installs): a short video made of the shipped example images is detected frame by
//! frame; the annotated video keeps the frame count and rate, and every frame's detections
//! (`predictions.jsonl`, `frame` field) equal the detections of the same decoded frame as an
//! image; `--vid-stride 2` detects frames 1, 3, 5; a file that is not a video is skipped with
//! ffprobe's reason.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A 6-frame, 5 fps H.264 video of the three example images, each shown twice.
fn make_video(dir: &Path) -> PathBuf {
    let mut ex: Vec<PathBuf> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/images"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
            .collect();
    ex.sort();
    for (i, p) in ex.iter().flat_map(|p| [p, p]).enumerate() {
        std::fs::copy(p, dir.join(format!("src{}.jpg", i + 1))).unwrap();
    }
    let v = dir.join("cells.mp4");
    let pattern = dir.join("src%d.jpg");
    common::ffmpeg(&[
        "-framerate",
        "5",
        "-i",
        pattern.to_str().unwrap(),
        "-c:v",
        "libx264",
        "-pix_fmt",
        "yuv420p",
        "-crf",
        "12",
        v.to_str().unwrap(),
    ]);
    v
}

fn detect(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .arg("detect")
        .args(args)
        .args(["--device", "cpu"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn jsonl(p: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn video_frames_are_detected_like_images() {
    let dir = common::tmpdir("detect_video");
    let video = make_video(&dir);
    let runs = dir.join("runs");
    let (ok, out) = detect(&[
        video.to_str().unwrap(),
        "--json",
        "--save-txt",
        "--project",
        runs.to_str().unwrap(),
        "--name",
        "v",
        "--img",
        "320",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("(frame 6/6)"), "{out}");
    // A video is a source, not an image.
    assert!(out.contains("1 source processed, 0 skipped"), "{out}");
    let run = runs.join("v");
    // The annotated video: 6 frames at 5 fps, 640x480.
    let info = yolo9::detect::video::probe(&run.join("cells.mp4")).unwrap();
    assert_eq!(
        (info.width, info.height, info.fps, info.frames),
        (640, 480, (5, 1), Some(6)),
        "{info:?}"
    );
    for f in 1..=6 {
        assert!(
            run.join(format!("labels/cells_{f}.txt")).is_file(),
            "label file of frame {f}"
        );
    }
    // The same decoded frames as images (ffmpeg's RGB24 conversion, saved losslessly).
    let frames = dir.join("frames");
    std::fs::create_dir_all(&frames).unwrap();
    let pat = frames.join("f%d.png");
    common::ffmpeg(&["-i", video.to_str().unwrap(), pat.to_str().unwrap()]);
    // At 320 px, as the command above (a quarter of the default's work in the test profile).
    let det = yolo9::Detector::new(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/weights/yolov9-s-bccd.safetensors"
        )),
        candle_core::Device::Cpu,
        yolo9::DetectorConfig {
            img_size: 320,
            ..Default::default()
        },
    )
    .unwrap();
    let lines = jsonl(&run.join("predictions.jsonl"));
    for f in 1..=6u64 {
        let img = yolo9::data::image::load_rgb8(&frames.join(format!("f{f}.png"))).unwrap();
        let want = det.detect_rgb(&img).unwrap();
        let got: Vec<&serde_json::Value> = lines.iter().filter(|l| l["frame"] == f).collect();
        assert!(!want.is_empty());
        assert_eq!(got.len(), want.len(), "frame {f}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g["class_id"], w.class_id, "frame {f}");
            assert_eq!(
                g["confidence"].as_f64().unwrap() as f32,
                w.confidence,
                "frame {f}"
            );
            for k in 0..4 {
                assert_eq!(
                    g["xyxy"][k].as_f64().unwrap() as f32,
                    w.bbox[k],
                    "frame {f}"
                );
            }
        }
    }

    // Every second frame.
    let (ok, out) = detect(&[
        video.to_str().unwrap(),
        "--json",
        "--nosave",
        "--vid-stride",
        "2",
        "--project",
        runs.to_str().unwrap(),
        "--name",
        "s",
    ]);
    assert!(ok, "{out}");
    let mut seen: Vec<u64> = jsonl(&runs.join("s/predictions.jsonl"))
        .iter()
        .map(|l| l["frame"].as_u64().unwrap())
        .collect();
    seen.dedup();
    assert_eq!(seen, [1, 3, 5]);

    // A phone-style video with a quarter-turn rotation: frames come upright (480 x 640), and so
    // does the annotated video.
    let rot = dir.join("rotated.mp4");
    common::ffmpeg(&[
        "-i",
        video.to_str().unwrap(),
        "-c",
        "copy",
        "-metadata:s:v:0",
        "rotate=90",
        rot.to_str().unwrap(),
    ]);
    let info = yolo9::detect::video::probe(&rot).unwrap();
    assert_eq!((info.width, info.height), (480, 640), "{info:?}");
    let (ok, out) = detect(&[
        rot.to_str().unwrap(),
        "--project",
        runs.to_str().unwrap(),
        "--name",
        "r",
    ]);
    assert!(ok && out.contains("(frame 6/6)"), "{out}");
    let info = yolo9::detect::video::probe(&runs.join("r/rotated.mp4")).unwrap();
    assert_eq!(
        (info.width, info.height, info.frames),
        (480, 640, Some(6)),
        "{info:?}"
    );

    // A file named like a video that is not one: skipped with ffprobe's reason, no panic.
    let fake = dir.join("fake.mp4");
    std::fs::write(&fake, b"not a video at all").unwrap();
    let (ok, out) = detect(&[fake.to_str().unwrap(), "--nosave"]);
    assert!(!ok, "nothing could be processed: {out}");
    assert!(
        out.contains("skipped") && out.contains("ffprobe cannot read it"),
        "{out}"
    );
}
