//! `yolo9 serve` bounds its clients (issue 36, the simple parts of "serve"): `--queue` is
//! validated at start (before: `--queue 4294967295` aborted with exit 134), and the service
//! holds at most `max_conns` connections, closing one that sends nothing for the idle time or
//! whose request header does not arrive within the header timeout (however slowly it trickles),
//! so idle and slowloris clients cannot lock out the others for ever.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use yolo9::serve::{serve, ServeConfig};
use yolo9::Detector;

#[test]
fn out_of_range_queue_sizes_are_refused_at_start() {
    for q in ["4294967295", "65537", "0"] {
        let (code, _out, err) = common::yolo9(&["serve", "--queue", q]);
        assert_eq!(code, 2, "--queue {q}: {err}");
        assert!(err.contains("--queue") && err.contains(q), "{err}");
    }
    let (code, _out, err) = common::yolo9(&["serve", "--max-conns", "0"]);
    assert_eq!(code, 2, "{err}");
}

fn get(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {raw:?}"));
    (code, t0.elapsed())
}

/// Starts the service with `cfg` on loopback: its address, the trigger of its shutdown, its
/// thread.
fn start(cfg: ServeConfig) -> Started {
    let det = Detector::load(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors"),
        candle_core::Device::Cpu,
    )
    .unwrap()
    .with_config(yolo9::DetectorConfig {
        img_size: 64,
        ..Default::default()
    })
    .unwrap();
    start_with(det, cfg)
}

type Started = (
    SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<anyhow::Result<yolo9::serve::ServeSummary>>,
);

/// [`start`] with the detector `det`.
fn start_with(det: Detector, cfg: ServeConfig) -> Started {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            serve(l, det, cfg, async {
                let _ = stopped.await;
            })
            .await
        })
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    (addr, stop, done)
}

/// Two connections that never send a byte fill a cap of 2: a third client closes the one that
/// has waited longest for a header and is answered at once; the other idle one is closed after
/// `timeout` + 5 s = 6 s without progress. Both see the close.
#[test]
fn idle_connections_are_capped_and_closed() {
    let cfg = ServeConfig {
        max_conns: 2,
        timeout: Duration::from_secs(1),
        idle: Duration::from_secs(1),
        header_timeout: Duration::from_secs(60),
        ..ServeConfig::default()
    };
    assert_eq!(cfg.effective_idle(), Duration::from_secs(6));
    let (addr, stop, done) = start(cfg);
    // Served at once while there is room.
    let (code, took) = get(addr, "/healthz");
    assert_eq!(code, 200);
    assert!(took < Duration::from_secs(3), "{took:?}");

    let t0 = Instant::now();
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(addr).unwrap());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, took) = get(addr, "/healthz");
    assert_eq!(code, 200);
    assert!(
        took < Duration::from_secs(3),
        "the third client waited {took:?} (cap 2, the oldest idle one is closed for it)"
    );
    let mut closed_at = Vec::new();
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(s.read(&mut b).unwrap_or(0), 0, "closed by the service");
        closed_at.push(t0.elapsed());
    }
    assert!(
        closed_at[0] < Duration::from_secs(3),
        "the oldest idle one is closed for the new client: {closed_at:?}"
    );
    assert!(
        closed_at[1] >= Duration::from_secs(4) && closed_at[1] < Duration::from_secs(15),
        "the other at the idle time: {closed_at:?}"
    );
    let _ = stop.send(());
    done.join().unwrap().unwrap();
}

/// A header sent one byte every 300 ms (the idle timer never fires) is cut at the header
/// timeout of 2 s, and a keep-alive connection left idle after its answer too; ordinary requests
/// are answered meanwhile.
#[test]
fn slow_headers_and_idle_keep_alives_are_cut_at_the_header_timeout() {
    let cfg = ServeConfig {
        header_timeout: Duration::from_secs(2),
        ..ServeConfig::default()
    };
    let (addr, stop, done) = start(cfg);
    let t0 = Instant::now();
    let mut slow = TcpStream::connect(addr).unwrap();
    let head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut cut = None;
    for &b in head.iter() {
        if slow.write_all(&[b]).is_err() {
            cut = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
        // Ordinary clients are answered while it trickles.
        if t0.elapsed() < Duration::from_millis(700) {
            assert_eq!(get(addr, "/healthz").0, 200);
        }
        let mut probe = [0u8; 1];
        slow.set_nonblocking(true).unwrap();
        let closed = matches!(slow.read(&mut probe), Ok(0));
        slow.set_nonblocking(false).unwrap();
        if closed {
            cut = Some(t0.elapsed());
            break;
        }
    }
    let cut = cut.expect("the slow header was never cut");
    assert!(
        cut >= Duration::from_millis(1500) && cut < Duration::from_secs(6),
        "cut after {cut:?}"
    );

    // Keep-alive: one answer, then silence; closed about 2 s after the answer.
    let mut ka = TcpStream::connect(addr).unwrap();
    ka.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    ka.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let t1 = Instant::now();
    let mut raw = Vec::new();
    let _ = ka.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        t1.elapsed() >= Duration::from_millis(1500) && t1.elapsed() < Duration::from_secs(6),
        "keep-alive closed after {:?}",
        t1.elapsed()
    );
    let _ = stop.send(());
    done.join().unwrap().unwrap();
}

/// A model that sleeps 400 ms per forward and detects nothing.
struct Slow(yolo9::ModelMeta);

impl yolo9::detect::detector::InferenceModel for Slow {
    fn forward(&self, x: &candle_core::Tensor) -> anyhow::Result<candle_core::Tensor> {
        std::thread::sleep(Duration::from_millis(400));
        let (b, _, h, w) = x.dims4()?;
        let a: usize = [8, 16, 32].iter().map(|s| (h / s) * (w / s)).sum();
        Ok(candle_core::Tensor::zeros(
            (b, 4 + self.0.nc, a),
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        )?)
    }
    fn meta(&self) -> &yolo9::ModelMeta {
        &self.0
    }
}

fn post_png(addr: SocketAddr, png: &[u8]) -> u16 {
    post(addr, png).0
}

/// POSTs `body` to /v1/detect: the status and the whole answer.
fn post(addr: SocketAddr, png: &[u8]) -> (u16, String) {
    post_to(addr, "/v1/detect", png)
}

/// POSTs `body` to `path` (with its query): the status and the whole answer.
fn post_to(addr: SocketAddr, path: &str, png: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        png.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(png).unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {raw:?}"));
    (code, raw)
}

/// Requests whose client already got its 504 are dropped by the worker instead of detected:
/// 6 requests at once on a model of 400 ms per forward with a 1 s timeout run about 3 forwards,
/// not 6, and `/metrics` counts the others as abandoned.
#[test]
fn requests_that_timed_out_are_not_detected() {
    let meta = Detector::load(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors"),
        candle_core::Device::Cpu,
    )
    .unwrap()
    .meta()
    .clone();
    let det = Detector::from_model(Slow(meta), candle_core::Device::Cpu)
        .with_config(yolo9::DetectorConfig {
            img_size: 64,
            ..Default::default()
        })
        .unwrap();
    let cfg = ServeConfig {
        max_batch: 1,
        max_delay: Duration::ZERO,
        queue: 16,
        timeout: Duration::from_secs(1),
        ..ServeConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(l.local_addr().unwrap()).unwrap();
            serve(l, det, cfg, async {
                let _ = stopped.await;
            })
            .await
        })
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    let t0 = Instant::now();
    while get(addr, "/readyz").0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut png = Vec::new();
    image::RgbImage::new(64, 64)
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let codes: Vec<u16> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..6).map(|_| s.spawn(|| post_png(addr, &png))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = codes.iter().filter(|&&c| c == 200).count();
    let late = codes.iter().filter(|&&c| c == 504).count();
    assert_eq!(ok + late, 6, "{codes:?}");
    assert!(late >= 2, "{codes:?}");
    // Let the worker reach the abandoned jobs.
    std::thread::sleep(Duration::from_millis(1500));
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let abandoned: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("yolo9_abandoned_total "))
        .unwrap_or_else(|| panic!("{text}"))
        .trim()
        .parse()
        .unwrap();
    let _ = stop.send(());
    let summary = done.join().unwrap().unwrap();
    assert!(abandoned >= 1, "{text}");
    assert_eq!(
        summary.batches as usize + abandoned as usize,
        6,
        "every request is either detected or dropped: {summary:?}, {abandoned} abandoned"
    );
    assert!(summary.batches < 6, "{summary:?}");
}

/// One budget for the images in flight: a picture whose header declares more than the budget is
/// a 413 before any decode (a 1 KB PNG declaring 20000x20000: 1.2 GB, over the decoding-bomb
/// guard too); two 1000x1000 RGBA pictures (7.1 MB to decode, 3 MB held after) do not fit a 9 MB budget at once: one is answered 503 with
/// Retry-After, and once the first is answered the budget is free again.
#[test]
fn images_in_flight_share_one_memory_budget() {
    let bomb = common::png_header(20_000, 20_000, 8, 2);
    assert!(bomb.len() < 1024);
    let (addr, stop, done) = start(ServeConfig::default());
    let t0 = Instant::now();
    let (code, text) = post(addr, &bomb);
    assert_eq!(code, 413, "{text}");
    assert!(
        text.contains("20000x20000") && text.contains("--decode-budget-mb"),
        "{text}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let _ = stop.send(());
    done.join().unwrap().unwrap();

    let meta = Detector::load(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/yolov9-s-bccd.safetensors"),
        candle_core::Device::Cpu,
    )
    .unwrap()
    .meta()
    .clone();
    let det = Detector::from_model(Slow(meta), candle_core::Device::Cpu)
        .with_config(yolo9::DetectorConfig {
            img_size: 64,
            ..Default::default()
        })
        .unwrap();
    let cfg = ServeConfig {
        max_batch: 1,
        decode_budget: 9_000_000,
        max_img: 2048,
        ..ServeConfig::default()
    };
    let (addr, stop, done) = start_with(det, cfg);
    let t0 = Instant::now();
    while get(addr, "/readyz").0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut png = Vec::new();
    // RGBA: 4 bytes a pixel in the decoder plus the RGB copy (an RGB PNG decodes in place: 3 MB).
    image::RgbaImage::from_pixel(1000, 1000, image::Rgba([90, 30, 200, 255]))
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2).map(|_| s.spawn(|| post(addr, &png))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut codes: Vec<u16> = answers.iter().map(|a| a.0).collect();
    codes.sort();
    assert_eq!(codes, [200, 503], "{answers:?}");
    let busy = &answers.iter().find(|a| a.0 == 503).unwrap().1;
    assert!(
        busy.contains("retry later") && busy.to_ascii_lowercase().contains("retry-after: 1"),
        "{busy}"
    );
    assert_eq!(post(addr, &png).0, 200, "the budget is given back");
    // The letterbox is held in the same budget: a 100x100 picture (30 KB decoded) asked at
    // img=2048 letterboxes to 2048x2048 RGB (12.6 MB), over the 9 MB budget.
    let mut small = Vec::new();
    image::RgbImage::from_pixel(100, 100, image::Rgb([90, 30, 200]))
        .write_to(
            &mut std::io::Cursor::new(&mut small),
            image::ImageFormat::Png,
        )
        .unwrap();
    let (code, text) = post_to(addr, "/v1/detect?img=2048", &small);
    assert_eq!(code, 413, "{text}");
    assert!(
        text.contains("100x100") && text.contains("letterbox") && text.contains("img=2048"),
        "{text}"
    );
    assert_eq!(post(addr, &small).0, 200, "the refusal held nothing");
    let _ = stop.send(());
    done.join().unwrap().unwrap();
}

/// A body that trickles (a header declaring 100 KB, then 10 bytes every 200 ms) falls behind
/// the minimum rate of 1 KB/s after the 1 s grace: it is answered 408 and its connection closed
/// within a few seconds, its bytes never held beyond that; ordinary requests are answered
/// meanwhile.
#[test]
fn slow_bodies_are_cut_at_the_minimum_rate() {
    let cfg = ServeConfig {
        header_timeout: Duration::from_secs(1),
        min_body_rate: 1000,
        ..ServeConfig::default()
    };
    let (addr, stop, done) = start(cfg);
    let t0 = Instant::now();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(
        b"POST /v1/detect HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n",
    )
    .unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut answer = Vec::new();
    while t0.elapsed() < Duration::from_secs(10) {
        let _ = slow.write_all(&[0u8; 10]);
        let mut b = [0u8; 4096];
        match slow.read(&mut b) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&b[..n]),
            Err(_) => {}
        }
        if t0.elapsed() < Duration::from_millis(600) {
            assert_eq!(get(addr, "/healthz").0, 200);
        }
    }
    let took = t0.elapsed();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("slower than 1000 bytes/s"), "{text}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "cut after {took:?}"
    );
    let _ = stop.send(());
    done.join().unwrap().unwrap();
}

/// The drain is bounded: with a connection still sending its body slowly (within the minimum
/// rate) when the shutdown starts, `serve` returns at the drain time (1 s), not when the client
/// is done.
#[test]
fn shutdown_ends_within_the_drain_time_whatever_clients_do() {
    let cfg = ServeConfig {
        drain: Duration::from_secs(1),
        min_body_rate: 1,
        header_timeout: Duration::from_secs(60),
        ..ServeConfig::default()
    };
    let (addr, stop, done) = start(cfg);
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(
        b"POST /v1/detect HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\nab",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let _ = stop.send(());
    done.join().unwrap().unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "serve returned {took:?} after the shutdown started (drain 1 s)"
    );
    drop(slow);
}

/// Issue 51: an upload sent with `Expect: 100-continue` (curl does so above 1 MB) is not cut by
/// the header deadline that the interim `100 Continue` used to re-arm: with a 1 s header
/// timeout, a 1.5 MB body paced over about 2.5 s (well above the minimum rate) is answered 200.
#[test]
fn an_upload_after_100_continue_is_not_cut_by_the_header_deadline() {
    let cfg = ServeConfig {
        header_timeout: Duration::from_secs(1),
        ..ServeConfig::default()
    };
    let (addr, stop, done) = start(cfg);
    // A noisy picture, so the PNG is large.
    let img = image::RgbImage::from_fn(800, 700, |x, y| {
        let v =
            (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)).wrapping_mul(2_246_822_519);
        image::Rgb([(v >> 8) as u8, (v >> 16) as u8, (v >> 24) as u8])
    });
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    assert!(png.len() > 1_000_000, "{}", png.len());
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/detect HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\
         Expect: 100-continue\r\nConnection: close\r\n\r\n",
        png.len()
    )
    .unwrap();
    let mut interim = [0u8; 25];
    s.read_exact(&mut interim).unwrap();
    assert!(
        interim.starts_with(b"HTTP/1.1 100 Continue"),
        "{}",
        String::from_utf8_lossy(&interim)
    );
    for chunk in png.chunks(png.len() / 10 + 1) {
        std::thread::sleep(Duration::from_millis(250));
        s.write_all(chunk).unwrap();
    }
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("\"width\":800"), "{raw}");
    let _ = stop.send(());
    done.join().unwrap().unwrap();
}
