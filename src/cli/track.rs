//! `yolo9 track`: detection plus ByteTrack ([`crate::track::byte::ByteTracker`], one tracker per
//! source) on videos, webcams, streams and image sequences (the images of one folder, in name
//! order, are the frames of one sequence), with the sources and flags of `yolo9 detect` and the
//! tracker's settings under Ultralytics' names.
//!
//! Outputs in the run folder (`--project runs/track --name exp`): the annotated video
//! `<stem>.mp4` (or annotated images for an image sequence) with `#ID class score` on each box
//! and a trail of its last `--trail` centres; `mot/<stem>.txt`, the MOTChallenge results
//! (`frame,id,x,y,w,h,conf,-1,-1,-1`, source frame numbers from 1); with `--json`,
//! `predictions.jsonl` rows with `track_id`; at the end per source the number of tracks per class.
//!
//! Frame numbers are the source's: `--vid-stride N` tracks frames 1, 1+N, ... and the filter
//! predicts N steps between them; a live stream's frames dropped while detecting count as a gap,
//! and so does the time a reconnection took (at `--fps`), so IDs survive it.
use crate::cli::detect::{prepare, DetectArgs};
use crate::detect::detector::{Detection, Detector};
use crate::detect::output::{annotated_name, unique_stems};
use crate::detect::stream::{LiveReader, StreamOptions, StreamSource};
use crate::track::byte::{ByteTracker, Track, TrackerConfig};
use crate::track::clock::FrameClock;
use crate::track::draw::{clipped, draw_tracks, mot_line, ClassCounts};
use crate::track::trail::Trails;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `yolo9 track`.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("project", |a| a.default_value("runs/track")))]
pub struct TrackArgs {
    /// The sources and every option of `yolo9 detect`.
    #[command(flatten)]
    pub detect: DetectArgs,
    /// The tracker's settings.
    #[command(flatten)]
    pub tracker: TrackerArgs,
    /// Centres drawn as a trail behind each box (0: none).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=10000))]
    pub trail: u32,
    /// Frame rate of image sequences and live streams (videos use their own): the track buffer
    /// is in frames at 30 fps, scaled by it; a stream's reconnection time becomes frames at it.
    #[arg(long, default_value_t = 30.0, value_parser = positive_fps)]
    pub fps: f64,
}

fn positive_fps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 10000.0 => Ok(v),
        _ => Err(format!("{s}: a frame rate in 0..=10000 frames per second")),
    }
}

fn unit(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: a number between 0 and 1")),
    }
}

/// ByteTrack's settings ([`TrackerConfig`]; Ultralytics' `bytetrack.yaml` names and defaults).
#[derive(Debug, Clone, Args)]
pub struct TrackerArgs {
    /// Detections above this score are associated first.
    #[arg(long = "track-high-thresh", default_value_t = 0.5, value_parser = unit)]
    pub track_high_thresh: f32,
    /// Detections between this and --track-high-thresh are associated second (with tracks
    /// tracked on the previous frame only).
    #[arg(long = "track-low-thresh", default_value_t = 0.1, value_parser = unit)]
    pub track_low_thresh: f32,
    /// An unmatched detection at or above this score starts a track.
    #[arg(long = "new-track-thresh", default_value_t = 0.6, value_parser = unit)]
    pub new_track_thresh: f32,
    /// Frames a lost track is kept, at 30 fps (scaled by the source's frame rate).
    #[arg(long = "track-buffer", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(0..=100000))]
    pub track_buffer: u32,
    /// Largest matching distance (1 − IoU·score) of the first association.
    #[arg(long = "match-thresh", default_value_t = 0.8, value_parser = unit)]
    pub match_thresh: f32,
    /// Weigh the IoU by the detection score (true, false).
    #[arg(long = "fuse-score", default_value_t = true, action = clap::ArgAction::Set)]
    pub fuse_score: bool,
}

impl TrackerArgs {
    /// The tracker's settings at `frame_rate` (checked: [`TrackerConfig::validate`]).
    pub fn config(&self, frame_rate: f64) -> Result<TrackerConfig> {
        let c = TrackerConfig {
            track_high_thresh: self.track_high_thresh,
            track_low_thresh: self.track_low_thresh,
            new_track_thresh: self.new_track_thresh,
            track_buffer: self.track_buffer,
            match_thresh: self.match_thresh,
            fuse_score: self.fuse_score,
            frame_rate,
        };
        c.validate()?;
        Ok(c)
    }
}

/// Runs `yolo9 track`.
pub fn run(args: TrackArgs) -> Result<()> {
    // Settings are checked before the model loads.
    args.tracker.config(args.fps)?;
    let p = prepare(&args.detect)?;
    run_with(
        &p.detector,
        &args,
        &p.files,
        &p.skipped,
        &p.streams,
        &p.cancel,
    )
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
    args: TrackArgs,
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
            tracker: ByteTracker::new(run.args.tracker.config(fps)?)?,
            trails: Trails::new(run.args.trail.max(1) as usize),
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
                let line = serde_json::json!({
                    "image": self.source,
                    "frame": frame,
                    "track_id": t.id,
                    "class_id": t.class_id,
                    "class_name": self.names.get(t.class_id).cloned().unwrap_or_default(),
                    "confidence": t.score,
                    "xyxy": clipped(t, size),
                });
                writeln!(out, "{line}").context("writing predictions.jsonl")?;
            }
            out.flush().context("writing predictions.jsonl")?;
        }
        if let Some(c) = canvas {
            // `--trail 0` keeps one point per ID: no segment is drawn.
            draw_tracks(
                c,
                &tracks,
                &self.trails,
                self.names,
                &run.args.detect.output.draw,
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

/// [`run`] with a built detector (tests use a stand-in model): image sequences (files grouped by
/// folder, in order), then videos, then `streams`; `cancel` stops a video or stream cleanly.
pub fn run_with(
    detector: &Detector,
    args: &TrackArgs,
    files: &[PathBuf],
    skipped: &[(PathBuf, String)],
    streams: &[StreamSource],
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    for (p, why) in skipped {
        crate::text::errln!(
            "skipped {}: {}",
            crate::text::path(&p),
            crate::text::message(why)
        );
    }
    let mut run = Run::open(args, files)?;
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
        let mut seq = Sequence::open(&run, src, stem, args.fps, &names)?;
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
                crate::text::errln!(
                    "skipped {}: {}",
                    crate::text::path(&path),
                    crate::text::message(&format!("{e:#}"))
                );
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
                crate::text::errln!(
                    "skipped {}: {}",
                    st.name(),
                    crate::text::redact(&format!("{e:#}"))
                );
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
    fn open(args: &TrackArgs, files: &[PathBuf]) -> Result<Self> {
        let d = &args.detect;
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
            args: args.clone(),
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
    let (vid_stride, nosave) = (run.args.detect.vid_stride, run.args.detect.output.nosave);
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
                crate::text::errln!(
                    "skipped {}: {}",
                    crate::text::path(&path),
                    crate::text::message(&format!("{e:#}"))
                );
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

/// Tracks every `--vid-stride`-th frame of a video file (frames numbered from 1 as in
/// `detect`); the annotated video `<stem>.mp4` at the source's frame rate unless `--nosave`.
fn track_video(
    detector: &Detector,
    run: &mut Run,
    path: &Path,
    stem: &str,
    names: &[String],
    (k, total): (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<String> {
    use crate::detect::video::{probe, FrameReader, FrameWriter};
    let info = probe(path)?;
    let mut reader = FrameReader::open(path, &info)?;
    let nosave = run.args.detect.output.nosave;
    let stride = run.args.detect.vid_stride as u64;
    let out = run.dir.join(format!("{stem}.mp4"));
    let mut writer = if nosave {
        None
    } else {
        Some(FrameWriter::create(
            &out,
            info.width,
            info.height,
            info.fps,
        )?)
    };
    let source = path.to_string_lossy().into_owned();
    let mut seq = Sequence::open(run, source, stem.to_string(), info.fps_f64(), names)?;
    let mut frame = 0u64;
    while let Some(mut img) = reader.next_frame()? {
        if cancel.requested() {
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
        let dets = detector
            .detect_rgb(&img)
            .with_context(|| format!("frame {frame}"))?;
        let size = img.dimensions();
        let canvas = writer.is_some().then_some(&mut img);
        let tracks = seq.frame(run, frame, &dets, size, canvas)?;
        crate::text::outln!(
            "video {k}/{total} (frame {frame}) {}: {} tracks, {:.1}ms",
            crate::text::path(&path),
            tracks.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        if let Some(w) = writer.as_mut() {
            w.write(&img)?;
        }
    }
    let _ = reader.finish();
    if let Some(w) = writer {
        w.finish()?;
    }
    if frame == 0 {
        bail!("no frame could be decoded");
    }
    seq.finish()
}

/// Tracks a webcam or stream until it ends or a stop request. The tracker's frame index is the
/// stream's frame number plus, after each reconnection, the frames the outage lasted at `--fps`
/// (from the last frame read to the reopening; [`FrameClock`]), so the filter steps over the gap
/// and IDs survive.
fn track_stream(
    detector: &Detector,
    run: &mut Run,
    src: &StreamSource,
    stem: &str,
    names: &[String],
    (k, total): (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<String> {
    use crate::detect::video::FrameWriter;
    let opts = StreamOptions {
        vid_stride: run.args.detect.vid_stride,
        retries: run.args.detect.stream_retries,
        ..StreamOptions::default()
    };
    let mut reader = LiveReader::open(src.clone(), opts)?;
    let name = src.name();
    let fps = run.args.fps;
    let mut seq = Sequence::open(run, name.clone(), stem.to_string(), fps, names)?;
    let out = run.dir.join(format!("{stem}.mp4"));
    let mut writer: Option<FrameWriter> = None;
    let mut clock = FrameClock::new(fps);
    let result = (|| -> Result<()> {
        while let Some(mut f) = reader.next(cancel)? {
            let now = Instant::now();
            let index = clock.index(f.frame, f.connection, f.outage);
            let dets = detector
                .detect_rgb(&f.image)
                .with_context(|| format!("frame {}", f.frame))?;
            let size = f.image.dimensions();
            if !run.args.detect.output.nosave && writer.is_none() {
                writer = Some(FrameWriter::create_live(&out, size.0, size.1)?);
            }
            let same = writer.as_ref().is_some_and(|w| w.size() == size);
            let tracks = seq.frame(run, index, &dets, size, same.then_some(&mut f.image))?;
            crate::text::outln!(
                "stream {k}/{total} (frame {}) {name}: {} tracks, {:.1}ms",
                f.frame,
                tracks.len(),
                now.elapsed().as_secs_f64() * 1e3
            );
            if same {
                if let Some(w) = writer.as_mut() {
                    w.write(&f.image)?;
                }
            }
        }
        Ok(())
    })();
    reader.stop();
    let s = reader.stats();
    if let Some(w) = writer {
        w.finish()?;
    }
    result?;
    if s.delivered == 0 {
        bail!("no frame was tracked");
    }
    let mut summary = seq.finish()?;
    summary.push_str(&format!(
        "; {} of {} frames tracked, {} reopenings",
        s.delivered, s.read, s.reconnects
    ));
    Ok(summary)
}
