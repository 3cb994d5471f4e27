//! `yolo9 convert`: official `.pt` → safetensors.
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 convert`.
#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// The checkpoint to convert (.pt official checkpoint, .pt state_dict or .safetensors).
    pub input: PathBuf,
}

/// Runs `yolo9 convert`.
pub fn run(_args: ConvertArgs) -> anyhow::Result<()> {
    anyhow::bail!("convert: not implemented yet")
}
