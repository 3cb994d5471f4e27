//! 3x3 stride-1 convolutions by Winograd's minimal filtering F(m×m, 3×3) (Lavin & Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016, sections 4 and 5), with `m` = 4 (the
//! default) or 2: each `m×m` block of output pixels (a tile) is computed from the `a×a` input
//! pixels under it (`a = m + 2`) as `Y = Aᵀ [Σ_c U_c ⊙ V_c] A`, with `V = Bᵀ d B` the input tile
//! and `U = G g Gᵀ` the kernel, both transformed. The sum over input channels is `a²` GEMMs, one
//! per element of the `a×a` transform (`M_e = V_e · U_e`, a `tiles × C_in` by `C_in × C_out`
//! product on [`gemm`]'s micro-kernels): per output pixel and channel pair, F(4×4, 3×3) does
//! 36/16 = 2.25 multiplications and F(2×2, 3×3) 16/4 = 4, against the direct convolution's 9.
//!
//! F(2×2, 3×3)'s transforms have coefficients 0, ±1 and ±½; F(4×4, 3×3)'s interpolate at 0, ±1,
//! ±2 and ∞ (`B` up to 5, `A` up to 8, `G` down to 1/24), so its results carry a few more
//! roundings (both tested against the direct convolution: `tests` below). A pixel's result does
//! not depend on how the tiles are split over threads.

use super::gemm;
use super::math;

/// One of the two tile sizes: the 1-D transforms `Bᵀ` (input, `A` values in and out), `Aᵀ`
/// (output, `A` products to `M` pixels) and `G` (kernel, 3 taps to `A` values).
trait Rule<const A: usize, const M: usize> {
    fn bt<const L: usize>(x: [[f32; L]; A]) -> [[f32; L]; A];
    fn at<const L: usize>(m: [[f32; L]; A]) -> [[f32; L]; M];
    fn g(g: [f64; 3]) -> [f64; A];
}

/// F(2×2, 3×3): 4×4 input tiles, 2×2 output tiles.
struct F2;

impl Rule<4, 2> for F2 {
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

    #[inline(always)]
    fn at<const L: usize>(m: [[f32; L]; 4]) -> [[f32; L]; 2] {
        let [m0, m1, m2, m3] = m;
        [
            lanes(|i| m0[i] + m1[i] + m2[i]),
            lanes(|i| m1[i] - m2[i] - m3[i]),
        ]
    }

    fn g(g: [f64; 3]) -> [f64; 4] {
        [
            g[0],
            (g[0] + g[1] + g[2]) / 2.0,
            (g[0] - g[1] + g[2]) / 2.0,
            g[2],
        ]
    }
}

/// F(4×4, 3×3): 6×6 input tiles, 4×4 output tiles (interpolation points 0, ±1, ±2, ∞).
struct F4;

impl Rule<6, 4> for F4 {
    /// Rows of `Bᵀ`: (4, 0, −5, 0, 1, 0), (0, −4, −4, 1, 1, 0), (0, 4, −4, −1, 1, 0),
    /// (0, −2, −1, 2, 1, 0), (0, 2, −1, −2, 1, 0), (0, 4, 0, −5, 0, 1).
    #[inline(always)]
    fn bt<const L: usize>(x: [[f32; L]; 6]) -> [[f32; L]; 6] {
        let [d0, d1, d2, d3, d4, d5] = x;
        let p: [f32; L] = lanes(|i| d4[i] - 4.0 * d2[i]);
        let q: [f32; L] = lanes(|i| d3[i] - 4.0 * d1[i]);
        let r: [f32; L] = lanes(|i| d4[i] - d2[i]);
        let s: [f32; L] = lanes(|i| 2.0 * (d3[i] - d1[i]));
        [
            lanes(|i| 4.0 * d0[i] - 5.0 * d2[i] + d4[i]),
            lanes(|i| p[i] + q[i]),
            lanes(|i| p[i] - q[i]),
            lanes(|i| r[i] + s[i]),
            lanes(|i| r[i] - s[i]),
            lanes(|i| 4.0 * d1[i] - 5.0 * d3[i] + d5[i]),
        ]
    }

    /// Rows of `Aᵀ`: (1, 1, 1, 1, 1, 0), (0, 1, −1, 2, −2, 0), (0, 1, 1, 4, 4, 0),
    /// (0, 1, −1, 8, −8, 1).
    #[inline(always)]
    fn at<const L: usize>(m: [[f32; L]; 6]) -> [[f32; L]; 4] {
        let [m0, m1, m2, m3, m4, m5] = m;
        let s12: [f32; L] = lanes(|i| m1[i] + m2[i]);
        let d12: [f32; L] = lanes(|i| m1[i] - m2[i]);
        let s34: [f32; L] = lanes(|i| m3[i] + m4[i]);
        let d34: [f32; L] = lanes(|i| m3[i] - m4[i]);
        [
            lanes(|i| m0[i] + s12[i] + s34[i]),
            lanes(|i| d12[i] + 2.0 * d34[i]),
            lanes(|i| s12[i] + 4.0 * s34[i]),
            lanes(|i| d12[i] + 8.0 * d34[i] + m5[i]),
        ]
    }

    /// Rows of `G`: (¼, 0, 0), (−⅙, −⅙, −⅙), (−⅙, ⅙, −⅙), (1/24, 1/12, ⅙), (1/24, −1/12, ⅙),
    /// (0, 0, 1).
    fn g(g: [f64; 3]) -> [f64; 6] {
        [
            g[0] / 4.0,
            -(g[0] + g[1] + g[2]) / 6.0,
            -(g[0] - g[1] + g[2]) / 6.0,
            g[0] / 24.0 + g[1] / 12.0 + g[2] / 6.0,
            g[0] / 24.0 - g[1] / 12.0 + g[2] / 6.0,
            g[2],
        ]
    }
}

/// `[f(0), …, f(L−1)]` (one vector operation once compiled).
#[inline(always)]
fn lanes<const L: usize>(f: impl Fn(usize) -> f32) -> [f32; L] {
    std::array::from_fn(f)
}

/// The largest input tile (F(4×4, 3×3)'s 6×6).
const MAX_A: usize = 6;

/// A convolution's kernel transformed and packed for the `a²` GEMMs: `U_e` (`C_in × C_out`) for
/// `e = a·i + j`, each in [`gemm::pack`]'s panels, from a 64-byte boundary.
#[derive(Debug)]
pub(crate) struct Weights {
    u: Vec<f32>,
    u0: usize,
    /// Floats of one packed `U_e`.
    per: usize,
    /// Output pixels along a tile's side: 2 or 4.
    pub m: usize,
    pub cin: usize,
    pub cout: usize,
    /// `C_out` zeros: the GEMMs' bias (the conv's own bias is added after the output transform).
    zeros: Vec<f32>,
    /// `C_in` zeros: the input under a tile's pixels that lie in the padding.
    pad: Vec<f32>,
}

/// Whether a convolution runs by [`Weights`]: a 3x3 kernel, stride 1, padding 1, one group, at
/// least 32 input channels with F(4×4, 3×3), 48 with F(2×2, 3×3) (over fewer the GEMMs are too
/// shallow to win; yolov9-s's 32-channel layers at 480x640, one thread, 2-core AMD EPYC: 40.9 ms
/// direct against 30.2 by F(4×4) with the AVX2 kernel, 31.5 against 19.7 with AVX-512, while
/// F(2×2) measured no faster than direct), unless `YOLO9_CPU_WINOGRAD=0`.
pub(crate) fn applies(k: usize, stride: usize, pad: usize, groups: usize, cin: usize) -> bool {
    let min_cin = if tile() == 4 { 32 } else { 48 };
    tile() != 0 && k == 3 && stride == 1 && pad == 1 && groups == 1 && cin >= min_cin
}

/// The output tile's side `m` of F(m×m, 3×3) that `YOLO9_CPU_WINOGRAD` asks for: 4 by default
/// (or `4`), 2 with `2`, 0 (direct convolution) with `0`.
pub(crate) fn tile() -> usize {
    static M: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *M.get_or_init(|| {
        match crate::switches::value("YOLO9_CPU_WINOGRAD")
            .as_deref()
            .map(str::trim)
        {
            Some("0") => 0,
            Some("2") => 2,
            _ => 4,
        }
    })
}

impl Weights {
    /// From a folded kernel `(C_out, C_in, 3, 3)`, row-major in `w`, for F(m×m, 3×3), `m` 2 or 4.
    pub fn new(w: &[f32], cout: usize, cin: usize, m: usize) -> Self {
        assert_eq!(
            w.len(),
            cout * cin * 9,
            "winograd: kernel of {cout}x{cin}x3x3"
        );
        assert!(m == 2 || m == 4, "winograd: F({m}x{m}, 3x3)");
        let (a, ne) = (m + 2, (m + 2) * (m + 2));
        // U = G g Gᵀ per (co, ci), in f64.
        let g_rows = |g: [f64; 3]| -> [f64; MAX_A] {
            let mut r = [0.0; MAX_A];
            if m == 2 {
                r[..4].copy_from_slice(&F2::g(g));
            } else {
                r.copy_from_slice(&F4::g(g));
            }
            r
        };
        let per = gemm::packed_len(cin, cout);
        let mut buf = vec![0f32; ne * per + 16];
        let u0 = buf.as_ptr().align_offset(64).min(16);
        // One panel of `NR` output channels at a time: its pairs' `U` (`tmp`, one record of the
        // `a²` elements per (co, ci)), then packed into panel `p` of each `U_e`. With a buffer of
        // all the pairs (as large as the result) yolov9-s's transforms took 0.16 s instead of
        // 0.13 (F(2x2): 0.055), on a 2-core AMD EPYC VM.
        let mut tmp = vec![0f32; ne * gemm::NR * cin];
        let plane = gemm::NR * cin;
        for p in 0..cout.div_ceil(gemm::NR) {
            let cols = (cout - p * gemm::NR).min(gemm::NR);
            for c in 0..cols {
                for ci in 0..cin {
                    let o = (p * gemm::NR + c) * cin + ci;
                    let k: [f64; 9] = std::array::from_fn(|i| w[9 * o + i] as f64);
                    let g: [[f64; MAX_A]; 3] =
                        std::array::from_fn(|x| g_rows([k[x], k[3 + x], k[6 + x]]));
                    for i in 0..a {
                        let row = g_rows([g[0][i], g[1][i], g[2][i]]);
                        for j in 0..a {
                            tmp[(c * cin + ci) * ne + a * i + j] = row[j] as f32;
                        }
                    }
                }
            }
            for e in 0..ne {
                let at = u0 + e * per + p * plane;
                let src = &tmp[e..];
                gemm::pack(cin, cols, &mut buf[at..at + plane], |ci, c| {
                    src[(c * cin + ci) * ne]
                });
            }
        }
        Self {
            u: buf,
            u0,
            per,
            m,
            cin,
            cout,
            zeros: vec![0.0; cout],
            pad: vec![0.0; cin],
        }
    }

    /// Elements of the transform: `a²`.
    fn elems(&self) -> usize {
        (self.m + 2) * (self.m + 2)
    }

    /// Tiles per task: the block's `V_e` and `M_e` stay near 1 MiB (about L2), a multiple of the
    /// micro-kernel's rows, between 12 and 192 (measured a little ahead of half of that,
    /// `conv_rate`, this 2-core AMD).
    pub fn block(&self) -> usize {
        let t = 262_144 / (self.elems() * (self.cin + self.cout));
        (t / gemm::MR * gemm::MR).clamp(gemm::MR, 192)
    }

    /// Floats of scratch one task needs for blocks of `tiles` tiles: the `a²` `V_e` and `M_e`
    /// (each [`spread`]), and one output pixel for the results of a tile's pixels outside the map
    /// (dropped).
    pub fn scratch(&self, tiles: usize) -> usize {
        self.elems() * (spread(tiles * self.cin) + spread(tiles * self.cout)) + self.cout
    }

    /// `m×m` tiles of an `h × w` output (the last row or column of tiles partly outside when
    /// `m` does not divide it).
    pub fn tiles_of(&self, h: usize, w: usize) -> usize {
        h.div_ceil(self.m) * w.div_ceil(self.m)
    }
}

/// The floats from one `V_e` (or `M_e`) to the next for `len` floats of each: `len` rounded up
/// to a whole number of 64-byte lines, and to an odd number of them. A tile's transform writes
/// (and reads) one vector in each of the `a²` matrices; at a stride of a multiple of 4 KiB all of
/// them fall in one set of the L1 cache, whose 8 or 12 ways hold fewer than F(4×4)'s 36 (this
/// made its input transform 6 times slower than F(2×2)'s); an odd number of lines puts
/// consecutive matrices in different sets.
fn spread(len: usize) -> usize {
    let lines = len.div_ceil(16);
    16 * (lines | 1)
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
    let (cin, cout, m) = (wt.cin, wt.cout, wt.m);
    let (a, ne) = (m + 2, wt.elems());
    assert!(scratch.len() >= wt.scratch(n) && bias.len() >= cout);
    let (sv, sm) = (spread(n * cin), spread(n * cout));
    let (v, rest) = scratch.split_at_mut(ne * sv);
    let (mm, spare) = rest.split_at_mut(ne * sm);
    let tw = map.w.div_ceil(m);
    // V_e, row t: the transformed input of tile t0 + t.
    for t in 0..n {
        let (ty, tx) = ((t0 + t) / tw, (t0 + t) % tw);
        let mut d = [wt.pad.as_ptr(); MAX_A * MAX_A];
        for i in 0..a {
            for j in 0..a {
                let (iy, ix) = ((m * ty + i) as isize - 1, (m * tx + j) as isize - 1);
                if iy >= 0 && ix >= 0 && (iy as usize) < map.h && (ix as usize) < map.w {
                    d[a * i + j] = map.x.add((iy as usize * map.w + ix as usize) * map.ldx);
                }
            }
        }
        transform_in(&d, m, cin, v.as_mut_ptr().add(t * cin), sv);
    }
    for e in 0..ne {
        let epi = gemm::Epilogue {
            bias: &wt.zeros,
            act: false,
            res: None,
        };
        let (va, c) = (v.as_ptr().add(e * sv), mm.as_mut_ptr().add(e * sm));
        let b = wt.u.as_ptr().add(wt.u0 + e * wt.per);
        gemm::gemm(n, cout, cin, va, cin, b, c, cout, epi);
    }
    // Y = Aᵀ M A per tile into its pixels inside the map (a pixel outside goes to `spare`), then
    // the epilogue on each of them.
    for t in 0..n {
        let (ty, tx) = ((t0 + t) / tw, (t0 + t) % tw);
        let mut dst = [spare.as_mut_ptr(); 16];
        let mut inside = [false; 16];
        for q in 0..m * m {
            let (oy, ox) = (m * ty + q / m, m * tx + q % m);
            inside[q] = oy < map.h && ox < map.w;
            if inside[q] {
                dst[q] = map.y.add((oy * map.w + ox) * map.ldy);
            }
        }
        transform_out(mm.as_ptr().add(t * cout), sm, m, cout, &dst);
        for q in (0..m * m).filter(|&q| inside[q]) {
            let p = (m * ty + q / m) * map.w + m * tx + q % m;
            let row = std::slice::from_raw_parts_mut(dst[q], cout);
            let res = map
                .res
                .map(|(r, ld)| std::slice::from_raw_parts(r.add(p * ld), cout));
            math::epilogue(row, bias, act, res);
        }
    }
}

math::dispatch! {
    /// The `a²` rows `V_e = (Bᵀ d B)_e` of one tile of F(m×m, 3×3) (row `e` at `v + e·stride`)
    /// from its `a²` input pixels `d[a·i + j]` (`c` channels each), 8 channels at a time, then
    /// one at a time.
    ///
    /// # Safety
    /// Each of the first `a²` `d` covers `c` floats; `v` covers `a²` rows of `c` at `stride`.
    unsafe fn transform_in(d: &[*const f32; MAX_A * MAX_A], m: usize, c: usize, v: *mut f32, stride: usize) {
        if m == 2 {
            transform_in_all::<4, 2, F2>(d, c, v, stride)
        } else {
            transform_in_all::<6, 4, F4>(d, c, v, stride)
        }
    }
}

#[inline(always)]
unsafe fn transform_in_all<const A: usize, const M: usize, R: Rule<A, M>>(
    d: &[*const f32; MAX_A * MAX_A],
    c: usize,
    v: *mut f32,
    stride: usize,
) {
    let mut k = 0;
    while k + 8 <= c {
        transform_in_at::<8, A, M, R>(d, k, v, stride);
        k += 8;
    }
    while k < c {
        transform_in_at::<1, A, M, R>(d, k, v, stride);
        k += 1;
    }
}

#[inline(always)]
unsafe fn transform_in_at<const L: usize, const A: usize, const M: usize, R: Rule<A, M>>(
    d: &[*const f32; MAX_A * MAX_A],
    k: usize,
    v: *mut f32,
    stride: usize,
) {
    let ld = |p: *const f32| (p.add(k) as *const [f32; L]).read_unaligned();
    // Bᵀ along the rows of the tile (i), column by column (j), into `t` (on the stack, through
    // a pointer: as one value of 36 vectors F(4×4)'s was compiled to slow code).
    let mut t = std::mem::MaybeUninit::<[[[f32; L]; A]; A]>::uninit();
    let tp = t.as_mut_ptr() as *mut [f32; L];
    for j in 0..A {
        let col = R::bt::<L>(std::array::from_fn(|i| ld(d[A * i + j])));
        for (i, val) in col.into_iter().enumerate() {
            tp.add(A * i + j).write(val);
        }
    }
    // B along the columns (j), row by row.
    for i in 0..A {
        let row = R::bt::<L>(std::array::from_fn(|j| tp.add(A * i + j).read()));
        for (j, val) in row.into_iter().enumerate() {
            (v.add((A * i + j) * stride + k) as *mut [f32; L]).write_unaligned(val);
        }
    }
}

math::dispatch! {
    /// The `m²` output pixels of a tile of F(m×m, 3×3), `Aᵀ M A` over `c` channels, into
    /// `dst[m·dy + dx]`, from the tile's `a²` product rows (row `e` at `mm + e·stride`), 8
    /// channels at a time, then one at a time.
    ///
    /// # Safety
    /// `mm` covers `a²` rows of `c` at `stride`, each of the first `m²` `dst` `c` floats.
    unsafe fn transform_out(mm: *const f32, stride: usize, m: usize, c: usize, dst: &[*mut f32; 16]) {
        if m == 2 {
            transform_out_all::<4, 2, F2>(mm, stride, c, dst)
        } else {
            transform_out_all::<6, 4, F4>(mm, stride, c, dst)
        }
    }
}

#[inline(always)]
unsafe fn transform_out_all<const A: usize, const M: usize, R: Rule<A, M>>(
    mm: *const f32,
    stride: usize,
    c: usize,
    dst: &[*mut f32; 16],
) {
    let mut k = 0;
    while k + 8 <= c {
        transform_out_at::<8, A, M, R>(mm, stride, k, dst);
        k += 8;
    }
    while k < c {
        transform_out_at::<1, A, M, R>(mm, stride, k, dst);
        k += 1;
    }
}

#[inline(always)]
unsafe fn transform_out_at<const L: usize, const A: usize, const M: usize, R: Rule<A, M>>(
    mm: *const f32,
    s: usize,
    k: usize,
    dst: &[*mut f32; 16],
) {
    let ld = |e: usize| (mm.add(e * s + k) as *const [f32; L]).read_unaligned();
    // Aᵀ along the rows (i) of each column j into `t` (through a pointer, as in
    // `transform_in_at`), then A along the columns of each of the M rows.
    let mut t = std::mem::MaybeUninit::<[[[f32; L]; A]; M]>::uninit();
    let tp = t.as_mut_ptr() as *mut [f32; L];
    for j in 0..A {
        let col = R::at::<L>(std::array::from_fn(|i| ld(A * i + j)));
        for (dy, val) in col.into_iter().enumerate() {
            tp.add(A * dy + j).write(val);
        }
    }
    for dy in 0..M {
        let out = R::at::<L>(std::array::from_fn(|j| tp.add(A * dy + j).read()));
        for (dx, val) in out.into_iter().enumerate() {
            (dst[M * dy + dx].add(k) as *mut [f32; L]).write_unaligned(val);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the direct convolution in f64, for both tile sizes, on a 7×9 map (tiles partly
    /// outside for both) of 13 input channels (a chunk of 8 and 5 single ones) and 37 output
    /// channels (a packed panel of 32 and a partial one), with bias, SiLU and a residual, input and output slices of wider storages; tiles
    /// split in two calls.
    #[test]
    fn equals_the_direct_convolution() {
        let (h, w, cin, cout) = (7usize, 9usize, 13usize, 37usize);
        let (ldx, ldy, ldr) = (cin + 3, cout + 2, cout + 1);
        let val = |i: usize, m: usize| ((i * 7919) % m) as f32 / m as f32 - 0.5;
        let x: Vec<f32> = (0..h * w * ldx).map(|i| val(i, 101)).collect();
        let k: Vec<f32> = (0..cout * cin * 9).map(|i| val(i, 89) * 0.3).collect();
        let bias: Vec<f32> = (0..cout).map(|i| val(i, 17)).collect();
        let r: Vec<f32> = (0..h * w * ldr).map(|i| val(i, 13)).collect();
        // The direct convolution in f64, then SiLU and the residual.
        let mut want = vec![0f64; h * w * cout];
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
                    want[(oy * w + ox) * cout + co] =
                        s / (1.0 + (-s).exp()) + r[(oy * w + ox) * ldr + co] as f64;
                }
            }
        }
        // Measured: 2.4e-7 for F(2×2), 7.3e-7 for F(4×4) (larger coefficients, up to 8 in `A`
        // and 5 in `B`, round larger intermediate values); a wrong coefficient is off by ~0.1.
        for m in [2usize, 4] {
            let mut y = vec![9f32; h * w * ldy];
            let wt = Weights::new(&k, cout, cin, m);
            let map = Map {
                x: x.as_ptr(),
                ldx,
                y: y.as_mut_ptr(),
                ldy,
                res: Some((r.as_ptr(), ldr)),
                h,
                w,
            };
            let n = wt.tiles_of(h, w);
            assert_eq!(n, h.div_ceil(m) * w.div_ceil(m));
            let first = n / 2 + 1;
            let mut scratch = vec![0f32; wt.scratch(n)];
            unsafe {
                tiles(map, &wt, &bias, true, 0, first, &mut scratch);
                tiles(map, &wt, &bias, true, first, n - first, &mut scratch);
            }
            let mut worst = 0f64;
            for p in 0..h * w {
                for co in 0..cout {
                    let got = y[p * ldy + co] as f64;
                    worst = worst.max((got - want[p * cout + co]).abs());
                }
                for pad in cout..ldy {
                    assert_eq!(
                        y[p * ldy + pad],
                        9.0,
                        "F({m}x{m}): a column past C_out written"
                    );
                }
            }
            println!("F({m}x{m}, 3x3): largest difference {worst:e}");
            assert!(worst < 2e-6, "F({m}x{m}): largest difference {worst:e}");
        }
    }

    /// Only 3x3, stride 1, padding 1, ungrouped convolutions over 32 or more channels (with
    /// F(4×4), the default).
    #[test]
    fn applies_to_3x3_stride_1_only() {
        assert_eq!(tile(), 4, "run without YOLO9_CPU_WINOGRAD");
        assert!(applies(3, 1, 1, 1, 64) && applies(3, 1, 1, 1, 48) && applies(3, 1, 1, 1, 32));
        assert!(!applies(3, 2, 1, 1, 64));
        assert!(!applies(1, 1, 0, 1, 64));
        assert!(!applies(3, 1, 1, 4, 64));
        assert!(!applies(3, 1, 1, 1, 16));
    }
}
