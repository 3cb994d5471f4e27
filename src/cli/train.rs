//! `yolo9 train`: the official `train_dual.py` recipe (see [`crate::train::trainer`]).

use crate::device::DeviceSpec;
use crate::train::dist::env::GroupEnv;
use crate::train::trainer::{train_group, train_with, Console, StopFlag, TrainOptions};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 train`: `--data` and `--epochs`, whose meaning depends on `--resume`,
/// and every other flag derived from [`TrainOptions`] (one definition, one default).
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// Dataset description (data.yaml); with --resume, only when the dataset moved.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Epochs; with --resume: extends the run to this many epochs [default: 100].
    #[arg(long)]
    pub epochs: Option<usize>,
    /// The device ([`crate::device::DEVICE_HELP`]), or a list of CUDA devices (`0,1,...`): one
    /// training process per GPU, each a rank of a data-parallel run.
    #[arg(long, default_value = "auto", value_parser = parse_device_list,
          allow_negative_numbers = true, help = TRAIN_DEVICE_HELP)]
    pub device: DeviceList,
    /// The run's options.
    #[command(flatten)]
    pub opts: TrainOptions,
}

/// The help of `yolo9 train --device`.
const TRAIN_DEVICE_HELP: &str = "Device: auto (the first CUDA GPU when this build has CUDA and \
     one is present, else the CPU), cpu, a CUDA device index such as 0 (or cuda:0), or a list \
     such as 0,1: data-parallel training, one process per GPU, --batch is the total over the GPUs \
     (torchrun's WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment make \
     this process one rank of a group instead)";

/// A parsed `yolo9 train --device` value: one device or a list.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceList(pub Vec<DeviceSpec>);

fn parse_device_list(s: &str) -> Result<DeviceList, String> {
    crate::device::parse_devices(s).map(DeviceList)
}

impl DeviceList {
    /// The device of local rank `local` of a group: the list's entry when it has several, else
    /// its one device. Errors when the list is shorter than the local ranks.
    pub fn for_local_rank(&self, local: usize) -> Result<DeviceSpec> {
        match self.0.as_slice() {
            [one] => Ok(*one),
            list => list.get(local).copied().ok_or_else(|| {
                anyhow::anyhow!(
                    "LOCAL_RANK={local} but --device lists {} devices; give one device per \
                     process of this host",
                    list.len()
                )
            }),
        }
    }
}

impl TrainArgs {
    /// The run's options: `--data` (optional with `--resume`) and `--epochs` (with `--resume`,
    /// the number to extend the run to) put into the flattened options.
    ///
    /// Errors: neither `--data` nor `--resume`; a `--weights` that is neither a file nor a
    /// published name, or whose download fails.
    pub fn into_options(self) -> Result<TrainOptions> {
        let data = match (self.data, &self.opts.resume) {
            (Some(d), _) => d,
            (None, Some(_)) => PathBuf::new(),
            (None, None) => anyhow::bail!("--data is required (or --resume RUN)"),
        };
        // `--weights yolov9-s`: an official checkpoint by name, from the cache or downloaded.
        let weights = match &self.opts.weights {
            Some(w) => Some(super::detect::weights_file(w)?),
            None => None,
        };
        Ok(TrainOptions {
            data,
            weights,
            device: self.device.0.first().copied().unwrap_or_default(),
            epochs: self.epochs.unwrap_or(self.opts.epochs),
            extend_epochs: self.opts.resume.is_some().then_some(self.epochs).flatten(),
            ..self.opts
        })
    }
}

/// Runs `yolo9 train`: one device; or, with a device list, one process per device
/// ([`crate::train::dist::launch::launch`]); or, with torchrun's `WORLD_SIZE` in the environment, one rank of a group.
pub fn run(a: TrainArgs) -> Result<()> {
    let devices = a.device.clone();
    let env = GroupEnv::read(crate::switches::var)?;
    if env.is_none() && devices.0.len() > 1 {
        return crate::train::dist::launch::launch(&devices.0);
    }
    let mut opts = a.into_options()?;
    // SIGINT/SIGTERM stop the run within one image, probe step or batch in every phase (its
    // state saved once training has begun).
    let stop = StopFlag::install()?;
    let s = match env {
        None => train_with(&opts, &stop, &mut Console::new())?,
        Some(g) => {
            opts.device = devices.for_local_rank(g.local_rank)?;
            // Rank 0 speaks for the group; the others print their errors only.
            opts.verbose &= g.rank == 0;
            let (comm, backend) = g.form(opts.device)?;
            if opts.verbose {
                crate::text::outln!(
                    "data-parallel training: {} ranks, gradients summed through {backend}",
                    g.world
                );
            }
            let s = train_group(&opts, &stop, &mut Console::new(), comm)?;
            if g.rank != 0 {
                return Ok(());
            }
            s
        }
    };
    if s.interrupted {
        return Ok(());
    }
    crate::text::outln!(
        "{} epochs done; best fitness {:.5}; weights {} and {}",
        s.epochs.len(),
        s.best_fitness,
        crate::text::path(&s.last),
        crate::text::path(&s.best)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use crate::train::options::{ImageCache, OptimizerKind};
    use clap::Parser;

    fn amp_of(args: &[&str]) -> bool {
        let mut v = vec!["yolo9", "train", "--data", "d.yaml"];
        v.extend_from_slice(args);
        match Cli::try_parse_from(v).unwrap().command {
            Command::Train(a) => a.opts.amp,
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
        let a = train_args(&[]).unwrap().opts;
        assert!(!a.single_cls && a.freeze.is_empty() && a.time.is_none());
        assert_eq!(a.cache, ImageCache::None);
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
        .unwrap()
        .opts;
        assert!(a.single_cls);
        assert_eq!(a.freeze, vec![10]);
        assert_eq!(a.optimizer, OptimizerKind::AdamW);
        assert_eq!(a.cache, ImageCache::Ram);
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
        .unwrap()
        .opts;
        assert_eq!(a.freeze, vec![0, 1, 2]);
        assert_eq!(
            (a.cache, a.optimizer),
            (ImageCache::Ram, OptimizerKind::Adam)
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

    /// `yolo9 train --data D` runs exactly `TrainOptions::new(D)`: the flags are derived from
    /// the options struct and take their defaults from the same constants, so no default can
    /// differ between the command line and the library (the class of d666a8b's `--amp` bug, and
    /// of `--device`, once `auto` on the command line and `cpu` in the library).
    #[test]
    fn command_line_defaults_are_the_library_defaults() {
        use crate::train::trainer::TrainOptions;
        let o = train_args(&[]).unwrap().into_options().unwrap();
        let lib = TrainOptions::new("d.yaml".into());
        assert_eq!(
            serde_json::to_value(&o).unwrap(),
            serde_json::to_value(&lib).unwrap()
        );
        assert_eq!(
            (o.verbose, o.extend_epochs),
            (lib.verbose, lib.extend_epochs)
        );
        // A run saved without the newer keys reads them as the same defaults.
        let mut v = serde_json::to_value(&lib).unwrap();
        let m = v.as_object_mut().unwrap();
        for k in [
            "save_interval",
            "nan_patience",
            "amp",
            "cfg",
            "micro_batch",
            "budget",
        ] {
            m.remove(k);
        }
        let old: TrainOptions = serde_json::from_value(v).unwrap();
        assert_eq!(
            serde_json::to_value(&old).unwrap(),
            serde_json::to_value(&lib).unwrap()
        );
        // args.yaml of earlier versions wrote the device as a string or an index.
        let mut v = serde_json::to_value(&lib).unwrap();
        v["device"] = serde_json::json!("0");
        let o: TrainOptions = serde_json::from_value(v).unwrap();
        assert_eq!(o.device, crate::device::DeviceSpec::Cuda(0));
    }
}
