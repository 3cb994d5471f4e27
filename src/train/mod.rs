//! Training: optimizer, EMA, schedules, memory budget, checkpoints, the loop.

pub mod budget;
pub mod checkpoint;
pub mod ema;
pub mod guard;
pub mod optimizer;
pub mod plots;
pub mod schedule;
pub mod trainer;
