//! The training loop of `yolo9 train` (official `train_dual.py`, single device).
//!
//! Per iteration `ni` (batches since the start): warmup of LR/momentum/accumulation
//! ([`Schedule::at`]), forward of both branches in train mode, the dual TAL loss
//! (`(box + cls + dfl) · batch`), backward, gradients summed over micro-batches, and an optimizer
//! step when `ni − last_opt_step ≥ accumulate` (gradient-norm clip 10, SGD Nesterov, then an EMA
//! update). Per epoch: LR factor `lf(epoch)` (linear or `--cos-lr`), mosaic off for the last
//! `--close-mosaic` epochs, validation of the EMA (P, R, mAP50, mAP50-95 and real val losses),
//! fitness `0.1·mAP50 + 0.9·mAP50-95` picks `best`, `results.csv`, `weights/last.safetensors`,
//! `weights/best.safetensors` (EMA, `Graph::Train`, f32, loadable by `YoloV9::load`) and the
//! training state `weights/state.safetensors` for `--resume` (see [`crate::train::checkpoint`]).

use crate::data::augment::AugmentConfig;
use crate::data::image::load_rgb8;
use crate::data::loader::{
    batches_per_epoch, default_workers, DecodeFn, Loader, LoaderConfig, TrainItem,
};
use crate::data::scan::{scan_split, ScanOptions};
use crate::data::yaml::{DataConfig, Split};
use crate::loss::tal_loss::{targets_tensor, GAINS};
use crate::loss::DualTalLoss;
use crate::metrics::validate::{val_images, validate, ValConfig, ValModel};
use crate::model::weights::{Weights, STRIDES};
use crate::model::yolov9::YoloV9Train;
use crate::runs::increment_path;
use crate::train::checkpoint::{load_state, save_state, CheckpointMeta};
use crate::train::ema::Ema;
use crate::train::optimizer::Sgd;
use crate::train::schedule::Schedule;
use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Gradient-norm clip of the official loop.
pub const MAX_GRAD_NORM: f64 = 10.0;

/// Options of a training run (the `yolo9 train` flags; written to `args.yaml`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainOptions {
    /// Dataset yaml.
    pub data: PathBuf,
    /// Initial weights (yolo9 safetensors or official .pt); `None` = from scratch.
    pub weights: Option<PathBuf>,
    /// Epochs.
    pub epochs: usize,
    /// Square training size in pixels (multiple of 32).
    pub img: u32,
    /// Micro-batch size.
    pub batch: usize,
    /// `cpu` or a CUDA ordinal.
    pub device: String,
    /// Loader threads (0 = available cores − 1).
    pub workers: usize,
    /// Seed of initialization, shuffling and augmentation.
    pub seed: u64,
    /// Epochs at the end without mosaic.
    pub close_mosaic: usize,
    /// Train images with fewer boxes are left out.
    pub min_items: usize,
    /// Runs folder.
    pub project: PathBuf,
    /// Run name (`exp`, then `exp2`, ... unless `exist_ok`).
    pub name: String,
    /// Reuse an existing run folder.
    pub exist_ok: bool,
    /// Save `epoch{N}.safetensors` every N epochs (−1 = never).
    pub save_period: i64,
    /// Stop after this many epochs without fitness improvement.
    pub patience: usize,
    /// Cosine LR schedule.
    pub cos_lr: bool,
    /// Validate only after the final epoch.
    pub noval: bool,
    /// No plots (plots are not implemented; accepted for compatibility).
    pub noplots: bool,
    /// Hyper-parameter yaml (official `hyp.scratch-high.yaml` format); `None` = its values.
    pub hyp: Option<PathBuf>,
    /// Resume from a run folder or a `state.safetensors`.
    pub resume: Option<PathBuf>,
    /// Show progress bars and per-epoch lines.
    pub verbose: bool,
}

impl TrainOptions {
    /// The official defaults for `data`.
    pub fn new(data: PathBuf) -> Self {
        TrainOptions {
            data,
            weights: None,
            epochs: 100,
            img: 640,
            batch: 16,
            device: "cpu".into(),
            workers: 0,
            seed: 0,
            close_mosaic: 10,
            min_items: 0,
            project: PathBuf::from("runs/train"),
            name: "exp".into(),
            exist_ok: false,
            save_period: -1,
            patience: 100,
            cos_lr: false,
            noval: false,
            noplots: false,
            hyp: None,
            resume: None,
            verbose: true,
        }
    }
}

/// Hyper-parameters (official `hyp.scratch-high.yaml`; unknown keys are ignored).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Hyp {
    /// Initial LR.
    pub lr0: f64,
    /// Final LR fraction.
    pub lrf: f64,
    /// SGD momentum.
    pub momentum: f64,
    /// Weight decay (before batch scaling).
    pub weight_decay: f64,
    /// Warmup epochs.
    pub warmup_epochs: f64,
    /// Warmup initial momentum.
    pub warmup_momentum: f64,
    /// Warmup initial bias LR.
    pub warmup_bias_lr: f64,
    /// Box loss gain (fixed at 7.5 by the loss).
    #[serde(rename = "box")]
    pub box_gain: f64,
    /// Class loss gain (fixed at 0.5).
    pub cls: f64,
    /// DFL gain (fixed at 1.5).
    pub dfl: f64,
    /// Augmentation keys (`hsv_h`, `hsv_s`, `hsv_v`, `degrees`, `translate`, `scale`, `shear`,
    /// `flipud`, `fliplr`, `mosaic`, `mixup`), read from the same yaml level.
    #[serde(flatten)]
    pub augment: AugmentConfig,
}

impl Default for Hyp {
    fn default() -> Self {
        Hyp {
            lr0: 0.01,
            lrf: 0.01,
            momentum: 0.937,
            weight_decay: 0.0005,
            warmup_epochs: 3.0,
            warmup_momentum: 0.8,
            warmup_bias_lr: 0.1,
            box_gain: GAINS[0] as f64,
            cls: GAINS[1] as f64,
            dfl: GAINS[2] as f64,
            augment: AugmentConfig::default(),
        }
    }
}

impl Hyp {
    /// Reads a hyp yaml (missing keys keep the scratch-high values).
    pub fn load(path: &Path) -> Result<Hyp> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--hyp {}: cannot read", path.display()))?;
        let h: Hyp = serde_yaml::from_str(&text).with_context(|| {
            format!(
                "--hyp {}: not a hyp yaml (expected keys like `lr0: 0.01`, numbers only)",
                path.display()
            )
        })?;
        ensure!(
            h.lr0 > 0.0
                && h.lr0.is_finite()
                && h.lrf > 0.0
                && h.momentum >= 0.0
                && h.momentum < 1.0,
            "--hyp {}: lr0 {} / lrf {} / momentum {} out of range",
            path.display(),
            h.lr0,
            h.lrf,
            h.momentum
        );
        Ok(h)
    }

    /// The augmentation part.
    pub fn augment(&self) -> AugmentConfig {
        self.augment.clone()
    }
}

/// One line of `results.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochReport {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Mean training losses `[box, cls, dfl]` of the epoch (official `mloss`).
    pub train_loss: [f32; 3],
    /// Precision, recall, mAP50, mAP50-95 of the EMA on the val split (zeros when not validated).
    pub metrics: [f64; 4],
    /// Val losses `[box, cls, dfl]` (zeros when not validated).
    pub val_loss: [f32; 3],
    /// LR of the groups `[bias, weight, bn_weight]` at the last iteration.
    pub lr: [f64; 3],
    /// Resident memory in bytes at the end of the epoch.
    pub rss: u64,
    /// Samples skipped (undecodable) during the epoch.
    pub skipped: usize,
    /// Training images per second.
    pub img_per_s: f64,
    /// Whether validation ran.
    pub validated: bool,
}

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
}

/// `cpu` → CPU; `N` → CUDA device N (needs the `cuda` feature).
pub fn parse_device(s: &str) -> Result<Device> {
    let spec = crate::device::parse_device(s).map_err(|e| anyhow::anyhow!("--device {s}: {e}"))?;
    crate::device::select(spec)
}

/// Resident set size of this process in bytes (Linux `/proc/self/statm`; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// The `results.csv` header.
pub const RESULTS_HEADER: &str = "epoch,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision,metrics/recall,metrics/mAP50,metrics/mAP50-95,val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2,rss,skipped";

fn csv_row(r: &EpochReport) -> String {
    format!(
        "{},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.6e},{:.6e},{:.6e},{},{}",
        r.epoch,
        r.train_loss[0],
        r.train_loss[1],
        r.train_loss[2],
        r.metrics[0],
        r.metrics[1],
        r.metrics[2],
        r.metrics[3],
        r.val_loss[0],
        r.val_loss[1],
        r.val_loss[2],
        r.lr[0],
        r.lr[1],
        r.lr[2],
        r.rss,
        r.skipped
    )
}

/// The model state as the EMA tracks it: every floating-point state_dict entry, sorted by name.
fn float_state(model: &YoloV9Train) -> Result<Vec<(String, Tensor)>> {
    let sd = model.state_dict()?;
    let mut v: Vec<(String, Tensor)> = sd
        .into_iter()
        .filter(|(_, t)| t.dtype() == DType::F32)
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

/// EMA weights as a full state_dict (`num_batches_tracked` from the model).
fn ema_weights(model: &YoloV9Train, ema: &Ema) -> Result<Weights> {
    let mut sd = model.state_dict()?;
    for (k, t) in &ema.state {
        sd.insert(k.clone(), t.clone());
    }
    Ok(Weights {
        tensors: sd,
        meta: model.meta().clone(),
    })
}

/// Environment variable that turns on per-phase timing of the training loop
/// (`YOLO9_STEP_TIMES=1`): the device is synchronized at each phase boundary and the summed
/// seconds per phase are printed after each epoch. Off by default (no synchronization, no output).
pub const STEP_TIMES_ENV: &str = "YOLO9_STEP_TIMES";

/// Names of the phases timed by [`StepTimes`], in loop order.
const PHASES: [&str; 7] = [
    "wait",
    "input",
    "forward",
    "loss",
    "backward",
    "accumulate",
    "optimizer+ema",
];

/// Opt-in wall-clock time per training-loop phase (see [`STEP_TIMES_ENV`]).
struct StepTimes {
    device: Option<Device>,
    last: std::time::Instant,
    secs: [f64; PHASES.len()],
}

impl StepTimes {
    fn new(device: &Device) -> Self {
        let on = std::env::var_os(STEP_TIMES_ENV).is_some_and(|v| !v.is_empty() && v != "0");
        StepTimes {
            device: on.then(|| device.clone()),
            last: std::time::Instant::now(),
            secs: [0.0; PHASES.len()],
        }
    }

    /// Ends phase `i` (index into [`PHASES`]) after the device finished its queued work.
    fn mark(&mut self, i: usize) -> Result<()> {
        if let Some(d) = &self.device {
            d.synchronize()?;
            let now = std::time::Instant::now();
            self.secs[i] += (now - self.last).as_secs_f64();
            self.last = now;
        }
        Ok(())
    }

    /// One line `step times (s): wait 0.12, input 0.03, ...`, or `None` when off.
    fn report(&self) -> Option<String> {
        self.device.as_ref()?;
        let parts: Vec<String> = PHASES
            .iter()
            .zip(self.secs)
            .map(|(n, t)| format!("{n} {t:.2}"))
            .collect();
        Some(format!(
            "step times (s, summed over the epoch): {}",
            parts.join(", ")
        ))
    }
}

fn fmt_mem(b: u64) -> String {
    format!("{:.2}G", b as f64 / 1e9)
}

/// Runs training with `opts` and returns the per-epoch reports. Outputs go to
/// `project/name{,2,..}` (see the module docs).
pub fn train(opts: &TrainOptions) -> Result<TrainSummary> {
    // Resume: restore the arguments and the state of an earlier run.
    let (opts, state, run_dir) = match &opts.resume {
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
            let dir = ckpt
                .parent()
                .and_then(|p| p.parent())
                .map(Path::to_path_buf)
                .with_context(|| format!("{}: not inside RUN/weights/", ckpt.display()))?;
            ensure!(
                st.meta.epoch + 1 < o.epochs,
                "--resume {}: the run already finished its {} epochs; start a new run with --weights {}",
                r.display(),
                o.epochs,
                dir.join("weights/last.safetensors").display()
            );
            (o, Some(st), dir)
        }
        None => {
            let dir = increment_path(&opts.project, &opts.name, opts.exist_ok);
            (opts.clone(), None, dir)
        }
    };
    let opts = &opts;
    ensure!(opts.epochs >= 1, "--epochs must be at least 1");
    ensure!(opts.batch >= 1, "--batch must be at least 1");
    ensure!(
        opts.img >= 32 && opts.img % 32 == 0,
        "--img {} must be a positive multiple of 32 (the largest stride)",
        opts.img
    );
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
            eprintln!("warning: hyp `{name}: {v}` ignored; the loss uses the official gain {g}");
        }
    }
    let device = parse_device(&opts.device)?;
    let cfg = DataConfig::load(&opts.data)?;
    let scan_opts = ScanOptions {
        use_cache: true,
        print: false,
    };
    let train_scan = scan_split(&cfg, Split::Train, &scan_opts)?;
    if opts.verbose {
        print!("{}", train_scan.report(&cfg.root, &cfg.names));
    }
    let val_scan = if cfg.val.is_empty() {
        None
    } else {
        let s = scan_split(&cfg, Split::Val, &scan_opts)?;
        if opts.verbose {
            print!("{}", s.report(&cfg.root, &cfg.names));
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
    if let Some(w) = &opts.weights {
        let n = model.vars().len();
        let init = model.initialized().len();
        println!(
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
        );
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
    let mut ema = Ema::new(&float_state(&model)?)?;
    let mut start_epoch = 0;
    let mut best_fitness = 0.0f64;
    let mut best_epoch: Option<usize> = None;
    let mut last_opt_step: i64 = -1;
    if let Some(st) = &state {
        model.load_state_dict(&st.model)?;
        opt.load_state(&st.optim)?;
        ensure!(
            st.ema.len() == ema.state.len(),
            "resume: EMA has {} tensors, model {}",
            st.ema.len(),
            ema.state.len()
        );
        ema.state = st.ema.clone();
        ema.updates = st.meta.ema_updates;
        start_epoch = st.meta.epoch + 1;
        best_fitness = st.meta.best_fitness;
        best_epoch = st.meta.best_epoch;
        last_opt_step = st.meta.last_opt_step as i64;
        println!(
            "resuming from epoch {} (best fitness {:.5})",
            start_epoch, best_fitness
        );
    }
    let eval_model = YoloV9Train::new(None, cfg.nc, cfg.names.clone(), &device, opts.seed)?;

    // Outputs.
    let wdir = run_dir.join("weights");
    std::fs::create_dir_all(&wdir)
        .with_context(|| format!("{}: cannot create the run folder", wdir.display()))?;
    let last = wdir.join("last.safetensors");
    let best = wdir.join("best.safetensors");
    let state_path = wdir.join("state.safetensors");
    let args_json = serde_json::to_value(opts)?;
    if state.is_none() {
        std::fs::write(run_dir.join("args.yaml"), serde_yaml::to_string(opts)?)
            .with_context(|| format!("{}: cannot write args.yaml", run_dir.display()))?;
        std::fs::write(run_dir.join("hyp.yaml"), serde_yaml::to_string(&hyp)?)
            .with_context(|| format!("{}: cannot write hyp.yaml", run_dir.display()))?;
        std::fs::write(run_dir.join("results.csv"), format!("{RESULTS_HEADER}\n"))
            .with_context(|| format!("{}: cannot write results.csv", run_dir.display()))?;
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
        println!(
            "training {} images ({} batches of {}) at {}x{} for {} epochs on {:?}; run folder {}",
            loader.len(),
            nb,
            opts.batch,
            opts.img,
            opts.img,
            opts.epochs,
            device,
            run_dir.display()
        );
    }

    let mut reports = Vec::new();
    for epoch in start_epoch..opts.epochs {
        // Official: mosaic off at `epoch == epochs - close_mosaic` (never when close_mosaic > epochs);
        // `>=` so that a resumed run past that epoch also has it off.
        if opts.close_mosaic > 0
            && opts.epochs >= opts.close_mosaic
            && epoch >= opts.epochs - opts.close_mosaic
            && loader.config().augment.mosaic > 0.0
        {
            if opts.verbose {
                println!("closing mosaic from epoch {epoch}");
            }
            loader.config_mut().augment.mosaic = 0.0;
        }
        let t0 = std::time::Instant::now();
        let mut mloss = [0f64; 3];
        let mut done = 0usize;
        let mut skipped = 0usize;
        let mut images_seen = 0usize;
        let mut acc: Option<candle_core::backprop::GradStore> = None;
        let mut times = StepTimes::new(&device);
        let pb = if opts.verbose {
            println!(
                "{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
                "Epoch", "mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size"
            );
            let pb = indicatif::ProgressBar::new(nb as u64);
            pb.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} {bar:20} {pos}/{len} [{elapsed_precise}<{eta_precise}, {per_sec}]",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            Some(pb)
        } else {
            None
        };
        for batch in loader.epoch(epoch, 0) {
            let i = batch.index;
            let ni = i + nb * epoch;
            skipped += batch.skipped.len();
            for (p, why) in &batch.skipped {
                if let Some(pb) = &pb {
                    pb.println(format!("skipped {}: {why}", p.display()));
                }
            }
            if batch.len == 0 {
                continue;
            }
            times.mark(0)?;
            let st = sched.at(ni, epoch, nb, opts.batch);
            opt.lr = st.lr;
            opt.momentum = st.momentum;
            let x = Tensor::from_vec(batch.images, (batch.len, 3, s, s), &device)?
                .to_dtype(DType::F32)?
                .broadcast_div(&Tensor::new(255f32, &device)?)?;
            times.mark(1)?;
            let raw = model.forward(&x, true)?;
            times.mark(2)?;
            let t = targets_tensor(&batch.targets, &device)?;
            let lo = loss.compute(&raw.aux, &raw.main, &t, (s, s))?;
            times.mark(3)?;
            if lo.items.iter().any(|v| !v.is_finite()) {
                if let Some(pb) = &pb {
                    pb.println(format!(
                        "warning: non-finite loss {:?} at batch {i}; batch skipped",
                        lo.items
                    ));
                }
                continue;
            }
            let grads = lo.total.backward()?;
            times.mark(4)?;
            acc = Some(match acc.take() {
                None => grads,
                Some(mut a) => {
                    for p in opt.params() {
                        if let Some(g) = grads.get(p.var.as_tensor()) {
                            let sum = match a.remove(p.var.as_tensor()) {
                                Some(prev) => (prev + g)?,
                                None => g.clone(),
                            };
                            a.insert(p.var.as_tensor(), sum);
                        }
                    }
                    a
                }
            });
            times.mark(5)?;
            if ni as i64 - last_opt_step >= st.accumulate as i64 {
                if let Some(mut g) = acc.take() {
                    let norm = opt.clip_grad_norm(&mut g, MAX_GRAD_NORM)?;
                    if norm.is_finite() {
                        opt.step(&g)?;
                        ema.update(&float_state(&model)?)?;
                    } else if let Some(pb) = &pb {
                        pb.println(format!(
                            "warning: non-finite gradient norm at batch {i}; step skipped"
                        ));
                    }
                }
                last_opt_step = ni as i64;
            }
            times.mark(6)?;
            for (m, v) in mloss.iter_mut().zip(lo.items) {
                *m = (*m * done as f64 + v as f64) / (done + 1) as f64;
            }
            done += 1;
            images_seen += batch.len;
            if let Some(pb) = &pb {
                pb.set_message(format!(
                    "{:>10}{:>10}{:>10.4}{:>10.4}{:>10.4}{:>10}{:>10}",
                    format!("{}/{}", epoch + 1, opts.epochs),
                    fmt_mem(rss_bytes()),
                    mloss[0],
                    mloss[1],
                    mloss[2],
                    batch.targets.len(),
                    s
                ));
                pb.inc(1);
            }
        }
        if let Some(pb) = &pb {
            pb.finish();
        }
        let train_secs = t0.elapsed().as_secs_f64();
        if let Some(line) = times.report() {
            println!("{line}");
        }
        let lr = opt.lr;
        let final_epoch = epoch + 1 == opts.epochs;

        // Validation of the EMA.
        let mut metrics = [0f64; 4];
        let mut val_loss = [0f32; 3];
        let mut validated = false;
        let tv = std::time::Instant::now();
        if (!opts.noval || final_epoch) && !vimages.is_empty() {
            let map: HashMap<String, Tensor> = ema.state.iter().cloned().collect();
            eval_model.load_state_dict(&map)?;
            let r = validate(
                ValModel::Train {
                    model: &eval_model,
                    loss: &loss,
                },
                &vimages,
                &ValConfig {
                    img: opts.img,
                    batch: opts.batch * 2,
                    progress: opts.verbose,
                    ..ValConfig::default()
                },
            )?;
            if opts.verbose {
                print!("{}", r.metrics.table(&cfg.names));
            }
            metrics = [
                r.metrics.mp,
                r.metrics.mr,
                r.metrics.map50,
                r.metrics.map50_95,
            ];
            val_loss = r.losses.unwrap_or_default();
            skipped += r.skipped.len();
            validated = true;
        }
        let val_secs = tv.elapsed().as_secs_f64();
        let fi = crate::metrics::fitness(metrics[2], metrics[3]);
        let improved = fi > best_fitness || best_epoch.is_none();
        if fi > best_fitness {
            best_fitness = fi;
        }
        if improved {
            best_epoch = Some(epoch);
        }
        let report = EpochReport {
            epoch,
            train_loss: [mloss[0] as f32, mloss[1] as f32, mloss[2] as f32],
            metrics,
            val_loss,
            lr,
            rss: rss_bytes(),
            skipped,
            img_per_s: images_seen as f64 / train_secs.max(1e-9),
            validated,
        };
        {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(run_dir.join("results.csv"))
                .with_context(|| format!("{}: cannot append to results.csv", run_dir.display()))?;
            writeln!(f, "{}", csv_row(&report))?;
        }
        if opts.verbose {
            println!(
                "epoch {}/{}: train box {:.4} cls {:.4} dfl {:.4}; {:.2} img/s; train {:.1} s, val {:.1} s; {} skipped; fitness {:.4}",
                epoch + 1,
                opts.epochs,
                report.train_loss[0],
                report.train_loss[1],
                report.train_loss[2],
                report.img_per_s,
                train_secs,
                val_secs,
                skipped,
                fi
            );
        }
        reports.push(report);

        // Save.
        let w = ema_weights(&model, &ema)?;
        w.save(&last, false)?;
        if improved {
            w.save(&best, false)?;
        }
        if opts.save_period > 0 && (epoch + 1) % opts.save_period as usize == 0 {
            w.save(&wdir.join(format!("epoch{epoch}.safetensors")), false)?;
        }
        let meta = CheckpointMeta {
            version: 1,
            epoch,
            best_fitness,
            best_epoch,
            ema_updates: ema.updates,
            iterations: nb * (epoch + 1),
            last_opt_step: last_opt_step.max(0) as usize,
            batches_tracked: model.batches_tracked(),
            args: args_json.clone(),
        };
        save_state(
            &state_path,
            &meta,
            &model.state_dict()?,
            &ema.state,
            &opt.state(),
        )?;

        if let Some(be) = best_epoch {
            if epoch >= be + opts.patience {
                println!(
                    "stopping early: no improvement in {} epochs (best epoch {})",
                    opts.patience,
                    be + 1
                );
                break;
            }
        }
    }
    if reports.is_empty() {
        bail!("no epoch was run");
    }
    Ok(TrainSummary {
        run_dir,
        epochs: reports,
        best_fitness,
        last,
        best,
    })
}
