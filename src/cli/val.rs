//! `yolo9 val`: the arguments and one call of the library's validation job
//! ([`crate::metrics::job::run`]).

use crate::device::{parse_device, DeviceSpec};
use crate::metrics::job::ValOptions;
pub use crate::metrics::job::{parse_split, save_txt};
use anyhow::Result;
use clap::Args;

/// Arguments of `yolo9 val`.
#[derive(Debug, Args)]
pub struct ValArgs {
    /// The weights and, optionally, the model they are.
    #[command(flatten)]
    pub model: crate::cli::detect::WeightsArgs,
    /// The device ([`crate::device::DEVICE_HELP`]).
    #[arg(long, default_value_t = DeviceSpec::Auto, value_parser = parse_device,
          allow_negative_numbers = true, help = crate::device::DEVICE_HELP)]
    pub device: DeviceSpec,
    /// The data, the split, the sizes, thresholds and outputs.
    #[command(flatten)]
    pub opts: ValOptions,
}

/// Runs `yolo9 val`.
pub fn run(a: ValArgs) -> Result<()> {
    crate::metrics::job::run(&a.opts, a.device, || a.model.load())
}
