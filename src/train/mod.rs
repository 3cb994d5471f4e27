//! Training: optimizer, EMA, schedules, memory budget, checkpoints, the loop.

pub mod ema;
pub mod optimizer;
pub mod schedule;
pub mod checkpoint;
pub mod trainer;
