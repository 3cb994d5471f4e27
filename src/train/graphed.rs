//! The training micro-step (taped forward → loss → loss backward → tape backward) replayed from
//! one CUDA graph.
//!
//! The step is bound by the host: enqueueing the ~1,700 kernels of the taped forward, the loss
//! and the ~3,600 of the backward takes longer than the GPU needs to run them
//! (`benches/train_step.rs`: `forward_host_ms` ≈ the forward phase). A CUDA graph replays a
//! recorded sequence with one launch (see [`crate::cuda::graph`] for the mechanism and its
//! requirements).
//!
//! [`StepGraphs::micro_step`] captures the whole micro-step, for one input shape, precision and
//! GT capacity, as **one** graph: the taped forward ([`YoloV9Train::forward_taped`]) from a fixed
//! input buffer, the loss with its assignment on the device
//! ([`DualTalLoss::compute_on_device`]) from GT rows refilled in place before each replay
//! ([`crate::loss::DeviceGt`], padded to a power-of-two row count per image; a batch with more
//! rows captures again with room for them), candle's backward of the loss, and the tape's
//! backward to the parameter gradients. The BN running statistics are updated in place as in an
//! ordinary forward. Nothing is read back inside the step: after the replay the parameter
//! gradients are copied out of graph memory (the next replay reuses it) and the loss values are
//! read, once.
//!
//! Why one graph: memory, and no host read in the middle of the step. Within one graph the
//! physical memory of what the step frees (the forward's saved tensors, as the backward consumes
//! them) can be reused by what it allocates later; captured as two graphs (forward, then
//! backward) the forward's saved tensors stayed mapped while the backward's allocations were
//! made. Measured on the H200 (2026-12-04, `benches/train_step.rs`): graph pool 4.22 GiB at bs16
//! AMP against 4.53 GiB with two graphs, 16.53 against 17.5–18.2 GiB at bs64. A budget sizes the
//! replayed step with its own measured peak and margin ([`crate::budget::GRAPHED_MARGIN`]).
//!
//! Policy: the first micro-step of a key on a thread runs the same step with ordinary launches
//! (choosing the cuDNN algorithms and filling candle's cache of small uploads, which a capture
//! needs; the pool is trimmed after each tape node, so that what it caches for good does not keep
//! freed blocks reserved); later ones capture once and replay. A key the budget probe warmed up
//! is captured by the run at once, and a budgeted run's GT capacity starts at the probe's
//! ([`StepGraphs::reserve_rows`]), so the run replays what the probe measured. One capture is
//! kept. Under a memory budget (whose sizing
//! measured the graphed step's memory) a micro-batch of another shape (a smaller last batch)
//! drops it and runs ordinarily, and [`StepGraphs::release_for_other_work`] drops it before
//! validation, so a capture's memory is never held while something else needs memory; the next
//! micro-step of a known shape captures again. Without a budget ([`StepGraphs::set_keep`]) the
//! capture survives both: the other shape runs ordinarily beside it and validation runs beside
//! it (an out-of-memory error in validation drops it before the retry). [`StepGraphs::reset`]
//! drops it after an out-of-memory error of the step. Before capturing, the memory the ordinary
//! steps left cached in the stream-ordered pool is returned, and after dropping a capture its
//! graph memory, so the device holds one step's memory, not two.
//! A capture that fails (an out-of-memory included) turns the graphs off for the run with one
//! warning. `YOLO9_TRAIN_GRAPH=0` turns them off; they need the tape ([`crate::model::tape`])
//! and the loss on the device ([`DualTalLoss::assigns_on`]; otherwise the ordinary step runs).
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
    !crate::switches::off(TRAIN_GRAPH_ENV)
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

    /// Starts the GT row capacity of the captures at room for `n` rows per image (a power of
    /// two, at least 16; it still grows when a batch has more). Under a memory budget the run
    /// starts at the rows its sizing measured ([`crate::budget::BudgetDecision::gt_rows`]):
    /// each growth is an ordinary warm-up step and a new capture, whose first-use allocations
    /// (candle's cached uploads of the new shapes) can keep freed pool memory reserved, so a run
    /// that grew held more memory than its probe (2026-12-04, `YOLO9_MEM_TRACE=1`).
    pub fn reserve_rows(&mut self, n: usize) {
        #[cfg(feature = "cuda")]
        if n > 0 {
            self.inner.reserve_rows(n);
        }
        let _ = n;
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
        self.micro_step_with(model, loss, params, x, targets, img_hw, &mut || Ok(()))
    }

    /// [`StepGraphs::micro_step`], calling `between` once: right after a replayed step is
    /// queued and before its loss values are read back (the host waits for the device there), so
    /// that host work in `between` (the next batch's upload) overlaps the replay; after the step
    /// in the other cases. An error of `between` is the micro-step's.
    #[allow(clippy::too_many_arguments)]
    pub fn micro_step_with(
        &mut self,
        model: &YoloV9Train,
        loss: &DualTalLoss,
        params: &[Tensor],
        x: &Tensor,
        targets: &Tensor,
        img_hw: (usize, usize),
        between: &mut dyn FnMut() -> Result<()>,
    ) -> Result<MicroOutcome> {
        #[cfg(feature = "cuda")]
        {
            let mut called = false;
            let out = self
                .inner
                .micro_step(model, loss, params, x, targets, img_hw, &mut || {
                    called = true;
                    between()
                });
            let out = match out {
                Ok(o) if !called => between().map(|()| o),
                other => other,
            };
            // `YOLO9_MEM_TRACE=1`: what the micro-step was (`warm`, `capture`, `replay`,
            // `ordinary`), the GT row capacity and the memory after it.
            crate::memory::mem_trace(
                x.device(),
                format_args!(
                    "{} batch={} gt_rows={}",
                    self.inner.event,
                    x.dims()[0],
                    self.inner.rows()
                ),
            );
            out
        }
        #[cfg(not(feature = "cuda"))]
        {
            let out = ordinary(model, loss, params, x, targets, img_hw)?;
            between()?;
            Ok(out)
        }
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
    let (raw, tape) = crate::train::pass::train_forward(model, x)?;
    let lo = loss.compute(&raw.aux, &raw.main, targets, img_hw)?;
    if lo.items.iter().any(|v| !v.is_finite()) {
        return Ok(MicroOutcome {
            items: lo.items,
            grads: None,
        });
    }
    let mut g = crate::train::pass::train_backward(&lo.total, raw, tape)?;
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
    use super::{ordinary, MicroOutcome};
    use crate::loss::{DeviceGt, DualTalLoss, GtBatch};
    use crate::model::yolov9::YoloV9Train;
    use anyhow::{anyhow, Context, Result};
    use candle_core::backend::BackendDevice;
    use candle_core::backprop::GradStore;
    use candle_core::{DType, Device, Tensor};
    use cudarc::driver::safe::CudaGraph;
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

    /// Input dims, dtype, AMP, GT rows per image, and a hash of the parameters' shapes (the
    /// model: a warm-up fills the upload cache for one model's shapes only).
    type Key = (Vec<usize>, DType, bool, usize, u64);

    thread_local! {
        /// Keys whose whole step ran ordinarily on this thread under candle's upload cache
        /// (ready to capture). Per thread, as that cache is (cuDNN's algorithm choices are
        /// process-wide), and per model (the key hashes the parameters' shapes): a key warmed by
        /// the budget probe's steps is not warmed again by the run that follows on the same
        /// thread, whose pool would otherwise grow to an ordinary step's size once more before
        /// the first capture (2026-12-04: 0.4 GiB more held at micro-batch 16 for the whole run).
        static WARM: std::cell::RefCell<Vec<Key>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// The GT row capacity per image for a batch whose largest image has `n` rows: a power of
    /// two, at least 16, so that a run recaptures a few times at most as its batches grow.
    fn row_capacity(n: usize) -> usize {
        n.max(16).next_power_of_two()
    }

    /// One captured shape.
    pub(super) struct Captured {
        // The graph first: destroyed before the memory held below is freed.
        graph: CudaGraph,
        key: Key,
        input: Tensor,
        gt: DeviceGt,
        /// The loss values ([`crate::loss::DeviceLoss::values`]) in graph memory.
        values: Tensor,
        /// (parameter, its gradient in graph memory).
        grads: Vec<(Tensor, Tensor)>,
        /// Replays so far.
        replays: usize,
    }

    #[derive(Default)]
    pub(super) struct State {
        /// Shapes whose capture was dropped for another shape before it was replayed twice:
        /// shapes that alternate (micro-batches of unequal size) run ordinarily, since a capture
        /// per micro-step costs more than it saves.
        unprofitable: Vec<Key>,
        cap: Option<Captured>,
        /// GT rows per image of the captures (grows with the batches, never shrinks).
        rows: usize,
        /// What the last micro-step was (for `YOLO9_MEM_TRACE`).
        pub(super) event: &'static str,
        /// Keep the capture when another shape runs (see `StepGraphs::set_keep`).
        pub(super) keep: bool,
        pub(super) off: bool,
        pub(super) captures: usize,
        pub(super) replays: usize,
    }

    fn key_of(model: &YoloV9Train, x: &Tensor, rows: usize, params: &[Tensor]) -> Key {
        use std::hash::{Hash, Hasher};
        // In any order: the budget probe's optimizer lists the model's variables as built, the
        // trainer's by parameter group.
        let mut shapes: Vec<&[usize]> = params.iter().map(|p| p.dims()).collect();
        shapes.sort_unstable();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        shapes.hash(&mut h);
        (
            x.dims().to_vec(),
            x.dtype(),
            model.amp() || crate::cuda::conv::strict_fp32(),
            rows,
            h.finish(),
        )
    }

    impl State {
        /// GT rows per image of the captures so far.
        pub(super) fn rows(&self) -> usize {
            self.rows
        }

        /// Room for `n` GT rows per image in the next captures (see `StepGraphs::reserve_rows`).
        pub(super) fn reserve_rows(&mut self, n: usize) {
            self.rows = self.rows.max(row_capacity(n));
        }

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

        #[allow(clippy::too_many_arguments)]
        pub(super) fn micro_step(
            &mut self,
            model: &YoloV9Train,
            loss: &DualTalLoss,
            params: &[Tensor],
            x: &Tensor,
            targets: &Tensor,
            img_hw: (usize, usize),
            between: &mut dyn FnMut() -> Result<()>,
        ) -> Result<MicroOutcome> {
            self.event = "ordinary";
            let Device::Cuda(dev) = x.device() else {
                return ordinary(model, loss, params, x, targets, img_hw);
            };
            if !loss.assigns_on(x.device()) {
                // The loss reads host copies mid-step: nothing to capture.
                return ordinary(model, loss, params, x, targets, img_hw);
            }
            let gt = loss.gt_batch(targets, x.dim(0)?, img_hw)?;
            let step_in = StepIn {
                model,
                loss,
                params,
                x,
                gt: &gt,
                img_hw,
            };
            self.rows = self.rows.max(row_capacity(gt.n_max_boxes));
            let key = key_of(model, x, self.rows, params);
            if let Some(c) = &mut self.cap {
                if c.key == key {
                    self.event = "replay";
                    self.replays += 1;
                    c.replays += 1;
                    return c.replay(model, loss, x, &gt, between);
                }
            }
            // The same shape with more GT rows than the capture has room for: capture again.
            let grown = self
                .cap
                .as_ref()
                .is_some_and(|c| c.key.0 == key.0 && c.key.1 == key.1 && c.key.4 == key.4);
            if self.keep && self.cap.is_some() && !grown {
                // Another shape (the epoch's last partial batch): ordinary, beside the capture.
                return ordinary(model, loss, params, x, targets, img_hw);
            }
            if let Some(c) = &self.cap {
                if !grown && c.replays < 2 && !self.unprofitable.contains(&c.key) {
                    self.unprofitable.push(c.key.clone());
                }
            }
            self.drop_capture();
            if self.unprofitable.contains(&key) {
                return ordinary(model, loss, params, x, targets, img_hw);
            }
            if !WARM.with(|w| w.borrow().contains(&key)) {
                // First sighting on this thread: the same step with ordinary launches under
                // candle's upload cache, so that the capture finds every small upload (kernel
                // parameters, constants) cached and every cuDNN algorithm chosen.
                WARM.with(|w| w.borrow_mut().push(key));
                self.event = "warm";
                return warm_step(dev, &step_in, self.rows);
            }
            // The ordinary steps' memory, cached in the stream-ordered pool, goes back first, so
            // the graph's pool can take it (and a measured peak does not count it beside the
            // graph's memory).
            dev.synchronize()?;
            crate::memory::MemoryProbe::new(x.device())?.fold_peak();
            match Captured::capture(dev, &step_in, key) {
                Ok((c, out)) => {
                    self.event = "capture";
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

    /// The whole micro-step on a device-resident batch: taped forward, the loss on the device
    /// ([`DualTalLoss::compute_on_device`]), its backward and the tape's. Returns the unread
    /// loss values and the gradients of `params`; everything else is dropped before it returns
    /// (inside a capture: freed inside the graph, so its memory is reused by later kernels of
    /// the same graph).
    fn whole(
        model: &YoloV9Train,
        loss: &DualTalLoss,
        params: &[Tensor],
        x: &Tensor,
        gt: &DeviceGt,
        img_hw: (usize, usize),
    ) -> Result<(Tensor, Vec<(Tensor, Tensor)>)> {
        let (raw, tape) = crate::train::pass::train_forward(model, x)?;
        let lo = loss.compute_on_device(&raw.aux, &raw.main, gt, img_hw)?;
        crate::model::tape::node_done();
        let mut pg = crate::train::pass::train_backward(&lo.total, raw, tape)?;
        let grads = params
            .iter()
            .filter_map(|p| pg.remove(p).map(|g| (p.clone(), g)))
            .collect();
        Ok((lo.values, grads))
    }

    /// The micro-step's outcome from its loss values (read back here: a synchronisation) and
    /// gradients; no gradients when a value is not finite.
    fn outcome(loss: &DualTalLoss, values: &Tensor, grads: GradStore) -> Result<MicroOutcome> {
        let v: Vec<f32> = values.to_vec1().context("reading the loss items")?;
        let items = loss.items_of(&v);
        let finite = v.iter().all(|x| x.is_finite());
        Ok(MicroOutcome {
            items,
            grads: finite.then_some(grads),
        })
    }

    /// The first micro-step of a shape: [`whole`] with ordinary launches, candle's upload cache
    /// on (the GT rows, `rows` per image, are uploaded before, outside it: they change with
    /// every batch).
    fn warm_step(dev: &candle_core::CudaDevice, s: &StepIn, rows: usize) -> Result<MicroOutcome> {
        let dg = s.loss.device_gt(s.gt, rows, s.img_hw, s.x.device())?;
        let (values, grads) = {
            let _cache = dev.enable_cuda_graph_htod_cache();
            // After each node: wait for the device and return the pool's free memory, so what
            // this first step keeps for good (candle's cached uploads of its shapes, a few
            // hundred small allocations) is not placed inside memory the step frees later; a
            // pool returns only whole blocks, and such blocks would stay reserved for the whole
            // run. Measured on the H200 (2026-12-04, 16x BCCD, `--budget 8GiB`, micro-batch 16,
            // `YOLO9_MEM_TRACE=1`): pool reserved after the capture 2.5–2.6 GiB against 3.1–3.4
            // without, run peak 7.40 against 8.12 GiB. A second or less, once per shape.
            let probe = crate::memory::MemoryProbe::new(s.x.device())?;
            let d = dev.clone();
            crate::model::tape::with_node_hook(
                move || {
                    let _ = d.synchronize();
                    probe.release_cached();
                },
                || whole(s.model, s.loss, s.params, s.x, &dg, s.img_hw),
            )?
        };
        let mut store = GradStore::default();
        for (p, g) in grads {
            store.insert(&p, g);
        }
        outcome(s.loss, &values, store)
    }

    /// What one micro-step is given (see `StepGraphs::micro_step`), with its GT rows read.
    #[derive(Clone, Copy)]
    struct StepIn<'a> {
        model: &'a YoloV9Train,
        loss: &'a DualTalLoss,
        params: &'a [Tensor],
        x: &'a Tensor,
        gt: &'a GtBatch,
        img_hw: (usize, usize),
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

    /// The parameter gradients copied out of the graph's memory (which the next replay
    /// overwrites): one multi-tensor copy into one buffer where they are contiguous f32
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
    /// synchronised at each boundary (input and GT copies, the graph, the gradient copies and
    /// the loss read-back); off by default (no synchronisation).
    struct Lap {
        dev: Option<Device>,
        t: std::time::Instant,
        ms: [f64; 3],
    }

    impl Lap {
        fn new(dev: &Device) -> Self {
            static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            let on = *ON.get_or_init(|| crate::switches::one("YOLO9_GRAPH_TIMES"));
            Self {
                dev: on.then(|| dev.clone()),
                t: std::time::Instant::now(),
                ms: [0.0; 3],
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
                    "graph_times batch={batch} inputs={:.2} step={:.2} grads_items={:.2} ms",
                    m[0],
                    m[1],
                    m[2]
                );
            }
        }
    }

    impl Captured {
        fn capture(
            dev: &candle_core::CudaDevice,
            s: &StepIn,
            key: Key,
        ) -> std::result::Result<(Self, MicroOutcome), CaptureError> {
            use CaptureError::{Graph, Step};
            let StepIn {
                model,
                loss,
                params,
                x,
                gt,
                img_hw,
            } = *s;
            if dev.is_event_tracking() {
                return Err(Graph(anyhow!("the device tracks CUDA events")));
            }
            let input = x
                .contiguous()
                .and_then(|t| t.copy())
                .map_err(|e| Step(e.into()))?;
            let dg = loss
                .device_gt(gt, key.3, img_hw, x.device())
                .map_err(Step)?;
            dev.synchronize().map_err(|e| Step(e.into()))?;
            let (graph, values, grads) = {
                let _cache = dev.enable_cuda_graph_htod_cache();
                begin(dev).map_err(Graph)?;
                let r = whole(model, loss, params, &input, &dg, img_hw);
                let g = end(dev);
                let (values, grads) = r
                    .context("training step in a CUDA graph capture")
                    .map_err(Graph)?;
                (g.map_err(Graph)?, values, grads)
            };
            graph
                .launch()
                .map_err(|e| Graph(anyhow!("training step replay: {e:?}")))?;
            let c = Captured {
                graph,
                key,
                input,
                gt: dg,
                values,
                grads,
                replays: 0,
            };
            let out = copy_grads(&c.grads)
                .and_then(|g| outcome(loss, &c.values, g))
                .map_err(Step)?;
            Ok((c, out))
        }

        /// One replayed micro-step (see the module docs).
        fn replay(
            &self,
            model: &YoloV9Train,
            loss: &DualTalLoss,
            x: &Tensor,
            gt: &GtBatch,
            between: &mut dyn FnMut() -> Result<()>,
        ) -> Result<MicroOutcome> {
            let mut lap = Lap::new(x.device());
            self.input.slice_set(&x.contiguous()?, 0, 0)?;
            self.gt.set(gt, loss.num_classes())?;
            lap.mark(0)?;
            self.graph
                .launch()
                .map_err(|e| anyhow!("training step replay: {e:?}"))?;
            model.count_batch();
            lap.mark(1)?;
            let grads = copy_grads(&self.grads)?;
            between()?;
            let out = outcome(loss, &self.values, grads)?;
            lap.mark(2)?;
            lap.report(x.dims()[0]);
            Ok(out)
        }
    }
}
