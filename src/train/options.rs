//! Options of a training run: [`TrainOptions`] (the `yolo9 train` flags, written to `args.yaml`
//! and restored by `--resume`) and [`Hyp`] (the official `hyp.scratch-high.yaml`), with their
//! defaults. Re-exported as `crate::train::trainer::{TrainOptions, Hyp}`.

use crate::data::augment::AugmentConfig;
use crate::device::DeviceSpec;
use crate::loss::tal_loss::GAINS;
use crate::train::guard::Faults;
pub use crate::train::optimizer::OptimizerKind;
use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The defaults of [`TrainOptions`], written once: [`TrainOptions::new`], the `yolo9 train`
/// flags (derived from the struct) and the values a saved run without the key reads all use these.
pub mod defaults {
    /// `--epochs`.
    pub const EPOCHS: usize = 100;
    /// `--img`, pixels.
    pub const IMG: u32 = 640;
    /// `--batch`.
    pub const BATCH: usize = 16;
    /// `--save-interval`, minutes.
    pub const SAVE_INTERVAL: f64 = 10.0;
    /// `--nan-patience`, steps.
    pub const NAN_PATIENCE: usize = 5;
    /// `--amp`.
    pub const AMP: bool = true;
    /// `--close-mosaic`, epochs.
    pub const CLOSE_MOSAIC: usize = 10;
    /// `--project`.
    pub const PROJECT: &str = "runs/train";
    /// `--name`.
    pub const NAME: &str = "exp";
    /// `--save-period` (−1 = never).
    pub const SAVE_PERIOD: i64 = -1;
    /// `--patience`, epochs.
    pub const PATIENCE: usize = 100;
}

/// Options of a training run: the `yolo9 train` flags (with the `cli` feature the flags are
/// derived from this struct, so each default exists once, in [`defaults`]), written to
/// `args.yaml` and restored by `--resume`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TrainOptions {
    /// Dataset yaml (the command line's `--data`, optional with `--resume`).
    #[cfg_attr(feature = "cli", arg(skip))]
    pub data: PathBuf,
    /// Initial weights (yolo9 safetensors or official .pt; on the command line also the name of
    /// an official checkpoint, e.g. gelan-c, fetched into the cache); omitted = from scratch.
    #[cfg_attr(feature = "cli", arg(long))]
    pub weights: Option<PathBuf>,
    /// Model to train: yolov9-t, yolov9-s, yolov9-m, yolov9-c, yolov9-e, or a model yaml in the
    /// official format (a DualDDetect graph) [default: the model of --weights, else yolov9-s].
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long))]
    pub cfg: Option<String>,
    /// Epochs (the command line's `--epochs`, which with `--resume` extends the run).
    #[cfg_attr(feature = "cli", arg(skip = defaults::EPOCHS))]
    pub epochs: usize,
    /// Train/val image size in pixels (a multiple of 32 in 32..=8192). On the CPU a size and
    /// batch whose estimated memory exceeds the free memory are refused before any work.
    #[cfg_attr(feature = "cli", arg(long, visible_aliases = ["imgsz", "img-size"],
        default_value_t = defaults::IMG, value_parser = crate::parse::train_img,
        allow_negative_numbers = true))]
    pub img: u32,
    /// Batch size the optimizer sees per iteration, or `auto`: the largest the memory budget
    /// allows, at most 64 (`auto` is 0 here; args.yaml records the size in effect). Nominal batch
    /// 64 is kept by gradient accumulation.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = defaults::BATCH,
        visible_alias = "batch-size", value_parser = crate::parse::batch,
        allow_negative_numbers = true))]
    pub batch: usize,
    /// Images per forward/backward, ≥ 1 (default: the whole batch, or what --budget picks); the
    /// gradients of a batch's micro-batches are summed.
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse::positive,
        allow_negative_numbers = true))]
    pub micro_batch: Option<usize>,
    /// Memory budget, e.g. 8GiB: the micro-batch is sized from measured
    /// training steps so that peak memory (device memory on CUDA, RSS on the CPU) stays within
    /// it. Without it there is no sizing unless the batch is `auto`, which uses 80% of the free
    /// memory.
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse::budget))]
    pub budget: Option<u64>,
    /// Minutes between mid-epoch checkpoints (0 = after every batch).
    #[serde(default = "save_interval")]
    #[cfg_attr(feature = "cli", arg(long, default_value_t = defaults::SAVE_INTERVAL))]
    pub save_interval: f64,
    /// Non-finite steps in a row before the last good state is restored and the LR halved.
    #[serde(default = "nan_patience")]
    #[cfg_attr(feature = "cli", arg(long, default_value_t = defaults::NAN_PATIENCE))]
    pub nan_patience: usize,
    /// Mixed-precision (bf16) training on a CUDA device, on by default as in the official
    /// trainer (`--amp false` trains in f32, with TF32 convolutions unless `--strict-fp32`). No
    /// effect on the CPU, which always trains in f32.
    #[serde(default = "amp")]
    #[cfg_attr(feature = "cli", arg(long, default_value_t = defaults::AMP,
        action = clap::ArgAction::Set))]
    pub amp: bool,
    /// Strict f32 convolutions on CUDA: no TF32 tensor cores (PyTorch's
    /// `torch.backends.cudnn.allow_tf32 = False`; for parity runs). By default f32 convolutions
    /// may use TF32, as PyTorch's do. No effect on the CPU.
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long))]
    pub strict_fp32: bool,
    /// The device: auto (the first CUDA GPU when this build has CUDA and one is present, else
    /// the CPU), cpu, or a CUDA index such as 0 (or cuda:0). The `yolo9 train --device` flag
    /// also takes a list (`0,1`: one process per GPU, see `crate::cli::train`) and sets this to
    /// the rank's device.
    #[cfg_attr(feature = "cli", arg(skip = DeviceSpec::Auto))]
    pub device: DeviceSpec,
    /// Loader threads, 0..=256 (0: available cores - 1).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0,
        value_parser = crate::parse::workers, allow_negative_numbers = true))]
    pub workers: usize,
    /// Seed of initialization, shuffling and augmentation.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Disable mosaic for the final N epochs.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = defaults::CLOSE_MOSAIC))]
    pub close_mosaic: usize,
    /// Leave out train images with fewer boxes.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0))]
    pub min_items: usize,
    /// Runs folder.
    #[cfg_attr(feature = "cli", arg(long, default_value = defaults::PROJECT))]
    pub project: PathBuf,
    /// Run name (`exp`, then `exp2`, ... unless --exist-ok).
    #[cfg_attr(feature = "cli", arg(long, default_value = defaults::NAME))]
    pub name: String,
    /// Reuse an existing run folder.
    #[cfg_attr(feature = "cli", arg(long))]
    pub exist_ok: bool,
    /// Save `epoch{N}.safetensors` every N epochs (-1 = never).
    #[cfg_attr(feature = "cli", arg(long, default_value_t = defaults::SAVE_PERIOD,
        allow_negative_numbers = true))]
    pub save_period: i64,
    /// Early-stopping patience: stop after this many epochs without fitness improvement.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = defaults::PATIENCE))]
    pub patience: usize,
    /// Cosine LR schedule.
    #[cfg_attr(feature = "cli", arg(long))]
    pub cos_lr: bool,
    /// Validate only the final epoch.
    #[cfg_attr(feature = "cli", arg(long))]
    pub noval: bool,
    /// Do not write plots.
    #[cfg_attr(feature = "cli", arg(long))]
    pub noplots: bool,
    /// Hyper-parameter yaml (official `hyp.scratch-high.yaml` format; default: its values).
    #[cfg_attr(feature = "cli", arg(long))]
    pub hyp: Option<PathBuf>,
    /// Resume a run: its folder, its weights/state.safetensors (or the last/best.safetensors
    /// beside it); `--resume` alone resumes the most recent run under --project.
    #[cfg_attr(feature = "cli", arg(long, num_args = 0..=1,
        default_missing_value = crate::train::options::RESUME_LATEST))]
    pub resume: Option<PathBuf>,
    /// Show progress bars and per-epoch lines (always on for `yolo9 train`).
    #[cfg_attr(feature = "cli", arg(skip = true))]
    pub verbose: bool,
    /// Train multi-class data as a single class (official `single_cls`): every label becomes
    /// class 0 and the model has `nc = 1`, named `item` (the dataset's own name when it has
    /// exactly one class).
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long))]
    pub single_cls: bool,
    /// Data-parallel runs: batch norm over the whole global micro-batch, every rank's images
    /// (official `--sync-bn`, PyTorch's `SyncBatchNorm`; [`crate::model::bn_sync`]). Ignored
    /// without a group. An out-of-memory error then stops the run instead of halving the
    /// micro-batch (the ranks' BN layers meet in every forward).
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long))]
    pub sync_bn: bool,
    /// Freeze layers (official semantics): one number N freezes model.0 … model.N-1 (e.g. 10 =
    /// the backbone of yolov9-c); several numbers freeze exactly those layers (e.g. --freeze 0 1
    /// 2); none or 0 freezes nothing. Frozen parameters get no optimizer update, no weight decay
    /// and no EMA averaging.
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long, num_args = 1.., value_name = "N"))]
    pub freeze: Vec<usize>,
    /// Optimizer: SGD, Adam or AdamW, with the official parameter groups and betas (momentum,
    /// 0.999) (official `smart_optimizer`).
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long, default_value = "SGD",
        value_parser = <OptimizerKind as std::str::FromStr>::from_str))]
    pub optimizer: OptimizerKind,
    /// Cache decoded training images: `ram` (also the value of a bare --cache). Skipped with a
    /// warning when the images would not fit in the available memory (with a 10% margin).
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long, num_args = 0..=1, default_value = "none",
        default_missing_value = "ram", hide_default_value = true,
        value_parser = <ImageCache as std::str::FromStr>::from_str))]
    pub cache: ImageCache,
    /// Wall-time limit in hours (Ultralytics semantics): after each epoch the epoch count is
    /// re-estimated from the mean epoch time so that training ends on time (overrides
    /// --epochs); it stops at an epoch boundary, saved.
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long, value_parser = crate::parse::hours))]
    pub time: Option<f64>,
    /// Label smoothing epsilon in [0, 1) (official `smooth_BCE`): class targets t become
    /// t·(1 − eps) + eps/2 in the classification BCE (0 = off).
    #[serde(default)]
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 0.0,
        value_parser = crate::parse::smoothing))]
    pub label_smoothing: f64,
    /// With `resume`: train until this many epochs instead of the stored number (extends a
    /// finished run).
    #[serde(skip)]
    #[cfg_attr(feature = "cli", arg(skip))]
    pub extend_epochs: Option<usize>,
    /// The environment switches set when the run started that change what it computes
    /// ([`crate::switches::recorded`]), name → value: written to `args.yaml` so the run can be
    /// reproduced from its folder (informational: a resumed run uses its own environment).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[cfg_attr(feature = "cli", arg(skip))]
    pub switches: std::collections::BTreeMap<String, String>,
    /// Injected faults (tests); empty = read `YOLO9_FAULTS`.
    #[serde(skip)]
    #[cfg_attr(feature = "cli", arg(skip))]
    pub faults: Faults,
}

/// Where training images are cached (`--cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageCache {
    /// Decode every image when it is used (the default).
    #[default]
    None,
    /// Decoded, resized images kept in memory (`--cache ram`).
    Ram,
}

impl std::str::FromStr for ImageCache {
    type Err = String;
    /// `ram` (or `none`/`false`); `disk` is the official trainer's other choice, not offered.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ram" | "true" => Ok(ImageCache::Ram),
            "none" | "false" | "" => Ok(ImageCache::None),
            "disk" => Err(
                "--cache disk is not supported; use --cache ram (decoded images in memory)".into(),
            ),
            _ => Err(format!("invalid --cache '{s}': expected ram")),
        }
    }
}

/// The names of the layers `--freeze` names (official `train_dual.py`): `[N]` gives
/// `model.0.` … `model.{N-1}.`, a longer list exactly those layers, `[]` or `[0]` none.
pub fn freeze_prefixes(freeze: &[usize]) -> Vec<String> {
    let layers: Vec<usize> = match freeze {
        [] => Vec::new(),
        [n] => (0..*n).collect(),
        list => list.to_vec(),
    };
    layers.iter().map(|i| format!("model.{i}.")).collect()
}

fn save_interval() -> f64 {
    defaults::SAVE_INTERVAL
}

fn amp() -> bool {
    defaults::AMP
}

fn nan_patience() -> usize {
    defaults::NAN_PATIENCE
}

impl TrainOptions {
    /// The official defaults ([`defaults`]) for `data`: what `yolo9 train --data DATA` runs.
    pub fn new(data: PathBuf) -> Self {
        TrainOptions {
            data,
            weights: None,
            cfg: None,
            epochs: defaults::EPOCHS,
            img: defaults::IMG,
            batch: defaults::BATCH,
            micro_batch: None,
            budget: None,
            save_interval: defaults::SAVE_INTERVAL,
            nan_patience: defaults::NAN_PATIENCE,
            amp: defaults::AMP,
            strict_fp32: false,
            device: DeviceSpec::Auto,
            workers: 0,
            seed: 0,
            close_mosaic: defaults::CLOSE_MOSAIC,
            min_items: 0,
            project: PathBuf::from(defaults::PROJECT),
            name: defaults::NAME.into(),
            exist_ok: false,
            save_period: defaults::SAVE_PERIOD,
            patience: defaults::PATIENCE,
            cos_lr: false,
            noval: false,
            noplots: false,
            hyp: None,
            resume: None,
            single_cls: false,
            sync_bn: false,
            freeze: Vec::new(),
            optimizer: OptimizerKind::Sgd,
            cache: ImageCache::None,
            time: None,
            label_smoothing: 0.0,
            verbose: true,
            extend_epochs: None,
            switches: Default::default(),
            faults: Faults::default(),
        }
    }
}

/// Hyper-parameters (official `hyp.scratch-high.yaml`; unknown keys are ignored).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Hyp {
    /// Initial LR.
    pub lr0: f64,
    /// Final LR fraction.
    pub lrf: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// Weight decay (before batch scaling).
    pub weight_decay: f64,
    /// Warmup epochs.
    pub warmup_epochs: f64,
    /// Warmup initial momentum.
    pub warmup_momentum: f64,
    /// Warmup initial bias LR.
    pub warmup_bias_lr: f64,
    /// Box loss gain (fixed at 7.5 by the loss).
    #[serde(rename = "box")]
    pub box_gain: f64,
    /// Class loss gain (fixed at 0.5).
    pub cls: f64,
    /// DFL gain (fixed at 1.5).
    pub dfl: f64,
    /// Augmentation keys (`hsv_h`, `hsv_s`, `hsv_v`, `degrees`, `translate`, `scale`, `shear`,
    /// `flipud`, `fliplr`, `mosaic`, `mixup`), read from the same yaml level.
    #[serde(flatten)]
    pub augment: AugmentConfig,
}

impl Default for Hyp {
    fn default() -> Self {
        Hyp {
            lr0: 0.01,
            lrf: 0.01,
            momentum: 0.937,
            weight_decay: 0.0005,
            warmup_epochs: 3.0,
            warmup_momentum: 0.8,
            warmup_bias_lr: 0.1,
            box_gain: GAINS[0] as f64,
            cls: GAINS[1] as f64,
            dfl: GAINS[2] as f64,
            augment: AugmentConfig::default(),
        }
    }
}

/// What `--resume` alone stands for: the most recent run under `--project` (official
/// `train_dual.py --resume` without a value).
pub const RESUME_LATEST: &str = "@latest";

/// The keys of a hyp yaml that yolo9 reads.
pub const HYP_KEYS: &[&str] = &[
    "lr0",
    "lrf",
    "momentum",
    "weight_decay",
    "warmup_epochs",
    "warmup_momentum",
    "warmup_bias_lr",
    "box",
    "cls",
    "dfl",
    "hsv_h",
    "hsv_s",
    "hsv_v",
    "degrees",
    "translate",
    "scale",
    "shear",
    "flipud",
    "fliplr",
    "mosaic",
    "mixup",
];

/// Keys of the official hyp files (`data/hyps/hyp.scratch-high.yaml` and its siblings) that the
/// YOLOv9 recipe does not use: accepted and ignored, so an official file loads as it is.
pub const IGNORED_HYP_KEYS: &[&str] = &[
    "cls_pw",
    "obj",
    "obj_pw",
    "iou_t",
    "anchor_t",
    "fl_gamma",
    "perspective",
    "copy_paste",
    "label_smoothing",
];

/// The entry of `keys` nearest to `key` by edit distance (for "did you mean").
fn nearest<'a>(key: &str, keys: &[&'a str]) -> &'a str {
    fn dist(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for j in 0..b.len() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != b[j]))
                    .min(row[j] + 1)
                    .min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    }
    keys.iter()
        .copied()
        .min_by_key(|k| dist(key, k))
        .unwrap_or("lr0")
}

impl Hyp {
    /// Reads a hyp yaml (missing keys keep the scratch-high values) and checks it
    /// ([`Hyp::validate`]). Keys of the official hyp files that yolo9 does not use
    /// ([`IGNORED_HYP_KEYS`]) are accepted; any other unknown key is an error naming the nearest
    /// valid key (a misspelt `lr00` would otherwise be silently ignored).
    pub fn load(path: &Path) -> Result<Hyp> {
        let text = crate::bounded::read_yaml(path, "--hyp")?;
        let not_hyp = || {
            format!(
                "--hyp {}: not a hyp yaml (expected keys like `lr0: 0.01`)",
                crate::text::path(&path)
            )
        };
        let map =
            match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text).with_context(not_hyp)? {
                serde_yaml_ng::Value::Mapping(m) => m,
                serde_yaml_ng::Value::Null => serde_yaml_ng::Mapping::new(),
                _ => anyhow::bail!(not_hyp()),
            };
        for k in map.keys() {
            let key = k.as_str().unwrap_or_default();
            if !HYP_KEYS.contains(&key) && !IGNORED_HYP_KEYS.contains(&key) {
                anyhow::bail!(
                    "--hyp {}: unknown key `{}`; did you mean `{}`? (valid keys: {})",
                    crate::text::path(&path),
                    serde_yaml_ng::to_string(k).unwrap_or_default().trim(),
                    nearest(key, HYP_KEYS),
                    HYP_KEYS.join(", ")
                );
            }
        }
        let h: Hyp = serde_yaml_ng::from_str(&text).with_context(|| {
            format!(
                "--hyp {}: not a hyp yaml (expected keys like `lr0: 0.01`, numbers only)",
                crate::text::path(&path)
            )
        })?;
        h.validate()
            .with_context(|| format!("--hyp {}", crate::text::path(&path)))?;
        Ok(h)
    }

    /// Checks every value: finite and in its range (learning rates in (0, 1], momentum in [0, 1),
    /// probabilities in [0, 1], `scale` in [0, 1), angles in degrees, ...). The error names the key,
    /// the value and the range.
    pub fn validate(&self) -> Result<()> {
        let a = &self.augment;
        let checks: [(&str, f64, f64, f64, bool); 21] = [
            // (key, value, low, high, high inclusive); low is inclusive except for lr0/lrf.
            ("lr0", self.lr0, 0.0, 1.0, true),
            ("lrf", self.lrf, 0.0, 1.0, true),
            ("momentum", self.momentum, 0.0, 1.0, false),
            ("weight_decay", self.weight_decay, 0.0, 0.1, true),
            ("warmup_epochs", self.warmup_epochs, 0.0, 1000.0, true),
            ("warmup_momentum", self.warmup_momentum, 0.0, 1.0, false),
            ("warmup_bias_lr", self.warmup_bias_lr, 0.0, 1.0, true),
            ("box", self.box_gain, 0.0, 1000.0, true),
            ("cls", self.cls, 0.0, 1000.0, true),
            ("dfl", self.dfl, 0.0, 1000.0, true),
            ("hsv_h", a.hsv_h as f64, 0.0, 0.5, true),
            ("hsv_s", a.hsv_s as f64, 0.0, 1.0, true),
            ("hsv_v", a.hsv_v as f64, 0.0, 1.0, true),
            ("degrees", a.degrees as f64, 0.0, 180.0, true),
            ("translate", a.translate as f64, 0.0, 1.0, true),
            ("scale", a.scale as f64, 0.0, 1.0, false),
            ("shear", a.shear as f64, 0.0, 90.0, false),
            ("flipud", a.flipud as f64, 0.0, 1.0, true),
            ("fliplr", a.fliplr as f64, 0.0, 1.0, true),
            ("mosaic", a.mosaic as f64, 0.0, 1.0, true),
            ("mixup", a.mixup as f64, 0.0, 1.0, true),
        ];
        for (key, v, lo, hi, hi_incl) in checks {
            let strict_lo = matches!(key, "lr0" | "lrf");
            let ok = v.is_finite()
                && (if strict_lo { v > lo } else { v >= lo })
                && (if hi_incl { v <= hi } else { v < hi });
            ensure!(
                ok,
                "`{key}: {v}` is out of range; {key} must be in {}{lo}, {hi}{}",
                if strict_lo { "(" } else { "[" },
                if hi_incl { "]" } else { ")" }
            );
        }
        Ok(())
    }

    /// The augmentation part.
    pub fn augment(&self) -> AugmentConfig {
        self.augment.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(tag: &str, text: &str) -> Result<Hyp> {
        let p = std::env::temp_dir().join(format!("yolo9-hyp-{tag}-{}.yaml", std::process::id()));
        std::fs::write(&p, text).unwrap();
        let r = Hyp::load(&p);
        let _ = std::fs::remove_file(&p);
        r
    }

    #[test]
    fn hyp_values_are_checked_and_unknown_keys_named() {
        let h = load_text("ok", "lr0: 0.02\nmosaic: 0.5\nobj: 0.7\ncopy_paste: 0.0\n").unwrap();
        assert_eq!((h.lr0, h.augment.mosaic), (0.02, 0.5));
        assert_eq!(h.momentum, Hyp::default().momentum);
        for (text, needle) in [
            ("lr0: 1e30\n", "lr0"),
            ("mosaic: 2\n", "mosaic"),
            ("fliplr: -1\n", "fliplr"),
            ("hsv_h: .inf\n", "hsv_h"),
            ("scale: 100\n", "scale"),
            ("lr0: 0\n", "lr0"),
        ] {
            let e = format!("{:#}", load_text("bad", text).unwrap_err());
            assert!(
                e.contains(needle) && e.contains("out of range"),
                "{text}: {e}"
            );
        }
        let e = format!("{:#}", load_text("typo", "lr00: 0.01\n").unwrap_err());
        assert!(
            e.contains("unknown key `lr00`") && e.contains("did you mean `lr0`"),
            "{e}"
        );
        assert!(Hyp::default().validate().is_ok());
    }
}
