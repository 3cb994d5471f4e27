//! `yolo9 train`: the official `train_dual.py` recipe (see [`crate::train::trainer`]).

use crate::train::options::{ImageCache, OptimizerKind};
use crate::train::trainer::{train_with, Console, StopFlag, TrainOptions};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Dataset description (data.yaml).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Initial weights (yolo9 safetensors or official .pt); omitted = from scratch.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// Model to train: yolov9-t, yolov9-s, yolov9-m, yolov9-c, yolov9-e, or a model yaml in the
    /// official format (a DualDDetect graph). Default: the model of --weights, else yolov9-s.
    #[arg(long)]
    pub cfg: Option<String>,
    /// Epochs (default 100; with --resume: extends the run to this many epochs).
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Train/val image size in pixels (a multiple of 32 in 32..=8192). On the CPU a size and
    /// batch whose estimated memory exceeds the free memory are refused before any work.
    #[arg(long, default_value = "640", value_parser = crate::cli::parse::train_img)]
    pub img: u32,
    /// Batch size the optimizer sees per iteration, or `auto` (the largest the memory budget
    /// allows, at most 64). Nominal batch 64 is kept by gradient accumulation.
    #[arg(long, default_value = "16", value_parser = parse_batch)]
    pub batch: usize,
    /// Images per forward/backward, ≥ 1 (default: the whole batch, or what --budget picks).
    #[arg(long, value_parser = crate::cli::parse::positive)]
    pub micro_batch: Option<usize>,
    /// Memory budget, e.g. 8GiB: the micro-batch is sized from measured training steps so that
    /// peak memory (device memory on CUDA, RSS on the CPU) stays within it.
    #[arg(long, value_parser = parse_budget)]
    pub budget: Option<u64>,
    /// Minutes between mid-epoch checkpoints (0 = after every batch).
    #[arg(long, default_value_t = 10.0)]
    pub save_interval: f64,
    /// Non-finite steps in a row before the last good state is restored and the LR halved.
    #[arg(long, default_value_t = 5)]
    pub nan_patience: usize,
    /// Mixed-precision (bf16) training on a CUDA device, on by default as in the official
    /// trainer (`--amp false` trains in f32, with TF32 convolutions unless `--strict-fp32`). No
    /// effect on the CPU, which always trains in f32.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub amp: bool,
    /// Strict f32 convolutions on CUDA: no TF32 tensor cores (PyTorch's
    /// `torch.backends.cudnn.allow_tf32 = False`). By default f32 convolutions may use TF32, as
    /// PyTorch's do. No effect on the CPU.
    #[arg(long)]
    pub strict_fp32: bool,
    /// Device: auto (the default: the first CUDA GPU if there is one, else the CPU), cpu, or a
    /// CUDA ordinal.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Loader threads, 0..=256 (0, the default: available cores - 1).
    #[arg(long, default_value = "0", value_parser = crate::cli::parse::workers)]
    pub workers: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Disable mosaic for the final N epochs.
    #[arg(long, default_value_t = 10)]
    pub close_mosaic: usize,
    /// Leave out train images with fewer boxes.
    #[arg(long, default_value_t = 0)]
    pub min_items: usize,
    /// Runs folder.
    #[arg(long, default_value = "runs/train")]
    pub project: PathBuf,
    /// Run name.
    #[arg(long, default_value = "exp")]
    pub name: String,
    /// Reuse an existing run folder.
    #[arg(long)]
    pub exist_ok: bool,
    /// Save a checkpoint every N epochs (-1 = never).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub save_period: i64,
    /// Early-stopping patience in epochs.
    #[arg(long, default_value_t = 100)]
    pub patience: usize,
    /// Cosine LR schedule.
    #[arg(long)]
    pub cos_lr: bool,
    /// Validate only the final epoch.
    #[arg(long)]
    pub noval: bool,
    /// Do not write plots.
    #[arg(long)]
    pub noplots: bool,
    /// Hyper-parameter yaml (default: hyp.scratch-high values).
    #[arg(long)]
    pub hyp: Option<PathBuf>,
    /// Resume a run: its folder or its weights/state.safetensors.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Train multi-class data as a single class (`item`, nc 1).
    #[arg(long)]
    pub single_cls: bool,
    /// Freeze layers: one number N freezes model.0 … model.N-1 (e.g. 10 = the backbone of
    /// yolov9-c); several numbers freeze exactly those layers (e.g. --freeze 0 1 2).
    #[arg(long, num_args = 1.., value_name = "N")]
    pub freeze: Vec<usize>,
    /// Optimizer: SGD (default), Adam or AdamW, with the official parameter groups and
    /// betas (momentum, 0.999).
    #[arg(long, default_value = "SGD", value_parser = parse_optimizer)]
    pub optimizer: OptimizerKind,
    /// Cache decoded training images: `ram` (also the value of a bare --cache). Skipped with a
    /// warning when the images would not fit in the available memory (with a 10% margin).
    #[arg(long, num_args = 0..=1, default_missing_value = "ram", value_parser = parse_cache)]
    pub cache: Option<ImageCache>,
    /// Wall-time limit in hours: the epoch count is re-estimated after each epoch so that
    /// training ends on time (overrides --epochs); it stops at an epoch boundary, saved.
    #[arg(long, value_parser = parse_hours)]
    pub time: Option<f64>,
    /// Label smoothing epsilon in [0, 1): class targets t become t*(1-eps) + eps/2.
    #[arg(long, default_value_t = 0.0, value_parser = parse_smoothing)]
    pub label_smoothing: f64,
}

fn parse_optimizer(s: &str) -> Result<OptimizerKind, String> {
    s.parse()
}

fn parse_cache(s: &str) -> Result<ImageCache, String> {
    s.parse()
}

fn parse_hours(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(h) if h.is_finite() && h > 0.0 => Ok(h),
        _ => Err(format!(
            "invalid --time '{s}': expected a positive number of hours (e.g. 1.5)"
        )),
    }
}

fn parse_smoothing(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(e) if (0.0..1.0).contains(&e) => Ok(e),
        _ => Err(format!(
            "invalid --label-smoothing '{s}': expected a number in [0, 1) (e.g. 0.1)"
        )),
    }
}

fn parse_batch(s: &str) -> Result<usize, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(0);
    }
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "invalid batch '{s}': expected a positive number or 'auto'"
        )),
    }
}

fn parse_budget(s: &str) -> Result<u64, String> {
    crate::memory::parse_size(s).map_err(|e| format!("{e:#}"))
}

/// Runs `yolo9 train`.
pub fn run(a: TrainArgs) -> Result<()> {
    let data = match (&a.data, &a.resume) {
        (Some(d), _) => d.clone(),
        (None, Some(_)) => PathBuf::new(),
        (None, None) => anyhow::bail!("--data is required (or --resume RUN)"),
    };
    let opts = TrainOptions {
        data,
        weights: a.weights,
        cfg: a.cfg,
        epochs: a.epochs.unwrap_or(100),
        img: a.img,
        batch: a.batch,
        micro_batch: a.micro_batch,
        budget: a.budget,
        save_interval: a.save_interval,
        nan_patience: a.nan_patience,
        amp: a.amp,
        strict_fp32: a.strict_fp32,
        device: a.device,
        workers: a.workers,
        seed: a.seed,
        close_mosaic: a.close_mosaic,
        min_items: a.min_items,
        project: a.project,
        name: a.name,
        exist_ok: a.exist_ok,
        save_period: a.save_period,
        patience: a.patience,
        cos_lr: a.cos_lr,
        noval: a.noval,
        noplots: a.noplots,
        hyp: a.hyp,
        extend_epochs: if a.resume.is_some() { a.epochs } else { None },
        resume: a.resume,
        single_cls: a.single_cls,
        freeze: a.freeze,
        optimizer: a.optimizer,
        cache: a.cache.unwrap_or_default(),
        time: a.time,
        label_smoothing: a.label_smoothing,
        verbose: true,
        faults: Default::default(),
    };
    // SIGINT/SIGTERM stop the run within one image, probe step or batch in every phase (its
    // state saved once training has begun).
    let stop = StopFlag::install()?;
    let s = train_with(&opts, &stop, &mut Console::new())?;
    if s.interrupted {
        return Ok(());
    }
    println!(
        "{} epochs done; best fitness {:.5}; weights {} and {}",
        s.epochs.len(),
        s.best_fitness,
        s.last.display(),
        s.best.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn amp_of(args: &[&str]) -> bool {
        let mut v = vec!["yolo9", "train", "--data", "d.yaml"];
        v.extend_from_slice(args);
        match Cli::try_parse_from(v).unwrap().command {
            Command::Train(a) => a.amp,
            _ => unreachable!("parsed as train"),
        }
    }

    fn train_args(args: &[&str]) -> Result<super::TrainArgs, clap::Error> {
        let mut v = vec!["yolo9", "train", "--data", "d.yaml"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| match c.command {
            Command::Train(a) => *a,
            _ => unreachable!("parsed as train"),
        })
    }

    /// The training options of issue 15 parse as the official flags do, and bad values are
    /// refused with the flag named.
    #[test]
    fn training_option_flags_parse() {
        use crate::train::options::{ImageCache, OptimizerKind};
        let a = train_args(&[]).unwrap();
        assert!(!a.single_cls && a.freeze.is_empty() && a.cache.is_none() && a.time.is_none());
        assert_eq!((a.optimizer, a.label_smoothing), (OptimizerKind::Sgd, 0.0));
        let a = train_args(&[
            "--single-cls",
            "--freeze",
            "10",
            "--optimizer",
            "AdamW",
            "--cache",
            "--time",
            "0.5",
            "--label-smoothing",
            "0.1",
        ])
        .unwrap();
        assert!(a.single_cls);
        assert_eq!(a.freeze, vec![10]);
        assert_eq!(a.optimizer, OptimizerKind::AdamW);
        assert_eq!(a.cache, Some(ImageCache::Ram));
        assert_eq!((a.time, a.label_smoothing), (Some(0.5), 0.1));
        let a = train_args(&[
            "--freeze",
            "0",
            "1",
            "2",
            "--cache",
            "ram",
            "--optimizer",
            "adam",
        ])
        .unwrap();
        assert_eq!(a.freeze, vec![0, 1, 2]);
        assert_eq!(
            (a.cache, a.optimizer),
            (Some(ImageCache::Ram), OptimizerKind::Adam)
        );
        for (bad, needle) in [
            (vec!["--optimizer", "LION"], "SGD, Adam or AdamW"),
            (vec!["--cache", "disk"], "--cache disk is not supported"),
            (vec!["--time", "0"], "positive number of hours"),
            (vec!["--label-smoothing", "1.5"], "[0, 1)"),
        ] {
            let e = train_args(&bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    /// Mixed precision is on unless turned off, in the CLI and in the library options (one
    /// default: a mismatch between the two is the bug fixed in d666a8b).
    #[test]
    fn amp_is_on_by_default() {
        assert!(amp_of(&[]));
        assert!(amp_of(&["--amp", "true"]));
        assert!(!amp_of(&["--amp", "false"]));
        let o = crate::train::trainer::TrainOptions::new("d.yaml".into());
        assert!(o.amp);
    }
}
