//! Video files for `yolo9 detect`, read and written through the `ffmpeg` and `ffprobe`
//! programs over pipes (raw RGB24 frames), so no system library is linked and the default build
//! stays as it is.
//!
//! - [`is_video`]: a source is a video by its extension ([`VIDEO_EXTENSIONS`], as the official
//!   `VID_FORMATS`).
//! - [`probe`]: size, frame rate and (when the container says) frame count, from `ffprobe`.
//! - [`FrameReader`]: decoded frames in order, upright RGB8 at the probed size.
//! - [`FrameWriter`]: an H.264 MP4 at the source's frame rate, or stamped with the wall clock for
//!   a live source ([`FrameWriter::create_live`]) (`yuv420p`, the width and height padded to even
//!   numbers as the encoder needs).
//!
//! Both ffmpeg programs run in a process group of their own, so a Ctrl-C reaches yolo9 alone and
//! it finishes the annotated video (webcams and streams: `super::stream`).
//!
//! Errors name the file and, when `ffmpeg` is missing, say how to get it. A stream that ends in
//! the middle of a frame (a truncated file) ends the video there, with a note.

use anyhow::{bail, Context, Result};
use image::RgbImage;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Extensions treated as video (lower case), as the official `VID_FORMATS`.
pub const VIDEO_EXTENSIONS: &[&str] = &[
    "asf", "avi", "gif", "m4v", "mkv", "mov", "mp4", "mpeg", "mpg", "ts", "wmv", "webm",
];

/// Whether `path` names a video by its extension. GIF counts as video only when it is not read
/// as an image: `yolo9 detect` decodes GIFs as images (their first frame), so `gif` is left out
/// here.
pub fn is_video(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .is_some_and(|e| e != "gif" && VIDEO_EXTENSIONS.contains(&e.as_str()))
}

/// What [`probe`] reads of a video's first video stream.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoInfo {
    /// Frame width in pixels, upright (after the stream's rotation, as ffmpeg decodes it).
    pub width: u32,
    /// Frame height in pixels, upright.
    pub height: u32,
    /// Frames per second as the rational `num / den` ffprobe gives (`avg_frame_rate`).
    pub fps: (u32, u32),
    /// Frames, when the container records it.
    pub frames: Option<u64>,
}

impl VideoInfo {
    /// Frames per second as a float (25.0 when the stream gives none).
    pub fn fps_f64(&self) -> f64 {
        if self.fps.0 == 0 || self.fps.1 == 0 {
            25.0
        } else {
            self.fps.0 as f64 / self.fps.1 as f64
        }
    }
}

fn tool(name: &str) -> Command {
    let mut c = Command::new(name);
    c.stdin(Stdio::null());
    c
}

/// Starts the child in a process group of its own (Unix), so a Ctrl-C in the terminal reaches
/// yolo9 only: yolo9 then ends the video cleanly (the encoder finishes the file) instead of both
/// ffmpeg programs dying mid-file.
pub(crate) fn own_process_group(cmd: &mut Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    #[cfg(not(unix))]
    let _ = cmd;
}

/// Reads a child's stderr on a thread of its own (a full pipe would stall the child), for the
/// error message.
pub(crate) fn drain(err: Option<std::process::ChildStderr>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut e) = err {
            let _ = e.read_to_string(&mut s);
        }
        s
    })
}

pub(crate) fn missing(name: &str, e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!(
            "videos are read and written with the `{name}` program, which is not installed (or \
             not on PATH); install FFmpeg (Debian/Ubuntu: apt-get install ffmpeg; macOS: brew \
             install ffmpeg)"
        )
    } else {
        anyhow::anyhow!("cannot run `{name}`: {e}")
    }
}

/// The size, frame rate and frame count of `path`'s first video stream.
///
/// Errors: ffprobe missing, the file unreadable or without a video stream, sizes out of range
/// (each side 1..=16384).
pub fn probe(path: &Path) -> Result<VideoInfo> {
    let out = tool("ffprobe")
        .args([
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-show_entries",
            "stream=width,height,avg_frame_rate,nb_frames:stream_side_data=rotation",
            "-of",
            "default=noprint_wrappers=1",
        ])
        .arg(path)
        .output()
        .map_err(|e| missing("ffprobe", e))?;
    if !out.status.success() {
        bail!(
            "{}: ffprobe cannot read it: {}",
            crate::text::path(&path),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(str::trim)
    };
    let (Some(w), Some(h)) = (field("width"), field("height")) else {
        bail!(
            "{}: no video stream (ffprobe found none)",
            crate::text::path(&path)
        );
    };
    let (mut width, mut height): (u32, u32) = (
        w.parse()
            .with_context(|| format!("{}: width {w:?}", crate::text::path(&path)))?,
        h.parse()
            .with_context(|| format!("{}: height {h:?}", crate::text::path(&path)))?,
    );
    // ffmpeg turns frames upright by the stream's rotation (phone videos): a quarter turn
    // swaps the frame's sides.
    let rotation: f64 = field("rotation")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0.0);
    if (rotation.abs() - 90.0).abs() < 1.0 || (rotation.abs() - 270.0).abs() < 1.0 {
        std::mem::swap(&mut width, &mut height);
    }
    if !(1..=16_384).contains(&width) || !(1..=16_384).contains(&height) {
        bail!(
            "{}: frames of {width}x{height} are outside 1..=16384 pixels a side",
            crate::text::path(&path)
        );
    }
    let fps = field("avg_frame_rate")
        .and_then(|r| r.split_once('/'))
        .and_then(|(n, d)| Some((n.parse().ok()?, d.parse().ok()?)))
        .unwrap_or((0, 0));
    let frames = field("nb_frames").and_then(|n| n.parse().ok());
    Ok(VideoInfo {
        width,
        height,
        fps,
        frames,
    })
}

/// Decoded frames of a video, in order, as RGB8 at the probed size.
pub struct FrameReader {
    child: Child,
    out: ChildStdout,
    err: std::thread::JoinHandle<String>,
    width: u32,
    height: u32,
    path: String,
}

impl FrameReader {
    /// Starts decoding `path` (frames of `info`'s size).
    ///
    /// Errors: ffmpeg missing or failing to start.
    pub fn open(path: &Path, info: &VideoInfo) -> Result<Self> {
        let mut cmd = tool("ffmpeg");
        cmd.args(["-nostdin", "-v", "error", "-i"])
            .arg(path)
            .args(["-map", "0:v:0", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        own_process_group(&mut cmd);
        let mut child = cmd.spawn().map_err(|e| missing("ffmpeg", e))?;
        let out = child.stdout.take().context("ffmpeg stdout")?;
        let err = drain(child.stderr.take());
        Ok(FrameReader {
            child,
            out,
            err,
            width: info.width,
            height: info.height,
            path: crate::text::path(&path).to_string(),
        })
    }

    /// The next frame, or `None` at the end of the video (a partial last frame ends it too).
    ///
    /// Errors: a read failure of the pipe.
    pub fn next_frame(&mut self) -> Result<Option<RgbImage>> {
        let n = self.width as usize * self.height as usize * 3;
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match self.out.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).with_context(|| format!("{}: reading frames", self.path)),
            }
        }
        if got == 0 {
            return Ok(None);
        }
        if got < n {
            tracing::warn!(
                "{}: the last frame is incomplete ({got} of {n} bytes); the video ends there",
                self.path
            );
            return Ok(None);
        }
        Ok(RgbImage::from_raw(self.width, self.height, buf))
    }

    /// Waits for ffmpeg; its error output when it failed (a damaged stream), else `None`.
    pub fn finish(mut self) -> Option<String> {
        drop(self.out);
        let status = self.child.wait();
        let err = self.err.join().unwrap_or_default();
        match status {
            Ok(s) if s.success() && err.trim().is_empty() => None,
            Ok(_) => Some(err.trim().to_string()),
            Err(e) => Some(e.to_string()),
        }
    }
}

/// An H.264 MP4 written from RGB8 frames of one size.
pub struct FrameWriter {
    child: Child,
    stdin: Option<ChildStdin>,
    err: Option<std::thread::JoinHandle<String>>,
    width: u32,
    height: u32,
    path: String,
    /// The file written ([`crate::outfile::commit`]ted over `dest` by [`FrameWriter::finish`]).
    tmp: std::path::PathBuf,
    dest: std::path::PathBuf,
}

impl Drop for FrameWriter {
    /// A video not finished (an error on the way) leaves no temporary behind; once moved into
    /// place by [`FrameWriter::finish`] there is nothing at the temporary's name.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

impl FrameWriter {
    /// Starts encoding `path` (overwritten) at `fps` (`num / den`) for frames `width x height`.
    ///
    /// Errors: ffmpeg missing or failing to start.
    pub fn create(path: &Path, width: u32, height: u32, fps: (u32, u32)) -> Result<Self> {
        let rate = if fps.0 == 0 || fps.1 == 0 {
            "25".to_string()
        } else {
            format!("{}/{}", fps.0, fps.1)
        };
        Self::spawn(path, width, height, &["-r", &rate], &[])
    }

    /// Starts encoding `path` (overwritten) for frames `width x height` of a live source: each
    /// frame is stamped with the wall-clock time it is written (a variable frame rate), so the
    /// video plays at the pace the frames were detected, gaps of dropped frames included.
    ///
    /// Errors: ffmpeg missing or failing to start.
    pub fn create_live(path: &Path, width: u32, height: u32) -> Result<Self> {
        Self::spawn(
            path,
            width,
            height,
            &["-use_wallclock_as_timestamps", "1"],
            &["-vsync", "vfr"],
        )
    }

    fn spawn(
        path: &Path,
        width: u32,
        height: u32,
        input_rate: &[&str],
        output_rate: &[&str],
    ) -> Result<Self> {
        // ffmpeg writes a unique temporary beside `path` (refused first when `path` is not a
        // regular file); `finish` moves it into place.
        let none = crate::outfile::Inputs::none();
        let tmp = crate::outfile::temp_beside(path, ".mp4", &none)?;
        let mut cmd = tool("ffmpeg");
        cmd.args([
            "-nostdin", "-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24",
        ])
        .args(["-s", &format!("{width}x{height}")])
        .args(input_rate)
        .args(["-i", "-"])
        .args(output_rate)
        .args([
            "-vf",
            "pad=ceil(iw/2)*2:ceil(ih/2)*2",
            "-c:v",
            "libx264",
            "-pix_fmt",
            "yuv420p",
            "-movflags",
            "+faststart",
        ])
        .arg(&tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        own_process_group(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(missing("ffmpeg", e));
            }
        };
        let stdin = child.stdin.take();
        let err = Some(drain(child.stderr.take()));
        Ok(FrameWriter {
            child,
            stdin,
            err,
            width,
            height,
            path: crate::text::path(&path).to_string(),
            tmp,
            dest: path.to_path_buf(),
        })
    }

    /// The frame size, `(width, height)`.
    pub fn size(&self) -> (u32, u32) {
        (self.width, self.height)
    }

    /// Appends one frame (its size must be the writer's).
    ///
    /// Errors: another size, or the encoder stopped (its message).
    pub fn write(&mut self, frame: &RgbImage) -> Result<()> {
        if frame.dimensions() != (self.width, self.height) {
            bail!(
                "{}: frame of {:?}, the video is {}x{}",
                self.path,
                frame.dimensions(),
                self.width,
                self.height
            );
        }
        let Some(stdin) = self.stdin.as_mut() else {
            bail!("{}: the encoder is closed", self.path);
        };
        if stdin.write_all(frame.as_raw()).is_err() {
            let msg = self.close_with_error();
            bail!("{}: the encoder stopped: {msg}", self.path);
        }
        Ok(())
    }

    fn close_with_error(&mut self) -> String {
        drop(self.stdin.take());
        let _ = self.child.wait();
        let err = self
            .err
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        err.trim().to_string()
    }

    /// Closes the stream and waits for the file to be written.
    ///
    /// Errors: the encoder failed (its message).
    pub fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = self
            .child
            .wait()
            .with_context(|| format!("{}: waiting for ffmpeg", self.path))?;
        let err = self
            .err
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        if !status.success() {
            let _ = std::fs::remove_file(&self.tmp);
            bail!("{}: ffmpeg failed to write it: {}", self.path, err.trim());
        }
        crate::outfile::commit(&self.tmp, &self.dest, &crate::outfile::Inputs::none())
    }
}
