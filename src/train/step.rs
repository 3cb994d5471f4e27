//! The training step, written once (the inner loop of the official `train_dual.py`).
//!
//! One iteration of the official loop is: forward of both branches in train mode, the dual TAL
//! loss (`(box + cls + dfl) · batch`), backward, gradients accumulated until the nominal batch of
//! 64 images is reached (`accumulate = round(64 / batch)` iterations), then an optimizer step:
//! gradient-norm clip at [`MAX_GRAD_NORM`] (10), the optimizer step (SGD Nesterov by default,
//! three groups), EMA update.
//!
//! Here that is two functions:
//! - [`step`] trains one loader batch as micro-batches (u8 images → `f32 / 255`, each
//!   micro-batch's target rows re-indexed from 0, `forward(x, true)`, the loss, a check that the
//!   loss items are finite, backward) and returns the parameter gradients summed over the
//!   micro-batches with the mean loss items ([`BatchOutcome`]);
//! - [`optimizer_step`] clips the gradient norm, steps the optimizer and updates the EMA, and
//!   returns the norm (a non-finite norm skips the optimizer and the EMA; the caller's NaN guard
//!   counts it).
//!
//! Both are called by the trainer ([`crate::train::trainer`], which adds the batch gradients over
//! the accumulation window with [`add_param_grads`]) **and** by the memory-budget probe
//! ([`crate::train::budget`]), so the probe measures exactly the step that runs.
//!
//! [`StepTimes`] is the step's opt-in phase timer (`YOLO9_STEP_TIMES=1`, see [`STEP_TIMES_ENV`]).

use crate::loss::seg::{seg_loss_of_raw, GtMasks};
use crate::loss::tal_loss::targets_tensor;
use crate::loss::DualTalLoss;
use crate::model::yolov9::YoloV9Train;
use crate::train::ema::Ema;
use crate::train::guard::Faults;
use crate::train::optimizer::Optimizer;
use crate::train::pass::{train_backward, train_forward};
use anyhow::Result;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};

/// Gradient-norm clip of the official loop.
pub const MAX_GRAD_NORM: f64 = 10.0;

/// Environment variable that turns on per-phase timing of the training loop
/// (`YOLO9_STEP_TIMES=1`): the device is synchronized at each phase boundary and the summed
/// seconds per phase are printed after each epoch, then the seconds of the epoch's end (results
/// plot, checkpoint, best/periodic copies; `crate::train::epoch`). Off by default (no
/// synchronization, no output).
pub const STEP_TIMES_ENV: &str = "YOLO9_STEP_TIMES";

/// Names of the phases timed by [`StepTimes`], in loop order (the indices of
/// [`StepTimes::mark`]).
pub const PHASES: [&str; 8] = [
    "wait",
    "bn snapshot",
    "input",
    "forward",
    "loss",
    "backward",
    "accumulate",
    "optimizer+ema",
];

/// Indices of [`PHASES`], for [`StepTimes::mark`].
pub mod phase {
    /// Waiting for the loader's batch.
    pub const WAIT: usize = 0;
    /// The BN statistics' snapshot (for out-of-memory recovery).
    pub const BN_SNAPSHOT: usize = 1;
    /// Upload and cast of the images.
    pub const INPUT: usize = 2;
    /// The taped forward (ordinary steps).
    pub const FORWARD: usize = 3;
    /// The loss (ordinary steps).
    pub const LOSS: usize = 4;
    /// The backward (with the forward and loss when the step is replayed from a CUDA graph).
    pub const BACKWARD: usize = 5;
    /// Adding the batch's gradients to the accumulation window.
    pub const ACCUMULATE: usize = 6;
    /// Gradient clipping, the optimizer step and the EMA update.
    pub const OPTIMIZER: usize = 7;
}

/// Opt-in wall-clock time per training-loop phase (see [`STEP_TIMES_ENV`]).
pub struct StepTimes {
    device: Option<Device>,
    last: std::time::Instant,
    secs: [f64; PHASES.len()],
}

impl StepTimes {
    /// Whether [`STEP_TIMES_ENV`] is set to something other than empty or `0`.
    pub fn enabled() -> bool {
        crate::switches::var_os(STEP_TIMES_ENV).is_some_and(|v| !v.is_empty() && v != "0")
    }

    /// On when [`StepTimes::enabled`]; off otherwise.
    pub fn new(device: &Device) -> Self {
        StepTimes {
            device: Self::enabled().then(|| device.clone()),
            last: std::time::Instant::now(),
            secs: [0.0; PHASES.len()],
        }
    }

    /// A timer that is always off (no synchronization, no report), whatever the environment.
    pub fn off() -> Self {
        StepTimes {
            device: None,
            last: std::time::Instant::now(),
            secs: [0.0; PHASES.len()],
        }
    }

    /// Ends phase `i` (index into [`PHASES`]) after the device finished its queued work.
    pub fn mark(&mut self, i: usize) -> Result<()> {
        if let Some(d) = &self.device {
            d.synchronize()?;
            let now = std::time::Instant::now();
            self.secs[i] += (now - self.last).as_secs_f64();
            self.last = now;
        }
        Ok(())
    }

    /// One line `step times (s): wait 0.12, input 0.03, ...`, or `None` when off.
    pub fn report(&self) -> Option<String> {
        self.device.as_ref()?;
        let parts: Vec<String> = PHASES
            .iter()
            .zip(self.secs)
            .map(|(n, t)| format!("{n} {t:.2}"))
            .collect();
        Some(format!(
            "step times (s, summed over the epoch): {}",
            parts.join(", ")
        ))
    }
}

/// Environment variable that turns off (`0`) the upload of the next batch's images during the
/// current step's replay ([`StepInput::next`]; for comparisons).
pub const PREFETCH_ENV: &str = "YOLO9_PREFETCH";

/// Whether the next batch's images are uploaded during the current step (a CUDA device and
/// [`PREFETCH_ENV`] not `0`).
pub fn prefetch_on(device: &Device) -> bool {
    device.is_cuda() && !crate::switches::off(PREFETCH_ENV)
}

/// The next batch's image bytes (`n × 3 × img × img`) on the CUDA `device`, queued as an
/// asynchronous copy from pinned memory ([`crate::cuda::upload::upload_u8`]); `None` elsewhere.
fn prefetch(bytes: &[u8], img: usize, device: &Device) -> Result<Option<Tensor>> {
    let per_image = 3 * img * img;
    if bytes.is_empty() || per_image == 0 || !bytes.len().is_multiple_of(per_image) {
        return Ok(None);
    }
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        let shape = (bytes.len() / per_image, 3, img, img);
        return Ok(Some(crate::cuda::upload::upload_u8(bytes, shape, device)?));
    }
    let _ = device;
    Ok(None)
}

/// What one step trains: a loader batch's images and targets
/// (see [`crate::data::loader::Batch`]).
#[derive(Debug, Clone, Copy)]
pub struct StepInput<'a> {
    /// `len × 3 × img × img` RGB bytes, channel-major (CHW per image).
    pub images: &'a [u8],
    /// Targets `[img, cls, cx, cy, w, h]`, normalized, `img` indexing the batch.
    pub targets: &'a [[f32; 6]],
    /// Number of images.
    pub len: usize,
    /// Square image side in pixels.
    pub img: usize,
    /// `images` already on the step's device (u8, `len × 3 × img × img`): what the previous
    /// step uploaded as its [`BatchOutcome::next_images`]. `None`: uploaded by the step.
    pub on_device: Option<&'a Tensor>,
    /// The next batch's image bytes (same layout): on CUDA, the step uploads them while its last
    /// replayed micro-step runs (the host would otherwise copy them while the GPU waits) and
    /// returns them as [`BatchOutcome::next_images`].
    pub next: Option<&'a [u8]>,
    /// Segmentation models: the images' overlap masks, `len × m × m` (see
    /// [`crate::data::loader::Batch::masks`]). Empty: all-background masks at `img / 4` (what
    /// the memory probe trains on).
    pub masks: &'a [u32],
}

impl<'a> StepInput<'a> {
    /// The images and targets of `batch` at side `img`.
    pub fn of(batch: &'a crate::data::loader::Batch, img: usize) -> Self {
        StepInput {
            images: &batch.images,
            targets: &batch.targets,
            len: batch.len,
            img,
            on_device: None,
            next: None,
            masks: &batch.masks,
        }
    }
}

/// What a step runs on: the training model, the loss and the optimizer (for its parameter
/// list), on `device`.
#[derive(Clone, Copy)]
pub struct StepParts<'a> {
    /// The training graph (both branches).
    pub model: &'a YoloV9Train,
    /// The dual TAL loss.
    pub loss: &'a DualTalLoss,
    /// The optimizer; its parameters are the gradients kept.
    pub opt: &'a Optimizer,
    /// The device of the model.
    pub device: &'a Device,
    /// CUDA-graph replay of the micro-step ([`crate::train::graphed`]); `None` runs every
    /// micro-step with ordinary launches (the memory-budget probe measures those).
    pub graphs: Option<&'a std::cell::RefCell<crate::train::graphed::StepGraphs>>,
}

/// Outcome of one loader batch.
pub struct BatchOutcome {
    /// Mean losses `[box, cls, dfl, seg]` over the batch's images (NaN when not finite; `seg` is 0
    /// for a detection model).
    pub items: [f64; 4],
    /// Parameter gradients of the batch (`None` when the loss was not finite).
    pub grads: Option<GradStore>,
    /// [`StepInput::next`] on the device, when the step uploaded it.
    pub next_images: Option<Tensor>,
}

/// Trains one loader batch as micro-batches of `micro` images and returns the summed parameter
/// gradients (official `loss * batch_size` per micro-batch, so gradients add up as for the
/// whole batch). `ni` is the iteration, for the injected faults (`faults.nan_at`: the loss
/// items become NaN; `faults.oom_above`: a micro-batch larger than that fails after its forward
/// with an out-of-memory error). A non-finite loss stops the batch before its backward and
/// returns `grads: None`. Any error, out-of-memory included, leaves the model's parameters
/// untouched (the BN statistics of the forwards that ran are the caller's to restore).
pub fn step(
    parts: &StepParts<'_>,
    input: &StepInput<'_>,
    micro: usize,
    faults: &Faults,
    ni: usize,
    times: &mut StepTimes,
) -> Result<BatchOutcome> {
    let StepParts {
        model,
        loss,
        opt,
        device,
        graphs,
    } = *parts;
    let s = input.img;
    let n = input.len;
    let per_image = 3 * s * s;
    let mut grads: Option<GradStore> = None;
    let mut items = [0f64; 4];
    let mut start = 0;
    let mut next_images = None;
    let on_device = input
        .on_device
        .filter(|t| t.dims() == [n, 3, s, s] && t.device().same_device(device));
    // `micro`-sized micro-batches; under --sync-bn the same number on every rank.
    let splits = crate::model::bn_sync::agreed_split(n, micro, device)?;
    let last = splits.len().saturating_sub(1);
    for (k, len) in splits.into_iter().enumerate() {
        let x = match on_device {
            Some(t) => t.narrow(0, start, len)?,
            None => Tensor::from_slice(
                &input.images[start * per_image..(start + len) * per_image],
                (len, 3, s, s),
                device,
            )?,
        }
        .to_dtype(DType::F32)?
        .affine(1.0 / 255.0, 0.0)?;
        times.mark(phase::INPUT)?;
        let rows: Vec<[f32; 6]> = input
            .targets
            .iter()
            .filter(|t| (t[0] as usize) >= start && (t[0] as usize) < start + len)
            .map(|t| {
                let mut r = *t;
                r[0] -= start as f32;
                r
            })
            .collect();
        // On the host: the loss reads the targets there (no upload and read-back).
        let t = targets_tensor(&rows, &Device::Cpu)?;
        let replay = !model.is_seg() && faults.oom_above.is_none();
        if let Some(gr) = graphs.filter(|g| replay && g.borrow().applies(&x)) {
            // Forward, loss and backward in one call (replayed graphs): the forward and loss
            // phases are timed as part of the backward.
            let params: Vec<Tensor> = opt
                .params()
                .iter()
                .map(|p| p.var.as_tensor().clone())
                .collect();
            let mut between = || -> Result<()> {
                if let Some(b) = input.next.filter(|_| k == last) {
                    next_images = prefetch(b, s, device)?;
                }
                Ok(())
            };
            let out = gr.borrow_mut().micro_step_with(
                model,
                loss,
                &params,
                &x,
                &t,
                (s, s),
                &mut between,
            )?;
            times.mark(phase::BACKWARD)?;
            let [bx, cls, dfl] = out.items;
            let mut li = [bx, cls, dfl, 0.0];
            if faults.nan_at.contains(&ni) {
                li = [f32::NAN; 4];
            }
            let Some(mut g) = out.grads.filter(|_| li.iter().all(|v| v.is_finite())) else {
                return Ok(BatchOutcome {
                    items: li.map(|v| v as f64),
                    grads: None,
                    next_images,
                });
            };
            add_param_grads(&mut grads, &mut g, opt)?;
            for (m, v) in items.iter_mut().zip(li) {
                *m += v as f64 * len as f64;
            }
            start += len;
            continue;
        }
        let (raw, tape) = train_forward(model, &x)?;
        times.mark(phase::FORWARD)?;
        if faults.kill_at == Some(ni) {
            crate::train::guard::die();
        }
        if faults.oom_above.is_some_and(|k| len > k) {
            return Err(crate::memory::OutOfMemory {
                what: format!("injected fault (oom>K) for a micro-batch of {len}"),
            }
            .into());
        }
        let (total, mut li) = if model.is_seg() {
            let masks = micro_masks(input, start, len, device)?;
            let lo = seg_loss_of_raw(loss, &raw, &t, GtMasks::Overlap(&masks), (s, s))?;
            let [bx, seg, cls, dfl] = lo.items;
            (lo.total, [bx, cls, dfl, seg])
        } else {
            let lo = loss.compute(&raw.aux, &raw.main, &t, (s, s))?;
            let [bx, cls, dfl] = lo.items;
            (lo.total, [bx, cls, dfl, 0.0])
        };
        times.mark(phase::LOSS)?;
        if faults.nan_at.contains(&ni) {
            li = [f32::NAN; 4];
        }
        if crate::model::bn_sync::any(li.iter().any(|v| !v.is_finite()), device)? {
            return Ok(BatchOutcome {
                items: li.map(|v| v as f64),
                grads: None,
                next_images,
            });
        }
        let mut g = train_backward(&total, raw, tape)?;
        add_param_grads(&mut grads, &mut g, opt)?;
        times.mark(phase::BACKWARD)?;
        for (m, v) in items.iter_mut().zip(li) {
            *m += v as f64 * len as f64;
        }
        start += len;
    }
    Ok(BatchOutcome {
        items: items.map(|v| v / n.max(1) as f64),
        grads,
        next_images,
    })
}

/// The overlap masks `(len, m, m)` f32 of images `start..start + len` of `input` on `device`,
/// `m = img / MASK_RATIO` (all background when the input has none).
///
/// Errors: masks of another size than `input.len × m × m`.
fn micro_masks(input: &StepInput<'_>, start: usize, len: usize, device: &Device) -> Result<Tensor> {
    let m = input.img / crate::data::polygons::MASK_RATIO;
    if input.masks.is_empty() {
        return Ok(Tensor::zeros((len, m, m), DType::F32, device)?);
    }
    anyhow::ensure!(
        input.masks.len() == input.len * m * m,
        "segmentation step: {} mask values for {} images of {m}x{m}",
        input.masks.len(),
        input.len
    );
    let slice = &input.masks[start * m * m..(start + len) * m * m];
    Ok(Tensor::from_slice(slice, (len, m, m), &Device::Cpu)?
        .to_dtype(DType::F32)?
        .to_device(device)?)
}

/// The optimizer step of the official loop: clips the global gradient norm of `grads` to
/// [`MAX_GRAD_NORM`], steps `opt`, then updates `ema` from the model's float state. Returns
/// the norm before clipping; when it is not finite, the optimizer and the EMA are skipped (the
/// gradients are left as they are) and the caller's NaN guard decides.
pub fn optimizer_step(
    model: &YoloV9Train,
    opt: &mut Optimizer,
    ema: &mut Ema,
    grads: &mut GradStore,
) -> Result<f64> {
    let norm = opt.clip_grad_norm(grads, MAX_GRAD_NORM)?;
    if norm.is_finite() {
        opt.step(grads)?;
        ema.update(&model.float_state()?)?;
    }
    Ok(norm)
}

/// Moves the parameter gradients of `g` into `acc` (summing), leaving everything else behind.
///
/// On CUDA, when every gradient is a contiguous f32 tensor and `acc` already holds all of them,
/// the sums are written by one multi-tensor launch into one new buffer
/// ([`crate::cuda::optim::sum_new`]) instead of one add per parameter tensor: this runs after
/// every micro-batch and every batch, and ~900 small launches took longer on the host than the
/// GPU needed for them. The values are the same (one f32 add per element).
/// `YOLO9_FUSED_GRADS=0` turns the one-launch form off (for comparisons).
pub fn add_param_grads(
    acc: &mut Option<GradStore>,
    g: &mut GradStore,
    opt: &Optimizer,
) -> Result<()> {
    #[cfg(feature = "cuda")]
    if add_param_grads_fused(acc, g, opt)? {
        return Ok(());
    }
    let a = acc.get_or_insert_with(GradStore::default);
    for p in opt.params() {
        if let Some(t) = g.remove(p.var.as_tensor()) {
            // Detached: a variable's gradient can still reference the step's forward graph
            // (see `Optimizer::step`); holding it across micro-batches would keep every graph alive.
            let t = t.detach();
            let sum = match a.remove(p.var.as_tensor()) {
                Some(prev) => (prev + t)?,
                None => t,
            };
            a.insert(p.var.as_tensor(), sum);
        }
    }
    Ok(())
}

/// The one-launch form of [`add_param_grads`] for a window that already holds every one of
/// `g`'s parameter gradients (the first micro-batch's are moved in, as the per-tensor path
/// does: no copy); `false` (nothing moved) where it does not apply.
#[cfg(feature = "cuda")]
fn add_param_grads_fused(
    acc: &mut Option<GradStore>,
    g: &mut GradStore,
    opt: &Optimizer,
) -> Result<bool> {
    let Some(store) = acc.as_mut() else {
        return Ok(false);
    };
    if !crate::cuda::optim::fused_grads() {
        return Ok(false);
    }
    // (parameter, held sum, new gradient) for every parameter with a gradient in `g`.
    let mut triples = Vec::new();
    for p in opt.params().iter().map(|p| p.var.as_tensor()) {
        if let Some(b) = g.get(p) {
            match store.get(p) {
                Some(a) if a.dims() == b.dims() => triples.push((p, a.clone(), b.clone())),
                _ => return Ok(false),
            }
        }
    }
    let a: Vec<&Tensor> = triples.iter().map(|(_, a, _)| a).collect();
    let b: Vec<&Tensor> = triples.iter().map(|(_, _, b)| b).collect();
    let apply = crate::cuda::optim::applies;
    if b.is_empty() || !apply(&a) || !apply(&b) {
        return Ok(false);
    }
    let sums = crate::cuda::optim::sum_new(Some(&a), &b)?;
    for ((p, _, _), s) in triples.iter().zip(sums) {
        g.remove(p);
        store.insert(p, s);
    }
    Ok(true)
}
