//! The `yolo9` command line linked with CUDA: the program that the `yolo9` launcher of a `cuda`
//! build runs once it has checked that the CUDA libraries can be loaded (see `src/launcher.rs`).
fn main() -> std::process::ExitCode {
    yolo9::internals::cli::main()
}
