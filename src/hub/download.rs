//! One file over HTTP(S) into the cache folder (feature `download`): ureq with rustls, connect
//! and per-read timeouts, retries with exponential backoff on 5xx, 429, timeouts and resets,
//! resumption with `Range` when the server answers `206`, a size limit, and a progress bar
//! (size and rate) on a terminal.
//!
//! The body goes to a `.part` file no other writer uses ([`super::cache::Cache::temp_path`]),
//! fsynced; the caller checks it and renames the result into place, so two processes fetching
//! the same name leave one good file and never a torn one.

use super::error::HubError;
use super::options::HubOptions;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// What a finished download wrote.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Bytes in the file.
    pub bytes: u64,
    /// Attempts it took (1 = no retry).
    pub attempts: u32,
}

/// Why one attempt ended without the whole body.
enum Attempt {
    /// Worth another attempt (5xx, 429, timeout, reset, a body cut short): the reason.
    Retry(String),
    /// Final: the error to return.
    Fail(HubError),
}

/// Downloads `url` into `part` (created here, exclusively; appended to when the server resumes).
/// On error the `.part` file is removed.
///
/// Errors: [`HubError::Http`] for a 4xx answer (404: the file is not at that URL),
/// [`HubError::TooLarge`] over `opts.max_bytes`, [`HubError::Network`] when every attempt failed
/// (the last reason), [`HubError::Cache`] when the file cannot be written.
pub fn download(url: &str, part: &Path, opts: &HubOptions) -> Result<Fetched, HubError> {
    let r = download_inner(url, part, opts);
    if r.is_err() {
        let _ = std::fs::remove_file(part);
    }
    r
}

fn download_inner(url: &str, part: &Path, opts: &HubOptions) -> Result<Fetched, HubError> {
    let cache_err = |e: std::io::Error| HubError::Cache {
        path: part.to_path_buf(),
        message: format!("cannot write the download ({e})"),
    };
    // `part` is a name of this process's own (`Cache::temp_path`): created exclusively, so an
    // existing file or link of that name is never opened.
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(part)
        .map_err(cache_err)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_connect(Some(opts.timeout))
        .timeout_per_read(Some(opts.timeout))
        .timeout_recv_response(Some(opts.timeout))
        .http_status_as_error(false)
        .user_agent(concat!("yolo9/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let progress = Progress::new(opts.verbose, url);
    let attempts = opts.retries + 1;
    let mut last = String::new();
    for attempt in 1..=attempts {
        if attempt > 1 {
            let wait = opts.backoff * 2u32.saturating_pow(attempt - 2);
            progress.note(&format!(
                "{last}; retrying in {:.1} s (attempt {attempt} of {attempts})",
                wait.as_secs_f64()
            ));
            std::thread::sleep(wait);
        }
        match one_attempt(&agent, url, &mut file, opts, &progress) {
            Ok(bytes) => {
                file.sync_all().map_err(cache_err)?;
                progress.finish();
                return Ok(Fetched {
                    bytes,
                    attempts: attempt,
                });
            }
            Err(Attempt::Fail(e)) => {
                progress.finish();
                return Err(e);
            }
            Err(Attempt::Retry(why)) => last = why,
        }
    }
    progress.finish();
    Err(HubError::Network {
        url: url.to_string(),
        attempts,
        last,
    })
}

/// One request: resumes from the bytes already in `file` when there are some. Returns the size
/// of the complete file.
fn one_attempt(
    agent: &ureq::Agent,
    url: &str,
    file: &mut std::fs::File,
    opts: &HubOptions,
    progress: &Progress,
) -> Result<u64, Attempt> {
    let io = |e: std::io::Error| {
        Attempt::Fail(HubError::Cache {
            path: std::path::PathBuf::from(url),
            message: format!("cannot write the download ({e})"),
        })
    };
    let have = file.metadata().map_err(io)?.len();
    let mut req = agent.get(url);
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(e) => return Err(Attempt::Retry(describe(&e))),
    };
    let status = resp.status().as_u16();
    let header = |k: &str| {
        resp.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let length: Option<u64> = header("content-length").and_then(|v| v.trim().parse().ok());
    let start = match status {
        200 => 0,
        206 if have > 0 => {
            // `Content-Range: bytes START-END/TOTAL` must continue where the file ends.
            let from: Option<u64> = header("content-range").and_then(|v| {
                v.trim()
                    .strip_prefix("bytes ")
                    .and_then(|r| r.split('-').next())
                    .and_then(|s| s.trim().parse().ok())
            });
            if from != Some(have) {
                file.set_len(0).map_err(io)?;
                return Err(Attempt::Retry(format!(
                    "the server resumed at {from:?}, not at byte {have}; starting over"
                )));
            }
            have
        }
        429 | 500..=599 => return Err(Attempt::Retry(format!("HTTP {status}"))),
        _ => {
            return Err(Attempt::Fail(HubError::Http {
                url: url.to_string(),
                status,
            }))
        }
    };
    if start == 0 {
        file.set_len(0).map_err(io)?;
    }
    file.seek(std::io::SeekFrom::Start(start)).map_err(io)?;
    let total = length.map(|n| n + start);
    if let Some(t) = total {
        if t > opts.max_bytes {
            return Err(Attempt::Fail(HubError::TooLarge {
                url: url.to_string(),
                bytes: t,
                limit: opts.max_bytes,
            }));
        }
    }
    progress.start(total, start);
    let mut reader = resp.into_body().into_reader();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = start;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                file.flush().map_err(io)?;
                let of = total.map(|t| format!(" of {t}")).unwrap_or_default();
                return Err(Attempt::Retry(format!(
                    "the connection broke after {got}{of} bytes ({e})"
                )));
            }
        };
        got += n as u64;
        if got > opts.max_bytes {
            return Err(Attempt::Fail(HubError::TooLarge {
                url: url.to_string(),
                bytes: got,
                limit: opts.max_bytes,
            }));
        }
        file.write_all(&buf[..n]).map_err(io)?;
        progress.set(got);
    }
    if let Some(t) = total {
        if got < t {
            return Err(Attempt::Retry(format!(
                "the body ended after {got} of {t} bytes"
            )));
        }
    }
    Ok(got)
}

/// A one-line reason for a failed request.
fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(t) => format!("timed out ({t})"),
        ureq::Error::Io(io) => format!("connection error ({io})"),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        other => other.to_string(),
    }
}

/// The progress bar (size and rate) and retry notes on stderr, when `enabled`; indicatif draws
/// the bar only on a terminal.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    fn new(enabled: bool, url: &str) -> Self {
        if !enabled {
            return Self { bar: None };
        }
        let bar =
            indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
        bar.set_style(crate::progress::style(
            "{msg} {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {remaining}",
            0,
        ));
        let file = url.rsplit('/').next().unwrap_or(url).to_string();
        bar.set_message(file);
        Self { bar: Some(bar) }
    }

    fn start(&self, total: Option<u64>, at: u64) {
        if let Some(b) = &self.bar {
            if let Some(t) = total {
                b.set_length(t);
            }
            b.set_position(at);
        }
    }

    fn set(&self, at: u64) {
        if let Some(b) = &self.bar {
            b.set_position(at);
        }
    }

    fn note(&self, line: &str) {
        match &self.bar {
            Some(b) if !b.is_hidden() => b.println(line),
            Some(_) => crate::text::errln!("{line}"),
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
