//! The training step's memory probe for budget sizing (`yolo9 train --budget 8GiB`, `--batch
//! auto`; the search, the fit and the decision are [`crate::budget`]'s): the micro-batch is
//! chosen from the **measured** peak memory of real training steps, not from a guess.
//!
//! Method: on the actual device, image size and model, run complete training steps — the
//! trainer's own [`crate::train::step::step`] and [`crate::train::step::optimizer_step`] on
//! synthetic u8 images: forward of the training graph (both branches, BN in train mode), the
//! dual TAL loss with the assigner at the most targets one sample can carry (mosaic joins 4
//! images and mixup blends two mosaics, so up to 8× the most labels of any train image),
//! backward, gradient clipping, the SGD step and the EMA update — at a few micro-batch sizes,
//! reading the peak of each with [`MemoryProbe`]. A least-squares line
//! `peak(b) = base + b · per_image` through the points gives the largest `b` whose predicted
//! peak fits the budget minus a safety margin ([`crate::budget::MARGIN`], or
//! [`crate::budget::GRAPHED_MARGIN`] for the graphed step); that size is then measured once
//! more and lowered while it does not fit. The nominal batch (64) is kept by gradient
//! accumulation in the trainer.
//!
//! On CUDA the peak is the whole process's device memory (the memory pool's reserved
//! high-water mark plus the CUDA context, kernels and library handles outside it, as
//! `nvidia-smi` counts it), and after sizing the pool's cache is kept within the budget; on the
//! CPU the process RSS high-water mark (see [`crate::memory`]). An out-of-memory error while
//! measuring ends the measurement at the sizes that worked.
//!
//! Where the training step is replayed from CUDA graphs ([`crate::train::graphed`]), that step
//! is sized first, with its real peak: the graph holds its memory in a pool of its own, outside
//! the stream-ordered pool, and its peak is not assumed to be the ordinary step's. When the
//! graphed micro-batch is the whole loader batch it is taken; otherwise the ordinary step is
//! sized as well and the faster of the two at its own micro-batch (measured images per second)
//! is chosen, and the run log says which, with both figures ([`BudgetDecision::choice`]).

use crate::budget::{keep_cache_within, search, BudgetDecision};
use crate::loss::DualTalLoss;
use crate::memory::MemoryProbe;
use crate::model::weights::STRIDES;
use crate::model::yolov9::YoloV9Train;
use crate::train::ema::Ema;
use crate::train::graphed::StepGraphs;
use crate::train::guard::Faults;
use crate::train::optimizer::Optimizer;
use crate::train::step::{optimizer_step, step, StepInput, StepParts, StepTimes};
use anyhow::{bail, ensure, Result};
use candle_core::Device;
use rand::{Rng, RngCore, SeedableRng};
use std::cell::RefCell;

/// What to size: model classes, image size, targets per image and the largest micro-batch
/// worth considering.
#[derive(Debug, Clone)]
pub struct BudgetRequest {
    /// Number of classes.
    pub nc: usize,
    /// Square training size, pixels.
    pub img: u32,
    /// Targets per image in the synthetic steps: the most one training sample can carry (the
    /// most labels of any train image, ×4 with mosaic, ×2 more with mixup).
    pub targets_per_image: usize,
    /// Upper bound of the micro-batch (the loader batch, or 64 for `--batch auto`).
    pub max_batch: usize,
    /// Budget in bytes.
    pub budget: u64,
    /// Seed of the synthetic data.
    pub seed: u64,
    /// Mixed precision, as the training run will use it.
    pub amp: bool,
    /// The model trained (its training graph).
    pub arch: std::sync::Arc<crate::model::Arch>,
    /// Whether the training step can be replayed from CUDA graphs on the device
    /// ([`crate::train::graphed::StepGraphs::applies_to`]): then the graphed step is sized too.
    pub graphs: bool,
    /// Whether `max_batch` is the loader batch as given (`--batch N`, so a graphed micro-batch
    /// must divide it) rather than the upper bound of `--batch auto`.
    pub fixed_batch: bool,
}

/// The model, loss, optimizer and EMA the synthetic steps run on.
struct Rig {
    model: YoloV9Train,
    loss: DualTalLoss,
    opt: Optimizer,
    ema: Ema,
}

/// The synthetic loader batch of `batch` images for `req` (u8 CHW images and normalized
/// targets drawn from a seeded RNG).
fn synthetic(req: &BudgetRequest, batch: usize) -> (Vec<u8>, Vec<[f32; 6]>) {
    let s = req.img as usize;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(req.seed ^ batch as u64);
    let mut rows = Vec::with_capacity(batch * req.targets_per_image);
    for b in 0..batch {
        for _ in 0..req.targets_per_image {
            let w: f32 = rng.random_range(0.02..0.25);
            let h: f32 = rng.random_range(0.02..0.25);
            rows.push([
                b as f32,
                rng.random_range(0..req.nc) as f32,
                rng.random_range(w / 2.0..1.0 - w / 2.0),
                rng.random_range(h / 2.0..1.0 - h / 2.0),
                w,
                h,
            ]);
        }
    }
    let mut images = vec![0u8; batch * 3 * s * s];
    rng.fill_bytes(&mut images);
    (images, rows)
}

/// One complete training step of `input` as one micro-batch: the trainer's own [`step`]
/// (through `graphs` when given) and [`optimizer_step`], finished on the device. Returns the
/// seconds of the forward, loss and backward alone (the optimizer and EMA run once per nominal
/// batch in training, not once per micro-batch, so they are left out of the rate).
fn run_step(
    rig: &mut Rig,
    input: &StepInput<'_>,
    device: &Device,
    graphs: Option<&RefCell<StepGraphs>>,
) -> Result<f64> {
    let Rig {
        model,
        loss,
        opt,
        ema,
    } = rig;
    let batch = input.len;
    device.synchronize()?;
    let t = std::time::Instant::now();
    let out = step(
        &StepParts {
            model,
            loss,
            opt,
            device,
            graphs,
        },
        input,
        batch,
        &Faults::default(),
        0,
        &mut StepTimes::off(),
    )?;
    device.synchronize()?;
    let secs = t.elapsed().as_secs_f64();
    let Some(mut grads) = out.grads else {
        bail!(
            "memory budget probe: non-finite loss {:?} at a micro-batch of {batch}; \
             no training step to measure",
            out.items
        );
    };
    let norm = optimizer_step(model, opt, ema, &mut grads)?;
    ensure!(
        norm.is_finite(),
        "memory budget probe: non-finite gradient norm at a micro-batch of {batch}; \
         no training step to measure"
    );
    drop(grads);
    // Make the work finish before reading the high-water mark.
    device.synchronize()?;
    Ok(secs)
}

/// Which training step a measurement runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepKind {
    /// Ordinary launches.
    Ordinary,
    /// Replayed from CUDA graphs ([`crate::train::graphed`]).
    Graphed,
}

/// One measured micro-batch size: the peak memory of its step (bytes) and the wall time of its
/// forward, loss and backward (seconds; for the ordinary kind this includes first-use costs of a
/// new shape, such as choosing cuDNN algorithms, so compare kinds with [`step_rate`]).
#[derive(Clone, Copy)]
struct Measured {
    peak: u64,
    secs: f64,
    /// Device memory outside the stream-ordered pool at the end of the step (bytes): for the
    /// graphed kind read while the capture is held, so it includes the graphs' own memory.
    outside: u64,
}

/// Runs complete synthetic training steps at `batch` images (one micro-batch) and returns the
/// peak memory and time of the step of `kind`, so the probe measures the step that runs.
///
/// The graphed kind runs the trainer's policy on a fresh [`StepGraphs`]: one ordinary step
/// (the warm-up a capture needs, unless this thread warmed the shape before), the capture,
/// and one replay; the window covers the capture and the replay (two replays when the first
/// step captured), and the peak includes the graphs' own memory (outside the stream-ordered
/// pool, read while the capture is held). The capture is dropped (its memory returned) before
/// this returns. A capture that does not happen is reported as out of memory at this size when
/// `batch` > 1 (the search then stops at the sizes that worked), as an error otherwise.
fn step_peak(
    rig: &mut Rig,
    req: &BudgetRequest,
    batch: usize,
    device: &Device,
    probe: &MemoryProbe,
    kind: StepKind,
) -> Result<Measured> {
    let (images, targets) = synthetic(req, batch);
    let input = StepInput {
        images: &images,
        targets: &targets,
        len: batch,
        img: req.img as usize,
        on_device: None,
        next: None,
        // Segmentation models train on all-background masks of the input's size.
        masks: &[],
    };
    // The window starts from what is live (the model, optimizer and EMA), not from the cache
    // the previous step left.
    probe.release_cached();
    if kind == StepKind::Ordinary {
        probe.reset_peak();
        let secs = run_step(rig, &input, device, None)?;
        return Ok(Measured {
            peak: probe.peak_bytes(),
            secs,
            outside: probe.outside_bytes(),
        });
    }
    let graphs = RefCell::new(StepGraphs::new());
    let measured = (|| -> Result<Measured> {
        run_step(rig, &input, device, Some(&graphs))?;
        probe.release_cached();
        probe.reset_peak();
        // The capture, then one replay (timed).
        run_step(rig, &input, device, Some(&graphs))?;
        let secs = run_step(rig, &input, device, Some(&graphs))?;
        Ok(Measured {
            peak: probe.peak_bytes(),
            secs,
            outside: probe.outside_bytes(),
        })
    })();
    let counts = graphs.borrow().counts();
    graphs.borrow_mut().reset();
    let m = measured?;
    // (1, 1) after a warm-up step; (1, 2) when this thread had warmed the shape already (the
    // search's warm-up measures batch 1 twice), so the first step captured.
    if counts.0 != 1 || counts.1 == 0 {
        if batch > 1 {
            return Err(crate::memory::OutOfMemory {
                what: format!(
                    "the training step's CUDA-graph capture at a micro-batch of {batch} \
                     (captures {}, replays {}; see the warning above)",
                    counts.0, counts.1
                ),
            }
            .into());
        }
        bail!(
            "memory budget probe: the training step could not be captured as CUDA graphs \
             (captures {}, replays {})",
            counts.0,
            counts.1
        );
    }
    Ok(m)
}

/// Seconds per image of the sized step `s`: the graphed kind's timed replay from the search;
/// the ordinary kind's step at that size run once more, now that its first-use costs (choosing
/// cuDNN algorithms for a new shape) are paid.
fn step_rate(
    rig: &mut Rig,
    req: &BudgetRequest,
    s: &Sized,
    device: &Device,
    probe: &MemoryProbe,
) -> Result<f64> {
    let b = s.decision.micro;
    let secs = if s.decision.graphed {
        s.at_micro.secs
    } else {
        step_peak(rig, req, b, device, probe, StepKind::Ordinary)?.secs
    };
    Ok(secs / b as f64)
}

/// The largest micro-batch ≤ `b` (at least 1) that divides `batch`: the sizes a graphed step
/// can run without a second shape (CUDA graphs replay one micro-batch shape).
pub fn largest_divisor_within(batch: usize, b: usize) -> usize {
    (1..=b.min(batch))
        .rev()
        .find(|d| batch.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Measures training steps on `device` and picks the largest micro-batch that fits
/// `req.budget` (see the module docs). Errors: the budget is too small for a micro-batch of 1
/// (the message gives the measured need and the flags to change), or a non-memory failure.
pub fn plan(req: &BudgetRequest, device: &Device, probe: &MemoryProbe) -> Result<BudgetDecision> {
    plan_cancellable(req, device, probe, &crate::cancel::Cancel::never())
}

/// One step kind sized: the decision and the last measurement at its micro-batch.
struct Sized {
    decision: BudgetDecision,
    at_micro: Measured,
}

/// The search for one step kind.
fn size_kind(
    req: &BudgetRequest,
    device: &Device,
    probe: &MemoryProbe,
    cancel: &crate::cancel::Cancel,
    rig: &mut Rig,
    kind: StepKind,
) -> Result<Sized> {
    // A graphed step replays one micro-batch shape: with a given loader batch the micro-batch
    // divides it (`--batch auto` takes the micro-batch as the batch).
    let fixed = req.fixed_batch.then_some(req.max_batch);
    let allowed = move |b: usize| match (kind, fixed) {
        (StepKind::Graphed, Some(n)) => largest_divisor_within(n, b),
        _ => b,
    };
    // The last measurement of each size (the search measures its choice last).
    let mut seen = std::collections::HashMap::new();
    let margin = match kind {
        StepKind::Graphed => crate::budget::GRAPHED_MARGIN,
        StepKind::Ordinary => crate::budget::MARGIN,
    };
    let mut d = search(
        req.budget,
        margin,
        req.max_batch,
        device,
        probe,
        "one training image",
        req.img,
        &allowed,
        |b| {
            cancel.check(SIZING_PHASE)?;
            let m = step_peak(rig, req, b, device, probe, kind)?;
            seen.insert(b, m);
            Ok(m.peak)
        },
    )?;
    d.graphed = kind == StepKind::Graphed;
    d.gt_rows = req.targets_per_image;
    let at_micro = *seen.get(&d.micro).ok_or_else(|| {
        anyhow::anyhow!("memory budget probe: micro-batch {} not measured", d.micro)
    })?;
    if d.graphed {
        // The graphs' memory at the chosen size is outside the pool (read while the capture
        // was held): the pool's cache is capped with it counted.
        d.outside = at_micro.outside;
    }
    Ok(Sized {
        decision: d,
        at_micro,
    })
}

/// Sizes the step for `req`: with CUDA graphs available ([`BudgetRequest::graphs`]) the graphed
/// step first; when its micro-batch is the whole batch it is taken (it is the default step
/// without a budget), otherwise the ordinary step is sized too and the kind with more images
/// per second at its micro-batch is chosen (measured, not assumed: the graphed step holds more
/// memory per image, so under a tight budget it runs smaller micro-batches). A graphed sizing
/// that fails falls back to the ordinary step, and [`BudgetDecision::choice`] says why.
fn choose(
    req: &BudgetRequest,
    device: &Device,
    probe: &MemoryProbe,
    cancel: &crate::cancel::Cancel,
    rig: &mut Rig,
) -> Result<BudgetDecision> {
    if !req.graphs {
        return Ok(size_kind(req, device, probe, cancel, rig, StepKind::Ordinary)?.decision);
    }
    let g = match size_kind(req, device, probe, cancel, rig, StepKind::Graphed) {
        Ok(g) => g,
        Err(e) if e.downcast_ref::<crate::cancel::Stopped>().is_some() => return Err(e),
        Err(e) => {
            let mut o = size_kind(req, device, probe, cancel, rig, StepKind::Ordinary)?.decision;
            o.choice = Some(format!(
                "ordinary launches: the CUDA-graph step could not be sized ({})",
                crate::device::error_head(&format!("{e:#}"))
            ));
            return Ok(o);
        }
    };
    if g.decision.micro >= req.max_batch {
        return Ok(g.decision);
    }
    let o = size_kind(req, device, probe, cancel, rig, StepKind::Ordinary)?;
    cancel.check(SIZING_PHASE)?;
    let tg = step_rate(rig, req, &g, device, probe)?;
    let to = step_rate(rig, req, &o, device, probe)?;
    let (g, o) = (g.decision, o.decision);
    let line = |k: &str, d: &BudgetDecision, t: f64| {
        format!(
            "{k} micro-batch {} peak {} {:.0} img/s",
            d.micro,
            crate::memory::fmt_size(d.measured),
            1.0 / t
        )
    };
    let summary = format!("{}; {}", line("graphed", &g, tg), line("ordinary", &o, to));
    let (mut pick, why) = if tg <= to {
        (g, "CUDA graphs chosen")
    } else {
        (o, "ordinary launches chosen (faster at the budget)")
    };
    pick.choice = Some(format!("{why}: {summary}"));
    Ok(pick)
}

/// The phase name of a sizing that was stopped ([`crate::cancel::Stopped::phase`]).
pub const SIZING_PHASE: &str = "the memory-budget sizing";

/// [`plan`], asking `cancel` before each measured step: a stop request ends the sizing with
/// [`crate::cancel::Stopped`] (phase [`SIZING_PHASE`]).
pub fn plan_cancellable(
    req: &BudgetRequest,
    device: &Device,
    probe: &MemoryProbe,
    cancel: &crate::cancel::Cancel,
) -> Result<BudgetDecision> {
    cancel.check(SIZING_PHASE)?;
    let model = YoloV9Train::build(&req.arch, None, req.nc, Vec::new(), device, req.seed)?;
    model.set_amp(req.amp);
    let loss = DualTalLoss::new(req.nc, &STRIDES)?;
    let params = model
        .vars()
        .iter()
        .map(|v| (v.name.clone(), v.var.clone()))
        .collect();
    let opt = Optimizer::new(params, 0.0, 0.9, 0.0);
    let ema = Ema::new(&model.float_state()?)?;
    let mut rig = Rig {
        model,
        loss,
        opt,
        ema,
    };
    let t0 = std::time::Instant::now();
    let d = choose(req, device, probe, cancel, &mut rig);
    drop(rig);
    device.synchronize()?;
    probe.release_cached();
    let mut d = d?;
    if let Some(c) = &mut d.choice {
        c.push_str(&format!(
            " (sizing took {:.1} s)",
            t0.elapsed().as_secs_f64()
        ));
    }
    keep_cache_within(&d, probe);
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::largest_divisor_within;

    #[test]
    fn graphed_micro_batches_divide_the_batch() {
        // Batch 16: the fit's 12 becomes 8, 5 becomes 4; batch 24: 13 → 12, 7 → 6.
        assert_eq!(largest_divisor_within(16, 12), 8);
        assert_eq!(largest_divisor_within(16, 5), 4);
        assert_eq!(largest_divisor_within(16, 16), 16);
        assert_eq!(largest_divisor_within(16, 40), 16);
        assert_eq!(largest_divisor_within(24, 13), 12);
        assert_eq!(largest_divisor_within(24, 7), 6);
        // A prime batch leaves 1 below itself; 0 asks for nothing and still gets 1.
        assert_eq!(largest_divisor_within(13, 12), 1);
        assert_eq!(largest_divisor_within(16, 0), 1);
    }
}
