//! Training: optimizer, EMA, schedules, memory budget, checkpoints, the loop.
