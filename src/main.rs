//! The `yolo9` command line. Every subcommand lives in `yolo9::cli`.
fn main() -> std::process::ExitCode {
    yolo9::cli::main()
}
