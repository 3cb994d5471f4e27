//! The tracking job: the sources of [`crate::detect::job`] through the detector and ByteTrack
//! ([`ByteTracker`], one tracker per source) on videos, webcams, streams and image sequences (the
//! images of one folder, in name order, are the frames of one sequence): [`run`], the loop of
//! `yolo9 track` and of a Rust program that tracks.
//!
//! Outputs in the run folder: the annotated video `<stem>.mp4` (or annotated images for an image
//! sequence) with `#ID class score` on each box and a trail of its last `trail` centres;
//! `mot/<stem>.txt`, the MOTChallenge results (`frame,id,x,y,w,h,conf,-1,-1,-1`, source frame
//! numbers from 1); with `json`, `predictions.jsonl` rows with `track_id`; at the end per source
//! the number of tracks per class.
//!
//! Frame numbers are the source's: `vid_stride N` tracks frames 1, 1+N, ... and the filter
//! predicts N steps between them; a live stream's frames dropped while detecting count as a gap,
//! and so does the time a reconnection took (at `fps`), so IDs survive it.
//!
//! A video with tracking, through the library alone (the shipped clip, every 10th frame at 256
//! px, nothing drawn):
//!
//! ```
//! # fn main() -> anyhow::Result<()> {
//! use yolo9::detect::job::JobOptions;
//! use yolo9::track::job::{self, TrackOptions};
//! use yolo9::{Detector, DetectorConfig};
//! let weights = yolo9::Weights::builtin()?;
//! let track = TrackOptions::default();
//! // Low-score detections reach the tracker (conf = the tracker's low threshold, 0.1).
//! let config = track.detector_config(DetectorConfig { img_size: 256, ..DetectorConfig::default() });
//! let detector = Detector::with_weights(&weights, candle_core::Device::Cpu, config)?;
//! let dir = std::env::temp_dir().join(format!("yolo9-doc-track-{}", std::process::id()));
//! let mut opts = JobOptions { project: dir.clone(), vid_stride: 10, ..JobOptions::default() };
//! opts.output.nosave = true;
//! let video = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/videos/cells.mp4"));
//! job::run(&detector, &opts, &track, &[video], &[], &[], &yolo9::cancel::Cancel::never())?;
//! let mot = std::fs::read_to_string(dir.join("exp/mot/cells.txt"))?;
//! assert!(mot.lines().count() > 0);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
use crate::detect::detector::{Detection, Detector};
use crate::detect::frames::{FrameAt, FrameStage};
use crate::detect::job::JobOptions;
use crate::detect::output::{annotated_name, unique_stems};
use crate::detect::stream::StreamSource;
use crate::track::byte::{ByteTracker, Track, TrackerConfig};
use crate::track::clock::FrameClock;
use crate::track::draw::{clipped, draw_tracks, mot_line, ClassCounts};
use crate::track::trail::Trails;
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The tracking stage's settings.
#[derive(Debug, Clone)]
pub struct TrackOptions {
    /// ByteTrack's settings; `frame_rate` is replaced per source (a video's own rate, else
    /// [`TrackOptions::fps`]).
    pub tracker: TrackerConfig,
    /// Centres drawn as a trail behind each box (0: none).
    pub trail: u32,
    /// Frame rate of image sequences and live streams (videos use their own).
    pub fps: f64,
}

impl Default for TrackOptions {
    /// ByteTrack's defaults, trails of 30 centres, 30 fps.
    fn default() -> Self {
        Self {
            tracker: TrackerConfig::default(),
            trail: 30,
            fps: 30.0,
        }
    }
}

impl TrackOptions {
    /// `base` with the confidence threshold ByteTrack needs: the tracker's low threshold
    /// ([`TrackerConfig::track_low_thresh`], 0.1), so that the detections of its second
    /// association reach it (a detector at detect's 0.25 loses them; Ultralytics' `track`
    /// lowers `conf` to 0.1 the same way).
    pub fn detector_config(
        &self,
        base: crate::detect::config::DetectorConfig,
    ) -> crate::detect::config::DetectorConfig {
        crate::detect::config::DetectorConfig {
            conf: self.tracker.track_low_thresh,
            ..base
        }
    }

    /// The tracker's settings at `frame_rate`, checked ([`TrackerConfig::validate`]).
    pub fn config(&self, frame_rate: f64) -> Result<TrackerConfig> {
        let c = TrackerConfig {
            frame_rate,
            ..self.tracker
        };
        c.validate()?;
        Ok(c)
    }
}

/// One source's tracking state and outputs.
struct Sequence<'a> {
    source: String,
    stem: String,
    tracker: ByteTracker,
    trails: Trails,
    counts: ClassCounts,
    mot: std::io::BufWriter<std::fs::File>,
    names: &'a [String],
}

/// The run folder's shared outputs.
struct Run {
    dir: PathBuf,
    jsonl: Option<std::io::BufWriter<std::fs::File>>,
    job: JobOptions,
    track: TrackOptions,
}

impl<'a> Sequence<'a> {
    fn open(
        run: &Run,
        source: String,
        stem: String,
        fps: f64,
        names: &'a [String],
    ) -> Result<Self> {
        let mot_dir = run.dir.join("mot");
        std::fs::create_dir_all(&mot_dir)
            .with_context(|| format!("cannot create {}", crate::text::path(&mot_dir)))?;
        let mp = mot_dir.join(format!("{stem}.txt"));
        let f = crate::outfile::create_stream(&mp, &crate::outfile::Inputs::none())?;
        Ok(Self {
            source,
            stem,
            tracker: ByteTracker::new(run.track.config(fps)?)?,
            trails: Trails::new(run.track.trail.max(1) as usize),
            counts: ClassCounts::default(),
            mot: std::io::BufWriter::new(f),
            names,
        })
    }

    /// Tracks `dets` of source frame `frame` (of an image `size`), writes the MOT and jsonl rows
    /// and draws the frame on `canvas` when given.
    fn frame(
        &mut self,
        run: &mut Run,
        frame: u64,
        dets: &[Detection],
        size: (u32, u32),
        canvas: Option<&mut image::RgbImage>,
    ) -> Result<Vec<Track>> {
        let tracks = self
            .tracker
            .update(dets, frame)
            .with_context(|| format!("{} frame {frame}", self.source))?;
        self.trails.push(&tracks);
        self.counts.add(&tracks);
        for t in &tracks {
            writeln!(self.mot, "{}", mot_line(frame, t)).context("writing the MOT file")?;
        }
        if let Some(out) = run.jsonl.as_mut() {
            for t in &tracks {
                let mut line = serde_json::json!({
                    "image": self.source,
                    "frame": frame,
                    "track_id": t.id,
                    "class_id": t.class_id,
                    "class_name": self.names.get(t.class_id).cloned().unwrap_or_default(),
                    "confidence": t.score,
                    "xyxy": clipped(t, size),
                });
                if let Some(m) = dets.get(t.detection).and_then(|d| d.mask.as_ref()) {
                    // A segmentation model: the matched detection's outline.
                    line["polygon"] = serde_json::json!(m.polygon);
                }
                writeln!(out, "{line}").context("writing predictions.jsonl")?;
            }
            out.flush().context("writing predictions.jsonl")?;
        }
        if let Some(c) = canvas {
            // `--trail 0` keeps one point per ID: no segment is drawn.
            draw_tracks(
                c,
                &tracks,
                dets,
                &self.trails,
                self.names,
                &run.job.output.draw,
            )?;
        }
        Ok(tracks)
    }

    fn finish(mut self) -> Result<String> {
        self.mot.flush().context("writing the MOT file")?;
        Ok(format!(
            "{}: {} (mot/{}.txt)",
            self.source,
            self.counts.summary(self.names),
            self.stem
        ))
    }
}

/// Runs the tracking job: image sequences (the images of `files` grouped by folder, in order),
/// then the videos of `files`, then `streams`, each through the detector and its own tracker;
/// `skipped` are sources already refused (reported, counted); `cancel` stops a video or stream
/// cleanly. Prints a line per frame and a summary per source.
///
/// Errors: the tracker settings are invalid; the run folder cannot be created; no source could be
/// tracked; an inference or write error.
pub fn run(
    detector: &Detector,
    job: &JobOptions,
    track: &TrackOptions,
    files: &[PathBuf],
    skipped: &[(PathBuf, String)],
    streams: &[StreamSource],
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    for (p, why) in skipped {
        crate::detect::job::report_skipped(crate::text::path(&p), why);
    }
    let low = track.config(track.fps)?.track_low_thresh;
    let conf = detector.config().conf;
    if conf > low {
        crate::text::errln!(
            "note: detections scored between {low} and --conf {conf} never reach the tracker's \
             second association (--track-low-thresh {low}); lower --conf to {low} to keep them"
        );
    }
    let mut run = Run::open(job, track, files)?;
    let names = detector.names().to_vec();
    let (videos, images): (Vec<PathBuf>, Vec<PathBuf>) = files
        .iter()
        .cloned()
        .partition(|p| crate::detect::video::is_video(p));
    let seqs = image_sequences(images);
    let mut stems = Stems::default();
    let (mut n_ok, mut n_bad) = (0usize, skipped.len());
    let mut summaries = Vec::new();
    let total = seqs.len() + videos.len() + streams.len();
    let mut k = 0usize;
    for (folder, frames) in &seqs {
        k += 1;
        let base = folder
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "images".into());
        let stem = stems.unique(crate::detect::output::safe_dir_name(&base));
        let src = folder.to_string_lossy().into_owned();
        let mut seq = Sequence::open(&run, src, stem, track.fps, &names)?;
        track_images(
            detector,
            &mut run,
            &mut seq,
            frames,
            files,
            (k, total),
            cancel,
        )?;
        summaries.push(seq.finish()?);
        n_ok += 1;
    }
    for path in &videos {
        k += 1;
        if cancel.requested() {
            break;
        }
        let base = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "video".into());
        let stem = stems.unique(base);
        match track_video(detector, &mut run, path, &stem, &names, (k, total), cancel) {
            Ok(s) => {
                summaries.push(s);
                n_ok += 1;
            }
            Err(e) => {
                crate::detect::job::report_skipped(crate::text::path(&path), &format!("{e:#}"));
                n_bad += 1;
            }
        }
    }
    for st in streams {
        k += 1;
        if cancel.requested() {
            break;
        }
        let stem = stems.unique(st.stem());
        match track_stream(detector, &mut run, st, &stem, &names, (k, total), cancel) {
            Ok(s) => {
                summaries.push(s);
                n_ok += 1;
            }
            Err(e) => {
                crate::detect::job::report_skipped(st.name(), &format!("{e:#}"));
                n_bad += 1;
            }
        }
    }
    if let Some(mut j) = run.jsonl.take() {
        j.flush().context("writing predictions.jsonl")?;
    }
    for s in &summaries {
        crate::text::outln!("{s}");
    }
    crate::text::outln!("Results saved to {}", crate::text::path(&run.dir));
    crate::text::outln!("{n_ok} sources tracked, {n_bad} skipped");
    if n_ok == 0 {
        bail!("no source could be tracked ({n_bad} skipped, reasons above)");
    }
    Ok(())
}

impl Run {
    /// Claims the run folder (`--project`/`--name`; with `--exist-ok` one that holds none of
    /// `files`) and opens `predictions.jsonl` in it with `--json`.
    fn open(job: &JobOptions, track: &TrackOptions, files: &[PathBuf]) -> Result<Self> {
        let d = job;
        let inputs = files.iter().map(PathBuf::as_path);
        crate::runs::refuse_reused_dir(&d.project, &d.name, d.exist_ok, inputs)?;
        let dir =
            crate::runs::claim_run_dir(&d.project, &d.name, d.exist_ok).with_context(|| {
                format!(
                    "cannot create the run folder under {}",
                    crate::text::path(&d.project)
                )
            })?;
        let jsonl = if d.output.json {
            let p = dir.join("predictions.jsonl");
            let f = crate::outfile::create_stream(&p, &crate::outfile::Inputs::none())?;
            Some(std::io::BufWriter::new(f))
        } else {
            None
        };
        Ok(Run {
            dir,
            jsonl,
            job: job.clone(),
            track: track.clone(),
        })
    }
}

/// Image sequences: one per folder (with its images), in the order the files came.
fn image_sequences(images: Vec<PathBuf>) -> Vec<(PathBuf, Vec<PathBuf>)> {
    let mut seqs: Vec<(PathBuf, Vec<PathBuf>)> = Vec::new();
    for p in images {
        let parent = p.parent().map(Path::to_path_buf).unwrap_or_default();
        match seqs.iter_mut().find(|(d, _)| *d == parent) {
            Some((_, v)) => v.push(p),
            None => seqs.push((parent, vec![p])),
        }
    }
    seqs
}

/// The output stems of the run's sources, distinct: a repeated one gets `_2`, `_3`, ...
#[derive(Default)]
struct Stems {
    used: std::collections::HashSet<String>,
}

impl Stems {
    /// `base`, or the first of `base_2`, `base_3`, ... not given before.
    fn unique(&mut self, base: String) -> String {
        let mut stem = base.clone();
        let mut n = 1;
        while !self.used.insert(stem.clone()) {
            n += 1;
            stem = format!("{base}_{n}");
        }
        stem
    }
}

/// Tracks every `--vid-stride`-th image of the sequence `frames` (frames numbered from 1) into
/// `seq`; the annotated images go to `<run>/<stem>/` unless `--nosave` (never over one of
/// `files`). An image that cannot be read is skipped; `cancel` ends the sequence early.
fn track_images(
    detector: &Detector,
    run: &mut Run,
    seq: &mut Sequence<'_>,
    frames: &[PathBuf],
    files: &[PathBuf],
    (k, total): (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    let (vid_stride, nosave) = (run.job.vid_stride, run.job.output.nosave);
    let out_dir = run.dir.join(&seq.stem);
    let stems = unique_stems(frames);
    for (i, path) in frames.iter().enumerate() {
        if cancel.requested() {
            break;
        }
        let frame = i as u64 + 1;
        if !(frame - 1).is_multiple_of(vid_stride as u64) {
            continue;
        }
        let t0 = Instant::now();
        let img = match crate::data::image::load_rgb8(path) {
            Ok(i) => i,
            Err(e) => {
                crate::detect::job::report_skipped(crate::text::path(&path), &format!("{e:#}"));
                continue;
            }
        };
        let dets = detector
            .detect_rgb(&img)
            .with_context(|| format!("detecting {}", crate::text::path(&path)))?;
        let size = img.dimensions();
        let mut canvas = (!nosave).then_some(img);
        let tracks = seq.frame(run, frame, &dets, size, canvas.as_mut())?;
        crate::text::outln!(
            "sequence {k}/{total} (frame {frame}/{}) {}: {} tracks, {:.1}ms",
            frames.len(),
            crate::text::path(&path),
            tracks.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        if let Some(c) = canvas {
            std::fs::create_dir_all(&out_dir)
                .with_context(|| format!("cannot create {}", crate::text::path(&out_dir)))?;
            let op = out_dir.join(annotated_name(path, &stems[i]));
            crate::outfile::save_image(&c, &op, &crate::outfile::Inputs::of(files))
                .with_context(|| format!("cannot save {}", crate::text::path(&op)))?;
        }
    }
    Ok(())
}

/// Track's stage of the frame loop: the source's tracker (its frame index the source's frame
/// number; for a stream, plus after each reconnection the frames the outage lasted at `--fps`,
/// [`FrameClock`], so the filter steps over the gap and IDs survive), its MOT and jsonl rows,
/// and the tracks drawn for the annotated video.
struct TrackStage<'a, 'n> {
    run: &'a mut Run,
    seq: Sequence<'n>,
    clock: Option<FrameClock>,
}

impl FrameStage for TrackStage<'_, '_> {
    fn frame(
        &mut self,
        at: FrameAt,
        image: &mut image::RgbImage,
        dets: &[Detection],
        draw: bool,
    ) -> Result<String> {
        let index = match self.clock.as_mut() {
            Some(c) => c.index(at.frame, at.connection, at.outage),
            None => at.frame,
        };
        let size = image.dimensions();
        let tracks = self
            .seq
            .frame(self.run, index, dets, size, draw.then_some(image))?;
        Ok(format!("{} tracks", tracks.len()))
    }
}

/// Tracks every `--vid-stride`-th frame of a video ([`FrameLoop::video`]); the source's
/// summary.
fn track_video(
    detector: &Detector,
    run: &mut Run,
    path: &Path,
    stem: &str,
    names: &[String],
    at: (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<String> {
    let info = crate::detect::video::probe(path)?;
    let lp = run.job.frame_loop(detector, &run.dir, stem, at, cancel);
    let source = path.to_string_lossy().into_owned();
    let seq = Sequence::open(run, source, stem.to_string(), info.fps_f64(), names)?;
    let mut stage = TrackStage {
        run,
        seq,
        clock: None,
    };
    lp.video(path, &info, &mut stage)?;
    stage.seq.finish()
}

/// Tracks a webcam or stream until it ends or a stop request ([`FrameLoop::stream`]); the
/// source's summary with the frames tracked and the reopenings.
fn track_stream(
    detector: &Detector,
    run: &mut Run,
    src: &StreamSource,
    stem: &str,
    names: &[String],
    at: (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<String> {
    let lp = run.job.frame_loop(detector, &run.dir, stem, at, cancel);
    let fps = run.track.fps;
    let seq = Sequence::open(run, src.name(), stem.to_string(), fps, names)?;
    let mut stage = TrackStage {
        run,
        seq,
        clock: Some(FrameClock::new(fps)),
    };
    let s = lp.stream(src, &mut stage)?;
    let mut summary = stage.seq.finish()?;
    summary.push_str(&format!(
        "; {} of {} frames tracked, {} reopenings",
        s.delivered, s.read, s.reconnects
    ));
    Ok(summary)
}
