//! Cooperative cancellation of the long phases of a run: the dataset scan, the memory-budget
//! sizing, the training batches and validation each ask a [`Cancel`] between units of work (an
//! image, a probe step, a batch) and end with [`Stopped`] when a stop was requested, so the first
//! SIGINT/SIGTERM is honoured within one unit in every phase (`yolo9 train` saves its state when
//! there is state to save; see `crate::train::trainer`).
//!
//! A [`Cancel`] is a cheap, cloneable view of whatever decides (the trainer's stop flag, a
//! service's shutdown); [`Cancel::never`] is the default and costs nothing.

use std::sync::Arc;

/// A stop request that long phases poll. `Default` is [`Cancel::never`].
#[derive(Clone, Default)]
pub struct Cancel(Option<Arc<dyn Fn() -> bool + Send + Sync>>);

impl Cancel {
    /// A cancel that asks `f` whether a stop was requested.
    pub fn new(f: impl Fn() -> bool + Send + Sync + 'static) -> Cancel {
        Cancel(Some(Arc::new(f)))
    }

    /// A cancel that never requests a stop.
    pub fn never() -> Cancel {
        Cancel(None)
    }

    /// Whether a stop was requested.
    pub fn requested(&self) -> bool {
        self.0.as_ref().is_some_and(|f| f())
    }

    /// `Err(Stopped { phase })` when a stop was requested.
    pub fn check(&self, phase: &'static str) -> Result<(), Stopped> {
        if self.requested() {
            Err(Stopped { phase })
        } else {
            Ok(())
        }
    }
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Cancel(..)"
        } else {
            "Cancel::never"
        })
    }
}

/// The error of a phase that ended early on a stop request; `phase` names it ("the dataset scan",
/// "the memory-budget sizing", "validation"). Find it in an error chain with
/// [`Stopped::in_chain`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stopped on request during {phase}")]
pub struct Stopped {
    /// The phase that was interrupted.
    pub phase: &'static str,
}

impl Stopped {
    /// The [`Stopped`] in `err`'s chain of causes, if any.
    pub fn in_chain(err: &anyhow::Error) -> Option<&Stopped> {
        err.chain().find_map(|e| e.downcast_ref::<Stopped>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_cancel_reports_the_flag_and_names_the_phase() {
        assert!(!Cancel::never().requested());
        assert!(Cancel::default().check("x").is_ok());
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let c = Cancel::new(move || f.load(Ordering::SeqCst));
        assert!(c.check("the dataset scan").is_ok());
        flag.store(true, Ordering::SeqCst);
        let e = c.clone().check("the dataset scan").unwrap_err();
        assert_eq!(e.to_string(), "stopped on request during the dataset scan");
        let chained = anyhow::Error::new(e).context("reading the train split");
        assert_eq!(
            Stopped::in_chain(&chained).map(|s| s.phase),
            Some("the dataset scan")
        );
        assert!(Stopped::in_chain(&anyhow::anyhow!("other")).is_none());
    }
}
