//! `yolo9 detect`: detection on images, directories, globs, videos, webcams and streams, with the
//! flags of the official `detect_dual.py`.
//!
//! Per image it prints `image 1/3 path: 448x640 25 RBC, 2 WBC, 12.3ms pre, 80.1ms infer, 0.4ms
//! nms` (the size is the letterboxed network input, H x W). Files that cannot be decoded are
//! skipped with one line each (`skipped path: reason`) and counted at the end.
//!
//! Outputs in the run folder (`--project runs/detect --name exp`, then `exp2`, `exp3`, ...
//! unless `--exist-ok`): annotated images (unless `--nosave`; inputs larger than 4096 px are drawn
//! on a copy scaled to 4096 px on the longer side), `labels/<stem>.txt` with `--save-txt` (`cls cx
//! cy w h [conf]`, normalized, boxes rounded to whole pixels first as officially, numbers printed
//! like Python's `%g`), and `predictions.jsonl` with `--json` (one object per detection, `xyxy` in
//! original pixels). Inputs with the same file stem (`a/same.jpg`, `b/same.png`) get unique output
//! names (`same`, `same_2`, ...; [`unique_stems`]), with a notice, so no output overwrites another.
//!
//! Memory: each image is decoded, letterboxed, and its full-resolution pixels are dropped at once
//! (only a ≤ 4096 px drawing copy is kept when saving), so a 108-MP input costs one decoded buffer.
//!
//! Why one file (about 720 lines): the arguments of `yolo9 detect` (the detector's options, the
//! outputs and the drawing are the library's `DetectorConfig`, `SinkOptions` and `DrawOptions`,
//! flattened), the weights resolution `val` and `serve` share (`WeightsArgs`), and the per-source
//! loops with their progress lines (images, video files, webcams/streams); the outputs are
//! written by `crate::detect::output::Sinks`, the frames read by `crate::detect::video` and
//! `crate::detect::stream`.
use crate::data::image::load_rgb8;
use crate::detect::config::DetectorConfig;
use crate::detect::detector::Detector;
use crate::detect::draw::{canvas_for, draw_detections};
use crate::detect::letterbox::round_img_size;
pub use crate::detect::output::{annotated_name, count_summary, fmt_g, label_line, unique_stems};
use crate::detect::output::{Item, SinkOptions, Sinks};
use crate::detect::source::{expand_sources, Sources};
use crate::detect::stream::{LiveReader, StreamOptions, StreamSource};
use crate::device::{parse_device, DeviceSpec};
use crate::runs::increment_path;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Arguments of `yolo9 detect`.
#[derive(Debug, Clone, Args)]
pub struct DetectArgs {
    /// Image files, directories (not recursive), glob patterns ("imgs/**/*.jpg"), videos,
    /// webcam indices (0, 1, ...) or stream URLs (rtsp://, rtmp://, http(s)://).
    #[arg(required_unless_present = "source_flag")]
    pub source: Vec<PathBuf>,
    /// Sources, as the official --source (added to the positional ones).
    #[arg(long = "source", value_name = "SOURCE", num_args = 1..)]
    pub source_flag: Vec<PathBuf>,
    /// The weights and, optionally, the model they are.
    #[command(flatten)]
    pub model: WeightsArgs,
    /// Memory budget, e.g. 2GiB: images are detected one at a time, and the measured peak of
    /// one forward at --img must fit (checked before the first image).
    #[arg(long, value_parser = crate::parse::budget)]
    pub budget: Option<u64>,
    /// Inference size, thresholds, class filter and precision (the detector's options).
    #[command(flatten)]
    pub config: DetectorConfig,
    /// The device ([`crate::device::DEVICE_HELP`]).
    #[arg(long, default_value_t = DeviceSpec::Auto, value_parser = parse_device,
          allow_negative_numbers = true, help = crate::device::DEVICE_HELP)]
    pub device: DeviceSpec,
    /// What is written into the run folder.
    #[command(flatten)]
    pub output: SinkOptions,
    /// Parent folder of the run folder.
    #[arg(long, default_value = "runs/detect")]
    pub project: PathBuf,
    /// Run folder name (exp, exp2, ... when it exists).
    #[arg(long, default_value = "exp")]
    pub name: String,
    /// Reuse the run folder if it exists instead of incrementing.
    #[arg(long = "exist-ok")]
    pub exist_ok: bool,
    /// Videos and streams: detect every N-th frame (the annotated video of a file keeps the
    /// source's frame rate).
    #[arg(long = "vid-stride", default_value = "1",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub vid_stride: u32,
    /// Webcams and streams: times a broken stream is reopened in a row (waiting 0.5, 1, 2, 4,
    /// 8 s) before it counts as ended; 0 ends it at the first break.
    #[arg(long = "stream-retries", default_value = "5",
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub stream_retries: u32,
}

impl DetectArgs {
    /// The sources: the positional ones, then those of `--source`.
    pub fn sources(&self) -> Vec<PathBuf> {
        self.source
            .iter()
            .chain(&self.source_flag)
            .cloned()
            .collect()
    }
}

/// Splits `sources` into webcams/stream URLs ([`StreamSource::parse`]) and paths.
pub fn split_streams(sources: &[PathBuf]) -> (Vec<StreamSource>, Vec<PathBuf>) {
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

/// The `--img` actually used (next multiple of 32) and the notice to print when it changed.
pub fn effective_img(img: u32) -> (u32, Option<String>) {
    let r = round_img_size(img).unwrap_or(32);
    let note = (r != img)
        .then(|| format!("note: --img {img} is not a multiple of the stride 32; using --img {r}"));
    (r, note)
}

/// `--weights` and `--cfg`, the same in detect, val, serve and export.
#[derive(Debug, Clone, Args)]
pub struct WeightsArgs {
    /// Weights: a yolo9 .safetensors, a plain state_dict safetensors or an official .pt file; or
    /// the name of an official checkpoint (yolov9-s, yolov9-c-converted, gelan-c, ...: see the
    /// README's "Models"), downloaded once into the cache ($YOLO9_HOME, else ~/.cache/yolo9)
    /// [default: the built-in yolov9-s-bccd weights (BCCD blood cells)].
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// The model the weights are: a built-in name (yolov9-t/s/m/c/e, gelan-t/s/m/c/e) or a model
    /// yaml in the official format [default: recognised from the weights].
    #[arg(long)]
    pub cfg: Option<String>,
}

/// What a command names the built-in weights in its messages (its file stem names exports).
pub const BUILTIN_LABEL: &str = "built-in/yolov9-s-bccd.safetensors";

impl WeightsArgs {
    /// The weights these arguments name, loaded ([`resolve_weights`], [`load_weights`]):
    /// `(path, weights)`; for the built-in weights the path is [`BUILTIN_LABEL`] (no file).
    pub fn load(&self) -> Result<(PathBuf, crate::model::weights::Weights)> {
        self.load_resolved(resolve_weights(self.weights.as_deref())?)
    }

    /// [`WeightsArgs::load`] of what [`resolve_weights`] returned (a command resolves first,
    /// opens its device, then loads).
    pub fn load_resolved(
        &self,
        resolved: Option<PathBuf>,
    ) -> Result<(PathBuf, crate::model::weights::Weights)> {
        match resolved {
            Some(p) => {
                let w = load_weights(&p, self.cfg.as_deref())?;
                Ok((p, w))
            }
            None => Ok((
                PathBuf::from(BUILTIN_LABEL),
                builtin_weights(self.cfg.as_deref())?,
            )),
        }
    }
}

/// The built-in weights (feature `builtin-weights`, which `cli` enables), as the model `cfg` names
/// when given; prints the one line that says the built-in model runs
/// ([`crate::hub::BUILTIN_NOTE`]).
fn builtin_weights(cfg: Option<&str>) -> Result<crate::model::weights::Weights> {
    crate::text::errln!("{}", crate::hub::BUILTIN_NOTE);
    let w = crate::model::weights::Weights::builtin()?;
    match cfg {
        None => Ok(w),
        Some(c) => {
            let arch = crate::model::arch::Arch::from_cfg(c)?;
            Ok(w.with_arch(arch, &format!("--cfg {c}"))
                .context("the built-in weights")?)
        }
    }
}

/// Loads `path` ([`crate::model::weights::Weights::load`]) as the model `cfg` names when given (`--cfg`: a
/// built-in name such as `yolov9-c`, or a model yaml; see [`crate::model::weights::Weights::with_arch`]), else as
/// the model its keys or metadata say. Errors name the file and, with `--cfg`, the first tensor
/// that does not fit.
pub fn load_weights(path: &Path, cfg: Option<&str>) -> Result<crate::model::weights::Weights> {
    let w = crate::model::weights::Weights::load(path)
        .with_context(|| format!("--weights {}", crate::text::path(&path)))?;
    match cfg {
        None => Ok(w),
        Some(c) => {
            let arch = crate::model::arch::Arch::from_cfg(c)?;
            w.with_arch(arch, &format!("--cfg {c}"))
                .with_context(|| format!("--weights {}", crate::text::path(&path)))
        }
    }
}

/// The weights file of `--weights`: an existing path as given, else an official checkpoint by
/// name (`yolov9-s`, `gelan-c.pt`), from the cache or downloaded ([`weights_file`]); `None`
/// without `--weights`: the built-in weights. Errors name the value and what to pass.
pub fn resolve_weights(arg: Option<&Path>) -> Result<Option<PathBuf>> {
    arg.map(weights_file).transpose()
}

/// The file a weights value means (`--weights` of every command, `convert`'s input): an existing
/// path as given; a name of the official release resolved through the cache
/// ([`crate::hub::resolve`], options from the environment); anything else an error naming the
/// value and listing the published names.
pub fn weights_file(p: &Path) -> Result<PathBuf> {
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    let text = p.to_string_lossy();
    if !crate::hub::registry::looks_like_name(&text) {
        bail!(
            "weights file {} not found; pass an existing .safetensors or .pt, or the name of an \
             official checkpoint ({})",
            crate::text::path(p),
            crate::hub::registry::published_names()
        );
    }
    let opts = crate::hub::HubOptions::from_env()?;
    Ok(crate::hub::resolve(p, &opts)?)
}

/// What `yolo9 detect` and `yolo9 track` set up before the first image: the detector, the
/// sources (files, those already refused, webcams/streams) and the stop flag.
pub struct Prepared {
    /// The detector (weights loaded, `--img` rounded, memory checked).
    pub detector: Detector,
    /// Image and video files, in order.
    pub files: Vec<PathBuf>,
    /// Sources refused while expanding (path, reason).
    pub skipped: Vec<(PathBuf, String)>,
    /// Webcams and stream URLs.
    pub streams: Vec<StreamSource>,
    /// Ctrl-C / SIGTERM for videos and streams (never for images only).
    pub cancel: crate::cancel::Cancel,
}

/// Runs `yolo9 detect`.
pub fn run(args: DetectArgs) -> Result<()> {
    let p = prepare(&args)?;
    run_with_streams(
        &p.detector,
        &args,
        &p.files,
        &p.skipped,
        &p.streams,
        &p.cancel,
    )
}

/// The set-up of [`run`] ([`Prepared`]): the notices of `--img` and `--device` printed, a
/// missing webcam, unknown weights, a class the model lacks or a size over the memory budget
/// refused before any work.
pub fn prepare(args: &DetectArgs) -> Result<Prepared> {
    let (img, note) = effective_img(args.config.img_size);
    if let Some(n) = note {
        crate::text::errln!("{n}");
    }
    let (streams, paths) = split_streams(&args.sources());
    let sources = if paths.is_empty() {
        Sources::default()
    } else {
        expand_sources(&paths)?
    };
    // A missing webcam is named before the model loads.
    for st in &streams {
        st.input_args()?;
    }
    let resolved = resolve_weights(args.model.weights.as_deref())?;
    let (device, notice) = crate::device::open(args.device)?;
    if let Some(n) = notice {
        crate::text::errln!("{n}");
    }
    // The size against the memory before any work: one image at a time.
    crate::footprint::check_device(
        &crate::footprint::Request {
            what: "detect",
            work: crate::footprint::Work::Infer,
            img,
            images: 1,
            batch_option: None,
            split_option: None,
        },
        &device,
        args.budget,
    )?;
    let dtype = inference_dtype(args.config.half, &device);
    let (weights, w) = args.model.load_resolved(resolved)?;
    if let Some(budget) = args.budget {
        let m = crate::model::yolov9::YoloV9::load_dtype(&w, &device, dtype)?;
        let probe = crate::memory::MemoryProbe::new(&device)?;
        let d = crate::budget::plan_inference(&m, img, 1, budget, &probe)?;
        crate::text::outln!(
            "memory budget {}: one image at --img {img} peaks at {} ({}); images are processed one at a time",
            crate::memory::fmt_size(budget),
            crate::memory::fmt_size(d.measured),
            d.what
        );
    }
    // Ctrl-C (or SIGTERM) ends a video or stream cleanly: the annotated video is finished; a
    // second one exits at once.
    let has_video = sources
        .files
        .iter()
        .any(|p| crate::detect::video::is_video(p));
    let cancel = if streams.is_empty() && !has_video {
        crate::cancel::Cancel::never()
    } else {
        crate::train::guard::StopFlag::install()?.cancel()
    };
    check_classes(args.config.classes.as_deref(), &w.meta.names)?;
    let config = DetectorConfig {
        img_size: img,
        ..args.config.clone()
    };
    let detector = Detector::with_weights(&w, device, config)
        .with_context(|| format!("building the model from {}", crate::text::path(&weights)))?;
    Ok(Prepared {
        detector,
        files: sources.files,
        skipped: sources.skipped,
        streams,
        cancel,
    })
}

/// `--classes` against the model's classes `names`: a class id the model lacks is refused before
/// any work, with the model's classes listed.
pub(crate) fn check_classes(classes: Option<&[usize]>, names: &[String]) -> Result<()> {
    if let Some(bad) = classes.and_then(|cs| cs.iter().find(|&&c| c >= names.len())) {
        bail!(
            "--classes {bad}: the model has {} classes (0..={}: {})",
            names.len(),
            names.len().saturating_sub(1),
            names.join(", ")
        );
    }
    Ok(())
}

/// The network dtype for `--half` on `device` ([`crate::detect::config::inference_dtype`]), with
/// a notice when `--half` has no effect (on the CPU).
pub fn inference_dtype(half: bool, device: &candle_core::Device) -> candle_core::DType {
    if half && device.is_cpu() {
        crate::text::errln!("--half has no effect on the CPU: the network runs in f32");
    }
    crate::detect::config::inference_dtype(half, device)
}

/// The detect loop with an already built detector (used by `run` and by tests with a stand-in
/// model). `skipped` are sources already rejected by [`expand_sources`].
pub fn run_with(
    detector: &Detector,
    args: &DetectArgs,
    files: &[PathBuf],
    skipped: &[(PathBuf, String)],
) -> Result<()> {
    run_with_streams(
        detector,
        args,
        files,
        skipped,
        &[],
        &crate::cancel::Cancel::never(),
    )
}

/// [`run_with`], then the webcams and streams `streams` (one after the other, each until it
/// ends or `cancel` asks to stop; a stop also ends a video file early and skips what follows).
pub fn run_with_streams(
    detector: &Detector,
    args: &DetectArgs,
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
    let folder = RunFolder::open(args, files)?;
    let mut sinks = Sinks::open(&folder.save_dir, args.output.clone())?;
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
        if own.as_deref() != Some(stem.as_str()) && (args.output.save_txt || !args.output.nosave) {
            crate::text::errln!(
                "note: {} is saved as {stem} (an earlier input has the same name)",
                crate::text::path(&path)
            );
        }
        if crate::detect::video::is_video(path) {
            let at = (k + 1, total);
            match detect_video(detector, args, path, stem, &mut sinks, at, cancel) {
                Ok(()) => tally.ok += 1,
                Err(e) => {
                    crate::text::errln!(
                        "skipped {}: {}",
                        crate::text::path(&path),
                        crate::text::message(&format!("{e:#}"))
                    );
                    tally.bad += 1;
                }
            }
            continue;
        }
        let job = ImageJob {
            detector,
            out: &args.output,
            folder: &folder,
            at: (k + 1, total),
        };
        job.run(path, stem, &mut sinks, &mut tally)?;
    }
    detect_streams(
        detector, args, streams, &stems, &mut sinks, &mut tally, cancel,
    );
    let n_labels = sinks.finish()?;
    tally.print(detector, args, &folder, n_labels, streams.is_empty());
    if tally.ok == 0 {
        bail!(
            "no image could be processed ({} skipped, reasons above)",
            tally.bad
        );
    }
    Ok(())
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
    fn open(args: &DetectArgs, files: &[PathBuf]) -> Result<Self> {
        let saving = args.output.saving();
        let mut save_dir = increment_path(&args.project, &args.name, args.exist_ok);
        if saving {
            let inputs = files.iter().map(PathBuf::as_path);
            crate::runs::refuse_reused_dir(&args.project, &args.name, args.exist_ok, inputs)?;
            save_dir = crate::runs::claim_run_dir(&args.project, &args.name, args.exist_ok)
                .with_context(|| {
                    format!(
                        "cannot create the run folder {}",
                        crate::text::path(&save_dir)
                    )
                })?;
        }
        // A reused folder (--exist-ok) was checked above; the images' identities also guard each
        // annotated image written (a hard link or symlink to an input in the folder).
        let inputs = if saving && args.exist_ok {
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
    pre_ms: f64,
    infer_ms: f64,
    nms_ms: f64,
}

impl Tally {
    /// The closing lines: mean speed per image, where the results are, how many sources.
    fn print(
        &self,
        detector: &Detector,
        args: &DetectArgs,
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
            if args.output.save_txt {
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
            crate::text::outln!("{n_ok} sources processed, {n_bad} skipped");
        }
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
                crate::text::errln!(
                    "skipped {}: {}",
                    crate::text::path(&path),
                    crate::text::message(&reason)
                );
                tally.bad += 1;
                return Ok(());
            }
        };
        let (w, h) = img.dimensions();
        let (lb, info) = match detector.preprocess(&img) {
            Ok(x) => x,
            Err(e) => {
                crate::text::errln!(
                    "skipped {}: {}",
                    crate::text::path(&path),
                    crate::text::message(&format!("{e:#}"))
                );
                tally.bad += 1;
                return Ok(());
            }
        };
        // Without --save-crop, drop the full-resolution pixels now and keep at most a 4096-px
        // copy for drawing.
        let mut full = None;
        let mut canvas = None;
        if out.save_crop {
            full = Some(img);
        } else if !out.nosave {
            canvas = Some(canvas_for(img));
        } else {
            drop(img);
        }
        let t1 = Instant::now();
        let y = detector
            .infer(&[&lb])
            .with_context(|| format!("inference on {}", crate::text::path(&path)))?;
        let t2 = Instant::now();
        let dets = detector.postprocess(&y, &[info])?.pop().unwrap_or_default();
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
        sinks.write(item, &dets, full.as_ref())?;
        if let Some(img) = full {
            if !out.nosave {
                canvas = Some(canvas_for(img));
            }
        }
        if let Some((mut canvas, scale)) = canvas {
            draw_detections(&mut canvas, &dets, scale, &out.draw)?;
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
    args: &DetectArgs,
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
        match detect_stream(detector, args, st, &stem, sinks, at, cancel) {
            Ok(()) => tally.ok += 1,
            Err(e) => {
                crate::text::errln!(
                    "skipped {}: {}",
                    st.name(),
                    crate::text::redact(&format!("{e:#}"))
                );
                tally.bad += 1;
            }
        }
    }
}

/// Writes one detected frame of a video or stream ([`Sinks::write`]: labels
/// `<stem>_<frame>.txt`, `predictions.jsonl` lines with a `frame` field, crops) and the
/// annotated frame to `writer`.
fn frame_outputs(
    sinks: &mut Sinks,
    (source, stem, frame): (&str, &str, u64),
    img: image::RgbImage,
    dets: &[crate::detect::detector::Detection],
    writer: Option<&mut crate::detect::video::FrameWriter>,
) -> Result<()> {
    let item = Item {
        source,
        stem,
        frame: Some(frame),
        size: img.dimensions(),
    };
    sinks.write(item, dets, Some(&img))?;
    if let Some(wr) = writer {
        let mut canvas = img;
        draw_detections(&mut canvas, dets, 1.0, &sinks.options().draw)?;
        wr.write(&canvas)?;
    }
    Ok(())
}

/// Detection on every `--vid-stride`-th frame of a video (frames numbered from 1, as the
/// official `LoadImages`): per frame a progress line and [`frame_outputs`], the annotated frames
/// as `<stem>.mp4` in the run folder (the source's frame rate) unless `--nosave`. A stop request
/// ends the video at the current frame, with a finished file.
fn detect_video(
    detector: &Detector,
    args: &DetectArgs,
    path: &Path,
    stem: &str,
    sinks: &mut Sinks,
    (k, total): (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    use crate::detect::video::{probe, FrameReader, FrameWriter};
    let info = probe(path)?;
    let names = detector.names();
    let mut reader = FrameReader::open(path, &info)?;
    let mut writer = if sinks.options().nosave {
        None
    } else {
        let out = sinks.dir().join(format!("{stem}.mp4"));
        Some((
            FrameWriter::create(&out, info.width, info.height, info.fps)?,
            out,
        ))
    };
    let of = info
        .frames
        .map(|n| n.to_string())
        .unwrap_or_else(|| "?".into());
    let source = path.to_string_lossy();
    let (mut frame, mut detected) = (0u64, 0u64);
    while let Some(img) = reader.next_frame()? {
        if cancel.requested() {
            crate::text::errln!(
                "stopped on request: {} ends at frame {frame}",
                crate::text::path(&path)
            );
            break;
        }
        frame += 1;
        if (frame - 1) % args.vid_stride as u64 != 0 {
            continue;
        }
        let t0 = Instant::now();
        let dets = detector
            .detect_rgb(&img)
            .with_context(|| format!("frame {frame}"))?;
        detected += 1;
        crate::text::outln!(
            "video {k}/{total} (frame {frame}/{of}) {}: {}, {:.1}ms",
            crate::text::path(&path),
            count_summary(&dets, names),
            t0.elapsed().as_secs_f64() * 1e3
        );
        let wr = writer.as_mut().map(|(w, _)| w);
        frame_outputs(sinks, (&source, stem, frame), img, &dets, wr)?;
    }
    if let Some(msg) = reader.finish() {
        if !cancel.requested() {
            crate::text::errln!("note: {}: ffmpeg reported: {msg}", crate::text::path(&path));
        }
    }
    if let Some((wr, out)) = writer {
        wr.finish()?;
        crate::text::outln!(
            "{}: {detected} of {frame} frames detected, saved to {}",
            crate::text::path(&path),
            crate::text::path(&out)
        );
    }
    if frame == 0 {
        bail!("no frame could be decoded");
    }
    Ok(())
}

/// Detection on a webcam or stream ([`LiveReader`]: the newest frame each time, so a slow
/// detector skips frames rather than lag behind), until it ends (after `--stream-retries`
/// reopenings) or a stop request: per detected frame a progress line with the frame number and
/// the frames dropped so far, [`frame_outputs`], and the annotated frames as `<stem>.mp4`
/// (stamped with the wall clock; at the first frame's size: frames of another size are left out
/// of it, counted) unless `--nosave`; at the end a summary of frames read, detected, dropped,
/// skipped by `--vid-stride`, damaged and reopenings.
fn detect_stream(
    detector: &Detector,
    args: &DetectArgs,
    src: &StreamSource,
    stem: &str,
    sinks: &mut Sinks,
    (k, total): (usize, usize),
    cancel: &crate::cancel::Cancel,
) -> Result<()> {
    use crate::detect::video::FrameWriter;
    let name = src.name();
    let opts = StreamOptions {
        vid_stride: args.vid_stride,
        retries: args.stream_retries,
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
    let names = detector.names();
    let out = sinks.dir().join(format!("{stem}.mp4"));
    let mut writer: Option<FrameWriter> = None;
    let mut off_size = 0u64;
    let result = (|| -> Result<()> {
        while let Some(f) = reader.next(cancel)? {
            let t0 = Instant::now();
            let dets = detector
                .detect_rgb(&f.image)
                .with_context(|| format!("frame {}", f.frame))?;
            let stats = reader.stats();
            crate::text::outln!(
                "stream {k}/{total} (frame {}, {} dropped) {name}: {}, {:.1}ms",
                f.frame,
                stats.dropped,
                count_summary(&dets, names),
                t0.elapsed().as_secs_f64() * 1e3
            );
            if !sinks.options().nosave && writer.is_none() {
                let (w, h) = f.image.dimensions();
                writer = Some(FrameWriter::create_live(&out, w, h)?);
            }
            // The video keeps its first frame size (a stream that changes size mid-way).
            let wr = match writer.as_mut() {
                Some(w) if w.size() == f.image.dimensions() => Some(w),
                Some(_) => {
                    off_size += 1;
                    None
                }
                None => None,
            };
            frame_outputs(sinks, (&name, stem, f.frame), f.image, &dets, wr)?;
        }
        Ok(())
    })();
    let stopped = cancel.requested();
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
    match &finished {
        Some(Ok(())) => summary.push_str(&format!(", saved to {}", crate::text::path(&out))),
        Some(Err(e)) => summary.push_str(&format!(
            ", the annotated video failed: {}",
            crate::text::message(&format!("{e:#}"))
        )),
        None => {}
    }
    crate::text::outln!("{summary}");
    result?;
    if let Some(r) = finished {
        r?;
    }
    if s.delivered == 0 {
        bail!("no frame was detected");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn img_rounding() {
        assert_eq!(effective_img(640), (640, None));
        assert_eq!(effective_img(650).0, 672);
        assert_eq!(effective_img(31).0, 32);
        assert!(effective_img(31).1.unwrap().contains("32"));
    }
}
