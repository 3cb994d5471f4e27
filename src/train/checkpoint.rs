//! Training-state checkpoints for `--resume`: everything needed to continue a run exactly where it
//! stopped, also in the middle of an epoch — model state, EMA state and update count, SGD
//! momentum buffers, gradients accumulated since the last optimizer step, the position in the
//! epoch (the loader's order and augmentation are pure functions of seed, epoch and position, so
//! no RNG state is needed), the epoch's running loss means and counters, LR scale, best fitness,
//! the budget decision and the run arguments — in one safetensors file written atomically
//! (temporary file, fsync, rename, fsync of the directory): a kill at any instant leaves the
//! previous file intact.
//!
//! Layout: tensors `model/<name>` (the training graph's state_dict, f32, BN running stats
//! included), `ema/<i>/<name>` (the EMA state in order), `optim/<name>` (SGD momentum buffers; for
//! `--optimizer Adam|AdamW` `optim/<name>#exp_avg`, `#exp_avg_sq` and `#step`, see
//! [`crate::train::optimizer::Optimizer::state`]),
//! `acc/<name>` (accumulated gradients, only mid-accumulation); metadata key
//! `yolo9-train-state` holds [`CheckpointMeta`] as JSON. The official equivalent is the `last.pt`
//! dict of `train_dual.py` (`epoch`, `best_fitness`, `model`, `ema`, `updates`, `optimizer`, `opt`).

use crate::device::to_host;
use crate::model::weights::write_atomic;
use anyhow::{ensure, Context, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Metadata key of the training state.
pub const STATE_KEY: &str = "yolo9-train-state";

/// Running sums of an epoch in progress (restored on a mid-epoch resume).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EpochProgress {
    /// Mean training losses `[box, cls, dfl]` over the batches done.
    pub mloss: [f64; 3],
    /// Mean mask loss (segmentation models; 0 for detection) over the batches done.
    #[serde(default)]
    pub mseg: f64,
    /// Batches whose loss entered `mloss`.
    pub done: usize,
    /// Samples skipped (undecodable) so far.
    pub skipped: usize,
    /// Images trained so far.
    pub images: usize,
    /// Non-finite losses or gradients so far.
    pub nan_events: usize,
    /// Out-of-memory recoveries so far.
    pub oom_events: usize,
    /// Training seconds spent in the epoch so far.
    pub train_secs: f64,
}

/// The scalars a run carries from checkpoint to checkpoint besides its position, micro-batch and
/// budget decision: saved in [`CheckpointMeta`] and restored from it on `--resume` as one value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    /// Best fitness so far (`0.1·mAP50 + 0.9·mAP50-95`).
    pub best_fitness: f64,
    /// Epoch of the best fitness.
    pub best_epoch: Option<usize>,
    /// Iteration of the last optimizer step (−1 = none yet).
    pub last_opt_step: i64,
    /// Factor on the scheduled LR (halved by each NaN rollback).
    #[serde(default = "one")]
    pub lr_scale: f64,
    /// NaN rollbacks so far.
    #[serde(default)]
    pub nan_rollbacks: usize,
}

impl Default for Counters {
    /// The counters of a new run.
    fn default() -> Counters {
        Counters {
            best_fitness: 0.0,
            best_epoch: None,
            last_opt_step: -1,
            lr_scale: 1.0,
            nan_rollbacks: 0,
        }
    }
}

/// Scalars of the training state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointMeta {
    /// Format version (2; version 1 files are read, see [`load_state`]).
    pub version: u32,
    /// Epoch to run next, or the epoch in progress when `next_batch > 0` (0-based).
    pub epoch: usize,
    /// First batch of `epoch` not trained yet (0 = the epoch has not started).
    #[serde(default)]
    pub next_batch: usize,
    /// Running sums of `epoch` when it is in progress.
    #[serde(default)]
    pub progress: EpochProgress,
    /// EMA update count.
    pub ema_updates: u64,
    /// Iterations (batches) since training start.
    pub iterations: usize,
    /// `num_batches_tracked` of the BN layers.
    pub batches_tracked: i64,
    /// Micro-batch in use (images per forward/backward; lowered by OOM recovery).
    #[serde(default)]
    pub micro: usize,
    /// Best fitness, the LR scale and the other scalars the run carries (flattened: the keys
    /// are at this level of the JSON, as before they were grouped).
    #[serde(flatten)]
    pub counters: Counters,
    /// The budget decision, if the run was sized by `--budget`/`--batch auto`.
    #[serde(default)]
    pub budget: Option<crate::budget::BudgetDecision>,
    /// The run arguments (as written to args.yaml), JSON.
    pub args: serde_json::Value,
}

fn one() -> f64 {
    1.0
}

/// A loaded training state.
#[derive(Debug, Clone)]
pub struct TrainState {
    /// Scalars.
    pub meta: CheckpointMeta,
    /// Model state_dict by official name (CPU).
    pub model: HashMap<String, Tensor>,
    /// EMA state by official name, in the saved order (CPU).
    pub ema: Vec<(String, Tensor)>,
    /// Optimizer state by parameter name (CPU): SGD momentum buffers, or Adam's moments and
    /// step counts ([`crate::train::optimizer::Optimizer::state`]).
    pub optim: Vec<(String, Tensor)>,
    /// Gradients accumulated since the last optimizer step, by parameter name (CPU).
    pub acc: Vec<(String, Tensor)>,
}

/// Writes the training state atomically to `path`.
pub fn save_state(
    path: &Path,
    meta: &CheckpointMeta,
    model: &HashMap<String, Tensor>,
    ema: &[(String, Tensor)],
    optim: &[(String, Tensor)],
    acc: &[(String, Tensor)],
) -> Result<()> {
    let mut named: Vec<(String, Tensor)> = Vec::new();
    let mut keys: Vec<&String> = model.keys().collect();
    keys.sort();
    for k in keys {
        named.push((format!("model/{k}"), to_host(&model[k])?));
    }
    for (i, (k, t)) in ema.iter().enumerate() {
        // Index prefix keeps the EMA order (safetensors sorts names).
        named.push((format!("ema/{i:05}/{k}"), to_host(t)?));
    }
    for (k, t) in optim {
        named.push((format!("optim/{k}"), to_host(t)?));
    }
    for (k, t) in acc {
        named.push((format!("acc/{k}"), to_host(t)?));
    }
    let info: HashMap<String, String> =
        [(STATE_KEY.to_string(), serde_json::to_string(meta)?)].into();
    let bytes = safetensors::serialize(named.iter().map(|(n, t)| (n.as_str(), t)), Some(info))
        .with_context(|| {
            format!(
                "{}: cannot serialize the training state",
                crate::text::path(&path)
            )
        })?;
    write_atomic(path, &bytes)
}

/// Reads a training state written by [`save_state`]. Errors name the file and what is wrong.
pub fn load_state(path: &Path) -> Result<TrainState> {
    let file = crate::text::path(&path).to_string();
    let bytes = crate::bounded::read_capped(path, crate::bounded::FileKind::Checkpoint)
        .with_context(|| format!("{file}: cannot read"))?;
    let (_, md) = safetensors::SafeTensors::read_metadata(&bytes)
        .with_context(|| format!("{file}: not a safetensors file"))?;
    let meta_json = md
        .metadata()
        .as_ref()
        .and_then(|m| m.get(STATE_KEY))
        .with_context(|| {
            format!("{file}: no `{STATE_KEY}` metadata; pass a state.safetensors written by yolo9 train")
        })?;
    let mut meta: CheckpointMeta = serde_json::from_str(meta_json)
        .with_context(|| format!("{file}: bad `{STATE_KEY}` metadata"))?;
    ensure!(
        meta.version == 1 || meta.version == 2,
        "{file}: training state version {} is not supported by this yolo9 (1 or 2); \
         start a new run with --weights {}",
        meta.version,
        crate::text::path(&path.with_file_name("last.safetensors"))
    );
    if meta.version == 1 {
        // Version 1 stored the last *completed* epoch and was only written at epoch ends.
        meta.epoch += 1;
        meta.next_batch = 0;
        meta.version = 2;
    }
    let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .with_context(|| format!("{file}: cannot read tensors"))?;
    let mut model = HashMap::new();
    let mut ema = Vec::new();
    let mut optim = Vec::new();
    let mut acc = Vec::new();
    for (k, t) in tensors {
        if let Some(n) = k.strip_prefix("model/") {
            model.insert(n.to_string(), t);
        } else if let Some(rest) = k.strip_prefix("ema/") {
            let (idx, n) = rest
                .split_once('/')
                .with_context(|| format!("{file}: bad EMA entry {k}"))?;
            let idx: usize = idx
                .parse()
                .with_context(|| format!("{file}: bad EMA index in {k}"))?;
            ema.push((idx, n.to_string(), t));
        } else if let Some(n) = k.strip_prefix("optim/") {
            optim.push((n.to_string(), t));
        } else if let Some(n) = k.strip_prefix("acc/") {
            acc.push((n.to_string(), t));
        }
    }
    ema.sort_by_key(|e| e.0);
    Ok(TrainState {
        meta,
        model,
        ema: ema.into_iter().map(|(_, n, t)| (n, t)).collect(),
        optim,
        acc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters sit at the top level of the metadata JSON, so states written before they
    /// were one struct read the same; keys added later read their defaults.
    #[test]
    fn metadata_json_keeps_its_flat_keys() {
        let meta = CheckpointMeta {
            version: 2,
            epoch: 3,
            next_batch: 7,
            progress: EpochProgress::default(),
            counters: Counters {
                best_fitness: 0.5,
                best_epoch: Some(2),
                last_opt_step: 41,
                lr_scale: 0.25,
                nan_rollbacks: 2,
            },
            ema_updates: 10,
            iterations: 40,
            batches_tracked: 40,
            micro: 4,
            budget: None,
            args: serde_json::json!({"epochs": 5}),
        };
        let v = serde_json::to_value(&meta).unwrap();
        assert_eq!(v["best_fitness"], 0.5);
        assert_eq!(v["lr_scale"], 0.25);
        assert_eq!(v["last_opt_step"], 41);
        assert!(v.get("counters").is_none());
        assert_eq!(serde_json::from_value::<CheckpointMeta>(v).unwrap(), meta);
        // A version-1 state: no next_batch, progress, lr_scale, micro or nan_rollbacks.
        let old = r#"{"version": 1, "epoch": 4, "best_fitness": 0.1, "best_epoch": null,
            "ema_updates": 3, "iterations": 9, "last_opt_step": 8, "batches_tracked": 9,
            "args": {}}"#;
        let m: CheckpointMeta = serde_json::from_str(old).unwrap();
        assert_eq!(
            m.counters,
            Counters {
                best_fitness: 0.1,
                best_epoch: None,
                last_opt_step: 8,
                lr_scale: 1.0,
                nan_rollbacks: 0,
            }
        );
        assert_eq!((m.next_batch, m.micro), (0, 0));
    }
}
