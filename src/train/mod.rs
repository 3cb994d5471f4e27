//! Training: options, the training step, optimizer, EMA, schedules, memory budget, checkpoints,
//! the loop ([`trainer::train`]) and its parts (setup, epoch, run state, report, observer).

pub mod budget;
pub mod cache;
pub mod checkpoint;
pub mod dist;
pub mod ema;
mod epoch;
pub mod graphed;
pub mod guard;
pub mod observer;
pub mod optimizer;
pub mod options;
pub mod pass;
pub mod plots;
pub mod report;
pub mod schedule;
mod setup;
mod state;
pub mod step;
pub mod trainer;

pub use options::{Hyp, TrainOptions};
