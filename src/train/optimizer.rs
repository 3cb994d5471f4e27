//! SGD with Nesterov momentum and the three official parameter groups.
//!
//! Follows the official `utils/torch_utils.py smart_optimizer(name='SGD')` and PyTorch's
//! `torch.optim.SGD(momentum, nesterov=True, dampening=0)`:
//!
//! ```text
//! g   = grad + weight_decay * p            (only the decay group has weight_decay != 0)
//! buf = g                    on the first step of a parameter
//! buf = momentum * buf + g   afterwards
//! p  -= lr * (g + momentum * buf)          (Nesterov)
//! ```
//!
//! Groups, in the official order (`pg0..pg2` in results.csv):
//! - [`ParamGroup::Bias`]: every bias (no decay; its warmup LR starts at `warmup_bias_lr`),
//! - [`ParamGroup::ConvWeight`]: conv weights (weight decay `5e-4 * batch * accumulate / 64`),
//! - [`ParamGroup::BnWeight`]: BatchNorm weights (no decay).
//!
//! BatchNorm running statistics are buffers, never parameters: they are not in the optimizer.

use anyhow::{Context, Result};
use candle_core::{backprop::GradStore, DType, Tensor, Var};

pub use crate::model::ParamGroup;

/// Index of a group in the official order (`pg0` biases, `pg1` decayed conv weights, `pg2`
/// BatchNorm weights): the index into [`Sgd::lr`] and the `lr/pgN` columns of results.csv.
pub fn pg_index(group: ParamGroup) -> usize {
    match group {
        ParamGroup::Bias => 0,
        ParamGroup::ConvWeight => 1,
        ParamGroup::BnWeight => 2,
    }
}

/// The group of a parameter from its official state_dict name: `*.bias` → Bias, `*.bn.weight`
/// → BnWeight (every BatchNorm of YOLOv9 is named `bn`), other `*.weight` → ConvWeight. Gives the
/// same groups as the model's structural assignment (`YoloV9Train::vars`) and as the isinstance
/// tests of the official `smart_optimizer`.
pub fn group_of(name: &str) -> ParamGroup {
    if name.ends_with(".bias") {
        ParamGroup::Bias
    } else if name.ends_with(".bn.weight") {
        ParamGroup::BnWeight
    } else {
        ParamGroup::ConvWeight
    }
}

/// One trainable parameter: its official name, the variable and its group.
#[derive(Debug, Clone)]
pub struct Param {
    /// Official state_dict name, e.g. `model.0.conv.weight`.
    pub name: String,
    /// The trainable tensor (f32).
    pub var: Var,
    /// Its optimizer group.
    pub group: ParamGroup,
}

/// SGD with Nesterov momentum over three parameter groups, with state that can be saved and
/// restored exactly (momentum buffers by parameter name).
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Param>,
    /// Momentum buffer per parameter (None before its first update).
    buffers: Vec<Option<Tensor>>,
    /// Learning rate of each group, indexed by [`pg_index`].
    pub lr: [f64; 3],
    /// Momentum shared by all groups (0.937; 0.8 → 0.937 during warmup).
    pub momentum: f64,
    /// Weight decay of the [`ParamGroup::ConvWeight`] group (already scaled by batch × accumulate / 64).
    pub weight_decay: f64,
}

impl Sgd {
    /// New optimizer over `params` (named variables); groups are derived from the names.
    pub fn new(params: Vec<(String, Var)>, lr: f64, momentum: f64, weight_decay: f64) -> Self {
        let params: Vec<Param> = params
            .into_iter()
            .map(|(name, var)| Param {
                group: group_of(&name),
                name,
                var,
            })
            .collect();
        let buffers = vec![None; params.len()];
        Sgd {
            params,
            buffers,
            lr: [lr; 3],
            momentum,
            weight_decay,
        }
    }

    /// The parameters, in the order given to [`Sgd::new`].
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Number of parameters in each group (`[bias, weight, bn_weight]`).
    pub fn group_sizes(&self) -> [usize; 3] {
        let mut n = [0; 3];
        for p in &self.params {
            n[pg_index(p.group)] += 1;
        }
        n
    }

    /// The gradients of `grads` that belong to parameters, in parameter order.
    fn present<'a>(&self, grads: &'a GradStore) -> Vec<&'a Tensor> {
        self.params
            .iter()
            .filter_map(|p| grads.get(p.var.as_tensor()))
            .collect()
    }

    /// Global L2 norm of all gradients present in `grads` (as `torch.nn.utils.clip_grad_norm_`).
    ///
    /// On a CUDA device (contiguous f32 gradients) one multi-tensor kernel sums the squares in
    /// f64 in a fixed order ([`crate::cuda::optim::sum_squares`]); elsewhere per-tensor f32 sums
    /// are added in f64. Either way one read-back.
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let gs = self.present(grads);
        if gs.is_empty() {
            return Ok(0.0);
        }
        #[cfg(feature = "cuda")]
        if crate::cuda::optim::applies(&gs) {
            return Ok(crate::cuda::optim::sum_squares(&gs)?.sqrt());
        }
        // Per-tensor sums of squares (f32 reductions, as PyTorch's per-tensor norms), added in
        // f64 on the device; one read back instead of one synchronisation per parameter.
        let mut sums = Vec::with_capacity(gs.len());
        for g in gs {
            sums.push(g.sqr()?.sum_all()?.to_dtype(DType::F64)?);
        }
        let total = Tensor::stack(&sums, 0)?.sum_all()?.to_scalar::<f64>()?;
        Ok(total.sqrt())
    }

    /// Scales all gradients so that their global norm is at most `max_norm` (official: 10.0).
    /// Returns the norm before clipping; a non-finite norm leaves the gradients untouched and
    /// is returned as is (the caller's NaN guard decides). On CUDA the gradients are scaled in
    /// place by one kernel (the gradient store owns them).
    pub fn clip_grad_norm(&self, grads: &mut GradStore, max_norm: f64) -> Result<f64> {
        let norm = self.grad_norm(grads)?;
        let coef = max_norm / (norm + 1e-6);
        if norm.is_finite() && coef < 1.0 {
            #[cfg(feature = "cuda")]
            {
                let gs = self.present(grads);
                if crate::cuda::optim::applies(&gs) {
                    crate::cuda::optim::scale(&gs, coef as f32)?;
                    return Ok(norm);
                }
            }
            for p in &self.params {
                if let Some(g) = grads.remove(p.var.as_tensor()) {
                    grads.insert(p.var.as_tensor(), (g * coef)?);
                }
            }
        }
        Ok(norm)
    }

    /// One optimizer step with the gradients in `grads`. Parameters without a gradient (e.g.
    /// the frozen DFL conv) are skipped, as PyTorch does.
    ///
    /// On a CUDA device (contiguous f32 parameters and gradients) every parameter is updated by
    /// one multi-tensor kernel in place ([`crate::cuda::optim::sgd_nesterov`], the same rounding
    /// as the ops below); elsewhere by candle ops per parameter.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        #[cfg(feature = "cuda")]
        if self.step_fused(grads)? {
            return Ok(());
        }
        let m = self.momentum;
        for (p, buf) in self.params.iter().zip(self.buffers.iter_mut()) {
            let Some(g) = grads.get(p.var.as_tensor()) else {
                continue;
            };
            // Both detached. Candle's backward leaves a variable's gradient attached to the op
            // graph when it was computed from tracked tensors (e.g. a conv's input activations),
            // and `w` is a variable: keeping either in the momentum buffer would keep the whole
            // forward graph of the step alive and chain it to the next step's (a leak of about a
            // training step's activations per step).
            let g = g.detach();
            let w = p.var.as_tensor().detach();
            let g = if p.group == ParamGroup::ConvWeight && self.weight_decay != 0.0 {
                (g + (&w * self.weight_decay)?)?
            } else {
                g.clone()
            };
            let b = match buf.take() {
                None => g.clone(),
                Some(b) => ((b * m)? + &g)?,
            };
            let update = (&g + (&b * m)?)?;
            let lr = self.lr[pg_index(p.group)];
            p.var
                .set(&(&w - (update * lr)?)?)
                .with_context(|| format!("updating {}", p.name))?;
            *buf = Some(b);
        }
        Ok(())
    }

    /// The fused CUDA step; false (nothing done) when the tensors are not all contiguous f32 on
    /// one CUDA device. Momentum buffers start at zero, which gives the first step's buffer
    /// `0 * momentum + g = g` exactly.
    #[cfg(feature = "cuda")]
    fn step_fused(&mut self, grads: &GradStore) -> Result<bool> {
        let mut idx = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            if let Some(g) = grads.get(p.var.as_tensor()) {
                if !crate::cuda::optim::applies(&[p.var.as_tensor(), g]) {
                    return Ok(false);
                }
                idx.push(i);
            }
        }
        if idx.is_empty() {
            return Ok(true);
        }
        for &i in &idx {
            if self.buffers[i].is_none() {
                self.buffers[i] = Some(self.params[i].var.as_tensor().zeros_like()?);
            }
        }
        let w: Vec<&Tensor> = idx
            .iter()
            .map(|&i| self.params[i].var.as_tensor())
            .collect();
        let b: Vec<&Tensor> = idx
            .iter()
            .map(|&i| self.buffers[i].as_ref().expect("allocated above"))
            .collect();
        let g: Vec<&Tensor> = idx
            .iter()
            .map(|&i| grads.get(self.params[i].var.as_tensor()).expect("present"))
            .collect();
        let lr: Vec<f32> = idx
            .iter()
            .map(|&i| self.lr[pg_index(self.params[i].group)] as f32)
            .collect();
        let wd: Vec<f32> = idx
            .iter()
            .map(|&i| {
                if self.params[i].group == ParamGroup::ConvWeight {
                    self.weight_decay as f32
                } else {
                    0.0
                }
            })
            .collect();
        if !crate::cuda::optim::applies(&b) {
            return Ok(false);
        }
        crate::cuda::optim::sgd_nesterov(&w, &b, &g, &lr, &wd, self.momentum as f32)?;
        Ok(true)
    }

    /// The momentum buffers by parameter name (for checkpoints). Parameters never updated have
    /// no entry.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .zip(&self.buffers)
            .filter_map(|(p, b)| b.as_ref().map(|b| (p.name.clone(), b.clone())))
            .collect()
    }

    /// Restores momentum buffers saved by [`Sgd::state`]. Errors name an unknown parameter or a
    /// shape mismatch.
    pub fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        for b in self.buffers.iter_mut() {
            *b = None;
        }
        for (name, t) in state {
            let i = self
                .params
                .iter()
                .position(|p| &p.name == name)
                .with_context(|| format!("optimizer state has unknown parameter {name}"))?;
            let want = self.params[i].var.shape();
            anyhow::ensure!(
                t.shape() == want,
                "optimizer state for {name} has shape {:?}, parameter has {:?}",
                t.shape(),
                want
            );
            // A copy: the fused CUDA step writes buffers in place, so they must not share the
            // caller's storage (e.g. a kept good state).
            self.buffers[i] = Some(t.to_device(self.params[i].var.device())?.copy()?);
        }
        Ok(())
    }
}
