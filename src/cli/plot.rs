//! `yolo9 plot`: training curves of one or more results.csv files (ours or the official
//! trainer's) in one figure (see [`crate::train::plots`]).

use crate::train::plots::{plot_results, read_results_csv};
use anyhow::{ensure, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `yolo9 plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// results.csv files (or run folders holding one), drawn in this order.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Legend labels, one per file (default: the run folder names).
    #[arg(long, num_args = 1..)]
    pub labels: Vec<String>,
    /// Output PNG [default: results.png beside the first results file (in its run folder)].
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Runs `yolo9 plot`.
pub fn run(a: PlotArgs) -> Result<()> {
    ensure!(
        a.labels.is_empty() || a.labels.len() == a.results.len(),
        "--labels: {} labels for {} files",
        a.labels.len(),
        a.results.len()
    );
    let mut runs = Vec::new();
    let mut inputs = crate::outfile::Inputs::none();
    for (i, p) in a.results.iter().enumerate() {
        let csv = if p.is_dir() {
            p.join("results.csv")
        } else {
            p.clone()
        };
        let label = match a.labels.get(i) {
            Some(l) => l.clone(),
            None => csv
                .parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| crate::text::path(&csv).to_string()),
        };
        runs.push(read_results_csv(&csv, &label)?);
        inputs.add(&csv);
    }
    let output = a.output.clone().unwrap_or_else(|| {
        let first = &a.results[0];
        let dir = if first.is_dir() {
            first.clone()
        } else {
            first
                .parent()
                .map(|p| p.to_path_buf())
                .unwrap_or_else(|| PathBuf::from("."))
        };
        dir.join("results.png")
    });
    // `-o` onto one of the results files (or a FIFO, a folder) is refused before drawing.
    crate::outfile::check(&output, &inputs)?;
    plot_results(&runs, &output)?;
    crate::text::outln!("wrote {}", crate::text::path(&output));
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Without `-o` the figure goes beside the first results file (a csv, or a run folder's
    /// results.csv), never into the working directory.
    #[test]
    fn the_default_output_is_beside_the_first_results_file() {
        let dir = std::env::temp_dir().join(format!("yolo9-plot-cli-{}", std::process::id()));
        let run = dir.join("runs/exp");
        std::fs::create_dir_all(&run).unwrap();
        let row = "0,4.6,5.1,5.3,0.01,0.1,0.002,0.0005,1,2,3,0.1,0.001,0.001,1,2,0,0,0,16";
        let text = format!("{}\n{row}\n", crate::train::report::RESULTS_HEADER);
        std::fs::write(run.join("results.csv"), &text).unwrap();
        std::fs::write(dir.join("other.csv"), &text).unwrap();
        let args = |results: Vec<std::path::PathBuf>| super::PlotArgs {
            results,
            labels: Vec::new(),
            output: None,
        };
        super::run(args(vec![dir.join("other.csv"), run.clone()])).unwrap();
        assert!(dir.join("results.png").is_file());
        assert!(!run.join("results.png").exists());
        super::run(args(vec![run.clone()])).unwrap();
        assert!(run.join("results.png").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
