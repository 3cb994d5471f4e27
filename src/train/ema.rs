//! Exponential moving average of the model state (official `utils/torch_utils.py ModelEMA`).
//!
//! Averages every floating-point entry of the state_dict — parameters *and* BatchNorm running
//! statistics — with the ramped decay `d(u) = decay · (1 − e^(−u/tau))`, `decay = 0.9999`,
//! `tau = 2000`, where `u` is the number of updates so far (counted from 1):
//! `ema = d · ema + (1 − d) · model`. The EMA weights are the ones validated and saved.
//!
//! Entries marked frozen ([`Ema::freeze`], the parameters of `--freeze` layers) keep their
//! value: the model's copy never changes, and `d · x + (1 − d) · x` need not round back to `x`
//! in f32, so averaging them could still move them by an ulp.

use anyhow::{Context, Result};
use candle_core::Tensor;

/// The EMA of a named model state.
#[derive(Debug, Clone)]
pub struct Ema {
    /// Averaged tensors, by official state_dict name (f32).
    pub state: Vec<(String, Tensor)>,
    /// Number of updates so far (saved in checkpoints for exact resume).
    pub updates: u64,
    /// Base decay (0.9999).
    pub decay: f64,
    /// Ramp constant in updates (2000).
    pub tau: f64,
    /// Per entry of `state`: true when it is frozen (never averaged).
    frozen: Vec<bool>,
}

impl Ema {
    /// Starts an EMA as a copy of `state` (official: `deepcopy(model)`), with `updates = 0`.
    pub fn new(state: &[(String, Tensor)]) -> Result<Self> {
        let state = state
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.detach().copy()?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Ema {
            frozen: vec![false; state.len()],
            state,
            updates: 0,
            decay: 0.9999,
            tau: 2000.0,
        })
    }

    /// Marks the entries named in `names` as frozen: [`Ema::update`] leaves them as they are.
    /// Returns how many entries were marked.
    pub fn freeze(&mut self, names: &[String]) -> usize {
        let set: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        self.frozen = self
            .state
            .iter()
            .map(|(n, _)| set.contains(n.as_str()))
            .collect();
        self.frozen.iter().filter(|&&f| f).count()
    }

    /// The decay used for update number `u` (1-based).
    pub fn decay_at(&self, u: u64) -> f64 {
        self.decay * (1.0 - (-(u as f64) / self.tau).exp())
    }

    /// One update from the current model state; `model` must hold the same names in the same
    /// order as the EMA (an error names the first mismatch).
    pub fn update(&mut self, model: &[(String, Tensor)]) -> Result<()> {
        anyhow::ensure!(
            model.len() == self.state.len(),
            "EMA holds {} tensors, model state has {}",
            self.state.len(),
            model.len()
        );
        self.updates += 1;
        let d = self.decay_at(self.updates);
        for ((name, _), (mname, _)) in self.state.iter().zip(model) {
            anyhow::ensure!(name == mname, "EMA entry {name} vs model entry {mname}");
        }
        #[cfg(feature = "cuda")]
        {
            let live = |i: &usize| !self.frozen.get(*i).copied().unwrap_or(false);
            let e: Vec<&Tensor> = (0..self.state.len())
                .filter(live)
                .map(|i| &self.state[i].1)
                .collect();
            let m: Vec<&Tensor> = (0..model.len()).filter(live).map(|i| &model[i].1).collect();
            if crate::cuda::optim::applies(&e) && crate::cuda::optim::applies(&m) {
                // One multi-tensor kernel, in place (the EMA owns its tensors: `new` and the
                // restore paths copy), with the rounding of the ops below.
                crate::cuda::optim::ema(&e, &m, d as f32, (1.0 - d) as f32)
                    .context("EMA update")?;
                return Ok(());
            }
        }
        for (i, ((name, e), (_, m))) in self.state.iter_mut().zip(model).enumerate() {
            if self.frozen.get(i).copied().unwrap_or(false) {
                continue;
            }
            let next = ((&*e * d)? + (m.detach() * (1.0 - d))?)
                .with_context(|| format!("EMA update of {name}"))?;
            *e = next;
        }
        Ok(())
    }
}
