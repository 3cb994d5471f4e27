//! The training loop of `yolo9 train` (official `train_dual.py`, single device): [`train`]
//! orchestrates the parts, which live beside it in `src/train/`.
//!
//! Per iteration `ni` (batches since the start): warmup of LR/momentum/accumulation
//! ([`crate::train::schedule::Schedule::at`]), one training step of the loader batch
//! ([`crate::train::step::step`]: forward of both branches in train mode, the dual TAL loss
//! (`(box + cls + dfl) · batch`), backward, gradients summed over micro-batches), the batch
//! gradients added over the accumulation window, and an optimizer step when
//! `ni − last_opt_step ≥ accumulate` ([`crate::train::step::optimizer_step`]: gradient-norm clip
//! 10, SGD Nesterov, then an EMA update). Per epoch: LR factor `lf(epoch)` (linear or
//! `--cos-lr`), mosaic off for the last `--close-mosaic` epochs, validation of the EMA (P, R,
//! mAP50, mAP50-95 and real val losses), fitness `0.1·mAP50 + 0.9·mAP50-95` picks `best`,
//! `results.csv`, `weights/last.safetensors`, `weights/best.safetensors` (EMA, `Graph::Train`,
//! f32, loadable by `YoloV9::load`) and the training state `weights/state.safetensors` for
//! `--resume` (see [`crate::train::checkpoint`]).
//!
//! The parts: the options ([`TrainOptions`], [`Hyp`]) in [`crate::train::options`]; resume
//! resolution, data, sizing and construction in `train/setup.rs`; the epoch (batch loop, NaN
//! guard, validation, best and early stop) in `train/epoch.rs`; the run's state, its checkpoints
//! and the resume in `train/state.rs`; `results.csv` and the epoch report in
//! [`crate::train::report`]; progress output through a [`TrainObserver`]
//! ([`crate::train::observer`]).

use crate::budget::BudgetDecision;
use crate::train::dist::{Collective, DistError};
use crate::train::epoch::{run_epoch, EpochEnd};
pub use crate::train::guard::StopFlag;
pub use crate::train::observer::{Console, TrainEvent, TrainObserver};
pub use crate::train::options::{Hyp, TrainOptions};
pub use crate::train::report::{EpochReport, RESULTS_HEADER, SEG_COLUMNS};
use crate::train::setup::{build, resolve, Prepared};
pub use crate::train::step::{MAX_GRAD_NORM, STEP_TIMES_ENV};
use anyhow::{bail, Result};
use std::path::PathBuf;

/// Result of [`train`].
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// The run folder (empty when a stop request came during the scan or the sizing, before it
    /// was created).
    pub run_dir: PathBuf,
    /// One report per epoch run.
    pub epochs: Vec<EpochReport>,
    /// Best fitness.
    pub best_fitness: f64,
    /// `weights/last.safetensors`.
    pub last: PathBuf,
    /// `weights/best.safetensors`.
    pub best: PathBuf,
    /// True when the run stopped early on SIGINT/SIGTERM (state saved for `--resume` once
    /// training has begun; nothing is saved for a stop during the scan or the sizing).
    pub interrupted: bool,
    /// The budget decision, if the batch was sized by memory.
    pub budget: Option<BudgetDecision>,
}

/// Runs training with `opts` and returns the per-epoch reports. Outputs go to
/// `project/name{,2,..}` (see the module docs). Errors name the flag or file at fault; a stop
/// request (SIGINT/SIGTERM) returns `Ok` with `interrupted = true` after saving the state.
///
/// This is [`train_with`] with the SIGINT/SIGTERM handlers installed ([`StopFlag::install`]) and
/// the output printed as `yolo9 train` prints it ([`Console`]).
pub fn train(opts: &TrainOptions) -> std::result::Result<TrainSummary, crate::error::Error> {
    let stop = StopFlag::install()?;
    train_with(opts, &stop, &mut Console::new())
}

/// [`train`] with the caller's stop flag (a request stops the run at the next batch boundary,
/// after saving the state) and its observer, which receives all progress as [`TrainEvent`]s
/// (any `FnMut(&TrainEvent)` is an observer):
///
/// ```no_run
/// use yolo9::train::trainer::{train_with, StopFlag, TrainEvent, TrainOptions};
/// let mut opts = TrainOptions::new("data.yaml".into());
/// opts.epochs = 10;
/// let stop = StopFlag::install()?;
/// let mut on_event = |e: &TrainEvent<'_>| {
///     if let TrainEvent::EpochEnd { report, .. } = e {
///         println!("epoch {}: mAP50-95 {:.4}", report.epoch + 1, report.metrics[3]);
///     }
/// };
/// let summary = train_with(&opts, &stop, &mut on_event)?;
/// println!("{} epochs in {}", summary.epochs.len(), summary.run_dir.display());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn train_with(
    opts: &TrainOptions,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> std::result::Result<TrainSummary, crate::error::Error> {
    Ok(run_training(opts, stop, obs, None)?)
}

/// [`train_with`] as one rank of a data-parallel group `comm` ([`crate::train::dist`]): this
/// rank trains its share of every batch of `--batch` images (the global batch) and every rank
/// ends with the same weights; rank 0 alone validates and writes the run folder (the others'
/// summaries carry their own training losses, no metrics, and rank 0's run folder path as they
/// computed it). Every rank must be called with the same options (the device aside). Errors:
/// this rank's own, or the first rank's failure, naming that rank
/// ([`crate::train::dist::DistError`]); before returning its own error a rank tells the others
/// ([`Collective::abort`]).
///
/// A group of one rank trains exactly as [`train_with`] (bitwise the same weights on the CPU).
/// `--batch auto` is refused (every rank would size its own batch); the CUDA-graph replay of the
/// step is off (ordinary launches); `--sync-bn` is not implemented (each rank's BN normalizes
/// with its share's statistics; the running statistics are rank 0's after each optimizer step).
pub fn train_group(
    opts: &TrainOptions,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
    comm: Box<dyn Collective>,
) -> std::result::Result<TrainSummary, crate::error::Error> {
    Ok(run_training(opts, stop, obs, Some(comm))?)
}

/// Tells the other ranks about this rank's error `e`, unless it came from the group itself.
fn abort_group(comm: Option<&mut (dyn Collective + 'static)>, e: &anyhow::Error) {
    if let Some(c) = comm {
        if !e.chain().any(|c| c.is::<DistError>()) {
            c.abort(&format!("{e:#}"));
        }
    }
}

/// The body of [`train_with`] and [`train_group`], in the library's chains of context.
fn run_training(
    opts: &TrainOptions,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
    mut comm: Option<Box<dyn Collective>>,
) -> Result<TrainSummary> {
    // Before anything runs a convolution (the budget probe included).
    #[cfg(feature = "cuda")]
    crate::cuda::conv::set_strict_fp32(opts.strict_fp32);
    if let Some(c) = &comm {
        let (b, w) = (opts.batch, c.world());
        if b == 0 || b < w {
            let e =
                anyhow::anyhow!(
                "--batch {}: a data-parallel run of {w} ranks needs the global batch given, at \
                 least one image per rank (--batch auto sizes one device's batch)",
                if b == 0 { "auto".to_string() } else { b.to_string() }
            );
            abort_group(comm.as_deref_mut(), &e);
            return Err(e);
        }
    }
    let rank0 = comm.as_ref().is_none_or(|c| c.rank() == 0);
    let (opts, resolved) = match resolve(opts, stop, obs) {
        // Stopped before the run folder exists: nothing was trained, nothing to save.
        Err(e) => {
            abort_group(comm.as_deref_mut(), &e);
            return stopped_before_training(e, obs);
        }
        Ok(r) => r,
    };
    let Prepared {
        mut run,
        mut loader,
        val,
        start,
    } = match build(&opts, resolved, stop, obs, rank0) {
        // Stopped while caching the images: nothing was trained, nothing to save.
        Err(e) => {
            abort_group(comm.as_deref_mut(), &e);
            return stopped_before_training(e, obs);
        }
        Ok(p) => p,
    };
    if let Some(c) = comm {
        loader = loader.with_shard(c.rank(), c.world())?;
        // Each rank's micro-step is its own (the gradients are summed after it, outside the
        // step) and replays from CUDA graphs as on one device; --sync-bn makes the BN layers
        // meet the other ranks inside every forward, which a captured graph cannot hold.
        if opts.sync_bn {
            run.graphs.borrow_mut().disable();
        }
        run.comm = Some(c);
    }
    let r = run_epochs(&mut run, &mut loader, &val, &start, stop, obs);
    if let Err(e) = &r {
        abort_group(run.comm.as_deref_mut(), e);
    }
    r
}

/// The epochs of a built run.
fn run_epochs(
    run: &mut crate::train::state::Run<'_>,
    loader: &mut crate::data::loader::Loader,
    val: &crate::train::epoch::Val,
    start: &crate::train::state::Start,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<TrainSummary> {
    let mut reports = Vec::new();
    let mut interrupted = false;
    run.session.started = std::time::Instant::now();
    let mut epoch = start.epoch;
    // The epoch count is the schedule's: `--time` re-estimates it after each epoch.
    while epoch < run.sched.epochs {
        // Between epochs the epoch-end checkpoint holds the state; in the first epoch the batch
        // loop saves it before it stops.
        if epoch > start.epoch && run.agreed_stop(stop)? {
            interrupted = true;
            break;
        }
        let end = run_epoch(run, loader, val, epoch, start, stop, obs);
        obs.event(&TrainEvent::EpochClosed { epoch });
        match end? {
            EpochEnd::Stopped => {
                interrupted = true;
                break;
            }
            EpochEnd::Trained { report, early_stop } => {
                reports.push(*report);
                if early_stop {
                    break;
                }
            }
        }
        epoch += 1;
    }
    if interrupted {
        obs.line(&format!(
            "stopped on request; the state is saved. Continue with:\n  {}",
            run.resume_command()
        ));
    } else if reports.is_empty() {
        bail!("no epoch was run");
    }
    Ok(TrainSummary {
        run_dir: run.files.dir.clone(),
        epochs: reports,
        best_fitness: run.counters.best_fitness,
        last: run.files.last.clone(),
        best: run.files.best.clone(),
        interrupted,
        budget: run.sizing.budget.clone(),
    })
}

/// A setup error `e`: when it is a stop request ([`crate::cancel::Stopped`]) the run ends as
/// interrupted before anything was trained (the observer is told nothing was saved); any other
/// error is returned as it is.
fn stopped_before_training(e: anyhow::Error, obs: &mut dyn TrainObserver) -> Result<TrainSummary> {
    let Some(s) = crate::cancel::Stopped::in_chain(&e) else {
        return Err(e);
    };
    obs.line(&format!("{s}: nothing was trained, so nothing was saved"));
    Ok(TrainSummary {
        run_dir: PathBuf::new(),
        epochs: Vec::new(),
        best_fitness: 0.0,
        last: PathBuf::new(),
        best: PathBuf::new(),
        interrupted: true,
        budget: None,
    })
}
