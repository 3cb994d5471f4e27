//! The `yolo9` entry point of a `cuda` build: checks that this machine can load the CUDA
//! program, then replaces itself with it.
//!
//! Candle links its CUDA libraries (`libcuda.so.1`, cuBLAS, cuRAND, cuDNN, the CUDA runtime)
//! dynamically, so a program that uses them cannot start where one is missing: the system's
//! dynamic loader stops it before `main`, with only "error while loading shared libraries". The
//! `cuda` build therefore installs two programs side by side: this launcher, `yolo9`, which uses
//! nothing but the standard library (so it needs none of those libraries), and the real
//! program, `yolo9-cuda`. The launcher asks the loader which libraries `yolo9-cuda` needs and
//! cannot find (glibc's `LD_TRACE_LOADED_OBJECTS=1`: list, do not run). When some are missing it
//! names each with what provides it and how to go on, and exits with status 2; otherwise it
//! `exec`s `yolo9-cuda` with the same arguments (same process id, so signals such as the
//! SIGTERM that stops `yolo9 train` reach the real program).
//!
//! The launcher binary compiles this file as its own module (`src/main.rs`), not through the
//! library, so that it links nothing of candle; the file must stay free of any dependency beyond
//! `std`. The library compiles it too, for its tests and for callers that want the checks.
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// File name of the real program, next to the launcher.
pub const REAL_PROGRAM: &str = "yolo9-cuda";

/// Runs the launcher: check, then `exec` (returns only on failure).
pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let real = match real_program() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let missing = missing_libraries(&real);
    if !missing.is_empty() {
        eprint!("{}", missing_message(&real, &missing));
        return ExitCode::from(2);
    }
    let err = Command::new(&real).args(&args).exec();
    eprintln!("error: cannot start {}: {err}", real.display());
    ExitCode::from(2)
}

/// `yolo9-cuda` next to this executable. Errors name the expected path and how to build it.
fn real_program() -> Result<PathBuf, String> {
    let me =
        std::env::current_exe().map_err(|e| format!("cannot find this program's own path: {e}"))?;
    let real = me.with_file_name(REAL_PROGRAM);
    if real.is_file() {
        Ok(real)
    } else {
        Err(format!(
            "this is the launcher of yolo9's CUDA build; the program itself, {}, is missing. \
             `cargo build --release --features cuda` builds both into the same folder \
             (copy `yolo9` and `{REAL_PROGRAM}` together), or use the CPU build \
             (`cargo build --release`).",
            real.display()
        ))
    }
}

/// The shared libraries that the loader would not find for `program`, as it reports them
/// (`libcuda.so.1 => not found`). Empty when all are found, or when the loader cannot be asked
/// (not glibc): then starting the program is the only test left.
pub fn missing_libraries(program: &Path) -> Vec<String> {
    let out = match Command::new(program)
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(_) => return Vec::new(),
    };
    parse_not_found(&String::from_utf8_lossy(&out.stdout))
}

/// Library names from the lines `name => not found` of a loader trace.
pub fn parse_not_found(trace: &str) -> Vec<String> {
    trace
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once("=>")?;
            (rest.trim() == "not found").then(|| name.trim().to_string())
        })
        .collect()
}

/// What provides a CUDA library, by its file name.
fn provider(lib: &str) -> &'static str {
    if lib.starts_with("libcuda.so") {
        "the NVIDIA driver (install it, or run on a machine with an NVIDIA GPU)"
    } else if lib.starts_with("libcudnn") {
        "cuDNN 9 (e.g. pip package nvidia-cudnn-cu13)"
    } else if lib.starts_with("libcublas")
        || lib.starts_with("libcurand")
        || lib.starts_with("libcudart")
        || lib.starts_with("libnvrtc")
    {
        "the CUDA 13 runtime libraries (CUDA toolkit, or pip packages nvidia-*-cu13)"
    } else {
        "a system library"
    }
}

/// The message for missing libraries: each with its provider, then the ways forward.
pub fn missing_message(program: &Path, missing: &[String]) -> String {
    let mut s = format!(
        "error: yolo9 was built with CUDA, and this machine lacks libraries that {} needs:\n",
        program.display()
    );
    for lib in missing {
        s.push_str(&format!("  {lib}: from {}\n", provider(lib)));
    }
    s.push_str(
        "Install them or add their folders to LD_LIBRARY_PATH; on a machine without an NVIDIA \
         GPU use the CPU build instead (`cargo build --release`, no CUDA needed).\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_trace_not_found_lines() {
        let trace = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                     \tlibcuda.so.1 => not found\n\
                     \tlibcublas.so.13 => /opt/x/libcublas.so.13 (0x00007f)\n\
                     \tlibcudnn.so.9 => not found\n\
                     \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_not_found(trace),
            vec!["libcuda.so.1", "libcudnn.so.9"]
        );
        assert!(parse_not_found("").is_empty());
    }

    #[test]
    fn message_names_each_library_and_its_provider() {
        let m = missing_message(
            Path::new("/x/yolo9-cuda"),
            &[
                "libcuda.so.1".into(),
                "libcurand.so.10".into(),
                "libcudnn.so.9".into(),
            ],
        );
        assert!(m.contains("/x/yolo9-cuda"), "{m}");
        assert!(m.contains("libcuda.so.1: from the NVIDIA driver"), "{m}");
        assert!(
            m.contains("libcurand.so.10: from the CUDA 13 runtime"),
            "{m}"
        );
        assert!(m.contains("libcudnn.so.9: from cuDNN 9"), "{m}");
        assert!(m.contains("cargo build --release"), "{m}");
    }

    /// A program whose libraries are all present is reported with none missing (glibc's loader
    /// lists them without running it).
    #[test]
    fn present_libraries_are_not_reported() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(missing_libraries(&me), Vec::<String>::new());
    }

    /// A copy of this test program whose needed `libgcc_s.so.1` is renamed (same length) to a
    /// library that exists nowhere: the loader reports exactly that one.
    #[test]
    fn a_missing_library_is_reported() {
        let me = std::env::current_exe().unwrap();
        let mut bytes = std::fs::read(&me).unwrap();
        let (from, to) = (b"libgcc_s.so.1\0", b"libnone.so.99\0");
        let mut n = 0;
        for i in 0..bytes.len() - from.len() {
            if &bytes[i..i + from.len()] == from {
                bytes[i..i + from.len()].copy_from_slice(to);
                n += 1;
            }
        }
        assert!(n >= 1, "this test program does not name libgcc_s.so.1");
        let dir = std::env::temp_dir().join(format!("yolo9-launcher-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("needs-missing-lib");
        std::fs::write(&copy, &bytes).unwrap();
        std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let missing = missing_libraries(&copy);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(missing, vec!["libnone.so.99"]);
    }
}
