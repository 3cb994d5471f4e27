//! Build script: with the `cuda` feature, compiles every `kernels/*.cu` to PTX in `OUT_DIR`
//! (`nvcc --ptx`), for the compute capability in `CUDA_COMPUTE_CAP` (default 90). nvcc is taken
//! from `NVCC`, else `$CUDA_HOME/bin/nvcc`, else `PATH` (see docs/cuda-build.md).
//! Without the feature it does nothing, so the default CPU build needs no CUDA toolkit.

use std::path::PathBuf;
use std::process::Command;

/// Kernels compiled with `-fmad=false`: they follow a CPU computation op for op, and a contracted
/// multiply-add would round differently.
const NO_FMA: &[&str] = &["tal_assign", "nms"];

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| match std::env::var("CUDA_HOME") {
        Ok(home) => format!("{home}/bin/nvcc"),
        Err(_) => "nvcc".to_string(),
    });
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".to_string());
    let mut sources: Vec<PathBuf> = std::fs::read_dir("kernels")
        .expect("kernels/ is part of the crate")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    for src in sources {
        let stem = src.file_stem().unwrap().to_string_lossy().to_string();
        let ptx = out.join(format!("{stem}.ptx"));
        let mut cmd = Command::new(&nvcc);
        cmd.args(["--ptx", "-O3", "-std=c++17"])
            .arg(format!("-arch=compute_{cap}"));
        if NO_FMA.contains(&stem.as_str()) {
            cmd.arg("-fmad=false");
        }
        let status = cmd
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "the cuda feature needs nvcc to compile {}: running `{nvcc}` failed: {e}. \
                     Set NVCC or CUDA_HOME (docs/cuda-build.md)",
                    src.display()
                )
            });
        assert!(status.success(), "nvcc failed on {}", src.display());
    }
}
