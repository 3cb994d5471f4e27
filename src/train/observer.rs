//! Where a training run's progress output goes: the [`TrainObserver`] trait the engine reports
//! through (the CLI prints, a service logs, a test records), and [`Console`], the observer that
//! prints what `yolo9 train` prints (stdout, stderr and an indicatif progress bar per epoch).
//!
//! The engine decides what to say and when (`--verbose` included); an observer only decides
//! where it goes.

/// Receives the output of a training run, in order.
pub trait TrainObserver {
    /// One line of information (stdout in [`Console`]).
    fn line(&mut self, line: &str);
    /// Text that ends in its own newline, such as a scan report or the metrics table (stdout in
    /// [`Console`]).
    fn text(&mut self, text: &str);
    /// A note or warning about the options or the environment (stderr in [`Console`]).
    fn note(&mut self, line: &str);
    /// The batch loop of an epoch starts (`--verbose` only): its column `header`, `batches` in
    /// the epoch, `first` the first batch to run (a resumed epoch starts later).
    fn epoch_start(&mut self, header: &str, batches: usize, first: usize);
    /// A line during the epoch, such as a skipped sample or a recovery (`--verbose` only; above
    /// the progress bar in [`Console`]).
    fn epoch_line(&mut self, line: &str);
    /// One batch of the epoch is done; `status` is the progress line (`--verbose` only).
    fn batch_done(&mut self, status: &str);
    /// The batch loop stopped on request before the epoch's end (`--verbose` only).
    fn epoch_abandoned(&mut self);
    /// The batch loop of the epoch finished (`--verbose` only).
    fn epoch_trained(&mut self);
    /// The epoch is over (always called, also after [`TrainObserver::epoch_abandoned`] or an
    /// error during the epoch).
    fn epoch_closed(&mut self);
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
    fn line(&mut self, line: &str) {
        crate::text::outln!("{line}");
    }

    fn text(&mut self, text: &str) {
        crate::text::out!("{text}");
    }

    fn note(&mut self, line: &str) {
        crate::text::errln!("{line}");
    }

    fn epoch_start(&mut self, header: &str, batches: usize, first: usize) {
        crate::text::outln!("{header}");
        let pb = indicatif::ProgressBar::new(batches as u64);
        pb.set_style(crate::progress::style(
            "{msg} {bar:20} {pos}/{len} [{elapsed_precise}<{remaining}, {rate}]",
            first as u64,
        ));
        pb.set_position(first as u64);
        self.bar = Some(pb);
    }

    fn epoch_line(&mut self, line: &str) {
        match &self.bar {
            Some(pb) => pb.println(crate::text::message(line)),
            None => crate::text::errln!("{line}"),
        }
    }

    fn batch_done(&mut self, status: &str) {
        if let Some(pb) = &self.bar {
            pb.set_message(status.to_string());
            pb.inc(1);
        }
    }

    fn epoch_abandoned(&mut self) {
        if let Some(pb) = &self.bar {
            pb.abandon();
        }
    }

    fn epoch_trained(&mut self) {
        if let Some(pb) = &self.bar {
            pb.finish();
        }
    }

    fn epoch_closed(&mut self) {
        self.bar = None;
    }
}
