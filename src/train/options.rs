//! Options of a training run: [`TrainOptions`] (the `yolo9 train` flags, written to `args.yaml`
//! and restored by `--resume`) and [`Hyp`] (the official `hyp.scratch-high.yaml`), with their
//! defaults. Re-exported as `crate::train::trainer::{TrainOptions, Hyp}`.

use crate::data::augment::AugmentConfig;
use crate::loss::tal_loss::GAINS;
use crate::train::guard::Faults;
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
    /// ([`crate::model::yolov9::YoloV9Train::set_amp`]); off by default, no effect on the CPU.
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
    /// With `resume`: train until this many epochs instead of the stored number (extends a
    /// finished run).
    #[serde(skip)]
    pub extend_epochs: Option<usize>,
    /// Injected faults (tests); empty = read `YOLO9_FAULTS`.
    #[serde(skip)]
    pub faults: Faults,
}

fn default_save_interval() -> f64 {
    10.0
}

fn default_amp() -> bool {
    false
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

impl Hyp {
    /// Reads a hyp yaml (missing keys keep the scratch-high values).
    pub fn load(path: &Path) -> Result<Hyp> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--hyp {}: cannot read", path.display()))?;
        let h: Hyp = serde_yaml::from_str(&text).with_context(|| {
            format!(
                "--hyp {}: not a hyp yaml (expected keys like `lr0: 0.01`, numbers only)",
                path.display()
            )
        })?;
        ensure!(
            h.lr0 > 0.0
                && h.lr0.is_finite()
                && h.lrf > 0.0
                && h.momentum >= 0.0
                && h.momentum < 1.0,
            "--hyp {}: lr0 {} / lrf {} / momentum {} out of range",
            path.display(),
            h.lr0,
            h.lrf,
            h.momentum
        );
        Ok(h)
    }

    /// The augmentation part.
    pub fn augment(&self) -> AugmentConfig {
        self.augment.clone()
    }
}
