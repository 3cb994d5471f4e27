//! Memory-budget sizing, shared by training (`yolo9 train --budget 8GiB`, `--batch auto`; the
//! training step's probe is `crate::train::budget`), validation (`yolo9 val --budget`) and
//! detection (`yolo9 detect --budget`): a batch is chosen from the **measured** peak memory of
//! real work at a few sizes, not from a guess.
//!
//! Method (`search`): a warm-up, then the work at 1, 2, 4, ... images, reading the peak of each
//! with [`MemoryProbe`]. A least-squares line `peak(b) = base + b · per_image` through the points
//! ([`MemoryFit`]) gives the largest `b` whose predicted peak fits the budget minus a safety
//! margin ([`MARGIN`]); that size is then measured once more and lowered while it does not fit.
//! An out-of-memory error while measuring ends the measurement at the sizes that worked.
//!
//! On CUDA the peak is the whole process's device memory (the memory pool's reserved
//! high-water mark plus the CUDA context, kernels and library handles outside it, as
//! `nvidia-smi` counts it), and after sizing the pool's cache is kept within the budget
//! ([`keep_cache_within`]); on the CPU the process RSS high-water mark (see [`crate::memory`]).

use crate::memory::{fmt_size, is_oom, MemoryProbe};
use crate::model::yolov9::YoloV9;
use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

/// Share of the budget kept free for what a synthetic step does not show (loader buffers,
/// the spread of real batches' target counts). The allocator's fragmentation and cache and, on
/// CUDA, the context and libraries are in the measured peaks themselves.
pub const MARGIN: f64 = 0.05;

/// The margin kept when sizing the training step replayed from CUDA graphs
/// ([`crate::train::graphed`]). A run holds a little more than its graphed probe: the trainer's
/// own tensors beside the step (the validation model, the batch on the device) and the pool
/// blocks its first capture leaves reserved. Measured on the H200 (2026-12-04, 16x BCCD,
/// `--budget 8GiB`, micro-batch 16, `YOLO9_MEM_TRACE=1`): probe 6.96 GiB, run 7.40 GiB
/// (nvidia-smi 7,573 MiB), 5.5% of the budget, before the run stopped warming up a shape the
/// probe had warmed; 8% keeps that much room.
pub const GRAPHED_MARGIN: f64 = 0.08;

fn default_margin() -> f64 {
    MARGIN
}

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
    /// kernels and library handles, read after the final check; 0 on the CPU). For a
    /// CUDA-graph step this includes the graphs' own memory at the chosen micro-batch.
    #[serde(default)]
    pub outside: u64,
    /// Whether the sizing is for the training step replayed from CUDA graphs
    /// (`crate::train::graphed`; false: ordinary launches, and always false for inference).
    #[serde(default)]
    pub graphed: bool,
    /// The share of the budget kept free ([`MARGIN`], or [`GRAPHED_MARGIN`] for the graphed
    /// step).
    #[serde(default = "default_margin")]
    pub margin: f64,
    /// GT rows per image of the training probe's synthetic batches
    /// (`crate::train::budget::BudgetRequest::targets_per_image`; 0 for inference and for
    /// decisions saved before it was recorded): a budgeted run's CUDA graphs start with room for
    /// them ([`crate::train::graphed::StepGraphs::reserve_rows`]), so the run replays the
    /// step the probe measured.
    #[serde(default)]
    pub gt_rows: usize,
    /// How the step kind was chosen when both were measured (the micro-batch, peak and
    /// images/s of each), for the run log; `None` when only one kind was sized.
    #[serde(default)]
    pub choice: Option<String>,
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
            "memory budget {} ({}{outside}){}: measured {}; fit {} + {}/image; micro-batch {} \
             (measured {} <= {} = budget - {:.0}% margin){}",
            fmt_size(self.budget),
            self.what,
            if self.graphed {
                ", training step replayed from CUDA graphs"
            } else {
                ""
            },
            pts.join(", "),
            fmt_size(self.fit.base.max(0.0) as u64),
            fmt_size(self.fit.per_image as u64),
            self.micro,
            fmt_size(self.measured),
            fmt_size((self.budget as f64 * (1.0 - self.margin)) as u64),
            self.margin * 100.0,
            self.choice
                .as_ref()
                .map_or(String::new(), |c| format!("; {c}"))
        )
    }
}

/// After sizing: the allocator may keep at most the budget less the margin and the memory
/// outside its pool cached, so that the whole process stays within the budget for the run, not
/// only during the measured steps (a resumed run calls it with its saved decision).
pub fn keep_cache_within(d: &BudgetDecision, probe: &MemoryProbe) {
    let limit = (d.budget as f64 * (1.0 - d.margin)) as u64;
    probe.cap_cache(limit.saturating_sub(d.outside));
}

/// Sizes an inference batch (`yolo9 val --budget`): the peak of `model`'s forward on
/// `img`×`img` inputs is measured at batches 1, 2, 4, ... and the largest batch up to
/// `max_batch` that fits `budget` minus the margin is chosen, as `crate::train::budget::plan` does for training.
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
        MARGIN,
        max_batch,
        &device,
        probe,
        "one image",
        img,
        &|b| b,
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

/// The search shared by `crate::train::budget::plan` and [`plan_inference`]: a warm-up, points at 1, 2, 4, ... (up
/// to 4 on the CPU, 16 on a GPU, stopping before a size that the line through the points so far
/// predicts above the budget, and at the first that exceeds it or runs out of memory), the fitted
/// line, and a final measured check of the choice. `allowed` rounds a micro-batch down to one
/// the caller can run (the identity, or e.g. a divisor of the loader batch for CUDA graphs,
/// which replay one shape); it must return at least 1 and never more than its argument.
#[allow(clippy::too_many_arguments)]
pub(crate) fn search(
    budget: u64,
    margin: f64,
    max_batch: usize,
    device: &Device,
    probe: &MemoryProbe,
    unit: &str,
    img: u32,
    allowed: &dyn Fn(usize) -> usize,
    mut step: impl FnMut(usize) -> Result<u64>,
) -> Result<BudgetDecision> {
    let limit = budget as f64 * (1.0 - margin);
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
        // Never probe a size the points so far predict above the budget: the probe itself
        // keeps to it. The line is a bound, not a forecast (a step's memory grows less than
        // linearly with the batch: the graphed step measured 7.08 GiB at 16 where 1, 2, 4, 8
        // predicted 7.69), so sizes predicted between the limit and the budget are measured
        // rather than ruled out; one measured above the limit ends the points.
        if points.len() >= 2 && MemoryFit::fit(&points).predict(b) > budget as f64 {
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
            margin * 100.0,
            fmt_size((p as f64 / (1.0 - margin)).ceil() as u64)
        ),
        _ => {}
    }
    let fit = MemoryFit::fit(&points);
    let mut micro = allowed(fit.largest_within(limit).clamp(1, max_batch.max(1))).max(1);
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
        micro = allowed(((micro as f64 * 0.85).floor() as usize).max(1)).max(1);
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
        graphed: false,
        margin,
        gt_rows: 0,
        choice: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `search` on the CPU with the 5% margin over synthetic peaks: the sizes it ran (in order)
    /// and its decision.
    fn searched(
        budget: u64,
        max_batch: usize,
        allowed: &dyn Fn(usize) -> usize,
        peak: impl Fn(usize) -> u64,
    ) -> (Vec<usize>, BudgetDecision) {
        let probe = MemoryProbe::new(&Device::Cpu).unwrap();
        let mut calls = Vec::new();
        let d = search(
            budget,
            MARGIN,
            max_batch,
            &Device::Cpu,
            &probe,
            "one image",
            64,
            allowed,
            |b| {
                calls.push(b);
                Ok(peak(b))
            },
        )
        .unwrap();
        (calls, d)
    }

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
    fn search_never_probes_a_size_predicted_over_the_budget() {
        // peak(b) = 100 + 100·b; budget 450 → limit 427.5. Points 1 (200) and 2 (300) predict
        // 500 at 4, above the budget: 4 is never run; 3 (400) is chosen and measured.
        let (calls, d) = searched(450, 64, &|b| b, |b| 100 + 100 * b as u64);
        assert_eq!(calls, vec![1, 1, 2, 3], "warm-up, 1, 2, then the choice");
        assert_eq!((d.micro, d.measured), (3, 400));
    }

    #[test]
    fn search_measures_a_size_predicted_between_the_limit_and_the_budget() {
        // Budget 1000 → limit 950. Points 1 (300) and 2 (530) predict 990 at 4: above the
        // limit but within the budget, so 4 is measured; it peaks at 900 (memory grows less
        // than linearly with the batch) and is chosen. Under the rule before (probe only sizes
        // predicted within the limit) 4 was never tried and 3 was chosen.
        let peak = |b: usize| match b {
            1 => 300,
            2 => 530,
            4 => 900,
            _ => 70 + 230 * b as u64,
        };
        let (calls, d) = searched(1000, 4, &|b| b, peak);
        assert_eq!(calls, vec![1, 1, 2, 4], "warm-up, 1, 2, then 4");
        assert_eq!((d.micro, d.measured), (4, 900));
    }

    #[test]
    fn search_rounds_the_choice_to_an_allowed_size() {
        // peak(b) = 100 + 100·b; budget 1000 → limit 950: the line allows 8, but only divisors
        // of 12 may be chosen (a CUDA-graph step replays one micro-batch shape), so 6 is
        // measured and chosen.
        let divisor_of_12 = |b: usize| (1..=b.min(12)).rev().find(|d| 12 % d == 0).unwrap_or(1);
        let (calls, d) = searched(1000, 12, &divisor_of_12, |b| 100 + 100 * b as u64);
        // Warm-up, 1, 2, 4 (the CPU's last point), then the rounded choice.
        assert_eq!(calls, vec![1, 1, 2, 4, 6]);
        assert_eq!((d.micro, d.measured), (6, 700));
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
