//! The `yolo9` command line. Every subcommand lives in `yolo9::internals::cli`.
//!
//! In a `cuda` build this binary is only the launcher ([`launcher`]): it checks that the CUDA
//! libraries can be loaded and then runs `yolo9-cuda` (`src/bin/yolo9-cuda.rs`), the same
//! command line linked with CUDA.
#[cfg(feature = "cuda")]
mod launcher;

#[cfg(not(feature = "cuda"))]
fn main() -> std::process::ExitCode {
    yolo9::internals::cli::main()
}

#[cfg(feature = "cuda")]
fn main() -> std::process::ExitCode {
    launcher::main()
}
