//! The `results.csv` file of a run: its header, one [`EpochReport`] per line (written after each
//! epoch), the epoch's summary line, and the reader of `results.csv` files written by `yolo9 train`
//! or by the official `train_dual.py` (for `results.png` and `yolo9 plot`).

use crate::memory::fmt_size;
use anyhow::{ensure, Context, Result};
use std::path::Path;

/// One line of `results.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochReport {
    /// Epoch (0-based).
    pub epoch: usize,
    /// Mean training losses `[box, cls, dfl]` of the epoch (official `mloss`).
    pub train_loss: [f32; 3],
    /// Mean training mask loss of a segmentation model (the `train/seg_loss` column, after the
    /// detection columns).
    pub seg_loss: Option<f32>,
    /// A segmentation model's mask P, R, mAP50, mAP50-95 of the EMA on the val split (zeros
    /// when not validated; the last four columns).
    pub mask_metrics: Option<[f64; 4]>,
    /// Precision, recall, mAP50, mAP50-95 of the EMA on the val split (zeros when not validated).
    pub metrics: [f64; 4],
    /// Val losses `[box, cls, dfl]` (zeros when not validated).
    pub val_loss: [f32; 3],
    /// A segmentation model's val mask loss (the `val/seg_loss` column, last; zero when not
    /// validated).
    pub val_seg_loss: Option<f32>,
    /// LR of the groups `[bias, weight, bn_weight]` at the last iteration.
    pub lr: [f64; 3],
    /// Resident memory in bytes at the end of the epoch.
    pub rss: u64,
    /// Peak memory of the epoch in bytes (device memory on CUDA, RSS on the CPU; training and
    /// validation).
    pub peak_mem: u64,
    /// Samples skipped (undecodable) during the epoch.
    pub skipped: usize,
    /// Non-finite losses or gradients (steps skipped) during the epoch.
    pub nan_events: usize,
    /// Out-of-memory recoveries during the epoch.
    pub oom_events: usize,
    /// Micro-batch at the end of the epoch.
    pub micro: usize,
    /// Training images per second.
    pub img_per_s: f64,
    /// Whether validation ran.
    pub validated: bool,
}

/// The `results.csv` header.
pub const RESULTS_HEADER: &str = "epoch,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision,metrics/recall,metrics/mAP50,metrics/mAP50-95,val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2,rss,peak_mem,skipped,nan_events,oom_events,micro";

fn csv_row(r: &EpochReport) -> String {
    format!(
        "{},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.5},{:.6e},{:.6e},{:.6e},{},{},{},{},{},{}",
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
        r.peak_mem,
        r.skipped,
        r.nan_events,
        r.oom_events,
        r.micro
    ) + &r.seg_loss.map(|v| format!(",{v:.5}")).unwrap_or_default()
        + &r
            .mask_metrics
            .map(|m| format!(",{:.5},{:.5},{:.5},{:.5}", m[0], m[1], m[2], m[3]))
            .unwrap_or_default()
        + &r.val_seg_loss
            .map(|v| format!(",{v:.5}"))
            .unwrap_or_default()
}

/// The extra last columns of a segmentation run's `results.csv`: its training mask loss, mask
/// metrics and val mask loss.
pub const SEG_COLUMNS: &str = "train/seg_loss,metrics/precision(M),metrics/recall(M),metrics/mAP50(M),metrics/mAP50-95(M),val/seg_loss";

impl EpochReport {
    /// The line printed after the epoch (`--verbose`): losses, speed, `train_secs` and
    /// `val_secs`, peak memory of `mem` (what the memory probe measures), counters and `fitness`,
    /// for a run of `epochs` epochs.
    pub(crate) fn summary(
        &self,
        epochs: usize,
        train_secs: f64,
        val_secs: f64,
        mem: &str,
        fitness: f64,
    ) -> String {
        format!(
            "epoch {}/{}: train box {:.4} cls {:.4} dfl {:.4}{}; {:.2} img/s; train {:.1} s, val {:.1} s; peak {} {}; \
             {} skipped, {} non-finite, {} OOM recoveries; fitness {:.4}",
            self.epoch + 1,
            epochs,
            self.train_loss[0],
            self.train_loss[1],
            self.train_loss[2],
            self.seg_loss
                .map(|v| format!(" seg {v:.4}"))
                .unwrap_or_default(),
            self.img_per_s,
            train_secs,
            val_secs,
            fmt_size(self.peak_mem),
            mem,
            self.skipped,
            self.nan_events,
            self.oom_events,
            fitness
        )
    }
}

/// Creates `run_dir/results.csv` with its header line (a new run; `seg`: a segmentation run,
/// with the [`SEG_COLUMNS`] last).
pub(crate) fn create_results_csv(run_dir: &Path, seg: bool) -> Result<()> {
    let extra = if seg {
        format!(",{SEG_COLUMNS}")
    } else {
        String::new()
    };
    crate::outfile::write(
        &run_dir.join("results.csv"),
        format!("{RESULTS_HEADER}{extra}\n").as_bytes(),
        &crate::outfile::Inputs::none(),
    )
}

/// Appends the line of `report` to `run_dir/results.csv`: the file is written whole again through
/// [`crate::outfile::write`] (a temporary beside it, fsync, rename), so a crash mid-write leaves
/// the previous epochs' file, never a torn line. A missing file starts from the row alone.
pub(crate) fn append_results_csv(run_dir: &Path, report: &EpochReport) -> Result<()> {
    let csv = run_dir.join("results.csv");
    let mut text =
        match crate::bounded::read_text_capped(&csv, crate::bounded::FileKind::ResultsCsv) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("{}: cannot read results.csv", crate::text::path(&run_dir))
                })
            }
        };
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&csv_row(report));
    text.push('\n');
    crate::outfile::write(&csv, text.as_bytes(), &crate::outfile::Inputs::none()).with_context(
        || {
            format!(
                "{}: cannot append to results.csv",
                crate::text::path(&run_dir)
            )
        },
    )
}

/// The ten panels: (title, column names accepted for it in a results.csv).
pub const PANELS: [(&str, &[&str]); 10] = [
    ("train/box_loss", &["train/box_loss"]),
    ("train/cls_loss", &["train/cls_loss"]),
    ("train/dfl_loss", &["train/dfl_loss"]),
    ("metrics/precision", &["metrics/precision"]),
    ("metrics/recall", &["metrics/recall"]),
    ("val/box_loss", &["val/box_loss"]),
    ("val/cls_loss", &["val/cls_loss"]),
    ("val/dfl_loss", &["val/dfl_loss"]),
    ("metrics/mAP50", &["metrics/mAP50", "metrics/mAP_0.5"]),
    (
        "metrics/mAP50-95",
        &["metrics/mAP50-95", "metrics/mAP_0.5:0.95"],
    ),
];

/// One run's curves: the epochs and, per panel of [`PANELS`], its values (`None` where the
/// file has no such column).
#[derive(Debug, Clone)]
pub struct Curves {
    /// Legend label.
    pub label: String,
    /// Epoch numbers (as written, 0-based).
    pub epochs: Vec<f64>,
    /// Values per panel, in [`PANELS`] order.
    pub series: Vec<Option<Vec<f64>>>,
}

/// Reads a results.csv written by `yolo9 train` or by the official `train_dual.py` (column
/// names trimmed of padding). Errors name the file, and the line of a non-numeric value.
pub fn read_results_csv(path: &Path, label: &str) -> Result<Curves> {
    let file = crate::text::path(&path).to_string();
    let text = crate::bounded::read_text_capped(path, crate::bounded::FileKind::ResultsCsv)
        .with_context(|| format!("{file}: cannot read"))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()
        .with_context(|| format!("{file}: empty file"))?
        .split(',')
        .map(|h| h.trim().to_string())
        .collect();
    let col = |names: &[&str]| header.iter().position(|h| names.contains(&h.as_str()));
    let epoch_col = col(&["epoch"])
        .with_context(|| format!("{file}: no `epoch` column; is this a results.csv?"))?;
    let mut rows: Vec<Vec<f64>> = Vec::new();
    for (i, line) in lines.enumerate() {
        let vals: Result<Vec<f64>> = line
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .with_context(|| format!("{file}:{}: '{}' is not a number", i + 2, v.trim()))
            })
            .collect();
        let vals = vals?;
        ensure!(
            vals.len() >= header.len(),
            "{file}:{}: {} values for {} columns",
            i + 2,
            vals.len(),
            header.len()
        );
        rows.push(vals);
    }
    let epochs = rows.iter().map(|r| r[epoch_col]).collect();
    let series = PANELS
        .iter()
        .map(|(_, names)| col(names).map(|c| rows.iter().map(|r| r[c]).collect()))
        .collect();
    Ok(Curves {
        label: label.to_string(),
        epochs,
        series,
    })
}
