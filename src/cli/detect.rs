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
use crate::detect::config::DetectorConfig;
use crate::detect::detector::Detector;
use crate::detect::job::JobOptions;
use crate::detect::letterbox::round_img_size;
use crate::detect::source::{expand_sources, Sources};
use crate::detect::stream::StreamSource;
use crate::device::{parse_device, DeviceSpec};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

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
    /// The run folder, its outputs, and how videos and streams are read.
    #[command(flatten)]
    pub job: JobOptions,
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
    crate::detect::job::run(
        &p.detector,
        &args.job,
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
