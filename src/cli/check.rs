//! `yolo9 check`: scan a dataset without training.
//!
//! Loads `--data`, scans every split named in it (train, val, test) exactly as training would
//! ([`crate::data::scan`]), prints each problem as `file:line: value → action` and one summary line per
//! split. Exits non-zero only when the yaml cannot be used or nothing is trainable (no train image with
//! at least one box); every other problem is reported and skipped.
use crate::data::scan::{scan_split, ScanOptions, SplitScan};
use crate::data::yaml::{DataConfig, Split};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The dataset description (data.yaml).
    #[arg(long)]
    pub data: PathBuf,
    /// Neither read nor write the label cache (always rescan).
    #[arg(long)]
    pub no_cache: bool,
}

/// Runs `yolo9 check`.
pub fn run(args: CheckArgs) -> Result<()> {
    let cfg = DataConfig::load(&args.data)?;
    crate::text::outln!(
        "dataset {} (root {}): {} classes {:?}",
        crate::text::path(&cfg.yaml_path),
        crate::text::path(&cfg.root),
        cfg.nc,
        cfg.names
    );
    if let Some(c) = &cfg.coco {
        crate::text::outln!("{}", c.mapping_line(&cfg.names));
    }
    let scans = check(&cfg, !args.no_cache)?;
    for s in &scans {
        crate::text::out!("{}", s.report(&cfg.root, &cfg.names));
    }
    trainable(&scans)
}

/// Scans every split of `cfg` (train, val, and test when present), without printing.
pub fn check(cfg: &DataConfig, use_cache: bool) -> Result<Vec<SplitScan>> {
    let opts = ScanOptions {
        use_cache,
        print: false,
        ..Default::default()
    };
    [Split::Train, Split::Val, Split::Test]
        .into_iter()
        .filter(|s| !cfg.sources(*s).is_empty())
        .map(|s| scan_split(cfg, s, &opts))
        .collect()
}

/// `Ok` when the train split has at least one usable image with a box; otherwise an error saying so.
pub fn trainable(scans: &[SplitScan]) -> Result<()> {
    let Some(train) = scans.iter().find(|s| s.split == Split::Train) else {
        bail!("no train split scanned");
    };
    if train.counts.labelled == 0 {
        bail!(
            "nothing is trainable: the train split has {} images, {} usable, none with a valid box \
             (fix the problems listed above: labels under a `labels/` folder beside `images/`, rows `cls cx cy w h`)",
            train.counts.images,
            train.records.len()
        );
    }
    Ok(())
}
