//! The CPU engine's INT8 GEMM: `C (m × n, f32) = epilogue(A (m × K, u8) · B (K × n, i8))` with
//! exact i32 sums, for the quantized convolutions of [`super::int8`].
//!
//! B is packed once, at load, in panels of [`NR`] = 32 columns whose depth goes in groups of 4
//! (for each group, 32 columns × 4 bytes: the operand layout of `vpdpbusd`, which adds four
//! u8 × i8 products into each i32 lane). A is read in place as runs of bytes (a convolution's
//! kernel rows over the quantized, padded input), so no im2col is made. The sums are integers
//! and exact, so every kernel gives the same sums; the epilogue turns them into
//! `act(sum · scale[j] + bias[j]) (+ residual)` in f32 (the zero point and both scales folded
//! into `scale` and `bias` by [`super::int8`]).
//!
//! Kernels: AVX-512 VNNI (12 rows × 32 columns, 24 accumulators; per group of 4 depth rows two
//! loads of B, twelve broadcasts of 4 bytes of A, 24 `vpdpbusd`) where the CPU has it; 6 rows ×
//! 16 columns on ymm registers with AVX-VNNI, or with plain AVX2 (`vpmaddubsw` then `vpmaddwd`
//! by ones, exact for weights of 7 bits: [`weight_max`]); a portable loop elsewhere (correct,
//! not fast: the reference of the tests).

use super::math;

/// Columns of a packed panel of B.
pub(crate) const NR: usize = 32;
/// Rows of the VNNI micro-kernel.
pub(crate) const MR: usize = 12;

/// Bytes of the panels of a `k × n` matrix (`k` a multiple of 4).
pub(crate) fn packed_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * k * NR
}

/// Packs row `kk`, column `j` of a `k × n` matrix given by `at(kk, j)` into `dst` (of
/// [`packed_len`] bytes; zeros in the padding columns). `k` is a multiple of 4.
pub(crate) fn pack(k: usize, n: usize, dst: &mut [i8], at: impl Fn(usize, usize) -> i8) {
    assert!(k.is_multiple_of(4) && dst.len() >= packed_len(k, n));
    for p in 0..n.div_ceil(NR) {
        for kk in 0..k {
            for c in 0..NR {
                let j = p * NR + c;
                dst[packed_at(k, p, kk, c)] = if j < n { at(kk, j) } else { 0 };
            }
        }
    }
}

/// Byte of row `kk`, column `c` of panel `p` of a depth-`k` packing.
fn packed_at(k: usize, p: usize, kk: usize, c: usize) -> usize {
    p * k * NR + ((kk / 4) * NR + c) * 4 + kk % 4
}

/// What turns the i32 sums of a row into outputs: `act(sum·scale[j] + bias[j]) (+ res[j])`.
#[derive(Clone, Copy)]
pub(crate) struct Epilogue<'a> {
    /// Per column: the input scale times the column's weight scale (`n` floats).
    pub scale: &'a [f32],
    /// Per column: the bias, less the zero point's share (`n` floats).
    pub bias: &'a [f32],
    /// SiLU after the bias.
    pub act: bool,
    /// Residual rows added last: pointer to row 0, row stride (floats).
    pub res: Option<(*const f32, usize)>,
}

/// The INT8 kernel this CPU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Kernel {
    /// AVX-512 with VNNI (`vpdpbusd` on zmm registers).
    Vnni512,
    /// AVX-VNNI (the VEX `vpdpbusd` on ymm registers: Intel's cores from Alder Lake on, AMD's
    /// from Zen 5, without AVX-512).
    Vnni256,
    /// The same ymm kernel on the EVEX `vpdpbusd` (AVX-512 VNNI + VL): what runs the ymm kernel
    /// on an AVX-512 machine with the narrower f32 kernel forced (`YOLO9_CPU_GEMM=avx2`), so
    /// that its code is tested there.
    Vnni256Evex,
    /// AVX2 without VNNI (Intel's cores before Ice Lake and Alder Lake, AMD's before Zen 4):
    /// the ymm kernel (4 rows: the ones vector and the products need registers) with
    /// `vpmaddubsw` (u8 × i8 products added in pairs into i16, saturating) then `vpmaddwd` by
    /// ones (pairs of i16 into i32). A pair's sum stays inside i16 only for weights in −63..=63
    /// (2·255·63 = 32,130), so for this kernel the engine quantizes the weights to 7 bits
    /// ([`weight_max`]; ONNX Runtime's `reduce_range` on CPUs without VNNI).
    /// `YOLO9_CPU_GEMM=avx2-novnni` runs it on a CPU that has VNNI.
    Avx2,
    /// Plain loops.
    Generic,
}

impl Kernel {
    /// The largest weight magnitude this kernel sums exactly: 63 on [`Kernel::Avx2`], else 127.
    pub(crate) fn weight_max(self) -> i8 {
        match self {
            Kernel::Avx2 => 63,
            _ => 127,
        }
    }
}

/// The largest quantized weight magnitude of this CPU's INT8 kernel ([`Kernel::weight_max`]):
/// the weights of a convolution are quantized to `−weight_max..=weight_max`.
pub(crate) fn weight_max() -> i8 {
    kernel().weight_max()
}

/// The INT8 kernel of this CPU (detected once): the zmm VNNI kernel where the CPU has AVX-512
/// VNNI and the f32 engine runs its AVX-512 kernel; the ymm one with AVX-VNNI (or, under
/// `YOLO9_CPU_GEMM=avx2`, AVX-512 VNNI's EVEX form); the `vpmaddubsw` kernel on AVX2 without
/// VNNI (or under `YOLO9_CPU_GEMM=avx2-novnni`); else the portable loop, which the engine leaves
/// to the tests: there (an AVX-512 CPU without VNNI, a CPU without AVX2, aarch64) a calibrated
/// model runs in f32.
pub(crate) fn kernel() -> Kernel {
    static K: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use super::isa::Kernel as F32;
            let has = |f: &str| match f {
                "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
                "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
                "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
                _ => std::arch::is_x86_feature_detected!("avxvnni"),
            };
            let vnni = super::isa::vnni_allowed();
            match super::isa::kernel() {
                F32::Avx512 if has("avx512bw") && has("avx512vnni") => return Kernel::Vnni512,
                F32::Avx2 if vnni && has("avxvnni") => return Kernel::Vnni256,
                F32::Avx2 if vnni && has("avx512vnni") && has("avx512vl") => {
                    return Kernel::Vnni256Evex
                }
                F32::Avx2 => return Kernel::Avx2,
                _ => {}
            }
        }
        Kernel::Generic
    })
}

/// `C = epilogue(A · B)`: `m` rows, `n` columns; row `r` of A is the runs `segs` (`(byte offset
/// from the row's start, bytes)`, each a multiple of 4 bytes) at `a + r·lda`, their bytes in
/// order making the depth `K` (the sum of the runs); `bp` the panels packed by [`pack`] for
/// depth `K`.
///
/// SAFETY: every run of every row lies in readable memory; `bp` holds the panels of `n`
/// columns; `c` covers `m` rows of `n` floats at stride `ldc`; the residual rows likewise.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    m: usize,
    n: usize,
    segs: &[(isize, usize)],
    a: *const u8,
    lda: usize,
    bp: *const i8,
    c: *mut f32,
    ldc: usize,
    epi: &Epilogue,
) {
    gemm_on(kernel(), m, n, segs, a, lda, bp, c, ldc, epi)
}

/// [`gemm`] on `kernel` (which the CPU must run).
///
/// SAFETY: as [`gemm`]'s.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_on(
    kernel: Kernel,
    m: usize,
    n: usize,
    segs: &[(isize, usize)],
    a: *const u8,
    lda: usize,
    bp: *const i8,
    c: *mut f32,
    ldc: usize,
    epi: &Epilogue,
) {
    assert!(
        epi.scale.len() >= n && epi.bias.len() >= n && segs.iter().all(|s| s.1.is_multiple_of(4)),
        "int8 gemm: {} scales, {} biases for {n} columns, runs {segs:?}",
        epi.scale.len(),
        epi.bias.len()
    );
    #[cfg(target_arch = "x86_64")]
    match kernel {
        Kernel::Vnni512 => return vnni::gemm(m, n, segs, a, lda, bp, c, ldc, epi),
        Kernel::Vnni256 => return vnni256::gemm(m, n, segs, a, lda, bp, c, ldc, epi),
        Kernel::Vnni256Evex => return vnni256_evex::gemm(m, n, segs, a, lda, bp, c, ldc, epi),
        Kernel::Avx2 => return avx2::gemm(m, n, segs, a, lda, bp, c, ldc, epi),
        Kernel::Generic => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kernel;
    generic(m, n, segs, a, lda, bp, c, ldc, epi)
}

/// The portable kernel: per row and panel, the i32 sums of 32 columns, then the epilogue.
#[allow(clippy::too_many_arguments)]
unsafe fn generic(
    m: usize,
    n: usize,
    segs: &[(isize, usize)],
    a: *const u8,
    lda: usize,
    bp: *const i8,
    c: *mut f32,
    ldc: usize,
    epi: &Epilogue,
) {
    let k: usize = segs.iter().map(|s| s.1).sum();
    for p in 0..n.div_ceil(NR) {
        let cols = NR.min(n - p * NR);
        for r in 0..m {
            let mut acc = [0i32; NR];
            let mut kk = 0;
            for &(off, len) in segs {
                let row = a.offset(off).add(r * lda);
                for t in 0..len {
                    let av = *row.add(t) as i32;
                    let b = bp.add(packed_at(k, p, kk + t, 0));
                    for (cc, s) in acc.iter_mut().enumerate().take(cols) {
                        *s += av * *b.add(cc * 4) as i32;
                    }
                }
                kk += len;
            }
            for (cc, &s) in acc.iter().enumerate().take(cols) {
                let j = p * NR + cc;
                let mut v = (s as f32).mul_add(epi.scale[j], epi.bias[j]);
                if epi.act {
                    v = math::silu(v);
                }
                if let Some((q, ld)) = epi.res {
                    v += *q.add(r * ld + j);
                }
                *c.add(r * ldc + j) = v;
            }
        }
    }
}

/// The epilogue of the ymm kernels on one tile of `R` rows × `w` (≤ 16) columns of i32 sums at
/// `c` (row stride `ldc`), turned in place into `act(sum·scale + bias) (+ res)` (one FMA, as
/// the zmm kernel's); `scale`, `bias` and the residual rows (`res`: its column 0 of the tile's
/// row 0, stride) start at the tile's first column. Not inlined, as the zmm kernel's `finish`:
/// the SiLU's constants beside the accumulators would push them out of registers.
///
/// SAFETY: AVX2 and FMA; the tile, its `w` scales and biases and the residual rows are readable
/// (the tile writable).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
unsafe fn finish_ymm<const R: usize>(
    c: *mut f32,
    ldc: usize,
    w: usize,
    scale: *const f32,
    bias: *const f32,
    act: bool,
    res: Option<(*const f32, usize)>,
) {
    use math::avx2::{lanes, silu};
    use std::arch::x86_64::*;
    let (m0, m1) = (lanes(w), lanes(w.saturating_sub(8)));
    let (s0, s1) = (
        _mm256_maskload_ps(scale, m0),
        _mm256_maskload_ps(scale.add(8), m1),
    );
    let (b0, b1) = (
        _mm256_maskload_ps(bias, m0),
        _mm256_maskload_ps(bias.add(8), m1),
    );
    for r in 0..R {
        let dst = c.add(r * ldc);
        let i0 = _mm256_maskload_epi32(dst as *const i32, m0);
        let i1 = _mm256_maskload_epi32(dst.add(8) as *const i32, m1);
        let mut v = [
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), s0, b0),
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), s1, b1),
        ];
        if act {
            silu(&mut v);
        }
        if let Some((q, ld)) = res {
            let q = q.add(r * ld);
            v[0] = _mm256_add_ps(v[0], _mm256_maskload_ps(q, m0));
            v[1] = _mm256_add_ps(v[1], _mm256_maskload_ps(q.add(8), m1));
        }
        if w == 16 {
            _mm256_storeu_ps(dst, v[0]);
            _mm256_storeu_ps(dst.add(8), v[1]);
        } else {
            _mm256_maskstore_ps(dst, m0, v[0]);
            _mm256_maskstore_ps(dst.add(8), m1, v[1]);
        }
    }
}

/// A ymm kernel (6 rows × 16 columns, 12 accumulators: AVX2 has 16 registers) on the panels
/// of [`pack`] (each half panel's 16 columns × 4 bytes are one 64-byte half of a depth group):
/// each tile's i32 sums are stored in place of C, then [`finish_ymm`] applies the epilogue
/// to them while they are in L1. `$dp(acc, a, b)`
/// adds to each i32 lane of `acc` the four products of its u8 bytes of `a` and i8 bytes of `b`.
macro_rules! vnni256 {
    ($name:ident, $features:literal, $dp:path, $mr:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use super::{Epilogue, NR};
            use std::arch::x86_64::*;

            /// Rows of the kernel (at most 6).
            const MR: usize = $mr;

            /// See [`super::gemm`].
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(super) unsafe fn gemm(
                m: usize,
                n: usize,
                segs: &[(isize, usize)],
                a: *const u8,
                lda: usize,
                bp: *const i8,
                c: *mut f32,
                ldc: usize,
                epi: &Epilogue,
            ) {
                let k: usize = segs.iter().map(|s| s.1).sum();
                for p in 0..n.div_ceil(NR) {
                    let cols = NR.min(n - p * NR);
                    for h in 0..cols.div_ceil(16) {
                        let j = p * NR + h * 16;
                        let b = bp.add(p * k * NR + h * 64);
                        let c = c.add(j);
                        let w = (cols - h * 16).min(16);
                        let st = Tile {
                            lda,
                            ldc,
                            segs,
                            w,
                            scale: epi.scale.as_ptr().add(j),
                            bias: epi.bias.as_ptr().add(j),
                            act: epi.act,
                            res: epi.res.map(|(q, ld)| (q.add(j), ld)),
                        };
                        let mut r = 0;
                        while r + MR <= m {
                            kern::<MR>(a.add(r * lda), b, c.add(r * ldc), r, &st);
                            r += MR;
                        }
                        let (a, c) = (a.add(r * lda), c.add(r * ldc));
                        match m - r {
                            0 => {}
                            1 => kern::<1>(a, b, c, r, &st),
                            2 => kern::<2>(a, b, c, r, &st),
                            3 => kern::<3>(a, b, c, r, &st),
                            4 => kern::<4>(a, b, c, r, &st),
                            _ => kern::<5>(a, b, c, r, &st),
                        }
                        debug_assert!(m - r < MR);
                    }
                }
            }

            /// What the kernel calls of one half panel share: strides, the depth's runs, the
            /// columns stored (`w` ≤ 16), and the epilogue from the half panel's first column.
            struct Tile<'a> {
                lda: usize,
                ldc: usize,
                segs: &'a [(isize, usize)],
                w: usize,
                scale: *const f32,
                bias: *const f32,
                act: bool,
                res: Option<(*const f32, usize)>,
            }

            /// `R` rows × 16 columns over the whole depth, the first `w` columns stored, then
            /// the epilogue; rows `r0..r0+R` of the half panel, for the residual.
            #[target_feature(enable = $features)]
            #[inline]
            #[allow(clippy::needless_range_loop)]
            unsafe fn kern<const R: usize>(
                a: *const u8,
                b: *const i8,
                c: *mut f32,
                r0: usize,
                st: &Tile,
            ) {
                let (lda, ldc, segs, w) = (st.lda, st.ldc, st.segs, st.w);
                let mut c0 = [_mm256_setzero_si256(); R];
                let mut c1 = [_mm256_setzero_si256(); R];
                let mut b = b;
                for &(off, len) in segs {
                    let a = a.offset(off);
                    for k4 in 0..len / 4 {
                        let kk = 4 * k4;
                        let b0 = _mm256_loadu_si256(b as *const __m256i);
                        let b1 = _mm256_loadu_si256(b.add(32) as *const __m256i);
                        for r in 0..R {
                            // 4-byte aligned, as in the zmm kernel.
                            let av = _mm256_set1_epi32(*(a.add(r * lda + kk) as *const i32));
                            c0[r] = $dp(c0[r], av, b0);
                            c1[r] = $dp(c1[r], av, b1);
                        }
                        b = b.add(4 * NR);
                    }
                }
                for r in 0..R {
                    let dst = c.add(r * ldc) as *mut i32;
                    if w == 16 {
                        _mm256_storeu_si256(dst as *mut __m256i, c0[r]);
                        _mm256_storeu_si256(dst.add(8) as *mut __m256i, c1[r]);
                    } else {
                        let mut t = [0i32; 16];
                        _mm256_storeu_si256(t.as_mut_ptr() as *mut __m256i, c0[r]);
                        _mm256_storeu_si256(t.as_mut_ptr().add(8) as *mut __m256i, c1[r]);
                        std::ptr::copy_nonoverlapping(t.as_ptr(), dst, w);
                    }
                }
                crate::model::cpu::igemm::finish_ymm::<R>(
                    c,
                    ldc,
                    w,
                    st.scale,
                    st.bias,
                    st.act,
                    st.res.map(|(q, ld)| (q.add(r0 * ld), ld)),
                );
            }
        }
    };
}

vnni256!(vnni256, "avx2,fma,avxvnni", _mm256_dpbusd_avx_epi32, 6);
vnni256!(avx2, "avx2,fma", crate::model::cpu::igemm::dp_maddubs, 4);

/// `vpdpbusd` of plain AVX2 for weights in −63..=63: `vpmaddubsw` (each pair of u8 × i8
/// products into an i16, exact while |a₀b₀ + a₁b₁| ≤ 2·255·63 < 2^15), `vpmaddwd` by ones (the
/// two pairs of each 4 bytes into an i32), added to `acc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dp_maddubs(
    acc: std::arch::x86_64::__m256i,
    a: std::arch::x86_64::__m256i,
    b: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let pairs = _mm256_maddubs_epi16(a, b);
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}
vnni256!(
    vnni256_evex,
    "avx2,fma,avx512vl,avx512vnni",
    _mm256_dpbusd_epi32,
    6
);

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{Epilogue, MR, NR};
    use crate::model::cpu::math::avx512::silu;
    use std::arch::x86_64::*;

    /// See [`super::gemm`]: per panel, the rows [`MR`] at a time (the panel's `K × 32` bytes
    /// stay in L2 while the rows stream past them).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
        m: usize,
        n: usize,
        segs: &[(isize, usize)],
        a: *const u8,
        lda: usize,
        bp: *const i8,
        c: *mut f32,
        ldc: usize,
        epi: &Epilogue,
    ) {
        let k: usize = segs.iter().map(|s| s.1).sum();
        for p in 0..n.div_ceil(NR) {
            let cols = NR.min(n - p * NR);
            let st = Step {
                lda,
                ldc,
                segs,
                mask: if cols == NR {
                    u32::MAX
                } else {
                    (1u32 << cols) - 1
                },
                scale: epi.scale.as_ptr().add(p * NR),
                bias: epi.bias.as_ptr().add(p * NR),
                act: epi.act,
                res: epi.res.map(|(q, ld)| (q.add(p * NR), ld)),
            };
            let b = bp.add(p * k * NR);
            let c = c.add(p * NR);
            if cols <= 16 {
                rows::<1>(m, a, b, c, &st)
            } else {
                rows::<2>(m, a, b, c, &st)
            }
        }
    }

    /// What the micro-kernel calls of one panel share.
    struct Step<'a> {
        lda: usize,
        ldc: usize,
        segs: &'a [(isize, usize)],
        /// Columns of the panel stored.
        mask: u32,
        /// The panel's 32 scales and biases.
        scale: *const f32,
        bias: *const f32,
        act: bool,
        /// Residual rows (the panel's column 0 of the tile's row 0, stride).
        res: Option<(*const f32, usize)>,
    }

    /// All `m` rows of one panel on `H` halves of it.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn rows<const H: usize>(m: usize, a: *const u8, b: *const i8, c: *mut f32, st: &Step) {
        let (lda, ldc) = (st.lda, st.ldc);
        let mut r = 0;
        while r + MR <= m {
            kern::<MR, H>(a.add(r * lda), b, c.add(r * ldc), r, st);
            r += MR;
        }
        let (a, c) = (a.add(r * lda), c.add(r * ldc));
        match m - r {
            0 => {}
            1 => kern::<1, H>(a, b, c, r, st),
            2 => kern::<2, H>(a, b, c, r, st),
            3 => kern::<3, H>(a, b, c, r, st),
            4 => kern::<4, H>(a, b, c, r, st),
            5 => kern::<5, H>(a, b, c, r, st),
            6 => kern::<6, H>(a, b, c, r, st),
            7 => kern::<7, H>(a, b, c, r, st),
            8 => kern::<8, H>(a, b, c, r, st),
            9 => kern::<9, H>(a, b, c, r, st),
            10 => kern::<10, H>(a, b, c, r, st),
            _ => kern::<11, H>(a, b, c, r, st),
        }
    }

    /// `R` rows × 32 columns (`H` = 1: only the first 16) over the whole depth, then the
    /// epilogue and the stores; rows `r0..r0+R` of the tile, for the residual.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    // Row loops index the accumulator arrays side by side (registers once unrolled).
    #[allow(clippy::needless_range_loop)]
    unsafe fn kern<const R: usize, const H: usize>(
        a: *const u8,
        b: *const i8,
        c: *mut f32,
        r0: usize,
        st: &Step,
    ) {
        let lda = st.lda;
        let mut c0 = [_mm512_setzero_si512(); R];
        let mut c1 = [_mm512_setzero_si512(); R];
        let mut b = b;
        for &(off, len) in st.segs {
            let a = a.offset(off);
            for k4 in 0..len / 4 {
                let kk = 4 * k4;
                // Four bytes of row r (4-byte aligned: row strides, runs and offsets are
                // multiples of 4 on a 4-byte aligned buffer).
                let b0 = _mm512_loadu_si512(b as *const __m512i);
                if H == 2 {
                    let b1 = _mm512_loadu_si512(b.add(64) as *const __m512i);
                    for r in 0..R {
                        let av = _mm512_set1_epi32(*(a.add(r * lda + kk) as *const i32));
                        c0[r] = _mm512_dpbusd_epi32(c0[r], av, b0);
                        c1[r] = _mm512_dpbusd_epi32(c1[r], av, b1);
                    }
                } else {
                    for r in 0..R {
                        let av = _mm512_set1_epi32(*(a.add(r * lda + kk) as *const i32));
                        c0[r] = _mm512_dpbusd_epi32(c0[r], av, b0);
                    }
                }
                b = b.add(4 * NR);
            }
        }
        // The sums go to C as they are, and the epilogue reads them back (from L1) in a
        // function of its own: with the SiLU's constants in registers beside the 24
        // accumulators, the compiler spilled the accumulators at every step (half the speed).
        let (m0, m1) = (st.mask as __mmask16, (st.mask >> 16) as __mmask16);
        // Plain stores where every column is stored (masked ones are slower on AMD's cores).
        let full = st.mask == u32::MAX;
        for r in 0..R {
            let dst = c.add(r * st.ldc) as *mut i32;
            if full {
                _mm512_storeu_si512(dst as *mut __m512i, c0[r]);
                _mm512_storeu_si512(dst.add(16) as *mut __m512i, c1[r]);
            } else {
                _mm512_mask_storeu_epi32(dst, m0, c0[r]);
                if H == 2 {
                    _mm512_mask_storeu_epi32(dst.add(16), m1, c1[r]);
                }
            }
        }
        finish::<R, H>(c, r0, st);
    }

    /// `R` rows of i32 sums at `c` turned in place into `act(sum·scale + bias) (+ res)`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline(never)]
    unsafe fn finish<const R: usize, const H: usize>(c: *mut f32, r0: usize, st: &Step) {
        let (m0, m1) = (st.mask as __mmask16, (st.mask >> 16) as __mmask16);
        let scale0 = _mm512_maskz_loadu_ps(m0, st.scale);
        let scale1 = _mm512_maskz_loadu_ps(m1, st.scale.add(16));
        let bias0 = _mm512_maskz_loadu_ps(m0, st.bias);
        let bias1 = _mm512_maskz_loadu_ps(m1, st.bias.add(16));
        for r in 0..R {
            let dst = c.add(r * st.ldc);
            let s0 = _mm512_maskz_loadu_epi32(m0, dst as *const i32);
            let mut v0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), scale0, bias0);
            let mut v1 = _mm512_setzero_ps();
            if H == 2 {
                let s1 = _mm512_maskz_loadu_epi32(m1, dst.add(16) as *const i32);
                v1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), scale1, bias1);
            }
            if st.act {
                v0 = silu(v0);
                if H == 2 {
                    v1 = silu(v1);
                }
            }
            if let Some((q, ld)) = st.res {
                let q = q.add((r0 + r) * ld);
                v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, q));
                if H == 2 {
                    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, q.add(16)));
                }
            }
            if st.mask == u32::MAX {
                _mm512_storeu_ps(dst, v0);
                _mm512_storeu_ps(dst.add(16), v1);
            } else {
                _mm512_mask_storeu_ps(dst, m0, v0);
                if H == 2 {
                    _mm512_mask_storeu_ps(dst.add(16), m1, v1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random sums through both kernels against a plain triple loop: every panel width (a
    /// full panel, a half, a remainder), row counts around the micro-kernel's, two runs of
    /// depth with a gap between them (a convolution's kernel rows), SiLU and a residual.
    #[test]
    fn kernels_equal_the_plain_product() {
        let mut seed = 7u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for &(m, n, act, res) in &[
            (1, 16, false, false),
            (13, 48, true, false),
            (25, 70, true, true),
            (12, 32, false, true),
        ] {
            let segs = [(0isize, 24usize), (40, 12)];
            let k = 36;
            let lda = 64;
            // Built as u32s so that the rows are 4-byte aligned, as the engine's buffer is.
            // The first case at the extremes: every byte 255 against weights ±weight_max (a
            // pair's sum at the edge of what `vpmaddubsw` holds).
            let extreme = m == 1;
            let a32: Vec<u32> = (0..m * lda / 4)
                .map(|_| if extreme { u32::MAX } else { rnd() })
                .collect();
            // SAFETY: u32 has no padding; the bytes live as long as `a32`.
            let a = unsafe { std::slice::from_raw_parts(a32.as_ptr() as *const u8, m * lda) };
            let scale: Vec<f32> = (0..n).map(|j| 1e-4 * (1 + j % 5) as f32).collect();
            let bias: Vec<f32> = (0..n).map(|j| 0.1 * j as f32 - 2.0).collect();
            let resv: Vec<f32> = (0..m * n).map(|i| (i % 7) as f32 * 0.25).collect();
            let epi = Epilogue {
                scale: &scale,
                bias: &bias,
                act,
                res: res.then_some((resv.as_ptr(), n)),
            };
            #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
            let mut kernels = vec![Kernel::Generic];
            #[cfg(target_arch = "x86_64")]
            {
                let has = |f| match f {
                    0 => {
                        std::arch::is_x86_feature_detected!("avx512vnni")
                            && std::arch::is_x86_feature_detected!("avx512vl")
                            && std::arch::is_x86_feature_detected!("avx512bw")
                    }
                    _ => {
                        std::arch::is_x86_feature_detected!("avxvnni")
                            && std::arch::is_x86_feature_detected!("fma")
                    }
                };
                if has(0) {
                    kernels.extend([Kernel::Vnni512, Kernel::Vnni256Evex]);
                }
                if has(1) {
                    kernels.push(Kernel::Vnni256);
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    kernels.push(Kernel::Avx2);
                }
            }
            for kern in kernels {
                // Weights over the kernel's whole range, its bounds included.
                let wm = kern.weight_max() as u32;
                let w: Vec<i8> = (0..k * n)
                    .map(|i| match i % 17 {
                        _ if extreme && i % 2 == 0 => wm as i8,
                        _ if extreme => -(wm as i32) as i8,
                        0 => -(wm as i32) as i8,
                        1 => wm as i8,
                        _ => ((rnd() % (2 * wm + 1)) as i32 - wm as i32) as i8,
                    })
                    .collect();
                let mut bp = vec![0i8; packed_len(k, n)];
                pack(k, n, &mut bp, |kk, j| w[kk * n + j]);
                let mut c = vec![f32::NAN; m * n];
                // SAFETY: the buffers have the sizes the call describes.
                unsafe {
                    gemm_on(
                        kern,
                        m,
                        n,
                        &segs,
                        a.as_ptr(),
                        lda,
                        bp.as_ptr(),
                        c.as_mut_ptr(),
                        n,
                        &epi,
                    )
                };
                for r in 0..m {
                    for j in 0..n {
                        let mut s = 0i32;
                        let mut kk = 0;
                        for &(off, len) in &segs {
                            for t in 0..len {
                                s += a[r * lda + off as usize + t] as i32
                                    * w[(kk + t) * n + j] as i32;
                            }
                            kk += len;
                        }
                        let mut want = s as f32 * scale[j] + bias[j];
                        if act {
                            want = want / (1.0 + (-want).exp());
                        }
                        if res {
                            want += resv[r * n + j];
                        }
                        let got = c[r * n + j];
                        assert!(
                            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{kern:?} m {m} n {n} row {r} col {j}: {got} against {want}"
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod rate {
    use super::*;

    fn bytemuck_bytes(v: &[u32]) -> &[u8] {
        // SAFETY: u32 has no padding; the bytes live as long as `v`.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 4) }
    }

    /// The micro-kernel's rate on one thread (`cargo test --release --lib igemm_rate --
    /// --ignored --nocapture`): a 3x3 convolution's row (80 pixels, K = 1152, 128 columns).
    #[test]
    #[ignore]
    fn igemm_rate() {
        for &(m, n, k) in &[
            (80usize, 128usize, 1152usize),
            (384, 64, 128),
            (96, 128, 1152),
        ] {
            let a32 = vec![0x0303_0303u32; (m * k + 64) / 4];
            let a: &[u8] = bytemuck_bytes(&a32);
            let mut bp = vec![0i8; packed_len(k, n)];
            pack(k, n, &mut bp, |kk, j| ((kk + j) % 7) as i8 - 3);
            let scale = vec![1e-3f32; n];
            let bias = vec![0.1f32; n];
            let epi = Epilogue {
                scale: &scale,
                bias: &bias,
                act: true,
                res: None,
            };
            let mut c = vec![0f32; m * n];
            let segs = [(0isize, k)];
            let reps = 2000;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                // SAFETY: buffers sized as described.
                unsafe {
                    gemm(
                        m,
                        n,
                        &segs,
                        a.as_ptr(),
                        k,
                        bp.as_ptr(),
                        c.as_mut_ptr(),
                        n,
                        &epi,
                    )
                };
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "igemm m {m} n {n} k {k}: {:.1} GOP/s ({:?})",
                2.0 * (m * n * k * reps) as f64 / s / 1e9,
                kernel()
            );
        }
    }
}
