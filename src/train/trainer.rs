//! The training loop of `yolo9 train` (official `train_dual.py`, single device).
//!
//! Per iteration `ni` (batches since the start): warmup of LR/momentum/accumulation
//! ([`Schedule::at`]), one training step of the loader batch ([`crate::train::step::step`]:
//! forward of both branches in train mode, the dual TAL loss (`(box + cls + dfl) · batch`),
//! backward, gradients summed over micro-batches), the batch gradients added over the
//! accumulation window, and an optimizer step when `ni − last_opt_step ≥ accumulate`
//! ([`crate::train::step::optimizer_step`]: gradient-norm clip 10, SGD Nesterov, then an EMA
//! update). Per epoch: LR factor `lf(epoch)` (linear or `--cos-lr`), mosaic off for the last
//! `--close-mosaic` epochs, validation of the EMA (P, R, mAP50, mAP50-95 and real val losses),
//! fitness `0.1·mAP50 + 0.9·mAP50-95` picks `best`, `results.csv`, `weights/last.safetensors`,
//! `weights/best.safetensors` (EMA, `Graph::Train`, f32, loadable by `YoloV9::load`) and the
//! training state `weights/state.safetensors` for `--resume` (see [`crate::train::checkpoint`]).
//! The options ([`TrainOptions`], [`Hyp`]) live in [`crate::train::options`].

use crate::data::image::load_rgb8;
use crate::data::loader::{
    batches_per_epoch, default_workers, DecodeFn, Loader, LoaderConfig, TrainItem,
};
use crate::data::scan::{scan_split, ScanOptions};
use crate::data::yaml::{DataConfig, Split};
use crate::loss::tal_loss::GAINS;
use crate::loss::DualTalLoss;
use crate::memory::{fmt_size, is_oom, MemoryProbe};
use crate::metrics::validate::{val_images, validate, ValConfig, ValModel};
use crate::model::weights::{Weights, STRIDES};
use crate::model::yolov9::YoloV9Train;
use crate::runs::increment_path;
use crate::train::budget::{plan, BudgetDecision, BudgetRequest, AUTO_SHARE};
use crate::train::checkpoint::{load_state, EpochProgress};
use crate::train::ema::Ema;
pub use crate::train::guard::StopFlag;
use crate::train::guard::{Faults, GoodState};
pub use crate::train::observer::{Console, TrainObserver};
use crate::train::optimizer::Sgd;
pub use crate::train::options::{Hyp, TrainOptions};
use crate::train::report::{append_results_csv, create_results_csv};
pub use crate::train::report::{EpochReport, RESULTS_HEADER};
use crate::train::schedule::Schedule;
use crate::train::state::{copy_atomic, restore, Resumed, Run};
use crate::train::step::{
    add_param_grads, optimizer_step, step, BatchOutcome, StepInput, StepParts, StepTimes,
};
pub use crate::train::step::{MAX_GRAD_NORM, STEP_TIMES_ENV};
use anyhow::{bail, ensure, Context, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Result of [`train`].
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// The run folder.
    pub run_dir: PathBuf,
    /// One report per epoch run.
    pub epochs: Vec<EpochReport>,
    /// Best fitness.
    pub best_fitness: f64,
    /// `weights/last.safetensors`.
    pub last: PathBuf,
    /// `weights/best.safetensors`.
    pub best: PathBuf,
    /// True when the run stopped early on SIGINT/SIGTERM (state saved for `--resume`).
    pub interrupted: bool,
    /// The budget decision, if the batch was sized by memory.
    pub budget: Option<BudgetDecision>,
}

/// `cpu` → CPU; `N` → CUDA device N (needs the `cuda` feature).
pub fn parse_device(s: &str) -> Result<Device> {
    let (d, notice) = select_device(s)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    Ok(d)
}

/// The device `s` names (as [`parse_device`]) and, for `auto`, the line saying which one it is.
fn select_device(s: &str) -> Result<(Device, Option<String>)> {
    let spec = crate::device::parse_device(s).map_err(|e| anyhow::anyhow!("--device {s}: {e}"))?;
    let d = crate::device::select(spec)?;
    let notice = (spec == crate::device::DeviceSpec::Auto).then(|| crate::device::auto_notice(&d));
    Ok((d, notice))
}

fn fmt_mem(b: u64) -> String {
    format!("{:.2}G", b as f64 / 1e9)
}

impl Run<'_> {
    /// [`step`] with out-of-memory recovery: restore BN statistics, halve the
    /// micro-batch, redo the same batch. Returns the outcome and the number of recoveries.
    fn train_batch_recovering(
        &mut self,
        batch: &crate::data::loader::Batch,
        ni: usize,
        epoch: usize,
        obs: &mut dyn TrainObserver,
        times: &mut StepTimes,
    ) -> Result<(BatchOutcome, usize)> {
        let bn = self.model.snapshot_bn()?;
        let mut events = 0;
        loop {
            let parts = StepParts {
                model: &self.model,
                loss: &self.loss,
                opt: &self.opt,
                device: &self.device,
                graphs: Some(&self.graphs),
            };
            let input = StepInput::of(batch, self.opts.img as usize);
            match step(&parts, &input, self.micro, &self.faults, ni, times) {
                Ok(o) => return Ok((o, events)),
                Err(e) if is_oom(&e) => {
                    self.model.restore_bn(&bn)?;
                    // A captured step holds its activations' memory: release it first.
                    self.graphs.borrow_mut().reset();
                    if self.micro <= 1 {
                        return Err(e.context(format!(
                            "out of memory with a micro-batch of 1 at --img {}; lower --img or \
                             free memory on the device",
                            self.opts.img
                        )));
                    }
                    let old = self.micro;
                    self.micro = old / 2;
                    events += 1;
                    self.log(
                        obs,
                        format!(
                            "out of memory at epoch {} batch {} (micro-batch {old}): micro-batch \
                             {} → {} ({} per batch of {}), redoing the batch",
                            epoch + 1,
                            batch.index,
                            old,
                            self.micro,
                            self.batch.div_ceil(self.micro),
                            self.batch
                        ),
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Runs training with `opts` and returns the per-epoch reports. Outputs go to
/// `project/name{,2,..}` (see the module docs). Errors name the flag or file at fault; a stop
/// request (SIGINT/SIGTERM) returns `Ok` with `interrupted = true` after saving the state.
///
/// This is [`train_with`] with the SIGINT/SIGTERM handlers installed ([`StopFlag::install`]) and
/// the output printed as `yolo9 train` prints it ([`Console`]).
pub fn train(opts: &TrainOptions) -> Result<TrainSummary> {
    let stop = StopFlag::install()?;
    train_with(opts, &stop, &mut Console::new())
}

/// [`train`] with the caller's stop flag (a request stops the run at the next batch boundary,
/// after saving the state) and its observer, which receives all progress output.
pub fn train_with(
    opts: &TrainOptions,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<TrainSummary> {
    // Before anything runs a convolution (the budget probe included).
    #[cfg(feature = "cuda")]
    crate::cuda::conv::set_strict_fp32(opts.strict_fp32);
    let faults = if opts.faults.is_empty() {
        Faults::from_env()?
    } else {
        opts.faults.clone()
    };
    // Resume: restore the arguments and the state of an earlier run.
    let (mut opts, state, mut run_dir) = match &opts.resume {
        Some(r) => {
            let ckpt = if r.is_dir() {
                r.join("weights").join("state.safetensors")
            } else {
                r.clone()
            };
            let st = load_state(&ckpt).with_context(|| {
                format!("--resume {}: cannot read the training state", r.display())
            })?;
            let mut o: TrainOptions = serde_json::from_value(st.meta.args.clone())
                .with_context(|| format!("{}: bad run arguments", ckpt.display()))?;
            o.resume = Some(ckpt.clone());
            o.verbose = opts.verbose;
            // `--data` given with `--resume`: the dataset moved (or is a copy); use it instead of
            // the path stored in the run. The images must be the same for an exact resume.
            if !opts.data.as_os_str().is_empty() && opts.data != o.data {
                if opts.verbose {
                    obs.line(&format!(
                        "resume: using --data {} instead of the run's {}",
                        opts.data.display(),
                        o.data.display()
                    ));
                }
                o.data = opts.data.clone();
            }
            let dir = ckpt
                .parent()
                .and_then(|p| p.parent())
                .map(Path::to_path_buf)
                .with_context(|| format!("{}: not inside RUN/weights/", ckpt.display()))?;
            if let Some(e) = opts.extend_epochs {
                ensure!(
                    e >= st.meta.epoch.max(1),
                    "--resume {} --epochs {e}: the run has already done {} epochs",
                    r.display(),
                    st.meta.epoch
                );
                o.epochs = e;
            }
            ensure!(
                st.meta.epoch < o.epochs,
                "--resume {}: the run already finished its {} epochs; to train it longer, \
                 resume with more epochs: yolo9 train --resume {} --epochs {}",
                r.display(),
                o.epochs,
                dir.display(),
                o.epochs * 2
            );
            (o, Some(st), dir)
        }
        None => {
            let dir = increment_path(&opts.project, &opts.name, opts.exist_ok);
            (opts.clone(), None, dir)
        }
    };
    ensure!(opts.epochs >= 1, "--epochs must be at least 1");
    ensure!(
        opts.img >= 32 && opts.img % 32 == 0,
        "--img {} must be a positive multiple of 32 (the largest stride)",
        opts.img
    );
    ensure!(
        opts.save_interval >= 0.0 && opts.save_interval.is_finite(),
        "--save-interval {} must be a number of minutes >= 0",
        opts.save_interval
    );
    ensure!(opts.nan_patience >= 1, "--nan-patience must be at least 1");
    let hyp = match &opts.hyp {
        Some(p) => Hyp::load(p)?,
        None => Hyp::default(),
    };
    for (name, v, g) in [
        ("box", hyp.box_gain, GAINS[0]),
        ("cls", hyp.cls, GAINS[1]),
        ("dfl", hyp.dfl, GAINS[2]),
    ] {
        if (v - g as f64).abs() > 1e-9 {
            obs.note(&format!(
                "warning: hyp `{name}: {v}` ignored; the loss uses the official gain {g}"
            ));
        }
    }
    let (device, notice) = select_device(&opts.device)?;
    if let Some(n) = notice {
        obs.note(&n);
    }
    let cfg = DataConfig::load(&opts.data)?;
    let scan_opts = ScanOptions {
        use_cache: true,
        print: false,
    };
    let train_scan = scan_split(&cfg, Split::Train, &scan_opts)?;
    if opts.verbose {
        obs.text(&train_scan.report(&cfg.root, &cfg.names));
    }
    let val_scan = if cfg.val.is_empty() {
        None
    } else {
        let s = scan_split(&cfg, Split::Val, &scan_opts)?;
        if opts.verbose {
            obs.text(&s.report(&cfg.root, &cfg.names));
        }
        Some(s)
    };
    let items: Vec<TrainItem> = train_scan
        .records
        .iter()
        .filter(|r| r.boxes.len() >= opts.min_items)
        .map(|r| TrainItem {
            path: r.image.clone(),
            labels: r
                .boxes
                .iter()
                .map(|b| (b.cls, [b.cx, b.cy, b.w, b.h]))
                .collect(),
        })
        .collect();
    ensure!(
        items.iter().any(|i| !i.labels.is_empty()),
        "{}: no train image with a valid box (after --min-items {}); run `yolo9 check --data {}`",
        cfg.yaml_path.display(),
        opts.min_items,
        cfg.yaml_path.display()
    );
    let vimages = val_scan.as_ref().map(val_images).unwrap_or_default();
    if vimages.is_empty() && opts.verbose {
        obs.line(&format!(
            "warning: the validation split of {} has no usable image: no metrics will be computed, \
             and best.safetensors will be the last epoch's weights",
            cfg.yaml_path.display()
        ));
    }

    // Batch and micro-batch: from the state, from measured memory, or as given.
    let probe = MemoryProbe::new(&device)?;
    let (micro, budget) = match &state {
        Some(st) => (st.meta.micro, st.meta.budget.clone()),
        None if opts.budget.is_some() || opts.batch == 0 => {
            let budget = match opts.budget {
                Some(b) => b,
                None => (probe.free_bytes() as f64 * AUTO_SHARE) as u64,
            };
            let max_labels = items.iter().map(|i| i.labels.len()).max().unwrap_or(1);
            let d = plan(
                &BudgetRequest {
                    nc: cfg.nc,
                    img: opts.img,
                    targets_per_image: (4 * max_labels).max(1),
                    max_batch: if opts.batch == 0 {
                        64.min(items.len())
                    } else {
                        opts.batch
                    },
                    budget,
                    seed: opts.seed,
                    amp: opts.amp,
                },
                &device,
                &probe,
            )
            .with_context(|| format!("sizing the batch for --budget {}", fmt_size(budget)))?;
            if opts.verbose {
                obs.line(&d.describe());
            }
            if opts.batch == 0 {
                opts.batch = d.micro;
            }
            (d.micro, Some(d))
        }
        None => (opts.micro_batch.unwrap_or(opts.batch), None),
    };
    ensure!(opts.batch >= 1, "--batch must be at least 1 (or auto)");
    let micro = micro.clamp(1, opts.batch);
    let opts = &opts;

    // Model, loss, optimizer, EMA.
    let weights = match &opts.weights {
        Some(p) => Some(Weights::load(p).with_context(|| format!("--weights {}", p.display()))?),
        None => None,
    };
    let model = YoloV9Train::new(
        weights.as_ref(),
        cfg.nc,
        cfg.names.clone(),
        &device,
        opts.seed,
    )?;
    model.set_amp(opts.amp);
    if opts.amp && !device.is_cuda() {
        obs.note("note: --amp true has no effect on the CPU; training runs in f32");
    }
    if let (Some(w), None) = (&opts.weights, &state) {
        let n = model.vars().len();
        let init = model.initialized().len();
        obs.line(&format!(
            "transferred {}/{} tensors from {} ({} initialized: {})",
            n.saturating_sub(init),
            n,
            w.display(),
            init,
            model
                .initialized()
                .iter()
                .take(6)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let loss = DualTalLoss::new(cfg.nc, &STRIDES)?;
    let sched = Schedule {
        epochs: opts.epochs,
        lr0: hyp.lr0,
        lrf: hyp.lrf,
        momentum: hyp.momentum,
        warmup_epochs: hyp.warmup_epochs,
        warmup_momentum: hyp.warmup_momentum,
        warmup_bias_lr: hyp.warmup_bias_lr,
        cos_lr: opts.cos_lr,
        nbs: 64,
    };
    let wd = sched.scaled_weight_decay(hyp.weight_decay, opts.batch);
    let params = model
        .vars()
        .iter()
        .map(|v| (v.name.clone(), v.var.clone()))
        .collect();
    let mut opt = Sgd::new(params, hyp.lr0, hyp.momentum, wd);
    let mut ema = Ema::new(&model.float_state()?)?;
    let resumed = match &state {
        Some(st) => {
            let r = restore(st, &model, &mut opt, &mut ema, &device)?;
            obs.line(&format!(
                "resuming at epoch {} batch {} (best fitness {:.5}, micro-batch {})",
                r.start.epoch + 1,
                r.start.batch,
                r.counters.best_fitness,
                micro
            ));
            r
        }
        None => Resumed::default(),
    };
    let eval_model = YoloV9Train::new(None, cfg.nc, cfg.names.clone(), &device, opts.seed)?;

    // Outputs. A new run claims its folder now, exclusively: another run started meanwhile with
    // the same --project/--name gets the next one instead of sharing it.
    if state.is_none() {
        run_dir = crate::runs::claim_run_dir(&opts.project, &opts.name, opts.exist_ok)
            .with_context(|| format!("{}: cannot create the run folder", run_dir.display()))?;
    }
    let wdir = run_dir.join("weights");
    std::fs::create_dir_all(&wdir)
        .with_context(|| format!("{}: cannot create the run folder", wdir.display()))?;
    // Temporary files of a writer killed mid-checkpoint (the checkpoints themselves are intact).
    if let Ok(entries) = std::fs::read_dir(&wdir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
                obs.line(&format!(
                    "removed {name}, left by an interrupted checkpoint write"
                ));
            }
        }
    }
    let args_json = serde_json::to_value(opts)?;
    if state.is_none() {
        std::fs::write(run_dir.join("args.yaml"), serde_yaml::to_string(opts)?)
            .with_context(|| format!("{}: cannot write args.yaml", run_dir.display()))?;
        std::fs::write(run_dir.join("hyp.yaml"), serde_yaml::to_string(&hyp)?)
            .with_context(|| format!("{}: cannot write hyp.yaml", run_dir.display()))?;
        create_results_csv(&run_dir)?;
    }

    // Loader.
    let workers = if opts.workers == 0 {
        default_workers()
    } else {
        opts.workers
    };
    let decode: Arc<DecodeFn> = Arc::new(|p: &Path| load_rgb8(p));
    let mut loader = Loader::new(
        items,
        decode,
        LoaderConfig {
            img_size: opts.img,
            batch: opts.batch,
            seed: opts.seed,
            workers,
            prefetch: 2,
            augment: hyp.augment(),
            shuffle: true,
        },
    )?;
    let nb = batches_per_epoch(loader.len(), opts.batch);
    let s = opts.img as usize;
    if opts.verbose {
        obs.line(&format!(
            "training {} images ({} batches of {}, micro-batch {}, accumulate {} for nominal batch 64) \
             at {}x{} for {} epochs on {:?}{}; run folder {}",
            loader.len(),
            nb,
            opts.batch,
            micro,
            sched.accumulate(opts.batch),
            opts.img,
            opts.img,
            opts.epochs,
            device,
            if model.amp() { " with mixed precision (bf16)" } else { "" },
            run_dir.display()
        ));
    }
    let good = GoodState::take(&model, &opt, &ema, "the start of this run".into())?;
    let Resumed {
        start,
        counters,
        acc,
    } = resumed;
    let mut run = Run {
        opts,
        device: device.clone(),
        model,
        loss,
        opt,
        ema,
        sched,
        probe,
        faults,
        last: wdir.join("last.safetensors"),
        best: wdir.join("best.safetensors"),
        state_path: wdir.join("state.safetensors"),
        run_dir,
        args_json,
        nb,
        batch: opts.batch,
        micro,
        budget,
        counters,
        nan_streak: 0,
        acc,
        good,
        graphs: Default::default(),
    };
    // CUDA-graph replay of the step (`train::graphed`) holds the captured step's memory in the
    // graphs' own pool, beside what the ordinary phases keep: with a memory budget the step runs
    // as ordinary launches, so the measured sizing holds.
    let graphed = run.budget.is_none() && run.graphs.borrow().applies_to(&run.device);
    if !graphed {
        run.graphs.borrow_mut().disable();
    }
    if opts.verbose && device.is_cuda() {
        obs.line(&format!(
            "training step: {}",
            if graphed {
                "replayed from CUDA graphs (YOLO9_TRAIN_GRAPH=0 turns that off)"
            } else if run.budget.is_some() {
                "ordinary launches (CUDA-graph replay is off under a memory budget)"
            } else {
                "ordinary launches"
            }
        ));
    }
    let interval = std::time::Duration::from_secs_f64(opts.save_interval * 60.0);

    let mut reports = Vec::new();
    let mut interrupted = false;
    'epochs: for epoch in start.epoch..opts.epochs {
        if stop.requested() {
            interrupted = true;
            break;
        }
        // Official: mosaic off at `epoch == epochs - close_mosaic` (never when close_mosaic > epochs);
        // `>=` so that a resumed run past that epoch also has it off.
        if opts.close_mosaic > 0
            && opts.epochs >= opts.close_mosaic
            && epoch >= opts.epochs - opts.close_mosaic
            && loader.config().augment.mosaic > 0.0
        {
            if opts.verbose {
                obs.line(&format!("closing mosaic from epoch {}", epoch + 1));
            }
            loader.config_mut().augment.mosaic = 0.0;
        }
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
            obs.epoch_start(
                &format!(
                    "{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
                    "Epoch", "mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size"
                ),
                nb,
                first,
            );
        }
        for batch in loader.epoch(epoch, first) {
            let i = batch.index;
            let ni = i + nb * epoch;
            // Stop request or mid-epoch checkpoint, before this batch (state = batches < i).
            if stop.requested() || (i > first && last_save.elapsed() >= interval) {
                pr.train_secs = secs0 + t0.elapsed().as_secs_f64();
                run.save(epoch, i, &pr, obs)?;
                last_save = std::time::Instant::now();
                if stop.requested() {
                    if opts.verbose {
                        obs.epoch_abandoned();
                    }
                    obs.epoch_closed();
                    interrupted = true;
                    break 'epochs;
                }
            }
            pr.skipped += batch.skipped.len();
            for (p, why) in &batch.skipped {
                run.log(obs, format!("skipped {}: {why}", p.display()));
            }
            if batch.len == 0 {
                continue;
            }
            times.mark(0)?;
            let st = run.sched.at(ni, epoch, nb, opts.batch);
            run.opt.lr = st.lr.map(|l| l * run.counters.lr_scale);
            run.opt.momentum = st.momentum;
            let (out, ooms) = run.train_batch_recovering(&batch, ni, epoch, obs, &mut times)?;
            pr.oom_events += ooms;
            match out.grads {
                Some(mut g) => {
                    add_param_grads(&mut run.acc, &mut g, &run.opt)?;
                    for (m, v) in pr.mloss.iter_mut().zip(out.items) {
                        *m = (*m * pr.done as f64 + v) / (pr.done + 1) as f64;
                    }
                    pr.done += 1;
                    pr.images += batch.len;
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
            if ni as i64 - run.counters.last_opt_step >= st.accumulate as i64 {
                if let Some(mut g) = run.acc.take() {
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
                }
                run.counters.last_opt_step = ni as i64;
            }
            times.mark(5)?;
            if run.nan_streak >= opts.nan_patience {
                let why = format!("{} non-finite steps in a row", run.nan_streak);
                run.rollback(&why, obs)?;
            }
            if run.faults.stop_at == Some(ni) {
                stop.request();
            }
            if opts.verbose {
                obs.batch_done(&format!(
                    "{:>10}{:>10}{:>10.4}{:>10.4}{:>10.4}{:>10}{:>10}",
                    format!("{}/{}", epoch + 1, opts.epochs),
                    fmt_mem(run.probe.current_bytes()),
                    pr.mloss[0],
                    pr.mloss[1],
                    pr.mloss[2],
                    batch.targets.len(),
                    s
                ));
            }
        }
        if stop.requested() && !interrupted {
            // The request came during the last batch: the epoch's training is complete; save
            // at its end position and stop before validation.
            pr.train_secs = secs0 + t0.elapsed().as_secs_f64();
            run.save(epoch, nb, &pr, obs)?;
            obs.epoch_closed();
            interrupted = true;
            break;
        }
        if opts.verbose {
            obs.epoch_trained();
        }
        let train_secs = secs0 + t0.elapsed().as_secs_f64();
        if let Some(line) = times.report() {
            obs.line(&line);
        }
        let lr = run.opt.lr;
        let final_epoch = epoch + 1 == opts.epochs;

        // Validation of the EMA (batch halved on out-of-memory).
        let mut metrics = [0f64; 4];
        let mut val_loss = [0f32; 3];
        let mut validated = false;
        let tv = std::time::Instant::now();
        if (!opts.noval || final_epoch) && !vimages.is_empty() {
            // The captured training step holds a training forward's activations: release them
            // for validation (the next epoch captures again, see `train::graphed`).
            run.graphs.borrow_mut().reset();
            let map: HashMap<String, Tensor> = run.ema.state.iter().cloned().collect();
            eval_model.load_state_dict(&map)?;
            let mut vb = (run.micro * 2).max(1);
            let r = loop {
                match validate(
                    ValModel::Train {
                        model: &eval_model,
                        loss: &run.loss,
                    },
                    &vimages,
                    &ValConfig {
                        img: opts.img,
                        batch: vb,
                        progress: opts.verbose,
                        ..ValConfig::default()
                    },
                ) {
                    Ok(r) => break r,
                    Err(e) if is_oom(&e) && vb > 1 => {
                        pr.oom_events += 1;
                        obs.line(&format!(
                            "out of memory in validation at batch {vb}: retrying with {}",
                            vb / 2
                        ));
                        vb /= 2;
                    }
                    Err(e) => return Err(e),
                }
            };
            if opts.verbose {
                obs.text(&r.metrics.table(&cfg.names));
            }
            metrics = [
                r.metrics.mp,
                r.metrics.mr,
                r.metrics.map50,
                r.metrics.map50_95,
            ];
            val_loss = r.losses.unwrap_or_default();
            pr.skipped += r.skipped.len();
            validated = true;
        }
        let val_secs = tv.elapsed().as_secs_f64();
        let fi = crate::metrics::fitness(metrics[2], metrics[3]);
        // Without any validation image there is nothing to rank epochs by: the best weights are
        // the last ones (as the official trainer's best.pt with equal, zero fitness every epoch).
        let improved = fi > run.counters.best_fitness
            || run.counters.best_epoch.is_none()
            || (!validated && vimages.is_empty());
        if fi > run.counters.best_fitness {
            run.counters.best_fitness = fi;
        }
        if improved {
            run.counters.best_epoch = Some(epoch);
        }
        let peak_mem = run.probe.peak_bytes();
        if let Some(b) = &run.budget {
            if peak_mem > b.budget {
                obs.line(&format!(
                    "warning: epoch {} peaked at {} of {}, above the budget {}",
                    epoch + 1,
                    fmt_size(peak_mem),
                    run.probe.what(),
                    fmt_size(b.budget)
                ));
            }
        }
        let report = EpochReport {
            epoch,
            train_loss: pr.mloss.map(|v| v as f32),
            metrics,
            val_loss,
            lr,
            rss: crate::memory::process_rss_bytes(),
            peak_mem,
            skipped: pr.skipped,
            nan_events: pr.nan_events,
            oom_events: pr.oom_events,
            micro: run.micro,
            img_per_s: pr.images as f64 / train_secs.max(1e-9),
            validated,
        };
        append_results_csv(&run.run_dir, &report)?;
        if opts.verbose {
            obs.line(&report.summary(opts.epochs, train_secs, val_secs, run.probe.what(), fi));
        }
        reports.push(report);
        if !opts.noplots {
            let csv = run.run_dir.join("results.csv");
            let drawn = crate::train::plots::read_results_csv(&csv, "yolo9").and_then(|c| {
                crate::train::plots::plot_results(&[c], &run.run_dir.join("results.png"))
            });
            if let Err(e) = drawn {
                obs.line(&format!("warning: results.png not drawn: {e:#}"));
            }
        }

        // Save (last, best, periodic, state).
        if run.save(epoch + 1, 0, &EpochProgress::default(), obs)? {
            if improved {
                copy_atomic(&run.last, &run.best)?;
            }
            if opts.save_period > 0 && (epoch + 1) % opts.save_period as usize == 0 {
                copy_atomic(&run.last, &wdir.join(format!("epoch{epoch}.safetensors")))?;
            }
        }

        if let Some(be) = run.counters.best_epoch {
            if epoch >= be + opts.patience {
                obs.line(&format!(
                    "stopping early: no improvement in {} epochs (best epoch {})",
                    opts.patience,
                    be + 1
                ));
                obs.epoch_closed();
                break;
            }
        }
        obs.epoch_closed();
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
        run_dir: run.run_dir.clone(),
        epochs: reports,
        best_fitness: run.counters.best_fitness,
        last: run.last.clone(),
        best: run.best.clone(),
        interrupted,
        budget: run.budget.clone(),
    })
}
