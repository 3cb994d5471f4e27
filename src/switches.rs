//! One home for the environment: every `YOLO9_*` switch yolo9 reads is listed in [`SWITCHES`]
//! (name, kind, values, effect), and this module is the only code of the crate that reads the
//! environment ([`var`], [`var_os`]; an architecture test holds `src/` to it). The table of
//! `docs/configuration.md` is [`markdown_table`]'s output, checked by a test, so the documentation
//! cannot drift from the code.
//!
//! A switch that changes what a training run computes (every kind but
//! [`Kind::Diagnostic`]) is recorded in the run's `args.yaml` when it is set
//! ([`recorded`], `TrainOptions::switches`), so a run can be reproduced from its folder.
//!
//! Everything a user turns for a run is an option of the commands (`--help`); the switches are
//! for the environment (caches, the network), for measurements (turning a measured default off
//! to compare against it) and for diagnostics.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// What a switch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A setting of the environment a user may need (a cache folder, a mirror, threads).
    Setting,
    /// Turns a measured default off or forces an alternative, to compare against it
    /// (`benches/`, parity tests); the default is the faster path that equals the reference.
    Comparison,
    /// Prints timings or traces; changes nothing that is computed.
    Diagnostic,
    /// For the test suite (fault injection, slow measurement tests).
    Testing,
}

impl Kind {
    /// The kind's name in the documentation table.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Setting => "setting",
            Kind::Comparison => "comparison",
            Kind::Diagnostic => "diagnostic",
            Kind::Testing => "testing",
        }
    }
}

/// One environment switch.
#[derive(Debug, Clone, Copy)]
pub struct Switch {
    /// The variable's name (`YOLO9_…`, or another program's variable yolo9 honours).
    pub name: &'static str,
    /// What it is for.
    pub kind: Kind,
    /// The values it takes (unset: the default).
    pub values: &'static str,
    /// What it does, and where its default comes from.
    pub effect: &'static str,
}

const fn s(name: &'static str, kind: Kind, values: &'static str, effect: &'static str) -> Switch {
    Switch {
        name,
        kind,
        values,
        effect,
    }
}

use Kind::{Comparison as C, Diagnostic as D, Setting as S, Testing as T};

/// Every `YOLO9_*` switch, in the order of `docs/configuration.md`.
pub const SWITCHES: &[Switch] = &[
    s("YOLO9_THREADS", S, "a number ≥ 1", "threads of the CPU engine when `--threads` is not given (default: the CPUs this process may run on)"),
    s("YOLO9_HOME", S, "a folder", "cache of official checkpoints fetched by name (default: `$XDG_CACHE_HOME/yolo9` or `~/.cache/yolo9`)"),
    s("YOLO9_WEIGHTS_URL", S, "a URL", "base URL of the official release, for a mirror (default: the v0.1 release on GitHub)"),
    s("YOLO9_OFFLINE", S, "`1`", "never download: a name not in the cache is an error that says where to place the file"),
    s("YOLO9_DOWNLOAD_TIMEOUT", S, "seconds", "connect and per-read timeout of a download (default 30)"),
    s("YOLO9_DOWNLOAD_RETRIES", S, "a number", "retries of a failed download (default 4)"),
    s("YOLO9_DOWNLOAD_BACKOFF", S, "seconds", "wait before the first retry, doubled after each (default 1)"),
    s("YOLO9_DOWNLOAD_MAX_BYTES", S, "bytes", "largest download accepted (default 1 GiB)"),
    s("YOLO9_CUDNN_CACHE", S, "a file, or `off`", "where the cuDNN algorithm choices are kept between runs (default: `$XDG_CACHE_HOME/yolo9/cudnn-algos.txt` or `~/.cache/yolo9/cudnn-algos.txt`)"),
    s("YOLO9_DIST_BACKEND", S, "`nccl` or `tcp`", "collective backend of a multi-GPU training (default: nccl on CUDA, tcp on the CPU)"),
    s("YOLO9_DIST_TIMEOUT", S, "seconds", "timeout of every collective operation of a multi-GPU training (a rank that is gone ends the run instead of hanging)"),
    s("YOLO9_LOG", S, "a `tracing` filter", "log level of the command line (default `warn`; `info`, `debug`, `yolo9=trace`)"),
    s("YOLO9_STRICT_FP32", C, "`1`", "f32 convolutions in strict f32 (no TF32) on CUDA; parity tests set it"),
    s("YOLO9_CUDNN_F32_MATH", C, "`tensor`, `default`, `convert`", "cuDNN math type of f32 convolutions (default `tensor`, measured fastest)"),
    s("YOLO9_CUDNN_ALGO", C, "`benchmark`, `heuristic`", "how cuDNN convolution algorithms are chosen (default `benchmark`: timed once per shape)"),
    s("YOLO9_CUDNN_FUSED", C, "`off`, `3x3`, `all`", "which channels-last f16/bf16 inference convolutions run with their bias and SiLU as one cuDNN graph: none, kernels larger than 1x1, or also 1x1 ones of one input (default `all`)"),
    s("YOLO9_CONCAT_IN_PLACE", C, "`0`", "the ELAN blocks' concatenations of channels-last f16/bf16 CUDA inference as products of one input per part (default: built in place, their parts written into one tensor by the layers that make them)"),
    s("YOLO9_INPUT_CONV", C, "`0`", "the first convolution of channels-last f16/bf16 CUDA inference as the input's cast to NHWC padded to 8 channels, then a cuDNN convolution (default: one kernel reading the f32 NCHW input)"),
    s("YOLO9_LOW_RES_PRODUCTS", C, "`0`", "the head's upsampled parts of channels-last f16/bf16 CUDA inference upsampled before the first 1x1 convolution of the block that reads them (default: that product taken at the lower resolution and upsampled inside the bias + SiLU pass)"),
    s("YOLO9_CONV", C, "`candle`", "every convolution through candle's `conv2d`, also on CUDA (default: cuDNN)"),
    s("YOLO9_TAPE", C, "`1`, `0`", "reverse mode of the training step: the tape (default on CUDA) or candle's autograd (default on the CPU)"),
    s("YOLO9_CUDA_GRAPH", C, "`0`", "CUDA-graph replay of inference forwards off"),
    s("YOLO9_TRAIN_GRAPH", C, "`0`", "CUDA-graph replay of the training step off"),
    s("YOLO9_NHWC", C, "`0`, `1`", "layout of CUDA inference: NCHW or channels-last (default: chosen per dtype and batch, as measured)"),
    s("YOLO9_GPU_NMS", C, "`0`", "NMS of a GPU forward on the host instead of on the device"),
    s("YOLO9_FUSED_LOSS", C, "`0`", "loss terms as candle's composite ops with autograd (the reference the fused op is tested against)"),
    s("YOLO9_DEVICE_ASSIGN", C, "`0`", "TAL assignment on the host instead of on the device"),
    s("YOLO9_FUSED_GRADS", C, "`0`", "gradient copies and sums one candle op per tensor instead of one multi-tensor kernel"),
    s("YOLO9_PREFETCH", C, "`0`", "the next batch's images uploaded after the step instead of during its replay"),
    s("YOLO9_CPU_ENGINE", C, "`0`", "CPU inference through candle's ops instead of yolo9's CPU engine"),
    s("YOLO9_CPU_GEMM", C, "`generic`, `avx2`, `avx2-novnni`", "forces the CPU engine's micro-kernels to a narrower ISA than the CPU has (default: the widest, detected: AVX-512, AVX2+FMA, NEON; `avx2-novnni`: AVX2 and the INT8 kernel of CPUs without VNNI); `generic` on aarch64 too"),
    s("YOLO9_CPU_WINOGRAD", C, "`0`, `2`", "the CPU engine's 3x3 stride-1 convolutions direct (`0`) or by Winograd's F(2x2, 3x3) (`2`) instead of F(4x4, 3x3)"),
    s("YOLO9_CPU_IMPLICIT_MAX_THREADS", C, "a number", "the most threads at which the CPU engine runs 3x3 convolutions implicitly instead of by im2col (0: im2col everywhere)"),
    s("YOLO9_STEP_TIMES", D, "`1`", "seconds per phase of the training step, and of the epoch's end, after each epoch (synchronizes the device)"),
    s("YOLO9_GRAPH_TIMES", D, "`1`", "times of the graphed training step's capture and replay"),
    s("YOLO9_LOSS_TIMES", D, "`1`", "times of the loss's phases"),
    s("YOLO9_MEM_TRACE", D, "`1`", "device memory at each phase of the training step"),
    s("YOLO9_CUDNN_TRACE", D, "`1`", "each cuDNN algorithm candidate's time and workspace, and the choice"),
    s("YOLO9_CPU_PROFILE_SHAPES", D, "any", "the CPU engine's per-layer profile names each layer's shapes"),
    s("YOLO9_FAULTS", T, "a fault list", "faults injected into a training run (tests of the guards: NaN, out of memory, killed workers)"),
    s("YOLO9_RATE_THREADS", T, "numbers, comma-separated", "thread counts of the ignored `conv_rate` measurement test"),
];

/// The switch named `name`, if yolo9 has it.
pub fn find(name: &str) -> Option<&'static Switch> {
    SWITCHES.iter().find(|s| s.name == name)
}

/// The environment variable `name` as text (`None` when unset or not Unicode). The one reader
/// of the environment in the crate, with [`var_os`].
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The environment variable `name` as it is (`None` when unset).
pub fn var_os(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// The trimmed value of `name`, `None` when unset or empty.
pub fn value(name: &str) -> Option<String> {
    var(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Whether the switch `name` is turned off (`0`); a default-on switch is on otherwise.
pub fn off(name: &str) -> bool {
    value(name).as_deref() == Some("0")
}

/// Whether the switch `name` is `1`.
pub fn one(name: &str) -> bool {
    value(name).as_deref() == Some("1")
}

/// The switches set now that change what a run computes (all but diagnostics), name → value:
/// what `args.yaml` records.
pub fn recorded() -> BTreeMap<String, String> {
    SWITCHES
        .iter()
        .filter(|s| s.kind != Kind::Diagnostic)
        .filter_map(|s| var(s.name).map(|v| (s.name.to_string(), v)))
        .collect()
}

/// The table of `docs/configuration.md`: one row per switch of [`SWITCHES`].
pub fn markdown_table() -> String {
    let mut t = String::from("| variable | kind | values | effect |\n| --- | --- | --- | --- |\n");
    for s in SWITCHES {
        t.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            s.name,
            s.kind.name(),
            s.values,
            s.effect
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_recorded_leaves_out_diagnostics() {
        let mut names: Vec<&str> = SWITCHES.iter().map(|s| s.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "a switch is listed twice");
        assert!(SWITCHES.iter().all(|s| s.name.starts_with("YOLO9_")));
        assert_eq!(find("YOLO9_TAPE").unwrap().kind, Kind::Comparison);
        assert!(find("YOLO9_NOPE").is_none());
        // This test's own process: nothing of ours set means nothing recorded but what is set.
        let rec = recorded();
        assert!(rec
            .keys()
            .all(|k| find(k).is_some_and(|s| s.kind != Kind::Diagnostic)));
        assert!(markdown_table().contains("| `YOLO9_THREADS` | setting | a number ≥ 1 |"));
    }
}
