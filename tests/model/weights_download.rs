//! Weights by name (`yolo9::hub`): resolution through the cache, the download from a release
//! server, its verification, and the built-in default weights. No test touches the internet: a
//! loopback HTTP server in this file (std `TcpListener`) plays the release, serving the official
//! checkpoint format of `../shared/reference/yolov9-s.pt` (official yolov9-s structure, 80
//! classes, random-but-sane weights) under the name `yolov9-s.pt`.
//!
//! Every case ends with the cached file intact or absent (no `.part` left behind) and a one-line
//! error, never a panic or a hang.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use yolo9::hub::{self, HubError, HubOptions};

/// What the server does with one request (by its index, 0 first).
#[derive(Clone)]
enum Reply {
    /// The whole file (or, with `range`, the part a `Range: bytes=N-` asks for, as 206).
    File { range: bool },
    /// Announces the whole length, sends `cut` bytes, closes.
    Cut { cut: usize },
    /// Announces and sends only the first `len` bytes (a consistent but wrong length).
    Short { len: usize },
    /// A status with an empty body.
    Status(u16),
    /// Reads the request and never answers (holds the connection for `hold`).
    Stall { hold: Duration },
    /// Announces the whole length, sends `cut` bytes, then goes silent for `hold`.
    StallAfter { cut: usize, hold: Duration },
}

/// A loopback release server: `GET /yolov9-s.pt` answered by `plan(index)`; other paths 404.
struct Server {
    base: String,
    requests: Arc<AtomicUsize>,
    ranges: Arc<Mutex<Vec<Option<String>>>>,
}

impl Server {
    fn start(body: Arc<Vec<u8>>, plan: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let ranges = Arc::new(Mutex::new(Vec::new()));
        let plan = Arc::new(plan);
        let (rq, rg) = (requests.clone(), ranges.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let (body, plan, rq, rg) = (body.clone(), plan.clone(), rq.clone(), rg.clone());
                std::thread::spawn(move || {
                    let _ = handle(stream, &body, &*plan, &rq, &rg);
                });
            }
        });
        Self {
            base,
            requests,
            ranges,
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn handle(
    mut stream: TcpStream,
    body: &[u8],
    plan: &(dyn Fn(usize) -> Reply + Send + Sync),
    requests: &AtomicUsize,
    ranges: &Mutex<Vec<Option<String>>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_string());
            }
        }
    }
    if path != "/yolov9-s.pt" {
        return stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
    let i = requests.fetch_add(1, Ordering::SeqCst);
    ranges.lock().unwrap().push(range.clone());
    let head = |status: &str, len: usize, extra: &str| {
        format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n")
    };
    match plan(i) {
        Reply::File { range: true } if range.is_some() => {
            let from: usize = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.strip_suffix('-'))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let part = &body[from.min(body.len())..];
            let cr = format!(
                "Content-Range: bytes {from}-{}/{}\r\n",
                body.len() - 1,
                body.len()
            );
            stream.write_all(head("206 Partial Content", part.len(), &cr).as_bytes())?;
            stream.write_all(part)
        }
        Reply::File { .. } => {
            stream.write_all(head("200 OK", body.len(), "").as_bytes())?;
            stream.write_all(body)
        }
        Reply::Cut { cut } => {
            stream.write_all(head("200 OK", body.len(), "").as_bytes())?;
            stream.write_all(&body[..cut])?;
            stream.flush()?;
            stream.shutdown(std::net::Shutdown::Both)
        }
        Reply::Short { len } => {
            stream.write_all(head("200 OK", len, "").as_bytes())?;
            stream.write_all(&body[..len])
        }
        Reply::Status(code) => stream.write_all(head(&format!("{code} Error"), 0, "").as_bytes()),
        Reply::Stall { hold } => {
            std::thread::sleep(hold);
            Ok(())
        }
        Reply::StallAfter { cut, hold } => {
            stream.write_all(head("200 OK", body.len(), "").as_bytes())?;
            stream.write_all(&body[..cut])?;
            stream.flush()?;
            std::thread::sleep(hold);
            Ok(())
        }
    }
}

/// The served checkpoint: the official format of yolov9-s (80 classes).
fn checkpoint() -> Arc<Vec<u8>> {
    Arc::new(std::fs::read(common::reference("yolov9-s.pt")).unwrap())
}

/// Options for a cache in `home` and the server at `base`: quiet, short timeouts and backoff.
fn options(home: &Path, base: &str) -> HubOptions {
    HubOptions {
        home: Some(home.to_path_buf()),
        base_url: base.to_string(),
        offline: false,
        timeout: Duration::from_millis(1500),
        retries: 2,
        backoff: Duration::from_millis(10),
        max_bytes: 1 << 30,
        verbose: false,
    }
}

/// The files in `dir` (names, sorted), `manifest/` entries prefixed.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if e.path().is_dir() {
                for f in listing(&e.path()) {
                    out.push(format!("{name}/{f}"));
                }
            } else {
                out.push(name);
            }
        }
    }
    out.sort();
    out
}

/// An error is one line and no panic text.
fn one_line(e: &HubError) -> String {
    let s = e.to_string();
    assert!(!s.contains('\n'), "not one line: {s}");
    s
}

#[test]
fn first_download_verifies_converts_and_records_then_the_cache_answers() {
    let home = common::tmpdir("first").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let opts = options(&home, &server.base);
    let path = hub::fetch_name("yolov9-s", &opts).unwrap();
    assert_eq!(path, home.join("yolov9-s.safetensors"));
    assert_eq!(server.requests(), 1);
    assert_eq!(
        listing(&home),
        ["manifest/yolov9-s.json", "yolov9-s.safetensors"]
    );
    // The record: the served file's hash and size, the converted file's hash, the model.
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(home.join("manifest/yolov9-s.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        record["source_sha256"],
        "9d0f09784ca50440e1fb1b97d7f54e0c28ebe10b6f2d908c42f4d0ab653c79bd"
    );
    assert_eq!(record["source_bytes"], 20_515_869);
    assert_eq!(record["source"], format!("{}/yolov9-s.pt", server.base));
    assert_eq!(
        record["sha256"],
        yolo9::convert::sha256_file(&path).unwrap().as_str()
    );
    assert_eq!(record["arch"], "yolov9-s");
    assert_eq!(record["parameters"], 9_804_512);
    // The cached weights are the checkpoint's, exactly (f16 values kept as they are).
    let cached = yolo9::Weights::load(&path).unwrap();
    let direct = yolo9::Weights::load(common::reference("yolov9-s.pt")).unwrap();
    assert_eq!(cached.meta.arch.name, "yolov9-s");
    assert_eq!(cached.meta.nc, 80);
    assert_eq!(cached.parameter_count(), 9_804_512);
    assert_eq!(cached.tensors.len(), direct.tensors.len());
    for (name, t) in &direct.tensors {
        assert_eq!(
            common::max_abs(t, &cached.tensors[name]),
            0.0,
            "{name} differs after the cache"
        );
    }
    // Cache hit, with or without `.pt`, through `resolve` and `Weights::named_with`: no request.
    for spec in ["yolov9-s", "yolov9-s.pt"] {
        assert_eq!(hub::resolve(Path::new(spec), &opts).unwrap(), path);
    }
    let w = yolo9::Weights::named_with("yolov9-s", &opts).unwrap();
    assert_eq!(w.parameter_count(), 9_804_512);
    assert_eq!(server.requests(), 1, "a cached model makes no request");
    // An existing path is used as given, even one that looks like a name.
    let dir = common::tmpdir("first-path");
    let local = dir.join("yolov9-s");
    std::fs::write(&local, b"x").unwrap();
    assert_eq!(hub::resolve(&local, &opts).unwrap(), local);
}

#[test]
fn a_cut_body_resumes_with_range_and_without_range_support_fails_cleanly() {
    let body = checkpoint();
    let cut = 5_000_000;
    // The first answer breaks off; the server honours Range: the download resumes where it was.
    let home = common::tmpdir("resume").join("cache");
    let server = Server::start(body.clone(), move |i| match i {
        0 => Reply::Cut { cut },
        _ => Reply::File { range: true },
    });
    let path = hub::fetch_name("yolov9-s", &options(&home, &server.base)).unwrap();
    assert_eq!(server.requests(), 2);
    assert_eq!(
        *server.ranges.lock().unwrap(),
        [None, Some(format!("bytes={cut}-"))]
    );
    assert_eq!(
        yolo9::Weights::load(&path).unwrap().parameter_count(),
        9_804_512
    );
    // A server that always breaks off: every attempt fails, one-line error, nothing left.
    let home = common::tmpdir("truncated").join("cache");
    let server = Server::start(body, move |_| Reply::Cut { cut });
    let e = hub::fetch_name("yolov9-s", &options(&home, &server.base)).unwrap_err();
    let text = one_line(&e);
    assert!(
        matches!(failed(&e), HubError::Network { attempts: 3, .. }),
        "{text}"
    );
    assert!(text.contains("of 20515869 bytes"), "{text}");
    assert_eq!(server.requests(), 3);
    assert_eq!(listing(&home), Vec::<String>::new(), "{text}");
}

/// The reason of a failed download, which the error wraps with the place for a file fetched
/// another way (issue 51).
fn failed(e: &HubError) -> &HubError {
    match e {
        HubError::DownloadFailed { reason, .. } => reason,
        other => panic!("not a failed download: {other}"),
    }
}

#[test]
fn a_wrong_length_is_caught_by_verification() {
    // The server announces and sends 12 MB of a 20.5 MB checkpoint: HTTP is satisfied, the
    // checkpoint is not.
    let home = common::tmpdir("short").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::Short { len: 12_000_000 });
    let e = hub::fetch_name("yolov9-s", &options(&home, &server.base)).unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, HubError::Verify { .. }), "{text}");
    assert!(text.contains("may be damaged"), "{text}");
    assert_eq!(server.requests(), 1);
    assert_eq!(listing(&home), Vec::<String>::new(), "{text}");
}

#[test]
fn status_errors_404_is_final_500_is_retried() {
    let body = checkpoint();
    // 404 (a base URL without the file): one request, an error naming the URL.
    let home = common::tmpdir("404").join("cache");
    let server = Server::start(body.clone(), |_| Reply::File { range: false });
    let opts = options(&home, &format!("{}/elsewhere", server.base));
    let e = hub::fetch_name("gelan-c", &opts).unwrap_err();
    let text = one_line(&e);
    assert!(
        matches!(failed(&e), HubError::Http { status: 404, .. }),
        "{text}"
    );
    assert!(text.contains("/elsewhere/gelan-c.pt"), "{text}");
    // As offline mode does, the error says where a file fetched another way goes.
    assert!(
        text.contains("another way and place it at") && text.contains("gelan-c.pt (it is verified"),
        "{text}"
    );
    assert_eq!(listing(&home), Vec::<String>::new());
    // 500 then the file: retried, cached.
    let home = common::tmpdir("500").join("cache");
    let server = Server::start(body.clone(), |i| match i {
        0 => Reply::Status(500),
        _ => Reply::File { range: false },
    });
    hub::fetch_name("yolov9-s", &options(&home, &server.base)).unwrap();
    assert_eq!(server.requests(), 2);
    assert_eq!(
        listing(&home),
        ["manifest/yolov9-s.json", "yolov9-s.safetensors"]
    );
    // 503 every time: the retries run out.
    let home = common::tmpdir("503").join("cache");
    let server = Server::start(body, |_| Reply::Status(503));
    let e = hub::fetch_name("yolov9-s", &options(&home, &server.base)).unwrap_err();
    assert!(one_line(&e).contains("HTTP 503"), "{e}");
    assert_eq!(server.requests(), 3);
    assert_eq!(listing(&home), Vec::<String>::new());
}

#[test]
fn a_stalled_server_times_out() {
    let home = common::tmpdir("stall").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::Stall {
        hold: Duration::from_secs(30),
    });
    let mut opts = options(&home, &server.base);
    opts.timeout = Duration::from_millis(300);
    opts.retries = 1;
    let t = Instant::now();
    let e = hub::fetch_name("yolov9-s", &opts).unwrap_err();
    let took = t.elapsed();
    let text = one_line(&e);
    assert!(
        matches!(failed(&e), HubError::Network { attempts: 2, .. }),
        "{text}"
    );
    assert!(text.contains("timed out"), "{text}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(listing(&home), Vec::<String>::new());
    // A server that goes silent in the middle of the body: the per-read timeout ends each attempt.
    let home = common::tmpdir("stall-body").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::StallAfter {
        cut: 3_000_000,
        hold: Duration::from_secs(30),
    });
    let mut opts = options(&home, &server.base);
    opts.timeout = Duration::from_millis(300);
    opts.retries = 1;
    let t = Instant::now();
    let e = hub::fetch_name("yolov9-s", &opts).unwrap_err();
    let took = t.elapsed();
    let text = one_line(&e);
    assert!(
        matches!(failed(&e), HubError::Network { attempts: 2, .. }),
        "{text}"
    );
    assert!(text.contains("of 20515869 bytes"), "{text}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(server.requests(), 2);
    assert_eq!(listing(&home), Vec::<String>::new());
}

#[test]
fn a_file_over_the_limit_is_refused() {
    let home = common::tmpdir("oversize").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let mut opts = options(&home, &server.base);
    opts.max_bytes = 1_000_000;
    let e = hub::fetch_name("yolov9-s", &opts).unwrap_err();
    let text = one_line(&e);
    assert!(
        matches!(
            failed(&e),
            HubError::TooLarge {
                bytes: 20_515_869,
                limit: 1_000_000,
                ..
            }
        ),
        "{text}"
    );
    assert_eq!(server.requests(), 1, "over the limit is not retried");
    assert_eq!(listing(&home), Vec::<String>::new());
}

#[test]
fn offline_names_the_file_to_place_and_a_placed_file_is_used() {
    let home = common::tmpdir("offline").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let mut opts = options(&home, &server.base);
    opts.offline = true;
    let e = hub::fetch_name("yolov9-s.pt", &opts).unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, HubError::Offline { .. }), "{text}");
    assert!(text.contains("YOLO9_OFFLINE=1"), "{text}");
    assert!(
        text.contains(&format!("{}/yolov9-s.pt", server.base)),
        "{text}"
    );
    assert!(
        text.contains(&home.join("yolov9-s.pt").display().to_string()),
        "{text}"
    );
    assert_eq!(server.requests(), 0);
    // Placing the file where the message says makes the next (offline) run convert it.
    std::fs::create_dir_all(&home).unwrap();
    std::fs::copy(common::reference("yolov9-s.pt"), home.join("yolov9-s.pt")).unwrap();
    let path = hub::fetch_name("yolov9-s", &opts).unwrap();
    assert_eq!(server.requests(), 0);
    assert_eq!(
        listing(&home),
        ["manifest/yolov9-s.json", "yolov9-s.safetensors"]
    );
    assert_eq!(
        yolo9::Weights::load(&path).unwrap().parameter_count(),
        9_804_512
    );
    // A converted file placed in another cache without a record: verified, then recorded.
    let other = home.with_file_name("other-cache");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(&path, other.join("yolov9-s.safetensors")).unwrap();
    let again = hub::fetch_name("yolov9-s", &options(&other, &server.base)).unwrap();
    assert_eq!(again, other.join("yolov9-s.safetensors"));
    assert_eq!(
        listing(&other),
        ["manifest/yolov9-s.json", "yolov9-s.safetensors"]
    );
    // A placed file that is another model is refused, naming both models, and not recorded.
    let wrong = home.with_file_name("wrong-cache");
    std::fs::create_dir_all(&wrong).unwrap();
    std::fs::copy(&path, wrong.join("gelan-c.safetensors")).unwrap();
    let e = hub::fetch_name("gelan-c", &options(&wrong, &server.base)).unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, HubError::Verify { .. }), "{text}");
    assert!(
        text.contains("holds a yolov9-s model, but gelan-c is gelan-c"),
        "{text}"
    );
    assert_eq!(listing(&wrong), ["gelan-c.safetensors"]);
    assert_eq!(server.requests(), 0);
}

#[test]
fn a_changed_cached_file_is_an_error_naming_both_hashes() {
    let home = common::tmpdir("tamper").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let opts = options(&home, &server.base);
    let path = hub::fetch_name("yolov9-s", &opts).unwrap();
    let recorded = yolo9::convert::sha256_file(&path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let actual = yolo9::convert::sha256_file(&path).unwrap();
    let e = hub::fetch_name("yolov9-s", &opts).unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, HubError::HashMismatch { .. }), "{text}");
    assert!(text.contains(&recorded) && text.contains(&actual), "{text}");
    assert_eq!(
        server.requests(),
        1,
        "a changed file is not silently replaced"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is left as it is"
    );
    // The library error carries the same text.
    let e = yolo9::Weights::named_with("yolov9-s", &opts).err().unwrap();
    assert!(e.to_string().contains(&recorded), "{e}");
}

#[test]
fn two_downloads_of_one_name_at_once_leave_one_good_file() {
    let home = common::tmpdir("race").join("cache");
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let opts = options(&home, &server.base);
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let o = opts.clone();
            std::thread::spawn(move || hub::fetch_name("yolov9-s", &o))
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    assert_eq!(server.requests(), 2);
    assert_eq!(
        listing(&home),
        ["manifest/yolov9-s.json", "yolov9-s.safetensors"]
    );
    // The file is whole and matches its record: the next use is a cache hit.
    let path = hub::fetch_name("yolov9-s", &opts).unwrap();
    assert_eq!(server.requests(), 2);
    assert_eq!(
        yolo9::Weights::load(&path).unwrap().parameter_count(),
        9_804_512
    );
}

#[test]
fn an_unusable_cache_folder_and_unknown_names_are_clear_errors() {
    let dir = common::tmpdir("badcache");
    // The cache path is a regular file (fails for root too, unlike a read-only folder).
    let file = dir.join("cache");
    std::fs::write(&file, b"not a folder").unwrap();
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let e = hub::fetch_name("yolov9-s", &options(&file, &server.base)).unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, HubError::Cache { .. }), "{text}");
    assert!(text.contains(&file.display().to_string()), "{text}");
    assert!(text.contains("YOLO9_HOME"), "{text}");
    assert_eq!(std::fs::read(&file).unwrap(), b"not a folder");
    assert_eq!(server.requests(), 0);
    // Names the release does not publish: the published ones are listed.
    let opts = options(&dir.join("c2"), &server.base);
    for (spec, hint) in [("yolov9-x", None), ("yolov9-t", Some("yolov9-t-converted"))] {
        let e = hub::resolve(Path::new(spec), &opts).unwrap_err();
        let text = one_line(&e);
        assert!(matches!(e, HubError::UnknownName { .. }), "{text}");
        assert!(
            text.contains("yolov9-e-converted, yolov9-s, yolov9-m"),
            "{text}"
        );
        if let Some(h) = hint {
            assert!(text.contains(&format!("published only as {h}")), "{text}");
        }
    }
    assert_eq!(server.requests(), 0);
}

#[test]
fn the_built_in_weights_are_the_shipped_file_and_detect_the_same() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read(repo.join("weights/yolov9-s-bccd.safetensors")).unwrap();
    assert_eq!(hub::builtin_bytes(), shipped.as_slice());
    let builtin = yolo9::Weights::builtin().unwrap();
    assert_eq!(builtin.meta.names, ["RBC", "WBC", "Platelets"]);
    assert_eq!(builtin.parameter_count(), 7_196_409);
    // The same model stored in f32: detections equal (the f16 values upcast exactly).
    let dir = common::tmpdir("builtin");
    let f32_path = dir.join("bccd-f32.safetensors");
    builtin.save(&f32_path, false).unwrap();
    assert!(std::fs::metadata(&f32_path).unwrap().len() > 28_000_000);
    let img = common::shared_dir().join("datasets/bccd/images/test");
    let mut imgs: Vec<_> = std::fs::read_dir(&img)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    imgs.sort();
    let cpu = candle_core::Device::Cpu;
    let a = yolo9::Detector::with_weights(&builtin, cpu.clone(), Default::default()).unwrap();
    let b = yolo9::Detector::new(&f32_path, cpu, Default::default()).unwrap();
    let mut total = 0;
    for p in imgs.iter().take(2) {
        let da = a.detect_file(p).unwrap();
        let db = b.detect_file(p).unwrap();
        assert_eq!(da.len(), db.len(), "{}", p.display());
        for (x, y) in da.iter().zip(&db) {
            assert_eq!(x.class_id, y.class_id);
            assert!((x.confidence - y.confidence).abs() <= 1e-6, "{x:?} {y:?}");
            for (u, v) in x.bbox.iter().zip(&y.bbox) {
                assert!((u - v).abs() <= 1e-3, "{x:?} {y:?}");
            }
        }
        total += da.len();
    }
    assert!(
        total >= 10,
        "only {total} cells found on two BCCD test images"
    );
}

/// Runs the program in `cwd` with `env`: (code, stdout, stderr).
fn run_in(cwd: &Path, env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_yolo9"));
    cmd.args(args).current_dir(cwd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run yolo9");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_program_detects_from_any_folder_offline_and_by_name() {
    // A folder outside the repository, no weights file in sight, no network.
    let dir = common::tmpdir("anywhere");
    assert!(!dir.starts_with(env!("CARGO_MANIFEST_DIR")));
    let img = dir.join("cells.jpg");
    let src = common::shared_dir().join("datasets/bccd/images/test");
    let first = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .min()
        .unwrap();
    std::fs::copy(&first, &img).unwrap();
    let home = dir.join("home");
    let home_s = home.to_str().unwrap();
    let offline = [("YOLO9_OFFLINE", "1"), ("YOLO9_HOME", home_s)];
    let (code, out, err) = run_in(&dir, &offline, &["detect", "cells.jpg", "--device", "cpu"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("built-in")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(notes[0].contains("--weights yolov9-s"), "{err}");
    assert!(out.contains("RBC"), "{out}");
    assert!(dir.join("runs/detect/exp/cells.jpg").is_file(), "{out}");
    // By name, offline and not cached: one line naming the file to place.
    let (code, _, err) = run_in(
        &dir,
        &offline,
        &["detect", "cells.jpg", "--weights", "yolov9-s"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("YOLO9_OFFLINE=1"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // By name from the loopback release: downloaded, verified, cached; the second run makes no
    // request.
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let online = [
        ("YOLO9_WEIGHTS_URL", server.base.as_str()),
        ("YOLO9_HOME", home_s),
    ];
    let args = [
        "detect",
        "cells.jpg",
        "--weights",
        "yolov9-s",
        "--device",
        "cpu",
        "--img",
        "320",
    ];
    let (code, out, err) = run_in(&dir, &online, &args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("sha256 9d0f09784ca50440e1fb1b97d7f54e0c28ebe10b6f2d908c42f4d0ab653c79bd"),
        "{err}"
    );
    assert!(!err.contains("built-in"), "{err}");
    assert_eq!(server.requests(), 1);
    let (code, out, err) = run_in(&dir, &online, &args);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!err.contains("sha256"), "{err}");
    assert_eq!(server.requests(), 1, "the second run makes no request");
}

#[test]
fn two_processes_fetching_one_name_at_once_leave_one_good_file() {
    let dir = common::tmpdir("race-processes");
    let home = dir.join("home");
    let server = Server::start(checkpoint(), |_| Reply::File { range: false });
    let spawn = |out: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_yolo9"))
            .args(["convert", "yolov9-s", "--half", "-o", out])
            .current_dir(&dir)
            .env("YOLO9_HOME", &home)
            .env("YOLO9_WEIGHTS_URL", &server.base)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let children = [spawn("a.safetensors"), spawn("b.safetensors")];
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let n = server.requests();
    assert!((1..=2).contains(&n), "{n} requests");
    assert_eq!(
        listing(&home),
        ["manifest/yolov9-s.json", "yolov9-s.safetensors"]
    );
    // Both wrote the same weights, and the cached file matches its record.
    assert_eq!(
        std::fs::read(dir.join("a.safetensors")).unwrap(),
        std::fs::read(dir.join("b.safetensors")).unwrap()
    );
    let path = hub::fetch_name("yolov9-s", &options(&home, &server.base)).unwrap();
    assert_eq!(server.requests(), n, "the next use is a cache hit");
    assert_eq!(
        yolo9::Weights::load(&path).unwrap().parameter_count(),
        9_804_512
    );
}

/// Issue 51: `--weights` given an existing folder or FIFO says what it is, not "not found"; a
/// name in the Ultralytics spelling gets the published name as a hint.
#[test]
fn weights_that_exist_but_are_not_files_say_what_they_are() {
    let d = common::tmpdir("weights-kind");
    let opts = options(&d.join("cache"), "http://127.0.0.1:9");
    let e = hub::resolve(&d, &opts).unwrap_err();
    let text = one_line(&e);
    assert!(matches!(e, HubError::NotAFile { .. }), "{text}");
    assert!(
        text.contains("is a directory, not a weights file"),
        "{text}"
    );
    let fifo = d.join("w.safetensors");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let text = one_line(&hub::resolve(&fifo, &opts).unwrap_err());
    assert!(
        text.contains("a FIFO") && text.contains("w.safetensors"),
        "{text}"
    );
    let text = one_line(&hub::resolve(std::path::Path::new("yolov9s"), &opts).unwrap_err());
    assert!(text.contains("did you mean yolov9-s?"), "{text}");
    let _ = std::fs::remove_dir_all(&d);
}
