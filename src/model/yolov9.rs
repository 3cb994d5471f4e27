//! The YOLOv9 graphs of every model description ([`Arch`]), from one definition:
//!
//! - [`YoloV9`]: the inference graph (gelan-*: a training graph's main branch, see
//!   [`Arch::main_branch`]) with its `DDetect` head, BN folded and `RepConvN` fused at load time.
//! - [`YoloV9Train`]: the training graph (yolov9-*: main and auxiliary branch, `DualDDetect`;
//!   gelan-*: the single `DDetect` head, as the official `train.py` trains them), parameters as candle `Var`s, BN in train (batch statistics) or eval (running statistics)
//!   mode, `RepConvN` unfused.
//!
//! Why one file: the inference graph and the training graph are built from the same `Arch` rows by
//! the same per-module dispatch, kept side by side so that a module added to one is added to the
//! other.

use super::arch::{Arch, Src, STRIDES};
use super::cpu::CpuEngine;
use super::graphs::ForwardGraphs;
use super::head::{decode, DetectHead, MaskHead, REG_MAX};
use super::net::{dfl_names, load_heads, Net};
use super::params::{BuildMode, Builder, NamedVar};
use super::rename::NameMap;
use super::tape::{Ctx, Tape};
use super::trace::{Trace, TracedOp};
use crate::model::weights::{ModelMeta, Weights};
use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

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
        "weights metadata: strides {:?} are not [8, 16, 32]",
        meta.strides
    );
    Ok(())
}

/// The inference graph of a model (gelan-* + `DDetect` head), BN folded, `RepConvN` fused.
///
/// `Send + Sync`: one instance can serve many threads.
pub struct YoloV9 {
    net: Net,
    /// The head inputs (P3, P4, P5).
    taps: Vec<Src>,
    head: DetectHead,
    /// The mask branch of a segmentation model, and the head inputs it needs (the detection
    /// inputs, then the prototype input when it is an extra one).
    mask: Option<(MaskHead, Vec<Src>)>,
    meta: ModelMeta,
    device: Device,
    dtype: DType,
    /// CUDA-graph replays of [`YoloV9::forward`] (see [`crate::model::graphs`]).
    graphs: ForwardGraphs,
    /// The activation layout of the network ([`YoloV9::with_channels_last`]).
    layout: Layout,
    /// Threads of the CPU engine (0: [`super::cpu::default_threads`]).
    threads: usize,
    /// The CPU engine ([`super::cpu`]) of an f32 model on the CPU, compiled on the first
    /// forward; `Err` (the reason, logged once) when it cannot run this graph.
    cpu: std::sync::OnceLock<std::result::Result<Arc<CpuEngine>, String>>,
}

/// The memory layout an inference model runs its activations in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// (B, C, H, W) for every batch.
    Nchw,
    /// Channels-last (B, H, W, C) for every batch (CUDA only).
    Nhwc,
    /// Channels-last in half precision at every batch, and in f32 from [`NHWC_F32_MIN_BATCH`]
    /// images on; NCHW for smaller f32 batches: what was faster on the H200 (see
    /// [`NHWC_F32_MIN_BATCH`]).
    Auto,
}

/// The smallest f32 batch that [`Layout::Auto`] runs channels-last. Measured on the H200
/// (yolov9-s, 480x640, forward only, `benches/detect.rs`, one device command), channels-last
/// against NCHW: f16 at batch 1, 2, 4, 8, 32: 2.6/2.5/2.8/4.1/10.0 ms against
/// 3.4/4.2/4.2/5.4/15.2 ms; f32 at batch 2, 4, 8: 5.7/6.8/9.2 ms against 5.5/6.5/8.3 ms, at
/// batch 32 15.5 ms against 19.3 ms (batch 16 was not measured).
pub const NHWC_F32_MIN_BATCH: usize = 16;

/// The default layout of an inference model on `device`: [`Layout::Auto`] on CUDA,
/// [`Layout::Nchw`] elsewhere. `YOLO9_NHWC=0` forces NCHW and `=1` channels-last.
pub fn default_layout(device: &Device) -> Layout {
    if !device.is_cuda() {
        return Layout::Nchw;
    }
    match crate::switches::value("YOLO9_NHWC").as_deref() {
        Some("0") => Layout::Nchw,
        Some("1") => Layout::Nhwc,
        _ => Layout::Auto,
    }
}

impl YoloV9 {
    /// Builds the inference graph from weights of either graph of their model
    /// (`weights.meta.arch`): a training graph (yolov9-*; its main branch is kept, as the
    /// official re-parameterization, with the head's `cv4`/`cv5` as `cv2`/`cv3`) or an
    /// inference graph (gelan-*). Every tensor must be present with its shape for
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
        let arch = &weights.meta.arch;
        let (infer, rename) = if arch.is_dual() {
            (arch.main_branch().0, Some(NameMap::infer_to_train(arch)))
        } else {
            (arch.as_ref().clone(), None)
        };
        let mut b = Builder::new(Some(&weights.tensors), rename, device, BuildMode::Fused, 0)
            .fused_dtype(dtype);
        let net = Net::load(&mut b, &infer)?;
        let heads = load_heads(&mut b, &infer, weights.meta.nc)?;
        let mut meta = weights.meta.clone();
        meta.strides = STRIDES.to_vec();
        let mask = heads.mask.map(|m| {
            let mut taps = infer.main_inputs().to_vec();
            taps.extend(infer.proto_inputs().last());
            (m, taps)
        });
        Ok(Self {
            net,
            taps: infer.main_inputs().to_vec(),
            head: heads.main,
            mask,
            meta,
            device: device.clone(),
            dtype,
            graphs: ForwardGraphs::new(),
            layout: default_layout(device),
            threads: 0,
            cpu: std::sync::OnceLock::new(),
        })
    }

    /// The same model with its network run on channels-last (B, H, W, C) activations for every
    /// batch (`on`) or NCHW ones: cuDNN's NHWC convolutions, the bias + SiLU epilogue on NHWC,
    /// the pools and upsampling on NHWC; the input is transposed once on entry and the head's
    /// raw outputs once on exit, so every output keeps its NCHW shape. CUDA only (`on` is
    /// ignored elsewhere); the default is [`default_layout`].
    pub fn with_channels_last(mut self, on: bool) -> Self {
        self.layout = if on && self.device.is_cuda() {
            Layout::Nhwc
        } else {
            Layout::Nchw
        };
        self
    }

    /// For validation (`yolo9 val`): where the layout is [`Layout::Auto`], an f32 network runs
    /// NCHW at every batch, the layout (and, with TF32, the arithmetic) of the official
    /// `val_dual.py`, so that the metrics table equals the official one to the printed digit
    /// (channels-last batch 32 gave P 0.806 against the official 0.805 on the BCCD test split,
    /// one device command). Half precision keeps [`Layout::Auto`].
    pub fn for_validation(mut self) -> Self {
        if self.layout == Layout::Auto && self.dtype == DType::F32 {
            self.layout = Layout::Nchw;
        }
        self
    }

    /// The same model with its CPU forward run on `threads` threads (0: the default,
    /// [`super::cpu::default_threads`]). No effect on a GPU.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.set_threads(threads);
        self
    }

    /// [`YoloV9::with_threads`] in place (the CPU engine is compiled again on the next forward).
    pub fn set_threads(&mut self, threads: usize) {
        if threads != self.threads {
            self.threads = threads;
            self.cpu = std::sync::OnceLock::new();
        }
    }

    /// The CPU engine that runs [`YoloV9::forward`] for an f32 model on the CPU (compiled on
    /// the first call), or `None`: on a GPU, in half precision, with `YOLO9_CPU_ENGINE=0`, or
    /// when it cannot compile the graph (then the reason is logged once and candle's ops run).
    pub fn cpu_engine(&self) -> Option<&CpuEngine> {
        if !matches!(self.device, Device::Cpu) || self.dtype != DType::F32 {
            return None;
        }
        if crate::switches::off("YOLO9_CPU_ENGINE") {
            return None;
        }
        let e = self.cpu.get_or_init(|| {
            let x = Tensor::zeros((1, 3, 64, 64), DType::F32, &Device::Cpu);
            x.map_err(anyhow::Error::from)
                .and_then(|x| {
                    // A segmentation model's engine computes its masks too (forward_seg).
                    let (ops, raw, extra) = if self.is_seg() {
                        let (ops, raw, mut extra, proto) =
                            self.trace_seg(&x).context("tracing the model")?;
                        extra.push(proto);
                        (ops, raw, extra)
                    } else {
                        let (ops, raw) = self.trace_raw(&x).context("tracing the model")?;
                        (ops, raw, Vec::new())
                    };
                    let (t, input) = (self.threads, x.id());
                    // The traced ops are copied only when a calibration may be refused.
                    let Some(c) = &self.meta.int8 else {
                        return CpuEngine::new(ops, input, &raw, &extra, t, None);
                    };
                    CpuEngine::new(ops.clone(), input, &raw, &extra, t, Some(&c.convs)).or_else(
                        |e| {
                            tracing::warn!(
                                "the INT8 calibration cannot be used ({e:#}); running in f32"
                            );
                            CpuEngine::new(ops, input, &raw, &extra, t, None)
                        },
                    )
                })
                .map(Arc::new)
                .map_err(|e| {
                    let e = format!("{e:#}");
                    tracing::warn!(
                        "the CPU engine cannot run this model ({e}); using candle's ops"
                    );
                    e
                })
        });
        e.as_ref().ok().map(|e| e.as_ref())
    }

    /// The layout policy of the network.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether a batch of `batch` images runs on channels-last activations.
    pub fn channels_last_for(&self, batch: usize) -> bool {
        match self.layout {
            Layout::Nchw => false,
            Layout::Nhwc => true,
            Layout::Auto => {
                matches!(self.dtype, DType::F16 | DType::BF16) || batch >= NHWC_F32_MIN_BATCH
            }
        }
    }

    /// Head-input features (P3, P4, P5; layers 15, 18, 21 of gelan-s): x (B,3,H,W) f32 →
    /// (B, C_i, H/s, W/s) for s = 8, 16, 32 (yolov9-s: C = 128, 192, 256) in the model's dtype
    /// ([`YoloV9::dtype`]).
    pub fn forward_features(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let (feats, c) = self.features_in_layout(x, &self.taps)?;
        if !c.nhwc {
            return Ok(feats);
        }
        feats.iter().map(to_nchw).collect()
    }

    /// The outputs of `taps` (the head inputs) in the layout the network runs in, with its
    /// context.
    fn features_in_layout(&self, x: &Tensor, taps: &[Src]) -> Result<(Vec<Tensor>, Ctx<'static>)> {
        check_input(x)?;
        let x = x.to_device(&self.device)?;
        if self.channels_last_for(x.dim(0)?) {
            let c = Ctx::plain_nhwc();
            if let Some((i, conv)) = self.net.input_conv() {
                if let Some(y) = conv.first_nhwc(&x, self.dtype)? {
                    return Ok((self.net.forward_from(&x, c, taps, Some((i, y)))?, c));
                }
            }
            let ch = super::layout::input_channels(x.dim(1)?, &self.device, self.dtype);
            let x = super::layout::nhwc_from_nchw(&x, self.dtype, ch)?;
            return Ok((self.net.forward(&x, c, taps)?, c));
        }
        let x = x.to_dtype(self.dtype)?;
        let c = Ctx::plain(false);
        Ok((self.net.forward(&x, c, taps)?, c))
    }

    /// The detection head's raw outputs of `feats` (P3, P4, P5 in the context's layout), NCHW
    /// f32.
    fn head_raw(&self, feats: &[Tensor], c: Ctx) -> Result<Vec<Tensor>> {
        raw_of_parts(&self.head.run_parts(feats, c)?, c)
    }

    /// Raw head outputs per level, (B, 64+nc, H/s, W/s) f32 for s = 8, 16, 32 (DFL logits
    /// side-major l,t,r,b × 16 bins, then class logits).
    pub fn forward_raw(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let (feats, c) = self.features_in_layout(x, &self.taps)?;
        self.head_raw(&feats, c)
    }

    /// The raw head outputs of [`YoloV9::forward_raw`] for `x` (B, 3, H, W) f32 on the model's
    /// device, computed NCHW with every layer op recorded ([`crate::model::trace`]; what
    /// `yolo9 export` writes): the ops in execution order, and the raw outputs (whose ids the
    /// last ops produce). The model must be f32 (an export in half precision casts the f32
    /// graph's constants).
    pub fn trace_raw(&self, x: &Tensor) -> Result<(Vec<TracedOp>, Vec<Tensor>)> {
        self.check_traceable(x)?;
        let trace = Trace::new();
        let c = Ctx::tracing(&trace);
        let feats = self.net.forward(x, c, &self.taps)?;
        let raw = self.head.run_raw(&feats, c)?;
        Ok((trace.into_ops(), raw))
    }

    /// The input checks of a traced forward: [`check_input`], an f32 model, `x` on its device.
    fn check_traceable(&self, x: &Tensor) -> Result<()> {
        check_input(x)?;
        ensure!(
            self.dtype == DType::F32 && x.device().same_device(&self.device),
            "tracing: an f32 model and an input on its device"
        );
        Ok(())
    }

    /// A segmentation model's mask head and the taps feeding it; an error for a detection model.
    fn mask_branch(&self) -> Result<(&MaskHead, &[Src])> {
        match &self.mask {
            Some((mask, taps)) => Ok((mask, taps)),
            None => bail!(
                "{} is a detection model: it has no masks",
                self.meta.arch.name
            ),
        }
    }

    /// [`YoloV9::trace_raw`] of a segmentation model (what `yolo9 export` writes for it): the
    /// ops in execution order, the raw head outputs, the mask-coefficient maps per level (B,
    /// nm, H/s, W/s) and the prototypes (B, nm, Hp, Wp), all NCHW f32 and produced by the
    /// recorded ops; [`YoloV9::forward_seg`] computes the same. Errors: a detection model.
    #[allow(clippy::type_complexity)]
    pub fn trace_seg(
        &self,
        x: &Tensor,
    ) -> Result<(Vec<TracedOp>, Vec<Tensor>, Vec<Tensor>, Tensor)> {
        let (mask, taps) = self.mask_branch()?;
        self.check_traceable(x)?;
        let trace = Trace::new();
        let c = Ctx::tracing(&trace);
        let feats = self.net.forward(x, c, taps)?;
        let levels = self.head.boxes.len();
        let raw = self.head.run_raw(&feats[..levels], c)?;
        let coeffs = mask.run_coeff_levels(&feats[..levels], c)?;
        let proto = mask.run_proto(feats.get(levels).unwrap_or(&feats[0]), c)?;
        Ok((trace.into_ops(), raw, coeffs, proto))
    }

    /// x: (B, 3, H, W) f32 RGB in 0..1, H and W multiples of 32 → (B, 4+nc, A) f32: rows 0..4 =
    /// cx, cy, w, h in input pixels, rows 4.. = sigmoid class scores; anchors P3, P4, P5,
    /// row-major within a level (A = 8400 at 640×640). Follows `DDetect.forward` in eval mode.
    ///
    /// On a CUDA device a shape met again is replayed from a CUDA graph
    /// ([`crate::model::graphs`]; same values, one launch); [`YoloV9::forward_launched`] never is.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_input(x)?;
        if let Some(e) = self.cpu_engine() {
            // On the calling thread: the engine has its own workers, and the call's few large
            // buffers (input copy, output) then come from one malloc arena. Run inside candle's
            // pool (a different worker each call), they spread over one arena per worker and
            // resident memory crept up with the thread count (16 threads: 120 → 136 MiB over
            // 1,000 calls).
            return e.forward(&x.to_device(&Device::Cpu)?);
        }
        let x = x.to_device(&self.device)?;
        // On the CPU, candle's own pool runs the whole candle forward, so its GEMMs, its
        // element-wise ops and our im2col share one set of warm worker threads instead of
        // contending with rayon's global pool (BCCD image on 2 cores: 550 → 455 ms, medians of 8
        // alternating runs, same detections). A no-op on CUDA.
        self.device
            .with_context(|| self.graphs.run(&x, &|x| self.forward_launched(x)))
    }

    /// [`YoloV9::forward`] with every kernel launched from the host (no CUDA graph).
    pub fn forward_launched(&self, x: &Tensor) -> Result<Tensor> {
        let (feats, c) = self.features_in_layout(x, &self.taps)?;
        let parts = self.head.run_parts(&feats, c)?;
        if c.nhwc {
            // Channels-last on CUDA: the head's parts decoded where they lie, in one launch.
            if let Some(y) = super::head::decode_nhwc(&parts, &STRIDES)? {
                return Ok(y);
            }
        }
        decode(&raw_of_parts(&parts, c)?, &STRIDES)
    }

    /// Whether the model has a mask branch (a segmentation head).
    pub fn is_seg(&self) -> bool {
        self.mask.is_some()
    }

    /// Detections with mask coefficients, and the prototype masks, of a segmentation model
    /// (official `Segment.forward` / `DSegment.forward` in eval mode, the first two outputs):
    /// x (B, 3, H, W) f32 RGB in 0..1 → `(pred (B, 4+nc+nm, A) f32, proto (B, nm, Hp, Wp) f32)`:
    /// `pred` rows 0..4+nc as [`YoloV9::forward`], rows 4+nc.. the raw mask coefficients; the
    /// prototypes at stride 4 for the official models (`Hp = H/4`). An instance mask is
    /// `sigmoid(coeffs · proto)` (see [`crate::detect::masks`]).
    ///
    /// On the CPU an f32 model runs on the CPU engine ([`CpuEngine::forward_seg`]); elsewhere
    /// candle's ops run it (no CUDA graph). Errors: a detection model.
    pub fn forward_seg(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        if self.is_seg() {
            if let Some(e) = self.cpu_engine().filter(|e| e.is_seg()) {
                check_input(x)?;
                return e.forward_seg(&x.to_device(&Device::Cpu)?);
            }
        }
        self.forward_seg_launched(x)
    }

    /// [`YoloV9::forward_seg`] on candle's ops (never the CPU engine nor a CUDA graph).
    pub fn forward_seg_launched(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (mask, taps) = self.mask_branch()?;
        self.device.with_context(|| {
            let (feats, c) = self.features_in_layout(x, taps)?;
            let levels = self.head.boxes.len();
            let raw = self.head_raw(&feats[..levels], c)?;
            let det = decode(&raw, &STRIDES)?;
            let coeffs = mask.run_coeffs(&feats[..levels], c)?.to_dtype(DType::F32)?;
            let proto_in = feats.get(levels).unwrap_or(&feats[0]);
            let proto = mask.run_proto(proto_in, c)?.to_dtype(DType::F32)?;
            Ok((Tensor::cat(&[&det, &coeffs], 1)?, proto))
        })
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

/// Each level's box and class parts ([`DetectHead::run_parts`]) joined into the raw head output
/// (B, 64+nc, H/s, W/s), NCHW f32 whatever the context's layout.
fn raw_of_parts(parts: &[(Tensor, Tensor)], c: Ctx) -> Result<Vec<Tensor>> {
    parts
        .iter()
        .map(|(b, k)| {
            let t = c.cat(&[b, k], 1)?;
            if c.nhwc {
                return super::layout::nchw_f32_from_nhwc(&t);
            }
            Ok(t.to_dtype(DType::F32)?)
        })
        .collect()
}

/// (B, H, W, C) → (B, C, H, W), contiguous.
fn to_nchw(t: &Tensor) -> Result<Tensor> {
    Ok(t.permute((0, 3, 1, 2))?.contiguous()?)
}

/// Raw outputs of both head branches of the training graph, per level P3, P4, P5, each
/// (B, 64+nc, H/s, W/s) (official `DualDDetect` training output `[aux, main]`; for a single
/// `DDetect` head, gelan-*, the official `DDetect` training output is `main` and `aux` is empty).
pub struct DualRaw {
    /// Auxiliary branch (`cv2`/`cv3`; over layers 28, 25, 22 in yolov9-s); weight 0.25 in the
    /// loss. Empty for a single-head (gelan-*) graph.
    pub aux: Vec<Tensor>,
    /// Main branch (`cv4`/`cv5`; over layers 15, 18, 21 in yolov9-s).
    pub main: Vec<Tensor>,
    /// The mask branches of a segmentation graph (official training output `(x, mc, p)`).
    pub seg: Option<SegRaw>,
}

/// Raw mask outputs of a segmentation training graph, NCHW f32: per branch the coefficient
/// maps per level (B, nm, H_i, W_i) (flatten with [`super::head::flatten_levels`]) and the
/// prototypes (B, nm, Hp, Wp).
pub struct SegRaw {
    /// The auxiliary branch (`DualDSegment`: `cv6`, `proto`).
    pub aux: Option<(Vec<Tensor>, Tensor)>,
    /// The main branch.
    pub main: (Vec<Tensor>, Tensor),
}

impl DualRaw {
    /// Decoded (aux, main), each (B, 4+nc, A): cx, cy, w, h in pixels + sigmoid scores. For a
    /// single-head graph (no auxiliary branch) the first is `(B, 4+nc, 0)`.
    pub fn decode(&self) -> Result<(Tensor, Tensor)> {
        let main = decode(&self.main, &STRIDES)?;
        let aux = if self.aux.is_empty() {
            let (b, c, _) = main.dims3()?;
            Tensor::zeros((b, c, 0), main.dtype(), main.device())?
        } else {
            decode(&self.aux, &STRIDES)?
        };
        Ok((aux, main))
    }
}

/// BN running statistics `(mean, var)` per layer (each (C,) f32, model device) and
/// `num_batches_tracked`, as taken by [`YoloV9Train::snapshot_bn`].
pub struct BnSnapshot {
    stats: Vec<(Tensor, Tensor)>,
    batches_tracked: i64,
}

/// The training graph of a model (yolov9-*: every layer + `DualDDetect`; gelan-*: every layer +
/// `DDetect`, the single-head models the official `train.py` trains), trainable `Var`s with
/// official names, unfused BN (train/eval modes) and `RepConvN`.
pub struct YoloV9Train {
    net: Net,
    arch: Arc<Arch>,
    /// Auxiliary (dual heads only) then main head inputs.
    taps: Vec<Src>,
    /// `None` for a single `DDetect` head (gelan-*).
    head_aux: Option<DetectHead>,
    head_main: DetectHead,
    /// The mask branches of a segmentation graph: (auxiliary, main).
    masks: Option<(Option<MaskHead>, MaskHead)>,
    /// The extra head inputs of the prototype branches (`DSegment`, `DualDSegment`).
    proto_taps: Vec<Src>,
    vars: Vec<NamedVar>,
    buffers: Vec<(String, Var, Var)>,
    batches_tracked: Arc<AtomicI64>,
    initialized: Vec<String>,
    reshaped: Vec<(String, Vec<usize>, Vec<usize>)>,
    meta: ModelMeta,
    device: Device,
    /// Mixed precision for train-mode forwards (see [`YoloV9Train::set_amp`]).
    amp: std::sync::atomic::AtomicBool,
}

impl YoloV9Train {
    /// Builds the yolov9-s training graph for `nc` classes, or that of the weights' model when
    /// `weights` are given (see [`YoloV9Train::build`]).
    pub fn new(
        weights: Option<&Weights>,
        nc: usize,
        names: Vec<String>,
        device: &Device,
        seed: u64,
    ) -> Result<Self> {
        let arch = match weights {
            Some(w) => training_arch(&w.meta.arch)?,
            None => Arc::new(Arch::builtin("yolov9-s")?),
        };
        Self::build(&arch, weights, nc, names, device, seed)
    }

    /// Builds the training graph `arch` for `nc` classes: a `DualDDetect` graph (e.g.
    /// `yolov9-c`, trained with both branches as the official `train_dual.py`) or a single
    /// `DDetect` graph (e.g. `gelan-c`, trained with its one head as the official `train.py`;
    /// [`DualRaw::aux`] is then empty). Tensors are taken from `weights` when given (weights of
    /// `arch` fill everything; weights of a dual graph's inference graph, e.g. gelan-c for
    /// yolov9-c, fill the main branch); tensors that are absent or have another shape (e.g.
    /// class convs for another nc, as the official `intersect_dicts`) are initialized like the
    /// official `Model` (PyTorch default conv init, BN γ=1 β=0, `bias_init`), deterministically
    /// from `seed`. The metadata's graph is `Graph::Train` for a dual graph and `Graph::Infer`
    /// for a single-head one (its state_dict is that of the inference graph).
    ///
    /// Errors: weights of another model (naming both).
    pub fn build(
        arch: &Arch,
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
        let rename = match weights {
            None => None,
            Some(w) if w.meta.arch.layers == arch.layers => None,
            Some(w) if arch.is_dual() && w.meta.arch.layers == arch.main_branch().0.layers => {
                Some(NameMap::train_to_infer(arch))
            }
            Some(w) => bail!(
                "weights of {} do not fit the {} training graph; pick the matching --cfg (or none)",
                w.meta.arch.name,
                arch.name
            ),
        };
        let from_infer = rename.is_some();
        let tensors = weights.map(|w| &w.tensors);
        let mut b = Builder::new(tensors, rename.clone(), device, BuildMode::Train, seed);
        let net = Net::load(&mut b, arch)?;
        let heads = load_heads(&mut b, arch, nc)?;
        let (head_aux, head_main) = (heads.aux, heads.main);
        let masks = heads.mask.map(|m| (heads.aux_mask, m));
        ensure!(
            head_aux.is_some() == arch.is_dual(),
            "{}: the auxiliary head must exist exactly for a DualDDetect graph",
            arch.name
        );
        // Continue num_batches_tracked from the source, if any.
        let counter = if from_infer {
            rename.as_ref().and_then(|m| m.map(&first_counter(arch)))
        } else {
            Some(first_counter(arch))
        };
        if let Some(t) = counter.and_then(|n| tensors.and_then(|t| t.get(n.as_str()))) {
            if let Ok(v) = t.to_dtype(DType::F64).and_then(|t| t.to_scalar::<f64>()) {
                b.batches_tracked.store(v as i64, Ordering::Relaxed);
            }
        }
        let names = if names.is_empty() {
            (0..nc).map(|i| format!("class{i}")).collect()
        } else {
            names
        };
        let mut taps = arch.aux_inputs().to_vec();
        taps.extend_from_slice(arch.main_inputs());
        let arch = Arc::new(arch.clone());
        Ok(Self {
            net,
            taps,
            head_aux,
            head_main,
            masks,
            proto_taps: arch.proto_inputs().to_vec(),
            vars: b.vars,
            buffers: b.buffers,
            batches_tracked: b.batches_tracked,
            initialized: b.initialized,
            reshaped: b.reshaped,
            meta: ModelMeta {
                nc,
                names,
                strides: STRIDES.to_vec(),
                graph: crate::model::weights::graph_of(&arch),
                arch: arch.clone(),
                int8: None,
            },
            arch,
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
        let seg = match raw.seg {
            None => None,
            Some(sg) => Some(SegRaw {
                aux: match sg.aux {
                    Some((l, p)) => Some((out(l)?, tape.output(&p)?)),
                    None => None,
                },
                main: (out(sg.main.0)?, tape.output(&sg.main.1)?),
            }),
        };
        let raw = DualRaw {
            aux: out(raw.aux)?,
            main: out(raw.main)?,
            seg,
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
        let taps: Vec<Src> = self.taps.iter().chain(&self.proto_taps).copied().collect();
        let mut feats = self.net.forward(&x, c, &taps)?;
        let protos = feats.split_off(self.taps.len());
        let main = feats.split_off(self.aux_taps());
        let seg = match &self.masks {
            None => None,
            Some((aux_m, main_m)) => {
                // Prototype inputs: the extra taps (aux then main), or P3 of each branch.
                let proto_in = |k: usize, branch: &[Tensor]| -> Tensor {
                    protos.get(k).unwrap_or(&branch[0]).clone()
                };
                let aux = match aux_m {
                    Some(m) => Some((
                        m.run_coeff_levels(&feats, c)?,
                        m.proto.run(&proto_in(0, &feats), c)?,
                    )),
                    None => None,
                };
                let k = usize::from(aux_m.is_some());
                Some(SegRaw {
                    aux,
                    main: (
                        main_m.run_coeff_levels(&main, c)?,
                        main_m.proto.run(&proto_in(k, &main), c)?,
                    ),
                })
            }
        };
        let mut raw = DualRaw {
            aux: match &self.head_aux {
                Some(h) => h.run_raw(&feats, c)?,
                None => Vec::new(),
            },
            main: self.head_main.run_raw(&main, c)?,
            seg,
        };
        if amp {
            for t in raw.aux.iter_mut().chain(raw.main.iter_mut()) {
                *t = c.cast(t, DType::F32)?;
            }
            if let Some(sg) = raw.seg.as_mut() {
                let SegRaw { aux, main } = sg;
                for (levels, p) in aux.iter_mut().chain(std::iter::once(main)) {
                    for t in levels.iter_mut() {
                        *t = c.cast(t, DType::F32)?;
                    }
                    *p = c.cast(p, DType::F32)?;
                }
            }
        }
        Ok(raw)
    }

    /// Eval-mode forward, decoded: (y_aux, y_main), each (B, 4+nc, A) as [`YoloV9::forward`]
    /// (y_aux is (B, 4+nc, 0) for a single-head graph).
    pub fn forward_eval_decoded(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        self.forward(x, false)?.decode()
    }

    /// Head-input features of the main branch (P3, P4, P5) in eval or train mode.
    pub fn forward_features(&self, x: &Tensor, train: bool) -> Result<Vec<Tensor>> {
        check_input(x)?;
        let n = self.aux_taps();
        self.net.forward(
            &x.to_device(&self.device)?,
            Ctx::plain(train),
            &self.taps[n..],
        )
    }

    /// The model description of this graph.
    pub fn arch(&self) -> &Arch {
        &self.arch
    }

    /// Whether the graph has mask branches (a segmentation head): its forward fills
    /// [`DualRaw::seg`].
    pub fn is_seg(&self) -> bool {
        self.arch.seg().is_some()
    }

    /// Whether the graph has the auxiliary branch (`DualDDetect`); `false` for gelan-*.
    pub fn is_dual(&self) -> bool {
        self.head_aux.is_some()
    }

    /// How many of `taps` feed the auxiliary head (half of them for a dual head, else 0).
    fn aux_taps(&self) -> usize {
        if self.head_aux.is_some() {
            self.taps.len() / 2
        } else {
            0
        }
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

    /// Of [`YoloV9Train::initialized`], the tensors the weights hold with another shape, as
    /// `(name, shape in the weights, shape here)`: re-initialised as the official
    /// `intersect_dicts` drops them (e.g. the last class convs of weights for another `nc`).
    pub fn reshaped(&self) -> &[(String, Vec<usize>, Vec<usize>)] {
        &self.reshaped
    }

    /// Metadata (nc, names, strides, `Graph::Train`, or `Graph::Infer` for a single-head graph).
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
            out.insert(
                v.name.clone(),
                crate::device::to_host(v.var.as_tensor())?.copy()?,
            );
        }
        let nbt = Tensor::new(self.batches_tracked(), &cpu)?;
        for (p, m, v) in &self.buffers {
            out.insert(
                format!("{p}.running_mean"),
                crate::device::to_host(m.as_tensor())?.copy()?,
            );
            out.insert(
                format!("{p}.running_var"),
                crate::device::to_host(v.as_tensor())?.copy()?,
            );
            out.insert(format!("{p}.num_batches_tracked"), nbt.clone());
        }
        let bins = Tensor::arange(0f32, REG_MAX as f32, &cpu)?.reshape((1, REG_MAX, 1, 1))?;
        for n in dfl_names(&self.arch) {
            out.insert(n, bins.clone());
        }
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
        for n in dfl_names(&self.arch) {
            out.push((n, bins.clone()));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// A copy of the BN running statistics and `num_batches_tracked`, on the model's device:
    /// what a train-mode forward changes besides the parameters. [`Self::restore_bn`] puts them
    /// back, so that a training step that failed halfway (out of memory) can be redone exactly.
    pub fn snapshot_bn(&self) -> Result<BnSnapshot> {
        let mut stats = Vec::with_capacity(self.buffers.len());
        #[cfg(feature = "cuda")]
        {
            // One multi-tensor copy on CUDA: this runs before every training batch, where a copy
            // per statistic is an allocation and a launch for each of several hundred tensors.
            let all: Vec<&Tensor> = self
                .buffers
                .iter()
                .flat_map(|(_, m, v)| [m.as_tensor(), v.as_tensor()])
                .collect();
            if crate::cuda::optim::applies(&all) {
                let mut c = crate::cuda::optim::sum_new(None, &all)?.into_iter();
                while let (Some(m), Some(v)) = (c.next(), c.next()) {
                    stats.push((m, v));
                }
            }
        }
        if stats.is_empty() {
            for (_, m, v) in &self.buffers {
                stats.push((m.as_tensor().copy()?, v.as_tensor().copy()?));
            }
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

    /// The BN running statistics (every layer's mean then variance, in layer order) and
    /// `num_batches_tracked` (two values: `n >> 24` and `n & 0xFF_FFFF`, exact in f32) as one
    /// flat f32 buffer, for data-parallel ranks to share ([`Self::set_bn_flat`] reads it back).
    pub fn bn_flat(&self) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for (_, m, v) in &self.buffers {
            out.extend(
                m.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
            out.extend(
                v.as_tensor()
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
        }
        let n = self.batches_tracked().max(0);
        out.push((n >> 24) as f32);
        out.push((n & 0xFF_FFFF) as f32);
        Ok(out)
    }

    /// Sets the BN running statistics and `num_batches_tracked` from a [`Self::bn_flat`] buffer
    /// of this model. Errors when its length is not this model's.
    pub fn set_bn_flat(&self, flat: &[f32]) -> Result<()> {
        let need: usize = self
            .buffers
            .iter()
            .map(|(_, m, v)| m.elem_count() + v.elem_count())
            .sum::<usize>()
            + 2;
        ensure!(
            flat.len() == need,
            "BN buffer of {} values, this model has {need}",
            flat.len()
        );
        let mut off = 0;
        for (_, m, v) in &self.buffers {
            for var in [m, v] {
                let n = var.elem_count();
                let t = Tensor::from_slice(&flat[off..off + n], var.shape(), var.device())?
                    .to_dtype(var.dtype())?;
                var.set(&t)?;
                off += n;
            }
        }
        let n = ((flat[off] as i64) << 24) | flat[off + 1] as i64;
        self.batches_tracked.store(n, Ordering::Relaxed);
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
        if let Some(t) = sd.get(&first_counter(&self.arch)) {
            let n = t.to_dtype(DType::I64)?.to_scalar::<i64>()?;
            self.batches_tracked.store(n, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// The name of the first BN step counter of `arch` (`model.0.bn.num_batches_tracked` for
/// yolov9-s; `model.1.…` behind a leading Silence).
fn first_counter(arch: &Arch) -> String {
    super::keys::state_dict_entries(arch, 1)
        .ok()
        .and_then(|e| {
            e.into_iter()
                .map(|e| e.0)
                .find(|n| super::keys::is_counter(n))
        })
        .unwrap_or_else(|| "model.0.bn.num_batches_tracked".into())
}

/// The training graph for weights of `arch`: itself when it has the auxiliary branch, else its
/// built-in counterpart (gelan-c → yolov9-c).
pub fn training_arch(arch: &Arc<Arch>) -> Result<Arc<Arch>> {
    if arch.is_dual() {
        return Ok(arch.clone());
    }
    arch.dual_counterpart().map(Arc::new).with_context(|| {
        format!(
            "{}: no training graph with an auxiliary branch matches this inference graph; train \
             it with --cfg naming its yolov9-* description",
            arch.name
        )
    })
}
