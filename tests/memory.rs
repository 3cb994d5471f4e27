//! Measurements of the process's memory (RSS) on the CPU (the files are in `tests/memory/`).
//! A test binary of their own: the probe reads the whole process's RSS, so no other test may run
//! beside them; they also take [`alone`] so that they never run at the same time as each other.
/// Held for the whole of each measurement: the tests of this binary run one at a time even with
/// `--include-ignored` (a failed test's poisoned lock is taken all the same).
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

mod memory {
    mod footprint_floor;
    mod probe_window;
    mod train_budget;
}
