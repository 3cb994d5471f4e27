//! Training tests: tiny runs, options, the optimizer, and the guards (OOM, NaN, stop, resume,
//! budget) (one test binary; the files are in `tests/train/`).
mod common;

mod train {
    mod dist;
    mod gelan;
    mod guard;
    mod optim;
    mod options;
    mod tiny;
}
