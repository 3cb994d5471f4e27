//! Everything before the first batch of a run: resume resolution (the arguments and state of an
//! earlier run), option checks and hyperparameters, the device, the dataset scan, the batch and
//! micro-batch (from the state, from measured memory or as given), then model, loss, optimizer
//! and EMA (restored on `--resume`), the run folder and its files, and the loader.
//!
//! Why one file (about 950 lines): the two phases before training, [`resolve`] (what the run is:
//! options, resume state, device, scan, batch sizing) and [`build`] (what it runs on: model, loss,
//! optimizer, EMA, run folder, loader), share the `Resolved` hand-over and are read in order; the
//! training engine's other parts (`step`, `epoch`, `state`, `report`) are their own files.

use crate::budget::{BudgetDecision, AUTO_SHARE};
use crate::data::image::load_rgb8;
use crate::data::loader::{
    batches_per_epoch, default_workers, DecodeFn, Loader, LoaderConfig, TrainItem,
};
use crate::data::scan::{scan_split, ScanOptions};
use crate::data::yaml::{DataConfig, Split};
use crate::loss::tal_loss::GAINS;
use crate::loss::DualTalLoss;
use crate::memory::{fmt_size, MemoryProbe};
use crate::metrics::validate::{val_images, ValImage};
use crate::model::weights::{Weights, STRIDES};
use crate::model::yolov9::YoloV9Train;
use crate::runs::increment_path;
use crate::train::budget::{plan_cancellable, BudgetRequest};
use crate::train::cache::{cache_bytes, check_fits, RamCache};
use crate::train::checkpoint::{load_state, TrainState};
use crate::train::ema::Ema;
use crate::train::epoch::Val;
use crate::train::guard::{Faults, GoodState, Phase, StopFlag};
use crate::train::observer::TrainObserver;
use crate::train::optimizer::{Optimizer, OptimizerKind, ADAM_BETA2};
use crate::train::options::{freeze_prefixes, Hyp, ImageCache, TrainOptions};
use crate::train::report::create_results_csv;
use crate::train::schedule::Schedule;
use crate::train::state::{restore, Resumed, Run, RunFiles, Session, Sizing, Start};
use anyhow::{ensure, Context, Result};
use candle_core::Device;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What [`resolve`] found besides the final options: the saved state of a resumed run, the
/// data, the device and the sizing.
pub(crate) struct Resolved {
    state: Option<TrainState>,
    run_dir: PathBuf,
    hyp: Hyp,
    device: Device,
    cfg: DataConfig,
    items: Vec<TrainItem>,
    /// Width and height of each of `items` (from the scan), for the `--cache ram` estimate.
    item_dims: Vec<(u32, u32)>,
    vimages: Vec<ValImage>,
    probe: MemoryProbe,
    micro: usize,
    budget: Option<BudgetDecision>,
    faults: Faults,
    /// The initial weights (`--weights`), read once.
    weights: Option<Weights>,
    /// The training graph of the run (`--cfg`, the weights' model, or yolov9-s).
    arch: std::sync::Arc<crate::model::Arch>,
}

/// A run ready for its first batch.
pub(crate) struct Prepared<'a> {
    /// The run's state.
    pub run: Run<'a>,
    /// The training images.
    pub loader: Loader,
    /// What validation needs.
    pub val: Val,
    /// Where the run starts.
    pub start: Start,
}

/// The run's final options (`opts`, or the arguments of the run `--resume` names, with the
/// batch sized), checked, and what was read to get them.
///
/// The scan and the sizing ask `stop` as they go: a stop request ends them with
/// [`crate::cancel::Stopped`] in the error chain.
pub(crate) fn resolve(
    opts: &TrainOptions,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<(TrainOptions, Resolved)> {
    let faults = if opts.faults.is_empty() {
        Faults::from_env()?
    } else {
        opts.faults.clone()
    };
    // Resume: restore the arguments and the state of an earlier run.
    let (mut opts, state, run_dir) = match &opts.resume {
        Some(r) => resume_args(opts, r, obs)?,
        None => {
            let dir = increment_path(&opts.project, &opts.name, opts.exist_ok);
            (opts.clone(), None, dir)
        }
    };
    check_options(&opts)?;
    let hyp = load_hyp(&opts, obs)?;
    let (device, notice) = crate::device::open(opts.device)?;
    if let Some(n) = notice {
        obs.note(&n);
    }
    check_step_fits(&opts, state.as_ref(), &device)?;
    let data = scan_data(&opts, &faults, stop, obs)?;

    // The model: the weights (read once, here) and the training graph they or --cfg name.
    let (weights, arch) = load_model(&opts)?;

    // Batch and micro-batch: from the state, from measured memory, or as given.
    let probe = MemoryProbe::new(&device)?;
    let (micro, budget) = match &state {
        Some(st) => {
            if let Some(d) = &st.meta.budget {
                crate::budget::keep_cache_within(d, &probe);
            }
            (st.meta.micro, st.meta.budget.clone())
        }
        None if opts.budget.is_some() || opts.batch == 0 => {
            if faults.stop_in == Some(Phase::Sizing) {
                stop.request();
            }
            let d = size_batch(&opts, &hyp, &data, &arch, &device, &probe, stop, obs)?;
            if opts.batch == 0 {
                opts.batch = d.micro;
            }
            (d.micro, Some(d))
        }
        None => (opts.micro_batch.unwrap_or(opts.batch), None),
    };
    ensure!(opts.batch >= 1, "--batch must be at least 1 (or auto)");
    let micro = micro.clamp(1, opts.batch);
    tracing::info!(
        device = %crate::device::name_of(&device),
        batch = opts.batch,
        micro,
        img = opts.img,
        resumed = state.is_some(),
        "training run resolved"
    );
    Ok((
        opts,
        Resolved {
            state,
            run_dir,
            hyp,
            device,
            cfg: data.cfg,
            items: data.items,
            item_dims: data.item_dims,
            vimages: data.vimages,
            probe,
            micro,
            budget,
            faults,
            weights,
            arch,
        },
    ))
}

/// The run folder under `project` whose `weights/state.safetensors` was written last (`--resume`
/// without a value). Errors: there is none, naming the folder searched.
fn latest_run(project: &Path) -> Result<PathBuf> {
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(project)
        .with_context(|| {
            format!(
                "--resume: cannot list {} to find the most recent run; pass --resume RUN_FOLDER",
                crate::text::path(&project)
            )
        })?
        .flatten()
    {
        let state = e.path().join("weights").join("state.safetensors");
        if let Ok(t) = std::fs::metadata(&state).and_then(|m| m.modified()) {
            if best.as_ref().is_none_or(|(b, _)| t > *b) {
                best = Some((t, e.path()));
            }
        }
    }
    best.map(|(_, p)| p).with_context(|| {
        format!(
            "--resume: no run under {} has weights/state.safetensors; pass --resume RUN_FOLDER \
             (or --project where the runs are)",
            crate::text::path(&project)
        )
    })
}

/// `--resume r`: the arguments of the run `r` names (with `--data` and `--epochs` of `opts`
/// applied), its saved state and its folder.
fn resume_args(
    opts: &TrainOptions,
    r: &Path,
    obs: &mut dyn TrainObserver,
) -> Result<(TrainOptions, Option<TrainState>, PathBuf)> {
    let latest;
    let r = if r.as_os_str() == crate::train::options::RESUME_LATEST {
        latest = latest_run(&opts.project)?;
        obs.line(&format!(
            "--resume: the most recent run under {} is {}",
            crate::text::path(&opts.project),
            crate::text::path(&latest)
        ));
        latest.as_path()
    } else {
        r
    };
    let ckpt = if r.is_dir() {
        r.join("weights").join("state.safetensors")
    } else {
        // `--resume runs/train/exp/weights/last.safetensors` (or best): the run's state is the
        // state.safetensors beside it; last/best hold weights only.
        let beside = r.with_file_name("state.safetensors");
        let weights_only = matches!(
            r.file_name().and_then(|n| n.to_str()),
            Some("last.safetensors" | "best.safetensors")
        );
        if weights_only && beside.is_file() {
            obs.line(&format!(
                "--resume {}: resuming from the run's state, {}",
                crate::text::path(&r),
                crate::text::path(&beside)
            ));
            beside
        } else {
            r.to_path_buf()
        }
    };
    let st = load_state(&ckpt).with_context(|| {
        format!(
            "--resume {}: cannot read the training state",
            crate::text::path(&r)
        )
    })?;
    let mut o: TrainOptions = serde_json::from_value(st.meta.args.clone())
        .with_context(|| format!("{}: bad run arguments", crate::text::path(&ckpt)))?;
    o.resume = Some(ckpt.clone());
    o.verbose = opts.verbose;
    // `--data` given with `--resume`: the dataset moved (or is a copy); use it instead of
    // the path stored in the run. The images must be the same for an exact resume.
    if !opts.data.as_os_str().is_empty() && opts.data != o.data {
        if opts.verbose {
            obs.line(&format!(
                "resume: using --data {} instead of the run's {}",
                crate::text::path(&opts.data),
                crate::text::path(&o.data)
            ));
        }
        o.data = opts.data.clone();
    }
    let dir = ckpt
        .parent()
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
        .with_context(|| format!("{}: not inside RUN/weights/", crate::text::path(&ckpt)))?;
    if let Some(e) = opts.extend_epochs {
        ensure!(
            e >= st.meta.epoch.max(1),
            "--resume {} --epochs {e}: the run has already done {} epochs",
            crate::text::path(&r),
            st.meta.epoch
        );
        o.epochs = e;
    }
    ensure!(
        st.meta.epoch < o.epochs,
        "--resume {}: the run already finished its {} epochs; to train it longer, \
         resume with more epochs: yolo9 train --resume {} --epochs {}",
        crate::text::path(&r),
        o.epochs,
        crate::text::path(&dir),
        o.epochs * 2
    );
    Ok((o, Some(st), dir))
}

/// The checks of the final options that need nothing read.
fn check_options(opts: &TrainOptions) -> Result<()> {
    ensure!(opts.epochs >= 1, "--epochs must be at least 1");
    ensure!(
        opts.img >= 32 && opts.img.is_multiple_of(32),
        "--img {} must be a positive multiple of 32 (the largest stride)",
        opts.img
    );
    ensure!(
        opts.save_interval >= 0.0 && opts.save_interval.is_finite(),
        "--save-interval {} must be a number of minutes >= 0",
        opts.save_interval
    );
    ensure!(opts.nan_patience >= 1, "--nan-patience must be at least 1");
    Ok(())
}

/// The hyperparameters (`--hyp`, or the defaults), with a warning for each loss gain that
/// differs from the official one the loss uses.
fn load_hyp(opts: &TrainOptions, obs: &mut dyn TrainObserver) -> Result<Hyp> {
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
    Ok(hyp)
}

/// The size against the memory, before the scan: a step that cannot fit is refused now.
/// Budget sizing (and `--batch auto`) starts from one image; a resumed run keeps its micro-batch.
fn check_step_fits(opts: &TrainOptions, state: Option<&TrainState>, device: &Device) -> Result<()> {
    let (images, batch_option) = match state {
        Some(st) => (st.meta.micro, "--micro-batch"),
        None if opts.budget.is_some() || opts.batch == 0 => (1, "--batch"),
        None => match opts.micro_batch {
            Some(m) => (m.min(opts.batch), "--micro-batch"),
            None => (opts.batch, "--batch"),
        },
    };
    crate::footprint::check_device(
        &crate::footprint::Request {
            what: "a training step",
            work: crate::footprint::Work::Train,
            img: opts.img,
            images,
            batch_option: Some(batch_option),
            split_option: (batch_option == "--batch").then_some("--micro-batch"),
        },
        device,
        opts.budget,
    )
}

/// The dataset of a run, as [`scan_data`] read it.
struct Data {
    cfg: DataConfig,
    items: Vec<TrainItem>,
    /// Width and height of each of `items`.
    item_dims: Vec<(u32, u32)>,
    vimages: Vec<ValImage>,
}

/// The dataset: its yaml, the scans of both splits, `--single-cls` and `--min-items` applied.
fn scan_data(
    opts: &TrainOptions,
    faults: &Faults,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<Data> {
    let mut cfg = DataConfig::load(&opts.data)?;
    if faults.stop_in == Some(Phase::Scan) {
        stop.request();
    }
    let scan_opts = ScanOptions {
        use_cache: true,
        print: false,
        cancel: stop.cancel(),
    };
    if let (Some(c), true) = (&cfg.coco, opts.verbose) {
        obs.line(&c.mapping_line(&cfg.names));
    }
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
    // `--single-cls` (official): one class, `item` unless the dataset has one name already.
    let class_of = |c: u32| if opts.single_cls { 0 } else { c };
    if opts.single_cls {
        if cfg.names.len() != 1 {
            cfg.names = vec!["item".to_string()];
        }
        if opts.verbose {
            obs.line(&format!(
                "--single-cls: training the {} classes of {} as one class `{}`",
                cfg.nc,
                crate::text::path(&cfg.yaml_path),
                cfg.names[0]
            ));
        }
        cfg.nc = 1;
    }
    let item_dims: Vec<(u32, u32)> = train_scan
        .records
        .iter()
        .filter(|r| r.boxes.len() >= opts.min_items)
        .map(|r| (r.width, r.height))
        .collect();
    let items: Vec<TrainItem> = train_scan
        .records
        .iter()
        .filter(|r| r.boxes.len() >= opts.min_items)
        .map(|r| TrainItem {
            path: r.image.clone(),
            labels: r
                .boxes
                .iter()
                .map(|b| (class_of(b.cls), [b.cx, b.cy, b.w, b.h]))
                .collect(),
            outlines: r.segments.clone(),
        })
        .collect();
    ensure!(
        items.iter().any(|i| !i.labels.is_empty()),
        "{}: no train image with a valid box (after --min-items {}); run `yolo9 check --data {}`",
        crate::text::path(&cfg.yaml_path),
        opts.min_items,
        crate::text::path(&cfg.yaml_path)
    );
    let mut vimages = val_scan.as_ref().map(val_images).unwrap_or_default();
    if opts.single_cls {
        for l in vimages.iter_mut().flat_map(|v| v.labels.iter_mut()) {
            l.0 = 0;
        }
    }
    if vimages.is_empty() && opts.verbose {
        obs.line(&format!(
            "warning: the validation split of {} has no usable image: no metrics will be computed, \
             and best.safetensors will be the last epoch's weights",
            crate::text::path(&cfg.yaml_path)
        ));
    }
    Ok(Data {
        cfg,
        items,
        item_dims,
        vimages,
    })
}

/// The initial weights (`--weights`, read once) and the training graph: `--cfg`, else the
/// weights' model, else yolov9-s.
fn load_model(opts: &TrainOptions) -> Result<(Option<Weights>, Arc<crate::model::Arch>)> {
    let weights = match &opts.weights {
        Some(p) => {
            Some(Weights::load(p).with_context(|| format!("--weights {}", crate::text::path(&p)))?)
        }
        None => None,
    };
    let arch = match (&opts.cfg, &weights) {
        (Some(c), _) => crate::model::Arch::from_cfg(c)?,
        (None, Some(w)) => crate::model::yolov9::training_arch(&w.meta.arch)?,
        (None, None) => crate::model::weights::default_arch(crate::model::weights::Graph::Train),
    };
    Ok((weights, arch))
}

/// `--budget` or `--batch auto` on a new run: the micro-batch (and batch) measured to fit the
/// budget (`--budget`, else a share of the free memory) for the images of `data`.
#[allow(clippy::too_many_arguments)]
fn size_batch(
    opts: &TrainOptions,
    hyp: &Hyp,
    data: &Data,
    arch: &Arc<crate::model::Arch>,
    device: &Device,
    probe: &MemoryProbe,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<BudgetDecision> {
    let budget = match opts.budget {
        Some(b) => b,
        None => (probe.free_bytes() as f64 * AUTO_SHARE) as u64,
    };
    let (cfg, items) = (&data.cfg, &data.items);
    let max_labels = items.iter().map(|i| i.labels.len()).max().unwrap_or(1);
    let d = plan_cancellable(
        &BudgetRequest {
            nc: cfg.nc,
            img: opts.img,
            targets_per_image: targets_per_sample(max_labels, hyp),
            max_batch: if opts.batch == 0 {
                64.min(items.len())
            } else {
                opts.batch
            },
            budget,
            seed: opts.seed,
            amp: opts.amp,
            arch: arch.clone(),
            graphs: crate::train::graphed::StepGraphs::new().applies_to(device),
            fixed_batch: opts.batch != 0,
        },
        device,
        probe,
        &stop.cancel(),
    )
    .with_context(|| format!("sizing the batch for --budget {}", fmt_size(budget)))?;
    if opts.verbose {
        obs.line(&d.describe());
    }
    Ok(d)
}

/// The most labels one training sample can carry when no image has more than `max_labels`:
/// a mosaic joins four images and a mixup blends a second mosaic into a mosaic sample (official
/// `__getitem__`: mixup only inside the mosaic branch; `crate::data::augment`), so 4× with
/// mosaic and 8× with mosaic and mixup. The budget probe's synthetic batches carry this many per
/// image, and a budgeted run's CUDA graphs start with room for it.
pub(crate) fn targets_per_sample(max_labels: usize, hyp: &Hyp) -> usize {
    let per = match (hyp.augment.mosaic > 0.0, hyp.augment.mixup > 0.0) {
        (true, true) => 8,
        (true, false) => 4,
        (false, _) => 1,
    };
    (per * max_labels).max(1)
}

/// Builds the run of the final options `opts`: model, loss, optimizer and EMA (restored from the
/// saved state on `--resume`), the run folder, the loader.
///
/// `--cache ram` asks `stop` while it fills: a request ends it with [`crate::cancel::Stopped`]
/// in the error chain.
pub(crate) fn build<'a>(
    opts: &'a TrainOptions,
    mut r: Resolved,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
    rank0: bool,
) -> Result<Prepared<'a>> {
    if r.state.is_none() && rank0 {
        refuse_inputs_in_run_dir(opts, &r)?;
    }
    // Model, loss, optimizer, EMA.
    let Parts {
        model,
        loss,
        sched,
        opt,
        ema,
        resumed,
        eval_model,
    } = parts(opts, &mut r, obs)?;

    // Outputs (rank 0 of a data-parallel run alone writes them).
    let (wdir, lock) = claim_outputs(opts, &mut r.run_dir, r.state.is_none(), rank0, obs)?;
    let args_json = serde_json::to_value(opts)?;
    if r.state.is_none() && rank0 {
        write_run_files(opts, &r, obs)?;
    }

    // Loader (segmentation models: with the overlap masks).
    let mask_ratio = r.arch.seg().map(|_| crate::data::polygons::MASK_RATIO);
    let Resolved {
        run_dir,
        hyp,
        device,
        cfg,
        items,
        item_dims,
        vimages,
        probe,
        micro,
        budget,
        faults,
        ..
    } = r;
    let loader = loader(opts, (items, mask_ratio), &item_dims, &hyp, stop, obs)?;
    let nb = batches_per_epoch(loader.len(), opts.batch);
    if opts.verbose {
        obs.line(&format!(
            "training {} images ({} batches of {}, micro-batch {}, accumulate {} for nominal batch 64) \
             at {}x{} for {} epochs on {}{}; run folder {}",
            loader.len(),
            nb,
            opts.batch,
            micro,
            sched.accumulate(opts.batch),
            opts.img,
            opts.img,
            opts.epochs,
            crate::device::name_of(&device),
            if model.amp() { " with mixed precision (bf16)" } else { "" },
            crate::text::path(&run_dir)
        ));
    }
    let good = GoodState::take(&model, &opt, &ema, "the start of this run".into())?;
    let Resumed {
        start,
        counters,
        acc,
    } = resumed;
    let run = Run {
        opts,
        device: device.clone(),
        model,
        loss,
        opt,
        ema,
        sched,
        probe,
        faults,
        files: RunFiles {
            last: wdir.join("last.safetensors"),
            best: wdir.join("best.safetensors"),
            state: wdir.join("state.safetensors"),
            dir: run_dir,
            args_json,
            _lock: lock,
        },
        sizing: Sizing {
            batches: nb,
            batch: opts.batch,
            micro,
            budget,
        },
        counters,
        nan_streak: 0,
        acc,
        good,
        graphs: Default::default(),
        session: Session {
            started: std::time::Instant::now(),
            first_epoch: start.epoch,
        },
        comm: None,
        rank0,
    };
    choose_step_launch(&run, obs);
    Ok(Prepared {
        run,
        loader,
        val: Val {
            model: eval_model,
            images: vimages,
            names: cfg.names,
        },
        start,
    })
}

/// What a run trains and evaluates, from [`parts`].
struct Parts {
    model: YoloV9Train,
    loss: DualTalLoss,
    sched: Schedule,
    opt: Optimizer,
    ema: Ema,
    resumed: Resumed,
    /// The model validation runs (it receives the EMA state before each validation).
    eval_model: YoloV9Train,
}

/// Model, loss, schedule, optimizer and EMA (restored from the saved state on `--resume`), and
/// the model validation runs; the initial weights of `r` are dropped once read.
fn parts(opts: &TrainOptions, r: &mut Resolved, obs: &mut dyn TrainObserver) -> Result<Parts> {
    let model = YoloV9Train::build(
        &r.arch,
        r.weights.as_ref(),
        r.cfg.nc,
        r.cfg.names.clone(),
        &r.device,
        opts.seed,
    )?;
    // AMP is the default and applies on CUDA only; the run's header line says when it is on.
    model.set_amp(opts.amp);
    if let (Some(w), None) = (&opts.weights, &r.state) {
        for l in transfer_lines(&model, w, r.weights.as_ref().map(|w| w.meta.nc)) {
            obs.line(&l);
        }
    }
    let loss = DualTalLoss::new(r.cfg.nc, &STRIDES)?.with_label_smoothing(opts.label_smoothing)?;
    let sched = Schedule {
        epochs: opts.epochs,
        lr0: r.hyp.lr0,
        lrf: r.hyp.lrf,
        momentum: r.hyp.momentum,
        warmup_epochs: r.hyp.warmup_epochs,
        warmup_momentum: r.hyp.warmup_momentum,
        warmup_bias_lr: r.hyp.warmup_bias_lr,
        cos_lr: opts.cos_lr,
        nbs: 64,
    };
    let (mut opt, frozen_names) = optimizer(opts, &r.hyp, &sched, &model, obs);
    let mut ema = Ema::new(&model.float_state()?)?;
    ema.freeze(&frozen_names);
    let resumed = match &r.state {
        Some(st) => {
            let res = restore(st, &model, &mut opt, &mut ema, &r.device)?;
            obs.line(&format!(
                "resuming at epoch {} batch {} (best fitness {:.5}, micro-batch {})",
                res.start.epoch + 1,
                res.start.batch,
                res.counters.best_fitness,
                r.micro
            ));
            res
        }
        None => Resumed::default(),
    };
    drop(r.weights.take());
    let eval_model = YoloV9Train::build(
        &r.arch,
        None,
        r.cfg.nc,
        r.cfg.names.clone(),
        &r.device,
        opts.seed,
    )?;
    Ok(Parts {
        model,
        loss,
        sched,
        opt,
        ema,
        resumed,
        eval_model,
    })
}

/// `--exist-ok` on a new run reuses the folder: it must not hold anything this run reads.
fn refuse_inputs_in_run_dir(opts: &TrainOptions, r: &Resolved) -> Result<()> {
    let labels: Vec<PathBuf> = r
        .items
        .iter()
        .map(|i| crate::data::scan::label_path_for(&i.path))
        .collect();
    let inputs = [Some(&opts.data), opts.hyp.as_ref(), opts.weights.as_ref()]
        .into_iter()
        .flatten()
        .chain(r.items.iter().map(|i| &i.path))
        .chain(&labels)
        .chain(r.vimages.iter().map(|i| &i.path))
        .map(PathBuf::as_path);
    crate::runs::refuse_reused_dir(&opts.project, &opts.name, opts.exist_ok, inputs)?;
    Ok(())
}

/// The optimizer over the parameters `--freeze` leaves trainable, and the names of the frozen
/// ones (for the EMA). The frozen parameters stay out of the optimizer (no update, no weight
/// decay) and out of the EMA averaging.
fn optimizer(
    opts: &TrainOptions,
    hyp: &Hyp,
    sched: &Schedule,
    model: &YoloV9Train,
    obs: &mut dyn TrainObserver,
) -> (Optimizer, Vec<String>) {
    let wd = sched.scaled_weight_decay(hyp.weight_decay, opts.batch);
    let prefixes = freeze_prefixes(&opts.freeze);
    let (frozen, params): (Vec<_>, Vec<_>) = model
        .vars()
        .iter()
        .map(|v| (v.name.clone(), v.var.clone()))
        .partition(|(n, _)| prefixes.iter().any(|p| n.starts_with(p.as_str())));
    if !prefixes.is_empty() {
        let count: usize = frozen.iter().map(|(_, v)| v.elem_count()).sum();
        let layers = frozen_layers(&frozen);
        obs.line(&format!(
            "--freeze: {} parameter tensors ({count} values) of {} layers frozen: {}",
            frozen.len(),
            layers.len(),
            if layers.is_empty() {
                "none (no layer of the model has those indices)".to_string()
            } else {
                layers.join(", ")
            }
        ));
    }
    let frozen_names: Vec<String> = frozen.into_iter().map(|(n, _)| n).collect();
    let opt = Optimizer::with_kind(opts.optimizer, params, hyp.lr0, hyp.momentum, wd);
    if opts.optimizer != OptimizerKind::Sgd && opts.verbose {
        obs.line(&format!(
            "optimizer: {}(lr={}, betas=({}, {ADAM_BETA2})) with parameter groups {} bias, {} \
             weight (decay {wd:.3e}), {} BatchNorm weight",
            opts.optimizer.name(),
            hyp.lr0,
            hyp.momentum,
            opt.group_sizes()[0],
            opt.group_sizes()[1],
            opt.group_sizes()[2],
        ));
    }
    (opt, frozen_names)
}

/// The run folder's `weights/` folder, created (on rank 0) and cleared of the temporary files of
/// an interrupted checkpoint write. A new run claims its folder first (`run_dir` becomes the one
/// claimed), exclusively: another run started meanwhile with the same --project/--name gets the
/// next one instead of sharing it. Rank 0 then locks the folder for the run's life
/// ([`crate::runs::lock_run_dir`]): a second `--resume` of the run or a second `--exist-ok` run
/// into it is refused, naming this process.
fn claim_outputs(
    opts: &TrainOptions,
    run_dir: &mut PathBuf,
    new_run: bool,
    rank0: bool,
    obs: &mut dyn TrainObserver,
) -> Result<(PathBuf, Option<crate::runs::RunLock>)> {
    if new_run && rank0 {
        *run_dir = crate::runs::claim_run_dir(&opts.project, &opts.name, opts.exist_ok)
            .with_context(|| {
                format!(
                    "{}: cannot create the run folder",
                    crate::text::path(&run_dir)
                )
            })?;
    }
    let lock = if rank0 {
        Some(crate::runs::lock_run_dir(run_dir)?)
    } else {
        None
    };
    let wdir = run_dir.join("weights");
    if rank0 {
        std::fs::create_dir_all(&wdir).with_context(|| {
            format!("{}: cannot create the run folder", crate::text::path(&wdir))
        })?;
    }
    // Temporary files of a writer killed mid-checkpoint (the checkpoints themselves are intact).
    if let Some(entries) = rank0.then(|| std::fs::read_dir(&wdir).ok()).flatten() {
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
    Ok((wdir, lock))
}

/// A new run's files in its folder: `args.yaml`, `hyp.yaml`, the header of `results.csv` and
/// (without `--noplots`) `labels.jpg`.
fn write_run_files(opts: &TrainOptions, r: &Resolved, obs: &mut dyn TrainObserver) -> Result<()> {
    let run_dir = &r.run_dir;
    // Through `outfile`, like every output: never onto the run's inputs (`--data`, `--hyp`,
    // `--weights`), only over a regular file, atomically.
    let inputs = crate::outfile::Inputs::of(
        std::iter::once(opts.data.clone())
            .chain(opts.hyp.clone())
            .chain(opts.weights.clone()),
    );
    // The run's arguments with the environment switches that change what it computes.
    let mut args = opts.clone();
    args.switches = crate::switches::recorded();
    for (name, text) in [
        ("args.yaml", serde_yaml_ng::to_string(&args)?),
        ("hyp.yaml", serde_yaml_ng::to_string(&r.hyp)?),
    ] {
        crate::outfile::write(&run_dir.join(name), text.as_bytes(), &inputs)
            .with_context(|| format!("{}: cannot write {name}", crate::text::path(&run_dir)))?;
    }
    create_results_csv(run_dir, r.arch.seg().is_some())?;
    if !opts.noplots {
        // labels.jpg: the training labels at a glance (official `plot_labels`).
        let boxes: Vec<(u32, [f32; 4])> = r
            .items
            .iter()
            .flat_map(|i| i.labels.iter().copied())
            .collect();
        let p = run_dir.join("labels.jpg");
        if let Err(e) = crate::metrics::plots::plot_labels(&boxes, &r.cfg.names, &p) {
            obs.line(&format!("warning: labels.jpg not drawn: {e:#}"));
        }
    }
    Ok(())
}

/// The loader of the training images (`items`, of sizes `item_dims`), through the `--cache ram`
/// cache when it fits.
fn loader(
    opts: &TrainOptions,
    (items, mask_ratio): (Vec<TrainItem>, Option<usize>),
    item_dims: &[(u32, u32)],
    hyp: &Hyp,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<Loader> {
    let workers = if opts.workers == 0 {
        default_workers()
    } else {
        opts.workers
    };
    let decode: Arc<DecodeFn> = Arc::new(|p: &Path| load_rgb8(p));
    let (decode, cached) = match opts.cache {
        ImageCache::Ram => match ram_cache(&items, item_dims, &decode, opts, workers, stop, obs)? {
            Some(c) => (c.decode_fn(decode, opts.img), true),
            None => (decode, false),
        },
        ImageCache::None => (decode, false),
    };
    let loader = Loader::new(
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
            mask_ratio,
        },
    )?;
    Ok(if cached {
        loader.with_resized_source()
    } else {
        loader
    })
}

/// Whether the run's step is replayed from CUDA graphs (`train::graphed`) or launched ordinarily,
/// set on `run.graphs` and (verbose, CUDA) said.
///
/// The replay holds the captured step's memory in the graphs' own pool, beside what the ordinary
/// phases keep: under a memory budget it runs only when the sizing measured it and chose it
/// (`train::budget`), at the micro-batch sized for it.
fn choose_step_launch(run: &Run, obs: &mut dyn TrainObserver) {
    // A segmentation step is not captured (its mask loss runs per image with ordinary launches).
    let graphed = !run.model.is_seg()
        && run.graphs.borrow().applies_to(&run.device)
        && run.sizing.budget.as_ref().is_none_or(|d| d.graphed);
    if !graphed {
        run.graphs.borrow_mut().disable();
    }
    // Without a budget the capture survives validation and the epoch's last partial batch;
    // with one, the captures start at the GT rows the sizing measured.
    run.graphs
        .borrow_mut()
        .set_keep(run.sizing.budget.is_none());
    if let Some(d) = &run.sizing.budget {
        run.graphs.borrow_mut().reserve_rows(d.gt_rows);
    }
    if run.opts.verbose && run.device.is_cuda() {
        let how = match (graphed, &run.sizing.budget) {
            (true, None) => {
                "replayed from CUDA graphs (YOLO9_TRAIN_GRAPH=0 turns that off)".to_string()
            }
            (true, Some(d)) => format!(
                "replayed from CUDA graphs at micro-batch {}, sized for them under the memory \
                 budget",
                d.micro
            ),
            (false, Some(d)) => match &d.choice {
                Some(c) => format!("ordinary launches under the memory budget ({c})"),
                None => "ordinary launches (sized for them under the memory budget)".to_string(),
            },
            (false, None) if run.model.is_seg() => {
                "ordinary launches (segmentation steps are not replayed from CUDA graphs)"
                    .to_string()
            }
            (false, None) => "ordinary launches".to_string(),
        };
        obs.line(&format!("training step: {how}"));
    }
}

/// The lines that say what `--weights` gave the model (official `Transferred N/M items`, after
/// `intersect_dicts`): how many tensors came from the file, which ones were re-initialised
/// because the file has them with another shape (with both shapes; for other class counts
/// the class convs of the head), and how many the file lacks.
fn transfer_lines(model: &YoloV9Train, w: &Path, weights_nc: Option<usize>) -> Vec<String> {
    let n = model.state_dict().map(|sd| sd.len()).unwrap_or(0);
    let init = model.initialized();
    let mut out = vec![format!(
        "transferred {}/{} tensors from {} (those whose name and shape match)",
        n.saturating_sub(init.len()),
        n,
        crate::text::path(&w)
    )];
    let reshaped = model.reshaped();
    if !reshaped.is_empty() {
        let why = match weights_nc {
            Some(wnc) if wnc != model.meta().nc => format!(
                "the weights have {wnc} classes, this model {}",
                model.meta().nc
            ),
            _ => "their shapes differ".to_string(),
        };
        let list: Vec<String> = reshaped
            .iter()
            .map(|(n, from, to)| format!("{n} {from:?} -> {to:?}"))
            .collect();
        out.push(format!(
            "re-initialised {} tensors because {why}: {}",
            reshaped.len(),
            list.join(", ")
        ));
    }
    let absent: Vec<&String> = init
        .iter()
        .filter(|n| !reshaped.iter().any(|(r, _, _)| r == *n))
        .collect();
    if !absent.is_empty() {
        out.push(format!(
            "initialised {} tensors absent from the weights: {}{}",
            absent.len(),
            absent
                .iter()
                .take(6)
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            if absent.len() > 6 { ", ..." } else { "" }
        ));
    }
    out
}

/// The layers (`model.N`) that the frozen parameters belong to, in order.
fn frozen_layers(frozen: &[(String, candle_core::Var)]) -> Vec<String> {
    let mut layers: Vec<String> = Vec::new();
    for (n, _) in frozen {
        let layer: String = n.splitn(3, '.').take(2).collect::<Vec<_>>().join(".");
        if !layers.contains(&layer) {
            layers.push(layer);
        }
    }
    layers
}

/// `--cache ram`: the memory check, then the fill; `None` (with the warning line) when the
/// images would not fit in the available memory.
fn ram_cache(
    items: &[TrainItem],
    dims: &[(u32, u32)],
    decode: &Arc<DecodeFn>,
    opts: &TrainOptions,
    workers: usize,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
) -> Result<Option<RamCache>> {
    let needed = cache_bytes(dims, opts.img);
    let Some(available) = crate::memory::available_bytes() else {
        obs.line(
            "warning: --cache ram: the available memory is not known on this system: not caching \
             images (training decodes them as without --cache)",
        );
        return Ok(None);
    };
    if let Err(why) = check_fits(needed, available) {
        obs.line(&why);
        return Ok(None);
    }
    let t = std::time::Instant::now();
    let paths: Vec<PathBuf> = items.iter().map(|i| i.path.clone()).collect();
    let cache = RamCache::fill(&paths, decode.as_ref(), opts.img, workers, &stop.cancel())?;
    if opts.verbose {
        obs.line(&format!(
            "--cache ram: {} of {} training images cached ({}) in {:.1} s",
            cache.len(),
            items.len(),
            fmt_size(cache.bytes()),
            t.elapsed().as_secs_f64()
        ));
    }
    Ok(Some(cache))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget probe's targets per image: BCCD's busiest image has 28 labels, so a sample of
    /// the default augmentation (mosaic 1.0, mixup 0.15) can carry 4 · 2 · 28 = 224 (a 16x BCCD
    /// run grew its graphs' GT capacity to 256 rows per image, past the 4× = 112 the probe
    /// measured before).
    #[test]
    fn targets_per_sample_count_mosaic_and_mixup() {
        let mut hyp = Hyp::default();
        assert_eq!((hyp.augment.mosaic, hyp.augment.mixup), (1.0, 0.15));
        assert_eq!(targets_per_sample(28, &hyp), 224);
        hyp.augment.mixup = 0.0;
        assert_eq!(targets_per_sample(28, &hyp), 112);
        hyp.augment.mosaic = 0.0;
        assert_eq!(targets_per_sample(28, &hyp), 28);
        // Mixup blends mosaics only: without mosaic a sample is one image.
        hyp.augment.mixup = 0.5;
        assert_eq!(targets_per_sample(28, &hyp), 28);
        // A dataset of background images still gets one synthetic target per image.
        assert_eq!(targets_per_sample(0, &hyp), 1);
    }
}
