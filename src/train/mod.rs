//! Training: options, the training step, optimizer, EMA, schedules, memory budget, checkpoints,
//! the loop ([`trainer::train`]) and its parts (setup, epoch, run state, report, observer).

pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod checkpoint;
pub(crate) mod dist;
pub(crate) mod ema;
mod epoch;
pub(crate) mod graphed;
pub(crate) mod guard;
pub mod observer;
pub(crate) mod optimizer;
pub mod options;
pub(crate) mod pass;
pub(crate) mod plots;
pub(crate) mod report;
pub(crate) mod schedule;
mod setup;
mod state;
pub(crate) mod step;
pub mod trainer;

pub use options::{Hyp, TrainOptions};
