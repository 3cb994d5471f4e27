//! INT8 convolutions of the CPU engine: post-training static quantization, as ONNX Runtime's
//! and OpenVINO's tools do it (per-channel symmetric weights, per-tensor asymmetric
//! activations from calibrated ranges; [`crate::model::quant`] records the ranges).
//!
//! - **Weights**: output channel `j` as `i8` in −127..=127 with scale `s_w[j] = max|w_j| / 127`
//!   (−63..=63 and `/ 63` for the kernel of AVX2 CPUs without VNNI: [`igemm::weight_max`]).
//! - **Input**: `u8` with scale `s_x = (max − min) / 255` and zero point `z = round(−min / s_x)`
//!   over the calibrated range widened to hold 0 (so the padding, a real 0, is exactly `z`):
//!   `q = clamp(round(x / s_x) + z, 0, 255)`, rounded half to even.
//! - **Sum**: `Σ (q − z)·w_q = Σ q·w_q − z·Σ w_q`, the first term exact in i32 on
//!   [`super::igemm`]'s kernels; so `y = act(s_x·s_w[j]·Σ q·w_q + (bias[j] − s_x·s_w[j]·z·Σ_k
//!   w_q[k][j])) (+ residual)`, both folded into one scale and one bias per channel at load.
//!
//! A convolution first quantizes its f32 NHWC input into a zero-point-padded `u8` buffer
//! (`(H + 2p) × (W + 2p)` pixels of the input channels rounded up to 4), then computes each
//! output row as one GEMM whose rows read the kernel's rows straight from that buffer (no
//! im2col, no border cases); the outputs are f32, so the rest of the engine (concatenations in
//! place, pools, the head's f32 convolutions, the decode) is unchanged.

use super::igemm;
use super::math::dispatch;
use super::view::{column_blocks, Act, Exec, Scratch};

/// Most output pixels of one task of a pointwise convolution (a multiple of [`igemm::MR`]).
const FLAT_ROWS: usize = 192;

/// A convolution's quantized weights and folded epilogue (see the module docs).
#[derive(Debug)]
pub(crate) struct QConv {
    /// Kernel size, stride, padding, output channels; SiLU after the bias.
    k: usize,
    stride: usize,
    pad: usize,
    co: usize,
    act: bool,
    /// Input channels rounded up to a multiple of 4 (the padded buffer's pixel stride).
    pub cip: usize,
    /// Packed weights ([`igemm::pack`]), depth `k·k·cip` in tap order, from byte `w0` (the
    /// first 64-byte aligned one).
    w: Vec<i8>,
    w0: usize,
    /// Per output channel: `s_x·s_w[j]`, and the bias less the zero point's share.
    scale: Vec<f32>,
    bias: Vec<f32>,
    /// `1 / s_x` and the zero point (an integer in 0..=255, as f32).
    inv: f32,
    zero: f32,
}

/// The scale and zero point of a `u8` tensor over `[min, max]` widened to hold 0.
pub(crate) fn act_params(min: f32, max: f32) -> (f32, f32) {
    let (lo, hi) = (min.min(0.0), max.max(0.0));
    let s = if hi > lo && (hi - lo).is_finite() {
        (hi - lo) / 255.0
    } else {
        1.0
    };
    (s, (-lo / s).round_ties_even().clamp(0.0, 255.0))
}

impl QConv {
    /// Quantizes the folded kernel `src` `(co, ci, k, k)` f32 (one group) with bias `bias`
    /// `(co,)`, of a convolution of stride `stride` and padding `pad` (SiLU after it when
    /// `act`), for an input calibrated to `[min, max]`.
    pub fn new(
        src: &[f32],
        bias: &[f32],
        (co, ci, k): (usize, usize, usize),
        (stride, pad, act): (usize, usize, bool),
        (min, max): (f32, f32),
    ) -> Self {
        let cip = ci.next_multiple_of(4);
        let kq = k * k * cip;
        let (sx, zero) = act_params(min, max);
        let mut q = vec![0i8; co * k * k * ci];
        let mut scale = vec![0f32; co];
        let mut folded = vec![0f32; co];
        let wmax = igemm::weight_max() as f32;
        for j in 0..co {
            let wj = &src[j * ci * k * k..(j + 1) * ci * k * k];
            let amax = wj.iter().fold(0f32, |m, v| m.max(v.abs()));
            let sw = if amax > 0.0 { amax / wmax } else { 1.0 };
            let mut sum = 0i64;
            for (d, &v) in q[j * ci * k * k..].iter_mut().zip(wj) {
                *d = (v / sw).round_ties_even().clamp(-wmax, wmax) as i8;
                sum += *d as i64;
            }
            scale[j] = sx * sw;
            folded[j] = bias[j] - scale[j] * zero * sum as f32;
        }
        let len = igemm::packed_len(kq, co);
        let mut w = vec![0i8; len + 64];
        let w0 = w.as_ptr().align_offset(64).min(64);
        // Row (ky·k + kx)·cip + c of the GEMM: tap (ky, kx) of input channel c (0 past ci).
        igemm::pack(kq, co, &mut w[w0..w0 + len], |row, j| {
            let (tap, c) = (row / cip, row % cip);
            if c >= ci {
                return 0;
            }
            q[((j * ci + c) * k + tap / k) * k + tap % k]
        });
        Self {
            k,
            stride,
            pad,
            co,
            act,
            cip,
            w,
            w0,
            scale,
            bias: folded,
            inv: 1.0 / sx,
            zero,
        }
    }

    /// A 1×1, stride-1, unpadded convolution (whose tasks quantize their own rows).
    fn pointwise(&self) -> bool {
        self.k == 1 && self.stride == 1 && self.pad == 0
    }

    /// Bytes of the padded input buffer for a `b × h × w` input (0 for a pointwise convolution).
    pub fn buf_len(&self, b: usize, h: usize, w: usize) -> usize {
        match self.pointwise() {
            true => 0,
            false => b * (h + 2 * self.pad) * (w + 2 * self.pad) * self.cip,
        }
    }

    /// Floats of per-thread scratch: a pointwise convolution's task quantizes its at most
    /// [`FLAT_ROWS`] rows there.
    pub fn scratch(&self) -> usize {
        match self.pointwise() {
            true => (FLAT_ROWS * self.cip).div_ceil(4),
            false => 0,
        }
    }
}

/// The quantized-input buffer's base, shared by a kernel's tasks (each writes or reads its own
/// rows).
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: the tasks given the pointer touch disjoint rows of the buffer, or only read it.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// `dst[i] = round(clamp(src[i]·inv + zero, 0, 255))`, rounded half to even (a
/// multiplication then an addition, never fused, so that every CPU gives the same bytes).
fn quantize_into(src: &[f32], dst: &mut [u8], inv: f32, zero: f32) {
    #[cfg(target_arch = "x86_64")]
    if super::isa::avx512() {
        assert!(src.len() >= dst.len());
        // SAFETY: the CPU has AVX-512F; `src` covers `dst`.
        unsafe { quantize_avx512(src, dst, inv, zero) };
        return;
    }
    quantize_auto(src, dst, inv, zero)
}

dispatch! {
    /// [`quantize_into`] as a plain loop.
    fn quantize_auto(src: &[f32], dst: &mut [u8], inv: f32, zero: f32) {
        let src = &src[..dst.len()];
        for i in 0..dst.len() {
            dst[i] = (src[i] * inv + zero).clamp(0.0, 255.0).round_ties_even() as u8;
        }
    }
}

/// [`quantize_into`] on 16 lanes (the conversion rounds half to even, as the default MXCSR
/// mode does).
///
/// SAFETY: AVX-512F; `src` covers `dst`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantize_avx512(src: &[f32], dst: &mut [u8], inv: f32, zero: f32) {
    use std::arch::x86_64::*;
    let n = dst.len();
    let (vi, vz) = (_mm512_set1_ps(inv), _mm512_set1_ps(zero));
    let (lo, hi) = (_mm512_setzero_ps(), _mm512_set1_ps(255.0));
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let q = |v: __m512| {
        let v = _mm512_min_ps(
            _mm512_max_ps(_mm512_add_ps(_mm512_mul_ps(v, vi), vz), lo),
            hi,
        );
        _mm512_cvtps_epi32(v)
    };
    let mut i = 0;
    while i + 16 <= n {
        let v = q(_mm512_loadu_ps(s.add(i)));
        _mm_storeu_si128(d.add(i) as *mut __m128i, _mm512_cvtusepi32_epi8(v));
        i += 16;
    }
    if i < n {
        let m = ((1u32 << (n - i)) - 1) as __mmask16;
        let v = q(_mm512_maskz_loadu_ps(m, s.add(i)));
        _mm512_mask_cvtusepi32_storeu_epi8(d.add(i) as *mut i8, m, v);
    }
}

/// Pixels `p0..p1` of `x` quantized into `dst` (`cip` bytes each, channels past `x.c` at the
/// zero point).
///
/// SAFETY: the pixels lie in `x`.
unsafe fn quantize_rows(x: Act, q: &QConv, p0: usize, p1: usize, dst: &mut [u8]) {
    let cip = q.cip;
    if x.ld == x.c && cip == x.c {
        let src = std::slice::from_raw_parts(x.at(p0 * x.ld), (p1 - p0) * x.c);
        quantize_into(src, &mut dst[..(p1 - p0) * cip], q.inv, q.zero);
        return;
    }
    for (i, p) in (p0..p1).enumerate() {
        let src = std::slice::from_raw_parts(x.at(p * x.ld), x.c);
        let d = &mut dst[i * cip..(i + 1) * cip];
        quantize_into(src, &mut d[..x.c], q.inv, q.zero);
        d[x.c..].fill(q.zero as u8);
    }
}

/// Writes `x` quantized into `buf` as `b × (h + 2·pad) × (w + 2·pad)` pixels of `cip` bytes
/// (`pad` the convolution's), the padding (border pixels and channels past `x.c`) at the zero
/// point.
///
/// SAFETY: `buf` holds [`QConv::buf_len`] bytes; `x` as the plan describes it.
unsafe fn quantize(ex: Exec, x: Act, q: &QConv, buf: *mut u8) {
    let (pad, cip) = (q.pad, q.cip);
    let (hp, wp) = (x.h + 2 * pad, x.w + 2 * pad);
    let rows = x.b * hp;
    let per = rows.div_ceil(4 * ex.threads()).max(1);
    let buf = SendPtr(buf);
    ex.each(rows.div_ceil(per), |t| {
        for row in t * per..((t + 1) * per).min(rows) {
            let (n, yy) = (row / hp, row % hp);
            // SAFETY: row `row` of the buffer is this task's alone; `x`'s pixels are readable.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(buf.get().add(row * wp * cip), wp * cip) };
            let z = q.zero as u8;
            if yy < pad || yy >= pad + x.h {
                dst.fill(z);
                continue;
            }
            dst[..pad * cip].fill(z);
            dst[(pad + x.w) * cip..].fill(z);
            let p0 = (n * x.h + yy - pad) * x.w;
            // SAFETY: the row's pixels lie in `x`.
            unsafe { quantize_rows(x, q, p0, p0 + x.w, &mut dst[pad * cip..(pad + x.w) * cip]) };
        }
    });
}

/// `y = act(conv(x) + bias) (+ res)` in INT8 (module docs). A pointwise convolution's task
/// quantizes its own rows of `x` into its thread's scratch (in cache when the GEMM reads them);
/// other convolutions quantize the whole input, padded, into the plan's buffer first.
///
/// SAFETY: as [`super::kernels::conv`]'s; `scratch.qbuf` holds [`QConv::buf_len`] bytes for
/// `x`, and each thread's scratch [`QConv::scratch`] floats.
pub(crate) unsafe fn conv(ex: Exec, x: Act, y: Act, res: Option<Act>, q: &QConv, scratch: Scratch) {
    let flat = q.pointwise();
    let buf = scratch.qbuf;
    if !flat {
        quantize(ex, x, q, buf);
    }
    let (s, k, cip) = (q.stride, q.k, q.cip);
    let (hp, wp) = (x.h + 2 * q.pad, x.w + 2 * q.pad);
    let threads = ex.threads();
    // Units of rows: a flat (pointwise) conv's pixels in tiles, else whole output rows.
    let (units, per_unit) = if flat {
        (y.pixels(), 1)
    } else {
        (y.b * y.h, y.w)
    };
    // Units per task: about 192 output pixels, fewer when there are too few for the threads.
    let mut per = (FLAT_ROWS / per_unit)
        .max(1)
        .min(units.div_ceil(2 * threads))
        .max(1);
    if flat {
        per = per.next_multiple_of(igemm::MR).min(FLAT_ROWS);
    }
    let tiles = units.div_ceil(per);
    let (nb, bw) = column_blocks(tiles, threads, q.co, igemm::NR);
    // A kernel row's taps are one run: k pixels of cip bytes side by side in the buffer.
    let segs: Vec<(isize, usize)> = (0..k)
        .map(|ky| ((ky * wp * cip) as isize, k * cip))
        .collect();
    let buf = SendPtr(buf);
    ex.each_on(tiles * nb, |task, thread| {
        let (t, jb) = (task / nb, task % nb);
        let j0 = jb * bw;
        let n = bw.min(q.co - j0);
        let epi = |p: usize| igemm::Epilogue {
            scale: &q.scale[j0..j0 + n],
            bias: &q.bias[j0..j0 + n],
            act: q.act,
            res: res.map(|a| (a.at(p * a.ld + j0) as *const f32, a.ld)),
        };
        let wq = q.w[q.w0 + j0 * k * k * cip..].as_ptr();
        let (u0, u1) = (t * per, ((t + 1) * per).min(units));
        // SAFETY: the buffer rows and weights read lie inside them; this task alone writes
        // output pixels of units u0..u1, channels j0..j0+n.
        unsafe {
            if flat {
                let mine = scratch.mine(thread);
                let a =
                    std::slice::from_raw_parts_mut(mine.as_mut_ptr() as *mut u8, (u1 - u0) * cip);
                quantize_rows(x, q, u0, u1, a);
                let dst = y.at(u0 * y.ld + j0);
                igemm::gemm(u1 - u0, n, &segs, a.as_ptr(), cip, wq, dst, y.ld, &epi(u0));
                return;
            }
            for u in u0..u1 {
                let (img, oy) = (u / y.h, u % y.h);
                let a = buf.get().add((img * hp + oy * s) * wp * cip);
                let p = u * y.w;
                let dst = y.at(p * y.ld + j0);
                igemm::gemm(y.w, n, &segs, a, s * cip, wq, dst, y.ld, &epi(p));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::pool::Pool;
    use candle_core::{Device, Tensor};

    /// A hand-computed case: the range of a SiLU output seen as [−0.278, 14.03] gives
    /// s = 14.308 / 255 and z = round(0.278 / s) = round(4.955) = 5; a range without 0 is widened
    /// to hold it (the padding is a real 0); an empty range falls back to scale 1.
    #[test]
    fn activation_scale_and_zero_point() {
        let (s, z) = act_params(-0.278, 14.03);
        assert!((s - 14.308 / 255.0).abs() < 1e-7 && z == 5.0, "{s} {z}");
        let (s, z) = act_params(0.196, 1.0);
        assert!((s - 1.0 / 255.0).abs() < 1e-9 && z == 0.0, "{s} {z}");
        assert_eq!(act_params(0.0, 0.0), (1.0, 0.0));
        // The AVX-512 and the plain quantization give the same bytes (ties, clamps, tails).
        let src: Vec<f32> = (0..37).map(|i| (i as f32 - 10.0) * 0.5 + 0.25).collect();
        let (mut a, mut b) = (vec![0u8; 37], vec![0u8; 37]);
        quantize_into(&src, &mut a, 2.0, 7.0);
        quantize_auto(&src, &mut b, 2.0, 7.0);
        assert_eq!(a, b);
        // src[0] = −4.75: 2·(−4.75) + 7 < 0 → 0; src[20] = 5.25 → 17.5 → 18 and src[21] = 5.75
        // → 18.5 → 18 (ties to even); src[36] = 13.25 → 33.5 → 34.
        assert_eq!(a[0], 0);
        assert_eq!((a[20], a[21], a[36]), (18, 18, 34));
    }

    /// The INT8 convolution equals the same arithmetic done by hand in f64 on the quantized
    /// values (`y = act(s_x·s_w[j]·Σ (q − z)·w_q + b) (+ res)`), within f32 rounding: pointwise
    /// and 3x3, stride 1 and 2, channels that are not a multiple of 4, a residual, a channel
    /// slice of a wider input, on one thread and on three.
    #[test]
    fn conv_equals_the_quantized_arithmetic() {
        let pool = Pool::new(3).unwrap();
        for &(ci, co, k, s, h, w, res) in &[
            (6usize, 40usize, 3usize, 1usize, 9usize, 11usize, false),
            (32, 48, 1, 1, 7, 13, true),
            (13, 70, 3, 2, 10, 9, false),
            (64, 32, 3, 1, 5, 30, true),
        ] {
            let pad = k / 2;
            let wt = Tensor::rand(-0.2f32, 0.2, (co, ci, k, k), &Device::Cpu).unwrap();
            let bias: Vec<f32> = (0..co).map(|j| j as f32 * 0.01 - 0.2).collect();
            let range = (-0.3f32, 4.0f32);
            let wv = wt.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let q = QConv::new(&wv, &bias, (co, ci, k), (s, pad, true), range);
            let (ho, wo) = ((h + 2 * pad - k) / s + 1, (w + 2 * pad - k) / s + 1);
            // The input is the last `ci` channels of pixels of `ci + 5` (a concatenation's slice).
            let ld = ci + 5;
            let xb: Vec<f32> = (0..h * w * ld)
                .map(|i| ((i * 37 % 101) as f32) * 0.045 - 0.4)
                .collect();
            let rb: Vec<f32> = (0..ho * wo * co).map(|i| (i % 9) as f32 * 0.1).collect();
            let (sx, z) = act_params(range.0, range.1);
            // As the engine rounds: (x·(1/s) + z) clamped to 0..255, to even, less z.
            let qx = |v: f32| ((v * (1.0 / sx) + z).clamp(0.0, 255.0).round_ties_even() - z) as f64;
            let mut want = vec![0f64; ho * wo * co];
            for oy in 0..ho {
                for ox in 0..wo {
                    for j in 0..co {
                        let wj = &wv[j * ci * k * k..(j + 1) * ci * k * k];
                        let amax = wj.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let sw = amax / igemm::weight_max() as f32;
                        let mut acc = 0f64;
                        for c in 0..ci {
                            for ky in 0..k {
                                for kx in 0..k {
                                    let (iy, ix) = (
                                        (oy * s + ky) as isize - pad as isize,
                                        (ox * s + kx) as isize - pad as isize,
                                    );
                                    if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= w {
                                        continue;
                                    }
                                    let xv = xb[(iy as usize * w + ix as usize) * ld + 5 + c];
                                    let wq = (wj[(c * k + ky) * k + kx] / sw).round_ties_even();
                                    acc += qx(xv) * wq as f64;
                                }
                            }
                        }
                        let v = acc * (sx * sw) as f64 + bias[j] as f64;
                        let mut v = v / (1.0 + (-v).exp());
                        if res {
                            v += rb[(oy * wo + ox) * co + j] as f64;
                        }
                        want[(oy * wo + ox) * co + j] = v;
                    }
                }
            }
            for ex in [Exec(None), Exec(Some(&pool))] {
                let mut xb = xb.clone();
                let mut rb = rb.clone();
                let mut yb = vec![f32::NAN; ho * wo * co];
                let mut qbuf = vec![0u8; q.buf_len(1, h, w) + 4];
                let per = q.scratch().max(1);
                let mut sc = vec![0f32; per * ex.threads()];
                let act = |ptr: *mut f32, ld, h, w, c| Act {
                    ptr,
                    ld,
                    b: 1,
                    h,
                    w,
                    c,
                };
                let x = act(xb.as_mut_ptr().wrapping_add(5), ld, h, w, ci);
                let y = act(yb.as_mut_ptr(), co, ho, wo, co);
                let r = res.then(|| act(rb.as_mut_ptr(), co, ho, wo, co));
                let scratch = Scratch {
                    ptr: sc.as_mut_ptr(),
                    per,
                    // 4-byte aligned, as the arena's buffer.
                    qbuf: qbuf
                        .as_mut_ptr()
                        .wrapping_add(qbuf.as_ptr().align_offset(4)),
                };
                // SAFETY: the buffers have the sizes the plan would give them.
                unsafe { conv(ex, x, y, r, &q, scratch) };
                let absmax = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                for (i, (&g, &t)) in yb.iter().zip(&want).enumerate() {
                    assert!(
                        (g as f64 - t).abs() <= 2e-6 * absmax.max(1.0),
                        "ci {ci} co {co} k {k} s {s} threads {}: output {i}: {g} against {t}",
                        ex.threads()
                    );
                }
            }
        }
    }
}
