//! `yolo9 detect`: detection on images, directories and globs.
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 detect`.
#[derive(Debug, Args)]
pub struct DetectArgs {
    /// Image files, directories or glob patterns.
    pub source: Vec<PathBuf>,
}

/// Runs `yolo9 detect`.
pub fn run(_args: DetectArgs) -> anyhow::Result<()> {
    anyhow::bail!("detect: not implemented yet")
}
