//! Loss tests: the task-aligned assigner, the TAL loss terms and a batch's loss and gradients
//! against the official code (one test binary; the files are in `tests/loss/`).
mod common;

mod loss {
    mod assigner;
    mod batch;
    mod tal;
}
