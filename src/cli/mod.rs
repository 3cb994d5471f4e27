//! The `yolo9` command line: one file per subcommand (clap derive), each thin: parse, call the
//! library, print.

pub mod check;
pub mod convert;
pub mod detect;
pub mod export;
mod hints;
pub mod plot;
#[cfg(feature = "serve")]
pub mod serve;
pub mod track;
pub mod train;
pub mod val;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Pure-Rust YOLOv9: detect, train, validate, convert.
#[derive(Debug, Parser)]
#[command(name = "yolo9", version, about, long_about = None)]
pub struct Cli {
    /// The subcommand and its arguments.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run detection on images, directories or globs.
    Detect(detect::DetectArgs),
    /// Convert an official YOLOv9 PyTorch checkpoint (.pt) to safetensors.
    Convert(convert::ConvertArgs),
    /// Scan a dataset (data.yaml) and report every problem, without training.
    Check(check::CheckArgs),
    /// Train a YOLOv9 model on a dataset (official train_dual.py recipe).
    Train(Box<train::TrainArgs>),
    /// Validate weights on a dataset split (official val_dual.py).
    Val(val::ValArgs),
    /// Export weights as an ONNX model (optionally with NMS inside).
    Export(export::ExportArgs),
    /// Draw training curves of results.csv files (ours or the official trainer's) in one PNG.
    Plot(plot::PlotArgs),
    /// Track objects across the frames of videos, streams and image sequences (ByteTrack).
    Track(Box<track::TrackArgs>),
    /// Serve detection over HTTP (POST /v1/detect), batching requests on one model.
    #[cfg(feature = "serve")]
    Serve(serve::ServeArgs),
}

/// Entry point used by `src/main.rs`: parses arguments, runs, and turns errors into a message
/// and a non-zero exit code (never a panic or a stack trace).
pub fn main() -> ExitCode {
    init_tracing();
    let (args, notes) = match hints::prepare(std::env::args_os().collect()) {
        Ok(x) => x,
        Err(hint) => {
            crate::text::errln!("error: {hint}");
            return ExitCode::from(2);
        }
    };
    for n in notes {
        crate::text::errln!("{n}");
    }
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Detect(a) => detect::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Check(a) => check::run(a),
        Command::Train(a) => train::run(*a),
        Command::Val(a) => val::run(a),
        Command::Export(a) => export::run(a),
        Command::Plot(a) => plot::run(a),
        Command::Track(a) => track::run(*a),
        #[cfg(feature = "serve")]
        Command::Serve(a) => serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            crate::text::errln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = crate::switches::value("YOLO9_LOG")
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("warn"));
    // A command line's messages: level and text, no timestamp or module path (YOLO9_LOG=debug
    // or yolo9=trace shows more).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Every log line through `text::message` (data-derived text escaped, URL credentials
        // redacted), so without colour codes of its own.
        .with_writer(|| crate::text::CleanStderr)
        .without_time()
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_subcommands_refuse_bad_options_at_parse_time() {
        use crate::cli::Cli;
        use clap::Parser;
        let bad: &[&[&str]] = &[
            &["yolo9", "val", "--data", "d.yaml", "--conf-thres", "2"],
            &["yolo9", "val", "--data", "d.yaml", "--conf-thres", "nan"],
            &["yolo9", "val", "--data", "d.yaml", "--iou-thres", "5"],
            &["yolo9", "val", "--data", "d.yaml", "--max-det", "0"],
            &["yolo9", "val", "--data", "d.yaml", "--batch", "0"],
            &["yolo9", "val", "--data", "d.yaml", "--img", "100000"],
            &["yolo9", "train", "--data", "d.yaml", "--img", "100000"],
            &["yolo9", "train", "--data", "d.yaml", "--micro-batch", "0"],
            &["yolo9", "train", "--data", "d.yaml", "--workers", "1000"],
        ];
        for args in bad {
            assert!(Cli::try_parse_from(*args).is_err(), "accepted {args:?}");
        }
        assert!(
            Cli::try_parse_from(["yolo9", "val", "--data", "d.yaml", "--conf-thres", "0.1"])
                .is_ok()
        );
        assert!(
            Cli::try_parse_from(["yolo9", "train", "--data", "d.yaml", "--img", "320"]).is_ok()
        );
    }
}
