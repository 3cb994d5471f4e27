//! Whole-project tests: the crate's import layering and the README's commands (one test
//! binary; the files are in `tests/project/`).
mod common;

mod project {
    mod architecture;
    mod readme_commands;
    mod writers;
}
