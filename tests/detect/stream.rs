//! Webcams and network streams in `yolo9 detect` (`yolo9::detect::stream`), on loopback: the
//! `ffmpeg` program itself serves a short MPEG-TS stream over HTTP (`-re`: at its real frame
//! rate; `-listen 1`: one client), which `.ci/run` installs.
//!
//! - a stream is detected frame by frame and each detected frame's detections equal those of the
//!   same decoded frame as an image; every frame read is counted as detected or dropped;
//! - a slow reader gets the newest frame and the frames it missed are dropped (no backlog);
//! - a stream that stops is reopened when it comes back, and Ctrl-C ends the run cleanly with a
//!   finished annotated video;
//! - a URL that refuses is retried `--stream-retries` times, then named with ffmpeg's reason;
//!   a missing webcam is named.
use crate::common;

use std::io::BufRead;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use yolo9::cancel::Cancel;
use yolo9::detect::stream::{LiveReader, StreamOptions, StreamSource};

/// `seconds` of one example image at 320x240, 10 fps, H.264 lossless (every decoded frame is
/// the same picture), keyframe every second, as MPEG-TS.
pub(crate) fn make_stream(dir: &Path, seconds: u32) -> PathBuf {
    let img = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/images/BloodImage_00007.jpg"
    );
    let ts = dir.join(format!("cells{seconds}.ts"));
    common::ffmpeg(
        &[
            "-loop",
            "1",
            "-i",
            img,
            "-t",
            &seconds.to_string(),
            "-r",
            "10",
            "-vf",
            "scale=320:240",
        ]
        .iter()
        .chain(LOSSLESS_TS_10FPS)
        .copied()
        .chain([ts.to_str().unwrap()])
        .collect::<Vec<_>>(),
    );
    ts
}

/// ffmpeg output options of the test streams: H.264 lossless (`-qp 0`), yuv420p, a keyframe
/// every 10 frames (a second at 10 fps), MPEG-TS; the output file follows.
pub(crate) const LOSSLESS_TS_10FPS: &[&str] = &[
    "-c:v", "libx264", "-qp", "0", "-pix_fmt", "yuv420p", "-g", "10", "-f", "mpegts",
];

/// A child process killed when dropped (a failing test leaves no server or detector behind).
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// ffmpeg serving `ts` at its frame rate to one client on `http://127.0.0.1:port` (`looped`:
/// over and over).
pub(crate) fn serve(ts: &Path, port: u16, looped: bool) -> Killed {
    let mut c = Command::new("ffmpeg");
    c.args(["-nostdin", "-v", "error", "-re"]);
    if looped {
        c.args(["-stream_loop", "-1"]);
    }
    c.arg("-i")
        .arg(ts)
        .args(["-c", "copy", "-f", "mpegts", "-listen", "1"])
        .arg(format!("http://127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Killed)
        .unwrap()
}

fn yolo9(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_yolo9"));
    c.arg("detect")
        .args(args)
        .args(["--device", "cpu"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

/// `(detected, read, dropped, reopenings)` from the summary line of a stream.
fn summary(out: &str) -> (u64, u64, u64, u64) {
    let line = out
        .lines()
        .find(|l| l.contains(" frames detected, "))
        .unwrap_or_else(|| panic!("no summary line in {out}"));
    // "<url with its port>: D of N frames detected, X dropped (...), S skipped ..., C damaged,
    // R reopenings"
    let at = line.find(": ").unwrap();
    let nums_after: Vec<u64> = line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|t| t.parse().ok())
        .collect();
    assert!(nums_after.len() >= 6, "{line}");
    (nums_after[0], nums_after[1], nums_after[2], nums_after[5])
}

#[test]
fn a_stream_is_detected_frame_by_frame_like_images() {
    let dir = common::tmpdir("detect_stream");
    let ts = make_stream(&dir, 4);
    let port = free_port();
    let server = serve(&ts, port, false);
    let url = format!("http://127.0.0.1:{port}");
    let runs = dir.join("runs");
    // The first connection may come before the server listens: the retries cover it.
    let out = yolo9(&[
        &url,
        "--img",
        "320",
        "--json",
        "--save-txt",
        "--stream-retries",
        "2",
        "--project",
        runs.to_str().unwrap(),
        "--name",
        "s",
    ])
    .output()
    .unwrap();
    drop(server);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let (detected, read, dropped, _) = summary(&text);
    assert_eq!(read, 40, "every frame of the 4 s stream is read: {text}");
    assert_eq!(detected + dropped, read, "{text}");
    assert!(detected >= 2, "{text}");
    // Detection on this CPU is slower than the 10 fps stream: frames are dropped, not queued.
    let ms: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("stream 1/1 (frame "))
        .filter_map(|l| l.rsplit(", ").next()?.strip_suffix("ms")?.parse().ok())
        .collect();
    assert_eq!(ms.len() as u64, detected, "{text}");
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    if mean > 150.0 {
        assert!(dropped > 0, "detection takes {mean:.0} ms a frame: {text}");
    }
    // Every detected frame equals the same decoded frame detected as an image.
    let png = dir.join("frame.png");
    common::ffmpeg(&[
        "-i",
        ts.to_str().unwrap(),
        "-frames:v",
        "1",
        png.to_str().unwrap(),
    ]);
    let det = yolo9::Detector::new(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/weights/yolov9-s-bccd.safetensors"
        ),
        candle_core::Device::Cpu,
        yolo9::DetectorConfig {
            img_size: 320,
            ..Default::default()
        },
    )
    .unwrap();
    let want = det
        .detect_rgb(&yolo9::data::image::load_rgb8(&png).unwrap())
        .unwrap();
    assert!(!want.is_empty());
    let run = runs.join("s");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(run.join("predictions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut frames: Vec<u64> = lines.iter().map(|l| l["frame"].as_u64().unwrap()).collect();
    frames.dedup();
    assert_eq!(frames.len() as u64, detected, "{text}");
    for f in &frames {
        let got: Vec<_> = lines.iter().filter(|l| l["frame"] == *f).collect();
        assert_eq!(got.len(), want.len(), "frame {f}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g["image"], url.as_str());
            assert_eq!(g["class_id"], w.class_id, "frame {f}");
            assert_eq!(g["confidence"].as_f64().unwrap() as f32, w.confidence);
            for k in 0..4 {
                assert_eq!(
                    g["xyxy"][k].as_f64().unwrap() as f32,
                    w.bbox[k],
                    "frame {f}"
                );
            }
        }
        let stem = format!("127.0.0.1_{port}");
        assert!(
            run.join(format!("labels/{stem}_{f}.txt")).is_file(),
            "frame {f}"
        );
    }
    // The annotated video holds the detected frames.
    let v = yolo9::detect::video::probe(&run.join(format!("127.0.0.1_{port}.mp4"))).unwrap();
    assert_eq!((v.width, v.height, v.frames), (320, 240, Some(detected)));
}

/// A reader slower than the stream (400 ms a frame, the stream 10 fps) gets the newest frame
/// each time: frame numbers jump, the missed frames are counted as dropped, and reading ends
/// with the stream instead of working through a backlog (40 frames x 400 ms = 16 s).
#[test]
fn a_slow_reader_gets_the_newest_frame_and_drops_the_rest() {
    let dir = common::tmpdir("detect_stream_slow");
    let ts = make_stream(&dir, 4);
    let port = free_port();
    let mut server = serve(&ts, port, false);
    let src = StreamSource::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let opts = StreamOptions {
        retries: 3,
        backoff: Duration::from_millis(200),
        ..StreamOptions::default()
    };
    let mut r = LiveReader::open(src, opts).unwrap();
    let mut got = Vec::new();
    let mut t_first = None;
    while let Some(f) = r.next(&Cancel::never()).unwrap() {
        t_first.get_or_insert_with(Instant::now);
        got.push(f.frame);
        assert_eq!(f.image.dimensions(), (320, 240));
        std::thread::sleep(Duration::from_millis(400));
        // After the stream ended the reopening attempts are refused; stop waiting for them.
        if server.0.try_wait().unwrap().is_some() && r.stats().read == 40 {
            break;
        }
    }
    let took = t_first.unwrap().elapsed();
    r.stop();
    drop(server);
    let s = r.stats();
    assert_eq!(s.read, 40, "{s:?}");
    assert_eq!(s.delivered, got.len() as u64);
    assert_eq!(s.delivered + s.dropped + s.strided, s.read, "{s:?}");
    assert!(s.dropped >= 20, "{s:?} {got:?}");
    assert!(got.windows(2).all(|w| w[1] > w[0]), "{got:?}");
    // Paced by the stream: once frames flow, each take skips the ~4 frames that came meanwhile.
    let jumps = got.windows(2).filter(|w| w[1] - w[0] >= 3).count();
    assert!(jumps * 2 >= got.len().saturating_sub(2), "{got:?}");
    assert!(took < Duration::from_secs(9), "{took:?} {got:?}");
}

/// A stream that stops and comes back is reopened (frame numbers go on), and Ctrl-C (SIGINT)
/// ends the run: exit 0, the annotated video finished and holding every detected frame.
#[test]
fn a_stream_that_comes_back_is_reopened_and_ctrl_c_finishes_the_video() {
    let dir = common::tmpdir("detect_stream_resume");
    let short = make_stream(&dir, 2);
    let port = free_port();
    let mut first = serve(&short, port, false);
    let url = format!("http://127.0.0.1:{port}");
    let runs = dir.join("runs");
    let mut child = yolo9(&[
        &url,
        "--img",
        "320",
        "--stream-retries",
        "4",
        "--project",
        runs.to_str().unwrap(),
        "--name",
        "r",
    ])
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
    // When the first server has sent its 20 frames and quit, a second one serves on the
    // same port, over and over.
    let deadline = Instant::now() + Duration::from_secs(25);
    while first.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the first stream did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = serve(&short, port, true);
    let mut lines = Vec::new();
    // Wait for a detected frame of the second connection (numbers above 20), then Ctrl-C.
    loop {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("no frame after the stream came back: {lines:?}"));
        let frame: Option<u64> = l
            .strip_prefix("stream 1/1 (frame ")
            .and_then(|r| r.split(',').next()?.parse().ok());
        lines.push(l);
        if frame.is_some_and(|f| f > 20) {
            break;
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
    assert!(text.contains("stopped on request"), "{text}");
    assert!(text.contains("reopening in"), "{text}");
    let (detected, read, dropped, reopened) = summary(&text);
    assert!(reopened >= 1 && read > 20, "{text}");
    assert_eq!(detected + dropped, read, "{text}");
    let v = yolo9::detect::video::probe(&runs.join(format!("r/127.0.0.1_{port}.mp4"))).unwrap();
    assert_eq!(
        (v.width, v.height, v.frames),
        (320, 240, Some(detected)),
        "{text}"
    );
}

#[test]
fn a_refused_url_is_retried_then_named_and_a_missing_webcam_too() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/live");
    let t = Instant::now();
    let out = yolo9(&[&url, "--stream-retries", "2", "--nosave"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("reopening in 0.5 s (attempt 1/2)")
            && text.contains("reopening in 1.0 s (attempt 2/2)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("skipped {url}: {url}: Connection refused"))
            && text.contains("--stream-retries"),
        "{text}"
    );
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    #[cfg(target_os = "linux")]
    {
        let out = yolo9(&["97"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("webcam 97: /dev/video97 does not exist"),
            "{err}"
        );
    }
}

/// A loopback HTTP server answering every request with `body` as `image/jpeg` (as a camera's
/// snapshot URL or an image host does); counts the requests.
fn serve_picture(body: Vec<u8>) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { continue };
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut req = [0u8; 4096];
            let _ = s.read(&mut req);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(head.as_bytes());
            let _ = s.write_all(&body);
        }
    });
    (port, hits)
}

/// Issue 51: `yolo9 detect http://host/img.jpg` (and a snapshot URL without an extension) is
/// one image, detected once, where it used to be reopened as a live stream until interrupted
/// (132 detections of the same picture in 120 s).
#[test]
fn an_url_whose_content_is_a_picture_is_one_image() {
    let jpg =
        std::fs::read(common::shared_dir().join("datasets/bccd/images/test/BloodImage_00007.jpg"))
            .unwrap();
    let (port, hits) = serve_picture(jpg);
    let dir = common::tmpdir("detect_url_picture");
    for path in ["cells.jpg", "snapshot"] {
        let url = format!("http://127.0.0.1:{port}/{path}");
        let t0 = std::time::Instant::now();
        let out = yolo9(&[
            &url,
            "--img",
            "320",
            "--nosave",
            "--project",
            dir.to_str().unwrap(),
            "--stream-retries",
            "3",
        ])
        .output()
        .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{path}: {stdout}{stderr}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(60), "{path}");
        let (detected, read, _, reopened) = summary(&format!("{stdout}{stderr}"));
        assert_eq!(
            (detected, read, reopened),
            (1, 1, 0),
            "{path}: {stdout}{stderr}"
        );
        assert!(!stderr.contains("reopening"), "{path}: {stderr}");
    }
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 2);
    let _ = std::fs::remove_dir_all(&dir);
}
