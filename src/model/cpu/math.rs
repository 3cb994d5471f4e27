//! Element-wise math of the CPU engine that the compiler can vectorise: `exp` without a libm
//! call (Cephes' `expf` range reduction and polynomial, relative error ≤ 2e-7 on the range
//! used), SiLU and the sigmoid on it, and the fused conv epilogue. Each loop is compiled for
//! AVX-512, AVX2+FMA and the baseline, and the widest one the CPU has is chosen at run time.

/// `e^x` for f32, branch-free (clamped to ±87, where f32 keeps a normal result).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2^23: adding it rounds to an integer
    let x = x.clamp(-87.0, 87.0);
    let n = (x * LOG2E + MAGIC) - MAGIC;
    let r = x - n * C1 - n * C2;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `x·σ(x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `σ(x) = 1 / (1 + e^−x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Runs `$body` (a block using the bindings) compiled for the widest vector ISA present; an
/// `unsafe fn` (its body reading raw pointers) stays unsafe to call.
macro_rules! dispatch {
    ($(#[$m:meta])* unsafe fn $name:ident($($a:ident: $t:ty),*) $body:block) => {
        $(#[$m])*
        pub unsafe fn $name($($a: $t),*) {
            #[inline(always)]
            unsafe fn inner($($a: $t),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn wide($($a: $t),*) { inner($($a),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn mid($($a: $t),*) { inner($($a),*) }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has the features the function is compiled for; the
                    // caller keeps the function's own contract.
                    return wide($($a),*);
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: as above.
                    return mid($($a),*);
                }
            }
            inner($($a),*)
        }
    };
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) $body:block) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) {
            dispatch! { unsafe fn run($($a: $t),*) $body }
            // SAFETY: `$body` is safe code; `run` only compiles it for the CPU's features.
            unsafe { run($($a),*) }
        }
    };
}
pub(crate) use dispatch;

/// One output row of a convolution in place: `row[j] = act(row[j] + bias[j]) (+ res[j])`
/// (AVX-512 intrinsics where the CPU has them, else [`epilogue_auto`]).
pub fn epilogue(row: &mut [f32], bias: &[f32], act: bool, res: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    if super::isa::avx512() {
        assert!(bias.len() >= row.len() && res.is_none_or(|r| r.len() >= row.len()));
        // SAFETY: the CPU has AVX-512F; the slices cover `row.len()` floats (checked above).
        unsafe { avx512::epilogue(row, bias, act, res) };
        return;
    }
    epilogue_auto(row, bias, act, res)
}

dispatch! {
    /// [`epilogue`] as plain loops (vectorised by the compiler).
    fn epilogue_auto(row: &mut [f32], bias: &[f32], act: bool, res: Option<&[f32]>) {
        let n = row.len();
        let bias = &bias[..n];
        match (act, res) {
            (true, Some(r)) => {
                let r = &r[..n];
                for j in 0..n {
                    row[j] = silu(row[j] + bias[j]) + r[j];
                }
            }
            (true, None) => {
                for j in 0..n {
                    row[j] = silu(row[j] + bias[j]);
                }
            }
            (false, Some(r)) => {
                let r = &r[..n];
                for j in 0..n {
                    row[j] = row[j] + bias[j] + r[j];
                }
            }
            (false, None) => {
                for j in 0..n {
                    row[j] += bias[j];
                }
            }
        }
    }
}

dispatch! {
    /// `y[j] = silu(x[j])`.
    fn silu_into(x: &[f32], y: &mut [f32]) {
        let x = &x[..y.len()];
        for j in 0..y.len() {
            y[j] = silu(x[j]);
        }
    }
}

dispatch! {
    /// `y[j] = a[j] + b[j]`.
    fn add_into(a: &[f32], b: &[f32], y: &mut [f32]) {
        let (a, b) = (&a[..y.len()], &b[..y.len()]);
        for j in 0..y.len() {
            y[j] = a[j] + b[j];
        }
    }
}

dispatch! {
    /// `y[j] = max(y[j], x[j])`.
    fn max_into(x: &[f32], y: &mut [f32]) {
        let x = &x[..y.len()];
        for j in 0..y.len() {
            y[j] = if x[j] > y[j] { x[j] } else { y[j] };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::exp`] on 16 lanes; 2^n by `vscalefps`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn exp(x: __m512) -> __m512 {
        let x = _mm512_min_ps(
            _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
            _mm512_set1_ps(87.0),
        );
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut p = _mm512_set1_ps(1.987_569_1e-4);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_199_9e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
        let y = _mm512_fmadd_ps(
            p,
            _mm512_mul_ps(r, r),
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        _mm512_scalef_ps(y, n)
    }

    /// `v / (1 + e^−v)`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn silu(v: __m512) -> __m512 {
        let d = _mm512_add_ps(
            exp(_mm512_sub_ps(_mm512_setzero_ps(), v)),
            _mm512_set1_ps(1.0),
        );
        // 1/d: the 14-bit estimate and one Newton step (≈ 1 ulp; d ≥ 1, so never 0 or NaN).
        let r = _mm512_rcp14_ps(d);
        let r = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0)));
        _mm512_mul_ps(v, r)
    }

    /// See [`super::epilogue`].
    ///
    /// SAFETY: AVX-512F; `bias` and `res` cover `row.len()` floats.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn epilogue(row: &mut [f32], bias: &[f32], act: bool, res: Option<&[f32]>) {
        let n = row.len();
        let mut j = 0;
        while j < n {
            let m: __mmask16 = if n - j >= 16 {
                0xffff
            } else {
                (1u16 << (n - j)) - 1
            };
            let p = row.as_mut_ptr().add(j);
            let mut v = _mm512_add_ps(
                _mm512_maskz_loadu_ps(m, p),
                _mm512_maskz_loadu_ps(m, bias.as_ptr().add(j)),
            );
            if act {
                v = silu(v);
            }
            if let Some(r) = res {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r.as_ptr().add(j)));
            }
            _mm512_mask_storeu_ps(p, m, v);
            j += 16;
        }
    }
}

/// `1.5·2^23`: added to an f32 of magnitude below 2^22, it rounds it to an integer, which the
/// sum's low mantissa bits then hold (the vector SiLUs' `2^n`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `2^f` for `f ∈ [−½, ½]` as a degree-5 polynomial, highest power first (fitted for relative
/// error, 2.4e-7 in f32): the exponential of the AVX2 and NEON SiLUs.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const EXP2_POLY: [f32; 6] = [
    1.327_647_1e-3,
    9.675_542e-3,
    5.550_713_5e-2,
    2.402_212e-1,
    6.931_469_4e-1,
    1.000_000_1,
];

/// AVX2 + FMA vector pieces shared by the f32 ymm kernel ([`super::gemm`]) and the ymm INT8
/// kernels' epilogue ([`super::igemm`]).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{EXP2_POLY, ROUND_MAGIC};
    use std::arch::x86_64::*;

    /// `v / (1 + e^−v)` on `N` vectors at once, each step for all of them before the next, so
    /// that their dependency chains overlap (one vector at a time left the micro-kernel waiting
    /// on each chain's latency: a third of a 1x1 convolution's time over 64 channels).
    /// `e^−v = 2^t` with `t = −v·log2 e` split as `n + f`, `n` an integer (rounded by the
    /// 1.5·2^23 trick, whose low bits then hold it), `f ∈ [−½, ½]`: `2^f` by a degree-5
    /// polynomial (fitted for relative error, 2.4e-7 in f32), `2^n` added to its exponent
    /// bits. Relative error of the SiLU: ≤ 5e-7 for |v| < 16, ≤ 1.5e-6 down to −87 (where
    /// the f32 rounding of log2 e counts); `v` is clamped to ±87 inside the exponential.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    // The steps index the arrays side by side (registers once unrolled).
    #[allow(clippy::needless_range_loop)]
    pub(crate) unsafe fn silu<const N: usize>(v: &mut [__m256; N]) {
        let magic = _mm256_set1_ps(ROUND_MAGIC);
        let nlog2e = _mm256_set1_ps(-std::f32::consts::LOG2_E);
        let (mut t, mut f) = ([_mm256_setzero_ps(); N], [_mm256_setzero_ps(); N]);
        for i in 0..N {
            let x = _mm256_min_ps(
                _mm256_max_ps(v[i], _mm256_set1_ps(-87.0)),
                _mm256_set1_ps(87.0),
            );
            t[i] = _mm256_fmadd_ps(x, nlog2e, magic);
            f[i] = _mm256_fmadd_ps(x, nlog2e, _mm256_sub_ps(magic, t[i]));
        }
        let mut p = [_mm256_set1_ps(EXP2_POLY[0]); N];
        for &c in &EXP2_POLY[1..] {
            for i in 0..N {
                p[i] = _mm256_fmadd_ps(p[i], f[i], _mm256_set1_ps(c));
            }
        }
        for i in 0..N {
            let e = _mm256_add_epi32(
                _mm256_castps_si256(p[i]),
                _mm256_slli_epi32::<23>(_mm256_castps_si256(t[i])),
            );
            let d = _mm256_add_ps(_mm256_castsi256_ps(e), _mm256_set1_ps(1.0));
            v[i] = _mm256_div_ps(v[i], d);
        }
    }

    /// Lanes `0..cols` (of 8) set.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) unsafe fn lanes(cols: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(cols.min(8) as i32), idx)
    }
}

/// The NEON SiLU of the aarch64 f32 kernel ([`super::gemm`]).
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use super::{EXP2_POLY, ROUND_MAGIC};
    use std::arch::aarch64::*;

    /// The AVX2 kernel's SiLU (`v / (1 + e^−v)`, `e^−v = 2^n·2^f` with the same rounding
    /// trick and degree-5 polynomial, hence the same error bounds: ≤ 5e-7 relative for |v| <
    /// 16, ≤ 1.5e-6 down to −87) on `N` vectors at once, each step for all of them before the
    /// next so that their dependency chains overlap.
    #[inline]
    // The steps index the arrays side by side (registers once unrolled).
    #[allow(clippy::needless_range_loop)]
    pub(crate) unsafe fn silu<const N: usize>(v: &mut [float32x4_t; N]) {
        let magic = vdupq_n_f32(ROUND_MAGIC);
        let nlog2e = vdupq_n_f32(-std::f32::consts::LOG2_E);
        let (mut t, mut f) = ([vdupq_n_f32(0.0); N], [vdupq_n_f32(0.0); N]);
        for i in 0..N {
            let x = vminq_f32(vmaxq_f32(v[i], vdupq_n_f32(-87.0)), vdupq_n_f32(87.0));
            // vfmaq_f32(a, b, c) = a + b·c, one rounding (as _mm256_fmadd_ps(b, c, a)).
            t[i] = vfmaq_f32(magic, x, nlog2e);
            f[i] = vfmaq_f32(vsubq_f32(magic, t[i]), x, nlog2e);
        }
        let mut p = [vdupq_n_f32(EXP2_POLY[0]); N];
        for &c in &EXP2_POLY[1..] {
            for i in 0..N {
                p[i] = vfmaq_f32(vdupq_n_f32(c), p[i], f[i]);
            }
        }
        for i in 0..N {
            let e = vaddq_s32(
                vreinterpretq_s32_f32(p[i]),
                vshlq_n_s32::<23>(vreinterpretq_s32_f32(t[i])),
            );
            let d = vaddq_f32(vreinterpretq_f32_s32(e), vdupq_n_f32(1.0));
            v[i] = vdivq_f32(v[i], d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0f64;
        let mut x = -80.0f32;
        while x < 80.0 {
            let e = exp(x) as f64;
            let r = (x as f64).exp();
            worst = worst.max(((e - r) / r).abs());
            x += 0.0137;
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-200.0) < 1e-37 && exp(200.0) > 1e37);
    }

    #[test]
    fn epilogue_is_bias_silu_residual() {
        let mut row = vec![0.5f32, -2.0, 3.0];
        let bias = [0.5f32, 1.0, -3.0];
        let res = [1.0f32, 2.0, 3.0];
        epilogue(&mut row, &bias, true, Some(&res));
        let s = |x: f32| x / (1.0 + (-x).exp());
        let want = [s(1.0) + 1.0, s(-1.0) + 2.0, s(0.0) + 3.0];
        for (a, b) in row.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}

#[cfg(test)]
mod rate {
    #[test]
    #[ignore]
    fn epilogue_rate() {
        let mut row = vec![0.3f32; 64];
        let bias = vec![0.1f32; 64];
        let n = 19200 * 10;
        let t = std::time::Instant::now();
        for i in 0..n {
            row[i % 64] += 1e-9;
            super::epilogue(&mut row, &bias, true, None);
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "epilogue: {:.2} ns per element ({:.2} ms per 19200x64)",
            s / (n * 64) as f64 * 1e9,
            s / 10.0 * 1e3
        );
    }
}
