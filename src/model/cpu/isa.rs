//! Which instruction set the CPU engine's kernels use: detected once (AVX-512, AVX2 with FMA,
//! NEON on aarch64, or none of them), shared by the GEMM ([`super::gemm`]) and the element-wise
//! math ([`super::math`]).

/// The micro-kernel a CPU runs (`YOLO9_CPU_GEMM=generic|avx2|avx2-novnni` forces a narrower
/// one; `generic` also on aarch64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// 12 rows × 32 columns on zmm registers.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    /// 6 rows × 16 columns on ymm registers with FMA, twice per panel.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// 6 rows × 16 columns on the 128-bit registers of aarch64 (four per row), twice per panel:
    /// the AVX2 kernel's blocking and packing.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    Neon,
    /// The `gemm` crate per panel, then the epilogue as a second pass.
    Generic,
}

/// The widest [`Kernel`] this CPU runs (detected once).
pub(crate) fn kernel() -> Kernel {
    static K: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        let forced = crate::switches::value("YOLO9_CPU_GEMM").unwrap_or_default();
        #[cfg(target_arch = "x86_64")]
        {
            let has = |f: &str| match f {
                "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
                _ => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
            };
            match forced.trim() {
                "generic" => Kernel::Generic,
                "avx2" | "avx2-novnni" if has("avx2") => Kernel::Avx2,
                _ if has("avx512f") => Kernel::Avx512,
                _ if has("avx2") => Kernel::Avx2,
                _ => Kernel::Generic,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            // NEON (Advanced SIMD) is part of every aarch64 CPU Linux runs on.
            match forced.trim() {
                "generic" => Kernel::Generic,
                _ if std::arch::is_aarch64_feature_detected!("neon") => Kernel::Neon,
                _ => Kernel::Generic,
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let _ = forced;
            Kernel::Generic
        }
    })
}

/// Whether the AVX-512 kernel runs.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn avx512() -> bool {
    kernel() == Kernel::Avx512
}

/// Whether the INT8 kernels may use VNNI: not under `YOLO9_CPU_GEMM=avx2-novnni`, which runs
/// the f32 engine's AVX2 kernel and the INT8 kernel of AVX2 CPUs without VNNI on any AVX2 CPU
/// (so that its code is tested and measured where the CPU has VNNI).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn vnni_allowed() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        crate::switches::value("YOLO9_CPU_GEMM").is_none_or(|v| v.trim() != "avx2-novnni")
    })
}
