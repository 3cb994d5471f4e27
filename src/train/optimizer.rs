//! The optimizers of `--optimizer SGD|Adam|AdamW` over the three official parameter groups.
//!
//! Follows the official `utils/torch_utils.py smart_optimizer(model, name, lr0, momentum,
//! weight_decay)` and PyTorch's optimizers. With `g` the gradient, `p` the parameter, `lr` the
//! group's learning rate and `wd` the group's weight decay (non-zero for the decay group only):
//!
//! ```text
//! SGD    (torch.optim.SGD(momentum, nesterov=True, dampening=0)):
//!        g   = grad + wd * p
//!        buf = g                    on the first step of a parameter
//!        buf = momentum * buf + g   afterwards
//!        p  -= lr * (g + momentum * buf)                       (Nesterov)
//! Adam   (torch.optim.Adam(betas=(momentum, 0.999), eps=1e-8), L2 weight decay):
//!        g  = grad + wd * p
//!        t += 1;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//!        p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//! AdamW  (torch.optim.AdamW(betas=(momentum, 0.999), eps=1e-8), decoupled weight decay):
//!        p *= 1 - lr * wd;  then the Adam update with g = grad
//! ```
//!
//! `b1` is the hyp `momentum` (0.937) as in the official `betas=(momentum, 0.999)`; the warmup
//! ramps only SGD's momentum (the official warmup sets `momentum` only in groups that have one,
//! and Adam's groups have `betas`). The weight decay is the hyp value scaled by
//! `batch * accumulate / 64`, as for SGD.
//!
//! Groups, in the official order (`pg0..pg2` in results.csv):
//! - [`ParamGroup::Bias`]: every bias (no decay; its warmup LR starts at `warmup_bias_lr`),
//! - [`ParamGroup::ConvWeight`]: conv weights (weight decay `5e-4 * batch * accumulate / 64`),
//! - [`ParamGroup::BnWeight`]: BatchNorm weights (no decay).
//!
//! BatchNorm running statistics are buffers, never parameters: they are not in the optimizer.
//! Parameters left out of the optimizer (`--freeze`, see [`crate::train::trainer`]) get no
//! update at all, weight decay included.
//!
//! On CUDA, SGD runs as one fused multi-tensor kernel ([`crate::cuda::optim::sgd_nesterov`]);
//! Adam and AdamW run as candle ops per parameter on every device (there is no fused Adam
//! kernel).

use anyhow::{Context, Result};
use candle_core::{backprop::GradStore, DType, Tensor, Var};

pub use crate::model::ParamGroup;

/// Index of a group in the official order (`pg0` biases, `pg1` decayed conv weights, `pg2`
/// BatchNorm weights): the index into [`Optimizer::lr`] and the `lr/pgN` columns of results.csv.
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

/// Which optimizer (`--optimizer`, official `smart_optimizer(name)`); SGD by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum OptimizerKind {
    /// SGD with Nesterov momentum (the official default).
    #[default]
    #[serde(rename = "SGD")]
    Sgd,
    /// Adam with L2 weight decay on the decay group.
    #[serde(rename = "Adam")]
    Adam,
    /// AdamW: decoupled weight decay on the decay group.
    #[serde(rename = "AdamW")]
    AdamW,
}

impl OptimizerKind {
    /// The official name (`SGD`, `Adam`, `AdamW`).
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "SGD",
            OptimizerKind::Adam => "Adam",
            OptimizerKind::AdamW => "AdamW",
        }
    }
}

impl std::str::FromStr for OptimizerKind {
    type Err = String;
    /// `SGD`, `Adam` or `AdamW` (any case), as the official `--optimizer` choices.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "sgd" => Ok(OptimizerKind::Sgd),
            "adam" => Ok(OptimizerKind::Adam),
            "adamw" => Ok(OptimizerKind::AdamW),
            _ => Err(format!(
                "invalid optimizer '{s}': expected SGD, Adam or AdamW"
            )),
        }
    }
}

/// Adam's second-moment decay (`betas[1]` of the official `smart_optimizer`).
pub const ADAM_BETA2: f64 = 0.999;
/// Adam's `eps` (PyTorch's default).
pub const ADAM_EPS: f64 = 1e-8;

/// Suffix of the first-moment entries of Adam in [`Optimizer::state`].
const EXP_AVG: &str = "#exp_avg";
/// Suffix of the second-moment entries.
const EXP_AVG_SQ: &str = "#exp_avg_sq";
/// Suffix of the step-count entries (a one-element f64 tensor).
const STEP: &str = "#step";

/// Adam state of one parameter (PyTorch's `exp_avg`, `exp_avg_sq`, `step`).
#[derive(Debug, Clone)]
struct AdamSlot {
    m: Tensor,
    v: Tensor,
    t: u64,
}

/// The optimizer of a run over three parameter groups ([`OptimizerKind`]: SGD, Adam or AdamW),
/// with state that can be saved and restored exactly (by parameter name).
#[derive(Debug)]
pub struct Optimizer {
    kind: OptimizerKind,
    params: Vec<Param>,
    /// SGD momentum buffer per parameter (None before its first update).
    buffers: Vec<Option<Tensor>>,
    /// Adam moments per parameter (None before its first update).
    adam: Vec<Option<AdamSlot>>,
    /// Learning rate of each group, indexed by [`pg_index`].
    pub lr: [f64; 3],
    /// SGD momentum shared by all groups (0.937; 0.8 → 0.937 during warmup); not used by Adam.
    pub momentum: f64,
    /// Adam's `beta1` (the hyp momentum when the optimizer was made; warmup leaves it).
    pub beta1: f64,
    /// Weight decay of the [`ParamGroup::ConvWeight`] group (already scaled by batch × accumulate / 64).
    pub weight_decay: f64,
}

/// The former name of [`Optimizer`] (SGD was the only optimizer); [`Sgd::new`] makes an SGD one.
pub type Sgd = Optimizer;

impl Optimizer {
    /// New SGD optimizer over `params` (named variables); groups are derived from the names.
    pub fn new(params: Vec<(String, Var)>, lr: f64, momentum: f64, weight_decay: f64) -> Self {
        Self::with_kind(OptimizerKind::Sgd, params, lr, momentum, weight_decay)
    }

    /// New optimizer of `kind` over `params`, as the official `smart_optimizer(model, kind, lr,
    /// momentum, weight_decay)`: for Adam/AdamW `momentum` is `beta1`.
    pub fn with_kind(
        kind: OptimizerKind,
        params: Vec<(String, Var)>,
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    ) -> Self {
        let params: Vec<Param> = params
            .into_iter()
            .map(|(name, var)| Param {
                group: group_of(&name),
                name,
                var,
            })
            .collect();
        let buffers = vec![None; params.len()];
        let adam = vec![None; params.len()];
        Optimizer {
            kind,
            params,
            buffers,
            adam,
            lr: [lr; 3],
            momentum,
            beta1: momentum,
            weight_decay,
        }
    }

    /// Which optimizer this is.
    pub fn kind(&self) -> OptimizerKind {
        self.kind
    }

    /// The parameters, in the order given to [`Optimizer::new`].
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
    /// SGD: on a CUDA device (contiguous f32 parameters and gradients) every parameter is updated
    /// by
    /// one multi-tensor kernel in place ([`crate::cuda::optim::sgd_nesterov`], the same rounding
    /// as the ops below); elsewhere by candle ops per parameter.
    /// Adam and AdamW run as candle ops on every device (no fused kernel).
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        if self.kind != OptimizerKind::Sgd {
            return self.step_adam(grads);
        }
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

    /// One Adam/AdamW step (see the module docs), in f32 candle ops per parameter; the step
    /// count and bias corrections are per parameter, as PyTorch's.
    fn step_adam(&mut self, grads: &GradStore) -> Result<()> {
        let (b1, b2) = (self.beta1, ADAM_BETA2);
        for (p, slot) in self.params.iter().zip(self.adam.iter_mut()) {
            let Some(g) = grads.get(p.var.as_tensor()) else {
                continue;
            };
            // Detached, as in the SGD step (no forward graph kept alive by the state).
            let g = g.detach();
            let mut w = p.var.as_tensor().detach();
            let lr = self.lr[pg_index(p.group)];
            let wd = if p.group == ParamGroup::ConvWeight {
                self.weight_decay
            } else {
                0.0
            };
            let g = match self.kind {
                OptimizerKind::Adam if wd != 0.0 => (g + (&w * wd)?)?,
                OptimizerKind::AdamW if wd != 0.0 => {
                    w = (&w * (1.0 - lr * wd))?;
                    g
                }
                _ => g,
            };
            let (m, v, t) = match slot.take() {
                None => ((&g * (1.0 - b1))?, (g.sqr()? * (1.0 - b2))?, 1u64),
                Some(s) => (
                    ((s.m * b1)? + (&g * (1.0 - b1))?)?,
                    ((s.v * b2)? + (g.sqr()? * (1.0 - b2))?)?,
                    s.t + 1,
                ),
            };
            let bc1 = 1.0 - b1.powi(t as i32);
            let bc2 = 1.0 - b2.powi(t as i32);
            let denom = ((v.sqrt()? / bc2.sqrt())? + ADAM_EPS)?;
            let update = ((&m / &denom)? * (lr / bc1))?;
            p.var
                .set(&(&w - update)?)
                .with_context(|| format!("updating {}", p.name))?;
            *slot = Some(AdamSlot { m, v, t });
        }
        Ok(())
    }

    /// The optimizer state by parameter name (for checkpoints): SGD's momentum buffers under the
    /// parameter's name; Adam's `<name>#exp_avg`, `<name>#exp_avg_sq` and `<name>#step` (a
    /// one-element f64 tensor). Parameters never updated have no entry.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        match self.kind {
            OptimizerKind::Sgd => self
                .params
                .iter()
                .zip(&self.buffers)
                .filter_map(|(p, b)| b.as_ref().map(|b| (p.name.clone(), b.clone())))
                .collect(),
            _ => {
                let mut out = Vec::new();
                for (p, s) in self.params.iter().zip(&self.adam) {
                    let Some(s) = s else { continue };
                    out.push((format!("{}{EXP_AVG}", p.name), s.m.clone()));
                    out.push((format!("{}{EXP_AVG_SQ}", p.name), s.v.clone()));
                    if let Ok(t) = Tensor::new(&[s.t as f64], &candle_core::Device::Cpu) {
                        out.push((format!("{}{STEP}", p.name), t));
                    }
                }
                out
            }
        }
    }

    /// Restores a state saved by [`Optimizer::state`] of the same optimizer kind. Errors name
    /// an unknown parameter, a shape mismatch, or a state of the other kind (e.g. SGD momentum
    /// buffers given to Adam: the run was saved with another `--optimizer`).
    pub fn load_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        for b in self.buffers.iter_mut() {
            *b = None;
        }
        for s in self.adam.iter_mut() {
            *s = None;
        }
        let adam_entry =
            |n: &str| n.ends_with(EXP_AVG) || n.ends_with(EXP_AVG_SQ) || n.ends_with(STEP);
        if let Some((n, _)) = state
            .iter()
            .find(|(n, _)| adam_entry(n) != (self.kind != OptimizerKind::Sgd))
        {
            anyhow::bail!(
                "optimizer state entry {n} was saved by {}, but this run uses {}; resume with the \
                 optimizer the run was started with",
                if adam_entry(n) { "Adam/AdamW" } else { "SGD" },
                self.kind.name()
            );
        }
        let index = |name: &str| -> Result<usize> {
            self.params
                .iter()
                .position(|p| p.name == name)
                .with_context(|| format!("optimizer state has unknown parameter {name}"))
        };
        if self.kind == OptimizerKind::Sgd {
            for (name, t) in state {
                let i = index(name)?;
                self.buffers[i] = Some(self.restored(i, name, t)?);
            }
            return Ok(());
        }
        let mut parts: Vec<(Option<Tensor>, Option<Tensor>, Option<u64>)> =
            vec![(None, None, None); self.params.len()];
        for (name, t) in state {
            if let Some(base) = name.strip_suffix(EXP_AVG) {
                let i = index(base)?;
                parts[i].0 = Some(self.restored(i, name, t)?);
            } else if let Some(base) = name.strip_suffix(EXP_AVG_SQ) {
                let i = index(base)?;
                parts[i].1 = Some(self.restored(i, name, t)?);
            } else if let Some(base) = name.strip_suffix(STEP) {
                let i = index(base)?;
                let v = t
                    .flatten_all()
                    .and_then(|t| t.to_dtype(DType::F64))
                    .and_then(|t| t.to_vec1::<f64>())
                    .with_context(|| format!("optimizer state {name}: not a step count"))?;
                anyhow::ensure!(
                    v.len() == 1 && v[0] >= 1.0 && v[0].fract() == 0.0,
                    "optimizer state {name}: step count {v:?} is not a positive integer"
                );
                parts[i].2 = Some(v[0] as u64);
            }
        }
        for (i, part) in parts.into_iter().enumerate() {
            match part {
                (None, None, None) => {}
                (Some(m), Some(v), Some(t)) => self.adam[i] = Some(AdamSlot { m, v, t }),
                _ => anyhow::bail!(
                    "optimizer state of {} is incomplete (Adam needs {EXP_AVG}, {EXP_AVG_SQ} \
                     and {STEP})",
                    self.params[i].name
                ),
            }
        }
        Ok(())
    }

    /// `t` as the state entry `name` of parameter `i`: its shape checked, copied onto the
    /// parameter's device (the fused CUDA step writes buffers in place, so they must not share
    /// the caller's storage, e.g. a kept good state).
    fn restored(&self, i: usize, name: &str, t: &Tensor) -> Result<Tensor> {
        let want = self.params[i].var.shape();
        anyhow::ensure!(
            t.shape() == want,
            "optimizer state for {name} has shape {:?}, parameter has {:?}",
            t.shape(),
            want
        );
        Ok(t.to_device(self.params[i].var.device())?.copy()?)
    }
}
