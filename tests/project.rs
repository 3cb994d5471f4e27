//! Whole-project tests: the crate's import layering, the output writers, and the commands of
//! README.md and docs/ (one test binary; the files are in `tests/project/`).
mod common;

mod project {
    mod architecture;
    mod readme_commands;
    mod writers;
}
