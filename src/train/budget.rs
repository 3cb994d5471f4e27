//! The training step's memory probe for budget sizing (`yolo9 train --budget 8GiB`, `--batch
//! auto`; the search, the fit and the decision are [`crate::budget`]'s): the micro-batch is
//! chosen from the **measured** peak memory of real training steps, not from a guess.
//!
//! Method: on the actual device, image size and model, run complete training steps — the
//! trainer's own [`crate::train::step::step`] and [`crate::train::step::optimizer_step`] on
//! synthetic u8 images: forward of the training graph (both branches, BN in train mode), the
//! dual TAL loss with the assigner at a realistic target count (mosaic joins 4 images, so 4× the
//! most labels of any train image), backward, gradient clipping, the SGD step and the EMA update
//! — at a few micro-batch sizes, reading the peak of each with [`MemoryProbe`]. A least-squares
//! line `peak(b) = base + b · per_image` through the points gives the largest `b` whose predicted
//! peak fits the budget minus a safety margin ([`crate::budget::MARGIN`]); that size is then measured once more
//! and lowered while it does not fit. The nominal batch (64) is kept by gradient accumulation in
//! the trainer.
//!
//! On CUDA the peak is the whole process's device memory (the memory pool's reserved
//! high-water mark plus the CUDA context, kernels and library handles outside it, as
//! `nvidia-smi` counts it), and after sizing the pool's cache is kept within the budget; on the
//! CPU the process RSS high-water mark (see [`crate::memory`]). An out-of-memory error while measuring ends the
//! measurement at the sizes that worked.

use crate::budget::{keep_cache_within, search, BudgetDecision};
use crate::loss::DualTalLoss;
use crate::memory::MemoryProbe;
use crate::model::weights::STRIDES;
use crate::model::yolov9::YoloV9Train;
use crate::train::ema::Ema;
use crate::train::guard::Faults;
use crate::train::optimizer::Optimizer;
use crate::train::step::{optimizer_step, step, StepInput, StepParts, StepTimes};
use anyhow::{bail, ensure, Result};
use candle_core::Device;
use rand::{Rng, RngCore, SeedableRng};

/// What to size: model classes, image size, targets per image and the largest micro-batch
/// worth considering.
#[derive(Debug, Clone)]
pub struct BudgetRequest {
    /// Number of classes.
    pub nc: usize,
    /// Square training size, pixels.
    pub img: u32,
    /// Targets per image in the synthetic steps (4 × the most labels of any train image).
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
}

/// The model, loss, optimizer and EMA the synthetic steps run on.
struct Rig {
    model: YoloV9Train,
    loss: DualTalLoss,
    opt: Optimizer,
    ema: Ema,
}

/// Runs one complete synthetic training step at `batch` images (one micro-batch) and returns
/// its peak memory: the trainer's own [`step`] and [`optimizer_step`] on u8 images and targets
/// drawn from the seeded RNG, so the probe measures the step that runs.
fn step_peak(
    rig: &mut Rig,
    req: &BudgetRequest,
    batch: usize,
    device: &Device,
    probe: &MemoryProbe,
) -> Result<u64> {
    let Rig {
        model,
        loss,
        opt,
        ema,
    } = rig;
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
    let input = StepInput {
        images: &images,
        targets: &rows,
        len: batch,
        img: s,
    };
    // The window starts from what is live (the model, optimizer and EMA), not from the cache
    // the previous step left.
    probe.release_cached();
    probe.reset_peak();
    let out = step(
        &StepParts {
            model,
            loss,
            opt,
            device,
            graphs: None,
        },
        &input,
        batch,
        &Faults::default(),
        0,
        &mut StepTimes::off(),
    )?;
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
    Ok(probe.peak_bytes())
}

/// Measures training steps on `device` and picks the largest micro-batch that fits
/// `req.budget` (see the module docs). Errors: the budget is too small for a micro-batch of 1
/// (the message gives the measured need and the flags to change), or a non-memory failure.
pub fn plan(req: &BudgetRequest, device: &Device, probe: &MemoryProbe) -> Result<BudgetDecision> {
    plan_cancellable(req, device, probe, &crate::cancel::Cancel::never())
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
    let d = search(
        req.budget,
        req.max_batch,
        device,
        probe,
        "one training image",
        req.img,
        |b| {
            cancel.check(SIZING_PHASE)?;
            step_peak(&mut rig, req, b, device, probe)
        },
    );
    drop(rig);
    device.synchronize()?;
    probe.release_cached();
    let d = d?;
    keep_cache_within(&d, probe);
    Ok(d)
}
