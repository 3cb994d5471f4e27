//! `yolo9 check`: scan a dataset without training.
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The dataset description (data.yaml).
    #[arg(long)]
    pub data: PathBuf,
}

/// Runs `yolo9 check`.
pub fn run(_args: CheckArgs) -> anyhow::Result<()> {
    anyhow::bail!("check: not implemented yet")
}
