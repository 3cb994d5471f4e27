//! Where a training run's progress goes: the engine reports typed [`TrainEvent`]s, in order, to
//! a [`TrainObserver`] (the CLI prints them, a service logs or charts them, a test records them),
//! and [`Console`] is the observer that prints what `yolo9 train` prints (stdout, stderr and an
//! indicatif progress bar per epoch). Modelled on burn's learner events.
//!
//! The engine decides what to say and when (`--verbose` included); an observer only decides
//! where it goes.

use crate::train::report::EpochReport;

/// One thing a training run reports. Epochs and batches are 0-based; `epochs` is the run's
/// epoch count (it may change under `--time`).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum TrainEvent<'a> {
    /// One line of information (stdout in [`Console`]).
    Line(&'a str),
    /// Text that ends in its own newline, such as a dataset scan report or the metrics table
    /// (stdout in [`Console`]).
    Text(&'a str),
    /// A note or warning about the options, the data or the environment (stderr in [`Console`]).
    Note(&'a str),
    /// The batch loop of an epoch starts (`--verbose` only): `batches` in the epoch, `first` the
    /// first to run (a resumed epoch starts later), `header` the column names of
    /// [`TrainEvent::Batch`]'s `status`.
    EpochStart {
        /// The epoch (0-based).
        epoch: usize,
        /// The run's epoch count.
        epochs: usize,
        /// Batches in the epoch.
        batches: usize,
        /// The first batch to run.
        first: usize,
        /// The column names of the progress lines.
        header: &'a str,
    },
    /// A line during the batch loop, such as a skipped sample or a recovery (above the progress
    /// bar in [`Console`]).
    EpochLine(&'a str),
    /// A batch is done (`--verbose` only): the epoch's running mean `losses` (box, class, DFL,
    /// the official `mloss`), the batch's `instances` (labelled boxes) and image `size` in
    /// pixels, the device memory in use in bytes, and the progress line made of them.
    Batch {
        /// The epoch (0-based).
        epoch: usize,
        /// The batch (0-based).
        batch: usize,
        /// The epoch's running mean box, class and DFL losses.
        losses: [f32; 3],
        /// Labelled boxes in the batch.
        instances: usize,
        /// The training image size, pixels.
        size: usize,
        /// Device memory in use, bytes.
        memory: u64,
        /// The progress line.
        status: &'a str,
    },
    /// The batch loop stopped on request before the epoch's end (`--verbose` only).
    EpochAbandoned {
        /// The epoch (0-based).
        epoch: usize,
    },
    /// The batch loop finished (`--verbose` only) after `seconds` of training.
    EpochTrained {
        /// The epoch (0-based).
        epoch: usize,
        /// Seconds of training in the epoch.
        seconds: f64,
    },
    /// The epoch's row of `results.csv` was written: its losses, metrics (P, R, mAP50,
    /// mAP50-95), learning rates and memory; `improved` when it is the best so far (saved as
    /// `best.safetensors`); `summary` the line `--verbose` prints.
    EpochEnd {
        /// The epoch's row of `results.csv`.
        report: &'a EpochReport,
        /// The best epoch so far.
        improved: bool,
        /// The line `--verbose` prints.
        summary: Option<&'a str>,
    },
    /// The epoch is over (always sent, also after [`TrainEvent::EpochAbandoned`] or an error
    /// during the epoch).
    EpochClosed {
        /// The epoch (0-based).
        epoch: usize,
    },
}

impl<'a> TrainEvent<'a> {
    /// The text of the events that are text ([`TrainEvent::Line`], `Text`, `Note`, `EpochLine`
    /// and the `summary` of `EpochEnd`), for observers that keep lines.
    pub fn message(&self) -> Option<&'a str> {
        match *self {
            TrainEvent::Line(s)
            | TrainEvent::Text(s)
            | TrainEvent::Note(s)
            | TrainEvent::EpochLine(s) => Some(s),
            TrainEvent::EpochEnd { summary, .. } => summary,
            _ => None,
        }
    }
}

/// Receives the events of a training run, in order.
pub trait TrainObserver {
    /// One event of the run.
    fn event(&mut self, event: &TrainEvent<'_>);
}

/// Any `FnMut(&TrainEvent)` is an observer.
impl<F: FnMut(&TrainEvent<'_>)> TrainObserver for F {
    fn event(&mut self, event: &TrainEvent<'_>) {
        self(event)
    }
}

/// The engine's shorthands for the text events.
impl dyn TrainObserver + '_ {
    pub(crate) fn line(&mut self, line: &str) {
        self.event(&TrainEvent::Line(line));
    }

    pub(crate) fn text(&mut self, text: &str) {
        self.event(&TrainEvent::Text(text));
    }

    pub(crate) fn note(&mut self, line: &str) {
        self.event(&TrainEvent::Note(line));
    }
}

/// The observer of `yolo9 train`: lines to stdout, notes to stderr, one progress bar per epoch.
#[derive(Default)]
pub struct Console {
    bar: Option<indicatif::ProgressBar>,
}

impl Console {
    /// A console observer with no progress bar yet.
    pub fn new() -> Console {
        Console::default()
    }
}

impl TrainObserver for Console {
    fn event(&mut self, event: &TrainEvent<'_>) {
        match *event {
            TrainEvent::Line(l) => crate::text::outln!("{l}"),
            TrainEvent::Text(t) => crate::text::out!("{t}"),
            TrainEvent::Note(l) => crate::text::errln!("{l}"),
            TrainEvent::EpochStart {
                batches,
                first,
                header,
                ..
            } => {
                crate::text::outln!("{header}");
                let pb = indicatif::ProgressBar::new(batches as u64);
                pb.set_style(crate::progress::style(
                    "{msg} {bar:20} {pos}/{len} [{elapsed_precise}<{remaining}, {rate}]",
                    first as u64,
                ));
                pb.set_position(first as u64);
                self.bar = Some(pb);
            }
            TrainEvent::EpochLine(l) => match &self.bar {
                Some(pb) => pb.println(crate::text::message(l)),
                None => crate::text::errln!("{l}"),
            },
            TrainEvent::Batch { status, .. } => {
                if let Some(pb) = &self.bar {
                    pb.set_message(status.to_string());
                    pb.inc(1);
                }
            }
            TrainEvent::EpochAbandoned { .. } => {
                if let Some(pb) = &self.bar {
                    pb.abandon();
                }
            }
            TrainEvent::EpochTrained { .. } => {
                if let Some(pb) = &self.bar {
                    pb.finish();
                }
            }
            TrainEvent::EpochEnd { summary, .. } => {
                if let Some(s) = summary {
                    crate::text::outln!("{s}");
                }
            }
            TrainEvent::EpochClosed { .. } => self.bar = None,
        }
    }
}
