//! Everything before the first batch of a run: resume resolution (the arguments and state of an
//! earlier run), option checks and hyperparameters, the device, the dataset scan, the batch and
//! micro-batch (from the state, from measured memory or as given), then model, loss, optimizer
//! and EMA (restored on `--resume`), the run folder and its files, and the loader.
//!
//! Why one file (about 750 lines): the two phases before training, [`resolve`] (what the run is:
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
use crate::train::state::{restore, Resumed, Run, Start};
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
    let (device, notice) = crate::device::open(opts.device)?;
    if let Some(n) = notice {
        obs.note(&n);
    }
    // The size against the memory, before the scan: a step that cannot fit is refused now.
    // Budget sizing (and `--batch auto`) starts from one image; a resumed run keeps its micro-batch.
    let (images, batch_option) = match &state {
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
        &device,
        opts.budget,
    )?;
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
                cfg.yaml_path.display(),
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
        })
        .collect();
    ensure!(
        items.iter().any(|i| !i.labels.is_empty()),
        "{}: no train image with a valid box (after --min-items {}); run `yolo9 check --data {}`",
        cfg.yaml_path.display(),
        opts.min_items,
        cfg.yaml_path.display()
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
            cfg.yaml_path.display()
        ));
    }

    // The model: the weights (read once, here) and the training graph they or --cfg name.
    let weights = match &opts.weights {
        Some(p) => Some(Weights::load(p).with_context(|| format!("--weights {}", p.display()))?),
        None => None,
    };
    let arch = match (&opts.cfg, &weights) {
        (Some(c), _) => crate::model::Arch::from_cfg(c)?,
        (None, Some(w)) => crate::model::yolov9::training_arch(&w.meta.arch)?,
        (None, None) => crate::model::weights::default_arch(crate::model::weights::Graph::Train),
    };

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
            let budget = match opts.budget {
                Some(b) => b,
                None => (probe.free_bytes() as f64 * AUTO_SHARE) as u64,
            };
            let max_labels = items.iter().map(|i| i.labels.len()).max().unwrap_or(1);
            if faults.stop_in == Some(Phase::Sizing) {
                stop.request();
            }
            let d = plan_cancellable(
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
                    arch: arch.clone(),
                    graphs: crate::train::graphed::StepGraphs::new().applies_to(&device),
                    fixed_batch: opts.batch != 0,
                },
                &device,
                &probe,
                &stop.cancel(),
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
            cfg,
            items,
            item_dims,
            vimages,
            probe,
            micro,
            budget,
            faults,
            weights,
            arch,
        },
    ))
}

/// Builds the run of the final options `opts`: model, loss, optimizer and EMA (restored from the
/// saved state on `--resume`), the run folder, the loader.
///
/// `--cache ram` asks `stop` while it fills: a request ends it with [`crate::cancel::Stopped`]
/// in the error chain.
pub(crate) fn build<'a>(
    opts: &'a TrainOptions,
    r: Resolved,
    stop: &StopFlag,
    obs: &mut dyn TrainObserver,
    rank0: bool,
) -> Result<Prepared<'a>> {
    let Resolved {
        state,
        mut run_dir,
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
        weights,
        arch,
    } = r;
    if state.is_none() && rank0 {
        // `--exist-ok` reuses the folder: it must not hold anything this run reads.
        let labels: Vec<PathBuf> = items
            .iter()
            .map(|i| crate::data::scan::label_path_for(&i.path))
            .collect();
        let inputs = [Some(&opts.data), opts.hyp.as_ref(), opts.weights.as_ref()]
            .into_iter()
            .flatten()
            .chain(items.iter().map(|i| &i.path))
            .chain(&labels)
            .chain(vimages.iter().map(|i| &i.path))
            .map(PathBuf::as_path);
        crate::runs::refuse_reused_dir(&opts.project, &opts.name, opts.exist_ok, inputs)?;
    }
    // Model, loss, optimizer, EMA.
    let model = YoloV9Train::build(
        &arch,
        weights.as_ref(),
        cfg.nc,
        cfg.names.clone(),
        &device,
        opts.seed,
    )?;
    // AMP is the default and applies on CUDA only; the run's header line says when it is on.
    model.set_amp(opts.amp);
    if let (Some(w), None) = (&opts.weights, &state) {
        for l in transfer_lines(&model, w, weights.as_ref().map(|w| w.meta.nc)) {
            obs.line(&l);
        }
    }
    let loss = DualTalLoss::new(cfg.nc, &STRIDES)?.with_label_smoothing(opts.label_smoothing)?;
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
    // `--freeze`: the parameters of the frozen layers stay out of the optimizer (no update, no
    // weight decay) and out of the EMA averaging.
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
    let mut opt = Optimizer::with_kind(opts.optimizer, params, hyp.lr0, hyp.momentum, wd);
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
    let mut ema = Ema::new(&model.float_state()?)?;
    ema.freeze(&frozen_names);
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
    drop(weights);
    let eval_model =
        YoloV9Train::build(&arch, None, cfg.nc, cfg.names.clone(), &device, opts.seed)?;

    // Outputs (rank 0 of a data-parallel run alone writes them). A new run claims its folder
    // now, exclusively: another run started meanwhile with the same --project/--name gets the
    // next one instead of sharing it.
    if state.is_none() && rank0 {
        run_dir = crate::runs::claim_run_dir(&opts.project, &opts.name, opts.exist_ok)
            .with_context(|| format!("{}: cannot create the run folder", run_dir.display()))?;
    }
    let wdir = run_dir.join("weights");
    if rank0 {
        std::fs::create_dir_all(&wdir)
            .with_context(|| format!("{}: cannot create the run folder", wdir.display()))?;
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
    let args_json = serde_json::to_value(opts)?;
    if state.is_none() && rank0 {
        // Through `outfile`, like every output: never onto the run's inputs (`--data`, `--hyp`,
        // `--weights`), only over a regular file, atomically.
        let inputs = crate::outfile::Inputs::of(
            std::iter::once(opts.data.clone())
                .chain(opts.hyp.clone())
                .chain(opts.weights.clone()),
        );
        for (name, text) in [
            ("args.yaml", serde_yaml_ng::to_string(opts)?),
            ("hyp.yaml", serde_yaml_ng::to_string(&hyp)?),
        ] {
            crate::outfile::write(&run_dir.join(name), text.as_bytes(), &inputs)
                .with_context(|| format!("{}: cannot write {name}", run_dir.display()))?;
        }
        create_results_csv(&run_dir)?;
        if !opts.noplots {
            // labels.jpg: the training labels at a glance (official `plot_labels`).
            let boxes: Vec<(u32, [f32; 4])> = items
                .iter()
                .flat_map(|i| i.labels.iter().copied())
                .collect();
            let p = run_dir.join("labels.jpg");
            if let Err(e) = crate::metrics::plots::plot_labels(&boxes, &cfg.names, &p) {
                obs.line(&format!("warning: labels.jpg not drawn: {e:#}"));
            }
        }
    }

    // Loader.
    let workers = if opts.workers == 0 {
        default_workers()
    } else {
        opts.workers
    };
    let decode: Arc<DecodeFn> = Arc::new(|p: &Path| load_rgb8(p));
    let (decode, cached) = match opts.cache {
        ImageCache::Ram => {
            match ram_cache(&items, &item_dims, &decode, opts, workers, stop, obs)? {
                Some(c) => (c.decode_fn(decode, opts.img), true),
                None => (decode, false),
            }
        }
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
        },
    )?;
    let loader = if cached {
        loader.with_resized_source()
    } else {
        loader
    };
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
            run_dir.display()
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
        clock: std::time::Instant::now(),
        start_epoch: start.epoch,
        comm: None,
        rank0,
    };
    // CUDA-graph replay of the step (`train::graphed`) holds the captured step's memory in the
    // graphs' own pool, beside what the ordinary phases keep: under a memory budget it runs only
    // when the sizing measured it and chose it (`train::budget`), at the micro-batch sized for it.
    let graphed = run.graphs.borrow().applies_to(&run.device)
        && run.budget.as_ref().is_none_or(|d| d.graphed);
    if !graphed {
        run.graphs.borrow_mut().disable();
    }
    // Without a budget the capture survives validation and the epoch's last partial batch.
    run.graphs.borrow_mut().set_keep(run.budget.is_none());
    if opts.verbose && device.is_cuda() {
        let how = match (graphed, &run.budget) {
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
            (false, None) => "ordinary launches".to_string(),
        };
        obs.line(&format!("training step: {how}"));
    }
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
        w.display()
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
