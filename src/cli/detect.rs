//! `yolo9 detect`: the arguments (the flags of the official `detect_dual.py`; the detector's
//! options, the outputs and the drawing are the library's `DetectorConfig`, `SinkOptions` and
//! `DrawOptions`, flattened), the set-up shared with `track` ([`prepare`]: weights, device,
//! memory) and one call of the library's detection job ([`crate::detect::job::run`], which
//! documents what is printed and written).
use crate::detect::config::DetectorConfig;
use crate::detect::detector::Detector;
use crate::detect::job::JobOptions;
use crate::detect::source::{expand_sources, Sources};
use crate::detect::stream::StreamSource;
use crate::device::{parse_device, DeviceSpec};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

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

pub use crate::detect::letterbox::effective_img;

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

pub use crate::hub::spec::{load_weights, resolve_weights, weights_file, BUILTIN_LABEL};

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
                crate::hub::spec::builtin_weights(self.cfg.as_deref())?,
            )),
        }
    }
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

pub use crate::detect::config::{check_classes, inference_dtype_noted as inference_dtype};
pub use crate::detect::stream::split_streams;

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
