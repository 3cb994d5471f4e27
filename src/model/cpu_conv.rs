//! Inference convolution on the CPU: im2col into a row-major (pixels × C·k·k) matrix, one GEMM
//! through candle's matmul, and a blocked transpose back to NCHW.
//!
//! Candle's own CPU `conv2d` lays the im2col matrix out the other way round and multiplies the
//! kernel (C_out × C·k·k) by it, an orientation its GEMM runs about 2.5× slower on two cores
//! (measured: 3×3 64→64 at 160², 62 ms vs 16 ms for the GEMM alone). A 1×1 stride-1 convolution
//! needs no im2col at all: `y = W · x` per image is already in NCHW order.
//!
//! Only for f32 and groups = 1. [`conv2d`] is for tensors that need no gradient (detection,
//! validation, any eval-mode forward: [`crate::model::conv::conv2d_any`] chooses it);
//! [`conv2d_tracked`] is the same forward as a candle op with a backward ([`conv2d_backward`]),
//! for training on the CPU.
//!
//! **Backward.** Candle differentiates its CPU `conv2d` through `conv_transpose2d`, a direct loop
//! of dot products per output pixel and tap: 35 of the 40 s of one official loss batch's forward
//! and backward (yolov9-s, 640², `tests/loss/batch.rs`, this 2-core machine). Here both gradients
//! are GEMMs on the same im2col matrix `col` (pixels × C·k·k) as the forward, per image:
//! `dW += dY · col` (C_out × pixels · pixels × C·k·k) and `dcol = dYᵀ · W`
//! (pixels × C_out · C_out × C·k·k), then `dX = col2im(dcol)`, each tap's gradient added back onto
//! the input pixel it was copied from (the transpose of im2col). A 1×1 stride-1 convolution needs
//! neither: `dW += dY · Xᵀ`, `dX = Wᵀ · dY`.

use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Whether [`conv2d`] handles these arguments.
pub fn applies(x: &Tensor, w: &Tensor, groups: usize) -> bool {
    applies_tracked(x, w, groups) && !x.track_op() && !w.track_op()
}

/// Whether [`conv2d_tracked`] and [`conv2d_backward`] handle these arguments (f32 on the CPU,
/// groups 1; the tensors may need gradients).
pub fn applies_tracked(x: &Tensor, w: &Tensor, groups: usize) -> bool {
    matches!(x.device(), Device::Cpu)
        && x.dtype() == DType::F32
        && w.dtype() == DType::F32
        && groups == 1
}

/// [`conv2d`] as a candle op whose backward is [`conv2d_backward`]: the CPU convolution of
/// training forwards (`x (N, C, H, W)`, `w (C_out, C, k_h, k_w)`, f32, groups 1; see
/// [`applies_tracked`]). The values equal [`conv2d`]'s bit for bit, tracked or not.
pub fn conv2d_tracked(x: &Tensor, w: &Tensor, padding: usize, stride: usize) -> Result<Tensor> {
    let op = TrackedConv { padding, stride };
    x.contiguous()?.apply_op2(&w.contiguous()?, op)
}

/// The op of [`conv2d_tracked`].
struct TrackedConv {
    padding: usize,
    stride: usize,
}

impl CustomOp2 for TrackedConv {
    fn name(&self) -> &'static str {
        "yolo9-cpu-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let view = |s: &CpuStorage, l: &Layout| -> Result<Tensor> {
            let (a, b) = l
                .contiguous_offsets()
                .ok_or_else(|| candle_core::Error::Msg("conv2d: non-contiguous input".into()))?;
            Tensor::from_slice(&s.as_slice::<f32>()?[a..b], l.shape(), &Device::Cpu)
        };
        let y = conv2d(&view(s1, l1)?, &view(s2, l2)?, self.padding, self.stride)?;
        let shape = y.shape().clone();
        Ok((CpuStorage::F32(y.flatten_all()?.to_vec1::<f32>()?), shape))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = conv2d_backward(x, w, dy, self.padding, self.stride, x.track_op())?;
        Ok((dx, Some(dw)))
    }
}

/// The gradients of `y = conv2d(x, w)` ([`conv2d`]'s arguments) for the output gradient
/// `dy (N, C_out, H', W')`: `dx` (only when `need_dx`) of `x`'s shape and `dw` of `w`'s, f32 (see
/// the module docs for the GEMMs). Computed on detached tensors: no autograd graph is recorded.
/// Errors: shapes that do not match one convolution.
pub fn conv2d_backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    padding: usize,
    stride: usize,
    need_dx: bool,
) -> Result<(Option<Tensor>, Tensor)> {
    let (n, c, h, wd) = x.dims4()?;
    let (co, ci, kh, kw) = w.dims4()?;
    let (dn, dco, ho, wo) = dy.dims4()?;
    if ci != c || dn != n || dco != co || stride == 0 {
        candle_core::bail!(
            "conv2d backward: x {:?}, w {:?} and dy {:?} are not one convolution",
            x.dims(),
            w.dims(),
            dy.dims()
        );
    }
    let (x, dy) = (x.detach().contiguous()?, dy.detach().contiguous()?);
    let ckk = c * kh * kw;
    let wm = w.detach().contiguous()?.reshape((co, ckk))?;
    let pointwise = kh == 1 && kw == 1 && stride == 1 && padding == 0;
    let g = Geom {
        c,
        h,
        w: wd,
        kh,
        kw,
        wo,
        padding,
        stride,
    };
    let mut dw: Option<Tensor> = None;
    let mut dxs = Vec::with_capacity(if need_dx { n } else { 0 });
    for b in 0..n {
        let dyb = dy.get(b)?.reshape((co, ho * wo))?;
        let (dwb, dxb) = if pointwise {
            let xb = x.get(b)?.reshape((c, h * wd))?;
            let dxb = match need_dx {
                true => Some(wm.t()?.matmul(&dyb)?),
                false => None,
            };
            (dyb.matmul(&xb.t()?)?, dxb)
        } else {
            let xs = x.get(b)?.flatten_all()?.to_vec1::<f32>()?;
            let col = Tensor::from_vec(im2col(&xs, &g, ho), (ho * wo, ckk), &Device::Cpu)?;
            let dxb = match need_dx {
                true => {
                    let dcol = dyb.t()?.matmul(&wm)?.flatten_all()?.to_vec1::<f32>()?;
                    Some(Tensor::from_vec(
                        col2im(&dcol, &g, ho),
                        (c, h * wd),
                        &Device::Cpu,
                    )?)
                }
                false => None,
            };
            (dyb.matmul(&col)?, dxb)
        };
        dw = Some(match dw {
            None => dwb,
            Some(acc) => (acc + dwb)?,
        });
        dxs.extend(dxb.map(|d| d.reshape((c, h, wd))));
    }
    let dw = match dw {
        Some(d) => d.reshape((co, ci, kh, kw))?,
        None => Tensor::zeros((co, ci, kh, kw), DType::F32, &Device::Cpu)?,
    };
    let dx = match need_dx {
        true => Some(Tensor::stack(
            &dxs.into_iter().collect::<Result<Vec<_>>>()?,
            0,
        )?),
        false => None,
    };
    Ok((dx, dw))
}

/// `x (N, C, H, W) ⊛ w (C_out, C, k_h, k_w) → (N, C_out, H', W')`, zero `padding` per side,
/// `stride`, dilation 1, groups 1, f32 on the CPU; `H' = (H + 2·padding − k_h)/stride + 1`.
/// Errors: shape mismatches (channels, a kernel larger than the padded input).
pub fn conv2d(x: &Tensor, w: &Tensor, padding: usize, stride: usize) -> Result<Tensor> {
    let (n, c, h, wd) = x.dims4()?;
    let (co, ci, kh, kw) = w.dims4()?;
    if ci != c {
        candle_core::bail!("conv2d: input has {c} channels, kernel expects {ci}");
    }
    if h + 2 * padding < kh || wd + 2 * padding < kw || stride == 0 {
        candle_core::bail!("conv2d: kernel {kh}x{kw} larger than the padded input {h}x{wd}");
    }
    let ho = (h + 2 * padding - kh) / stride + 1;
    let wo = (wd + 2 * padding - kw) / stride + 1;
    let x = x.contiguous()?;
    let ckk = c * kh * kw;
    let wm = w.contiguous()?.reshape((co, ckk))?;
    let mut outs = Vec::with_capacity(n);
    for b in 0..n {
        let xb = x.get(b)?;
        let y = if kh == 1 && kw == 1 && stride == 1 && padding == 0 {
            // (C_out × C) · (C × H·W): NCHW order directly.
            wm.matmul(&xb.reshape((c, h * wd))?)?
        } else {
            let xs = xb.flatten_all()?.to_vec1::<f32>()?;
            let g = Geom {
                c,
                h,
                w: wd,
                kh,
                kw,
                wo,
                padding,
                stride,
            };
            let col = Tensor::from_vec(im2col(&xs, &g, ho), (ho * wo, ckk), &Device::Cpu)?;
            // (pixels × C·k·k) · (C·k·k × C_out) → (pixels × C_out), then NCHW.
            let yt = col.matmul(&wm.t()?)?;
            let v = transpose(&yt.flatten_all()?.to_vec1::<f32>()?, ho * wo, co);
            Tensor::from_vec(v, (co, ho * wo), &Device::Cpu)?
        };
        outs.push(y.reshape((co, ho, wo))?);
    }
    Tensor::stack(&outs, 0)
}

/// Geometry of one image's im2col.
struct Geom {
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    wo: usize,
    padding: usize,
    stride: usize,
}

impl Geom {
    /// The valid tap range `[lo, hi)` of a kernel axis of `k` taps at output position `o` over an
    /// input of `n` pixels, and the first input index covered (meaningful only when lo < hi).
    fn taps(&self, o: usize, k: usize, n: usize) -> (usize, usize, usize) {
        let start = o * self.stride;
        let lo = self.padding.saturating_sub(start).min(k);
        let hi = (n + self.padding).saturating_sub(start).min(k).max(lo);
        (lo, hi, (start + lo).saturating_sub(self.padding))
    }
}

/// Row `oy·W' + ox` holds the receptive field of output pixel (oy, ox), ordered (c, ky, kx) like
/// the flattened kernel; out-of-image taps are 0. Rows are filled in parallel, one output row of
/// pixels per task.
///
/// The input column of tap `kx` is `ox·stride + kx − padding`, consecutive in `kx`, so the taps of
/// one (c, ky) that fall inside the image are one contiguous slice of an input row: the valid
/// `kx` range is found once per output pixel and the valid `ky` range once per output row, and
/// each in-image segment is a slice copy. The buffer is not zeroed beforehand (that was a
/// single-threaded memset of the whole matrix): every entry is written once, in parallel, either
/// with its pixel or with the 0 of an out-of-image tap.
fn im2col(x: &[f32], g: &Geom, ho: usize) -> Vec<f32> {
    let ckk = g.c * g.kh * g.kw;
    let kk = g.kh * g.kw;
    let n = ho * g.wo * ckk;
    let zero = |d: &mut [MaybeUninit<f32>]| d.iter_mut().for_each(|v| *v = MaybeUninit::new(0.0));
    let mut col: Vec<f32> = Vec::with_capacity(n);
    col.spare_capacity_mut()[..n]
        .par_chunks_mut((g.wo * ckk).max(1))
        .enumerate()
        .for_each(|(oy, rows)| {
            let (ky_lo, ky_hi, iy0) = g.taps(oy, g.kh, g.h);
            for (ox, row) in rows.chunks_exact_mut(ckk).enumerate() {
                let (kx_lo, kx_hi, ix0) = g.taps(ox, g.kw, g.w);
                let len = kx_hi - kx_lo;
                if len == 0 || ky_lo == ky_hi {
                    zero(row);
                    continue;
                }
                for (ch, taps_c) in row.chunks_exact_mut(kk).enumerate() {
                    let plane = &x[ch * g.h * g.w..(ch + 1) * g.h * g.w];
                    for (ky, seg) in taps_c.chunks_exact_mut(g.kw).enumerate() {
                        if ky < ky_lo || ky >= ky_hi {
                            zero(seg);
                            continue;
                        }
                        zero(&mut seg[..kx_lo]);
                        zero(&mut seg[kx_hi..]);
                        let at = (iy0 + ky - ky_lo) * g.w + ix0;
                        let src = &plane[at..at + len];
                        let dst = &mut seg[kx_lo..kx_hi];
                        if len == 3 {
                            // The 3×3 interior case, without a memcpy call per 3 values.
                            dst[0] = MaybeUninit::new(src[0]);
                            dst[1] = MaybeUninit::new(src[1]);
                            dst[2] = MaybeUninit::new(src[2]);
                        } else {
                            for (d, s) in dst.iter_mut().zip(src) {
                                *d = MaybeUninit::new(*s);
                            }
                        }
                    }
                }
            }
        });
    // SAFETY: the loop above wrote all `n` entries: the chunks of `ckk` cover every output pixel
    // of every output row (`ho` rows of `wo` pixels), and within a pixel each (c, ky) segment of
    // `kw` taps is written whole, as zeros (out-of-image row or no in-image column) or as zeros
    // before `kx_lo`, the copied pixels in `kx_lo..kx_hi` and zeros from `kx_hi`.
    unsafe { col.set_len(n) };
    col
}

/// The transpose of [`im2col`]: every entry of `dcol` (pixels × C·k·k, row-major) added onto the
/// input pixel its tap reads, taps outside the image dropped; returns the (C × H × W) plane.
/// Channels in parallel (each task owns one input plane, so no two tasks add to one pixel).
fn col2im(dcol: &[f32], g: &Geom, ho: usize) -> Vec<f32> {
    let kk = g.kh * g.kw;
    let ckk = g.c * kk;
    let mut out = vec![0f32; g.c * g.h * g.w];
    out.par_chunks_mut((g.h * g.w).max(1))
        .enumerate()
        .for_each(|(ch, plane)| {
            for oy in 0..ho {
                let (ky_lo, ky_hi, iy0) = g.taps(oy, g.kh, g.h);
                for ox in 0..g.wo {
                    let (kx_lo, kx_hi, ix0) = g.taps(ox, g.kw, g.w);
                    if kx_lo == kx_hi {
                        continue;
                    }
                    let row = &dcol[(oy * g.wo + ox) * ckk + ch * kk..][..kk];
                    for ky in ky_lo..ky_hi {
                        let at = (iy0 + ky - ky_lo) * g.w + ix0;
                        let dst = &mut plane[at..at + (kx_hi - kx_lo)];
                        for (d, s) in dst
                            .iter_mut()
                            .zip(&row[ky * g.kw + kx_lo..ky * g.kw + kx_hi])
                        {
                            *d += s;
                        }
                    }
                }
            }
        });
    out
}

/// (rows × cols) row-major → (cols × rows) row-major, in 64×64 tiles, output rows in parallel.
fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const T: usize = 64;
    let mut out = vec![0f32; a.len()];
    out.par_chunks_mut(T * rows)
        .enumerate()
        .for_each(|(cb, block)| {
            let c0 = cb * T;
            let cn = (cols - c0).min(T);
            for r0 in (0..rows).step_by(T) {
                let rn = (rows - r0).min(T);
                for r in r0..r0 + rn {
                    let src = &a[r * cols + c0..r * cols + c0 + cn];
                    for (j, &v) in src.iter().enumerate() {
                        block[j * rows + r] = v;
                    }
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: tap (c, ky, kx) of output pixel (oy, ox) is the input pixel at
    /// `(oy·s + ky − p, ox·s + kx − p)`, or 0 outside the image.
    fn im2col_reference(x: &[f32], g: &Geom, ho: usize) -> Vec<f32> {
        let mut out = Vec::new();
        for oy in 0..ho {
            for ox in 0..g.wo {
                for c in 0..g.c {
                    for ky in 0..g.kh {
                        for kx in 0..g.kw {
                            let iy = (oy * g.stride + ky) as isize - g.padding as isize;
                            let ix = (ox * g.stride + kx) as isize - g.padding as isize;
                            let inside =
                                (0..g.h as isize).contains(&iy) && (0..g.w as isize).contains(&ix);
                            out.push(if inside {
                                x[(c * g.h + iy as usize) * g.w + ix as usize]
                            } else {
                                0.0
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// Every entry of the (unzeroed) im2col buffer is written: the allocator is first handed a
    /// NaN-filled block of the same size to reuse, so an entry left unwritten would show up as
    /// NaN (or garbage) instead of the reference value. Geometries cover wide padding, stride 2,
    /// kernels wider than the image and 1-pixel images.
    #[test]
    fn im2col_writes_every_entry() {
        for (c, h, w, k, p, s) in [
            (2, 9, 7, 3, 1, 1),
            (3, 8, 8, 3, 1, 2),
            (2, 5, 6, 5, 2, 1),
            (1, 3, 3, 5, 2, 1),
            (2, 7, 8, 3, 3, 2),
            (2, 4, 6, 3, 4, 1),
            (1, 1, 1, 3, 1, 1),
            (2, 9, 9, 3, 0, 2),
        ] {
            let ho = (h + 2 * p - k) / s + 1;
            let g = Geom {
                c,
                h,
                w,
                kh: k,
                kw: k,
                wo: (w + 2 * p - k) / s + 1,
                padding: p,
                stride: s,
            };
            let x: Vec<f32> = (0..c * h * w).map(|i| i as f32 + 1.0).collect();
            let want = im2col_reference(&x, &g, ho);
            drop(std::hint::black_box(vec![f32::NAN; want.len()]));
            let got = im2col(&x, &g, ho);
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{c}x{h}x{w} k{k} p{p} s{s}: entry {i} is {a}, want {b}"
                );
            }
        }
    }

    /// The tracked convolution's values and both gradients against candle's own `conv2d` and its
    /// autograd (`conv_transpose2d` for dX), on random tensors: 1×1, 3×3 with stride 1 and 2,
    /// 5×5 with wide padding, a kernel as wide as the image, batches of 1 to 3. The loss is
    /// `Σ y·r` for a random `r`, so every output pixel's gradient differs.
    #[test]
    fn tracked_conv_and_its_gradients_equal_candles() {
        use candle_core::Var;
        let dev = Device::Cpu;
        for (n, c, co, h, w, k, p, s) in [
            (2, 5, 7, 9, 11, 1, 0, 1),
            (1, 4, 6, 10, 8, 3, 1, 1),
            (3, 3, 5, 9, 9, 3, 1, 2),
            (2, 2, 3, 7, 6, 5, 2, 1),
            (1, 3, 4, 8, 8, 3, 0, 2),
            (2, 2, 2, 3, 3, 3, 1, 1),
            (1, 6, 4, 7, 5, 1, 0, 2),
        ] {
            let x =
                Var::from_tensor(&Tensor::randn(0f32, 1.0, (n, c, h, w), &dev).unwrap()).unwrap();
            let wt =
                Var::from_tensor(&Tensor::randn(0f32, 0.5, (co, c, k, k), &dev).unwrap()).unwrap();
            let want = x.as_tensor().conv2d(wt.as_tensor(), p, s, 1, 1).unwrap();
            let r = Tensor::randn(0f32, 1.0, want.shape(), &dev).unwrap();
            let got = conv2d_tracked(x.as_tensor(), wt.as_tensor(), p, s).unwrap();
            assert_eq!(got.dims(), want.dims());
            let close = |a: &Tensor, b: &Tensor, what: &str| {
                let (a, b) = (a.flatten_all().unwrap(), b.flatten_all().unwrap());
                let scale = b.abs().unwrap().max(0).unwrap().to_scalar::<f32>().unwrap();
                let err = (a - &b).unwrap().abs().unwrap().max(0).unwrap();
                let err = err.to_scalar::<f32>().unwrap();
                assert!(
                    err <= 1e-5 * scale.max(1.0),
                    "n{n} c{c} co{co} {h}x{w} k{k} p{p} s{s}: {what} differs by {err} (scale {scale})"
                );
            };
            close(&got, &want, "y");
            let gw = (want * &r).unwrap().sum_all().unwrap().backward().unwrap();
            let gg = (got * &r).unwrap().sum_all().unwrap().backward().unwrap();
            for (v, what) in [(&x, "dx"), (&wt, "dw")] {
                close(
                    gg.get(v.as_tensor()).unwrap(),
                    gw.get(v.as_tensor()).unwrap(),
                    what,
                );
            }
            // The taped path's call, without dx.
            let dy = r.clone();
            let (dx, dw) =
                conv2d_backward(x.as_tensor(), wt.as_tensor(), &dy, p, s, false).unwrap();
            assert!(dx.is_none());
            close(&dw, gw.get(wt.as_tensor()).unwrap(), "dw alone");
        }
    }

    #[test]
    fn transpose_is_exact() {
        let a: Vec<f32> = (0..(130 * 70)).map(|i| i as f32).collect();
        let t = transpose(&a, 130, 70);
        for r in 0..130 {
            for c in 0..70 {
                assert_eq!(t[c * 130 + r], a[r * 70 + c]);
            }
        }
    }
}
