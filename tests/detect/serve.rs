//! `yolo9::serve` (the `yolo9 serve` service) on loopback, in-process: the detections of the
//! shipped images equal `Detector::detect`'s, bad requests get a 4xx with a message, a burst
//! larger than the queue gets 503s and every request an answer, and shutdown answers what was
//! queued; the page of `GET /` draws the boxes in a real headless Chromium (driven through
//! chromedriver). Requests are plain HTTP/1.1 over a `TcpStream` (no client library).

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use candle_core::{Device, Tensor};
use yolo9::detect::detector::InferenceModel;
use yolo9::serve::{serve, ServeConfig, ServeSummary};
use yolo9::{Detector, ModelMeta};

/// A status code and the body of one request.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    ctype: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the service");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(c) = ctype {
        head.push_str(&format!("Content-Type: {c}\r\n"));
    }
    head.push_str("\r\n");
    // The service may answer (413) before reading the whole body; the answer still comes back.
    let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body));
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (h, b) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = h
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    (code, b.to_string())
}

/// A running service: its address, the trigger of its shutdown and its result.
struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: std::thread::JoinHandle<Result<ServeSummary>>,
}

impl Running {
    fn start(det: Detector, cfg: ServeConfig) -> Running {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                addr_tx.send(l.local_addr()?).unwrap();
                serve(l, det, cfg, async {
                    let _ = stopped.await;
                })
                .await
            })
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        // Ready once the warm-up forward has run.
        for _ in 0..600 {
            if http(addr, "GET", "/readyz", None, b"").0 == 200 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Running {
            addr,
            stop: Some(stop),
            done,
        }
    }

    fn stop(mut self) -> ServeSummary {
        let _ = self.stop.take().unwrap().send(());
        self.done.join().unwrap().unwrap()
    }
}

fn shipped() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors")
}

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/images"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "jpg"))
            .collect();
    v.sort();
    v
}

/// A model that sleeps `delay` per forward and detects nothing (for queueing tests).
struct Slow {
    meta: ModelMeta,
    delay: Duration,
}

impl InferenceModel for Slow {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        std::thread::sleep(self.delay);
        let (b, _, h, w) = x.dims4()?;
        let a: usize = [8, 16, 32].iter().map(|s| (h / s) * (w / s)).sum();
        Ok(Tensor::zeros(
            (b, 4 + self.meta.nc, a),
            candle_core::DType::F32,
            &Device::Cpu,
        )?)
    }
    fn meta(&self) -> &ModelMeta {
        &self.meta
    }
}

fn slow(ms: u64) -> Detector {
    let meta = Detector::load(shipped(), Device::Cpu)
        .unwrap()
        .meta()
        .clone();
    Detector::from_model(
        Slow {
            meta,
            delay: Duration::from_millis(ms),
        },
        Device::Cpu,
    )
    .with_config(yolo9::DetectorConfig {
        img_size: 64,
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn detections_equal_detect_and_the_info_endpoints_answer() {
    let det = Detector::load(shipped(), Device::Cpu).unwrap();
    let want: Vec<_> = examples()
        .iter()
        .map(|p| {
            det.detect_rgb(&yolo9::data::image::load_rgb8(p).unwrap())
                .unwrap()
        })
        .collect();
    let svc = Running::start(
        Detector::load(shipped(), Device::Cpu).unwrap(),
        ServeConfig::default(),
    );
    assert_eq!(http(svc.addr, "GET", "/healthz", None, b"").0, 200);
    let (code, body) = http(svc.addr, "GET", "/v1/model", None, b"");
    assert_eq!(code, 200);
    let m: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(m["names"], serde_json::json!(["RBC", "WBC", "Platelets"]));
    assert_eq!(m["img"], 640);
    for (p, want) in examples().iter().zip(&want) {
        let bytes = std::fs::read(p).unwrap();
        let (code, body) = http(svc.addr, "POST", "/v1/detect", Some("image/jpeg"), &bytes);
        assert_eq!(code, 200, "{}: {body}", p.display());
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let got = v["detections"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{}", p.display());
        assert!(!want.is_empty());
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g["class_id"], w.class_id);
            assert_eq!(g["class_name"], w.class_name.as_str());
            assert_eq!(g["confidence"].as_f64().unwrap() as f32, w.confidence);
            for k in 0..4 {
                assert_eq!(g["xyxy"][k].as_f64().unwrap() as f32, w.bbox[k]);
            }
        }
        let (iw, ih) = image::image_dimensions(p).unwrap();
        assert_eq!(
            (v["width"].as_u64(), v["height"].as_u64()),
            (Some(iw as u64), Some(ih as u64))
        );
        assert!(v["timings_ms"]["total"].as_f64().unwrap() > 0.0);
    }
    // A per-request threshold: conf 0.8 keeps the subset of detections above 0.8.
    let bytes = std::fs::read(&examples()[0]).unwrap();
    let (code, body) = http(
        svc.addr,
        "POST",
        "/v1/detect?conf=0.8&classes=0,1",
        None,
        &bytes,
    );
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let n = want[0]
        .iter()
        .filter(|d| d.confidence > 0.8 && d.class_id < 2)
        .count();
    assert_eq!(v["detections"].as_array().unwrap().len(), n);
    let (code, metrics) = http(svc.addr, "GET", "/metrics", None, b"");
    assert_eq!(code, 200);
    let ok = 1 + examples().len();
    assert!(
        metrics.contains(&format!("yolo9_requests_total{{outcome=\"ok\"}} {ok}\n")),
        "{metrics}"
    );
    let s = svc.stop();
    assert_eq!((s.ok, s.errors), (ok as u64, 0));
}

#[test]
fn bad_requests_get_a_4xx_with_a_message() {
    let cfg = ServeConfig {
        max_body: 4096,
        ..ServeConfig::default()
    };
    let svc = Running::start(slow(0), cfg);
    let a = svc.addr;
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "/v1/detect",
            b"hello, not an image".to_vec(),
            400,
            "not a readable image",
        ),
        ("/v1/detect", Vec::new(), 400, "empty body"),
        ("/v1/detect", vec![0u8; 5000], 413, "4096 bytes"),
        ("/v1/detect?conf=2", b"x".to_vec(), 400, "conf=2"),
        (
            "/v1/detect?classes=0,7",
            b"x".to_vec(),
            400,
            "\\\"7\\\" is not a class id in 0..3",
        ),
        ("/v1/detect?img=10", b"x".to_vec(), 400, "img=10"),
        ("/v1/detect?max_det=abc", b"x".to_vec(), 400, "query"),
    ];
    for (path, body, want, msg) in cases {
        let (code, text) = http(a, "POST", path, None, &body);
        assert_eq!(code, want, "{path}: {text}");
        assert!(text.contains(msg), "{path}: {text:?} lacks {msg:?}");
        assert!(text.starts_with("{\"error\":"), "{path}: {text}");
    }
    // A multipart body without a file field.
    let mp = "--B\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n--B--\r\n";
    let (code, text) = http(
        a,
        "POST",
        "/v1/detect",
        Some("multipart/form-data; boundary=B"),
        mp.as_bytes(),
    );
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("no file field"), "{text}");
    let s = svc.stop();
    assert_eq!((s.ok, s.errors), (0, 8));
}

#[test]
fn a_burst_beyond_the_queue_gets_503_and_every_request_an_answer() {
    let cfg = ServeConfig {
        max_batch: 1,
        max_delay: Duration::ZERO,
        queue: 1,
        ..ServeConfig::default()
    };
    let svc = Running::start(slow(400), cfg);
    let png = {
        let mut b = Vec::new();
        image::DynamicImage::new_rgb8(64, 48)
            .write_to(&mut std::io::Cursor::new(&mut b), image::ImageFormat::Png)
            .unwrap();
        Arc::new(b)
    };
    let addr = svc.addr;
    let all: Vec<(u16, String)> = (0..8)
        .map(|_| {
            let png = png.clone();
            std::thread::spawn(move || http(addr, "POST", "/v1/detect", None, &png))
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let ok = all.iter().filter(|(c, _)| *c == 200).count();
    let busy: Vec<_> = all.iter().filter(|(c, _)| *c == 503).collect();
    assert_eq!(
        ok + busy.len(),
        8,
        "every request is answered 200 or 503: {all:?}"
    );
    assert!(ok >= 1 && !busy.is_empty(), "{all:?}");
    assert!(busy[0].1.contains("queue is full"), "{:?}", busy[0]);
    let s = svc.stop();
    assert_eq!((s.ok, s.errors), (ok as u64, busy.len() as u64));
}

#[test]
fn shutdown_answers_what_was_queued() {
    let cfg = ServeConfig {
        max_batch: 1,
        max_delay: Duration::ZERO,
        queue: 8,
        ..ServeConfig::default()
    };
    let mut svc = Running::start(slow(300), cfg);
    let png = {
        let mut b = Vec::new();
        image::DynamicImage::new_rgb8(40, 40)
            .write_to(&mut std::io::Cursor::new(&mut b), image::ImageFormat::Png)
            .unwrap();
        Arc::new(b)
    };
    let addr = svc.addr;
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let png = png.clone();
            std::thread::spawn(move || http(addr, "POST", "/v1/detect", None, &png))
        })
        .collect();
    // All three are received (one in the forward, two queued) before the stop.
    std::thread::sleep(Duration::from_millis(150));
    let _ = svc.stop.take().unwrap().send(());
    for c in clients {
        let (code, body) = c.join().unwrap();
        assert_eq!(code, 200, "{body}");
    }
    let s = svc.done.join().unwrap().unwrap();
    assert_eq!((s.ok, s.errors, s.batches), (3, 0, 3));
    assert!(TcpStream::connect(addr).is_err(), "the listener is closed");
}

/// The service's GPU batching pads each forward's input to `--max-batch`: the detections of a
/// padded call are those of the unpadded one (here on the CPU, one image padded to 2).
#[test]
fn padded_batches_detect_what_unpadded_ones_do() {
    let det = Detector::load(shipped(), Device::Cpu).unwrap();
    let img =
        image::DynamicImage::ImageRgb8(yolo9::data::image::load_rgb8(&examples()[1]).unwrap());
    let nms = det.nms_options();
    let want = det
        .detect_batch_with(std::slice::from_ref(&img), 640, &nms)
        .unwrap();
    let got = det
        .detect_batch_padded(std::slice::from_ref(&img), 640, &nms, 2)
        .unwrap();
    assert!(!want[0].is_empty());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].len(), want[0].len());
    // Equal up to the CPU GEMM's blocking for another batch size.
    for (g, w) in got[0].iter().zip(&want[0]) {
        assert_eq!(g.class_id, w.class_id);
        assert!(
            (g.confidence - w.confidence).abs() <= 1e-5,
            "{g:?} vs {w:?}"
        );
        for k in 0..4 {
            assert!((g.bbox[k] - w.bbox[k]).abs() <= 1e-3, "{g:?} vs {w:?}");
        }
    }
}

/// A request's `img` above the default is checked against the free memory on the CPU
/// (`yolo9::internals::footprint`): a full batch of 256 at 4096 px (about 512 GiB) is a 400 naming the
/// size, the estimate and what is free, answered before any decoding; the default size works.
#[test]
fn a_request_size_that_cannot_fit_in_memory_is_a_400() {
    let cfg = ServeConfig {
        max_batch: 256,
        ..ServeConfig::default()
    };
    let svc = Running::start(slow(0), cfg);
    let body = std::fs::read(&examples()[0]).unwrap();
    let (code, text) = http(svc.addr, "POST", "/v1/detect?img=4096", None, &body);
    assert_eq!(code, 400, "{text}");
    assert!(
        text.contains("img=4096: a full batch of 256 images needs about 512.00GiB on the CPU")
            && text.contains("is free"),
        "{text}"
    );
    let (code, text) = http(svc.addr, "POST", "/v1/detect?img=64", None, &body);
    assert_eq!(code, 200, "{text}");
    let s = svc.stop();
    assert_eq!((s.ok, s.errors), (1, 1));
}

/// `chromium` and `chromedriver` on PATH, or `None` (then the page test is skipped with a
/// printed reason, except in CI (`CI=true`), where it fails: `.ci/run` installs both).
fn chromium() -> Option<(PathBuf, PathBuf)> {
    let find = |name: &str| {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|c| c.is_file())
        })
    };
    let found = find("chromium").zip(find("chromedriver"));
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and chromium or chromedriver is not on PATH: .ci/run installs them \
             (apt-get install chromium chromium-driver)"
        );
        eprintln!(
            "SKIPPED the_page_draws_the_boxes_in_a_browser: chromium or chromedriver is not \
             installed (Debian: apt-get install chromium chromium-driver); CI runs this test"
        );
    }
    found
}

/// One WebDriver command to chromedriver at `addr`: the JSON `value` of its answer. The answer
/// is read by its `Content-Length` (chromedriver keeps the connection open).
fn webdriver(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> serde_json::Value {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = TcpStream::connect(addr).expect("connect to chromedriver");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut head = String::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut r, &mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
        head.push_str(&line);
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf);
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{method} {path}: {head} {text:?}: {e}"));
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "{method} {path}: {head}{text}"
    );
    v["value"].clone()
}

/// A WebDriver session, deleted when dropped (so no browser outlives the test).
struct Session {
    wd: SocketAddr,
    id: String,
}

impl Session {
    fn path(&self, p: &str) -> String {
        format!("/session/{}{p}", self.id)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            webdriver(self.wd, "DELETE", &format!("/session/{}", self.id), None)
        });
    }
}

/// Standard base64 (the WebDriver screenshot).
fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= (val(c) as u32) << (18 - 6 * i);
        }
        out.extend(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// A child process killed when dropped (chromedriver, also when an assertion fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The page of `GET /` in a real headless Chromium, driven through chromedriver (WebDriver over
/// HTTP): an example image is chosen in its file input as a user would; the page posts it to
/// `/v1/detect` and draws the answer. The page then reports as many boxes as `Detector::detect`
/// finds, and its screenshot shows the RBC colour of `draw::class_color` (box outlines and label
/// backgrounds) in thousands of pixels, where the image itself has almost none.
#[test]
fn the_page_draws_the_boxes_in_a_browser() {
    let Some((chromium, driver)) = chromium() else {
        return;
    };
    let path = examples()[0].clone();
    let img = yolo9::data::image::load_rgb8(&path).unwrap();
    let det = Detector::load(shipped(), Device::Cpu).unwrap();
    let want = det.detect_rgb(&img).unwrap();
    assert!(want.iter().any(|d| d.class_id == 0));
    let svc = Running::start(det, ServeConfig::default());
    let (code, page) = http(svc.addr, "GET", "/", None, b"");
    assert_eq!(code, 200);
    assert!(page.contains("<canvas") && page.contains("/v1/detect"));
    // Self-contained: no external script, style, image or font.
    for bad in [
        "src=\"http",
        "href=\"http",
        "url(http",
        "@import",
        "src=\"//",
    ] {
        assert!(
            !page.contains(bad),
            "the page loads an external resource: {bad}"
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _driver = Killed(
        std::process::Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start chromedriver"),
    );
    let wd: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t = std::time::Instant::now();
    while TcpStream::connect(wd).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "chromedriver does not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let profile = common::tmpdir("serve_page_profile");
    let args = serde_json::json!([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        format!("--user-data-dir={}", profile.display()),
        "--window-size=900,800",
    ]);
    let caps = serde_json::json!({"capabilities": {"alwaysMatch": {
        "browserName": "chrome",
        "goog:chromeOptions": {"binary": chromium, "args": args},
    }}});
    let session = webdriver(wd, "POST", "/session", Some(caps));
    let session = Session {
        wd,
        id: session["sessionId"].as_str().unwrap().to_string(),
    };
    let s = |p: &str| session.path(p);
    let url = format!("http://{}/", svc.addr);
    webdriver(
        wd,
        "POST",
        &s("/url"),
        Some(serde_json::json!({ "url": url })),
    );
    let input = webdriver(
        wd,
        "POST",
        &s("/element"),
        Some(serde_json::json!({"using": "css selector", "value": "#file"})),
    );
    let eid = input.as_object().unwrap().values().next().unwrap();
    let file = path.canonicalize().unwrap();
    webdriver(
        wd,
        "POST",
        &s(&format!("/element/{}/value", eid.as_str().unwrap())),
        Some(serde_json::json!({ "text": file.to_str().unwrap() })),
    );
    let script = serde_json::json!({
        "script": "return [document.body.dataset.state, document.body.dataset.boxes, \
                   document.getElementById('summary').textContent, \
                   document.getElementById('error').textContent]",
        "args": [],
    });
    let t = std::time::Instant::now();
    let state = loop {
        let v = webdriver(wd, "POST", &s("/execute/sync"), Some(script.clone()));
        if v[0] == "done" || v[0] == "error" {
            break v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the page is still {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(state[0], "done", "{state}");
    assert_eq!(state[1], want.len().to_string(), "{state}");
    let summary = format!("{} detections: ", want.len());
    assert!(state[2].as_str().unwrap().starts_with(&summary), "{state}");
    let shot = webdriver(wd, "GET", &s("/screenshot"), None);
    let png = image::load_from_memory(&base64(shot.as_str().unwrap()))
        .unwrap()
        .to_rgb8();
    let file = common::tmpdir("serve_page").join("page.png");
    png.save(&file).unwrap();
    drop(session);
    let rbc = yolo9::detect::draw::class_color(0).0;
    let near = |p: &image::Rgb<u8>| (0..3).all(|k| (p[k] as i32 - rbc[k] as i32).abs() <= 6);
    let in_shot = png.pixels().filter(|p| near(p)).count();
    let in_image = img.pixels().filter(|p| near(p)).count();
    assert!(
        in_image < 50,
        "the image itself has {in_image} pixels of the RBC colour"
    );
    assert!(
        in_shot > 2000,
        "{in_shot} pixels of the RBC colour {rbc:?} in {}",
        file.display()
    );
    eprintln!(
        "screenshot: {} ({in_shot} RBC-coloured pixels)",
        file.display()
    );
    let s = svc.stop();
    assert_eq!((s.ok, s.errors), (1, 0));
}

#[test]
fn a_segmentation_model_answers_with_the_polygons_of_its_masks() {
    // tiny-seg: an official checkpoint of a small segmentation graph (tests/model/seg.rs).
    let (w, _) = common::tiny_seg_converted();
    let config = yolo9::DetectorConfig::default();
    let det = Detector::with_weights(&w, Device::Cpu, config.clone()).unwrap();
    let p = &examples()[0];
    let want = det
        .detect_rgb(&yolo9::data::image::load_rgb8(p).unwrap())
        .unwrap();
    assert!(
        !want.is_empty(),
        "the untrained model detects something at conf 0.25"
    );
    let svc = Running::start(
        Detector::with_weights(&w, Device::Cpu, config).unwrap(),
        ServeConfig::default(),
    );
    let (code, body) = http(
        svc.addr,
        "POST",
        "/v1/detect",
        Some("image/jpeg"),
        &std::fs::read(p).unwrap(),
    );
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let got = v["detections"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        let poly = &w.mask.as_ref().unwrap().polygon;
        assert_eq!(g["polygon"], serde_json::json!(poly));
    }
    svc.stop();
}
