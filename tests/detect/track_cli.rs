//! `yolo9 track` end to end on an image sequence (a folder's images in name order are the
//! frames), with the built-in weights on the CPU: the MOTChallenge file, `predictions.jsonl`
//! rows with `track_id`, annotated frames, the per-class counts, `--vid-stride`, the tracker
//! flags' defaults and refusals.
use crate::common;

use clap::Parser;
use yolo9::internals::cli::{Cli, Command as Sub};

fn parse(args: &[&str]) -> Result<yolo9::internals::cli::track::TrackArgs, String> {
    let mut v = vec!["yolo9", "track", "x.mp4"];
    v.extend_from_slice(args);
    match Cli::try_parse_from(v) {
        Ok(c) => match c.command {
            Sub::Track(a) => Ok(*a),
            _ => Err("not track".into()),
        },
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn tracker_flags_have_the_bytetrack_defaults() {
    let a = parse(&[]).unwrap();
    let c = a.tracker.config(30.0).unwrap();
    assert_eq!(c, yolo9::track::byte::TrackerConfig::default());
    assert_eq!(
        (c.track_high_thresh, c.track_low_thresh, c.new_track_thresh),
        (0.5, 0.1, 0.6)
    );
    assert_eq!((c.track_buffer, c.match_thresh), (30, 0.8));
    assert_eq!(a.detect.job.project, std::path::PathBuf::from("runs/track"));
    // The detector keeps the low-score detections ByteTrack's second association needs.
    assert_eq!(
        a.detect.config,
        yolo9::DetectorConfig {
            conf: 0.1,
            ..yolo9::DetectorConfig::default()
        }
    );
    assert_eq!(a.detect.config.conf, c.track_low_thresh);
    let a = parse(&[
        "--fuse-score",
        "false",
        "--track-buffer",
        "60",
        "--vid-stride",
        "2",
    ])
    .unwrap();
    assert_eq!(a.tracker.fuse_score, Some(false));
    assert!(!a.tracker.config(60.0).unwrap().fuse_score);
    assert_eq!(a.tracker.config(60.0).unwrap().max_time_lost(), 120);
    assert_eq!(a.detect.job.vid_stride, 2);
    for bad in [
        &["--track-high-thresh", "1.5"][..],
        &["--match-thresh", "1.1"],
        &["--fps", "0"],
        &["--track-buffer", "x"],
    ] {
        let e = parse(bad).unwrap_err();
        assert!(e.contains(bad[0]), "{bad:?}: {e}");
    }
    // A low threshold above the high one is refused before any model loads.
    let a = parse(&["--track-low-thresh", "0.7"]).unwrap();
    let e = a.tracker.config(30.0).unwrap_err().to_string();
    assert!(e.contains("--track-low-thresh 0.7"), "{e}");
    // --conf given explicitly wins.
    assert_eq!(parse(&["--conf", "0.3"]).unwrap().detect.config.conf, 0.3);
}

/// `--tracker FILE` (Ultralytics' bytetrack.yaml keys): its values over the defaults, the flags
/// given over the file; a botsort file, an unknown key and a missing file are refused naming
/// the file.
#[test]
fn tracker_file_then_flags() {
    let dir = common::tmpdir("trackerfile");
    let f = dir.join("bytetrack.yaml");
    std::fs::write(
        &f,
        "tracker_type: bytetrack\ntrack_high_thresh: 0.25\ntrack_low_thresh: 0.1\n\
         new_track_thresh: 0.25\ntrack_buffer: 30\nmatch_thresh: 0.8\nfuse_score: True\n",
    )
    .unwrap();
    let fs = f.to_str().unwrap();
    let config = |args: &[&str]| parse(args).unwrap().tracker.config(30.0);
    let c = config(&["--tracker", fs]).unwrap();
    assert_eq!(
        (c.track_high_thresh, c.new_track_thresh, c.track_buffer),
        (0.25, 0.25, 30)
    );
    let c = config(&[
        "--tracker",
        fs,
        "--track-buffer",
        "90",
        "--new-track-thresh",
        "0.4",
    ])
    .unwrap();
    assert_eq!(
        (c.track_high_thresh, c.new_track_thresh, c.track_buffer),
        (0.25, 0.4, 90)
    );
    let bot = dir.join("botsort.yaml");
    std::fs::write(&bot, "tracker_type: botsort\ngmc_method: sparseOptFlow\n").unwrap();
    let typo = dir.join("typo.yaml");
    std::fs::write(&typo, "track_bufer: 30\n").unwrap();
    for (p, want) in [
        (bot, "tracker_type botsort: only bytetrack"),
        (typo, "unknown key track_bufer"),
        (dir.join("missing.yaml"), "cannot read"),
    ] {
        let e = config(&["--tracker", p.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(p.file_name().unwrap().to_str().unwrap()) && e.contains(want),
            "{e}"
        );
    }
}

#[test]
fn image_sequence_end_to_end() {
    let dir = common::tmpdir("seq");
    let seq = dir.join("cells");
    std::fs::create_dir_all(&seq).unwrap();
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/images/BloodImage_00007.jpg"
    );
    // Three frames: the same picture, the last shifted 4 px right (the cells move a little).
    let img = image::open(src).unwrap().to_rgb8();
    let (w, h) = img.dimensions();
    let small = image::imageops::resize(&img, w / 2, h / 2, image::imageops::FilterType::Triangle);
    let mut shifted = image::RgbImage::from_pixel(w / 2, h / 2, image::Rgb([200, 180, 190]));
    image::imageops::overlay(&mut shifted, &small, 4, 0);
    small.save(seq.join("f1.png")).unwrap();
    small.save(seq.join("f2.png")).unwrap();
    shifted.save(seq.join("f3.png")).unwrap();
    let project = dir.join("runs");
    let (code, out, err) = common::yolo9(&[
        "track",
        seq.to_str().unwrap(),
        "--img",
        "320",
        "--json",
        "--project",
        project.to_str().unwrap(),
        "--name",
        "t",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let run = project.join("t");
    let mot = std::fs::read_to_string(run.join("mot/cells.txt")).unwrap();
    let rows: Vec<Vec<String>> = mot
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    assert!(!rows.is_empty(), "{out}");
    let ids_on = |f: &str| -> std::collections::BTreeSet<u64> {
        rows.iter()
            .filter(|r| r[0] == f)
            .map(|r| r[1].parse().unwrap())
            .collect()
    };
    // Confirmed on the first frame; the same IDs on the identical second frame, and no new
    // confirmed ID on the shifted third (a cell cut by the edge may be lost).
    let first = ids_on("1");
    assert!(first.len() >= 5, "{mot}");
    assert_eq!(ids_on("2"), first, "{mot}");
    let third = ids_on("3");
    assert!(
        third.is_subset(&first) && third.len() + 2 >= first.len(),
        "{mot}"
    );
    for r in &rows {
        assert_eq!(r.len(), 10, "{r:?}");
        assert_eq!(&r[7..], ["-1", "-1", "-1"]);
        let (bw, bh): (f32, f32) = (r[4].parse().unwrap(), r[5].parse().unwrap());
        assert!(bw > 0.0 && bh > 0.0, "{r:?}");
    }
    // The moved frame's boxes moved right (the filter follows the detections).
    let x_of = |f: &str, id: u64| -> f32 {
        rows.iter()
            .find(|r| r[0] == f && r[1] == id.to_string())
            .map(|r| r[2].parse().unwrap())
            .unwrap()
    };
    let id = *third.iter().next().unwrap();
    let dx = x_of("3", id) - x_of("2", id);
    assert!(dx > 1.0 && dx < 6.0, "dx {dx}\n{mot}");
    let jsonl = std::fs::read_to_string(run.join("predictions.jsonl")).unwrap();
    assert_eq!(jsonl.lines().count(), rows.len());
    let j: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert_eq!(j["frame"], 1);
    assert!(first.contains(&j["track_id"].as_u64().unwrap()), "{j}");
    assert!(j["class_name"].is_string() && j["xyxy"].is_array(), "{j}");
    for f in ["f1.png", "f2.png", "f3.png"] {
        assert!(run.join("cells").join(f).is_file(), "{f}");
    }
    // The per-class counts at the end.
    let line = out.lines().find(|l| l.contains("mot/cells.txt")).unwrap();
    assert!(
        line.contains(&format!("{} tracks: ", first.len())),
        "{line}"
    );
    assert!(line.contains("RBC"), "{line}");

    // --vid-stride 2: frames 1 and 3 only, numbered as the source's, the same IDs.
    let (code, out, err) = common::yolo9(&[
        "track",
        seq.to_str().unwrap(),
        "--img",
        "320",
        "--vid-stride",
        "2",
        "--nosave",
        "--project",
        project.to_str().unwrap(),
        "--name",
        "s",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let mot2 = std::fs::read_to_string(project.join("s/mot/cells.txt")).unwrap();
    let frames: std::collections::BTreeSet<&str> =
        mot2.lines().map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(frames.into_iter().collect::<Vec<_>>(), ["1", "3"], "{mot2}");
    assert!(!project.join("s/cells").exists());
}

/// `yolo9 track` on a loopback stream that stops after 20 frames and comes back (the stream
/// test's server): the stream is reopened and the tracker goes on over the gap, so the cells
/// (one still picture) keep the IDs they had before; Ctrl-C finishes the run.
#[test]
fn ids_survive_a_stream_reconnect() {
    use super::stream::{free_port, make_stream, serve, Killed};
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let dir = common::tmpdir("track_stream");
    let short = make_stream(&dir, 2);
    let port = free_port();
    let mut first = serve(&short, port, false);
    let url = format!("http://127.0.0.1:{port}");
    let runs = dir.join("runs");
    let mut child = Command::new(env!("CARGO_BIN_EXE_yolo9"))
        .args(["track", &url, "--img", "320", "--stream-retries", "4"])
        .args([
            "--fps",
            "10",
            "--track-buffer",
            "300",
            "--nosave",
            "--device",
            "cpu",
        ])
        .arg("--project")
        .arg(&runs)
        .args(["--name", "r"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Killed)
        .unwrap();
    let err = child.0.stderr.take().unwrap();
    let err = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let out = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while first.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the first stream did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = serve(&short, port, true);
    let mut lines = Vec::new();
    // Two tracked frames of the second connection (numbers above 20), then Ctrl-C.
    let mut after = 0;
    while after < 2 {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no frame after the stream came back: {lines:?}"));
        let frame: Option<u64> = l
            .strip_prefix("stream 1/1 (frame ")
            .and_then(|r| r.split([',', ')']).next()?.parse().ok());
        lines.push(l);
        if frame.is_some_and(|f| f > 20) {
            after += 1;
        }
    }
    unsafe {
        libc::kill(child.0.id() as i32, libc::SIGINT);
    }
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no exit after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(second);
    lines.extend(rx.try_iter());
    let text = lines.join("\n") + "\n" + &err.join().unwrap();
    assert!(status.success(), "{status:?}: {text}");
    assert!(text.contains("reopening in"), "{text}");
    let mot = std::fs::read_to_string(runs.join(format!("r/mot/127.0.0.1_{port}.txt"))).unwrap();
    let ids_on = |f: &str| -> std::collections::BTreeSet<u64> {
        mot.lines()
            .filter(|l| l.split(',').next() == Some(f))
            .map(|l| l.split(',').nth(1).unwrap().parse().unwrap())
            .collect()
    };
    let frames: Vec<&str> = mot.lines().map(|l| l.split(',').next().unwrap()).collect();
    let (first_f, last_f) = (frames[0], frames[frames.len() - 1]);
    let (before, after) = (ids_on(first_f), ids_on(last_f));
    assert!(before.len() >= 5, "{mot}");
    // After the reconnection: only IDs of the first frame (a new sequence would number anew).
    assert!(
        after.is_subset(&before) && after.len() + 2 >= before.len(),
        "{before:?} {after:?}\n{text}"
    );
}

#[test]
fn tracks_of_a_segmentation_model_carry_their_masks() {
    // tiny-seg (tests/model/seg.rs), converted from its official checkpoint.
    let dir = common::tmpdir("seg-track");
    let (w, _) = common::tiny_seg_converted();
    let weights = dir.join("tiny-seg.safetensors");
    w.save(&weights, false).unwrap();
    let seq = dir.join("frames");
    std::fs::create_dir_all(&seq).unwrap();
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/images/BloodImage_00007.jpg"
    );
    let img = image::open(src).unwrap().to_rgb8();
    img.save(seq.join("f1.png")).unwrap();
    img.save(seq.join("f2.png")).unwrap();
    let project = dir.join("runs");
    let (code, out, err) = common::yolo9(&[
        "track",
        seq.to_str().unwrap(),
        "--weights",
        weights.to_str().unwrap(),
        "--img",
        "320",
        // The untrained model's scores stay below the default thresholds.
        "--track-high-thresh",
        "0.3",
        "--new-track-thresh",
        "0.3",
        "--json",
        "--project",
        project.to_str().unwrap(),
        "--name",
        "t",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let lines = std::fs::read_to_string(project.join("t/predictions.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!rows.is_empty(), "{out}");
    assert!(
        rows.iter()
            .all(|r| r["track_id"].is_u64() && r["polygon"].is_array()),
        "{lines}"
    );
}
