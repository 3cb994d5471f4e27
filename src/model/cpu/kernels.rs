//! The CPU engine's kernels on NHWC activations: the convolution (GEMM on tiles of output
//! pixels with the bias, SiLU and residual applied to each tile while it is in cache), pooling,
//! upsampling, additions, copies into concatenation slots, and the head decode. Every kernel
//! splits its work over the engine's thread pool.
//!
//! An activation is an [`Act`]: a base pointer and a row stride `ld` (floats between two
//! pixels), so a value that lives in a channel slice of a wider buffer (a concatenation's
//! storage) is read and written in place.

use super::gemm;
use super::int8;
use super::math;
use super::math::dispatch;
pub(crate) use super::view::{column_blocks, Act, Exec, Scratch, ALIGN_FLOATS};
use super::winograd;
use anyhow::{ensure, Result};
use candle_core::Tensor;

/// The `len` floats of `buf` from its first 64-byte aligned float (`buf` holds at least
/// `len + ALIGN_FLOATS - 1`). A vector load or store at a 64-byte multiple from there never
/// straddles two cache lines. Malloc aligns to 16 bytes only: at three of the four possible
/// offsets every such load or store straddles two lines (two cache accesses each), and which
/// offset a buffer got changed from one process to the next.
pub(crate) fn aligned(buf: &mut [f32], len: usize) -> &mut [f32] {
    let off = buf.as_ptr().align_offset(64).min(ALIGN_FLOATS);
    &mut buf[off..off + len]
}

/// A convolution's folded weights, repacked once for the GEMM: per group the
/// `(k·k·C_in/g) × (C_out/g)` matrix whose row `(ky·k + kx)·C_in/g + ci` holds the kernel taps
/// of input channel `ci` at `(ky, kx)` (the column order of the im2col rows), in the panels of
/// [`gemm::pack`]; and the bias.
#[derive(Debug)]
pub(crate) struct ConvWeights {
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub groups: usize,
    /// Input channels per group.
    pub cig: usize,
    /// Output channels per group.
    pub cog: usize,
    /// Output channels.
    pub co: usize,
    pub act: bool,
    /// Per group [`gemm::packed_len`]`(K, cog)` floats, K = k·k·cig, from float `w0` (the
    /// first 64-byte aligned one: every panel row then starts a cache line).
    pub w: Vec<f32>,
    pub w0: usize,
    pub bias: Vec<f32>,
    /// The kernel transformed for Winograd's F(m×m, 3×3), for the convolutions that run by it
    /// ([`winograd::applies`]).
    pub wino: Option<winograd::Weights>,
    /// The quantized kernel of a convolution that runs in INT8 ([`int8`]).
    pub q: Option<Box<int8::QConv>>,
    /// The convolution's place among the traced forward's convolutions (in trace order): the
    /// index of its calibrated range ([`crate::model::quant::Int8Calibration::convs`]).
    pub id: usize,
}

impl ConvWeights {
    /// Packs a folded kernel `(C_out, C_in/groups, k, k)` f32 and bias `(C_out,)` (zeros when
    /// absent); with `int8`, the calibrated range of the input, the kernel is also quantized and
    /// the convolution runs in INT8 ([`int8`]; ungrouped convolutions only). Errors: a
    /// non-square kernel, or shapes that disagree.
    pub fn pack(
        weight: &Tensor,
        bias: Option<&Tensor>,
        (stride, pad, groups): (usize, usize, usize),
        act: bool,
        int8: Option<(f32, f32)>,
    ) -> Result<Self> {
        let (co, cig, kh, kw) = weight.dims4()?;
        ensure!(
            kh == kw,
            "cpu engine: a {kh}x{kw} kernel (only square ones)"
        );
        ensure!(
            groups > 0 && co % groups == 0 && stride > 0,
            "cpu engine: {co} output channels in {groups} groups, stride {stride}"
        );
        let k = kh;
        let cog = co / groups;
        let src = weight
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let kk = k * k * cig;
        let per = gemm::packed_len(kk, cog);
        let mut w = vec![0f32; groups * per + ALIGN_FLOATS];
        let w0 = w.as_ptr().align_offset(64).min(ALIGN_FLOATS);
        let packed = aligned(&mut w, groups * per);
        for g in 0..groups {
            // Row (ky·k + kx)·cig + ci, column j of group g's matrix.
            gemm::pack(kk, cog, &mut packed[g * per..(g + 1) * per], |row, j| {
                let (tap, ci) = (row / cig, row % cig);
                let (ky, kx) = (tap / k, tap % k);
                src[(((g * cog + j) * cig + ci) * k + ky) * k + kx]
            });
        }
        let bias = match bias {
            Some(b) => {
                let b = b
                    .to_dtype(candle_core::DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                ensure!(
                    b.len() == co,
                    "cpu engine: bias of {} for {co} channels",
                    b.len()
                );
                b
            }
            None => vec![0.0; co],
        };
        let q = match int8 {
            Some(range) if groups == 1 => Some(Box::new(int8::QConv::new(
                &src,
                &bias,
                (co, cig, k),
                (stride, pad, act),
                range,
            ))),
            _ => None,
        };
        let wino = (q.is_none() && winograd::applies(k, stride, pad, groups, cig))
            .then(|| winograd::Weights::new(&src, co, cig, winograd::tile()));
        Ok(Self {
            k,
            stride,
            pad,
            groups,
            cig,
            cog,
            co,
            act,
            w,
            w0,
            bias,
            wino,
            q,
            id: 0,
        })
    }

    /// Input channels.
    pub fn ci(&self) -> usize {
        self.cig * self.groups
    }

    /// Output size for an input of `h × w`.
    pub fn out_hw(&self, h: usize, w: usize) -> (usize, usize) {
        let o = |n: usize| (n + 2 * self.pad).saturating_sub(self.k) / self.stride + 1;
        (o(h), o(w))
    }

    /// A 1×1, stride-1, unpadded conv: a plain GEMM on the NHWC rows (no im2col).
    fn pointwise(&self) -> bool {
        self.k == 1 && self.stride == 1 && self.pad == 0
    }

    /// Floats of scratch one task needs: a block of Winograd tiles' transforms
    /// ([`winograd::Weights::scratch`]); else 0 for a pointwise conv, or the im2col rows of a
    /// tile, then the outputs of a batch of [`BORDER_BATCH`] border pixels ([`implicit`]).
    pub fn scratch(&self) -> usize {
        if let Some(q) = &self.q {
            q.scratch()
        } else if let Some(wt) = &self.wino {
            wt.scratch(wt.block())
        } else if self.pointwise() {
            0
        } else {
            let kk = self.k * self.k * self.cig;
            tile_rows(kk) * kk + BORDER_BATCH * self.cog
        }
    }
}

/// Most threads a convolution runs the implicit GEMM ([`implicit`]) on; above, each task's run
/// of pixels is short and splits into many short rows, and im2col + one GEMM per task measured
/// faster at 8 and 16 threads (16-core Xeon, yolov9-s, `.dev/cpu16b.sh`, 2026-12-03). At 1 to 4
/// threads neither form won consistently on that shared host (3 alternating rounds: implicit
/// ahead at 640x640 on 4 threads, behind at 480x640), so this is a measured default, not a
/// settled one; `YOLO9_CPU_IMPLICIT_MAX_THREADS` overrides it (0: im2col everywhere).
const IMPLICIT_MAX_THREADS: usize = 4;

/// [`IMPLICIT_MAX_THREADS`], or `YOLO9_CPU_IMPLICIT_MAX_THREADS` (0: im2col everywhere).
fn implicit_max_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        crate::switches::value("YOLO9_CPU_IMPLICIT_MAX_THREADS")
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(IMPLICIT_MAX_THREADS)
    })
}

/// Border pixels (windows overlapping the padding) of an implicit convolution gathered into one
/// GEMM: one or two per output row, each alone would run the micro-kernel on one row of A.
const BORDER_BATCH: usize = 2 * gemm::MR;

/// Output pixels per task of a conv whose GEMM depth is `kk`: the tile's rows of A stay near
/// 512 KiB (in L2), a multiple of the micro-kernel's rows, between 24 and 480.
fn tile_rows(kk: usize) -> usize {
    ((131_072 / kk.max(1)) / gemm::MR * gemm::MR).clamp(2 * gemm::MR, 480)
}

/// `(min, max)` widened to the values of `x` (one thread: a calibration pass, not a hot path).
pub(crate) fn min_max(x: Act, (mut lo, mut hi): (f32, f32)) -> (f32, f32) {
    for p in 0..x.pixels() {
        // SAFETY: pixel p of `x`, read only.
        for &v in unsafe { x.px(p) }.iter() {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    (lo, hi)
}

/// `y = act(conv(x) + bias) (+ res)` (see [`ConvWeights`]); `y` is `x`'s output shape.
pub(crate) fn conv(ex: Exec, x: Act, y: Act, res: Option<Act>, cw: &ConvWeights, scratch: Scratch) {
    if let Some(q) = &cw.q {
        // SAFETY: the plan sized the buffer for this convolution's input (`Plan::qbuf_len`).
        return unsafe { int8::conv(ex, x, y, res, q, scratch) };
    }
    if let Some(wt) = &cw.wino {
        return conv_winograd(ex, x, y, res, cw, wt, scratch);
    }
    let kk = cw.k * cw.k * cw.cig;
    let pixels = y.pixels();
    let threads = ex.threads();
    // Rows per task: smaller than the tile when there are too few tiles for the threads.
    let mt = tile_rows(kk).min(pixels.div_ceil(2 * threads).next_multiple_of(gemm::MR));
    let tiles = pixels.div_ceil(mt);
    // Column blocks (whole panels) when the rows alone leave threads idle.
    let (nb, bw) = column_blocks(tiles, threads, cw.cog, gemm::NR);
    let tasks = tiles * nb;
    // The implicit convolution's taps: offset of tap (ky, kx) from the window's corner, and its
    // depth (made once per conv, not per task).
    let implicit_on =
        !cw.pointwise() && gemm::taps_supported() && threads <= implicit_max_threads();
    let taps: Vec<(isize, usize)> = match implicit_on {
        true => coalesce(
            (0..cw.k * cw.k).map(|t| ((((t / cw.k) * x.w + t % cw.k) * x.ld) as isize, cw.cig)),
        ),
        false => Vec::new(),
    };
    let run = |task: usize, thread: usize| {
        let (t, jb) = (task / nb, task % nb);
        let p0 = t * mt;
        let m = mt.min(pixels - p0);
        let j0 = jb * bw;
        let n = bw.min(cw.cog - j0);
        for g in 0..cw.groups {
            let per = gemm::packed_len(kk, cw.cog);
            // Group g's panels from the one holding column j0.
            let wg = cw.w[cw.w0 + g * per + j0 * kk..].as_ptr();
            let bias = &cw.bias[g * cw.cog + j0..g * cw.cog + j0 + n];
            // SAFETY: pointers stay within the activations and weights described by the plan;
            // this task alone writes output pixels p0..p0+m, channels g·cog + j0 .. + n.
            unsafe {
                let dst = y.ptr.add(p0 * y.ld + g * cw.cog + j0);
                let epi = gemm::Epilogue {
                    bias,
                    act: cw.act,
                    res: res.map(|a| (a.ptr.add(p0 * a.ld + g * cw.cog + j0) as *const f32, a.ld)),
                };
                if cw.pointwise() {
                    let lhs = x.ptr.add(p0 * x.ld + g * cw.cig);
                    gemm::gemm(m, n, kk, lhs, x.ld, wg, dst, y.ld, epi);
                } else if implicit_on {
                    let col = scratch.mine(thread);
                    implicit(x, y, res, cw, &taps, g, p0, m, (j0, n), wg, bias, col);
                } else {
                    let col = scratch.mine(thread);
                    im2col(x, y, cw, g, p0, m, col);
                    gemm::gemm(m, n, kk, col.as_ptr(), kk, wg, dst, y.ld, epi);
                }
            }
        }
    };
    ex.each_on(tasks, run);
}

/// [`conv`] by Winograd's F(m×m, 3×3): each image's m×m output tiles in blocks (tasks) of at
/// most [`winograd::Weights::block`], fewer when there are too few for the threads.
fn conv_winograd(
    ex: Exec,
    x: Act,
    y: Act,
    res: Option<Act>,
    cw: &ConvWeights,
    wt: &winograd::Weights,
    scratch: Scratch,
) {
    let image = |a: Act, n: usize| a.ptr.wrapping_add(n * a.h * a.w * a.ld);
    let map = |n: usize| winograd::Map {
        x: image(x, n),
        ldx: x.ld,
        y: image(y, n),
        ldy: y.ld,
        res: res.map(|r| (image(r, n) as *const f32, r.ld)),
        h: y.h,
        w: y.w,
    };
    let per_image = wt.tiles_of(y.h, y.w);
    let tb = wt.block().min(
        (per_image * x.b)
            .div_ceil(2 * ex.threads())
            .next_multiple_of(gemm::MR),
    );
    let blocks = per_image.div_ceil(tb);
    ex.each_on(x.b * blocks, |task, thread| {
        let (n, t0) = (task / blocks, (task % blocks) * tb);
        // SAFETY: the activations hold `b` images of the shapes in `x`, `y` and `res`; this task
        // alone writes tiles t0.. of image n; the thread's scratch holds a block of tiles.
        unsafe {
            winograd::tiles(
                map(n),
                wt,
                &cw.bias,
                cw.act,
                t0,
                tb.min(per_image - t0),
                scratch.mine(thread),
            )
        };
    });
}

/// Runs of A `(offset, floats)` with each run that starts where the previous one ends joined to
/// it: the taps of one kernel row over a dense input (its row stride is its channel count) are
/// one run of `k·C` floats instead of `k` runs of `C`, the same depth in the same order (the
/// same sums), with fewer restarts of the micro-kernel's inner loop (the first convolution,
/// over 3 channels, had runs of 3 floats).
fn coalesce(taps: impl Iterator<Item = (isize, usize)>) -> Vec<(isize, usize)> {
    let mut runs: Vec<(isize, usize)> = Vec::new();
    for (off, len) in taps {
        match runs.last_mut() {
            Some(last) if last.0 + last.1 as isize == off => last.1 += len,
            _ => runs.push((off, len)),
        }
    }
    runs
}

/// Output pixels `p0..p0+m`, columns `j0..j0+n` of group `g` of a k > 1 convolution (see
/// [`conv`]): each run of pixels of one output row whose taps all fall inside the input goes
/// through [`gemm::conv_taps`] reading the input in place; the pixels whose window overlaps
/// the padding through im2col into `col`: whole border rows (top, bottom) as one GEMM each, the
/// one or two at the ends of the other rows gathered [`BORDER_BATCH`] at a time into one GEMM
/// whose rows are then stored (with the residual) at their pixels. Every pixel's sums are those
/// of one row of the micro-kernel whichever way it is gathered (the same bits).
///
/// SAFETY: as [`conv`]'s; [`gemm::taps_supported`]; `col` holds [`ConvWeights::scratch`].
#[allow(clippy::too_many_arguments)]
unsafe fn implicit(
    x: Act,
    y: Act,
    res: Option<Act>,
    cw: &ConvWeights,
    taps: &[(isize, usize)],
    g: usize,
    p0: usize,
    m: usize,
    (j0, n): (usize, usize),
    wg: *const f32,
    bias: &[f32],
    col: &mut [f32],
) {
    let (k, s, pad, cig) = (cw.k, cw.stride, cw.pad, cw.cig);
    let kk = k * k * cig;
    let (col, outs) = col.split_at_mut(tile_rows(kk) * kk);
    // Output columns whose window lies inside the input: ox·s ≥ pad and ox·s − pad + k ≤ W.
    let lo = pad.div_ceil(s);
    let hi = if x.w + pad >= k {
        ((x.w + pad - k) / s + 1).min(y.w)
    } else {
        0
    };
    let out = |q: usize| {
        let epi = gemm::Epilogue {
            bias,
            act: cw.act,
            res: res.map(|a| (a.ptr.add(q * a.ld + g * cw.cog + j0) as *const f32, a.ld)),
        };
        (y.ptr.add(q * y.ld + g * cw.cog + j0), epi)
    };
    // Gathered border pixels: im2col row i of `col` is pixel `pend[i]`.
    let mut pend = [0usize; BORDER_BATCH];
    let mut np = 0;
    let flush = |pend: &[usize], col: &mut [f32], outs: &mut [f32]| {
        if pend.is_empty() {
            return;
        }
        let epi = gemm::Epilogue {
            bias,
            act: cw.act,
            res: None,
        };
        gemm::gemm(
            pend.len(),
            n,
            kk,
            col.as_ptr(),
            kk,
            wg,
            outs.as_mut_ptr(),
            n,
            epi,
        );
        for (i, &q) in pend.iter().enumerate() {
            let src = &outs[i * n..(i + 1) * n];
            let dst = std::slice::from_raw_parts_mut(y.ptr.add(q * y.ld + g * cw.cog + j0), n);
            match res {
                Some(r) => {
                    let r = std::slice::from_raw_parts(r.ptr.add(q * r.ld + g * cw.cog + j0), n);
                    for ((d, v), r) in dst.iter_mut().zip(src).zip(r) {
                        *d = v + r;
                    }
                }
                None => dst.copy_from_slice(src),
            }
        }
    };
    let mut border = |q: usize, len: usize, col: &mut [f32], outs: &mut [f32]| {
        if len >= gemm::MR {
            // A whole border row: one GEMM of its own (after the gathered rows, whose im2col
            // rows it would overwrite).
            flush(&pend[..np], col, outs);
            np = 0;
            im2col(x, y, cw, g, q, len, col);
            let (dst, epi) = out(q);
            gemm::gemm(len, n, kk, col.as_ptr(), kk, wg, dst, y.ld, epi);
            return;
        }
        for q in q..q + len {
            if np == BORDER_BATCH {
                flush(&pend, col, outs);
                np = 0;
            }
            im2col(x, y, cw, g, q, 1, &mut col[np * kk..(np + 1) * kk]);
            pend[np] = q;
            np += 1;
        }
    };
    let end = p0 + m;
    let mut q = p0;
    while q < end {
        let ox = q % y.w;
        let oy = (q / y.w) % y.h;
        let img = q / (y.w * y.h);
        let row_end = (q - ox + y.w).min(end);
        let last = ox + (row_end - q); // one past the last column of this run
        let iy = (oy * s) as isize - pad as isize;
        let row_inside = iy >= 0 && iy as usize + k <= x.h;
        let (a, b) = if row_inside && lo < hi {
            (ox.max(lo).min(last), last.min(hi).max(ox.max(lo).min(last)))
        } else {
            (last, last)
        };
        // [ox, a) border, [a, b) inside, [b, last) border.
        border(q, a - ox, col, outs);
        if b > a {
            let qa = q + (a - ox);
            let base = x
                .ptr
                .add(((img * x.h + iy as usize) * x.w + a * s - pad) * x.ld + g * cig);
            let (dst, epi) = out(qa);
            gemm::conv_taps(b - a, n, taps, base, s * x.ld, wg, dst, y.ld, epi);
        }
        border(q + (b - ox), last - b, col, outs);
        q = row_end;
    }
    flush(&pend[..np], col, outs);
}

/// The im2col rows of output pixels `p0..p0+m` of group `g` into `col` (`m × k·k·cig`),
/// zeros where a tap falls in the padding.
///
/// SAFETY: as [`conv`]'s.
unsafe fn im2col(x: Act, y: Act, cw: &ConvWeights, g: usize, p0: usize, m: usize, col: &mut [f32]) {
    let (k, s, pad, cig) = (cw.k, cw.stride, cw.pad, cw.cig);
    let kk = k * k * cig;
    let dense = x.ld == cig; // the k taps of one kernel row are one run of k·cig floats
    for r in 0..m {
        let p = p0 + r;
        let ox = p % y.w;
        let oy = (p / y.w) % y.h;
        let n = p / (y.w * y.h);
        let row = col.as_mut_ptr().add(r * kk);
        let ix0 = (ox * s) as isize - pad as isize;
        let inside_x = ix0 >= 0 && ix0 + k as isize <= x.w as isize;
        for ky in 0..k {
            let iy = (oy * s + ky) as isize - pad as isize;
            let d = row.add(ky * k * cig);
            if iy < 0 || iy >= x.h as isize {
                std::ptr::write_bytes(d, 0, k * cig);
                continue;
            }
            let q = (n * x.h + iy as usize) * x.w;
            if inside_x && dense {
                let src = x.ptr.add((q + ix0 as usize) * x.ld + g * cig);
                std::ptr::copy_nonoverlapping(src, d, k * cig);
                continue;
            }
            for kx in 0..k {
                let ix = ix0 + kx as isize;
                let d = d.add(kx * cig);
                if ix < 0 || ix >= x.w as isize {
                    std::ptr::write_bytes(d, 0, cig);
                } else {
                    let src = x.ptr.add((q + ix as usize) * x.ld + g * cig);
                    std::ptr::copy_nonoverlapping(src, d, cig);
                }
            }
        }
    }
}

/// Runs `f(p)` for every output pixel, in parallel chunks of whole rows.
fn for_pixels(ex: Exec, y: Act, f: impl Fn(usize) + Sync) {
    let rows = y.b * y.h;
    let threads = ex.threads();
    // A few rows per task; one task when the whole op is small.
    let per = (rows / (4 * threads)).max(1);
    let chunks = rows.div_ceil(per);
    let run = |c: usize| {
        for r in c * per..((c + 1) * per).min(rows) {
            for x in 0..y.w {
                f(r * y.w + x);
            }
        }
    };
    if y.pixels() * y.c < 16384 {
        (0..chunks).for_each(run);
    } else {
        ex.each(chunks, run);
    }
}

/// `y = a + b`.
pub(crate) fn add(ex: Exec, a: Act, b: Act, y: Act) {
    // SAFETY: each pixel is written by one call of the closure.
    for_pixels(ex, y, |p| unsafe {
        math::add_into(a.px(p), b.px(p), y.px(p))
    });
}

/// `y = x·σ(x)`.
pub(crate) fn silu(ex: Exec, x: Act, y: Act) {
    // SAFETY: as [`add`].
    for_pixels(ex, y, |p| unsafe { math::silu_into(x.px(p), y.px(p)) });
}

/// `y = x` (a concatenation slot).
pub(crate) fn copy(ex: Exec, x: Act, y: Act) {
    // SAFETY: as [`add`].
    for_pixels(ex, y, |p| unsafe { y.px(p).copy_from_slice(x.px(p)) });
}

/// The channels of one image's NHWC map `x` as rows: `dst[ch·stride + p] = x[p][ch]` for
/// every pixel `p` (row-major) and channel `ch` (a segmentation head's coefficients and
/// prototypes, read out channel-major as the official head returns them). On the calling thread:
/// a few hundred thousand floats per image.
pub(crate) fn to_channel_rows(x: Act, dst: &mut [f32], stride: usize) {
    let n = x.pixels();
    assert!(x.c > 0 && (x.c - 1) * stride + n <= dst.len() && n <= stride);
    for p in 0..n {
        // SAFETY: `p` < pixels; the forward that wrote `x` is over, nothing else writes it.
        let px = unsafe { x.px(p) };
        for (ch, &v) in px.iter().enumerate() {
            dst[ch * stride + p] = v;
        }
    }
}

/// Nearest upsampling by `f`.
pub(crate) fn upsample(ex: Exec, x: Act, y: Act, f: usize) {
    for_pixels(ex, y, |p| {
        let (ox, oy, n) = (p % y.w, (p / y.w) % y.h, p / (y.w * y.h));
        let q = (n * x.h + oy / f) * x.w + ox / f;
        // SAFETY: as [`add`].
        unsafe { y.px(p).copy_from_slice(x.px(q)) }
    });
}

/// The even rows and columns.
pub(crate) fn take_even(ex: Exec, x: Act, y: Act) {
    for_pixels(ex, y, |p| {
        let (ox, oy, n) = (p % y.w, (p / y.w) % y.h, p / (y.w * y.h));
        let q = (n * x.h + 2 * oy) * x.w + 2 * ox;
        // SAFETY: as [`add`].
        unsafe { y.px(p).copy_from_slice(x.px(q)) }
    });
}

/// `avg_pool2d(2, stride 1)`: `((a + b) + c + d) / 4` in the order of the reference forward.
pub(crate) fn avg_pool2(ex: Exec, x: Act, y: Act) {
    for_pixels(ex, y, |p| {
        let (ox, oy, n) = (p % y.w, (p / y.w) % y.h, p / (y.w * y.h));
        let q = (n * x.h + oy) * x.w + ox;
        // SAFETY: as [`add`].
        unsafe {
            let (a, b) = (x.px(q), x.px(q + 1));
            let (c, d) = (x.px(q + x.w), x.px(q + x.w + 1));
            let o = y.px(p);
            for j in 0..o.len() {
                o[j] = (((a[j] + b[j]) + c[j]) + d[j]) * 0.25;
            }
        }
    });
}

/// `max_pool2d(k, stride, padding k/2)` (padding never wins).
pub(crate) fn max_pool(ex: Exec, x: Act, y: Act, k: usize, stride: usize) {
    let r = k / 2;
    for_pixels(ex, y, |p| {
        let (ox, oy, n) = (p % y.w, (p / y.w) % y.h, p / (y.w * y.h));
        let (cy, cx) = (oy * stride, ox * stride);
        let (y0, y1) = (cy.saturating_sub(r), (cy + r + 1).min(x.h));
        let (x0, x1) = (cx.saturating_sub(r), (cx + r + 1).min(x.w));
        // SAFETY: as [`add`].
        unsafe {
            let o = y.px(p);
            o.copy_from_slice(x.px((n * x.h + cy) * x.w + cx));
            for iy in y0..y1 {
                for ix in x0..x1 {
                    math::max_into(x.px((n * x.h + iy) * x.w + ix), o);
                }
            }
        }
    });
}

/// The input `(B, 3, H, W)` (NCHW, `src` flat) into the NHWC activation `y`.
pub(crate) fn from_nchw(ex: Exec, src: &[f32], y: Act) {
    let hw = y.h * y.w;
    for_pixels(ex, y, |p| {
        let (n, i) = (p / hw, p % hw);
        // SAFETY: as [`add`].
        let o = unsafe { y.px(p) };
        for (c, v) in o.iter_mut().enumerate() {
            *v = src[(n * y.c + c) * hw + i];
        }
    });
}

/// DFL bins per box side.
const BINS: usize = crate::model::head::REG_MAX;

dispatch! {
    /// The DFL expectation of each side of one anchor: `Σ i·softmax(bins)_i` over the 16 bins of
    /// each of the 4 sides in `raw`. The exponentials of a side are one vector of 16 lanes
    /// where the CPU has AVX-512 (the same bits as one at a time: the same operations, and the
    /// sums in the same order); one at a time they took about 5 % of an INT8 forward.
    fn dfl_sides(raw: &[f32], d: &mut [f32; 4]) {
        for (side, dv) in d.iter_mut().enumerate() {
            let bins: &[f32; BINS] = raw[side * BINS..(side + 1) * BINS]
                .try_into()
                .expect("16 bins");
            let mut m = f32::NEG_INFINITY;
            for &v in bins {
                m = m.max(v);
            }
            let mut e = [0f32; BINS];
            for i in 0..BINS {
                e[i] = math::exp(bins[i] - m);
            }
            let (mut num, mut den) = (0f32, 0f32);
            for (i, &v) in e.iter().enumerate() {
                num += v * i as f32;
                den += v;
            }
            *dv = num / den;
        }
    }
}

/// The decode of [`crate::model::head::decode`] from NHWC raw outputs: `levels[i]` is level
/// i's `(B, H_i, W_i, 64 + nc)` raw output with stride `strides[i]`; writes `out`, the
/// `(B, 4 + nc, A)` f32 result (cx, cy, w, h in input pixels, then sigmoid scores).
pub(crate) fn decode(ex: Exec, levels: &[Act], strides: &[u32], out: &mut [f32]) {
    let b = levels[0].b;
    let no = levels[0].c;
    let nc = no - 4 * BINS;
    let a_total: usize = levels.iter().map(|l| l.h * l.w).sum();
    let rows = 4 + nc;
    let out = Act {
        ptr: out.as_mut_ptr(),
        ld: 1,
        b: 1,
        h: 1,
        w: out.len(),
        c: 1,
    };
    // Tasks: (image, level, row of anchors).
    let mut tasks = Vec::new();
    let mut a0 = 0;
    for (l, lv) in levels.iter().enumerate() {
        for n in 0..b {
            for gy in 0..lv.h {
                tasks.push((n, l, gy, a0 + gy * lv.w));
            }
        }
        a0 += lv.h * lv.w;
    }
    let run = |&(n, l, gy, a_row): &(usize, usize, usize, usize)| {
        let lv = levels[l];
        let s = strides[l] as f32;
        for gx in 0..lv.w {
            // SAFETY: pixel (n, gy, gx) of the level; each anchor's output column is written by
            // this task alone.
            unsafe {
                let raw = lv.px((n * lv.h + gy) * lv.w + gx);
                let mut d = [0f32; 4];
                dfl_sides(raw, &mut d);
                let (ax, ay) = (gx as f32 + 0.5, gy as f32 + 0.5);
                let (x1, y1, x2, y2) = (ax - d[0], ay - d[1], ax + d[2], ay + d[3]);
                let a = a_row + gx;
                let base = out.at(n * rows * a_total + a);
                *base = (x1 + x2) / 2.0 * s;
                *base.add(a_total) = (y1 + y2) / 2.0 * s;
                *base.add(2 * a_total) = (x2 - x1) * s;
                *base.add(3 * a_total) = (y2 - y1) * s;
                for c in 0..nc {
                    *base.add((4 + c) * a_total) = math::sigmoid(raw[4 * BINS + c]);
                }
            }
        }
    };
    ex.each(tasks.len(), |i| run(&tasks[i]));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DFL expectation with its exponentials as one vector equals the same sums done one
    /// value at a time, bit for bit, and a hand-computed case: bins all equal give the mean
    /// index 7.5, one bin far above the others gives its index.
    #[test]
    fn dfl_sides_are_the_scalar_sums() {
        let raw: Vec<f32> = (0..4 * BINS)
            .map(|i| ((i * 7919) % 23) as f32 * 0.37 - 4.0)
            .collect();
        let mut d = [0f32; 4];
        dfl_sides(&raw, &mut d);
        for side in 0..4 {
            let bins = &raw[side * BINS..(side + 1) * BINS];
            let m = bins.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut num, mut den) = (0f32, 0f32);
            for (i, &v) in bins.iter().enumerate() {
                let e = math::exp(v - m);
                num += e * i as f32;
                den += e;
            }
            assert_eq!(d[side].to_bits(), (num / den).to_bits(), "side {side}");
        }
        let mut flat = vec![1.5f32; 4 * BINS];
        flat[BINS + 3] = 60.0;
        dfl_sides(&flat, &mut d);
        assert_eq!((d[0], d[1]), (7.5, 3.0));
    }

    /// Whatever the buffer's own alignment (every 4-byte offset within a cache line), the slice
    /// starts on a 64-byte boundary, holds `len` floats and lies inside the buffer.
    #[test]
    fn aligned_slices_start_a_cache_line() {
        let mut v = vec![0f32; 1000 + 2 * ALIGN_FLOATS];
        for shift in 0..ALIGN_FLOATS {
            let buf = &mut v[shift..shift + 1000 + ALIGN_FLOATS];
            let (lo, hi) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len() * 4);
            let a = aligned(buf, 1000);
            let p = a.as_ptr() as usize;
            assert_eq!(p % 64, 0, "shift {shift}");
            assert_eq!(a.len(), 1000);
            assert!(p >= lo && p + 4000 <= hi, "shift {shift}");
        }
    }

    /// A 3x3 kernel's taps over a dense 3-channel input 10 pixels wide are three runs of 9
    /// floats, one per kernel row (rows 30 floats apart); over a slice of a wider storage (row
    /// stride 5) they stay nine runs of 3.
    #[test]
    fn taps_of_one_kernel_row_join_over_a_dense_input() {
        let taps =
            |ld: usize| coalesce((0..9).map(move |t| ((((t / 3) * 10 + t % 3) * ld) as isize, 3)));
        assert_eq!(taps(3), vec![(0, 9), (30, 9), (60, 9)]);
        let sliced = taps(5);
        assert_eq!(sliced.len(), 9);
        assert_eq!(&sliced[..4], &[(0, 3), (5, 3), (10, 3), (50, 3)]);
    }
}

#[cfg(test)]
mod rate {
    use super::*;
    use crate::model::cpu::pool::Pool;

    /// `cargo test --release --lib conv_rate -- --ignored --nocapture`: GFLOP/s of single convs.
    #[test]
    #[ignore]
    fn conv_rate() {
        let threads: Vec<usize> = crate::switches::var("YOLO9_RATE_THREADS")
            .unwrap_or_else(|| "1".into())
            .split(',')
            .filter_map(|t| t.trim().parse().ok())
            .collect();
        for &t in &threads {
            println!("threads {t}");
            rate_on(&Pool::new(t).unwrap());
        }
    }

    fn rate_on(pool: &Pool) {
        for &(ci, co, k, s, h, w) in &[
            (64usize, 64usize, 1usize, 1usize, 120usize, 160usize),
            (64, 64, 1, 1, 20, 24),
            (64, 64, 1, 1, 40, 48),
            (128, 64, 1, 1, 120, 160),
            (32, 32, 3, 1, 120, 160),
            (128, 128, 3, 1, 60, 80),
            (3, 32, 3, 2, 480, 640),
            (64, 64, 3, 1, 60, 80),
            (48, 48, 3, 1, 30, 40),
            (64, 32, 1, 1, 60, 80),
            (128, 128, 3, 1, 15, 20),
        ] {
            let wt = Tensor::rand(-0.1f32, 0.1, (co, ci, k, k), &candle_core::Device::Cpu).unwrap();
            let cw = ConvWeights::pack(&wt, None, (s, k / 2, 1), true, None).unwrap();
            let (ho, wo) = cw.out_hw(h, w);
            let mut xb = vec![0.5f32; h * w * ci];
            let mut yb = vec![0f32; ho * wo * co];
            let per = cw.scratch().max(1);
            let mut sc = vec![0f32; per * pool.threads()];
            let x = Act {
                ptr: xb.as_mut_ptr(),
                ld: ci,
                b: 1,
                h,
                w,
                c: ci,
            };
            let y = Act {
                ptr: yb.as_mut_ptr(),
                ld: co,
                b: 1,
                h: ho,
                w: wo,
                c: co,
            };
            let scratch = Scratch {
                ptr: sc.as_mut_ptr(),
                per,
                qbuf: std::ptr::null_mut(),
            };
            let flop = 2.0 * (ho * wo * co * ci * k * k) as f64;
            let reps = (1e9 / flop).ceil() as usize;
            let ex = Exec(Some(pool));
            conv(ex, x, y, None, &cw, scratch);
            // The best of 5 rounds: this rate is for comparing kernels on a shared machine.
            let sec = (0..5)
                .map(|_| {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        conv(ex, x, y, None, &cw, scratch);
                    }
                    t.elapsed().as_secs_f64() / reps as f64
                })
                .fold(f64::INFINITY, f64::min);
            println!(
                "{ci}->{co} k{k} s{s} {h}x{w}: {:.2} ms {:.1} GFLOP/s",
                sec * 1e3,
                flop / sec / 1e9
            );
        }
    }
}
