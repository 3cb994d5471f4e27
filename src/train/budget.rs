//! Memory-budget batch sizing (`yolo9 train --budget 8GiB`, `--batch auto`, `yolo9 val --budget`,
//! `yolo9 detect --budget`): the (micro-)batch is
//! chosen from the **measured** peak memory of real training steps, not from a guess.
//!
//! Method: on the actual device, image size and model, run complete training steps — the
//! trainer's own [`crate::train::step::step`] and [`crate::train::step::optimizer_step`] on
//! synthetic u8 images: forward of the training graph (both branches, BN in train mode), the
//! dual TAL loss with the assigner at a realistic target count (mosaic joins 4 images, so 4× the
//! most labels of any train image), backward, gradient clipping, the SGD step and the EMA update
//! — at a few micro-batch sizes, reading the peak of each with [`MemoryProbe`]. A least-squares
//! line `peak(b) = base + b · per_image` through the points gives the largest `b` whose predicted
//! peak fits the budget minus a safety margin ([`MARGIN`]); that size is then measured once more
//! and lowered while it does not fit. The nominal batch (64) is kept by gradient accumulation in
//! the trainer.
//!
//! On CUDA the peak is the whole process's device memory (the memory pool's reserved
//! high-water mark plus the CUDA context, kernels and library handles outside it, as
//! `nvidia-smi` counts it), and after sizing the pool's cache is kept within the budget; on the
//! CPU the process RSS high-water mark (see [`crate::memory`]). An out-of-memory error while measuring ends the
//! measurement at the sizes that worked.

use crate::loss::DualTalLoss;
use crate::memory::{fmt_size, is_oom, MemoryProbe};
use crate::model::weights::STRIDES;
use crate::model::yolov9::{YoloV9, YoloV9Train};
use crate::train::ema::Ema;
use crate::train::guard::Faults;
use crate::train::optimizer::Optimizer;
use crate::train::step::{optimizer_step, step, StepInput, StepParts, StepTimes};
use anyhow::{bail, ensure, Result};
use candle_core::{Device, Tensor};
use rand::{Rng, RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

/// Share of the budget kept free for what a synthetic step does not show (loader buffers,
/// the spread of real batches' target counts). The allocator's fragmentation and cache and, on
/// CUDA, the context and libraries are in the measured peaks themselves.
pub const MARGIN: f64 = 0.05;

/// Share of the free device memory used by `--batch auto` without `--budget`.
pub const AUTO_SHARE: f64 = 0.80;

/// One measured point: a training step at `batch` images peaked at `peak` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BudgetPoint {
    /// Micro-batch size (images).
    pub batch: usize,
    /// Peak memory of the step in bytes (device memory on CUDA, process RSS on the CPU).
    pub peak: u64,
}

/// The line `peak(b) = base + b · per_image` (bytes) fitted through measured points.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryFit {
    /// Memory that does not grow with the batch (model, optimizer, EMA, workspaces), bytes.
    pub base: f64,
    /// Memory per image of the micro-batch, bytes.
    pub per_image: f64,
}

impl MemoryFit {
    /// Least-squares fit through `points` (at least one; a single point gives `base = 0`).
    /// The slope is kept positive (at least 1 byte per image) so the inversion is defined.
    pub fn fit(points: &[BudgetPoint]) -> MemoryFit {
        let n = points.len() as f64;
        if points.len() < 2 {
            let p = points
                .first()
                .map(|p| p.peak as f64 / p.batch.max(1) as f64);
            return MemoryFit {
                base: 0.0,
                per_image: p.unwrap_or(1.0).max(1.0),
            };
        }
        let mx = points.iter().map(|p| p.batch as f64).sum::<f64>() / n;
        let my = points.iter().map(|p| p.peak as f64).sum::<f64>() / n;
        let sxy: f64 = points
            .iter()
            .map(|p| (p.batch as f64 - mx) * (p.peak as f64 - my))
            .sum();
        let sxx: f64 = points.iter().map(|p| (p.batch as f64 - mx).powi(2)).sum();
        let per_image = if sxx > 0.0 { sxy / sxx } else { my / mx };
        let per_image = per_image.max(1.0);
        MemoryFit {
            base: my - per_image * mx,
            per_image,
        }
    }

    /// Predicted peak at `batch` images, bytes.
    pub fn predict(&self, batch: usize) -> f64 {
        self.base + self.per_image * batch as f64
    }

    /// The largest batch (≥ 0) whose predicted peak is at most `limit` bytes.
    pub fn largest_within(&self, limit: f64) -> usize {
        let b = ((limit - self.base) / self.per_image).floor();
        if b.is_finite() && b > 0.0 {
            b as usize
        } else {
            0
        }
    }
}

/// The outcome of budget sizing: what was measured, the fit and the chosen micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetDecision {
    /// The budget in bytes.
    pub budget: u64,
    /// What the budget counts (`device memory` or `process RSS`).
    pub what: String,
    /// Measured points, by increasing batch.
    pub points: Vec<BudgetPoint>,
    /// The fitted line.
    pub fit: MemoryFit,
    /// The chosen micro-batch (images per forward/backward).
    pub micro: usize,
    /// Measured peak at `micro` (bytes), from the final check.
    pub measured: u64,
    /// Of each peak, the device memory outside the allocator's pool (bytes; the CUDA context,
    /// kernels and library handles, read after the final check; 0 on the CPU).
    #[serde(default)]
    pub outside: u64,
}

impl BudgetDecision {
    /// Human-readable summary (the measured points, the fit and the choice).
    pub fn describe(&self) -> String {
        let pts: Vec<String> = self
            .points
            .iter()
            .map(|p| format!("{} @ batch {}", fmt_size(p.peak), p.batch))
            .collect();
        let outside = if self.outside > 0 {
            format!(
                ", of which {} outside the memory pool",
                fmt_size(self.outside)
            )
        } else {
            String::new()
        };
        format!(
            "memory budget {} ({}{outside}): measured {}; fit {} + {}/image; micro-batch {} \
             (measured {} <= {} = budget - {:.0}% margin)",
            fmt_size(self.budget),
            self.what,
            pts.join(", "),
            fmt_size(self.fit.base.max(0.0) as u64),
            fmt_size(self.fit.per_image as u64),
            self.micro,
            fmt_size(self.measured),
            fmt_size((self.budget as f64 * (1.0 - MARGIN)) as u64),
            MARGIN * 100.0
        )
    }
}

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

/// After sizing: the allocator may keep at most the budget less the margin and the memory
/// outside its pool cached, so that the whole process stays within the budget for the run, not
/// only during the measured steps (a resumed run calls it with its saved decision).
pub fn keep_cache_within(d: &BudgetDecision, probe: &MemoryProbe) {
    let limit = (d.budget as f64 * (1.0 - MARGIN)) as u64;
    probe.cap_cache(limit.saturating_sub(d.outside));
}

/// Sizes an inference batch (`yolo9 val --budget`): the peak of `model`'s forward on
/// `img`×`img` inputs is measured at batches 1, 2, 4, ... and the largest batch up to
/// `max_batch` that fits `budget` minus the margin is chosen, as [`plan`] does for training.
pub fn plan_inference(
    model: &YoloV9,
    img: u32,
    max_batch: usize,
    budget: u64,
    probe: &MemoryProbe,
) -> Result<BudgetDecision> {
    let device = model.device().clone();
    let s = img as usize;
    let d = search(
        budget,
        max_batch,
        &device,
        probe,
        "one image",
        img,
        |b| -> Result<u64> {
            probe.release_cached();
            probe.reset_peak();
            let x = Tensor::rand(0f32, 1f32, (b, 3, s, s), &device)?;
            let y = model.forward(&x)?;
            let _ = y.sum_all()?.to_vec0::<f32>()?;
            device.synchronize()?;
            Ok(probe.peak_bytes())
        },
    );
    probe.release_cached();
    let d = d?;
    keep_cache_within(&d, probe);
    Ok(d)
}

/// The search shared by [`plan`] and [`plan_inference`]: a warm-up, points at 1, 2, 4, ... (up
/// to 4 on the CPU, 16 on a GPU, stopping before a size that the line through the points so far
/// predicts above the limit, and at the first that exceeds it or runs out of memory), the fitted
/// line, and a final measured check of the choice.
fn search(
    budget: u64,
    max_batch: usize,
    device: &Device,
    probe: &MemoryProbe,
    unit: &str,
    img: u32,
    mut step: impl FnMut(usize) -> Result<u64>,
) -> Result<BudgetDecision> {
    let limit = budget as f64 * (1.0 - MARGIN);
    let mut measure = |b: usize| -> Result<Option<u64>> {
        match step(b) {
            Ok(p) => Ok(Some(p)),
            Err(e) if is_oom(&e) => Ok(None),
            Err(e) => Err(e),
        }
    };
    // Warm-up (first-use allocations, kernel loading), then the points.
    let _ = measure(1)?;
    let mut points = Vec::new();
    let mut b = 1;
    while b <= max_batch.max(1) {
        // Never probe a size the points so far predict above the limit: the probe itself
        // keeps to the budget (the final check below measures the chosen size).
        if points.len() >= 2 && MemoryFit::fit(&points).predict(b) > limit {
            break;
        }
        match measure(b)? {
            Some(peak) => {
                points.push(BudgetPoint { batch: b, peak });
                if peak as f64 > limit {
                    break;
                }
            }
            None => break,
        }
        // CPU steps are slow: three points (1, 2, 4) suffice for the line there.
        if b >= 4 && matches!(device, Device::Cpu) {
            break;
        }
        if b >= 16 {
            break;
        }
        b *= 2;
    }
    match points.first().map(|p| p.peak) {
        None => bail!(
            "--budget {}: out of memory already with {unit} at --img {img}; \
             lower --img or free {} on this device",
            fmt_size(budget),
            probe.what()
        ),
        Some(p) if p as f64 > limit => bail!(
            "--budget {} is too small: {unit} at --img {img} needs {} ({}), \
             and {:.0}% of the budget is kept as margin; raise --budget to at least {} or lower --img",
            fmt_size(budget),
            fmt_size(p),
            probe.what(),
            MARGIN * 100.0,
            fmt_size((p as f64 / (1.0 - MARGIN)).ceil() as u64)
        ),
        _ => {}
    }
    let fit = MemoryFit::fit(&points);
    let mut micro = fit.largest_within(limit).clamp(1, max_batch.max(1));
    // Check the choice with a real measurement, lowering it while it does not fit.
    let mut measured = 0;
    for _ in 0..4 {
        if let Some(p) = points.iter().find(|p| p.batch == micro) {
            if p.peak as f64 <= limit {
                measured = p.peak;
                break;
            }
        } else if let Some(p) = measure(micro)? {
            points.push(BudgetPoint {
                batch: micro,
                peak: p,
            });
            if p as f64 <= limit {
                measured = p;
                break;
            }
        }
        micro = ((micro as f64 * 0.85).floor() as usize).max(1);
        if micro == 1 {
            measured = points[0].peak;
            break;
        }
    }
    points.sort_by_key(|p| p.batch);
    points.dedup_by_key(|p| p.batch);
    Ok(BudgetDecision {
        budget,
        what: probe.what().to_string(),
        points,
        fit,
        micro,
        measured,
        outside: probe.outside_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_is_exact_on_a_line_and_inverts() {
        let pts: Vec<BudgetPoint> = [1usize, 2, 4, 8]
            .iter()
            .map(|&b| BudgetPoint {
                batch: b,
                peak: 1_000 + 300 * b as u64,
            })
            .collect();
        let f = MemoryFit::fit(&pts);
        assert!((f.base - 1000.0).abs() < 1e-6 && (f.per_image - 300.0).abs() < 1e-6);
        assert_eq!(f.predict(10), 4000.0);
        // (4000 - 1000) / 300 = 10 exactly; one byte less gives 9.
        assert_eq!(f.largest_within(4000.0), 10);
        assert_eq!(f.largest_within(3999.0), 9);
        assert_eq!(f.largest_within(500.0), 0);
    }

    #[test]
    fn search_never_probes_a_size_predicted_over_the_limit() {
        // peak(b) = 100 + 100·b; budget 500 → limit 450. Points 1 (200) and 2 (300) predict
        // 500 at 4, above the limit: 4 is never run; 3 (400) is chosen and measured.
        let probe = MemoryProbe::new(&Device::Cpu).unwrap();
        let mut calls = Vec::new();
        let d = search(500, 64, &Device::Cpu, &probe, "one image", 64, |b| {
            calls.push(b);
            Ok(100 + 100 * b as u64)
        })
        .unwrap();
        assert_eq!(calls, vec![1, 1, 2, 3], "warm-up, 1, 2, then the choice");
        assert_eq!((d.micro, d.measured), (3, 400));
    }

    #[test]
    fn fit_of_one_point_goes_through_the_origin() {
        let f = MemoryFit::fit(&[BudgetPoint {
            batch: 2,
            peak: 800,
        }]);
        assert_eq!((f.base, f.per_image), (0.0, 400.0));
    }
}
