//! The live state of one run and its checkpoints: [`Run`] (model, loss, optimizer, EMA,
//! schedule, paths and [`Counters`]), saving it (`weights/last.safetensors` and the training state
//! `weights/state.safetensors`, see [`crate::train::checkpoint`]), the NaN guard's rollback to the
//! last good state, and [`restore`] of a saved state on `--resume`.

use crate::budget::BudgetDecision;
use crate::loss::DualTalLoss;
use crate::memory::MemoryProbe;
use crate::model::weights::Weights;
use crate::model::yolov9::YoloV9Train;
pub(crate) use crate::train::checkpoint::Counters;
use crate::train::checkpoint::{save_state, CheckpointMeta, EpochProgress, TrainState};
use crate::train::ema::Ema;
use crate::train::guard::{all_finite, Faults, GoodState};
use crate::train::observer::{TrainEvent, TrainObserver};
use crate::train::optimizer::Optimizer;
use crate::train::options::TrainOptions;
use crate::train::schedule::Schedule;
use anyhow::{ensure, Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use std::path::{Path, PathBuf};

/// Where a run starts: a new run at the start of epoch 0, a resumed one where its state was
/// saved.
#[derive(Debug, Clone, Default)]
pub(crate) struct Start {
    /// First epoch to run (0-based).
    pub epoch: usize,
    /// First batch of `epoch` to run.
    pub batch: usize,
    /// Running sums of `epoch` when it is in progress.
    pub progress: EpochProgress,
}

/// What a run continues from: nothing for a new run ([`Resumed::default`]), else what
/// [`restore`] read.
#[derive(Default)]
pub(crate) struct Resumed {
    /// Where the run starts.
    pub start: Start,
    /// The counters.
    pub counters: Counters,
    /// Gradients accumulated since the last optimizer step.
    pub acc: Option<GradStore>,
}

/// The run folder and what the run writes there.
pub(crate) struct RunFiles {
    /// The run folder (`--project/--name`).
    pub dir: PathBuf,
    /// `weights/last.safetensors`.
    pub last: PathBuf,
    /// `weights/best.safetensors`.
    pub best: PathBuf,
    /// `weights/state.safetensors` (what `--resume` reads).
    pub state: PathBuf,
    /// The run's options as saved in the state (`args.yaml`'s content).
    pub args_json: serde_json::Value,
    /// The run folder's lock, held by rank 0 for the run's life ([`crate::runs::lock_run_dir`]).
    pub _lock: Option<crate::runs::RunLock>,
}

/// The batch a run trains with.
pub(crate) struct Sizing {
    /// Batches per epoch.
    pub batches: usize,
    /// Images per batch (`--batch`, or what the budget chose).
    pub batch: usize,
    /// Images per micro-batch (the step splits a batch into these).
    pub micro: usize,
    /// The memory-budget decision, when `--budget` sized the batch.
    pub budget: Option<BudgetDecision>,
}

/// This session of the run (a resumed run starts a new one).
pub(crate) struct Session {
    /// When its first epoch started.
    pub started: std::time::Instant,
    /// Its first epoch.
    pub first_epoch: usize,
}

/// Everything one run mutates, shared by the batch loop, the epoch end and the checkpoints.
pub(crate) struct Run<'a> {
    pub opts: &'a TrainOptions,
    pub device: Device,
    pub model: YoloV9Train,
    pub loss: DualTalLoss,
    pub opt: Optimizer,
    pub ema: Ema,
    pub sched: Schedule,
    pub probe: MemoryProbe,
    pub faults: Faults,
    /// The run folder and its files.
    pub files: RunFiles,
    /// The batch the run trains with and how it was sized.
    pub sizing: Sizing,
    pub counters: Counters,
    pub nan_streak: usize,
    pub acc: Option<GradStore>,
    pub good: GoodState,
    /// CUDA-graph replay of the training micro-step (see [`crate::train::graphed`]).
    pub graphs: std::cell::RefCell<crate::train::graphed::StepGraphs>,
    /// This session's start (for `--time`).
    pub session: Session,
    /// The data-parallel group this rank belongs to (`None`: a single-device run); see
    /// [`crate::train::dist`].
    pub comm: Option<Box<dyn crate::train::dist::Collective>>,
    /// Whether this rank writes the run folder (rank 0, or a single-device run).
    pub rank0: bool,
}

impl Run<'_> {
    /// Whether to stop: the stop flag, agreed by every rank of a data-parallel run (any rank's
    /// request stops them all; the flag is then set on every rank). One
    /// [`crate::train::dist::Collective::agree`] when there is a group.
    pub fn agreed_stop(&mut self, stop: &crate::train::guard::StopFlag) -> Result<bool> {
        let Some(c) = self.comm.as_mut() else {
            return Ok(stop.requested());
        };
        let any = c.agree(u32::from(stop.requested()))?.any(1);
        if any {
            stop.request();
        }
        Ok(any)
    }

    /// A line during the epoch (`--verbose` only).
    pub fn log(&self, obs: &mut dyn TrainObserver, msg: String) {
        if self.opts.verbose {
            obs.event(&TrainEvent::EpochLine(&msg))
        }
    }

    /// Restores the last good state and halves the LR (NaN guard).
    pub fn rollback(&mut self, why: &str, obs: &mut dyn TrainObserver) -> Result<()> {
        self.good
            .restore(&self.model, &mut self.opt, &mut self.ema)?;
        self.acc = None;
        self.nan_streak = 0;
        self.counters.nan_rollbacks += 1;
        self.counters.lr_scale *= 0.5;
        // `info`: the observer shows the rollback (with --verbose); this is for embedders' logs.
        tracing::info!(
            why,
            restored = %self.good.label,
            lr_scale = self.counters.lr_scale,
            "NaN guard: rolled back"
        );
        self.log(
            obs,
            format!(
                "warning: {why}: restored the state of {} and halved the LR (scale now {})",
                self.good.label, self.counters.lr_scale
            ),
        );
        Ok(())
    }

    /// Writes `last` (EMA weights) and the full training state at position (`epoch`,
    /// `next_batch`), after checking that the state is finite; refreshes the good state.
    /// Returns false (and rolls back) when the state was not finite.
    pub fn save(
        &mut self,
        epoch: usize,
        next_batch: usize,
        progress: &EpochProgress,
        obs: &mut dyn TrainObserver,
    ) -> Result<bool> {
        let t0 = std::time::Instant::now();
        let vars: Vec<Tensor> = self
            .model
            .vars()
            .iter()
            .map(|v| v.var.as_tensor().clone())
            .collect();
        if !all_finite(vars.iter().chain(self.ema.state.iter().map(|(_, t)| t)))? {
            self.rollback(
                "non-finite weights found before saving; nothing written",
                obs,
            )?;
            return Ok(false);
        }
        let t_write = std::time::Instant::now();
        if self.rank0 {
            self.write_state(epoch, next_batch, progress)?;
        }
        let t_good = std::time::Instant::now();
        self.good = GoodState::take(
            &self.model,
            &self.opt,
            &self.ema,
            format!("epoch {} batch {}", epoch + 1, next_batch),
        )?;
        if crate::train::step::StepTimes::enabled() {
            obs.line(&format!(
                "checkpoint times (s): finite check {:.2}, write {:.2}, rollback copy {:.2}",
                (t_write - t0).as_secs_f64(),
                (t_good - t_write).as_secs_f64(),
                t_good.elapsed().as_secs_f64()
            ));
        }
        Ok(true)
    }

    /// Writes `last` and the training state (the part of [`Run::save`] that rank 0 alone does).
    fn write_state(
        &mut self,
        epoch: usize,
        next_batch: usize,
        progress: &EpochProgress,
    ) -> Result<()> {
        let w = ema_weights(&self.model, &self.ema)?;
        w.save(&self.files.last, false)?;
        let acc: Vec<(String, Tensor)> = match &self.acc {
            Some(g) => self
                .opt
                .params()
                .iter()
                .filter_map(|p| {
                    g.get(p.var.as_tensor())
                        .map(|t| (p.name.clone(), t.clone()))
                })
                .collect(),
            None => Vec::new(),
        };
        let meta = CheckpointMeta {
            version: 2,
            epoch,
            next_batch,
            progress: progress.clone(),
            counters: self.counters.clone(),
            ema_updates: self.ema.updates,
            iterations: self.sizing.batches * epoch + next_batch,
            batches_tracked: self.model.batches_tracked(),
            micro: self.sizing.micro,
            budget: self.sizing.budget.clone(),
            args: self.files.args_json.clone(),
        };
        save_state(
            &self.files.state,
            &meta,
            &self.model.state_dict()?,
            &self.ema.state,
            &self.opt.state(),
            &acc,
        )?;
        tracing::debug!(
            path = %crate::text::path(&self.files.state),
            epoch,
            next_batch,
            "training state saved"
        );
        Ok(())
    }

    /// `--time`: after epoch `epoch` (0-based) re-estimates the run's epoch count from the mean
    /// epoch time of this session ([`crate::train::schedule::epochs_for_time`]), sets it in the
    /// schedule and in the arguments the checkpoints keep, and returns true when training stops
    /// here (the time is used up), with a line saying so. Nothing happens without `--time`.
    pub fn retime(&mut self, epoch: usize, obs: &mut dyn TrainObserver) -> bool {
        let Some(hours) = self.opts.time else {
            return false;
        };
        let elapsed = self.session.started.elapsed().as_secs_f64();
        let (total, stop) = crate::train::schedule::epochs_for_time(
            hours,
            elapsed,
            self.session.first_epoch,
            epoch,
        );
        if total != self.sched.epochs && !stop && self.opts.verbose {
            obs.line(&format!(
                "--time {hours} h: {:.1} s per epoch, so {total} epochs in all (was {})",
                elapsed / (epoch + 1 - self.session.first_epoch.min(epoch)) as f64,
                self.sched.epochs
            ));
        }
        self.sched.epochs = total;
        if let Some(e) = self.files.args_json.get_mut("epochs") {
            *e = serde_json::Value::from(total);
        }
        if stop {
            obs.line(&format!(
                "stopping: the --time limit of {hours} h is reached after epoch {} ({:.1} s of \
                 training); last.safetensors and the training state are saved",
                epoch + 1,
                elapsed
            ));
        }
        stop
    }

    /// The command that continues this run.
    pub fn resume_command(&self) -> String {
        format!(
            "yolo9 train --resume {}",
            crate::text::path(&self.files.dir)
        )
    }
}

/// Loads the saved state `st` into the model, optimizer and EMA of a resumed run (tensors moved
/// to `device`) and returns where the run stopped, its counters and its accumulated gradients.
pub(crate) fn restore(
    st: &TrainState,
    model: &YoloV9Train,
    opt: &mut Optimizer,
    ema: &mut Ema,
    device: &Device,
) -> Result<Resumed> {
    model.load_state_dict(&st.model)?;
    opt.load_state(&st.optim)?;
    ensure!(
        st.ema.len() == ema.state.len(),
        "resume: EMA has {} tensors, model {}",
        st.ema.len(),
        ema.state.len()
    );
    ema.state = st
        .ema
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_device(device)?)))
        .collect::<Result<_>>()?;
    ema.updates = st.meta.ema_updates;
    let mut acc = None;
    if !st.acc.is_empty() {
        let mut g = GradStore::default();
        for (name, t) in &st.acc {
            let p = opt
                .params()
                .iter()
                .find(|p| &p.name == name)
                .with_context(|| format!("resume: accumulated gradient of unknown `{name}`"))?;
            g.insert(p.var.as_tensor(), t.to_device(device)?);
        }
        acc = Some(g);
    }
    Ok(Resumed {
        start: Start {
            epoch: st.meta.epoch,
            batch: st.meta.next_batch,
            progress: st.meta.progress.clone(),
        },
        counters: st.meta.counters.clone(),
        acc,
    })
}

/// EMA weights as a full state_dict (`num_batches_tracked` from the model).
fn ema_weights(model: &YoloV9Train, ema: &Ema) -> Result<Weights> {
    let mut sd = model.state_dict()?;
    for (k, t) in &ema.state {
        sd.insert(k.clone(), crate::device::to_host(t)?);
    }
    Ok(Weights {
        tensors: sd,
        meta: model.meta().clone(),
    })
}

/// Copies `src` to `dst` atomically (see [`crate::model::weights::write_atomic`]).
pub(crate) fn copy_atomic(src: &Path, dst: &Path) -> Result<()> {
    let bytes = crate::bounded::read_capped(src, crate::bounded::FileKind::Checkpoint)
        .with_context(|| format!("{}: cannot read", crate::text::path(&src)))?;
    crate::model::weights::write_atomic(dst, &bytes)
}
