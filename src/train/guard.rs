//! What keeps a run alive: stop requests from SIGINT/SIGTERM, the last known-good state for the
//! NaN/Inf guard, finiteness checks, and injected faults that let tests exercise every recovery
//! path on the CPU.
//!
//! - [`StopFlag`]: the first SIGINT or SIGTERM asks the trainer to stop at the next batch
//!   boundary (it saves the full state and prints the resume command, exit code 0); a second
//!   one ends the process at once with code 130.
//! - [`GoodState`]: a copy (on the training device) of parameters, BN statistics, optimizer
//!   momentum and EMA, taken whenever a checkpoint is written; after `--nan-patience` non-finite
//!   steps in a row the trainer restores it and halves the LR.
//! - [`Faults`]: `YOLO9_FAULTS="nan@3,oom>2,stop@5"` (or [`Faults`] set in code) replaces the
//!   loss at iteration 3 by NaN, makes every micro-batch of more than 2 images fail with an
//!   out-of-memory error after its forward pass, and requests a stop after iteration 5;
//!   `stop@scan`, `stop@sizing` and `stop@val` request one as that phase starts.

use crate::model::yolov9::{BnSnapshot, YoloV9Train};
use crate::train::ema::Ema;
use crate::train::optimizer::Optimizer;
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// A stop request for one run: set by SIGINT/SIGTERM (process-wide, see the module docs) or by
/// [`StopFlag::request`] (this run only, so concurrent runs in one process stay independent).
#[derive(Clone)]
pub struct StopFlag {
    signal: Arc<AtomicBool>,
    local: Arc<AtomicBool>,
}

static SIGNAL: OnceLock<Arc<AtomicBool>> = OnceLock::new();

impl StopFlag {
    /// A new flag for a run; installs the signal handlers on first use and clears an earlier
    /// signal (a stopped run already acted on it). Errors when the handlers cannot be installed.
    pub fn install() -> Result<StopFlag> {
        let signal = match SIGNAL.get() {
            Some(f) => f.clone(),
            None => {
                let f = Arc::new(AtomicBool::new(false));
                #[cfg(unix)]
                for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                    // Order matters: the exit check runs first, so only a second signal exits.
                    signal_hook::flag::register_conditional_shutdown(sig, 130, f.clone())
                        .context("installing the SIGINT/SIGTERM handler")?;
                    signal_hook::flag::register(sig, f.clone())
                        .context("installing the SIGINT/SIGTERM handler")?;
                }
                let _ = SIGNAL.set(f.clone());
                SIGNAL.get().cloned().unwrap_or(f)
            }
        };
        signal.store(false, Ordering::SeqCst);
        Ok(StopFlag {
            signal,
            local: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Whether a stop was requested (by a signal or for this run).
    pub fn requested(&self) -> bool {
        self.signal.load(Ordering::SeqCst) || self.local.load(Ordering::SeqCst)
    }

    /// Requests a stop of this run (as a signal would).
    pub fn request(&self) {
        self.local.store(true, Ordering::SeqCst)
    }

    /// This flag as a [`crate::cancel::Cancel`] for the phases that poll one (scan, sizing,
    /// validation).
    pub fn cancel(&self) -> crate::cancel::Cancel {
        let s = self.clone();
        crate::cancel::Cancel::new(move || s.requested())
    }
}

/// A phase of a run at whose start [`Faults::stop_in`] requests a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The dataset scan (`stop@scan`).
    Scan,
    /// The memory-budget sizing (`stop@sizing`).
    Sizing,
    /// The validation after an epoch's batches (`stop@val`).
    Val,
}

/// Injected faults for tests (see the module docs). Empty by default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Iterations whose loss is replaced by NaN.
    pub nan_at: Vec<usize>,
    /// Micro-batches larger than this fail with an out-of-memory error after their forward.
    pub oom_above: Option<usize>,
    /// A stop is requested after this iteration.
    pub stop_at: Option<usize>,
    /// The process kills itself (SIGKILL; an abort elsewhere) in the middle of this iteration's
    /// step, after its first forward (`kill@N`): a rank dying mid-step, for the data-parallel
    /// failure tests.
    pub kill_at: Option<usize>,
    /// A stop is requested when this phase starts.
    pub stop_in: Option<Phase>,
}

impl Faults {
    /// Parses `nan@N`, `oom>K` and `stop@N` items separated by commas. Errors name the item.
    pub fn parse(s: &str) -> Result<Faults> {
        let mut f = Faults::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let num = |v: &str| -> Result<usize> {
                v.parse()
                    .with_context(|| format!("YOLO9_FAULTS item '{item}': '{v}' is not a number"))
            };
            if let Some(v) = item.strip_prefix("nan@") {
                f.nan_at.push(num(v)?);
            } else if let Some(v) = item.strip_prefix("kill@") {
                f.kill_at = Some(num(v)?);
            } else if let Some(v) = item.strip_prefix("oom>") {
                f.oom_above = Some(num(v)?);
            } else if let Some(v) = item.strip_prefix("stop@") {
                match v {
                    "scan" => f.stop_in = Some(Phase::Scan),
                    "sizing" => f.stop_in = Some(Phase::Sizing),
                    "val" => f.stop_in = Some(Phase::Val),
                    _ => f.stop_at = Some(num(v)?),
                }
            } else {
                bail!(
                    "YOLO9_FAULTS item '{item}': expected nan@N, oom>K, kill@N, stop@N or \
                     stop@scan|sizing|val"
                );
            }
        }
        Ok(f)
    }

    /// Faults from the `YOLO9_FAULTS` environment variable (none when unset).
    pub fn from_env() -> Result<Faults> {
        match crate::switches::var("YOLO9_FAULTS").ok_or(()) {
            Ok(s) => Faults::parse(&s),
            Err(_) => Ok(Faults::default()),
        }
    }

    /// True when nothing is injected.
    pub fn is_empty(&self) -> bool {
        *self == Faults::default()
    }
}

/// Ends the process at once, as a kill would ([`Faults::kill_at`]): SIGKILL on Unix (no
/// destructor, no flush, sockets closed by the kernel), an abort elsewhere.
pub fn die() -> ! {
    #[cfg(unix)]
    // SAFETY: kill(2) on this process's own id; it does not return.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// True when every element of every tensor is finite (no NaN, no ±Inf).
pub fn all_finite<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Result<bool> {
    // 0·x is 0 for finite x and NaN for NaN/±Inf; the sums keep any NaN. One read back for all.
    let mut sums = Vec::new();
    for t in tensors {
        sums.push((t * 0.0)?.sum_all()?.to_dtype(candle_core::DType::F32)?);
    }
    if sums.is_empty() {
        return Ok(true);
    }
    let s = Tensor::stack(&sums, 0)?.sum_all()?.to_scalar::<f32>()?;
    Ok(s.is_finite())
}

/// A copy of the trainable state (parameters, BN statistics, optimizer momentum, EMA), on the
/// training device, for the NaN guard's rollback.
pub struct GoodState {
    vars: Vec<Tensor>,
    bn: BnSnapshot,
    optim: Vec<(String, Tensor)>,
    ema: Vec<(String, Tensor)>,
    ema_updates: u64,
    /// Where the state comes from (e.g. `epoch 3, batch 0`), for messages.
    pub label: String,
}

impl GoodState {
    /// Copies the current state.
    pub fn take(
        model: &YoloV9Train,
        opt: &Optimizer,
        ema: &Ema,
        label: String,
    ) -> Result<GoodState> {
        Ok(GoodState {
            vars: model
                .vars()
                .iter()
                .map(|v| v.var.as_tensor().copy())
                .collect::<candle_core::Result<_>>()?,
            bn: model.snapshot_bn()?,
            // Copies: on CUDA the optimizer buffers and the EMA are updated in place.
            optim: opt
                .state()
                .into_iter()
                .map(|(n, t)| Ok((n, t.copy()?)))
                .collect::<candle_core::Result<_>>()?,
            ema: ema
                .state
                .iter()
                .map(|(n, t)| Ok((n.clone(), t.copy()?)))
                .collect::<candle_core::Result<_>>()?,
            ema_updates: ema.updates,
            label,
        })
    }

    /// Puts the copied state back.
    pub fn restore(&self, model: &YoloV9Train, opt: &mut Optimizer, ema: &mut Ema) -> Result<()> {
        for (v, t) in model.vars().iter().zip(&self.vars) {
            v.var.set(t)?;
        }
        model.restore_bn(&self.bn)?;
        opt.load_state(&self.optim)?;
        ema.state = self
            .ema
            .iter()
            .map(|(n, t)| Ok((n.clone(), t.copy()?)))
            .collect::<candle_core::Result<_>>()?;
        ema.updates = self.ema_updates;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn faults_parse_and_reject_bad_items() {
        let f = Faults::parse("nan@3, nan@4,oom>2,stop@5").unwrap();
        assert_eq!(f.nan_at, vec![3, 4]);
        assert_eq!(f.oom_above, Some(2));
        assert_eq!(f.stop_at, Some(5));
        assert!(Faults::parse("").unwrap().is_empty());
        let e = Faults::parse("nan@x").unwrap_err().to_string();
        assert!(e.contains("nan@x"), "{e}");
        assert!(Faults::parse("boom").is_err());
    }

    #[test]
    fn finiteness_is_checked_per_element() {
        let d = Device::Cpu;
        let ok = Tensor::new(&[1f32, -2.0, 3e30], &d).unwrap();
        let nan = Tensor::new(&[1f32, f32::NAN], &d).unwrap();
        let inf = Tensor::new(&[f32::NEG_INFINITY, 0.0], &d).unwrap();
        assert!(all_finite([&ok]).unwrap());
        assert!(!all_finite([&ok, &nan]).unwrap());
        assert!(!all_finite([&inf]).unwrap());
    }

    #[test]
    fn stop_requests_are_per_run() {
        let a = StopFlag::install().unwrap();
        let b = StopFlag::install().unwrap();
        let a2 = a.clone();
        assert!(!a.requested());
        a.request();
        assert!(a2.requested() && !b.requested());
    }
}
