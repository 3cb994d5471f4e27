//! The one frame loop of videos, webcams and streams, shared by the detect and track jobs: read
//! (every `--vid-stride`-th frame), detect, hand the frame to the job's [`FrameStage`] (detect's
//! outputs, or the tracker), print a progress line, and write the annotated video. A new
//! per-frame capability is a stage, not another loop.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use image::RgbImage;

use crate::cancel::Cancel;
use crate::detect::detector::{Detection, Detector};
use crate::detect::stream::{LiveReader, StreamOptions, StreamSource, StreamStats};
use crate::detect::video::{FrameReader, FrameWriter, VideoInfo};

/// Where a frame comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameAt {
    /// Its number in the source, from 1 (a stream's go on across reopenings).
    pub frame: u64,
    /// A stream's reopenings before it (0 for a video and a stream's first connection).
    pub connection: u64,
    /// How long a stream was away before that connection (zero for a video).
    pub outage: Duration,
}

/// What a job does with each detected frame.
pub(crate) trait FrameStage {
    /// The frame at `at`, detected (`dets` in the frame's pixels): the stage reads `image` for
    /// its outputs, then, when `draw`, draws on it (the frame then goes into the annotated
    /// video). Returns the progress line's account of the frame ("3 RBCs", "5 tracks").
    fn frame(
        &mut self,
        at: FrameAt,
        image: &mut RgbImage,
        dets: &[Detection],
        draw: bool,
    ) -> Result<String>;
}

/// The settings of one source's frame loop.
pub(crate) struct FrameLoop<'a> {
    pub detector: &'a Detector,
    pub cancel: &'a Cancel,
    /// Detect every n-th frame of a video (`--vid-stride`; a stream's reader skips them).
    pub vid_stride: u32,
    /// Reopenings of a stream that ended (`--stream-retries`).
    pub stream_retries: u32,
    /// The annotated video to write (`None` with `--nosave`).
    pub video: Option<PathBuf>,
    /// This source's place among the job's sources (1-based, for the progress lines).
    pub at: (usize, usize),
}

/// How a video's loop ended.
pub(crate) struct VideoDone {
    /// Frames read.
    pub frames: u64,
    /// Frames detected (every `--vid-stride`-th).
    pub detected: u64,
}

impl FrameLoop<'_> {
    /// Every `--vid-stride`-th frame of the video at `path` (probed as `info`; frames numbered
    /// from 1, as the official `LoadImages`) through the detector and `stage`, the annotated
    /// frames written at the source's frame rate. A stop request ends the video at the current
    /// frame, with a finished file. Errors: ffmpeg cannot read it, no frame decodes, an
    /// inference or write error.
    pub fn video(
        &self,
        path: &Path,
        info: &VideoInfo,
        stage: &mut dyn FrameStage,
    ) -> Result<VideoDone> {
        let mut reader = FrameReader::open(path, info)?;
        let mut writer = match &self.video {
            Some(out) => Some(FrameWriter::create(out, info.width, info.height, info.fps)?),
            None => None,
        };
        let of = info
            .frames
            .map(|n| n.to_string())
            .unwrap_or_else(|| "?".into());
        let (k, total) = self.at;
        let stride = u64::from(self.vid_stride.max(1));
        let (mut frame, mut detected) = (0u64, 0u64);
        while let Some(mut img) = reader.next_frame()? {
            if self.cancel.requested() {
                crate::text::errln!(
                    "stopped on request: {} ends at frame {frame}",
                    crate::text::path(&path)
                );
                break;
            }
            frame += 1;
            if !(frame - 1).is_multiple_of(stride) {
                continue;
            }
            let t0 = Instant::now();
            let dets = self
                .detector
                .detect_rgb(&img)
                .with_context(|| format!("frame {frame}"))?;
            detected += 1;
            let at = FrameAt {
                frame,
                connection: 0,
                outage: Duration::ZERO,
            };
            let said = stage.frame(at, &mut img, &dets, writer.is_some())?;
            crate::text::outln!(
                "video {k}/{total} (frame {frame}/{of}) {}: {said}, {:.1}ms",
                crate::text::path(&path),
                t0.elapsed().as_secs_f64() * 1e3
            );
            if let Some(w) = writer.as_mut() {
                w.write(&img)?;
            }
        }
        if let Some(msg) = reader.finish() {
            if !self.cancel.requested() {
                crate::text::errln!("note: {}: ffmpeg reported: {msg}", crate::text::path(&path));
            }
        }
        if let Some(w) = writer {
            w.finish()?;
        }
        if frame == 0 {
            bail!("no frame could be decoded");
        }
        Ok(VideoDone {
            frames: frame,
            detected,
        })
    }

    /// A webcam or stream ([`LiveReader`]: the newest frame each time, so a slow detector skips
    /// frames rather than lag behind) through the detector and `stage` until it ends (after
    /// `--stream-retries` reopenings) or a stop request; the annotated frames are written
    /// stamped with the wall clock, at the first frame's size (frames of another size are left
    /// out of the video, counted). Prints a summary line: frames read, detected, dropped,
    /// skipped by `--vid-stride`, damaged, reopenings, how it ended and where the video went.
    /// Errors: it cannot be opened, no frame arrives, an inference or write error.
    pub fn stream(&self, src: &StreamSource, stage: &mut dyn FrameStage) -> Result<StreamStats> {
        let name = src.name();
        let opts = StreamOptions {
            vid_stride: self.vid_stride,
            retries: self.stream_retries,
            ..StreamOptions::default()
        };
        let mut reader = LiveReader::open(src.clone(), opts)?;
        crate::text::errln!(
            "reading {name} ({}); Ctrl-C stops and finishes the outputs",
            if reader.is_live() {
                "live: the newest frame is detected, frames that arrive meanwhile are dropped"
            } else {
                "a file (a video or a picture): every frame"
            }
        );
        let (k, total) = self.at;
        let mut writer: Option<FrameWriter> = None;
        let mut off_size = 0u64;
        let result = (|| -> Result<()> {
            while let Some(mut f) = reader.next(self.cancel)? {
                let t0 = Instant::now();
                let dets = self
                    .detector
                    .detect_rgb(&f.image)
                    .with_context(|| format!("frame {}", f.frame))?;
                let size = f.image.dimensions();
                if let (Some(out), None) = (&self.video, &writer) {
                    writer = Some(FrameWriter::create_live(out, size.0, size.1)?);
                }
                // The video keeps its first frame size (a stream that changes size mid-way).
                let draw = writer.as_ref().is_some_and(|w| w.size() == size);
                off_size += u64::from(writer.is_some() && !draw);
                let at = FrameAt {
                    frame: f.frame,
                    connection: f.connection,
                    outage: f.outage,
                };
                let said = stage.frame(at, &mut f.image, &dets, draw)?;
                crate::text::outln!(
                    "stream {k}/{total} (frame {}, {} dropped) {name}: {said}, {:.1}ms",
                    f.frame,
                    reader.stats().dropped,
                    t0.elapsed().as_secs_f64() * 1e3
                );
                if let (true, Some(w)) = (draw, writer.as_mut()) {
                    w.write(&f.image)?;
                }
            }
            Ok(())
        })();
        let stopped = self.cancel.requested();
        reader.stop();
        let s = reader.stats();
        let finished = writer.map(|w| w.finish());
        let mut summary = format!(
            "{name}: {} of {} frames detected, {} dropped (detection slower than the stream), {} \
             skipped by --vid-stride, {} damaged, {} reopenings",
            s.delivered, s.read, s.dropped, s.strided, s.corrupt, s.reconnects
        );
        if off_size > 0 {
            summary.push_str(&format!(
                "; {off_size} frames of another size than the first are not in the video"
            ));
        }
        if stopped {
            summary.push_str("; stopped on request");
        } else if let Some(why) = reader.end_reason() {
            summary.push_str(&format!("; ended: {why}"));
        }
        match (&finished, &self.video) {
            (Some(Ok(())), Some(out)) => {
                summary.push_str(&format!(", saved to {}", crate::text::path(&out)))
            }
            (Some(Err(e)), _) => summary.push_str(&format!(
                ", the annotated video failed: {}",
                crate::text::message(&format!("{e:#}"))
            )),
            _ => {}
        }
        crate::text::outln!("{summary}");
        result?;
        if let Some(r) = finished {
            r?;
        }
        if s.delivered == 0 {
            bail!("no frame was detected");
        }
        Ok(s)
    }
}
