//! The CPU engine's GEMM: `C (m × n) = A (m × k) · B (k × n)` with B packed once, at load, in
//! panels of [`NR`] = 32 columns (`B_p[k][0..32]` contiguous, zero-padded), A read in place with
//! a row stride (NHWC rows or im2col rows) and C written in place with a row stride (a slice of
//! a concatenation's storage).
//!
//! On a CPU with AVX-512 the work is a register-blocked micro-kernel of 12 rows × 32 columns (24
//! accumulators; per step of k two loads of B, twelve broadcasts of A, 24 FMAs), with k split in
//! blocks of [`KC`] so that the B block stays in L1 while the tile's rows stream past it.
//! With AVX2 and FMA (most laptops) the same scheme runs 6 rows × 16 columns on ymm registers,
//! each panel as two halves (the implicit convolution of [`conv_taps`] included); on aarch64 the
//! AVX2 kernel's blocking on NEON's 128-bit registers (6 rows × 16 columns, four registers per
//! row, the same packing); elsewhere each panel goes through the `gemm` crate and the epilogue
//! is a second pass.

use super::isa::{kernel, Kernel};

/// Columns of a packed panel of B.
pub(crate) const NR: usize = 32;
/// Rows of the AVX-512 micro-kernel.
pub(crate) const MR: usize = 12;
/// Depth of a k block.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
const KC: usize = 256;

/// Floats of the panels of a `k × n` matrix.
pub(crate) fn packed_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * k * NR
}

/// Packs row `kk`, column `j` of a `k × n` matrix given by `at(kk, j)` into `dst` (of
/// [`packed_len`] floats, zeros in the padding), in the layout of this CPU's micro-kernel.
pub(crate) fn pack(k: usize, n: usize, dst: &mut [f32], at: impl Fn(usize, usize) -> f32) {
    pack_on(kernel(), k, n, dst, at)
}

/// Columns of a half panel (the AVX2 kernel's width).
const HALF: usize = NR / 2;

/// Float index of row `kk`, column `c` (of [`NR`]) of panel `p` of a depth-`k` packing for
/// `kernel`. Panel `p` always covers floats `p·k·NR ..` `(p+1)·k·NR`; inside it, the AVX-512
/// and generic kernels read rows of 32 columns (`kk·32 + c`), the AVX2 and NEON kernels their two
/// halves of 16 columns one after the other (`(c / 16)·k·16 + kk·16 + c % 16`), so that each of
/// their loads of B reads one whole cache line and a half panel is contiguous.
fn packed_at(kernel: Kernel, k: usize, p: usize, kk: usize, c: usize) -> usize {
    match kernel {
        Kernel::Avx2 | Kernel::Neon => p * k * NR + (c / HALF) * k * HALF + kk * HALF + c % HALF,
        _ => (p * k + kk) * NR + c,
    }
}

/// [`pack`] in the layout of `kernel`.
fn pack_on(kernel: Kernel, k: usize, n: usize, dst: &mut [f32], at: impl Fn(usize, usize) -> f32) {
    for p in 0..n.div_ceil(NR) {
        for kk in 0..k {
            for c in 0..NR {
                let j = p * NR + c;
                dst[packed_at(kernel, k, p, kk, c)] = if j < n { at(kk, j) } else { 0.0 };
            }
        }
    }
}

/// What is applied to each output row once its sums are complete: `row[j] = act(row[j] +
/// bias[j]) (+ res[j])`, with `res` rows at a stride of their own (a residual connection).
#[derive(Clone, Copy)]
pub(crate) struct Epilogue<'a> {
    /// One bias per column of C (`n` floats).
    pub bias: &'a [f32],
    /// SiLU after the bias.
    pub act: bool,
    /// Residual rows added last: pointer to row 0, row stride.
    pub res: Option<(*const f32, usize)>,
}

/// `C = A · B` for the panels of B starting at panel `p0` (column `p0·NR`): `n` columns,
/// `m` rows, depth `k` (the full depth of the packing: panel stride `k·NR`).
///
/// SAFETY: `a` covers `m` rows of `k` floats at stride `lda`; `bp` the packed panels; `c` covers
/// `m` rows of `n` floats at stride `ldc`, overlapping neither input.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    bp: *const f32,
    c: *mut f32,
    ldc: usize,
    epi: Epilogue,
) {
    gemm_on(kernel(), m, n, k, a, lda, bp, c, ldc, epi)
}

/// [`gemm`] on the kernel `kernel` (which the CPU must run).
///
/// SAFETY: as [`gemm`]'s, and the CPU has the features of `kernel`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_on(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    bp: *const f32,
    c: *mut f32,
    ldc: usize,
    epi: Epilogue,
) {
    assert!(
        epi.bias.len() >= n,
        "epilogue: {} biases for {n} columns",
        epi.bias.len()
    );
    #[cfg(target_arch = "x86_64")]
    match kernel {
        Kernel::Avx512 => return avx512::gemm(m, n, k, a, lda, bp, c, ldc, epi),
        Kernel::Avx2 => return avx2::gemm(m, n, k, a, lda, bp, c, ldc, epi),
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    if kernel == Kernel::Neon {
        return neon::gemm(m, n, k, a, lda, bp, c, ldc, epi);
    }
    for p in 0..n.div_ceil(NR) {
        let cols = NR.min(n - p * NR);
        gemm::gemm(
            m,
            cols,
            k,
            c.add(p * NR),
            1,
            ldc as isize,
            false,
            a,
            1,
            lda as isize,
            bp.add(p * k * NR),
            1,
            NR as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
    for r in 0..m {
        let row = std::slice::from_raw_parts_mut(c.add(r * ldc), n);
        let res = epi
            .res
            .map(|(p, ld)| std::slice::from_raw_parts(p.add(r * ld), n));
        super::math::epilogue(row, epi.bias, epi.act, res);
    }
}

/// Whether [`conv_taps`] runs on this CPU (the AVX-512, AVX2 and NEON kernels).
pub(crate) fn taps_supported() -> bool {
    match kernel() {
        Kernel::Avx512 | Kernel::Avx2 => cfg!(target_arch = "x86_64"),
        Kernel::Neon => cfg!(target_arch = "aarch64"),
        Kernel::Generic => false,
    }
}

/// An implicit-GEMM convolution of `m` output pixels in a row, without im2col: the depth is
/// the kernel's taps in order, tap `t` reading `taps[t].1` floats at `a + taps[t].0 + r·lda` for
/// output pixel `r` (the input pixel under that tap), against the packed weights `bp` (rows in
/// tap order, as [`pack`]); `C = act(A·B + bias) (+ res)` as [`gemm`].
///
/// SAFETY: [`taps_supported`]; every tap's reads stay inside the input (the caller keeps the
/// padding out of these pixels); `c` and `bp` as [`gemm`]'s.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv_taps(
    m: usize,
    n: usize,
    taps: &[(isize, usize)],
    a: *const f32,
    lda: usize,
    bp: *const f32,
    c: *mut f32,
    ldc: usize,
    epi: Epilogue,
) {
    assert!(taps_supported() && epi.bias.len() >= n);
    conv_taps_on(kernel(), m, n, taps, a, lda, bp, c, ldc, epi)
}

/// [`conv_taps`] on the micro-kernel `wide` (AVX-512, AVX2 or NEON, which the CPU must have).
#[allow(clippy::too_many_arguments)]
unsafe fn conv_taps_on(
    wide: Kernel,
    m: usize,
    n: usize,
    taps: &[(isize, usize)],
    a: *const f32,
    lda: usize,
    bp: *const f32,
    c: *mut f32,
    ldc: usize,
    epi: Epilogue,
) {
    match wide {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => avx512::conv_taps(m, n, taps, a, lda, bp, c, ldc, epi),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => avx2::conv_taps(m, n, taps, a, lda, bp, c, ldc, epi),
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon => neon::conv_taps(m, n, taps, a, lda, bp, c, ldc, epi),
        _ => unreachable!("no implicit convolution on the {wide:?} kernel of this CPU"),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Epilogue, KC, MR, NR};
    use crate::model::cpu::math::avx512::silu;
    use std::arch::x86_64::*;

    /// See [`super::gemm`].
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        a: *const f32,
        lda: usize,
        bp: *const f32,
        c: *mut f32,
        ldc: usize,
        epi: Epilogue,
    ) {
        let mut kb = 0;
        while kb < k {
            let kc = KC.min(k - kb);
            let seg = [(0isize, kc)];
            for p in 0..n.div_ceil(NR) {
                // The epilogue once the sums are complete (last k block).
                let st = step(p, n, lda, ldc, &seg, kb > 0, kb + kc == k, &epi);
                rows(m, a.add(kb), bp.add((p * k + kb) * NR), c.add(p * NR), &st);
            }
            kb += kc;
        }
    }

    /// The [`Step`] of panel `p` (of `n` columns): its column mask, and its epilogue when `last`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn step(
        p: usize,
        n: usize,
        lda: usize,
        ldc: usize,
        segs: &[(isize, usize)],
        acc: bool,
        last: bool,
        epi: &Epilogue,
    ) -> Step {
        let cols = NR.min(n - p * NR);
        Step {
            lda,
            ldc,
            segs: segs.as_ptr(),
            nsegs: segs.len(),
            acc,
            mask: if cols == NR {
                u32::MAX
            } else {
                (1u32 << cols) - 1
            },
            epi: last.then(|| Epi {
                bias: epi.bias.as_ptr().add(p * NR),
                act: epi.act,
                res: epi.res.map(|(q, ld)| (q.add(p * NR), ld)),
            }),
        }
    }

    /// All `m` rows of one panel: [`MR`] at a time, then the remainder; only the first half of
    /// the panel where its other 16 columns are not stored.
    #[target_feature(enable = "avx512f")]
    unsafe fn rows(m: usize, a: *const f32, b: *const f32, c: *mut f32, st: &Step) {
        if st.mask >> 16 == 0 {
            rows_of::<1>(m, a, b, c, st)
        } else {
            rows_of::<2>(m, a, b, c, st)
        }
    }

    /// [`rows`] on `H` halves of the panel (see [`kern`]).
    #[target_feature(enable = "avx512f")]
    unsafe fn rows_of<const H: usize>(
        m: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        st: &Step,
    ) {
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

    /// See [`super::conv_taps`].
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn conv_taps(
        m: usize,
        n: usize,
        taps: &[(isize, usize)],
        a: *const f32,
        lda: usize,
        bp: *const f32,
        c: *mut f32,
        ldc: usize,
        epi: Epilogue,
    ) {
        let k: usize = taps.iter().map(|t| t.1).sum();
        for p in 0..n.div_ceil(NR) {
            let st = step(p, n, lda, ldc, taps, false, true, &epi);
            rows(m, a, bp.add(p * k * NR), c.add(p * NR), &st);
        }
    }

    impl Step {
        /// The runs of the depth.
        ///
        /// SAFETY: `segs` points at `nsegs` runs that outlive the step.
        unsafe fn segs(&self) -> &[(isize, usize)] {
            std::slice::from_raw_parts(self.segs, self.nsegs)
        }
    }

    /// The epilogue of one panel: its 32 biases, SiLU, residual rows (pointer to the panel's
    /// column 0 of row 0 of the tile, stride).
    struct Epi {
        bias: *const f32,
        act: bool,
        res: Option<(*const f32, usize)>,
    }

    /// What the micro-kernel calls of one (k block, panel) share.
    struct Step {
        lda: usize,
        ldc: usize,
        /// The depth as runs of A: `(offset of the run from A's row start, floats)`; one run
        /// `(0, kc)` for a plain GEMM, one per kernel tap for an implicit convolution.
        segs: *const (isize, usize),
        nsegs: usize,
        /// Add to C (a later k block) instead of overwriting it.
        acc: bool,
        /// Columns of the panel stored.
        mask: u32,
        epi: Option<Epi>,
    }

    /// `R` rows × 32 columns over depth `kc` (see [`Step`]); rows `r0..r0+R` of the tile, for
    /// the residual.
    ///
    /// `H` = 2 computes both 16-column halves of the panel; `H` = 1 only the first (a last
    /// panel of at most 16 columns: 48 output channels are a panel and a half).
    #[target_feature(enable = "avx512f")]
    #[inline]
    // Row loops index the accumulator arrays side by side (registers once unrolled).
    #[allow(clippy::needless_range_loop)]
    unsafe fn kern<const R: usize, const H: usize>(
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        r0: usize,
        st: &Step,
    ) {
        let (lda, ldc) = (st.lda, st.ldc);
        let (m0, m1) = (st.mask as __mmask16, (st.mask >> 16) as __mmask16);
        let mut c0 = [_mm512_setzero_ps(); R];
        let mut c1 = [_mm512_setzero_ps(); R];
        if st.acc {
            for r in 0..R {
                c0[r] = _mm512_maskz_loadu_ps(m0, c.add(r * ldc));
                if H == 2 {
                    c1[r] = _mm512_maskz_loadu_ps(m1, c.add(r * ldc + 16));
                }
            }
        }
        let mut b = b;
        for &(off, len) in st.segs() {
            let a = a.offset(off);
            for kk in 0..len {
                let b0 = _mm512_loadu_ps(b.add(kk * NR));
                if H == 2 {
                    let b1 = _mm512_loadu_ps(b.add(kk * NR + 16));
                    for r in 0..R {
                        let av = _mm512_set1_ps(*a.add(r * lda + kk));
                        c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
                        c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
                    }
                } else {
                    for r in 0..R {
                        let av = _mm512_set1_ps(*a.add(r * lda + kk));
                        c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
                    }
                }
            }
            b = b.add(len * NR);
        }
        if let Some(e) = &st.epi {
            let bias0 = _mm512_maskz_loadu_ps(m0, e.bias);
            let bias1 = _mm512_maskz_loadu_ps(m1, e.bias.add(16));
            for r in 0..R {
                c0[r] = _mm512_add_ps(c0[r], bias0);
                if H == 2 {
                    c1[r] = _mm512_add_ps(c1[r], bias1);
                }
                if e.act {
                    c0[r] = silu(c0[r]);
                    if H == 2 {
                        c1[r] = silu(c1[r]);
                    }
                }
                if let Some((q, ld)) = e.res {
                    let q = q.add((r0 + r) * ld);
                    c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, q));
                    if H == 2 {
                        c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, q.add(16)));
                    }
                }
            }
        }
        // Plain stores where every column is stored (a masked store is several times slower on
        // some cores, AMD's among them).
        let full = st.mask == u32::MAX;
        for r in 0..R {
            if full {
                _mm512_storeu_ps(c.add(r * ldc), c0[r]);
                _mm512_storeu_ps(c.add(r * ldc + 16), c1[r]);
            } else {
                _mm512_mask_storeu_ps(c.add(r * ldc), m0, c0[r]);
                if H == 2 {
                    _mm512_mask_storeu_ps(c.add(r * ldc + 16), m1, c1[r]);
                }
            }
        }
    }
}

/// The drivers of a 16-column micro-kernel (AVX2, NEON) over weights packed in half panels
/// ([`packed_at`]): `gemm` and `conv_taps` walk the half panels (and, for `gemm`, the k blocks),
/// `rows` the rows [`MR`]-at-a-time (6), then the remainder. Expanded inside the kernel's
/// module, compiled for `$features`; the module defines `MR`, `Step` (with `lda` and `ldc`),
/// `step(j, n, lda, ldc, segs, acc, last, epi)` and `kern::<R>(a, b, c, r0, step)`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! half_panel_drivers {
    ($features:literal) => {
        /// See [`super::gemm`]: each 32-column panel as two halves of 16.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn gemm(
            m: usize,
            n: usize,
            k: usize,
            a: *const f32,
            lda: usize,
            bp: *const f32,
            c: *mut f32,
            ldc: usize,
            epi: Epilogue,
        ) {
            let mut kb = 0;
            while kb < k {
                let kc = KC.min(k - kb);
                let seg = [(0isize, kc)];
                for j in (0..n).step_by(16) {
                    let (p, half) = (j / NR, (j % NR) / 16);
                    let b = bp.add(p * k * NR + half * k * 16 + kb * 16);
                    let st = step(j, n, lda, ldc, &seg, kb > 0, kb + kc == k, &epi);
                    rows(m, a.add(kb), b, c.add(j), &st);
                }
                kb += kc;
            }
        }

        /// See [`super::conv_taps`]: the whole depth (the taps' runs) in one pass per 16
        /// columns.
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        pub(super) unsafe fn conv_taps(
            m: usize,
            n: usize,
            taps: &[(isize, usize)],
            a: *const f32,
            lda: usize,
            bp: *const f32,
            c: *mut f32,
            ldc: usize,
            epi: Epilogue,
        ) {
            let k: usize = taps.iter().map(|t| t.1).sum();
            for j in (0..n).step_by(16) {
                let (p, half) = (j / NR, (j % NR) / 16);
                let st = step(j, n, lda, ldc, taps, false, true, &epi);
                rows(m, a, bp.add(p * k * NR + half * k * 16), c.add(j), &st);
            }
        }

        /// All `m` rows of 16 columns: `MR` at a time, then the remainder.
        #[target_feature(enable = $features)]
        unsafe fn rows(m: usize, a: *const f32, b: *const f32, c: *mut f32, st: &Step) {
            let (lda, ldc) = (st.lda, st.ldc);
            let mut r = 0;
            while r + MR <= m {
                kern::<MR>(a.add(r * lda), b, c.add(r * ldc), r, st);
                r += MR;
            }
            let (a, c) = (a.add(r * lda), c.add(r * ldc));
            match m - r {
                0 => {}
                1 => kern::<1>(a, b, c, r, st),
                2 => kern::<2>(a, b, c, r, st),
                3 => kern::<3>(a, b, c, r, st),
                4 => kern::<4>(a, b, c, r, st),
                _ => kern::<5>(a, b, c, r, st),
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Epilogue, KC, NR};
    use crate::model::cpu::math::avx2::{lanes, silu};
    use std::arch::x86_64::*;

    /// Rows of the AVX2 micro-kernel.
    const MR: usize = 6;

    /// What the micro-kernel calls of one (k block, half panel) share.
    struct Step {
        lda: usize,
        ldc: usize,
        /// The depth as runs of A: `(offset of the run from A's row start, floats)`; one run
        /// `(0, kc)` for a plain GEMM, one per kernel tap for an implicit convolution.
        segs: *const (isize, usize),
        nsegs: usize,
        acc: bool,
        m0: __m256i,
        m1: __m256i,
        /// All 16 columns stored (plain stores instead of masked ones).
        full: bool,
        epi: Option<Epi>,
    }

    impl Step {
        /// The runs of the depth.
        ///
        /// SAFETY: `segs` points at `nsegs` runs that outlive the step.
        unsafe fn segs(&self) -> &[(isize, usize)] {
            std::slice::from_raw_parts(self.segs, self.nsegs)
        }
    }

    /// Bias of the 16 columns, SiLU, residual (column 0 of the tile's row 0, stride).
    #[derive(Clone, Copy)]
    struct Epi(*const f32, bool, Option<(*const f32, usize)>);

    /// The [`Step`] of the 16 columns from `j` (of `n`): their masks, and the epilogue when
    /// `last`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn step(
        j: usize,
        n: usize,
        lda: usize,
        ldc: usize,
        segs: &[(isize, usize)],
        acc: bool,
        last: bool,
        epi: &Epilogue,
    ) -> Step {
        let cols = 16.min(n - j);
        Step {
            lda,
            ldc,
            segs: segs.as_ptr(),
            nsegs: segs.len(),
            acc,
            m0: lanes(cols),
            m1: lanes(cols.saturating_sub(8)),
            full: cols == 16,
            epi: last.then(|| {
                Epi(
                    epi.bias.as_ptr().add(j),
                    epi.act,
                    epi.res.map(|(q, ld)| (q.add(j), ld)),
                )
            }),
        }
    }

    half_panel_drivers!("avx2,fma");

    /// `R` rows × 16 columns over the step's depth; rows `r0..r0+R` of the tile, for the
    /// residual.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    // Row loops index the accumulator arrays side by side (registers once unrolled).
    #[allow(clippy::needless_range_loop)]
    unsafe fn kern<const R: usize>(
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        r0: usize,
        st: &Step,
    ) {
        let (lda, ldc, m0, m1) = (st.lda, st.ldc, st.m0, st.m1);
        let mut c0 = [_mm256_setzero_ps(); R];
        let mut c1 = [_mm256_setzero_ps(); R];
        if st.acc {
            for r in 0..R {
                c0[r] = _mm256_maskload_ps(c.add(r * ldc), m0);
                c1[r] = _mm256_maskload_ps(c.add(r * ldc + 8), m1);
            }
        }
        let mut b = b;
        for &(off, len) in st.segs() {
            let a = a.offset(off);
            for kk in 0..len {
                let b0 = _mm256_loadu_ps(b.add(kk * 16));
                let b1 = _mm256_loadu_ps(b.add(kk * 16 + 8));
                for r in 0..R {
                    let av = _mm256_broadcast_ss(&*a.add(r * lda + kk));
                    c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
                    c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
                }
            }
            b = b.add(len * 16);
        }
        if let Some(Epi(bias, act, res)) = st.epi {
            let bias0 = _mm256_maskload_ps(bias, m0);
            let bias1 = _mm256_maskload_ps(bias.add(8), m1);
            for r in 0..R {
                c0[r] = _mm256_add_ps(c0[r], bias0);
                c1[r] = _mm256_add_ps(c1[r], bias1);
            }
            if act {
                // Two rows (four vectors) at a time.
                let mut r = 0;
                while r + 2 <= R {
                    let mut g = [c0[r], c1[r], c0[r + 1], c1[r + 1]];
                    silu(&mut g);
                    [c0[r], c1[r], c0[r + 1], c1[r + 1]] = g;
                    r += 2;
                }
                if r < R {
                    let mut g = [c0[r], c1[r]];
                    silu(&mut g);
                    [c0[r], c1[r]] = g;
                }
            }
            for r in 0..R {
                if let Some((q, ld)) = res {
                    let q = q.add((r0 + r) * ld);
                    c0[r] = _mm256_add_ps(c0[r], _mm256_maskload_ps(q, m0));
                    c1[r] = _mm256_add_ps(c1[r], _mm256_maskload_ps(q.add(8), m1));
                }
            }
        }
        if st.full {
            for r in 0..R {
                _mm256_storeu_ps(c.add(r * ldc), c0[r]);
                _mm256_storeu_ps(c.add(r * ldc + 8), c1[r]);
            }
        } else {
            for r in 0..R {
                _mm256_maskstore_ps(c.add(r * ldc), m0, c0[r]);
                _mm256_maskstore_ps(c.add(r * ldc + 8), m1, c1[r]);
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    //! The AVX2 kernel's scheme on NEON: 6 rows × 16 columns, each row's 16 sums in four
    //! 128-bit registers (24 accumulators, 4 registers of B, of NEON's 32), the half-panel
    //! packing of [`super::packed_at`]. NEON has no masked loads or stores: a last block of
    //! fewer than 16 columns goes through a 16-float buffer on the stack.

    use super::{Epilogue, KC, NR};
    use crate::model::cpu::math::neon::silu;
    use std::arch::aarch64::*;

    /// Rows of the NEON micro-kernel.
    const MR: usize = 6;
    /// Columns of a half panel.
    const W: usize = 16;

    /// The 16 floats from `p`, of which the first `cols` are read (the rest are 0).
    #[inline]
    unsafe fn load(p: *const f32, cols: usize) -> [float32x4_t; 4] {
        if cols == W {
            return [0, 4, 8, 12].map(|o| vld1q_f32(p.add(o)));
        }
        let mut t = [0f32; W];
        std::ptr::copy_nonoverlapping(p, t.as_mut_ptr(), cols);
        [0, 4, 8, 12].map(|o| vld1q_f32(t.as_ptr().add(o)))
    }

    /// Stores the first `cols` of the 16 floats `v` at `p`.
    #[inline]
    unsafe fn store(p: *mut f32, cols: usize, v: &[float32x4_t; 4]) {
        if cols == W {
            for (q, v) in v.iter().enumerate() {
                vst1q_f32(p.add(4 * q), *v);
            }
            return;
        }
        let mut t = [0f32; W];
        for (q, v) in v.iter().enumerate() {
            vst1q_f32(t.as_mut_ptr().add(4 * q), *v);
        }
        std::ptr::copy_nonoverlapping(t.as_ptr(), p, cols);
    }

    /// Bias of the 16 columns (zeros past the last), SiLU, residual (column 0 of the tile's row
    /// 0, stride).
    struct Epi {
        bias: [f32; W],
        act: bool,
        res: Option<(*const f32, usize)>,
    }

    /// What the micro-kernel calls of one (k block, half panel) share.
    struct Step {
        lda: usize,
        ldc: usize,
        /// The depth as runs of A: `(offset of the run from A's row start, floats)`; one run
        /// `(0, kc)` for a plain GEMM, one per kernel tap for an implicit convolution.
        segs: *const (isize, usize),
        nsegs: usize,
        /// Add to C (a later k block) instead of overwriting it.
        acc: bool,
        /// Columns stored (1..=16).
        cols: usize,
        epi: Option<Epi>,
    }

    impl Step {
        /// The runs of the depth.
        ///
        /// SAFETY: `segs` points at `nsegs` runs that outlive the step.
        unsafe fn segs(&self) -> &[(isize, usize)] {
            std::slice::from_raw_parts(self.segs, self.nsegs)
        }
    }

    /// The [`Step`] of the 16 columns from `j` (of `n`), with the epilogue when `last`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn step(
        j: usize,
        n: usize,
        lda: usize,
        ldc: usize,
        segs: &[(isize, usize)],
        acc: bool,
        last: bool,
        epi: &Epilogue,
    ) -> Step {
        let cols = W.min(n - j);
        Step {
            lda,
            ldc,
            segs: segs.as_ptr(),
            nsegs: segs.len(),
            acc,
            cols,
            epi: last.then(|| {
                let mut bias = [0f32; W];
                bias[..cols].copy_from_slice(&epi.bias[j..j + cols]);
                Epi {
                    bias,
                    act: epi.act,
                    res: epi.res.map(|(q, ld)| (q.add(j), ld)),
                }
            }),
        }
    }

    half_panel_drivers!("neon");

    /// `R` rows × 16 columns over the step's depth; rows `r0..r0+R` of the tile, for the
    /// residual.
    #[inline]
    // Row loops index the accumulator arrays side by side (registers once unrolled).
    #[allow(clippy::needless_range_loop)]
    unsafe fn kern<const R: usize>(
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        r0: usize,
        st: &Step,
    ) {
        let (lda, ldc, cols) = (st.lda, st.ldc, st.cols);
        let mut acc = [[vdupq_n_f32(0.0); 4]; R];
        if st.acc {
            for r in 0..R {
                acc[r] = load(c.add(r * ldc), cols);
            }
        }
        let mut b = b;
        for &(off, len) in st.segs() {
            let a = a.offset(off);
            for kk in 0..len {
                let bv = [0, 4, 8, 12].map(|o| vld1q_f32(b.add(kk * W + o)));
                for r in 0..R {
                    let av = *a.add(r * lda + kk);
                    for q in 0..4 {
                        acc[r][q] = vfmaq_n_f32(acc[r][q], bv[q], av);
                    }
                }
            }
            b = b.add(len * W);
        }
        if let Some(e) = &st.epi {
            let bias = [0, 4, 8, 12].map(|o| vld1q_f32(e.bias.as_ptr().add(o)));
            for r in 0..R {
                for q in 0..4 {
                    acc[r][q] = vaddq_f32(acc[r][q], bias[q]);
                }
                if e.act {
                    silu(&mut acc[r]);
                }
                if let Some((q, ld)) = e.res {
                    let res = load(q.add((r0 + r) * ld), cols);
                    for q in 0..4 {
                        acc[r][q] = vaddq_f32(acc[r][q], res[q]);
                    }
                }
            }
        }
        for r in 0..R {
            store(c.add(r * ldc), cols, &acc[r]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels this CPU has, the generic one first.
    fn kernels() -> Vec<Kernel> {
        let mut kernels = vec![Kernel::Generic];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                kernels.push(Kernel::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                kernels.push(Kernel::Avx512);
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            kernels.push(Kernel::Neon);
        }
        kernels
    }

    /// Every kernel against a plain triple loop, on shapes with ragged rows, columns and depth.
    #[test]
    fn gemm_matches_naive() {
        let shapes = [
            (1, 3, 5),
            (13, 32, 300),
            (25, 45, 257),
            (12, 64, 27),
            (7, 17, 512),
            (13, 48, 300),
        ];
        let kernels = kernels();
        assert!(kernels.len() > 1 || !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")));
        for kernel in kernels {
            for &(m, n, k) in &shapes {
                check(kernel, m, n, k);
            }
        }
    }

    /// The implicit convolution (taps read in place) gives the bits of the GEMM on the same
    /// rows gathered (im2col), on every wide kernel the CPU has: a 3x3 kernel over one row of
    /// `m` output pixels of a `c`-channel input with a row stride, 48 output channels (a panel
    /// and a half).
    #[test]
    fn conv_taps_equal_the_gemm_of_the_gathered_rows() {
        let kernels: Vec<Kernel> = kernels()
            .into_iter()
            .filter(|k| *k != Kernel::Generic)
            .collect();
        let (m, n, c, w, ld) = (19usize, 48usize, 5usize, 24usize, 7usize);
        let x: Vec<f32> = (0..3 * w * ld)
            .map(|i| ((i * 7919) % 101) as f32 / 101.0 - 0.5)
            .collect();
        // Tap (ky, kx): offset of the input pixel under it from the window's corner.
        let taps: Vec<(isize, usize)> = (0..9)
            .map(|t| ((((t / 3) * w + t % 3) * ld) as isize, c))
            .collect();
        let k = 9 * c;
        let bm: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5)
            .collect();
        let gathered: Vec<f32> = (0..m)
            .flat_map(|r| {
                let x = &x;
                taps.iter().flat_map(move |&(off, len)| {
                    let at = off as usize + r * ld;
                    x[at..at + len].iter().copied()
                })
            })
            .collect();
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01).collect();
        let epi = || Epilogue {
            bias: &bias,
            act: true,
            res: None,
        };
        for wide in kernels {
            let mut bp = vec![0f32; packed_len(k, n)];
            pack_on(wide, k, n, &mut bp, |kk, j| bm[kk * n + j]);
            let mut by_gemm = vec![0f32; m * n];
            let mut by_taps = vec![0f32; m * n];
            unsafe {
                gemm_on(
                    wide,
                    m,
                    n,
                    k,
                    gathered.as_ptr(),
                    k,
                    bp.as_ptr(),
                    by_gemm.as_mut_ptr(),
                    n,
                    epi(),
                );
                conv_taps_on(
                    wide,
                    m,
                    n,
                    &taps,
                    x.as_ptr(),
                    ld,
                    bp.as_ptr(),
                    by_taps.as_mut_ptr(),
                    n,
                    epi(),
                );
            }
            assert!(
                by_gemm
                    .iter()
                    .zip(&by_taps)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{wide:?}: implicit convolution differs from the GEMM"
            );
            assert!(by_taps.iter().any(|v| *v != 0.0));
        }
    }

    /// The AVX2 SiLU (the GEMM's epilogue) against f64: see [`silu_is_accurate`].
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_silu_is_accurate() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            return;
        }
        silu_is_accurate(|ch| {
            // SAFETY: the CPU has AVX2 and FMA (checked above); four 8-float loads and stores
            // inside the 32-float chunk.
            unsafe {
                use std::arch::x86_64::*;
                let p = ch.as_mut_ptr();
                let mut v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
                crate::model::cpu::math::avx2::silu(&mut v);
                for (o, v) in [0, 8, 16, 24].into_iter().zip(v) {
                    _mm256_storeu_ps(p.add(o), v);
                }
            }
        });
    }

    /// The NEON SiLU against f64: see [`silu_is_accurate`].
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_silu_is_accurate() {
        silu_is_accurate(|ch| {
            // SAFETY: NEON is part of aarch64; eight 4-float loads and stores inside the
            // 32-float chunk.
            unsafe {
                use std::arch::aarch64::*;
                let p = ch.as_mut_ptr();
                let mut v = [0, 4, 8, 12, 16, 20, 24, 28].map(|o| vld1q_f32(p.add(o)));
                crate::model::cpu::math::neon::silu(&mut v);
                for (o, v) in [0, 4, 8, 12, 16, 20, 24, 28].into_iter().zip(v) {
                    vst1q_f32(p.add(o), v);
                }
            }
        });
    }

    /// A vector SiLU (`silu` applied in place to chunks of 32 floats) against f64 from −87 to
    /// 87: relative error ≤ 5e-7 for |v| < 16 and ≤ 1.5e-6 beyond (the bounds of its doc);
    /// exactly 0 at 0.
    #[allow(dead_code)]
    fn silu_is_accurate(silu: impl Fn(&mut [f32])) {
        let xs: Vec<f32> = (0..=400_000)
            .map(|i| -87.0 + i as f32 * (174.0 / 400_000.0))
            .chain([0.0])
            .collect();
        let mut ys = xs.clone();
        for ch in ys.chunks_exact_mut(32) {
            silu(ch);
        }
        let n = ys.len() / 32 * 32;
        let (mut near, mut far) = (0f64, 0f64);
        for (&x, &y) in xs[..n].iter().zip(&ys[..n]) {
            let want = x as f64 / (1.0 + (-(x as f64)).exp());
            if want == 0.0 {
                assert_eq!(y, 0.0);
                continue;
            }
            let rel = ((y as f64 - want) / want).abs();
            if x.abs() < 16.0 {
                near = near.max(rel);
            } else {
                far = far.max(rel);
            }
        }
        assert!(
            near <= 5e-7 && far <= 1.5e-6,
            "relative error {near:e} (|v| < 16), {far:e}"
        );
        assert!(near > 0.0, "nothing compared");
    }

    fn check(wide: Kernel, m: usize, n: usize, k: usize) {
        {
            let lda = k + 3;
            let ldc = n + 5;
            let a: Vec<f32> = (0..m * lda)
                .map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5)
                .collect();
            let bm: Vec<f32> = (0..k * n)
                .map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5)
                .collect();
            let mut bp = vec![0f32; packed_len(k, n)];
            pack_on(wide, k, n, &mut bp, |kk, j| bm[kk * n + j]);
            let mut c = vec![7f32; m * ldc];
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01).collect();
            let res: Vec<f32> = (0..m * (n + 1)).map(|i| (i % 13) as f32 * 0.1).collect();
            let epi = Epilogue {
                bias: &bias,
                act: true,
                res: Some((res.as_ptr(), n + 1)),
            };
            let (ap, bpp, cp) = (a.as_ptr(), bp.as_ptr(), c.as_mut_ptr());
            unsafe { gemm_on(wide, m, n, k, ap, lda, bpp, cp, ldc, epi) };
            for i in 0..m {
                for j in 0..ldc {
                    let got = c[i * ldc + j];
                    if j >= n {
                        assert_eq!(got, 7.0, "column {j} past n written");
                        continue;
                    }
                    let sum: f64 = (0..k)
                        .map(|kk| a[i * lda + kk] as f64 * bm[kk * n + j] as f64)
                        .sum();
                    let v = sum + bias[j] as f64;
                    let want = v / (1.0 + (-v).exp()) + res[i * (n + 1) + j] as f64;
                    assert!(
                        (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "({m},{n},{k}) [{i},{j}] {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod rate {
    use super::*;
    #[test]
    #[ignore]
    fn gemm_rate() {
        for &(m, n, k) in &[
            (48usize, 128usize, 2304usize),
            (216, 64, 576),
            (480, 64, 64),
            (480, 128, 128),
            (12, 32, 256),
        ] {
            let a = vec![0.5f32; m * k];
            let bp = vec![0.25f32; packed_len(k, n)];
            let mut c = vec![0f32; m * n];
            let reps = (2e9 / (2.0 * (m * n * k) as f64)) as usize;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                let bias = vec![0f32; n];
                let epi = Epilogue {
                    bias: &bias,
                    act: true,
                    res: None,
                };
                unsafe { gemm(m, n, k, a.as_ptr(), k, bp.as_ptr(), c.as_mut_ptr(), n, epi) };
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "m{m} n{n} k{k}: {:.1} GFLOP/s",
                2.0 * (m * n * k * reps) as f64 / s / 1e9
            );
        }
    }
}
