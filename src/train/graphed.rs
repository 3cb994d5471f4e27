//! The training micro-step (taped forward → loss → tape backward) with its forward and backward
//! replayed from CUDA graphs.
//!
//! The step is bound by the host: enqueueing the ~1,700 kernels of the taped forward and the
//! ~3,600 of its backward takes longer than the GPU needs to run them (`benches/train_step.rs`:
//! `forward_host_ms` ≈ the forward phase). A CUDA graph replays a recorded sequence with one
//! launch (see [`crate::cuda::graph`] for the mechanism and its requirements).
//!
//! [`StepGraphs::micro_step`] captures two graphs for one input shape and precision:
//! - **forward**: the taped forward ([`YoloV9Train::forward_taped`]) from a fixed input buffer;
//!   its head outputs (the loss's inputs) and the tape (each node's saved tensors) live in graph
//!   memory, at the same addresses at every replay, and the BN running statistics are updated in
//!   place as in an ordinary forward;
//! - **backward**: [`crate::model::tape::Tape::backward`] from fixed gradient-seed buffers to the
//!   parameter gradients; it frees the forward's saved tensors as it goes, as the ordinary backward
//!   does.
//!
//! Between the two, the loss (with its CPU assigner) runs as ordinary launches on the forward's
//! outputs, and candle's backward of the loss fills the seed buffers. The parameter gradients are
//! copied out of graph memory before they are returned (the next replay reuses it).
//!
//! Policy: the first micro-step of a shape runs ordinarily (choosing the cuDNN algorithms and
//! filling candle's cache of small uploads, which a capture needs); later ones capture once and
//! replay. One capture is kept. Under a memory budget (whose sizing measured one step's memory,
//! not two) a micro-batch of another shape (a smaller last batch) drops it and runs ordinarily,
//! and [`StepGraphs::release_for_other_work`] drops it before validation, so a capture's memory
//! is never held while something else needs memory; the next micro-step of a known shape
//! captures again. Without a budget ([`StepGraphs::set_keep`]) the capture survives both: the
//! other shape runs ordinarily beside it and validation runs beside it (an out-of-memory error in
//! validation drops it before the retry). [`StepGraphs::reset`] drops it after an out-of-memory
//! error of the step. Before capturing, the memory the ordinary
//! steps left cached in the stream-ordered pool is returned, and after dropping a capture its
//! graph memory, so the device holds one step's memory, not two.
//! A capture that fails (an out-of-memory included) turns the graphs off for the run with one
//! warning. `YOLO9_TRAIN_GRAPH=0` turns them off; they need the tape ([`crate::model::tape`]).
//! The values are those of the ordinary step (`tests/gpu_parity.rs` compares every gradient).

use crate::loss::DualTalLoss;
use crate::model::yolov9::YoloV9Train;
use anyhow::Result;
use candle_core::backprop::GradStore;
use candle_core::Tensor;

/// Environment variable that turns CUDA-graph replay of the training step off (`0`).
pub const TRAIN_GRAPH_ENV: &str = "YOLO9_TRAIN_GRAPH";

/// Whether [`TRAIN_GRAPH_ENV`] allows training graphs (default yes).
pub fn train_graphs_enabled() -> bool {
    std::env::var(TRAIN_GRAPH_ENV).map_or(true, |v| v.trim() != "0")
}

/// The outcome of one micro-step: the loss items and, when they are finite, the parameter
/// gradients (fresh tensors, keyed by the parameters).
pub struct MicroOutcome {
    /// `[box, cls, dfl]` loss items of the micro-batch.
    pub items: [f32; 3],
    /// Parameter gradients (`None` when an item is not finite: no backward ran).
    pub grads: Option<GradStore>,
}

/// The captured training step of one run (see the module docs). Not `Send`.
#[derive(Default)]
pub struct StepGraphs {
    #[cfg(feature = "cuda")]
    inner: imp::State,
}

impl std::fmt::Debug for StepGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, r) = self.counts();
        write!(f, "StepGraphs {{ captures: {c}, replays: {r} }}")
    }
}

impl StepGraphs {
    /// No capture yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// (captures made, micro-steps replayed).
    pub fn counts(&self) -> (usize, usize) {
        #[cfg(feature = "cuda")]
        return (self.inner.captures, self.inner.replays);
        #[cfg(not(feature = "cuda"))]
        (0, 0)
    }

    /// Drops the capture (its graph memory is released); the next micro-steps start over with
    /// an ordinary one. For out-of-memory recovery.
    pub fn reset(&mut self) {
        #[cfg(feature = "cuda")]
        self.inner.drop_capture();
    }

    /// Keeps the capture across micro-batches of another shape and across validation (see the
    /// module docs): for runs without a memory budget.
    pub fn set_keep(&mut self, keep: bool) {
        #[cfg(feature = "cuda")]
        {
            self.inner.keep = keep;
        }
        let _ = keep;
    }

    /// Before other work that needs device memory (validation): drops the capture unless it is
    /// kept ([`StepGraphs::set_keep`]).
    pub fn release_for_other_work(&mut self) {
        #[cfg(feature = "cuda")]
        if !self.inner.keep {
            self.inner.drop_capture();
        }
    }

    /// Turns replay off for good (the ordinary step runs).
    pub fn disable(&mut self) {
        #[cfg(feature = "cuda")]
        {
            self.inner.drop_capture();
            self.inner.off = true;
        }
    }

    /// Whether micro-steps on `dev` would be replayed (a CUDA device, the tape on, graphs allowed
    /// and not turned off).
    pub fn applies_to(&self, dev: &candle_core::Device) -> bool {
        #[cfg(feature = "cuda")]
        return dev.is_cuda()
            && crate::model::tape::enabled_for(dev)
            && train_graphs_enabled()
            && !self.inner.off;
        #[cfg(not(feature = "cuda"))]
        {
            let _ = dev;
            false
        }
    }

    /// Whether [`StepGraphs::micro_step`] can run for `x` (a CUDA tensor, the tape on, graphs
    /// allowed and not turned off by a failed capture). When `false`, run the ordinary step.
    pub fn applies(&self, x: &Tensor) -> bool {
        self.applies_to(x.device())
    }

    /// One micro-step on `x` (B, 3, H, W) f32 and `targets` (N, 6), captured, replayed or run
    /// ordinarily by the policy of the module docs. `params` are the tensors whose gradients are
    /// returned (the optimizer's variables).
    ///
    /// Errors: those of the ordinary step (forward, loss, backward); a failed capture is not
    /// one (the ordinary step runs, and graphs are off from then on).
    pub fn micro_step(
        &mut self,
        model: &YoloV9Train,
        loss: &DualTalLoss,
        params: &[Tensor],
        x: &Tensor,
        targets: &Tensor,
        img_hw: (usize, usize),
    ) -> Result<MicroOutcome> {
        #[cfg(feature = "cuda")]
        return self
            .inner
            .micro_step(model, loss, params, x, targets, img_hw);
        #[cfg(not(feature = "cuda"))]
        ordinary(model, loss, params, x, targets, img_hw)
    }
}

/// The ordinary micro-step: taped (or autograd) forward, loss, backward.
pub fn ordinary(
    model: &YoloV9Train,
    loss: &DualTalLoss,
    params: &[Tensor],
    x: &Tensor,
    targets: &Tensor,
    img_hw: (usize, usize),
) -> Result<MicroOutcome> {
    ordinary_step(model, loss, params, x, targets, img_hw, false)
}

/// [`ordinary`], with candle's cache of small host-to-device uploads on around the forward and
/// the backward when `cache_uploads` (and `x` is on CUDA): what a capture of the same shape needs
/// to find cached. The loss runs outside it (its uploads change with every batch).
fn ordinary_step(
    model: &YoloV9Train,
    loss: &DualTalLoss,
    params: &[Tensor],
    x: &Tensor,
    targets: &Tensor,
    img_hw: (usize, usize),
    cache_uploads: bool,
) -> Result<MicroOutcome> {
    // The guard's type is not nameable outside candle; it only has to live for the phase.
    let uploads_cached = || -> Option<Box<dyn std::any::Any>> {
        #[cfg(feature = "cuda")]
        if let (true, candle_core::Device::Cuda(d)) = (cache_uploads, x.device()) {
            return Some(Box::new(d.enable_cuda_graph_htod_cache()));
        }
        let _ = cache_uploads;
        None
    };
    let (raw, tape) = {
        let _cache = uploads_cached();
        crate::train::pass::train_forward(model, x)?
    };
    let lo = loss.compute(&raw.aux, &raw.main, targets, img_hw)?;
    if lo.items.iter().any(|v| !v.is_finite()) {
        return Ok(MicroOutcome {
            items: lo.items,
            grads: None,
        });
    }
    let mut g = {
        let _cache = uploads_cached();
        crate::train::pass::train_backward(&lo.total, raw, tape)?
    };
    let mut out = GradStore::default();
    for p in params {
        if let Some(t) = g.remove(p) {
            out.insert(p, t.detach());
        }
    }
    Ok(MicroOutcome {
        items: lo.items,
        grads: Some(out),
    })
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{ordinary, ordinary_step, MicroOutcome};
    use crate::loss::DualTalLoss;
    use crate::model::yolov9::YoloV9Train;
    use crate::model::DualRaw;
    use anyhow::{anyhow, Context, Result};
    use candle_core::backend::BackendDevice;
    use candle_core::backprop::GradStore;
    use candle_core::{DType, Device, Tensor};
    use cudarc::driver::safe::CudaGraph;
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

    type Key = (Vec<usize>, DType, bool);

    /// One captured shape.
    pub(super) struct Captured {
        // Graphs first: destroyed before the memory held below is freed.
        fwd: CudaGraph,
        bwd: CudaGraph,
        key: Key,
        input: Tensor,
        raw: DualRaw,
        /// (head-output variable, its gradient-seed buffer), aux then main.
        seeds: Vec<(Tensor, Tensor)>,
        /// (parameter, its gradient in the backward graph's memory).
        grads: Vec<(Tensor, Tensor)>,
        /// The backward graph's other outputs (the gradients of parameters the optimizer does
        /// not step: `--freeze` layers): never read, but the graph writes them on every replay,
        /// so their memory must live as long as the graph.
        _unread: Vec<Tensor>,
        /// Replays so far.
        replays: usize,
    }

    #[derive(Default)]
    pub(super) struct State {
        /// Shapes that ran an ordinary step under the upload cache (ready to capture).
        warm: Vec<Key>,
        /// Shapes whose capture was dropped for another shape before it was replayed twice:
        /// shapes that alternate (micro-batches of unequal size) run ordinarily, since a capture
        /// per micro-step costs more than it saves.
        unprofitable: Vec<Key>,
        cap: Option<Captured>,
        /// Keep the capture when another shape runs (see `StepGraphs::set_keep`).
        pub(super) keep: bool,
        pub(super) off: bool,
        pub(super) captures: usize,
        pub(super) replays: usize,
    }

    fn key_of(model: &YoloV9Train, x: &Tensor) -> Key {
        (
            x.dims().to_vec(),
            x.dtype(),
            model.amp() || crate::cuda::conv::strict_fp32(),
        )
    }

    fn outputs(raw: &DualRaw) -> impl Iterator<Item = &Tensor> {
        raw.aux.iter().chain(raw.main.iter())
    }

    impl State {
        /// Drops the capture, if any, and returns its graph memory to the device.
        pub(super) fn drop_capture(&mut self) {
            if let Some(c) = self.cap.take() {
                let dev = c.input.device().clone();
                drop(c);
                if let Device::Cuda(d) = &dev {
                    if let Err(e) = d
                        .synchronize()
                        .and_then(|()| crate::cuda::graph::trim_graph_pool(d))
                    {
                        tracing::warn!("releasing CUDA graph memory: {e}");
                    }
                }
            }
        }

        pub(super) fn micro_step(
            &mut self,
            model: &YoloV9Train,
            loss: &DualTalLoss,
            params: &[Tensor],
            x: &Tensor,
            targets: &Tensor,
            img_hw: (usize, usize),
        ) -> Result<MicroOutcome> {
            let Device::Cuda(dev) = x.device() else {
                return ordinary(model, loss, params, x, targets, img_hw);
            };
            let key = key_of(model, x);
            if let Some(c) = &mut self.cap {
                if c.key == key {
                    self.replays += 1;
                    c.replays += 1;
                    return c.replay(model, loss, x, targets, img_hw);
                }
            }
            if self.keep && self.cap.is_some() {
                // Another shape (the epoch's last partial batch): ordinary, beside the capture.
                return ordinary(model, loss, params, x, targets, img_hw);
            }
            if let Some(c) = &self.cap {
                if c.replays < 2 && !self.unprofitable.contains(&c.key) {
                    self.unprofitable.push(c.key.clone());
                }
            }
            self.drop_capture();
            if self.unprofitable.contains(&key) {
                return ordinary(model, loss, params, x, targets, img_hw);
            }
            if !self.warm.contains(&key) {
                // First sighting: an ordinary step under candle's upload cache, so that the
                // capture finds every small kernel-parameter upload cached and every cuDNN
                // algorithm chosen.
                self.warm.push(key);
                return ordinary_step(model, loss, params, x, targets, img_hw, true);
            }
            // The ordinary steps' memory, cached in the stream-ordered pool, goes back first, so
            // the graphs' pool can take it.
            dev.synchronize()?;
            crate::memory::MemoryProbe::new(x.device())?.release_cached();
            match Captured::capture(dev, model, loss, params, x, targets, img_hw, key) {
                Ok((c, out)) => {
                    self.captures += 1;
                    self.cap = Some(c);
                    Ok(out)
                }
                Err(CaptureError::Step(e)) => Err(e),
                Err(CaptureError::Graph(e)) => {
                    tracing::warn!(
                        "training step: CUDA graph capture failed, ordinary launches are used \
                         from now on: {}",
                        crate::device::error_head(&format!("{e:#}"))
                    );
                    self.off = true;
                    ordinary(model, loss, params, x, targets, img_hw)
                }
            }
        }
    }

    /// A capture failure (fall back to ordinary launches) or an error of the step itself.
    enum CaptureError {
        Graph(anyhow::Error),
        Step(anyhow::Error),
    }

    fn begin(dev: &candle_core::CudaDevice) -> Result<()> {
        dev.cuda_stream()
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| anyhow!("begin capture: {e:?}"))
    }

    fn end(dev: &candle_core::CudaDevice) -> Result<CudaGraph> {
        dev.cuda_stream()
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(|e| anyhow!("end capture / instantiate: {e:?}"))?
            .ok_or_else(|| anyhow!("the capture recorded nothing"))
    }

    /// The parameter gradients copied out of the backward graph's memory (which the next
    /// replay overwrites): one multi-tensor copy into one buffer where they are contiguous f32
    /// (always, in practice), else a copy per tensor.
    fn copy_grads(grads: &[(Tensor, Tensor)]) -> Result<GradStore> {
        let gs: Vec<&Tensor> = grads.iter().map(|(_, g)| g).collect();
        let copies = if crate::cuda::optim::fused_grads() && crate::cuda::optim::applies(&gs) {
            crate::cuda::optim::sum_new(None, &gs)?
        } else {
            gs.iter()
                .map(|g| g.copy())
                .collect::<candle_core::Result<_>>()?
        };
        let mut out = GradStore::default();
        for ((p, _), c) in grads.iter().zip(copies) {
            out.insert(p, c);
        }
        Ok(out)
    }

    /// `YOLO9_GRAPH_TIMES=1`: each replay prints its phases' milliseconds, the device
    /// synchronised at each boundary (input copy, forward graph, loss, loss backward into the
    /// seeds, backward graph, gradient copies); off by default (no synchronisation).
    struct Lap {
        dev: Option<Device>,
        t: std::time::Instant,
        ms: [f64; 6],
    }

    impl Lap {
        fn new(dev: &Device) -> Self {
            static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            let on = *ON.get_or_init(|| std::env::var("YOLO9_GRAPH_TIMES").is_ok_and(|v| v == "1"));
            Self {
                dev: on.then(|| dev.clone()),
                t: std::time::Instant::now(),
                ms: [0.0; 6],
            }
        }

        fn mark(&mut self, i: usize) -> Result<()> {
            if let Some(d) = &self.dev {
                d.synchronize()?;
                self.ms[i] = self.t.elapsed().as_secs_f64() * 1e3;
                self.t = std::time::Instant::now();
            }
            Ok(())
        }

        fn report(&self, batch: usize) {
            if self.dev.is_some() {
                let m = self.ms;
                crate::text::errln!(
                    "graph_times batch={batch} input={:.2} fwd={:.2} loss={:.2} seeds={:.2} \
                     bwd={:.2} copy_grads={:.2} ms",
                    m[0],
                    m[1],
                    m[2],
                    m[3],
                    m[4],
                    m[5]
                );
            }
        }
    }

    impl Captured {
        #[allow(clippy::too_many_arguments)]
        fn capture(
            dev: &candle_core::CudaDevice,
            model: &YoloV9Train,
            loss: &DualTalLoss,
            params: &[Tensor],
            x: &Tensor,
            targets: &Tensor,
            img_hw: (usize, usize),
            key: Key,
        ) -> std::result::Result<(Self, MicroOutcome), CaptureError> {
            use CaptureError::{Graph, Step};
            if dev.is_event_tracking() {
                return Err(Graph(anyhow!("the device tracks CUDA events")));
            }
            let input = x
                .contiguous()
                .and_then(|t| t.copy())
                .map_err(|e| Step(e.into()))?;
            dev.synchronize().map_err(|e| Step(e.into()))?;
            // Forward graph.
            let (fwd, raw, tape) = {
                let _cache = dev.enable_cuda_graph_htod_cache();
                begin(dev).map_err(Graph)?;
                let r = model.forward_taped(&input);
                let g = end(dev);
                let (raw, tape) = r
                    .context("taped forward in a CUDA graph capture")
                    .map_err(Graph)?;
                (g.map_err(Graph)?, raw, tape)
            };
            fwd.launch()
                .map_err(|e| Graph(anyhow!("forward replay: {e:?}")))?;
            let lo = loss
                .compute(&raw.aux, &raw.main, targets, img_hw)
                .map_err(Step)?;
            if lo.items.iter().any(|v| !v.is_finite()) {
                return Err(Step(anyhow!(
                    "non-finite loss {:?} in the capture step",
                    lo.items
                )));
            }
            let items = lo.items;
            let mut lg = lo.total.backward().map_err(|e| Step(e.into()))?;
            // Seed buffers: the loss gradients, copied to memory of their own.
            let mut seeds = Vec::new();
            let mut store = GradStore::default();
            for v in outputs(&raw) {
                let s = match lg.remove(v) {
                    Some(g) => g.contiguous().and_then(|g| g.copy()),
                    None => v.zeros_like(),
                }
                .map_err(|e| Step(e.into()))?;
                store.insert(v, s.clone());
                seeds.push((v.clone(), s));
            }
            drop(lg);
            drop(lo);
            dev.synchronize().map_err(|e| Step(e.into()))?;
            // Backward graph.
            let (bwd, mut pg) = {
                let _cache = dev.enable_cuda_graph_htod_cache();
                begin(dev).map_err(Graph)?;
                let r = tape.backward(&mut store);
                drop(store);
                let g = end(dev);
                let pg = r
                    .context("tape backward in a CUDA graph capture")
                    .map_err(Graph)?;
                (g.map_err(Graph)?, pg)
            };
            let grads: Vec<(Tensor, Tensor)> = params
                .iter()
                .filter_map(|p| pg.remove(p).map(|g| (p.clone(), g)))
                .collect();
            let unread: Vec<Tensor> = pg
                .get_ids()
                .filter_map(|id| pg.get_id(*id).cloned())
                .collect();
            drop(pg);
            bwd.launch()
                .map_err(|e| Graph(anyhow!("backward replay: {e:?}")))?;
            let out = copy_grads(&grads).map_err(Step)?;
            let c = Captured {
                fwd,
                bwd,
                key,
                input,
                raw,
                seeds,
                grads,
                _unread: unread,
                replays: 0,
            };
            Ok((
                c,
                MicroOutcome {
                    items,
                    grads: Some(out),
                },
            ))
        }

        /// One replayed micro-step (see the module docs).
        fn replay(
            &self,
            model: &YoloV9Train,
            loss: &DualTalLoss,
            x: &Tensor,
            targets: &Tensor,
            img_hw: (usize, usize),
        ) -> Result<MicroOutcome> {
            let mut lap = Lap::new(x.device());
            self.input.slice_set(&x.contiguous()?, 0, 0)?;
            lap.mark(0)?;
            self.fwd
                .launch()
                .map_err(|e| anyhow!("training forward replay: {e:?}"))?;
            model.count_batch();
            lap.mark(1)?;
            let lo = loss.compute(&self.raw.aux, &self.raw.main, targets, img_hw)?;
            lap.mark(2)?;
            if lo.items.iter().any(|v| !v.is_finite()) {
                return Ok(MicroOutcome {
                    items: lo.items,
                    grads: None,
                });
            }
            let mut lg = lo.total.backward()?;
            for (v, s) in &self.seeds {
                match lg.remove(v) {
                    Some(g) => s.slice_set(&g.contiguous()?, 0, 0)?,
                    None => s.slice_set(&s.zeros_like()?, 0, 0)?,
                }
            }
            drop(lg);
            lap.mark(3)?;
            self.bwd
                .launch()
                .map_err(|e| anyhow!("training backward replay: {e:?}"))?;
            lap.mark(4)?;
            let grads = copy_grads(&self.grads)?;
            lap.mark(5)?;
            lap.report(x.dims()[0]);
            Ok(MicroOutcome {
                items: lo.items,
                grads: Some(grads),
            })
        }
    }
}
