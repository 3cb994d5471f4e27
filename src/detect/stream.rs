//! Live sources for `yolo9 detect`: webcams and network streams, decoded by the `ffmpeg` program
//! over a pipe (as [`super::video`] reads files; nothing is linked).
//!
//! - [`StreamSource::parse`]: which sources are streams, as the official `detect.py`: a number
//!   (`0`, `1`, …) is a webcam (`/dev/videoN` through ffmpeg's `v4l2` input on Linux, the
//!   `avfoundation` device N on macOS); `rtsp://`, `rtmp://`, `http://`, `https://` URLs are
//!   streams. A path that exists is never a webcam.
//! - [`LiveReader`]: the frames. A reader thread decodes without pause; for a live source it
//!   keeps only the **newest** frame in a one-slot buffer, so when detection is slower than the
//!   stream the detector always gets the latest frame (never a growing backlog) and the frames it
//!   never saw are counted as dropped. An URL whose path ends in a video extension
//!   (`http://host/clip.mp4`) is a file, not a live stream: every frame is delivered, in order.
//!
//! Breaks: when ffmpeg ends or fails, or no frame arrives for [`StreamOptions::stall`], a live
//! stream is reopened after 0.5 s, 1 s, 2 s, … (at most 8 s), up to [`StreamOptions::retries`]
//! attempts in a row, each announced on stderr; after the last one the stream ends (an error
//! naming the source and ffmpeg's reason when no frame ever came). Each frame carries its
//! connection and how long the stream was away before it ([`LiveFrame::outage`]), which
//! `yolo9 track` turns into frames (`crate::track::clock`). A frame that arrives damaged
//! (a bad header, cut off when the connection broke) is skipped and counted
//! ([`StreamStats::corrupt`]); ffmpeg itself drops packets its demuxer flags as corrupt
//! (`-fflags +discardcorrupt`).
//!
//! Frames travel as PPM images (`-f image2pipe -c:v ppm`, RGB24): each carries its size, so no
//! separate probe has to connect to the stream first (a camera or a one-client server may accept
//! one connection only); the pixels are ffmpeg's RGB24 conversion, as for video files.
//!
//! Why one file (about 750 lines of code, then its unit tests): the reader thread, the
//! newest-frame hand-over, the reopening with back-off and the PPM frame parser are one live
//! source's reader.

use anyhow::{bail, Result};
use image::RgbImage;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;

/// A webcam or a stream URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSource {
    /// A webcam by index (`/dev/videoN` on Linux).
    Webcam(u32),
    /// An `rtsp://`, `rtmp://`, `http://` or `https://` URL.
    Url(String),
}

/// URL schemes read as streams (lower case), as the official `is_url` check of `detect.py`.
pub const STREAM_SCHEMES: &[&str] = &["rtsp://", "rtmp://", "http://", "https://"];

impl StreamSource {
    /// The stream `source` names, or `None` for a path (file, directory, glob). A string of
    /// digits is a webcam unless a file or folder of that name exists.
    /// Picture extensions of an URL read as one image rather than a live stream.
    const PICTURES: &'static [&'static str] =
        &["jpg", "jpeg", "png", "bmp", "tif", "tiff", "webp", "gif"];

    /// Parses a source: a webcam index or a stream URL; `None` for a path.
    pub fn parse(source: &str) -> Option<StreamSource> {
        let lower = source.to_ascii_lowercase();
        if STREAM_SCHEMES.iter().any(|s| lower.starts_with(s)) {
            return Some(StreamSource::Url(source.to_string()));
        }
        if !source.is_empty()
            && source.len() <= 3
            && source.bytes().all(|b| b.is_ascii_digit())
            && !Path::new(source).exists()
        {
            return source.parse().ok().map(StreamSource::Webcam);
        }
        None
    }

    /// Whether frames should be dropped when detection is slower (a camera or a live stream);
    /// `false` for an URL whose path ends in a video extension, read whole like a file.
    pub fn is_live(&self) -> bool {
        match self {
            StreamSource::Webcam(_) => true,
            StreamSource::Url(u) => {
                let path = u.split(['?', '#']).next().unwrap_or(u);
                let after_host = Path::new(path.splitn(4, '/').nth(3).unwrap_or(""));
                let image = after_host
                    .extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| Self::PICTURES.contains(&e.to_ascii_lowercase().as_str()));
                after_host.as_os_str().is_empty() || !(super::video::is_video(after_host) || image)
            }
        }
    }

    /// The source as shown in messages, logs and output files: as the user gave it (`0`, or the
    /// URL), with the URL's credentials redacted ([`crate::text::redact`]: `rtsp://user:***@host`).
    pub fn name(&self) -> String {
        match self {
            StreamSource::Webcam(i) => i.to_string(),
            StreamSource::Url(u) => crate::text::redact(u).into_owned(),
        }
    }

    /// A file stem for the outputs: `webcam0`, or the URL without its scheme and credentials,
    /// every character other than letters, digits, `.`, `-` made `_` (at most 60 characters).
    pub fn stem(&self) -> String {
        match self {
            StreamSource::Webcam(i) => format!("webcam{i}"),
            StreamSource::Url(u) => {
                let rest = u.split_once("://").map(|x| x.1).unwrap_or(u);
                let rest = rest.rsplit_once('@').map(|x| x.1).unwrap_or(rest);
                let s: String = rest
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .take(60)
                    .collect();
                let s = s.trim_matches('_').to_string();
                if s.is_empty() {
                    "stream".into()
                } else {
                    s
                }
            }
        }
    }

    /// ffmpeg's input arguments (`… -i INPUT`). Errors: a webcam whose device does not exist
    /// (naming it and the cameras there are), or webcams on a system without a known input.
    pub fn input_args(&self) -> Result<Vec<String>> {
        match self {
            // At most 2 s of probing before the first frame (ffmpeg's default is 5 s, whose
            // frames would then come in one burst).
            StreamSource::Url(u) if self.is_live() => Ok(vec![
                "-analyzeduration".into(),
                "2000000".into(),
                "-i".into(),
                u.clone(),
            ]),
            StreamSource::Url(u) => Ok(vec!["-i".into(), u.clone()]),
            StreamSource::Webcam(i) => webcam_args(*i),
        }
    }
}

#[cfg(target_os = "linux")]
fn webcam_args(i: u32) -> Result<Vec<String>> {
    let dev = PathBuf::from(format!("/dev/video{i}"));
    if !dev.exists() {
        let mut have: Vec<String> = std::fs::read_dir("/dev")
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("video"))
                    .map(|n| format!("/dev/{n}"))
                    .collect()
            })
            .unwrap_or_default();
        have.sort();
        bail!(
            "webcam {i}: {} does not exist (cameras here: {}); pass the index of a connected \
             camera, or a stream URL (rtsp://, rtmp://, http://)",
            crate::text::path(&dev),
            if have.is_empty() {
                "none".to_string()
            } else {
                have.join(", ")
            }
        );
    }
    Ok(vec![
        "-f".into(),
        "v4l2".into(),
        "-i".into(),
        crate::text::path(&dev).to_string(),
    ])
}

#[cfg(target_os = "macos")]
fn webcam_args(i: u32) -> Result<Vec<String>> {
    Ok(vec![
        "-f".into(),
        "avfoundation".into(),
        "-framerate".into(),
        "30".into(),
        "-i".into(),
        format!("{i}:none"),
    ])
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn webcam_args(i: u32) -> Result<Vec<String>> {
    bail!(
        "webcam {i}: webcams are read on Linux (v4l2) and macOS (avfoundation); on this system \
         pass a stream URL (rtsp://, rtmp://, http://)"
    )
}

/// How a [`LiveReader`] reads.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Deliver every N-th frame read (≥ 1; `--vid-stride`); the others are counted as skipped.
    pub vid_stride: u32,
    /// Reopen attempts in a row after a break (0: the first break ends the stream).
    pub retries: u32,
    /// The first wait before reopening; it doubles per attempt, at most 8 s.
    pub backoff: Duration,
    /// A connection without a frame for this long counts as broken (ffmpeg is stopped).
    pub stall: Duration,
}

impl Default for StreamOptions {
    /// Every frame, 5 attempts after 0.5, 1, 2, 4, 8 s, a 15 s stall limit.
    fn default() -> Self {
        StreamOptions {
            vid_stride: 1,
            retries: 5,
            backoff: Duration::from_millis(500),
            stall: Duration::from_secs(15),
        }
    }
}

/// Counts of what a [`LiveReader`] read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Whole frames decoded (the last frame number).
    pub read: u64,
    /// Frames handed to the caller.
    pub delivered: u64,
    /// Frames replaced by a newer one before the caller took them (detection slower than the
    /// stream).
    pub dropped: u64,
    /// Frames left out by `vid_stride`.
    pub strided: u64,
    /// Damaged frames skipped.
    pub corrupt: u64,
    /// Times the stream was reopened.
    pub reconnects: u64,
}

/// One delivered frame.
#[derive(Debug, Clone)]
pub struct LiveFrame {
    /// The pixels (RGB8, upright).
    pub image: RgbImage,
    /// Its number among all frames read, from 1, across reopenings.
    pub frame: u64,
    /// The connection it was read on: the reopenings before it (0 for the first).
    pub connection: u64,
    /// How long the stream was away before that connection: from the last frame read on an
    /// earlier one to the opening of this one (zero while no frame was read before it). The
    /// frames a new connection gathers while ffmpeg probes it come after, read and numbered.
    pub outage: Duration,
}

/// Why a stream ended.
#[derive(Debug, Clone)]
enum Ending {
    /// `stop` or a cancel.
    Stopped,
    /// The source ended, or the last attempt failed after frames came (the reason).
    Ended(String),
    /// No frame ever came (the error).
    Failed(String),
}

struct State {
    slot: Option<LiveFrame>,
    stats: StreamStats,
    ending: Option<Ending>,
    /// The last frame, or the start of the current connection.
    activity: Instant,
    /// When the last frame was read, on any connection.
    last_read: Option<Instant>,
    /// The current connection's [`LiveFrame::outage`].
    outage: Duration,
    stalled: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    child: Mutex<Option<Child>>,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn kill_child(&self) {
        if let Some(c) = self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            let _ = c.kill();
        }
    }
}

/// Frames of a webcam or stream, newest first (see the module docs).
pub struct LiveReader {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    source: StreamSource,
    live: bool,
    stall: Duration,
}

impl LiveReader {
    /// Starts reading `source`.
    ///
    /// Errors: a webcam device that does not exist, `vid_stride` 0. A stream that cannot be
    /// opened is retried first; its error comes from [`LiveReader::next`].
    pub fn open(source: StreamSource, opts: StreamOptions) -> Result<LiveReader> {
        if opts.vid_stride == 0 {
            bail!("vid_stride must be at least 1");
        }
        let input = source.input_args()?;
        let live = source.is_live();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slot: None,
                stats: StreamStats::default(),
                ending: None,
                activity: Instant::now(),
                last_read: None,
                outage: Duration::ZERO,
                stalled: false,
            }),
            cv: Condvar::new(),
            child: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let stall = opts.stall;
        let thread = {
            let (shared, name) = (shared.clone(), source.name());
            std::thread::Builder::new()
                .name("yolo9-stream".into())
                .spawn(move || read_loop(&shared, &name, &input, live, &opts))?
        };
        Ok(LiveReader {
            shared,
            thread: Some(thread),
            source,
            live,
            stall,
        })
    }

    /// The source.
    pub fn source(&self) -> &StreamSource {
        &self.source
    }

    /// Whether frames are dropped when the caller is slower ([`StreamSource::is_live`]).
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// The newest frame not yet taken, waiting for one; `None` once the stream ended (after
    /// its retries; see the module docs) or `cancel` asked to stop.
    ///
    /// Errors: the stream never gave a frame (ffmpeg's reason, after the retries; ffmpeg not
    /// installed).
    pub fn next(&mut self, cancel: &Cancel) -> Result<Option<LiveFrame>> {
        let sh = &self.shared;
        let mut st = sh.lock();
        loop {
            if cancel.requested() {
                drop(st);
                self.stop();
                return Ok(None);
            }
            if let Some(f) = st.slot.take() {
                st.stats.delivered += 1;
                sh.cv.notify_all();
                return Ok(Some(f));
            }
            match &st.ending {
                Some(Ending::Failed(e)) => {
                    let e = e.clone();
                    drop(st);
                    self.stop();
                    bail!("{}: {}", self.source.name(), crate::text::redact(&e));
                }
                Some(_) => return Ok(None),
                None => {}
            }
            if !st.stalled && st.activity.elapsed() > self.stall {
                st.stalled = true;
                sh.kill_child();
            }
            st = sh
                .cv
                .wait_timeout(st, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Why the stream ended by itself (the source ended, or reopening failed), once
    /// [`LiveReader::next`] returned `None`; `None` while running or after a stop.
    pub fn end_reason(&self) -> Option<String> {
        match &self.shared.lock().ending {
            Some(Ending::Ended(why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// What was read so far.
    pub fn stats(&self) -> StreamStats {
        self.shared.lock().stats.clone()
    }

    /// Stops ffmpeg and the reader thread (a frame not taken counts as dropped).
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.kill_child();
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut st = self.shared.lock();
        if st.slot.take().is_some() {
            st.stats.dropped += 1;
        }
        if st.ending.is_none() {
            st.ending = Some(Ending::Stopped);
        }
    }
}

impl Drop for LiveReader {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A frame read from the pipe, or why not.
#[derive(Debug)]
pub enum PpmRead {
    /// A whole frame.
    Frame(RgbImage),
    /// A damaged frame (the reason); the reader resynchronised on the next frame's start.
    Corrupt(String),
    /// The end of the pipe.
    End,
}

/// The next PPM (`P6`, maxval 255) frame of `r`, as ffmpeg's `image2pipe`/`ppm` writes them.
/// A bad header is skipped up to the next `P6` line start, a frame cut off by the end of the
/// pipe is [`PpmRead::Corrupt`]; sizes must be 1..=16384 a side.
///
/// Errors: a read failure of the pipe.
pub fn read_ppm(r: &mut impl BufRead) -> std::io::Result<PpmRead> {
    let mut tokens: Vec<String> = Vec::with_capacity(4);
    let mut cur = String::new();
    let mut header_len = 0usize;
    let mut byte = [0u8; 1];
    // Header: "P6" w h maxval, separated by whitespace, then one whitespace byte.
    loop {
        if r.read(&mut byte)? == 0 {
            return Ok(if tokens.is_empty() && cur.is_empty() && header_len == 0 {
                PpmRead::End
            } else {
                PpmRead::Corrupt("the stream ended inside a frame header".into())
            });
        }
        header_len += 1;
        let b = byte[0];
        if b.is_ascii_whitespace() {
            if !cur.is_empty() {
                tokens.push(std::mem::take(&mut cur));
                if tokens.len() == 4 {
                    break;
                }
            }
        } else if b == b'#' && tokens.len() < 4 && cur.is_empty() && !tokens.is_empty() {
            // A comment line.
            let mut skip = Vec::new();
            r.read_until(b'\n', &mut skip)?;
            header_len += skip.len();
        } else {
            cur.push(b as char);
        }
        let bad = (tokens.first().is_some_and(|t| t != "P6"))
            || (tokens.is_empty() && cur.len() >= 2 && cur != "P6")
            || cur.len() > 8
            || header_len > 64;
        if bad {
            let why = format!(
                "not a frame header ({:?})",
                tokens.join(" ") + if cur.is_empty() { "" } else { " " } + &cur
            );
            resync(r)?;
            return Ok(PpmRead::Corrupt(why));
        }
    }
    let num = |t: &str| t.parse::<u32>().ok();
    let (w, h, max) = (num(&tokens[1]), num(&tokens[2]), num(&tokens[3]));
    let (Some(w), Some(h), Some(255)) = (w, h, max) else {
        resync(r)?;
        return Ok(PpmRead::Corrupt(format!(
            "frame header {:?} is not an 8-bit RGB size",
            tokens.join(" ")
        )));
    };
    if !(1..=16_384).contains(&w) || !(1..=16_384).contains(&h) {
        resync(r)?;
        return Ok(PpmRead::Corrupt(format!(
            "frame of {w}x{h} is outside 1..=16384 pixels a side"
        )));
    }
    let n = w as usize * h as usize * 3;
    let mut buf = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Ok(PpmRead::Corrupt(format!(
                    "frame cut off ({got} of {n} bytes)"
                )))
            }
            Ok(k) => got += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(RgbImage::from_raw(w, h, buf)
        .map_or_else(|| PpmRead::Corrupt("frame buffer".into()), PpmRead::Frame))
}

/// Skips to just before the next line that starts with `P6` (or the end).
fn resync(r: &mut impl BufRead) -> std::io::Result<()> {
    // The magic at a line start: "\nP6" (or right here).
    let mut prev_nl = true;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut i = 0;
        while i < buf.len() {
            if prev_nl && buf[i] == b'P' && buf.get(i + 1) == Some(&b'6') {
                r.consume(i);
                return Ok(());
            }
            prev_nl = buf[i] == b'\n';
            i += 1;
        }
        let n = buf.len();
        r.consume(n);
    }
}

/// The reader thread: connections, frames into the slot, reopening with backoff.
fn read_loop(sh: &Shared, name: &str, input: &[String], live: bool, opts: &StreamOptions) {
    let mut attempt = 0u32;
    let mut ever = false;
    loop {
        if sh.stop.load(Ordering::SeqCst) {
            break;
        }
        {
            let mut st = sh.lock();
            let now = Instant::now();
            st.activity = now;
            st.outage = st.last_read.map_or(Duration::ZERO, |t| now - t);
            st.stalled = false;
        }
        let reason = match connect(sh, input) {
            Err(e) => {
                // ffmpeg itself is missing: no retry helps.
                let e = crate::text::redact(&format!("{e:#}")).into_owned();
                sh.lock().ending = Some(Ending::Failed(e));
                sh.cv.notify_all();
                return;
            }
            Ok((out, err)) => {
                let got = pump(sh, out, live, opts);
                if got {
                    ever = true;
                    attempt = 0;
                }
                let status = sh
                    .child
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .map(|mut c| c.wait());
                let text = err.join().unwrap_or_default();
                let last = text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| {
                    let l = l.trim();
                    // ffmpeg starts its message with the input's name; ours does already.
                    l.strip_prefix(&format!("{}: ", input[input.len() - 1]))
                        .unwrap_or(l)
                        .to_string()
                });
                let stalled = sh.lock().stalled;
                if stalled {
                    format!("no frame for {:.0} s", opts.stall.as_secs_f64())
                } else {
                    match (status, last) {
                        (_, Some(l)) => l,
                        (Some(Ok(s)), None) if s.success() => "the stream ended".into(),
                        (Some(Ok(s)), None) => format!("ffmpeg exited with {s}"),
                        (Some(Err(e)), None) => e.to_string(),
                        (None, None) => "ffmpeg stopped".into(),
                    }
                }
            }
        };
        // ffmpeg's messages may repeat the URL with its credentials.
        let reason = crate::text::redact(&reason).into_owned();
        if sh.stop.load(Ordering::SeqCst) {
            break;
        }
        // An URL whose content is one picture (a snapshot URL, a JPEG served over HTTP): ffmpeg
        // reads one frame and ends cleanly on the first connection. That is one image, not a
        // live stream to reopen for ever (each reopening gave the same picture again).
        let one_picture = live
            && matches!(input.last(), Some(u) if u.contains("://"))
            && reason == "the stream ended"
            && sh.lock().stats.read == 1
            && sh.lock().stats.reconnects == 0;
        let clean_end = (!live || one_picture) && reason == "the stream ended";
        if clean_end || attempt >= opts.retries || (!live && ever) {
            let why = if clean_end || (!live && ever) {
                reason
            } else if opts.retries == 0 {
                format!("{reason} (not reopened: --stream-retries 0)")
            } else {
                format!(
                    "{reason} (reopened {} times in a row without a frame: --stream-retries)",
                    opts.retries
                )
            };
            sh.lock().ending = Some(if ever {
                Ending::Ended(why)
            } else {
                Ending::Failed(why)
            });
            sh.cv.notify_all();
            return;
        }
        attempt += 1;
        let wait = opts
            .backoff
            .saturating_mul(1u32 << (attempt - 1).min(16))
            .min(Duration::from_secs(8));
        tracing::warn!(
            "{name}: {reason}; reopening in {:.1} s (attempt {attempt}/{})",
            wait.as_secs_f64(),
            opts.retries
        );
        let until = Instant::now() + wait;
        while Instant::now() < until && !sh.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
        }
        sh.lock().stats.reconnects += 1;
    }
    let mut st = sh.lock();
    if st.ending.is_none() {
        st.ending = Some(Ending::Stopped);
    }
    sh.cv.notify_all();
}

type Pipes = (std::process::ChildStdout, std::thread::JoinHandle<String>);

/// Starts ffmpeg on `input`; its stdout and a thread collecting its stderr.
fn connect(sh: &Shared, input: &[String]) -> Result<Pipes> {
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-nostdin", "-hide_banner", "-loglevel", "error"])
        .args(["-fflags", "+discardcorrupt"])
        .args(input)
        .args([
            "-map",
            "0:v:0",
            "-an",
            "-f",
            "image2pipe",
            "-c:v",
            "ppm",
            "-pix_fmt",
            "rgb24",
            "-",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    super::video::own_process_group(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| super::video::missing("ffmpeg", e))?;
    let out = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("ffmpeg stdout"))?;
    let err = super::video::drain(child.stderr.take());
    *sh.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
    Ok((out, err))
}

/// Reads frames until the pipe ends; whether any whole frame came.
fn pump(sh: &Shared, out: std::process::ChildStdout, live: bool, opts: &StreamOptions) -> bool {
    let mut r = BufReader::with_capacity(1 << 20, out);
    let mut got = false;
    loop {
        match read_ppm(&mut r) {
            Ok(PpmRead::Frame(image)) => {
                got = true;
                let mut st = sh.lock();
                st.stats.read += 1;
                st.activity = Instant::now();
                st.last_read = Some(st.activity);
                let frame = st.stats.read;
                if !(frame - 1).is_multiple_of(opts.vid_stride as u64) {
                    st.stats.strided += 1;
                    continue;
                }
                if !live {
                    // A file: wait until the caller took the previous frame.
                    while st.slot.is_some() && !sh.stop.load(Ordering::SeqCst) {
                        st = sh
                            .cv
                            .wait_timeout(st, Duration::from_millis(100))
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                        st.activity = Instant::now();
                    }
                }
                let frame = LiveFrame {
                    image,
                    frame,
                    connection: st.stats.reconnects,
                    outage: st.outage,
                };
                if st.slot.replace(frame).is_some() {
                    st.stats.dropped += 1;
                }
                sh.cv.notify_all();
            }
            Ok(PpmRead::Corrupt(why)) => {
                sh.lock().stats.corrupt += 1;
                tracing::debug!("skipped a damaged frame: {why}");
                if sh.stop.load(Ordering::SeqCst) {
                    return got;
                }
            }
            Ok(PpmRead::End) | Err(_) => return got,
        }
        if sh.stop.load(Ordering::SeqCst) {
            return got;
        }
    }
}

/// Splits `sources` into webcams/stream URLs ([`StreamSource::parse`]) and paths.
pub fn split_streams(
    sources: &[std::path::PathBuf],
) -> (Vec<StreamSource>, Vec<std::path::PathBuf>) {
    let mut streams = Vec::new();
    let mut paths = Vec::new();
    for s in sources {
        match s.to_str().and_then(StreamSource::parse) {
            Some(st) => streams.push(st),
            None => paths.push(s.clone()),
        }
    }
    (streams, paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ppm(w: u32, h: u32, v: u8) -> Vec<u8> {
        let mut b = format!("P6\n{w} {h}\n255\n").into_bytes();
        b.extend(std::iter::repeat_n(v, (w * h * 3) as usize));
        b
    }

    #[test]
    fn sources_are_classified_like_detect_py() {
        assert_eq!(StreamSource::parse("0"), Some(StreamSource::Webcam(0)));
        assert_eq!(StreamSource::parse("12"), Some(StreamSource::Webcam(12)));
        let u = "RTSP://cam.local:554/live?x=1";
        assert_eq!(StreamSource::parse(u), Some(StreamSource::Url(u.into())));
        assert_eq!(StreamSource::parse("img.jpg"), None);
        assert_eq!(StreamSource::parse("file://x.mp4"), None);
        assert_eq!(StreamSource::parse("src"), None);
        assert_eq!(StreamSource::parse("1234"), None);
        assert!(StreamSource::Webcam(0).is_live());
        assert!(StreamSource::Url("http://h:8080/live".into()).is_live());
        assert!(StreamSource::Url("rtsp://h/stream1".into()).is_live());
        assert!(!StreamSource::Url("https://h/clips/a.MP4?sig=1".into()).is_live());
        assert!(!StreamSource::Url("http://h/img/cells.JPG?x=1".into()).is_live());
        assert!(!StreamSource::Url("https://h/a.png".into()).is_live());
        assert_eq!(
            StreamSource::Url("rtsp://user:pw@10.0.0.2:554/h264/ch1".into()).stem(),
            "10.0.0.2_554_h264_ch1"
        );
        assert_eq!(StreamSource::Webcam(2).stem(), "webcam2");
    }

    #[test]
    fn ppm_frames_are_read_and_damaged_ones_skipped() {
        let mut bytes = ppm(2, 1, 7);
        bytes.extend(b"garbage that is no header\n");
        bytes.extend(ppm(1, 2, 9));
        bytes.extend(b"P6\n0 5\n255\n");
        bytes.extend(ppm(1, 1, 3));
        bytes.extend(b"P6\n4 4\n255\n0123");
        let mut r = std::io::Cursor::new(bytes);
        let mut seen = Vec::new();
        loop {
            match read_ppm(&mut r).unwrap() {
                PpmRead::Frame(f) => {
                    seen.push(format!("{}x{}:{}", f.width(), f.height(), f[(0, 0)][0]))
                }
                PpmRead::Corrupt(w) => seen.push(format!("corrupt {w}")),
                PpmRead::End => break,
            }
        }
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert_eq!(seen[0], "2x1:7");
        assert!(
            seen[1].starts_with("corrupt not a frame header"),
            "{seen:?}"
        );
        assert_eq!(seen[2], "1x2:9");
        assert!(seen[3].contains("0x5 is outside"), "{seen:?}");
        assert_eq!(seen[4], "1x1:3");
        assert_eq!(seen[5], "corrupt frame cut off (4 of 48 bytes)");
    }

    #[test]
    fn a_missing_webcam_is_named() {
        #[cfg(target_os = "linux")]
        {
            let e = LiveReader::open(StreamSource::Webcam(999), StreamOptions::default())
                .err()
                .unwrap()
                .to_string();
            assert!(
                e.contains("webcam 999: /dev/video999 does not exist"),
                "{e}"
            );
        }
    }
}
