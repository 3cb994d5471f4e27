//! Training-state checkpoints for `--resume`: model state, EMA state and update count, SGD
//! momentum buffers, epoch, best fitness and the run arguments, in one safetensors file written
//! atomically (temporary file, fsync, rename).
//!
//! Layout: tensors `model/<name>` (the training graph's state_dict, f32, BN running stats
//! included), `ema/<name>` (the EMA state), `optim/<name>` (momentum buffers); metadata key
//! `yolo9-train-state` holds [`CheckpointMeta`] as JSON. The official equivalent is the `last.pt`
//! dict of `train_dual.py` (`epoch`, `best_fitness`, `model`, `ema`, `updates`, `optimizer`, `opt`).

use crate::model::weights::write_atomic;
use anyhow::{ensure, Context, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Metadata key of the training state.
pub const STATE_KEY: &str = "yolo9-train-state";

/// Scalars of the training state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointMeta {
    /// Format version (1).
    pub version: u32,
    /// Last completed epoch (0-based).
    pub epoch: usize,
    /// Best fitness so far (`0.1·mAP50 + 0.9·mAP50-95`).
    pub best_fitness: f64,
    /// Epoch of the best fitness.
    pub best_epoch: Option<usize>,
    /// EMA update count.
    pub ema_updates: u64,
    /// Optimizer iterations counted since training start (`ni` of the next batch).
    pub iterations: usize,
    /// Iteration of the last optimizer step.
    pub last_opt_step: usize,
    /// `num_batches_tracked` of the BN layers.
    pub batches_tracked: i64,
    /// The run arguments (as written to args.yaml), JSON.
    pub args: serde_json::Value,
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
    /// SGD momentum buffers by parameter name (CPU).
    pub optim: Vec<(String, Tensor)>,
}

/// Writes the training state atomically to `path`.
pub fn save_state(
    path: &Path,
    meta: &CheckpointMeta,
    model: &HashMap<String, Tensor>,
    ema: &[(String, Tensor)],
    optim: &[(String, Tensor)],
) -> Result<()> {
    let cpu = Device::Cpu;
    let mut named: Vec<(String, Tensor)> = Vec::new();
    let mut keys: Vec<&String> = model.keys().collect();
    keys.sort();
    for k in keys {
        named.push((format!("model/{k}"), model[k].to_device(&cpu)?));
    }
    for (i, (k, t)) in ema.iter().enumerate() {
        // Index prefix keeps the EMA order (safetensors sorts names).
        named.push((format!("ema/{i:05}/{k}"), t.to_device(&cpu)?));
    }
    for (k, t) in optim {
        named.push((format!("optim/{k}"), t.to_device(&cpu)?));
    }
    let info: HashMap<String, String> =
        [(STATE_KEY.to_string(), serde_json::to_string(meta)?)].into();
    let bytes = safetensors::serialize(named.iter().map(|(n, t)| (n.as_str(), t)), Some(info))
        .with_context(|| format!("{}: cannot serialize the training state", path.display()))?;
    write_atomic(path, &bytes)
}

/// Reads a training state written by [`save_state`]. Errors name the file and what is wrong.
pub fn load_state(path: &Path) -> Result<TrainState> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).with_context(|| format!("{file}: cannot read"))?;
    let (_, md) = safetensors::SafeTensors::read_metadata(&bytes)
        .with_context(|| format!("{file}: not a safetensors file"))?;
    let meta_json = md
        .metadata()
        .as_ref()
        .and_then(|m| m.get(STATE_KEY))
        .with_context(|| {
            format!("{file}: no `{STATE_KEY}` metadata; pass a state.safetensors written by yolo9 train")
        })?;
    let meta: CheckpointMeta = serde_json::from_str(meta_json)
        .with_context(|| format!("{file}: bad `{STATE_KEY}` metadata"))?;
    ensure!(
        meta.version == 1,
        "{file}: unsupported state version {}",
        meta.version
    );
    let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .with_context(|| format!("{file}: cannot read tensors"))?;
    let mut model = HashMap::new();
    let mut ema = Vec::new();
    let mut optim = Vec::new();
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
        }
    }
    ema.sort_by_key(|e| e.0);
    Ok(TrainState {
        meta,
        model,
        ema: ema.into_iter().map(|(_, n, t)| (n, t)).collect(),
        optim,
    })
}
