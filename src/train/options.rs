//! Options of a training run: [`TrainOptions`] (the `yolo9 train` flags, written to `args.yaml`
//! and restored by `--resume`) and [`Hyp`] (the official `hyp.scratch-high.yaml`), with their
//! defaults. Re-exported as `crate::train::trainer::{TrainOptions, Hyp}`.

use crate::data::augment::AugmentConfig;
use crate::loss::tal_loss::GAINS;
use crate::train::guard::Faults;
pub use crate::train::optimizer::OptimizerKind;
use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Options of a training run (the `yolo9 train` flags; written to `args.yaml`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainOptions {
    /// Dataset yaml.
    pub data: PathBuf,
    /// Initial weights (yolo9 safetensors or official .pt); `None` = from scratch.
    pub weights: Option<PathBuf>,
    /// The model to train (`--cfg`): a built-in name (`yolov9-t/s/m/c/e`) or a model yaml in the
    /// official format; `None` = the model of `weights`, or yolov9-s.
    #[serde(default)]
    pub cfg: Option<String>,
    /// Epochs.
    pub epochs: usize,
    /// Square training size in pixels (multiple of 32).
    pub img: u32,
    /// Batch size the optimizer sees per iteration (0 = auto: the largest micro-batch the memory
    /// budget allows, at most 64). Written to args.yaml as the size in effect.
    pub batch: usize,
    /// Images per forward/backward (`None` = the whole batch, or the budget's choice); the
    /// gradients of a batch's micro-batches are summed.
    #[serde(default)]
    pub micro_batch: Option<usize>,
    /// Memory budget in bytes (`--budget 8GiB`); `None` = no sizing unless `batch` is 0, which
    /// uses 80% of the free memory.
    #[serde(default)]
    pub budget: Option<u64>,
    /// Minutes between mid-epoch checkpoints (0 = after every batch).
    #[serde(default = "default_save_interval")]
    pub save_interval: f64,
    /// Non-finite steps in a row before the last good state is restored and the LR halved.
    #[serde(default = "default_nan_patience")]
    pub nan_patience: usize,
    /// Mixed precision (bf16) training on CUDA
    /// ([`crate::model::yolov9::YoloV9Train::set_amp`]); on by default (as the official trainer),
    /// no effect on the CPU.
    #[serde(default = "default_amp")]
    pub amp: bool,
    /// Strict f32 convolutions on CUDA (no TF32 tensor cores; for parity runs). Off by default:
    /// f32 convolutions may use TF32, as PyTorch's do. No effect on the CPU.
    #[serde(default)]
    pub strict_fp32: bool,
    /// `cpu` or a CUDA ordinal.
    pub device: String,
    /// Loader threads (0 = available cores − 1).
    pub workers: usize,
    /// Seed of initialization, shuffling and augmentation.
    pub seed: u64,
    /// Epochs at the end without mosaic.
    pub close_mosaic: usize,
    /// Train images with fewer boxes are left out.
    pub min_items: usize,
    /// Runs folder.
    pub project: PathBuf,
    /// Run name (`exp`, then `exp2`, ... unless `exist_ok`).
    pub name: String,
    /// Reuse an existing run folder.
    pub exist_ok: bool,
    /// Save `epoch{N}.safetensors` every N epochs (−1 = never).
    pub save_period: i64,
    /// Stop after this many epochs without fitness improvement.
    pub patience: usize,
    /// Cosine LR schedule.
    pub cos_lr: bool,
    /// Validate only after the final epoch.
    pub noval: bool,
    /// Do not draw `results.png`.
    pub noplots: bool,
    /// Hyper-parameter yaml (official `hyp.scratch-high.yaml` format); `None` = its values.
    pub hyp: Option<PathBuf>,
    /// Resume from a run folder or a `state.safetensors`.
    pub resume: Option<PathBuf>,
    /// Show progress bars and per-epoch lines.
    pub verbose: bool,
    /// Train multi-class data as one class (`--single-cls`, official `single_cls`): every label
    /// becomes class 0 and the model has `nc = 1`, named `item` (the dataset's own name when it
    /// has exactly one class).
    #[serde(default)]
    pub single_cls: bool,
    /// Layers to freeze (`--freeze`, official semantics): one number `N` freezes layers
    /// `model.0` … `model.N-1`; several numbers freeze exactly those layers; empty or `[0]`
    /// freezes nothing. Frozen parameters get no optimizer update, no weight decay and no EMA
    /// averaging.
    #[serde(default)]
    pub freeze: Vec<usize>,
    /// The optimizer (`--optimizer SGD|Adam|AdamW`, official `smart_optimizer`).
    #[serde(default)]
    pub optimizer: OptimizerKind,
    /// Keep the decoded training images in memory (`--cache ram`), when they fit (see
    /// [`crate::train::cache`]).
    #[serde(default)]
    pub cache: ImageCache,
    /// Wall-time limit in hours (`--time`, Ultralytics semantics): after each epoch the epoch
    /// count is re-estimated from the mean epoch time so that the schedule ends on time, and
    /// training stops at the epoch boundary where the time is used up (checkpoints saved).
    #[serde(default)]
    pub time: Option<f64>,
    /// Label smoothing epsilon (`--label-smoothing`, official `smooth_BCE`): class targets
    /// become `t·(1 − eps) + eps/2` in the classification BCE (0 = off).
    #[serde(default)]
    pub label_smoothing: f64,
    /// With `resume`: train until this many epochs instead of the stored number (extends a
    /// finished run).
    #[serde(skip)]
    pub extend_epochs: Option<usize>,
    /// Injected faults (tests); empty = read `YOLO9_FAULTS`.
    #[serde(skip)]
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

fn default_save_interval() -> f64 {
    10.0
}

fn default_amp() -> bool {
    true
}

fn default_nan_patience() -> usize {
    5
}

impl TrainOptions {
    /// The official defaults for `data`.
    pub fn new(data: PathBuf) -> Self {
        TrainOptions {
            data,
            weights: None,
            cfg: None,
            epochs: 100,
            img: 640,
            batch: 16,
            micro_batch: None,
            budget: None,
            save_interval: default_save_interval(),
            nan_patience: default_nan_patience(),
            amp: default_amp(),
            strict_fp32: false,
            device: "cpu".into(),
            workers: 0,
            seed: 0,
            close_mosaic: 10,
            min_items: 0,
            project: PathBuf::from("runs/train"),
            name: "exp".into(),
            exist_ok: false,
            save_period: -1,
            patience: 100,
            cos_lr: false,
            noval: false,
            noplots: false,
            hyp: None,
            resume: None,
            single_cls: false,
            freeze: Vec::new(),
            optimizer: OptimizerKind::Sgd,
            cache: ImageCache::None,
            time: None,
            label_smoothing: 0.0,
            verbose: true,
            extend_epochs: None,
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
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--hyp {}: cannot read", path.display()))?;
        let not_hyp = || {
            format!(
                "--hyp {}: not a hyp yaml (expected keys like `lr0: 0.01`)",
                path.display()
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
                    path.display(),
                    serde_yaml_ng::to_string(k).unwrap_or_default().trim(),
                    nearest(key, HYP_KEYS),
                    HYP_KEYS.join(", ")
                );
            }
        }
        let h: Hyp = serde_yaml_ng::from_str(&text).with_context(|| {
            format!(
                "--hyp {}: not a hyp yaml (expected keys like `lr0: 0.01`, numbers only)",
                path.display()
            )
        })?;
        h.validate()
            .with_context(|| format!("--hyp {}", path.display()))?;
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
