//! The detection job: sources → decode → [`Detector`] → sinks, the one frame loop of
//! `yolo9 detect` and of a Rust program that detects on files, videos, webcams and streams
//! ([`run`]). Tracking runs the same sources through [`crate::track::job`].
//!
//! Per image it prints `image 1/3 path: 448x640 25 RBC, 2 WBC, 12.3ms pre, 80.1ms infer, 0.4ms
//! nms` (the size is the letterboxed network input, H x W). Files that cannot be decoded are
//! skipped with one line each (`skipped path: reason`) and counted at the end.
//!
//! Outputs in the run folder (`project/name`, then `name2`, `name3`, ... unless `exist_ok`):
//! annotated images (unless `nosave`; inputs larger than 4096 px are drawn on a copy scaled to
//! 4096 px on the longer side), `labels/<stem>.txt` with `save_txt` (`cls cx cy w h [conf]`,
//! normalized, boxes rounded to whole pixels first as officially, numbers printed like Python's
//! `%g`), and `predictions.jsonl` with `json` (one object per detection, `xyxy` in original
//! pixels). Inputs with the same file stem (`a/same.jpg`, `b/same.png`) get unique output names
//! (`same`, `same_2`, ...; [`unique_stems`]), with a notice, so no output overwrites another.
//! Videos are written as `<stem>.mp4` (ffmpeg), every `vid_stride`-th frame detected; webcams and
//! streams give their newest frame each time ([`LiveReader`]).
//!
//! Memory: each image is decoded, letterboxed, and its full-resolution pixels are dropped at once
//! (only a ≤ 4096 px drawing copy is kept when saving), so a 108-MP input costs one decoded buffer.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use yolo9::detect::job::{self, JobOptions};
//! use yolo9::{Detector, DetectorConfig};
//! let weights = yolo9::Weights::builtin()?;
//! let detector = Detector::with_weights(&weights, candle_core::Device::Cpu, DetectorConfig::default())?;
//! let sources = yolo9::detect::source::expand_sources(&["examples/images".into()])?;
//! let opts = JobOptions { project: "runs/mine".into(), ..JobOptions::default() };
//! job::run(&detector, &opts, &sources.files, &sources.skipped, &[], &yolo9::cancel::Cancel::never())?;
//! # Ok(()) }
//! ```
use crate::data::image::load_rgb8;
use crate::detect::detector::Detector;
use crate::detect::draw::{canvas_for, draw_detections};
use crate::detect::frames::{FrameAt, FrameLoop, FrameStage};
use crate::detect::output::{
    annotated_name, count_summary, unique_stems, Item, SinkOptions, Sinks,
};
use crate::detect::stream::StreamSource;
use crate::runs::increment_path;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where a job writes, what it writes, and how it reads videos and streams (the run-folder and
/// source options of `yolo9 detect` and `yolo9 track`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct JobOptions {
    /// What is written into the run folder.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub output: SinkOptions,
    /// Parent folder of the run folder.
    #[cfg_attr(feature = "cli", arg(long, default_value = "runs/detect"))]
    pub project: PathBuf,
    /// Run folder name (exp, exp2, ... when it exists).
    #[cfg_attr(feature = "cli", arg(long, default_value = "exp"))]
    pub name: String,
    /// Reuse the run folder if it exists instead of incrementing.
    #[cfg_attr(feature = "cli", arg(long = "exist-ok"))]
    pub exist_ok: bool,
    /// Videos and streams: detect every N-th frame (the annotated video of a file keeps the
    /// source's frame rate).
    #[cfg_attr(feature = "cli", arg(long = "vid-stride", default_value = "1",
          value_parser = clap::value_parser!(u32).range(1..)))]
    pub vid_stride: u32,
    /// Webcams and streams: times a broken stream is reopened in a row (waiting 0.5, 1, 2, 4,
    /// 8 s) before it counts as ended; 0 ends it at the first break.
    #[cfg_attr(feature = "cli", arg(long = "stream-retries", default_value = "5",
          value_parser = clap::value_parser!(u32).range(0..=1000)))]
    pub stream_retries: u32,
}

impl Default for JobOptions {
    /// `yolo9 detect`'s defaults: `runs/detect/exp`, annotated images, every frame, 5 reopenings.
    fn default() -> Self {
        Self {
            output: SinkOptions::default(),
            project: PathBuf::from("runs/detect"),
            name: "exp".into(),
            exist_ok: false,
            vid_stride: 1,
            stream_retries: 5,
        }
    }
}

impl JobOptions {
    /// The frame loop of one video or stream of a detect or track job: `--vid-stride`,
    /// `--stream-retries`, and its annotated video `<stem>.mp4` in the run folder `dir` unless
    /// `--nosave`.
    pub(crate) fn frame_loop<'a>(
        &self,
        detector: &'a Detector,
        dir: &Path,
        stem: &str,
        at: (usize, usize),
        cancel: &'a crate::cancel::Cancel,
    ) -> FrameLoop<'a> {
        FrameLoop {
            detector,
            cancel,
            vid_stride: self.vid_stride,
            stream_retries: self.stream_retries,
            video: (!self.output.nosave).then(|| dir.join(format!("{stem}.mp4"))),
            at,
        }
    }
}

/// Runs the detection job: the image and video `files` in order (`skipped`: sources already
/// refused, reported and counted), then the webcams and streams `streams` (one after the other,
/// each until it ends or `cancel` asks to stop; a stop also ends a video file early and skips
/// what follows); prints a line per image or frame and a summary.
///
/// Errors: no source could be processed; an inference or write error (a source that cannot be
/// decoded is skipped, not an error).
pub fn run(
    detector: &Detector,
    opts: &JobOptions,
    files: &[PathBuf],
    skipped: &[(PathBuf, String)],
    streams: &[StreamSource],
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    for (p, why) in skipped {
        report_skipped(crate::text::path(&p), why);
    }
    let folder = RunFolder::open(opts, files)?;
    let mut sinks = Sinks::open(&folder.save_dir, opts.output.clone())?;
    let mut tally = Tally {
        bad: skipped.len(),
        ..Tally::default()
    };
    let total = files.len() + streams.len();
    let stems = unique_stems(files);
    for (k, path) in files.iter().enumerate() {
        if cancel.requested() {
            crate::text::errln!("stopped on request: the remaining sources are not read");
            break;
        }
        let stem = &stems[k];
        let own = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        if own.as_deref() != Some(stem.as_str()) && (opts.output.save_txt || !opts.output.nosave) {
            crate::text::errln!(
                "note: {} is saved as {stem} (an earlier input has the same name)",
                crate::text::path(&path)
            );
        }
        if crate::detect::video::is_video(path) {
            let at = (k + 1, total);
            match detect_video(detector, opts, path, stem, &mut sinks, at, cancel) {
                Ok(()) => {
                    tally.ok += 1;
                    tally.videos += 1;
                }
                Err(e) => {
                    report_skipped(crate::text::path(&path), &format!("{e:#}"));
                    tally.bad += 1;
                }
            }
            continue;
        }
        let job = ImageJob {
            detector,
            out: &opts.output,
            folder: &folder,
            at: (k + 1, total),
        };
        job.run(path, stem, &mut sinks, &mut tally)?;
    }
    detect_streams(
        detector, opts, streams, &stems, &mut sinks, &mut tally, cancel,
    );
    let n_labels = sinks.finish()?;
    let images_only = streams.is_empty() && tally.videos == 0;
    tally.print(detector, opts, &folder, n_labels, images_only);
    if tally.ok == 0 {
        bail!(
            "no image could be processed ({} skipped, reasons above)",
            tally.bad
        );
    }
    Ok(())
}

/// Prints `skipped SOURCE: REASON`, the one line of a source (a file, a video, a stream) that is
/// not processed; `source` as shown (`text::path` of a file, a stream's redacted name), `reason`
/// redacted and escaped ([`crate::text::message`]).
pub(crate) fn report_skipped(source: impl std::fmt::Display, reason: &str) {
    crate::text::errln!("skipped {source}: {}", crate::text::message(reason));
}

/// The run folder of `yolo9 detect`: claimed (created, numbered) only when something is saved.
struct RunFolder {
    /// Whether anything is written into it ([`SinkOptions::saving`]).
    saving: bool,
    /// The folder (`--project/--name`, numbered unless `--exist-ok`).
    save_dir: PathBuf,
    /// The inputs an annotated image must never be written onto.
    inputs: crate::outfile::Inputs,
}

impl RunFolder {
    /// Claims the run folder for `args` when saving; refuses a reused folder (`--exist-ok`)
    /// that holds one of the inputs `files`.
    fn open(opts: &JobOptions, files: &[PathBuf]) -> Result<Self> {
        let saving = opts.output.saving();
        let mut save_dir = increment_path(&opts.project, &opts.name, opts.exist_ok);
        if saving {
            let inputs = files.iter().map(PathBuf::as_path);
            crate::runs::refuse_reused_dir(&opts.project, &opts.name, opts.exist_ok, inputs)?;
            save_dir = crate::runs::claim_run_dir(&opts.project, &opts.name, opts.exist_ok)
                .with_context(|| {
                    format!(
                        "cannot create the run folder {}",
                        crate::text::path(&save_dir)
                    )
                })?;
        }
        // A reused folder (--exist-ok) was checked above; the images' identities also guard each
        // annotated image written (a hard link or symlink to an input in the folder).
        let inputs = if saving && opts.exist_ok {
            crate::outfile::Inputs::of(files)
        } else {
            crate::outfile::Inputs::none()
        };
        Ok(RunFolder {
            saving,
            save_dir,
            inputs,
        })
    }
}

/// The counters of a detect run: sources processed and skipped, images detected (videos print
/// their own per-frame times) and the summed per-image times in milliseconds.
#[derive(Default)]
struct Tally {
    ok: usize,
    bad: usize,
    images: usize,
    /// Video files processed (counted in `ok` too).
    videos: usize,
    pre_ms: f64,
    infer_ms: f64,
    nms_ms: f64,
}

impl Tally {
    /// The closing lines: mean speed per image, where the results are, how many sources.
    fn print(
        &self,
        detector: &Detector,
        opts: &JobOptions,
        folder: &RunFolder,
        n_labels: usize,
        images_only: bool,
    ) {
        if self.images > 0 {
            let d = self.images as f64;
            crate::text::outln!(
                "Speed: {:.1}ms pre-process, {:.1}ms inference, {:.1}ms NMS per image (size {})",
                self.pre_ms / d,
                self.infer_ms / d,
                self.nms_ms / d,
                detector.effective_img_size().unwrap_or(0)
            );
        }
        if folder.saving {
            let mut s = format!("Results saved to {}", crate::text::path(&folder.save_dir));
            if opts.output.save_txt {
                s.push_str(&format!(
                    "\n{n_labels} labels saved to {}",
                    crate::text::path(&folder.save_dir.join("labels"))
                ));
            }
            crate::text::outln!("{s}");
        }
        let (n_ok, n_bad) = (self.ok, self.bad);
        if images_only {
            let noun = if n_ok == 1 { "image" } else { "images" };
            crate::text::outln!("{n_ok} {noun} processed, {n_bad} skipped");
        } else {
            let noun = if n_ok == 1 { "source" } else { "sources" };
            crate::text::outln!("{n_ok} {noun} processed, {n_bad} skipped");
        }
    }
}

/// What the outputs of a detected image need of its pixels: the image itself for
/// `--save-crop` (drawn later), else at most a 4096-px copy to draw on (`canvas_for`), else
/// nothing.
#[allow(clippy::type_complexity)]
fn keep_for_outputs(
    img: image::RgbImage,
    out: &SinkOptions,
) -> (Option<image::RgbImage>, Option<(image::RgbImage, f64)>) {
    if out.save_crop {
        (Some(img), None)
    } else if !out.nosave {
        (None, Some(canvas_for(img)))
    } else {
        (None, None)
    }
}

/// Detection on one image file of a detect run.
struct ImageJob<'a> {
    detector: &'a Detector,
    out: &'a SinkOptions,
    folder: &'a RunFolder,
    /// `(k, total)`: the source's number (from 1) and the number of sources.
    at: (usize, usize),
}

impl ImageJob<'_> {
    /// Decodes, detects and writes the outputs of `path` (output name `stem`), with its progress
    /// line. An image that cannot be decoded or letterboxed is skipped (one line, counted in
    /// `tally.bad`); an inference or write error ends the run.
    fn run(&self, path: &Path, stem: &str, sinks: &mut Sinks, tally: &mut Tally) -> Result<()> {
        let (detector, out) = (self.detector, self.out);
        let t0 = Instant::now();
        let img = match load_rgb8(path) {
            Ok(i) => i,
            Err(e) => {
                // The error chain starts with the file name; print the reasons.
                let reason = e
                    .chain()
                    .skip(1)
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(": ");
                report_skipped(crate::text::path(&path), &reason);
                tally.bad += 1;
                return Ok(());
            }
        };
        let (w, h) = img.dimensions();
        if detector.config().tile.on() {
            return self.run_tiled(path, stem, img, t0, sinks, tally);
        }
        let (lb, info) = match detector.preprocess(&img) {
            Ok(x) => x,
            Err(e) => {
                report_skipped(crate::text::path(&path), &format!("{e:#}"));
                tally.bad += 1;
                return Ok(());
            }
        };
        // Without --save-crop, drop the full-resolution pixels now and keep at most a 4096-px
        // copy for drawing.
        let (full, canvas) = keep_for_outputs(img, out);
        let t1 = Instant::now();
        let (dets, t2) = if detector.is_seg() {
            // A segmentation model: forward, NMS and masks in one call, all counted as
            // inference.
            let d = detector
                .segment(&[&lb], &[info], &detector.nms_options())
                .with_context(|| format!("inference on {}", crate::text::path(&path)))?
                .pop()
                .unwrap_or_default();
            (d, Instant::now())
        } else {
            let y = detector
                .infer(&[&lb])
                .with_context(|| format!("inference on {}", crate::text::path(&path)))?;
            let t2 = Instant::now();
            (
                detector.postprocess(&y, &[info])?.pop().unwrap_or_default(),
                t2,
            )
        };
        let t3 = Instant::now();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let (p, i, n) = (ms(t0, t1), ms(t1, t2), ms(t2, t3));
        tally.pre_ms += p;
        tally.infer_ms += i;
        tally.nms_ms += n;
        tally.ok += 1;
        tally.images += 1;
        crate::text::outln!(
            "image {}/{} {}: {}x{} {}, {p:.1}ms pre, {i:.1}ms infer, {n:.1}ms nms",
            self.at.0,
            self.at.1,
            crate::text::path(&path),
            info.out_h(),
            info.out_w(),
            count_summary(&dets, detector.names())
        );
        self.write(path, stem, (w, h), &dets, full, canvas, sinks)
    }

    /// [`ImageJob::run`] with tiles ([`crate::detect::tile`]): the whole detection is one
    /// call, its time counted as inference.
    fn run_tiled(
        &self,
        path: &Path,
        stem: &str,
        img: image::RgbImage,
        t0: Instant,
        sinks: &mut Sinks,
        tally: &mut Tally,
    ) -> Result<()> {
        let (detector, out) = (self.detector, self.out);
        let (w, h) = img.dimensions();
        let tile = detector.config().tile;
        let n_tiles = crate::detect::tile::grid(w, h, tile.size, tile.overlap).len();
        let t1 = Instant::now();
        let dets = detector
            .detect_rgb(&img)
            .with_context(|| format!("inference on {}", crate::text::path(&path)))?;
        let t2 = Instant::now();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let (p, i) = (ms(t0, t1), ms(t1, t2));
        tally.pre_ms += p;
        tally.infer_ms += i;
        tally.ok += 1;
        tally.images += 1;
        let full = if n_tiles > 1 && tile.full_image {
            " + the whole image"
        } else {
            ""
        };
        crate::text::outln!(
            "image {}/{} {}: {w}x{h} in {n_tiles} tiles of {}{full} {}, {p:.1}ms decode, \
             {i:.1}ms tiled detection",
            self.at.0,
            self.at.1,
            crate::text::path(&path),
            tile.size,
            count_summary(&dets, detector.names())
        );
        let (full, canvas) = keep_for_outputs(img, out);
        self.write(path, stem, (w, h), &dets, full, canvas, sinks)
    }

    /// Writes the outputs of one detected image: the sinks' lines and crops (`full`: the
    /// image at full resolution, for crops), the annotated copy (`canvas` and its scale).
    #[allow(clippy::too_many_arguments)]
    fn write(
        &self,
        path: &Path,
        stem: &str,
        (w, h): (u32, u32),
        dets: &[crate::detect::detector::Detection],
        full: Option<image::RgbImage>,
        mut canvas: Option<(image::RgbImage, f64)>,
        sinks: &mut Sinks,
    ) -> Result<()> {
        let (detector, out) = (self.detector, self.out);
        let max_det = detector.config().max_det;
        if dets.len() >= max_det {
            crate::text::errln!(
                "note: {}: {} detections reached --max-det {max_det}; lower-confidence boxes were \
                 dropped (raise --max-det or --conf)",
                crate::text::path(&path),
                dets.len()
            );
        }
        let source = path.to_string_lossy();
        let item = Item {
            source: &source,
            stem,
            frame: None,
            size: (w, h),
        };
        sinks.write(item, dets, full.as_ref())?;
        if let Some(img) = full {
            if !out.nosave {
                canvas = Some(canvas_for(img));
            }
        }
        if let Some((mut canvas, scale)) = canvas {
            draw_detections(&mut canvas, dets, scale, &out.draw)?;
            let op = self.folder.save_dir.join(annotated_name(path, stem));
            if scale < 1.0 {
                crate::text::errln!(
                    "note: {} is {w}x{h}; the annotated copy is drawn at {}x{}",
                    crate::text::path(&path),
                    canvas.width(),
                    canvas.height()
                );
            }
            crate::outfile::save_image(&canvas, &op, &self.folder.inputs).with_context(|| {
                format!("cannot save the annotated image {}", crate::text::path(&op))
            })?;
        }
        Ok(())
    }
}

/// The webcams and streams of a detect run, after the files (whose output names are `stems`),
/// one after the other; a stream that fails is skipped (one line, counted).
fn detect_streams(
    detector: &Detector,
    opts: &JobOptions,
    streams: &[StreamSource],
    stems: &[String],
    sinks: &mut Sinks,
    tally: &mut Tally,
    cancel: &crate::cancel::Cancel,
) {
    let n_files = stems.len();
    let total = n_files + streams.len();
    let mut used = std::collections::HashSet::new();
    for (j, st) in streams.iter().enumerate() {
        if cancel.requested() {
            break;
        }
        // Two streams of one host get `<stem>`, `<stem>_2`, ...
        let base = st.stem();
        let mut stem = base.clone();
        let mut n = 1;
        while stems.contains(&stem) || !used.insert(stem.clone()) {
            n += 1;
            stem = format!("{base}_{n}");
        }
        let at = (n_files + j + 1, total);
        match detect_stream(detector, opts, st, &stem, sinks, at, cancel) {
            Ok(()) => tally.ok += 1,
            Err(e) => {
                report_skipped(st.name(), &format!("{e:#}"));
                tally.bad += 1;
            }
        }
    }
}

/// Detect's stage of the frame loop: per frame [`Sinks::write`] (labels `<stem>_<frame>.txt`,
/// `predictions.jsonl` lines with a `frame` field, crops), then the boxes drawn for the
/// annotated video.
struct DetectStage<'a> {
    sinks: &'a mut Sinks,
    source: String,
    stem: &'a str,
    names: &'a [String],
}

impl FrameStage for DetectStage<'_> {
    fn frame(
        &mut self,
        at: FrameAt,
        image: &mut image::RgbImage,
        dets: &[crate::detect::detector::Detection],
        draw: bool,
    ) -> Result<String> {
        let item = Item {
            source: &self.source,
            stem: self.stem,
            frame: Some(at.frame),
            size: image.dimensions(),
        };
        self.sinks.write(item, dets, Some(image))?;
        if draw {
            draw_detections(image, dets, 1.0, &self.sinks.options().draw)?;
        }
        Ok(count_summary(dets, self.names))
    }
}

/// Detection on every `--vid-stride`-th frame of a video ([`FrameLoop::video`]) with
/// [`DetectStage`]; a line saying where the annotated video went.
fn detect_video(
    detector: &Detector,
    opts: &JobOptions,
    path: &Path,
    stem: &str,
    sinks: &mut Sinks,
    at: (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    let info = crate::detect::video::probe(path)?;
    let lp = opts.frame_loop(detector, sinks.dir(), stem, at, cancel);
    let mut stage = DetectStage {
        sinks,
        source: path.to_string_lossy().into_owned(),
        stem,
        names: detector.names(),
    };
    let done = lp.video(path, &info, &mut stage)?;
    if let Some(out) = &lp.video {
        crate::text::outln!(
            "{}: {} of {} frames detected, saved to {}",
            crate::text::path(&path),
            done.detected,
            done.frames,
            crate::text::path(&out)
        );
    }
    Ok(())
}

/// Detection on a webcam or stream ([`FrameLoop::stream`]) with [`DetectStage`].
fn detect_stream(
    detector: &Detector,
    opts: &JobOptions,
    src: &StreamSource,
    stem: &str,
    sinks: &mut Sinks,
    at: (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    let lp = opts.frame_loop(detector, sinks.dir(), stem, at, cancel);
    let mut stage = DetectStage {
        sinks,
        source: src.name(),
        stem,
        names: detector.names(),
    };
    lp.stream(src, &mut stage).map(|_| ())
}
