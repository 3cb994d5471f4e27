//! 3x3 stride-1 convolutions by Winograd's minimal filtering F(2×2, 3×3) (Lavin & Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016, section 4): each 2×2 block of output
//! pixels (a tile) is computed from the 4×4 input pixels under it as `Y = Aᵀ [Σ_c U_c ⊙ V_c] A`,
//! with `V = Bᵀ d B` the input tile and `U = G g Gᵀ` the kernel, both transformed. The sum over
//! input channels is 16 GEMMs, one per element of the 4×4 transform (`M_e = V_e · U_e`, a
//! `tiles × C_in` by `C_in × C_out` product on [`gemm`]'s micro-kernels): 16 multiplications
//! per tile and channel pair instead of 36, 2.25 times fewer.
//!
//! The transforms' coefficients are 0, ±1 and ±½, so the results differ from the direct
//! convolution by rounding only (tested against it: `tests` below); a pixel's result does not
//! depend on how the tiles are split over threads.

use super::gemm;
use super::math;

/// The 4 values of `Bᵀ x` for a column `x` of 4 input values (`B` of F(2×2, 3×3)).
#[inline(always)]
fn bt<const L: usize>(x: [[f32; L]; 4]) -> [[f32; L]; 4] {
    let [d0, d1, d2, d3] = x;
    [
        lanes(|i| d0[i] - d2[i]),
        lanes(|i| d1[i] + d2[i]),
        lanes(|i| d2[i] - d1[i]),
        lanes(|i| d1[i] - d3[i]),
    ]
}

/// The 2 values of `Aᵀ m` for a column `m` of 4 products (`A` of F(2×2, 3×3)).
#[inline(always)]
fn at<const L: usize>(m: [[f32; L]; 4]) -> [[f32; L]; 2] {
    let [m0, m1, m2, m3] = m;
    [
        lanes(|i| m0[i] + m1[i] + m2[i]),
        lanes(|i| m1[i] - m2[i] - m3[i]),
    ]
}

/// `[f(0), …, f(L−1)]` (one vector operation once compiled).
#[inline(always)]
fn lanes<const L: usize>(f: impl Fn(usize) -> f32) -> [f32; L] {
    std::array::from_fn(f)
}

/// A convolution's kernel transformed and packed for the 16 GEMMs: `U_e` (`C_in × C_out`) for
/// `e = 4·i + j`, each in [`gemm::pack`]'s panels, from a 64-byte boundary.
#[derive(Debug)]
pub(crate) struct Weights {
    u: Vec<f32>,
    u0: usize,
    /// Floats of one packed `U_e`.
    per: usize,
    pub cin: usize,
    pub cout: usize,
    /// `C_out` zeros: the GEMMs' bias (the conv's own bias is added after the output transform).
    zeros: Vec<f32>,
    /// `C_in` zeros: the input under a tile's pixels that lie in the padding.
    pad: Vec<f32>,
}

/// Whether a convolution runs by [`Weights`]: a 3x3 kernel, stride 1, padding 1, one group, at
/// least 48 input channels (over fewer the 16 GEMMs are too shallow to win: 32 channels measured
/// no faster), unless `YOLO9_CPU_WINOGRAD=0`.
pub(crate) fn applies(k: usize, stride: usize, pad: usize, groups: usize, cin: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| {
        crate::switches::value("YOLO9_CPU_WINOGRAD").is_none_or(|v| v.trim() != "0")
    });
    on && k == 3 && stride == 1 && pad == 1 && groups == 1 && cin >= 48
}

impl Weights {
    /// From a folded kernel `(C_out, C_in, 3, 3)`, row-major in `w`.
    pub fn new(w: &[f32], cout: usize, cin: usize) -> Self {
        assert_eq!(
            w.len(),
            cout * cin * 9,
            "winograd: kernel of {cout}x{cin}x3x3"
        );
        // U = G g Gᵀ per (co, ci), in f64: rows of G are g0, (g0+g1+g2)/2, (g0−g1+g2)/2, g2.
        let g_rows = |g: [f64; 3]| {
            [
                g[0],
                (g[0] + g[1] + g[2]) / 2.0,
                (g[0] - g[1] + g[2]) / 2.0,
                g[2],
            ]
        };
        let mut u = vec![[0f32; 16]; cout * cin];
        for (o, k) in w.chunks_exact(9).enumerate() {
            let k: [f64; 9] = std::array::from_fn(|i| k[i] as f64);
            let cols: [[f64; 4]; 3] = std::array::from_fn(|x| g_rows([k[x], k[3 + x], k[6 + x]]));
            for i in 0..4 {
                let row = g_rows([cols[0][i], cols[1][i], cols[2][i]]);
                for j in 0..4 {
                    u[o][4 * i + j] = row[j] as f32;
                }
            }
        }
        let per = gemm::packed_len(cin, cout);
        let mut buf = vec![0f32; 16 * per + 16];
        let u0 = buf.as_ptr().align_offset(64).min(16);
        for e in 0..16 {
            let dst = &mut buf[u0 + e * per..u0 + (e + 1) * per];
            gemm::pack(cin, cout, dst, |ci, co| u[co * cin + ci][e]);
        }
        Self {
            u: buf,
            u0,
            per,
            cin,
            cout,
            zeros: vec![0.0; cout],
            pad: vec![0.0; cin],
        }
    }

    /// Tiles per task: the block's 16 `V_e` and 16 `M_e` stay near 1 MiB (about L2), a multiple
    /// of the micro-kernel's rows, between 12 and 192 (measured a little ahead of half of that,
    /// `conv_rate`, this 2-core AMD).
    pub fn block(&self) -> usize {
        let t = 262_144 / (16 * (self.cin + self.cout));
        (t / gemm::MR * gemm::MR).clamp(gemm::MR, 192)
    }

    /// Floats of scratch one task needs for blocks of `tiles` tiles: the 16 `V_e` and `M_e`, and
    /// one output pixel for the results of a tile's pixels outside the map (dropped).
    pub fn scratch(&self, tiles: usize) -> usize {
        16 * tiles * (self.cin + self.cout) + self.cout
    }
}

/// One image's map: input `h × w` pixels at `x` (pixel stride `ldx`), output the same size at
/// `y` (`ldy`), with an optional residual (`res`, its pixel stride) added last.
#[derive(Clone, Copy)]
pub(crate) struct Map {
    pub x: *const f32,
    pub ldx: usize,
    pub y: *mut f32,
    pub ldy: usize,
    pub res: Option<(*const f32, usize)>,
    pub h: usize,
    pub w: usize,
}

impl Map {
    /// 2×2 tiles of the output (the last row or column of tiles half outside when odd).
    pub fn tiles(&self) -> usize {
        self.h.div_ceil(2) * self.w.div_ceil(2)
    }
}

/// Tiles `t0..t0 + n` (row-major over the map) of a convolution by `wt`: `y = act(conv(x) +
/// bias) (+ res)`. `scratch` holds [`Weights::scratch`]`(n)` floats.
///
/// SAFETY: the map's pointers cover `h × w` pixels of `C_in` (input) and `C_out` (output,
/// residual) floats at their strides; this call alone writes these tiles' output pixels.
pub(crate) unsafe fn tiles(
    map: Map,
    wt: &Weights,
    bias: &[f32],
    act: bool,
    t0: usize,
    n: usize,
    scratch: &mut [f32],
) {
    let (cin, cout) = (wt.cin, wt.cout);
    assert!(scratch.len() >= wt.scratch(n) && bias.len() >= cout);
    let (v, rest) = scratch.split_at_mut(16 * n * cin);
    let (m, spare) = rest.split_at_mut(16 * n * cout);
    let tw = map.w.div_ceil(2);
    // V_e, row t: the transformed input of tile t0 + t.
    for t in 0..n {
        let (ty, tx) = ((t0 + t) / tw, (t0 + t) % tw);
        let mut d = [wt.pad.as_ptr(); 16];
        for i in 0..4 {
            for j in 0..4 {
                let (iy, ix) = ((2 * ty + i) as isize - 1, (2 * tx + j) as isize - 1);
                if iy >= 0 && ix >= 0 && (iy as usize) < map.h && (ix as usize) < map.w {
                    d[4 * i + j] = map.x.add((iy as usize * map.w + ix as usize) * map.ldx);
                }
            }
        }
        transform_in(&d, cin, v.as_mut_ptr().add(t * cin), n * cin);
    }
    for e in 0..16 {
        let epi = gemm::Epilogue {
            bias: &wt.zeros,
            act: false,
            res: None,
        };
        let (a, c) = (
            v.as_ptr().add(e * n * cin),
            m.as_mut_ptr().add(e * n * cout),
        );
        let b = wt.u.as_ptr().add(wt.u0 + e * wt.per);
        gemm::gemm(n, cout, cin, a, cin, b, c, cout, epi);
    }
    // Y = Aᵀ M A per tile into its pixels inside the map (a pixel outside goes to `spare`), then
    // the epilogue on each of them.
    for t in 0..n {
        let (ty, tx) = ((t0 + t) / tw, (t0 + t) % tw);
        let mut dst = [std::ptr::null_mut(); 4];
        let mut inside = [false; 4];
        for (q, d) in dst.iter_mut().enumerate() {
            let (oy, ox) = (2 * ty + q / 2, 2 * tx + q % 2);
            inside[q] = oy < map.h && ox < map.w;
            *d = if inside[q] {
                map.y.add((oy * map.w + ox) * map.ldy)
            } else {
                spare.as_mut_ptr()
            };
        }
        transform_out(m.as_ptr().add(t * cout), n * cout, cout, &dst);
        for q in (0..4).filter(|&q| inside[q]) {
            let p = (2 * ty + q / 2) * map.w + 2 * tx + q % 2;
            let row = std::slice::from_raw_parts_mut(dst[q], cout);
            let res = map
                .res
                .map(|(r, ld)| std::slice::from_raw_parts(r.add(p * ld), cout));
            math::epilogue(row, bias, act, res);
        }
    }
}

math::dispatch! {
    /// The 16 rows `V_e = (Bᵀ d B)_e` of one tile (row `e` at `v + e·stride`) from its 16 input
    /// pixels `d[4·i + j]` (`c` channels each), 8 channels at a time, then one at a time.
    ///
    /// # Safety
    /// Each `d` covers `c` floats; `v` covers 16 rows of `c` at `stride`.
    unsafe fn transform_in(d: &[*const f32; 16], c: usize, v: *mut f32, stride: usize) {
        let mut k = 0;
        while k + 8 <= c {
            transform_in_at::<8>(d, k, v, stride);
            k += 8;
        }
        while k < c {
            transform_in_at::<1>(d, k, v, stride);
            k += 1;
        }
    }
}

#[inline(always)]
unsafe fn transform_in_at<const L: usize>(
    d: &[*const f32; 16],
    k: usize,
    v: *mut f32,
    stride: usize,
) {
    let ld = |p: *const f32| (p.add(k) as *const [f32; L]).read_unaligned();
    // Bᵀ along the rows of the tile (i), column by column (j).
    let mut t = [[[0f32; L]; 4]; 4];
    for j in 0..4 {
        let col = bt([ld(d[j]), ld(d[4 + j]), ld(d[8 + j]), ld(d[12 + j])]);
        for i in 0..4 {
            t[i][j] = col[i];
        }
    }
    // B along the columns (j), row by row.
    for (i, row) in t.into_iter().enumerate() {
        for (j, val) in bt(row).into_iter().enumerate() {
            (v.add((4 * i + j) * stride + k) as *mut [f32; L]).write_unaligned(val);
        }
    }
}

math::dispatch! {
    /// The 4 output pixels of a tile, `Aᵀ M A` over `c` channels, into `dst[2·dy + dx]`, from
    /// the tile's 16 product rows (row `e` at `m + e·stride`), 8 channels at a time, then one at
    /// a time.
    ///
    /// # Safety
    /// `m` covers 16 rows of `c` at `stride`, each `dst` `c` floats.
    unsafe fn transform_out(m: *const f32, stride: usize, c: usize, dst: &[*mut f32; 4]) {
        let mut k = 0;
        while k + 8 <= c {
            transform_out_at::<8>(m, stride, k, dst);
            k += 8;
        }
        while k < c {
            transform_out_at::<1>(m, stride, k, dst);
            k += 1;
        }
    }
}

#[inline(always)]
unsafe fn transform_out_at<const L: usize>(m: *const f32, s: usize, k: usize, dst: &[*mut f32; 4]) {
    let ld = |e: usize| (m.add(e * s + k) as *const [f32; L]).read_unaligned();
    // Aᵀ along the rows (i) of each column j, then A along the columns of each of the 2 rows.
    let cols: [[[f32; L]; 2]; 4] =
        std::array::from_fn(|j| at([ld(j), ld(4 + j), ld(8 + j), ld(12 + j)]));
    for dy in 0..2 {
        let out = at([cols[0][dy], cols[1][dy], cols[2][dy], cols[3][dy]]);
        for dx in 0..2 {
            (dst[2 * dy + dx].add(k) as *mut [f32; L]).write_unaligned(out[dx]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the direct convolution in f64, on a 7×9 map (odd: tiles half outside) of 13
    /// input channels (a chunk of 8 and 5 single ones) and 21 output channels, with bias, SiLU
    /// and a residual, input and output slices of wider storages; tiles split in two calls.
    #[test]
    fn equals_the_direct_convolution() {
        let (h, w, cin, cout) = (7usize, 9usize, 13usize, 21usize);
        let (ldx, ldy, ldr) = (cin + 3, cout + 2, cout + 1);
        let val = |i: usize, m: usize| ((i * 7919) % m) as f32 / m as f32 - 0.5;
        let x: Vec<f32> = (0..h * w * ldx).map(|i| val(i, 101)).collect();
        let k: Vec<f32> = (0..cout * cin * 9).map(|i| val(i, 89) * 0.3).collect();
        let bias: Vec<f32> = (0..cout).map(|i| val(i, 17)).collect();
        let r: Vec<f32> = (0..h * w * ldr).map(|i| val(i, 13)).collect();
        let mut y = vec![9f32; h * w * ldy];
        let wt = Weights::new(&k, cout, cin);
        let map = Map {
            x: x.as_ptr(),
            ldx,
            y: y.as_mut_ptr(),
            ldy,
            res: Some((r.as_ptr(), ldr)),
            h,
            w,
        };
        let n = map.tiles();
        let first = n / 2 + 1;
        let mut scratch = vec![0f32; wt.scratch(n)];
        unsafe {
            tiles(map, &wt, &bias, true, 0, first, &mut scratch);
            tiles(map, &wt, &bias, true, first, n - first, &mut scratch);
        }
        let mut worst = 0f64;
        for oy in 0..h {
            for ox in 0..w {
                for co in 0..cout {
                    let mut s = bias[co] as f64;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (oy as isize + ky - 1, ox as isize + kx - 1);
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            for ci in 0..cin {
                                let xv = x[(iy as usize * w + ix as usize) * ldx + ci] as f64;
                                let kv = k[((co * cin + ci) * 3 + ky as usize) * 3 + kx as usize];
                                s += xv * kv as f64;
                            }
                        }
                    }
                    let want = s / (1.0 + (-s).exp()) + r[(oy * w + ox) * ldr + co] as f64;
                    let got = y[(oy * w + ox) * ldy + co] as f64;
                    worst = worst.max((got - want).abs());
                }
                for pad in cout..ldy {
                    assert_eq!(
                        y[(oy * w + ox) * ldy + pad],
                        9.0,
                        "a column past C_out written"
                    );
                }
            }
        }
        assert!(worst < 2e-6, "largest difference {worst:e}");
    }

    /// Only 3x3, stride 1, padding 1, ungrouped convolutions over 8 or more channels.
    #[test]
    fn applies_to_3x3_stride_1_only() {
        assert!(applies(3, 1, 1, 1, 64) && applies(3, 1, 1, 1, 48));
        assert!(!applies(3, 2, 1, 1, 64));
        assert!(!applies(1, 1, 0, 1, 64));
        assert!(!applies(3, 1, 1, 4, 64));
        assert!(!applies(3, 1, 1, 1, 32));
    }
}
