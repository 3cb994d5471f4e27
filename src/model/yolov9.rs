//! The YOLOv9-s graph (official `models/detect/yolov9-s.yaml`), from one definition:
//!
//! - [`YoloV9`]: the inference graph = gelan-s (layers 0–21) + `DDetect` (the main branch of
//!   layer 29, `cv4`/`cv5`), BN folded and `RepConvN` fused at load time.
//! - [`YoloV9Train`]: the training graph = layers 0–28 (incl. the auxiliary branch 22–28) +
//!   `DualDDetect` over `[28, 25, 22 | 15, 18, 21]`, parameters as candle `Var`s, BN in train
//!   (batch statistics) or eval (running statistics) mode, `RepConvN` unfused.

use super::blocks::{AConv, Elan1, RepNCSPELAN4, SppElan};
use super::conv::{Conv, ConvSpec};
use super::graphs::ForwardGraphs;
use super::head::{decode, DetectHead, REG_MAX};
use super::params::{source_name, BuildMode, Builder, NamedVar};
use super::tape::{Ctx, Tape};
use crate::model::weights::{Graph, ModelMeta, Weights};
use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Head strides of YOLOv9-s in pixels (P3, P4, P5).
pub const STRIDES: [u32; 3] = [8, 16, 32];
/// Input channels of the three head levels (P3, P4, P5).
const HEAD_CH: [usize; 3] = [128, 192, 256];

/// Layers 0–21 (the gelan-s backbone + neck). Field `lN` is official layer `model.N`.
pub(crate) struct Gelan {
    l0: Conv,
    l1: Conv,
    l2: Elan1,
    l3: AConv,
    l4: RepNCSPELAN4,
    l5: AConv,
    l6: RepNCSPELAN4,
    l7: AConv,
    l8: RepNCSPELAN4,
    l9: SppElan,
    l12: RepNCSPELAN4,
    l15: RepNCSPELAN4,
    l16: AConv,
    l18: RepNCSPELAN4,
    l19: AConv,
    l21: RepNCSPELAN4,
}

/// Outputs of [`Gelan::forward`]: backbone taps reused by the auxiliary branch and the three
/// main-head inputs.
pub(crate) struct GelanOut {
    pub x4: Tensor,
    pub x6: Tensor,
    pub x8: Tensor,
    /// Layers 15, 18, 21: (B,128,H/8,W/8), (B,192,H/16,W/16), (B,256,H/32,W/32).
    pub feats: [Tensor; 3],
}

impl Gelan {
    fn load(b: &mut Builder) -> Result<Self> {
        let r = |n: usize| format!("model.{n}");
        Ok(Self {
            l0: Conv::load(b, &r(0), ConvSpec::new(3, 32, 3, 2))?,
            l1: Conv::load(b, &r(1), ConvSpec::new(32, 64, 3, 2))?,
            l2: Elan1::load(b, &r(2), [64, 64, 64, 32])?,
            l3: AConv::load(b, &r(3), 64, 128)?,
            l4: RepNCSPELAN4::load(b, &r(4), [128, 128, 128, 64, 3])?,
            l5: AConv::load(b, &r(5), 128, 192)?,
            l6: RepNCSPELAN4::load(b, &r(6), [192, 192, 192, 96, 3])?,
            l7: AConv::load(b, &r(7), 192, 256)?,
            l8: RepNCSPELAN4::load(b, &r(8), [256, 256, 256, 128, 3])?,
            l9: SppElan::load(b, &r(9), [256, 256, 128])?,
            l12: RepNCSPELAN4::load(b, &r(12), [448, 192, 192, 96, 3])?,
            l15: RepNCSPELAN4::load(b, &r(15), [320, 128, 128, 64, 3])?,
            l16: AConv::load(b, &r(16), 128, 96)?,
            l18: RepNCSPELAN4::load(b, &r(18), [288, 192, 192, 96, 3])?,
            l19: AConv::load(b, &r(19), 192, 128)?,
            l21: RepNCSPELAN4::load(b, &r(21), [384, 256, 256, 128, 3])?,
        })
    }

    fn forward(&self, x: &Tensor, t: Ctx) -> Result<GelanOut> {
        let cat1 = |a: &Tensor, b: &Tensor| t.cat(&[a, b], 1);
        let x = self.l0.run(x, t)?;
        let x = self.l1.run(&x, t)?;
        let x = self.l2.run(&x, t)?;
        let x = self.l3.run(&x, t)?;
        let x4 = self.l4.run(&x, t)?;
        let x = self.l5.run(&x4, t)?;
        let x6 = self.l6.run(&x, t)?;
        let x = self.l7.run(&x6, t)?;
        let x8 = self.l8.run(&x, t)?;
        let x9 = self.l9.run(&x8, t)?;
        let x12 = self.l12.run(&cat1(&t.upsample_nearest_2x(&x9)?, &x6)?, t)?;
        let x15 = self
            .l15
            .run(&cat1(&t.upsample_nearest_2x(&x12)?, &x4)?, t)?;
        let x18 = self.l18.run(&cat1(&self.l16.run(&x15, t)?, &x12)?, t)?;
        let x21 = self.l21.run(&cat1(&self.l19.run(&x18, t)?, &x9)?, t)?;
        Ok(GelanOut {
            x4,
            x6,
            x8,
            feats: [x15, x18, x21],
        })
    }
}

/// The auxiliary branch, layers 22–28 (SPPELAN on layer 8, then two upsample/concat/ELAN steps).
pub(crate) struct AuxNeck {
    l22: SppElan,
    l25: RepNCSPELAN4,
    l28: RepNCSPELAN4,
}

impl AuxNeck {
    fn load(b: &mut Builder) -> Result<Self> {
        Ok(Self {
            l22: SppElan::load(b, "model.22", [256, 256, 128])?,
            l25: RepNCSPELAN4::load(b, "model.25", [448, 192, 192, 96, 3])?,
            l28: RepNCSPELAN4::load(b, "model.28", [320, 128, 128, 64, 3])?,
        })
    }

    /// Returns the aux head inputs in head order `[28, 25, 22]` (P3, P4, P5).
    fn forward(&self, g: &GelanOut, t: Ctx) -> Result<[Tensor; 3]> {
        let cat1 = |a: &Tensor, b: &Tensor| t.cat(&[a, b], 1);
        let x22 = self.l22.run(&g.x8, t)?;
        let x25 = self
            .l25
            .run(&cat1(&t.upsample_nearest_2x(&x22)?, &g.x6)?, t)?;
        let x28 = self
            .l28
            .run(&cat1(&t.upsample_nearest_2x(&x25)?, &g.x4)?, t)?;
        Ok([x28, x25, x22])
    }
}

/// Checks a network input: (B, 3, H, W) f32 with B ≥ 1 and H, W positive multiples of 32.
pub fn check_input(x: &Tensor) -> Result<()> {
    let dims = x.dims();
    ensure!(
        dims.len() == 4,
        "model input must be (B, 3, H, W), got shape {dims:?}"
    );
    let (b, c, h, w) = (dims[0], dims[1], dims[2], dims[3]);
    ensure!(b >= 1, "model input has an empty batch (shape {dims:?})");
    ensure!(
        c == 3,
        "model input must have 3 (RGB) channels, got {c} (shape {dims:?})"
    );
    ensure!(
        h >= 32 && w >= 32 && h % 32 == 0 && w % 32 == 0,
        "model input height and width must be positive multiples of 32, got {h}x{w} \
         (letterbox the image to a multiple of the largest stride)"
    );
    ensure!(
        x.dtype() == DType::F32,
        "model input must be f32 in 0..1, got {:?}",
        x.dtype()
    );
    Ok(())
}

fn check_meta(meta: &ModelMeta) -> Result<()> {
    ensure!(
        meta.nc >= 1,
        "weights metadata: nc = 0; a detector needs at least one class"
    );
    ensure!(
        meta.strides.is_empty() || meta.strides == STRIDES,
        "weights metadata: strides {:?} are not YOLOv9-s's [8, 16, 32]",
        meta.strides
    );
    Ok(())
}

/// The YOLOv9-s inference graph (gelan-s + main `DDetect` head), BN folded, `RepConvN` fused.
///
/// `Send + Sync`: one instance can serve many threads.
pub struct YoloV9 {
    gelan: Gelan,
    head: DetectHead,
    meta: ModelMeta,
    device: Device,
    dtype: DType,
    /// CUDA-graph replays of [`YoloV9::forward`] (see [`crate::model::graphs`]).
    graphs: ForwardGraphs,
}

impl YoloV9 {
    /// Builds the inference graph from weights of either graph: `Graph::Train` (yolov9-s; keeps
    /// layers 0–21 and uses `model.29.cv4/cv5` as the head) or `Graph::Infer` (gelan-s,
    /// `model.22.cv2/cv3`). Every tensor must be present with the YOLOv9-s shape for
    /// `weights.meta.nc` classes; errors name the offending tensor.
    pub fn load(weights: &Weights, device: &Device) -> Result<Self> {
        Self::load_dtype(weights, device, DType::F32)
    }

    /// [`YoloV9::load`] with the fused kernels and biases stored, and the network run, in
    /// `dtype`: f32, or half precision (f16 as the official `detect.py --half`, or bf16). BN is
    /// folded in f32 first; the input stays an f32 tensor (cast on entry) and the head's raw
    /// outputs are cast back to f32 before the DFL/box decode, so the output is always f32.
    /// Half precision is meant for CUDA (tensor cores); on the CPU it runs, slowly, through
    /// candle's generic convolution.
    ///
    /// Errors: those of [`YoloV9::load`], or a `dtype` that is not a float type.
    pub fn load_dtype(weights: &Weights, device: &Device, dtype: DType) -> Result<Self> {
        ensure!(
            matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
            "inference dtype must be f32, f16 or bf16, got {dtype:?}"
        );
        check_meta(&weights.meta)?;
        let g = weights.meta.graph;
        let mut b =
            Builder::new(Some(&weights.tensors), g, device, BuildMode::Fused, 0).fused_dtype(dtype);
        let gelan = Gelan::load(&mut b)?;
        let head = DetectHead::load(
            &mut b,
            "model.29.cv4",
            "model.29.cv5",
            &HEAD_CH,
            weights.meta.nc,
            &STRIDES,
        )
        .context("loading the detection head")?;
        let mut meta = weights.meta.clone();
        meta.strides = STRIDES.to_vec();
        Ok(Self {
            gelan,
            head,
            meta,
            device: device.clone(),
            dtype,
            graphs: ForwardGraphs::new(),
        })
    }

    /// Head-input features (layers 15, 18, 21): x (B,3,H,W) f32 →
    /// [(B,128,H/8,W/8), (B,192,H/16,W/16), (B,256,H/32,W/32)] in the model's dtype
    /// ([`YoloV9::dtype`]).
    pub fn forward_features(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        check_input(x)?;
        let x = x.to_device(&self.device)?.to_dtype(self.dtype)?;
        Ok(self.gelan.forward(&x, Ctx::plain(false))?.feats)
    }

    /// Raw head outputs per level, (B, 64+nc, H/s, W/s) f32 for s = 8, 16, 32 (DFL logits
    /// side-major l,t,r,b × 16 bins, then class logits).
    pub fn forward_raw(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let feats = self.forward_features(x)?;
        self.head
            .forward_raw(&feats, false)?
            .into_iter()
            .map(|t| Ok(t.to_dtype(DType::F32)?))
            .collect()
    }

    /// x: (B, 3, H, W) f32 RGB in 0..1, H and W multiples of 32 → (B, 4+nc, A) f32: rows 0..4 =
    /// cx, cy, w, h in input pixels, rows 4.. = sigmoid class scores; anchors P3, P4, P5,
    /// row-major within a level (A = 8400 at 640×640). Follows `DDetect.forward` in eval mode.
    ///
    /// On a CUDA device a shape met again is replayed from a CUDA graph
    /// ([`crate::model::graphs`]; same values, one launch); [`YoloV9::forward_launched`] never is.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_input(x)?;
        let x = x.to_device(&self.device)?;
        self.graphs.run(&x, &|x| self.forward_launched(x))
    }

    /// [`YoloV9::forward`] with every kernel launched from the host (no CUDA graph).
    pub fn forward_launched(&self, x: &Tensor) -> Result<Tensor> {
        let raw = self.forward_raw(x)?;
        decode(&raw, &STRIDES)
    }

    /// (CUDA graphs captured, forwards replayed from them) by [`YoloV9::forward`] so far.
    pub fn graph_counts(&self) -> (usize, usize) {
        self.graphs.counts()
    }

    /// Metadata of the loaded weights (nc, class names, strides, source graph).
    pub fn meta(&self) -> &ModelMeta {
        &self.meta
    }

    /// The device the model lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype the network runs in (see [`YoloV9::load_dtype`]).
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// Raw outputs of both head branches of the training graph, per level P3, P4, P5, each
/// (B, 64+nc, H/s, W/s) (official `DualDDetect` training output `[aux, main]`).
pub struct DualRaw {
    /// Auxiliary branch (`cv2`/`cv3` over layers 28, 25, 22); weight 0.25 in the loss.
    pub aux: Vec<Tensor>,
    /// Main branch (`cv4`/`cv5` over layers 15, 18, 21).
    pub main: Vec<Tensor>,
}

impl DualRaw {
    /// Decoded (aux, main), each (B, 4+nc, A): cx, cy, w, h in pixels + sigmoid scores.
    pub fn decode(&self) -> Result<(Tensor, Tensor)> {
        Ok((decode(&self.aux, &STRIDES)?, decode(&self.main, &STRIDES)?))
    }
}

/// BN running statistics `(mean, var)` per layer (each (C,) f32, model device) and
/// `num_batches_tracked`, as taken by [`YoloV9Train::snapshot_bn`].
pub struct BnSnapshot {
    stats: Vec<(Tensor, Tensor)>,
    batches_tracked: i64,
}

/// The YOLOv9-s training graph: layers 0–28 + `DualDDetect`, trainable `Var`s with official
/// names, unfused BN (train/eval modes) and `RepConvN`.
pub struct YoloV9Train {
    gelan: Gelan,
    aux: AuxNeck,
    head_aux: DetectHead,
    head_main: DetectHead,
    vars: Vec<NamedVar>,
    buffers: Vec<(String, Var, Var)>,
    batches_tracked: Arc<AtomicI64>,
    initialized: Vec<String>,
    meta: ModelMeta,
    device: Device,
    /// Mixed precision for train-mode forwards (see [`YoloV9Train::set_amp`]).
    amp: std::sync::atomic::AtomicBool,
}

impl YoloV9Train {
    /// Builds the training graph for `nc` classes. Tensors are taken from `weights` when given
    /// (yolov9-s weights fill everything; gelan-s weights fill layers 0–21 and the main head);
    /// tensors that are absent or have another shape (e.g. class convs for another nc, as the
    /// official `intersect_dicts`) are initialized like the official `Model` (PyTorch default
    /// conv init, BN γ=1 β=0, `bias_init`), deterministically from `seed`.
    pub fn new(
        weights: Option<&Weights>,
        nc: usize,
        names: Vec<String>,
        device: &Device,
        seed: u64,
    ) -> Result<Self> {
        ensure!(nc >= 1, "training graph: nc must be at least 1");
        ensure!(
            names.is_empty() || names.len() == nc,
            "training graph: {} class names for nc = {nc}",
            names.len()
        );
        let g = weights.map(|w| w.meta.graph).unwrap_or(Graph::Train);
        let tensors = weights.map(|w| &w.tensors);
        let mut b = Builder::new(tensors, g, device, BuildMode::Train, seed);
        let gelan = Gelan::load(&mut b)?;
        let aux = AuxNeck::load(&mut b)?;
        let head_aux = DetectHead::load(
            &mut b,
            "model.29.cv2",
            "model.29.cv3",
            &HEAD_CH,
            nc,
            &STRIDES,
        )?;
        let head_main = DetectHead::load(
            &mut b,
            "model.29.cv4",
            "model.29.cv5",
            &HEAD_CH,
            nc,
            &STRIDES,
        )?;
        // Continue num_batches_tracked from the source, if any.
        if let Some(t) =
            tensors.and_then(|t| t.get(source_name(g, "model.0.bn.num_batches_tracked")?.as_str()))
        {
            if let Ok(v) = t.to_dtype(DType::F64).and_then(|t| t.to_scalar::<f64>()) {
                b.batches_tracked.store(v as i64, Ordering::Relaxed);
            }
        }
        let names = if names.is_empty() {
            (0..nc).map(|i| format!("class{i}")).collect()
        } else {
            names
        };
        Ok(Self {
            gelan,
            aux,
            head_aux,
            head_main,
            vars: b.vars,
            buffers: b.buffers,
            batches_tracked: b.batches_tracked,
            initialized: b.initialized,
            meta: ModelMeta {
                nc,
                names,
                strides: STRIDES.to_vec(),
                graph: Graph::Train,
            },
            device: device.clone(),
            amp: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Builds the training graph from weights, with their nc and names.
    pub fn from_weights(weights: &Weights, device: &Device) -> Result<Self> {
        check_meta(&weights.meta)?;
        Self::new(
            Some(weights),
            weights.meta.nc,
            weights.meta.names.clone(),
            device,
            0,
        )
    }

    /// Forward of both branches. x: (B, 3, H, W) f32 in 0..1, H, W multiples of 32.
    /// `train = true`: BN uses batch statistics and updates running stats (call once per
    /// optimizer step); `train = false`: running statistics (validation).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<DualRaw> {
        self.forward_ctx(x, Ctx::plain(train))
    }

    /// The train-mode forward recorded on a [`Tape`] instead of candle's autograd graph (see
    /// [`crate::model::tape`]): same values and side effects as `forward(x, true)` (BN running
    /// statistics, `num_batches_tracked`), but the returned head outputs are variables with no
    /// graph behind them. Differentiate a loss of them with candle (`loss.backward()`), then pass
    /// its gradient store to [`Tape::backward`], which returns the parameter gradients.
    ///
    /// Errors: as [`Self::forward`]; a dtype/device without the fused train-mode BN
    /// ([`crate::model::bn_act::bn_act_supported`]).
    pub fn forward_taped(&self, x: &Tensor) -> Result<(DualRaw, Tape)> {
        let tape = Tape::new();
        let raw = self.forward_ctx(x, Ctx::taped(&tape))?;
        let out =
            |v: Vec<Tensor>| -> Result<Vec<Tensor>> { v.iter().map(|t| tape.output(t)).collect() };
        let raw = DualRaw {
            aux: out(raw.aux)?,
            main: out(raw.main)?,
        };
        Ok((raw, tape))
    }

    fn forward_ctx(&self, x: &Tensor, c: Ctx) -> Result<DualRaw> {
        check_input(x)?;
        let train = c.train;
        let mut x = x.to_device(&self.device)?;
        if train {
            self.batches_tracked.fetch_add(1, Ordering::Relaxed);
        }
        let amp = train && self.amp();
        if amp {
            x = x.to_dtype(DType::BF16)?;
        }
        let g = self.gelan.forward(&x, c)?;
        let aux_in = self.aux.forward(&g, c)?;
        let mut raw = DualRaw {
            aux: self.head_aux.run_raw(&aux_in, c)?,
            main: self.head_main.run_raw(&g.feats, c)?,
        };
        if amp {
            for t in raw.aux.iter_mut().chain(raw.main.iter_mut()) {
                *t = c.cast(t, DType::F32)?;
            }
        }
        Ok(raw)
    }

    /// Eval-mode forward, decoded: (y_aux, y_main), each (B, 4+nc, A) as [`YoloV9::forward`].
    pub fn forward_eval_decoded(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        self.forward(x, false)?.decode()
    }

    /// Head-input features of the main branch (layers 15, 18, 21) in eval or train mode.
    pub fn forward_features(&self, x: &Tensor, train: bool) -> Result<[Tensor; 3]> {
        check_input(x)?;
        Ok(self
            .gelan
            .forward(&x.to_device(&self.device)?, Ctx::plain(train))?
            .feats)
    }

    /// Mixed precision (AMP) for train-mode forwards: on a CUDA device, the input is cast to bf16,
    /// every convolution runs in bf16 on tensor cores with its f32 kernel cast per forward (the
    /// cast is differentiable, so gradients reach the f32 master weights), train-mode BN + SiLU
    /// reads and writes bf16 with f32 arithmetic and f32 statistics, and the head outputs are cast
    /// back to f32 for the loss. Eval-mode forwards (validation) stay f32. Ignored on the CPU.
    /// bf16 keeps f32's exponent range, so no loss scaling is needed (unlike fp16 AMP).
    pub fn set_amp(&self, on: bool) {
        self.amp.store(on, Ordering::Relaxed);
    }

    /// Whether train-mode forwards use mixed precision (on, and on a CUDA device).
    pub fn amp(&self) -> bool {
        self.amp.load(Ordering::Relaxed) && self.device.is_cuda()
    }

    /// Trainable parameters with official names and optimizer groups (state_dict order).
    pub fn vars(&self) -> &[NamedVar] {
        &self.vars
    }

    /// Names that were initialized rather than loaded (empty when all came from the weights).
    pub fn initialized(&self) -> &[String] {
        &self.initialized
    }

    /// Metadata (nc, names, strides, `Graph::Train`).
    pub fn meta(&self) -> &ModelMeta {
        &self.meta
    }

    /// The device the variables live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Counts one train-mode forward in `num_batches_tracked` without running one: what a
    /// replayed forward ([`crate::train::graphed`]) does on the host side.
    pub fn count_batch(&self) {
        self.batches_tracked.fetch_add(1, Ordering::Relaxed);
    }

    /// `num_batches_tracked` of every BN layer.
    pub fn batches_tracked(&self) -> i64 {
        self.batches_tracked.load(Ordering::Relaxed)
    }

    /// Running (mean, var) of the BN at `prefix` (e.g. `model.0.bn`), each (C,) f32.
    pub fn bn_running_stats(&self, prefix: &str) -> Option<(Tensor, Tensor)> {
        self.buffers
            .iter()
            .find(|(n, _, _)| n == prefix)
            .map(|(_, m, v)| (m.as_tensor().clone(), v.as_tensor().clone()))
    }

    /// The official yolov9-s state_dict (1772 entries for nc = 80): every parameter, BN
    /// `running_mean`/`running_var` (f32), `num_batches_tracked` (i64 scalar), and the constant
    /// DFL kernels `model.29.dfl.conv.weight`/`dfl2` (1,16,1,1) = 0..15. All on the CPU.
    pub fn state_dict(&self) -> Result<HashMap<String, Tensor>> {
        let cpu = Device::Cpu;
        let mut out = HashMap::new();
        for v in &self.vars {
            out.insert(v.name.clone(), v.var.as_tensor().to_device(&cpu)?.copy()?);
        }
        let nbt = Tensor::new(self.batches_tracked(), &cpu)?;
        for (p, m, v) in &self.buffers {
            out.insert(
                format!("{p}.running_mean"),
                m.as_tensor().to_device(&cpu)?.copy()?,
            );
            out.insert(
                format!("{p}.running_var"),
                v.as_tensor().to_device(&cpu)?.copy()?,
            );
            out.insert(format!("{p}.num_batches_tracked"), nbt.clone());
        }
        let bins = Tensor::arange(0f32, REG_MAX as f32, &cpu)?.reshape((1, REG_MAX, 1, 1))?;
        out.insert("model.29.dfl.conv.weight".into(), bins.clone());
        out.insert("model.29.dfl2.conv.weight".into(), bins);
        Ok(out)
    }

    /// Every f32 entry of [`Self::state_dict`] (parameters, BN running statistics and the
    /// constant DFL kernels), sorted by name, **on the model's device and without copying**:
    /// what the EMA averages (official `ModelEMA.update` over `state_dict()` floating entries).
    /// The tensors alias the live variables, so use them before the next optimizer step.
    pub fn float_state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out: Vec<(String, Tensor)> =
            Vec::with_capacity(self.vars.len() + 2 * self.buffers.len() + 2);
        for v in &self.vars {
            out.push((v.name.clone(), v.var.as_tensor().detach()));
        }
        for (p, m, v) in &self.buffers {
            out.push((format!("{p}.running_mean"), m.as_tensor().detach()));
            out.push((format!("{p}.running_var"), v.as_tensor().detach()));
        }
        let bins =
            Tensor::arange(0f32, REG_MAX as f32, &self.device)?.reshape((1, REG_MAX, 1, 1))?;
        out.push(("model.29.dfl.conv.weight".into(), bins.clone()));
        out.push(("model.29.dfl2.conv.weight".into(), bins));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// A copy of the BN running statistics and `num_batches_tracked`, on the model's device:
    /// what a train-mode forward changes besides the parameters. [`Self::restore_bn`] puts them
    /// back, so that a training step that failed halfway (out of memory) can be redone exactly.
    pub fn snapshot_bn(&self) -> Result<BnSnapshot> {
        let mut stats = Vec::with_capacity(self.buffers.len());
        for (_, m, v) in &self.buffers {
            stats.push((m.as_tensor().copy()?, v.as_tensor().copy()?));
        }
        Ok(BnSnapshot {
            stats,
            batches_tracked: self.batches_tracked(),
        })
    }

    /// Restores a [`BnSnapshot`] taken from this model.
    pub fn restore_bn(&self, s: &BnSnapshot) -> Result<()> {
        ensure!(
            s.stats.len() == self.buffers.len(),
            "BN snapshot holds {} layers, model has {}",
            s.stats.len(),
            self.buffers.len()
        );
        for ((_, m, v), (sm, sv)) in self.buffers.iter().zip(&s.stats) {
            m.set(sm)?;
            v.set(sv)?;
        }
        self.batches_tracked
            .store(s.batches_tracked, Ordering::Relaxed);
        Ok(())
    }

    /// The current state as [`Weights`] (`Graph::Train`, official names), ready for
    /// `Weights::save` or [`YoloV9::load`].
    pub fn to_weights(&self) -> Result<Weights> {
        Ok(Weights {
            tensors: self.state_dict()?,
            meta: self.meta.clone(),
        })
    }

    /// Copies values from a state_dict with official names into the variables, the BN buffers
    /// and (when present) `num_batches_tracked`
    /// (e.g. EMA weights back into the model). Every variable must be present with its shape.
    pub fn load_state_dict(&self, sd: &HashMap<String, Tensor>) -> Result<()> {
        for v in &self.vars {
            let t = sd
                .get(&v.name)
                .with_context(|| format!("state_dict: missing `{}`", v.name))?;
            if t.dims() != v.var.dims() {
                bail!(
                    "state_dict: `{}` has shape {:?}, expected {:?}",
                    v.name,
                    t.dims(),
                    v.var.dims()
                );
            }
            v.var
                .set(&t.to_dtype(DType::F32)?.to_device(&self.device)?)?;
        }
        for (p, m, v) in &self.buffers {
            for (suffix, var) in [("running_mean", m), ("running_var", v)] {
                let name = format!("{p}.{suffix}");
                let t = sd
                    .get(&name)
                    .with_context(|| format!("state_dict: missing `{name}`"))?;
                ensure!(
                    t.dims() == var.dims(),
                    "state_dict: `{name}` has shape {:?}, expected {:?}",
                    t.dims(),
                    var.dims()
                );
                var.set(&t.to_dtype(DType::F32)?.to_device(&self.device)?)?;
            }
        }
        if let Some(t) = sd.get("model.0.bn.num_batches_tracked") {
            let n = t.to_dtype(DType::I64)?.to_scalar::<i64>()?;
            self.batches_tracked.store(n, Ordering::Relaxed);
        }
        Ok(())
    }
}
