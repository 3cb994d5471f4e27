//! One epoch of a run: the batch loop (warmup schedule, the step with out-of-memory recovery,
//! gradient accumulation and optimizer steps, the NaN guard, mid-epoch checkpoints and stop
//! requests), validation of the EMA with out-of-memory retry, fitness and best epoch, the
//! `results.csv` line and `results.png`, the epoch-end checkpoint, and the early stop.

use crate::data::loader::{Batch, Loader};
use crate::memory::{fmt_size, halve_on_oom, is_oom};
use crate::metrics::validate::{validate, ValConfig, ValImage, ValModel};
use crate::model::yolov9::YoloV9Train;
use crate::train::checkpoint::EpochProgress;
use crate::train::dist::sync::BnSyncOf;
use crate::train::guard::{Phase, StopFlag};
use crate::train::observer::{TrainEvent, TrainObserver};
use crate::train::report::{append_results_csv, EpochReport};
use crate::train::state::{copy_atomic, Run, Start};
use crate::train::step::{
    add_param_grads, optimizer_step, phase, step, BatchOutcome, StepInput, StepParts, StepTimes,
};
use anyhow::Result;
use candle_core::Tensor;
use std::collections::HashMap;

/// What validation needs besides the run: the model the EMA is loaded into, the images, the
/// class names (for the metrics table).
pub(crate) struct Val {
    /// Training graph that receives the EMA state before each validation.
    pub model: YoloV9Train,
    /// The val split.
    pub images: Vec<ValImage>,
    /// Class names.
    pub names: Vec<String>,
}

/// How an epoch ended.
pub(crate) enum EpochEnd {
    /// Stopped on request; the state is saved (no report: the epoch was not validated).
    Stopped,
    /// The epoch ran to its end; `early_stop` when there was no improvement in `--patience`
    /// epochs.
    Trained {
        /// Its `results.csv` line.
        report: Box<EpochReport>,
        /// Whether training stops here.
        early_stop: bool,
    },
}

fn fmt_mem(b: u64) -> String {
    format!("{:.2}G", b as f64 / 1e9)
}

/// Runs epoch `epoch` of `run` (from `start` when it is the run's first, resumed, epoch).
pub(crate) fn run_epoch(
    run: &mut Run<'_>,
    loader: &mut Loader,
    val: &Val,
    epoch: usize,
    start: &Start,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<EpochEnd> {
    let opts = run.opts;
    // Official: mosaic off at `epoch == epochs - close_mosaic` (never when close_mosaic > epochs);
    // `>=` so that a resumed run past that epoch also has it off.
    let epochs = run.sched.epochs;
    if opts.close_mosaic > 0
        && epochs >= opts.close_mosaic
        && epoch >= epochs - opts.close_mosaic
        && loader.config().augment.mosaic > 0.0
    {
        if opts.verbose {
            obs.line(&format!("closing mosaic from epoch {}", epoch + 1));
        }
        loader.config_mut().augment.mosaic = 0.0;
    }
    let Some((mut pr, train_secs)) =
        train_batches(run, loader, (epoch, &val.names), start, stop, obs)?
    else {
        return Ok(EpochEnd::Stopped);
    };
    if !run.rank0 {
        return other_rank_epoch_end(run, epoch, pr, train_secs, obs);
    }
    let lr = run.opt.lr;
    let final_epoch = epoch + 1 == epochs;
    // The two phases' peaks apart, so that a warning names the one above the budget.
    let train_peak = run.probe.peak_bytes();
    run.probe.reset_peak();

    // Validation of the EMA (batch halved on out-of-memory).
    let mut metrics = [0f64; 4];
    let mut val_loss = [0f32; 3];
    let mut val_seg_loss = run.model.is_seg().then_some(0f32);
    let mut mask_metrics = run.model.is_seg().then_some([0f64; 4]);
    let mut validated = false;
    let tv = std::time::Instant::now();
    if (!opts.noval || final_epoch) && !val.images.is_empty() {
        let confusion = final_epoch && !opts.noplots;
        if run.faults.stop_in == Some(Phase::Val) {
            stop.request();
        }
        match validate_ema(run, val, &mut pr, obs, confusion, stop) {
            Err(e) if crate::cancel::Stopped::in_chain(&e).is_some() => {
                // The epoch's batches are done: save at its end position, so that `--resume`
                // validates it and goes on; the stop is reported by the trainer.
                pr.train_secs = train_secs;
                run.save(epoch, run.sizing.batches, &pr, obs)?;
                tell_others(run, EndCode::Stopped, false)?;
                return Ok(EpochEnd::Stopped);
            }
            r => (metrics, val_loss, val_seg_loss, mask_metrics) = r?,
        }
        validated = true;
    }
    let val_secs = tv.elapsed().as_secs_f64();
    // A segmentation model: box plus mask fitness (official segment/metrics.py `fitness`).
    let fi = crate::metrics::fitness(metrics[2], metrics[3])
        + mask_metrics.map_or(0.0, |m| crate::metrics::fitness(m[2], m[3]));
    // Without any validation image there is nothing to rank epochs by: the best weights are
    // the last ones (as the official trainer's best.pt with equal, zero fitness every epoch).
    let c = &mut run.counters;
    let improved =
        fi > c.best_fitness || c.best_epoch.is_none() || (!validated && val.images.is_empty());
    if fi > c.best_fitness {
        c.best_fitness = fi;
    }
    if improved {
        c.best_epoch = Some(epoch);
    }
    let val_peak = if validated { run.probe.peak_bytes() } else { 0 };
    let peak_mem = train_peak.max(val_peak);
    if let Some(b) = &run.sizing.budget {
        if peak_mem > b.budget {
            obs.line(&format!(
                "warning: epoch {} peaked at {} of {} (training {}, validation {}), above the \
                 budget {}",
                epoch + 1,
                fmt_size(peak_mem),
                run.probe.what(),
                fmt_size(train_peak),
                fmt_size(val_peak),
                fmt_size(b.budget)
            ));
        }
    }
    let report = EpochReport {
        epoch,
        train_loss: pr.mloss.map(|v| v as f32),
        seg_loss: run.model.is_seg().then_some(pr.mseg as f32),
        mask_metrics,
        metrics,
        val_loss,
        val_seg_loss,
        lr,
        rss: crate::memory::process_rss_bytes(),
        peak_mem,
        skipped: pr.skipped,
        nan_events: pr.nan_events,
        oom_events: pr.oom_events,
        micro: run.sizing.micro,
        img_per_s: pr.images as f64 / train_secs.max(1e-9),
        validated,
    };
    append_results_csv(&run.files.dir, &report)?;
    let summary = opts
        .verbose
        .then(|| report.summary(epochs, train_secs, val_secs, run.probe.what(), fi));
    obs.event(&TrainEvent::EpochEnd {
        report: &report,
        improved,
        summary: summary.as_deref(),
    });
    // `--time`: the epoch count re-estimated (and kept in the state saved next).
    let time_up = run.retime(epoch, obs);
    write_epoch_end(run, epoch, improved, obs)?;

    let mut early_stop = time_up;
    if let Some(be) = run.counters.best_epoch {
        if epoch >= be + opts.patience {
            obs.line(&format!(
                "stopping early: no improvement in {} epochs (best epoch {})",
                opts.patience,
                be + 1
            ));
            early_stop = true;
        }
    }
    tell_others(run, EndCode::Trained, early_stop)?;
    Ok(EpochEnd::Trained {
        report: Box::new(report),
        early_stop,
    })
}

/// How rank 0's epoch ended, for the other ranks.
#[derive(Clone, Copy, PartialEq)]
enum EndCode {
    Trained = 0,
    Stopped = 1,
}

/// Rank 0 of a data-parallel run, at its epoch's end: tells the other ranks (waiting in
/// [`other_rank_epoch_end`]) how it ended, the epoch count (`--time`) and the early stop.
fn tell_others(run: &mut Run<'_>, code: EndCode, early_stop: bool) -> Result<()> {
    if let Some(c) = run.comm.as_mut() {
        let mut d = [
            code as u8 as f32,
            run.sched.epochs as f32,
            f32::from(u8::from(early_stop)),
        ];
        c.broadcast(&mut d)?;
    }
    Ok(())
}

/// The epoch's end on a rank other than 0: it waits for rank 0's validation and checkpoint
/// ([`tell_others`]), then takes the same decisions (the epoch count, the stop, the early stop)
/// and refreshes its good state as rank 0's checkpoint did. Its report carries its own
/// training losses (the global batch's, as rank 0's) and no metrics.
fn other_rank_epoch_end(
    run: &mut Run<'_>,
    epoch: usize,
    mut pr: EpochProgress,
    train_secs: f64,
    obs: &mut dyn TrainObserver,
) -> Result<EpochEnd> {
    let mut d = [0f32; 3];
    if let Some(c) = run.comm.as_mut() {
        c.broadcast(&mut d)?;
    }
    run.sched.epochs = d[1] as usize;
    if let Some(e) = run.files.args_json.get_mut("epochs") {
        *e = serde_json::Value::from(run.sched.epochs);
    }
    if d[0] as u8 == EndCode::Stopped as u8 {
        pr.train_secs = train_secs;
        run.save(epoch, run.sizing.batches, &pr, obs)?;
        return Ok(EpochEnd::Stopped);
    }
    run.save(epoch + 1, 0, &EpochProgress::default(), obs)?;
    let report = EpochReport {
        epoch,
        train_loss: pr.mloss.map(|v| v as f32),
        seg_loss: run.model.is_seg().then_some(pr.mseg as f32),
        mask_metrics: run.model.is_seg().then_some([0.0; 4]),
        metrics: [0.0; 4],
        val_loss: [0.0; 3],
        val_seg_loss: run.model.is_seg().then_some(0.0),
        lr: run.opt.lr,
        rss: crate::memory::process_rss_bytes(),
        peak_mem: run.probe.peak_bytes(),
        skipped: pr.skipped,
        nan_events: pr.nan_events,
        oom_events: pr.oom_events,
        micro: run.sizing.micro,
        img_per_s: pr.images as f64 / train_secs.max(1e-9),
        validated: false,
    };
    Ok(EpochEnd::Trained {
        report: Box::new(report),
        early_stop: d[2] != 0.0,
    })
}

/// The batch loop of epoch `epoch`: returns the epoch's running sums and training seconds, or
/// `None` when it stopped on request (after saving the state).
fn train_batches(
    run: &mut Run<'_>,
    loader: &Loader,
    (epoch, names): (usize, &[String]),
    start: &Start,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<Option<(EpochProgress, f64)>> {
    let opts = run.opts;
    let nb = run.sizing.batches;
    let interval = std::time::Duration::from_secs_f64(opts.save_interval * 60.0);
    let first = if epoch == start.epoch { start.batch } else { 0 };
    let mut pr = if epoch == start.epoch {
        start.progress.clone()
    } else {
        EpochProgress::default()
    };
    run.probe.reset_peak();
    let t0 = std::time::Instant::now();
    let secs0 = pr.train_secs;
    let mut last_save = std::time::Instant::now();
    let mut times = StepTimes::new(&run.device);
    if opts.verbose {
        obs.event(&TrainEvent::EpochStart {
            epoch,
            epochs: run.sched.epochs,
            batches: nb,
            first,
            header: &format!(
                "{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
                "Epoch", "mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size"
            ),
        });
    }
    // The next batch's images are uploaded during this batch's replayed step (CUDA): peeked
    // here, handed over as `pre`.
    let prefetch = crate::train::step::prefetch_on(&run.device);
    let mut batches = loader.epoch(epoch, first).peekable();
    let mut pre: Option<(usize, Tensor)> = None;
    while let Some(batch) = batches.next() {
        let i = batch.index;
        let ni = i + nb * epoch;
        // Stop request or mid-epoch checkpoint, before this batch (state = batches < i).
        let want_save = agree_save(run, stop, i > first && last_save.elapsed() >= interval)?;
        if stop.requested() || want_save {
            pr.train_secs = secs0 + t0.elapsed().as_secs_f64();
            run.save(epoch, i, &pr, obs)?;
            last_save = std::time::Instant::now();
            if stop.requested() {
                if opts.verbose {
                    obs.event(&TrainEvent::EpochAbandoned { epoch });
                }
                return Ok(None);
            }
        }
        pr.skipped += batch.skipped.len();
        for (p, why) in &batch.skipped {
            run.log(obs, format!("skipped {}: {why}", crate::text::path(&p)));
        }
        // A data-parallel rank trains on (a share can be empty): the others wait for it.
        if batch.len == 0 && run.comm.is_none() {
            continue;
        }
        if ni < 3 && !opts.noplots && run.rank0 && batch.len > 0 {
            plot_batch(run, &batch, ni, names, obs);
        }
        times.mark(phase::WAIT)?;
        let st = run.sched.at(ni, epoch, nb, opts.batch);
        run.opt.lr = st.lr.map(|l| l * run.counters.lr_scale);
        run.opt.momentum = st.momentum;
        let (out, ooms) = if batch.len == 0 {
            let grads = Some(candle_core::backprop::GradStore::default());
            (
                BatchOutcome {
                    items: [0.0; 4],
                    grads,
                    next_images: None,
                },
                0,
            )
        } else {
            let on_device = pre.take().filter(|(k, _)| *k == i).map(|(_, t)| t);
            // Peeking waits for the loader's next batch (its workers keep filling the queue).
            let next = if prefetch {
                batches.peek().filter(|b| b.len > 0)
            } else {
                None
            }
            .map(|b| (b.index, b.images.as_slice()));
            let input = StepInput {
                on_device: on_device.as_ref(),
                next: next.map(|(_, b)| b),
                ..StepInput::of(&batch, opts.img as usize)
            };
            let (mut out, ooms) =
                run.train_batch_recovering(&batch, &input, ni, epoch, obs, &mut times)?;
            pre = next.zip(out.next_images.take()).map(|((k, _), t)| (k, t));
            (out, ooms)
        };
        pr.oom_events += ooms;
        let (out, images) = exchange(run, out, batch.len, obs)?;
        accumulate(run, &mut pr, out, images, (epoch, i), obs)?;
        times.mark(phase::ACCUMULATE)?;
        if ni as i64 - run.counters.last_opt_step >= st.accumulate as i64 {
            if let Some(g) = run.acc.take() {
                apply_step(run, &mut pr, g, (epoch, i), obs)?;
            }
            run.counters.last_opt_step = ni as i64;
        }
        times.mark(phase::OPTIMIZER)?;
        if run.nan_streak >= opts.nan_patience {
            let why = format!("{} non-finite steps in a row", run.nan_streak);
            run.rollback(&why, obs)?;
        }
        if run.faults.stop_at == Some(ni) {
            stop.request();
        }
        if opts.verbose {
            report_batch(run, obs, &pr, (epoch, i), batch.targets.len());
        }
    }
    if run.agreed_stop(stop)? {
        // The request came during the last batch: the epoch's training is complete; save
        // at its end position and stop before validation.
        pr.train_secs = secs0 + t0.elapsed().as_secs_f64();
        run.save(epoch, nb, &pr, obs)?;
        return Ok(None);
    }
    let train_secs = secs0 + t0.elapsed().as_secs_f64();
    if opts.verbose {
        obs.event(&TrainEvent::EpochTrained {
            epoch,
            seconds: train_secs,
        });
    }
    if let Some(line) = times.report() {
        obs.line(&line);
    }
    Ok(Some((pr, train_secs)))
}

/// The `--verbose` progress of batch `i` of `epoch` ([`TrainEvent::Batch`]): the epoch's running
/// mean losses, the batch's `instances`, the image size and the memory in use, and the progress
/// line made of them.
fn report_batch(
    run: &Run,
    obs: &mut dyn TrainObserver,
    pr: &EpochProgress,
    (epoch, i): (usize, usize),
    instances: usize,
) {
    let size = run.opts.img as usize;
    let memory = run.probe.current_bytes();
    let status = format!(
        "{:>10}{:>10}{:>10.4}{:>10.4}{:>10.4}{:>10}{:>10}",
        format!("{}/{}", epoch + 1, run.sched.epochs),
        fmt_mem(memory),
        pr.mloss[0],
        pr.mloss[1],
        pr.mloss[2],
        instances,
        size
    );
    obs.event(&TrainEvent::Batch {
        epoch,
        batch: i,
        losses: pr.mloss.map(|v| v as f32),
        instances,
        size,
        memory,
        status: &status,
    });
}

/// In a data-parallel run, any rank's stop request and rank 0's save timer (`want_save`),
/// agreed: another rank's stop request is set on `stop`, and the agreed save is returned. A
/// single-device run returns `want_save`.
fn agree_save(run: &mut Run<'_>, stop: &StopFlag, mut want_save: bool) -> Result<bool> {
    if let Some(c) = run.comm.as_mut() {
        let mine = u32::from(stop.requested()) | (u32::from(want_save && c.rank() == 0) << 1);
        let a = c.agree(mine)?;
        if a.any(1) {
            stop.request();
        }
        want_save = a.any(2);
    }
    Ok(want_save)
}

/// Draws batch `ni` (one of the first three of the run) as the official `train_batch{ni}.jpg`;
/// a failure is a warning.
fn plot_batch(
    run: &Run<'_>,
    batch: &Batch,
    ni: usize,
    names: &[String],
    obs: &mut dyn TrainObserver,
) {
    let p = run.files.dir.join(format!("train_batch{ni}.jpg"));
    let drawn = crate::train::plots::plot_train_batch(
        &batch.images,
        batch.len,
        batch.size,
        &batch.targets,
        names,
        &p,
    );
    if let Err(e) = drawn {
        obs.note(&format!("warning: {e:#}"));
    }
}

/// The batch's outcome across the ranks of a data-parallel run (gradients summed, losses
/// averaged over the global batch, the batch dropped by all when one rank's loss is not finite;
/// the micro-batch becomes the smallest of any rank) and the images it counts; a single-device
/// run returns `out` and its own `len` images.
fn exchange(
    run: &mut Run<'_>,
    out: BatchOutcome,
    len: usize,
    obs: &mut dyn TrainObserver,
) -> Result<(BatchOutcome, usize)> {
    Ok(match run.comm.as_mut() {
        None => (out, len),
        Some(c) => {
            // The next batch's images, uploaded during this step's replay, stay for it.
            let next_images = out.next_images;
            let local = crate::train::dist::sync::Local {
                grads: out.grads,
                items: out.items,
                len,
                micro: run.sizing.micro,
            };
            let g = crate::train::dist::sync::exchange(c.as_mut(), local, &run.opt, &run.device)?;
            run.sizing.micro = g.micro;
            if !g.nan_ranks.is_empty() {
                run.log(
                    obs,
                    format!(
                        "non-finite loss on rank(s) {:?}: every rank drops the batch",
                        g.nan_ranks
                    ),
                );
            }
            (
                BatchOutcome {
                    items: g.items,
                    grads: g.grads,
                    next_images,
                },
                g.len,
            )
        }
    })
}

/// Adds the gradients of batch `i` of `epoch` to the accumulation window and its losses to the
/// epoch's means; a batch without gradients (non-finite loss) drops the window and counts a NaN
/// event.
fn accumulate(
    run: &mut Run<'_>,
    pr: &mut EpochProgress,
    out: BatchOutcome,
    images: usize,
    (epoch, i): (usize, usize),
    obs: &mut dyn TrainObserver,
) -> Result<()> {
    match out.grads {
        Some(mut g) => {
            add_param_grads(&mut run.acc, &mut g, &run.opt)?;
            for (m, v) in pr.mloss.iter_mut().chain([&mut pr.mseg]).zip(out.items) {
                *m = (*m * pr.done as f64 + v) / (pr.done + 1) as f64;
            }
            pr.done += 1;
            pr.images += images;
        }
        None => {
            // The optimizer step this batch belongs to is skipped: its window's
            // gradients are dropped.
            run.acc = None;
            pr.nan_events += 1;
            run.nan_streak += 1;
            run.log(
                obs,
                format!(
                    "warning: non-finite loss {:?} at epoch {} batch {i}; batch skipped ({} in a row)",
                    out.items, epoch + 1, run.nan_streak
                ),
            );
        }
    }
    Ok(())
}

/// The optimizer step on the accumulated gradients `g` (after batch `i` of `epoch`), with the
/// BatchNorm statistics of rank 0 in a data-parallel run; a non-finite gradient norm skips the
/// step and counts a NaN event.
fn apply_step(
    run: &mut Run<'_>,
    pr: &mut EpochProgress,
    mut g: candle_core::backprop::GradStore,
    (epoch, i): (usize, usize),
    obs: &mut dyn TrainObserver,
) -> Result<()> {
    if let Some(c) = run.comm.as_mut() {
        crate::train::dist::sync::broadcast_bn(c.as_mut(), &run.model)?;
    }
    let norm = optimizer_step(&run.model, &mut run.opt, &mut run.ema, &mut g)?;
    if norm.is_finite() {
        run.nan_streak = 0;
    } else {
        pr.nan_events += 1;
        run.nan_streak += 1;
        run.log(
            obs,
            format!(
                "warning: non-finite gradient norm at epoch {} batch {i}; optimizer step skipped ({} in a row)",
                epoch + 1,
                run.nan_streak
            ),
        );
    }
    Ok(())
}

/// The epoch's files: `results.png` (unless `--noplots`), the epoch-end checkpoint (`last`,
/// the state), `best` when the epoch `improved`, and the `--save-period` copy. With
/// `YOLO9_STEP_TIMES=1` one line gives the seconds of each (and `Run::save` its parts: a 16x BCCD
/// run on the H200 host stalled 18–31 s in a checkpoint written mid accumulation window, until the
/// window's gradients were copied to the host with `crate::device::to_host`, 2026-12-04).
fn write_epoch_end(
    run: &mut Run<'_>,
    epoch: usize,
    improved: bool,
    obs: &mut dyn TrainObserver,
) -> Result<()> {
    let opts = run.opts;
    let t_plots = std::time::Instant::now();
    if !opts.noplots {
        let csv = run.files.dir.join("results.csv");
        let drawn = crate::train::plots::read_results_csv(&csv, "yolo9").and_then(|c| {
            crate::train::plots::plot_results(&[c], &run.files.dir.join("results.png"))
        });
        if let Err(e) = drawn {
            obs.line(&format!("warning: results.png not drawn: {e:#}"));
        }
    }
    let plots = t_plots.elapsed().as_secs_f64();
    let t_save = std::time::Instant::now();
    let (mut checkpoint, mut copies) = (0.0, 0.0);
    if run.save(epoch + 1, 0, &EpochProgress::default(), obs)? {
        checkpoint = t_save.elapsed().as_secs_f64();
        if improved {
            copy_atomic(&run.files.last, &run.files.best)?;
        }
        if opts.save_period > 0 && (epoch + 1).is_multiple_of(opts.save_period as usize) {
            let wdir = run.files.dir.join("weights");
            copy_atomic(
                &run.files.last,
                &wdir.join(format!("epoch{epoch}.safetensors")),
            )?;
        }
        copies = t_save.elapsed().as_secs_f64() - checkpoint;
    }
    if StepTimes::enabled() {
        obs.line(&format!(
            "epoch end times (s): plots {plots:.2}, checkpoint {checkpoint:.2}, best/periodic \
             copies {copies:.2}"
        ));
    }
    Ok(())
}

/// Validates the EMA on the val split, halving the batch on out-of-memory (counted in `pr`, as
/// are the images it skipped); returns P, R, mAP50, mAP50-95 and the val losses. With
/// `confusion` (the final epoch, plots on) it also draws `confusion_matrix.png` and
/// `confusion_matrix_normalized.png` into the run folder.
/// What the validation of the EMA gives an epoch: box P, R, mAP50, mAP50-95, the val losses
/// `[box, cls, dfl]`, and a segmentation model's val mask loss and mask metrics.
type EmaVal = ([f64; 4], [f32; 3], Option<f32>, Option<[f64; 4]>);

fn validate_ema(
    run: &mut Run<'_>,
    val: &Val,
    pr: &mut EpochProgress,
    obs: &mut dyn TrainObserver,
    confusion: bool,
    stop: &StopFlag,
) -> Result<EmaVal> {
    let opts = run.opts;
    // The captured training step holds a training forward's activations: under a memory
    // budget they are released for validation (the next epoch captures again); without one the
    // capture stays, and an out-of-memory error below drops it before the retry (see
    // `train::graphed`).
    run.graphs.borrow_mut().release_for_other_work();
    let map: HashMap<String, Tensor> = run.ema.state.iter().cloned().collect();
    val.model.load_state_dict(&map)?;
    // The official trainer validates at twice the training batch. Under a memory budget the
    // measured micro-batch is the size known to fit (an eval forward needs less than a training
    // step at the same batch); the training state (weights, gradients, momentum, EMA) stays
    // resident beside it, and twice the micro-batch of the largest models does not fit.
    let start = if run.sizing.budget.is_some() {
        run.sizing.micro.max(1)
    } else {
        (run.sizing.micro * 2).max(1)
    };
    let (r, vb, halvings) = halve_on_oom(
        start,
        |vb| {
            let cfg = ValConfig {
                img: opts.img,
                batch: vb,
                progress: opts.verbose,
                confusion,
                collect: confusion,
                cancel: stop.cancel(),
                ..ValConfig::default()
            };
            if val.model.is_seg() {
                // Boxes and masks (official segment/val.py), without val losses.
                let m = crate::metrics::seg_val::SegValModel::Train {
                    model: &val.model,
                    loss: Some(&run.loss),
                };
                return crate::metrics::seg_val::validate_seg(m, &val.images, &cfg);
            }
            let m = ValModel::Train {
                model: &val.model,
                loss: &run.loss,
            };
            validate(m, &val.images, &cfg)
        },
        |old, new| {
            run.graphs.borrow_mut().reset();
            obs.line(&format!(
                "out of memory in validation at batch {old}: retrying with {new}"
            ));
            Ok(())
        },
    )?;
    pr.oom_events += halvings;
    crate::memory::mem_trace(val.model.device(), format_args!("validation batch={vb}"));
    if opts.verbose {
        obs.text(&match &r.masks {
            Some(m) => crate::metrics::seg::seg_table(&r.metrics, m, &val.names),
            None => r.metrics.table(&val.names),
        });
    }
    if let Some(cm) = &r.confusion {
        let drawn = crate::metrics::plots::plot_validation(
            &run.files.dir,
            &r.metrics.per_class,
            Some(cm),
            &val.names,
        );
        if let Err(e) = drawn {
            obs.note(&format!("warning: the validation plots: {e:#}"));
        }
        if let Some(dets) = &r.detections {
            let drawn = crate::metrics::plots::plot_val_batches(
                &run.files.dir,
                &val.images,
                dets,
                vb,
                &val.names,
            );
            if let Err(e) = drawn {
                obs.note(&format!("warning: the val_batch pictures: {e:#}"));
            }
        }
    }
    let metrics = [
        r.metrics.mp,
        r.metrics.mr,
        r.metrics.map50,
        r.metrics.map50_95,
    ];
    let val_loss = r.losses.unwrap_or_default();
    let masks = r.masks.map(|m| [m.mp, m.mr, m.map50, m.map50_95]);
    pr.skipped += r.skipped.len();
    let seg_loss = val.model.is_seg().then(|| r.seg_loss.unwrap_or(0.0));
    Ok((metrics, val_loss, seg_loss, masks))
}

impl Run<'_> {
    /// [`step`] with out-of-memory recovery: restore BN statistics, halve the
    /// micro-batch, redo the same batch. Returns the outcome and the number of recoveries.
    fn train_batch_recovering(
        &mut self,
        batch: &Batch,
        input: &StepInput<'_>,
        ni: usize,
        epoch: usize,
        obs: &mut dyn TrainObserver,
        times: &mut StepTimes,
    ) -> Result<(BatchOutcome, usize)> {
        let bn = self.model.snapshot_bn()?;
        times.mark(phase::BN_SNAPSHOT)?;
        // --sync-bn: this rank's collective serves the BN layers during the step.
        let mut sync = if self.opts.sync_bn {
            self.comm.take()
        } else {
            None
        };
        let this = &*self;
        let r = halve_on_oom(
            self.sizing.micro,
            |micro| {
                if let Some(c) = sync.as_mut() {
                    anyhow::ensure!(
                        micro == this.sizing.micro,
                        "--sync-bn: out of memory at micro-batch {} on rank {}; the ranks cannot \
                         halve apart (their BN layers meet in every forward): lower --batch, \
                         set --micro-batch, or drop --sync-bn",
                        this.sizing.micro,
                        c.rank()
                    );
                }
                let parts = StepParts {
                    model: &this.model,
                    loss: &this.loss,
                    opt: &this.opt,
                    device: &this.device,
                    graphs: Some(&this.graphs),
                };
                match sync.as_mut() {
                    Some(c) => crate::model::bn_sync::with_sync(&mut BnSyncOf(c.as_mut()), || {
                        step(&parts, input, micro, &this.faults, ni, times)
                    }),
                    None => step(&parts, input, micro, &this.faults, ni, times),
                }
            },
            |old, new| {
                this.model.restore_bn(&bn)?;
                // A captured step holds its activations' memory: release it first.
                this.graphs.borrow_mut().reset();
                this.log(
                    obs,
                    format!(
                        "out of memory at epoch {} batch {} (micro-batch {old}): micro-batch \
                         {old} → {new} ({} per batch of {}), redoing the batch",
                        epoch + 1,
                        batch.index,
                        this.sizing.batch.div_ceil(new),
                        this.sizing.batch
                    ),
                );
                Ok(())
            },
        );
        if sync.is_some() {
            self.comm = sync;
        }
        match r {
            Ok((o, micro, halvings)) => {
                self.sizing.micro = micro;
                Ok((o, halvings))
            }
            Err(e) if is_oom(&e) => {
                self.model.restore_bn(&bn)?;
                self.graphs.borrow_mut().reset();
                self.sizing.micro = 1;
                Err(e.context(format!(
                    "out of memory with a micro-batch of 1 at --img {}; lower --img or free \
                     memory on the device",
                    self.opts.img
                )))
            }
            Err(e) => Err(e),
        }
    }
}
