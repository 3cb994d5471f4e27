//! Parameter source for building the network: official state_dict names → tensors on the target
//! device, either as plain tensors (inference, folded) or as trainable [`Var`]s (training).
//!
//! The builder records every trainable parameter with its official name and optimizer group, and
//! every BatchNorm buffer, so a trained model can be written back as an official state_dict.

use crate::model::rename::NameMap;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;

/// Optimizer group of a trainable parameter, following the official `smart_optimizer`:
/// group 0 = weights with weight decay (conv weights), group 1 = BatchNorm weights (no decay),
/// group 2 = biases (BatchNorm biases and conv biases, no decay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamGroup {
    /// Convolution kernels (`*.conv.weight`, head `*.2.weight`): decayed.
    ConvWeight,
    /// BatchNorm scale (`*.bn.weight`): not decayed.
    BnWeight,
    /// Any bias (`*.bn.bias`, head `*.2.bias`): not decayed.
    Bias,
}

/// A trainable parameter: official state_dict name, the variable, its optimizer group.
#[derive(Clone)]
pub struct NamedVar {
    /// Official state_dict name, e.g. `model.0.conv.weight`.
    pub name: String,
    /// The variable (f32, on the model's device).
    pub var: Var,
    /// Optimizer group.
    pub group: ParamGroup,
}

/// How tensors are turned into layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildMode {
    /// Inference: every tensor must be present with the expected shape; BN is folded.
    Fused,
    /// Training: tensors become [`Var`]s; missing or mis-shaped ones are freshly initialized.
    Train,
}

/// Builds layers from a flat state_dict with official names. Layers ask for the names of the
/// graph being built; a source of the other graph (training weights for the inference graph, or
/// the reverse) is read through a [`NameMap`].
///
/// A *describing* build ([`Builder::describing`]) reads nothing and allocates no parameters: it
/// records every `(name, shape)` the layers ask for, in order, which is how
/// [`crate::model::keys`] lists a graph's state_dict.
pub struct Builder<'a> {
    tensors: Option<&'a HashMap<String, Tensor>>,
    rename: Option<NameMap>,
    /// The entries asked for, in a describing build.
    pub(crate) described: Option<Vec<(String, Vec<usize>)>>,
    pub(crate) device: Device,
    pub(crate) mode: BuildMode,
    pub(crate) vars: Vec<NamedVar>,
    /// BN buffers: (prefix `model.N....bn`, running_mean, running_var).
    pub(crate) buffers: Vec<(String, Var, Var)>,
    /// Names that were not found in the source (or had another shape) and were initialized.
    pub(crate) initialized: Vec<String>,
    /// Of `initialized`, those the source holds with another shape: (name, the source's shape,
    /// the model's shape) — the tensors the official `intersect_dicts` drops, e.g. the class
    /// convs of weights for another class count.
    pub(crate) reshaped: Vec<(String, Vec<usize>, Vec<usize>)>,
    /// Shared `num_batches_tracked` counter of all BN layers (they always move together).
    pub(crate) batches_tracked: Arc<AtomicI64>,
    rng: u64,
    /// Storage dtype of fused inference kernels and biases (f32 unless [`Builder::fused_dtype`]
    /// asks for half precision); folding itself always runs in f32.
    pub(crate) fused_dtype: DType,
}

impl<'a> Builder<'a> {
    /// A builder over `tensors` (official names; read through `rename` when they belong to the
    /// other graph), placing tensors on `device`. `seed` drives the initialization of tensors
    /// missing in training mode.
    pub fn new(
        tensors: Option<&'a HashMap<String, Tensor>>,
        rename: Option<NameMap>,
        device: &Device,
        mode: BuildMode,
        seed: u64,
    ) -> Self {
        Self {
            tensors,
            rename,
            described: None,
            device: device.clone(),
            mode,
            vars: Vec::new(),
            buffers: Vec::new(),
            initialized: Vec::new(),
            reshaped: Vec::new(),
            batches_tracked: Arc::new(AtomicI64::new(0)),
            rng: seed ^ 0x9E37_79B9_7F4A_7C15,
            fused_dtype: DType::F32,
        }
    }

    /// A describing build (see the type docs): training-mode layers on the CPU whose parameters
    /// are unallocated zeros; [`Builder::described`] holds the entries.
    pub fn describing() -> Self {
        let mut b = Self::new(None, None, &Device::Cpu, BuildMode::Train, 0);
        b.described = Some(Vec::new());
        b
    }

    /// Records a constant entry (the DFL kernels) in a describing build; a no-op otherwise.
    pub fn constant(&mut self, name: &str, shape: &[usize]) {
        if let Some(d) = &mut self.described {
            d.push((name.to_string(), shape.to_vec()));
        }
    }

    /// In a describing build, records the entry and returns unallocated zeros of `shape`.
    fn describe(&mut self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        let Some(d) = &mut self.described else {
            return Ok(None);
        };
        d.push((name.to_string(), shape.to_vec()));
        Ok(Some(
            Tensor::zeros((), DType::F32, &self.device)?.broadcast_as(shape)?,
        ))
    }

    /// The name of `name` in the source.
    fn source_name(&self, name: &str) -> Option<String> {
        match &self.rename {
            None => Some(name.to_string()),
            Some(m) => m.map(name),
        }
    }

    /// Stores the fused (inference) kernels and biases in `dtype` (f32, f16 or bf16) after the
    /// f32 folding. Training builds ignore it (their parameters stay f32 variables).
    pub fn fused_dtype(mut self, dtype: DType) -> Self {
        self.fused_dtype = dtype;
        self
    }

    /// A folded inference conv's `(kernel, bias)` cast to the build's fused dtype.
    pub(crate) fn finish_fused(
        &self,
        w: Tensor,
        bias: Tensor,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        Ok((
            w.to_dtype(self.fused_dtype)?,
            bias.to_dtype(self.fused_dtype)?,
        ))
    }

    /// Trainable variables created so far (training mode), in creation order.
    pub fn vars(&self) -> &[NamedVar] {
        &self.vars
    }

    /// Names initialized because the source lacked them (or had another shape).
    pub fn initialized(&self) -> &[String] {
        &self.initialized
    }

    /// splitmix64 → uniform f32 in [0, 1).
    fn next_uniform(&mut self) -> f32 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Looks up `name` in the source; checks dtype and shape. `Ok(None)` when absent (or, in
    /// training mode, present with another shape — the official `intersect_dicts` drops those).
    fn lookup(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor>> {
        let src_name = self.source_name(name);
        let found = match (self.tensors, &src_name) {
            (Some(t), Some(n)) => t.get(n),
            _ => None,
        };
        let src_name = src_name.unwrap_or_else(|| name.to_string());
        match found {
            None => Ok(None),
            Some(t) if t.dims() != shape => {
                if self.mode == BuildMode::Train {
                    Ok(None)
                } else {
                    bail!(
                        "weights: tensor `{src_name}` has shape {:?}, the model's graph needs {shape:?} \
                         (are these weights for another model or another number of classes?)",
                        t.dims()
                    )
                }
            }
            Some(t) => {
                let t = t
                    .to_dtype(DType::F32)
                    .and_then(|t| t.to_device(&self.device))
                    .with_context(|| {
                        format!("weights: moving `{src_name}` to {:?}", self.device)
                    })?;
                Ok(Some(t))
            }
        }
    }

    /// A required tensor (inference mode) or a trainable one (training mode, initialized with
    /// `init` when absent).
    pub fn param(
        &mut self,
        name: &str,
        shape: &[usize],
        group: ParamGroup,
        init: Init,
    ) -> Result<Tensor> {
        if let Some(z) = self.describe(name, shape)? {
            return Ok(z);
        }
        let t = self.lookup(name, shape)?;
        match self.mode {
            BuildMode::Fused => t.with_context(|| {
                format!(
                    "weights: missing tensor `{}` (shape {shape:?}); the file is not a complete \
                     state_dict of this model — re-convert it with `yolo9 convert`",
                    self.source_name(name).unwrap_or_else(|| name.to_string())
                )
            }),
            BuildMode::Train => {
                let t = match t {
                    Some(t) => t,
                    None => {
                        self.note_initialized(name, shape);
                        self.init_tensor(shape, init)?
                    }
                };
                let var = Var::from_tensor(&t)?;
                let out = var.as_tensor().clone();
                self.vars.push(NamedVar {
                    name: name.to_string(),
                    var,
                    group,
                });
                Ok(out)
            }
        }
    }

    /// A non-trainable buffer (BN running stats): present, or `init` in training mode.
    pub fn buffer(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        if let Some(z) = self.describe(name, shape)? {
            if name.ends_with(".running_var") {
                let p = name.trim_end_matches("running_var");
                self.constant(&format!("{p}num_batches_tracked"), &[]);
            }
            return Ok(z);
        }
        let t = self.lookup(name, shape)?;
        match (t, self.mode) {
            (Some(t), _) => Ok(t),
            (None, BuildMode::Fused) => bail!(
                "weights: missing tensor `{}` (shape {shape:?}); the file is not a complete \
                 state_dict of this model — re-convert it with `yolo9 convert`",
                self.source_name(name).unwrap_or_else(|| name.to_string())
            ),
            (None, BuildMode::Train) => {
                self.note_initialized(name, shape);
                self.init_tensor(shape, init)
            }
        }
    }

    /// Records that `name` (of `shape`) is initialized rather than loaded, and, when the source
    /// has it with another shape, that shape.
    fn note_initialized(&mut self, name: &str, shape: &[usize]) {
        self.initialized.push(name.to_string());
        let src = match (self.tensors, self.source_name(name)) {
            (Some(t), Some(n)) => t.get(&n),
            _ => None,
        };
        if let Some(t) = src {
            if t.dims() != shape {
                self.reshaped
                    .push((name.to_string(), t.dims().to_vec(), shape.to_vec()));
            }
        }
    }

    /// A new tensor of `shape` drawn from this builder's seeded generator with `init` (the
    /// from-scratch initialisation; the draw order is the state_dict order).
    pub fn init_tensor(&mut self, shape: &[usize], init: Init) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = match init {
            Init::Const(c) => vec![c; n],
            Init::Uniform(bound) => (0..n)
                .map(|_| (self.next_uniform() * 2.0 - 1.0) * bound)
                .collect(),
        };
        Ok(Tensor::from_vec(data, shape, &self.device)?)
    }
}

/// Initializer for tensors missing from the source (training from scratch / new class count).
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// Every element equal.
    Const(f32),
    /// U(-b, b); PyTorch's default conv init is `b = 1/sqrt(fan_in)`.
    Uniform(f32),
}
