//! Pooling and upsampling used by YOLOv9, written so that they match PyTorch numerically and
//! have correct gradients under candle's autograd (candle's own backward refuses
//! `avg_pool2d(2, stride 1)` and `max_pool2d(5, stride 1, pad 2)`).

use anyhow::Result;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor, WithDType};
use rayon::prelude::*;

use crate::op_args::InferPool;

/// `F.avg_pool2d(x, 2, 1, 0, ceil_mode=False, count_include_pad=True)` (official `AConv`).
///
/// x: (B, C, H, W) f32 → (B, C, H−1, W−1). With `differentiable` the result is the mean of the
/// four shifted views (narrow + add, whose backward candle supports); otherwise candle's
/// `avg_pool2d_with_stride` (faster, no backward for stride ≠ kernel).
pub fn avg_pool_2x2_s1(x: &Tensor, differentiable: bool) -> Result<Tensor> {
    let (_, _, h, w) = x.dims4()?;
    anyhow::ensure!(
        h >= 2 && w >= 2,
        "avg_pool 2x2: input {h}x{w} is smaller than the window (input sizes must be multiples of 32)"
    );
    if !differentiable {
        if infer_pool_runs(x) {
            return infer_pool(x, InferPool::Avg2Nchw);
        }
        return Ok(x.avg_pool2d_with_stride((2, 2), (1, 1))?);
    }
    let top = x.narrow(2, 0, h - 1)?;
    let bot = x.narrow(2, 1, h - 1)?;
    let s = (top.narrow(3, 0, w - 1)? + top.narrow(3, 1, w - 1)?)?;
    let s = (s + bot.narrow(3, 0, w - 1)?)?;
    let s = (s + bot.narrow(3, 1, w - 1)?)?;
    Ok((s * 0.25)?)
}

/// Pads H and W by `p` on each side with −∞ (PyTorch max-pool padding semantics: padded cells
/// never win). x: (B, C, H, W) → (B, C, H+2p, W+2p).
pub fn pad_neg_inf(x: &Tensor, p: usize) -> Result<Tensor> {
    if p == 0 {
        return Ok(x.clone());
    }
    let (b, c, h, w) = x.dims4()?;
    let side = Tensor::full(f32::NEG_INFINITY, (b, c, h, p), x.device())?.to_dtype(x.dtype())?;
    let x = Tensor::cat(&[&side, x, &side], 3)?;
    let tb =
        Tensor::full(f32::NEG_INFINITY, (b, c, p, w + 2 * p), x.device())?.to_dtype(x.dtype())?;
    Ok(Tensor::cat(&[&tb, &x, &tb], 2)?)
}

/// `nn.MaxPool2d(k, stride=1, padding=k/2)` for odd `k` (official `SP`, k = 5 in `SPPELAN`).
///
/// x: (B, C, H, W) → (B, C, H, W). Computed separably (rows then columns) on a −∞-padded copy
/// with `maximum` of shifted views, so it is differentiable in candle. On ties candle's
/// `maximum` splits the gradient equally where PyTorch sends it to the first maximum; the total
/// gradient reaching equal-valued inputs is the same.
pub fn max_pool_same(x: &Tensor, k: usize) -> Result<Tensor> {
    anyhow::ensure!(k % 2 == 1, "max_pool_same: kernel {k} must be odd");
    let (_, _, h, w) = x.dims4()?;
    let p = k / 2;
    let xp = pad_neg_inf(x, p)?;
    let mut r = xp.narrow(3, 0, w)?;
    for i in 1..k {
        r = r.maximum(&xp.narrow(3, i, w)?)?;
    }
    let mut out = r.narrow(2, 0, h)?;
    for i in 1..k {
        out = out.maximum(&r.narrow(2, i, h)?)?;
    }
    Ok(out)
}

/// `nn.Upsample(scale_factor=2, mode='nearest')`: x (B, C, H, W) → (B, C, 2H, 2W), each pixel
/// repeated 2×2. Written as broadcast + reshape so the backward is a plain sum.
pub fn upsample_nearest_2x(x: &Tensor) -> Result<Tensor> {
    upsample_nearest(x, 2)
}

/// Nearest upsampling by the integer factor `f ≥ 1`: x (B, C, H, W) → (B, C, fH, fW), each
/// pixel repeated f×f (`F.interpolate(x, size=(fH, fW), mode='nearest')`).
pub fn upsample_nearest(x: &Tensor, f: usize) -> Result<Tensor> {
    anyhow::ensure!(f >= 1, "upsample: factor 0");
    let (b, c, h, w) = x.dims4()?;
    let y = x
        .reshape((b, c, h, 1, w, 1))?
        .broadcast_as((b, c, h, f, w, f))?
        .reshape((b, c, f * h, f * w))?;
    Ok(y)
}

/// Rows and columns 0, 2, 4, … of x: (B, C, H, W) → (B, C, ⌈H/2⌉, ⌈W/2⌉), contiguous.
pub fn take_even(x: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let (h2, w2) = (h.div_ceil(2), w.div_ceil(2));
    let xp = x
        .pad_with_zeros(2, 0, 2 * h2 - h)?
        .pad_with_zeros(3, 0, 2 * w2 - w)?;
    let y = xp
        .reshape((b, c, h2, 2, w2, 2))?
        .narrow(3, 0, 1)?
        .narrow(5, 0, 1)?
        .reshape((b, c, h2, w2))?
        .contiguous()?;
    Ok(y)
}

/// Channels-last forms of the pools above for the channels-last inference forward
/// ([`crate::model::tape::Ctx::plain_nhwc`]): `x` is (B, H, W, C) and so is the result; the same
/// values as the NCHW functions on the transposed tensor (max and nearest copies are exact; the
/// average adds its four terms in the order of the differentiable NCHW form). Not meant for
/// autograd.
pub mod nhwc {
    use crate::op_args::InferPool;
    use anyhow::Result;
    use candle_core::Tensor;

    /// [`super::avg_pool_2x2_s1`]: (B, H, W, C) → (B, H−1, W−1, C); one op on CUDA
    /// ([`super::InferPoolOp`]).
    pub fn avg_pool_2x2_s1(x: &Tensor) -> Result<Tensor> {
        let (_, h, w, _) = x.dims4()?;
        anyhow::ensure!(
            h >= 2 && w >= 2,
            "avg_pool 2x2: input {h}x{w} is smaller than the window (input sizes must be multiples of 32)"
        );
        if super::infer_pool_runs(x) {
            return super::infer_pool(x, InferPool::Avg2Nhwc);
        }
        let top = x.narrow(1, 0, h - 1)?;
        let bot = x.narrow(1, 1, h - 1)?;
        let s = (top.narrow(2, 0, w - 1)? + top.narrow(2, 1, w - 1)?)?;
        let s = (s + bot.narrow(2, 0, w - 1)?)?;
        let s = (s + bot.narrow(2, 1, w - 1)?)?;
        Ok((s * 0.25)?)
    }

    /// [`super::max_pool_same`]: `MaxPool2d(k, 1, k/2)` for odd `k`, −∞ padding, separable
    /// (one op on CUDA, [`super::InferPoolOp`]).
    pub fn max_pool_same(x: &Tensor, k: usize) -> Result<Tensor> {
        anyhow::ensure!(k % 2 == 1, "max_pool_same: kernel {k} must be odd");
        if super::infer_pool_runs(x) && k <= 15 {
            return super::infer_pool(x, InferPool::MaxSameNhwc(k));
        }
        let (b, h, w, c) = x.dims4()?;
        let p = k / 2;
        let ninf = |shape: (usize, usize, usize, usize)| -> Result<Tensor> {
            Ok(Tensor::full(f32::NEG_INFINITY, shape, x.device())?.to_dtype(x.dtype())?)
        };
        let side = ninf((b, h, p, c))?;
        let xp = Tensor::cat(&[&side, x, &side], 2)?;
        let mut r = xp.narrow(2, 0, w)?;
        for i in 1..k {
            r = r.maximum(&xp.narrow(2, i, w)?)?;
        }
        let tb = ninf((b, p, w, c))?;
        let rp = Tensor::cat(&[&tb, &r, &tb], 1)?;
        let mut out = rp.narrow(1, 0, h)?;
        for i in 1..k {
            out = out.maximum(&rp.narrow(1, i, h)?)?;
        }
        Ok(out)
    }

    /// [`super::upsample_nearest`]: (B, H, W, C) → (B, fH, fW, C).
    pub fn upsample_nearest(x: &Tensor, f: usize) -> Result<Tensor> {
        anyhow::ensure!(f >= 1, "upsample: factor 0");
        if f == 2 {
            return crate::model::layout::upsample2_nhwc(x);
        }
        crate::model::layout::upsample_view_nhwc(x, f)
    }

    /// [`super::take_even`]: (B, H, W, C) → (B, ⌈H/2⌉, ⌈W/2⌉, C), contiguous.
    pub fn take_even(x: &Tensor) -> Result<Tensor> {
        let (b, h, w, c) = x.dims4()?;
        let (h2, w2) = (h.div_ceil(2), w.div_ceil(2));
        let xp = x
            .pad_with_zeros(1, 0, 2 * h2 - h)?
            .pad_with_zeros(2, 0, 2 * w2 - w)?;
        Ok(xp
            .reshape((b, h2, 2, w2, 2, c))?
            .narrow(2, 0, 1)?
            .narrow(4, 0, 1)?
            .reshape((b, h2, w2, c))?
            .contiguous()?)
    }
}

/// `nn.MaxPool2d(k, stride=1, padding=k/2)` for odd `k` ≤ 15 as one op ([`MaxPoolSame`]) on
/// contiguous NCHW tensors (CPU f32/f64, CUDA f32/bf16 through `kernels/pool.cu`): the same values
/// as [`max_pool_same`]. Not differentiable; the training graph's tape pairs it with
/// [`max_pool_same_backward`].
pub fn max_pool_same_op(x: &Tensor, k: usize) -> Result<Tensor> {
    x.dims4()?;
    Ok(super::ew::contiguous(x)?.apply_op1_no_bwd(&MaxPoolSame { k })?)
}

/// The input gradient of [`max_pool_same_op`] at `x` for the output gradient `dy`: each output's
/// gradient goes to the first maximum of its window in row-major order (PyTorch's
/// `max_pool2d_with_indices_backward`), summed in row-major order of the outputs.
pub fn max_pool_same_backward(x: &Tensor, dy: &Tensor, k: usize) -> Result<Tensor> {
    x.dims4()?;
    Ok(super::ew::contiguous(x)?
        .apply_op2_no_bwd(&super::ew::contiguous(dy)?, &MaxPoolSameGrad { k })?)
}

/// Whether [`max_pool_same_op`] runs for this device and dtype.
pub fn max_pool_op_supported(x: &Tensor) -> bool {
    match x.device() {
        candle_core::Device::Cpu => matches!(x.dtype(), DType::F32 | DType::F64),
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(_) => matches!(x.dtype(), DType::F32 | DType::BF16),
        #[allow(unreachable_patterns)]
        _ => false,
    }
}

/// The op of [`max_pool_same_op`].
#[derive(Debug, Clone, Copy)]
pub struct MaxPoolSame {
    /// Odd window size.
    pub k: usize,
}

/// The op of [`max_pool_same_backward`]: args `x`, `dy` → `dx`.
#[derive(Debug, Clone, Copy)]
pub struct MaxPoolSameGrad {
    /// Odd window size.
    pub k: usize,
}

/// Offset `dr·k + dc` of the first maximum of output (i, j)'s window in the plane `x` (H × W).
fn argmax_at<T: WithDType>(x: &[T], h: usize, w: usize, k: usize, i: usize, j: usize) -> usize {
    let r = k / 2;
    let mut best: Option<(T, usize)> = None;
    for dr in 0..k {
        let Some(a) = (i + dr).checked_sub(r).filter(|&a| a < h) else {
            continue;
        };
        for dc in 0..k {
            let Some(b) = (j + dc).checked_sub(r).filter(|&b| b < w) else {
                continue;
            };
            let v = x[a * w + b];
            if best.is_none_or(|(m, _)| v > m) {
                best = Some((v, dr * k + dc));
            }
        }
    }
    best.map_or(0, |b| b.1)
}

fn cpu_planes(l: &Layout, k: usize) -> candle_core::Result<(usize, usize, usize, (usize, usize))> {
    let (n, c, h, w) = l.shape().dims4()?;
    if k.is_multiple_of(2) || k > 15 {
        candle_core::bail!("max pool: kernel {k} must be odd and at most 15");
    }
    let r = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("max pool: x is not contiguous".into()))?;
    Ok((n * c, h, w, r))
}

fn cpu_pool_fwd<T: WithDType>(x: &[T], h: usize, w: usize, k: usize) -> Vec<T> {
    let r = k / 2;
    let mut y = vec![T::zero(); x.len()];
    y.par_chunks_mut(h * w)
        .zip(x.par_chunks(h * w))
        .for_each(|(yp, xp)| {
            for i in 0..h {
                for j in 0..w {
                    let o = argmax_at(xp, h, w, k, i, j);
                    yp[i * w + j] = xp[(i + o / k - r) * w + (j + o % k - r)];
                }
            }
        });
    y
}

fn cpu_pool_bwd<T: WithDType>(x: &[T], dy: &[T], h: usize, w: usize, k: usize) -> Vec<T> {
    let r = k / 2;
    let mut dx = vec![T::zero(); x.len()];
    dx.par_chunks_mut(h * w)
        .zip(x.par_chunks(h * w).zip(dy.par_chunks(h * w)))
        .for_each(|(dxp, (xp, dyp))| {
            for i in 0..h {
                for j in 0..w {
                    let o = argmax_at(xp, h, w, k, i, j);
                    dxp[(i + o / k - r) * w + (j + o % k - r)] += dyp[i * w + j];
                }
            }
        });
    dx
}

impl CustomOp1 for MaxPoolSame {
    fn name(&self) -> &'static str {
        "max-pool-same"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, h, w, (a, b)) = cpu_planes(l, self.k)?;
        let out = match s {
            CpuStorage::F32(v) => CpuStorage::F32(cpu_pool_fwd(&v[a..b], h, w, self.k)),
            CpuStorage::F64(v) => CpuStorage::F64(cpu_pool_fwd(&v[a..b], h, w, self.k)),
            _ => candle_core::bail!("max pool: dtype {:?} on the CPU", s.dtype()),
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::pool::forward(s, l, self.k)
    }
}

impl CustomOp2 for MaxPoolSameGrad {
    fn name(&self) -> &'static str {
        "max-pool-same-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, h, w, (a, b)) = cpu_planes(l1, self.k)?;
        let (_, _, _, (c, d)) = cpu_planes(l2, self.k)?;
        if l1.shape() != l2.shape() {
            candle_core::bail!("max pool backward: x and dy shapes differ");
        }
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                CpuStorage::F32(cpu_pool_bwd(&x[a..b], &g[c..d], h, w, self.k))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(cpu_pool_bwd(&x[a..b], &g[c..d], h, w, self.k))
            }
            _ => candle_core::bail!(
                "max pool backward: dtypes {:?}/{:?} on the CPU",
                s1.dtype(),
                s2.dtype()
            ),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::pool::backward((s1, l1), (s2, l2), self.k)
    }
}

/// Whether the inference pools run as one op ([`InferPoolOp`]) for `x`: on CUDA in f32, f16 or
/// bf16. Elsewhere the composites of this module run (the op's CPU form exists to test it).
pub fn infer_pool_runs(x: &Tensor) -> bool {
    x.device().is_cuda() && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// Runs the inference pool `p` ([`InferPoolOp`]) on `x` (made contiguous first).
pub fn infer_pool(x: &Tensor, p: InferPool) -> Result<Tensor> {
    x.dims4()?;
    Ok(super::ew::contiguous(x)?.apply_op1_no_bwd(&InferPoolOp(p))?)
}

/// The input gradient of [`avg_pool_2x2_s1`] as one op ([`Avg2Grad`]): `dy` (B, C, H−1, W−1) →
/// `dx` (B, C, H, W), `dx[i, j] = (dy[i−1, j−1] + dy[i−1, j] + dy[i, j−1] + dy[i, j]) / 4` over
/// the terms inside `dy`, added in that order in f32 (the order of the composite backward of
/// `crate::model::tape::Ctx::avg_pool_2x2_s1`: the same f32 values). CUDA f32/f16/bf16
/// (`kernels/pool.cu`), CPU f32. Not differentiable.
pub fn avg_pool_2x2_s1_backward(dy: &Tensor) -> Result<Tensor> {
    dy.dims4()?;
    Ok(super::ew::contiguous(dy)?.apply_op1_no_bwd(&Avg2Grad)?)
}

/// The op of [`avg_pool_2x2_s1_backward`].
#[derive(Debug, Clone, Copy)]
pub struct Avg2Grad;

impl CustomOp1 for Avg2Grad {
    fn name(&self) -> &'static str {
        "avg-pool-2x2-s1-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, c, ho, wo) = l.shape().dims4()?;
        let (Some((a, b)), CpuStorage::F32(v)) = (l.contiguous_offsets(), s) else {
            return Err(candle_core::Error::Msg(
                "avg_pool_2x2_s1_backward: the CPU version takes a contiguous f32 gradient".into(),
            ));
        };
        let (h, w) = (ho + 1, wo + 1);
        let mut dx = Vec::with_capacity(n * c * h * w);
        let v = &v[a..b];
        for p in 0..n * c {
            // A plane of dy; empty when H−1 or W−1 is 0 (every dx term is then outside it).
            let g = &v[p * ho * wo..(p + 1) * ho * wo];
            for i in 0..h {
                for j in 0..w {
                    let at = |ii: usize, jj: usize| g[ii * wo + jj];
                    let (up, down, left, right) = (i > 0, i < ho, j > 0, j < wo);
                    let mut s = if up && left { at(i - 1, j - 1) } else { 0.0 };
                    s += if up && right { at(i - 1, j) } else { 0.0 };
                    s += if down && left { at(i, j - 1) } else { 0.0 };
                    s += if down && right { at(i, j) } else { 0.0 };
                    dx.push(s * 0.25);
                }
            }
        }
        Ok((CpuStorage::F32(dx), Shape::from((n, c, h, w))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::pool::avg2_backward(s, l)
    }
}

/// The pools of inference as one op each, no backward: SPPELAN's max pool on channels-last
/// tensors and ADown's `avg_pool2d(2, 1)` on NCHW and channels-last tensors
/// ([`InferPool`]). CUDA: `kernels/pool.cu` (f32, f16, bf16). CPU (f32): the same arithmetic in
/// loops — the four cells of an average summed in the order (i, j), (i, j+1), (i+1, j),
/// (i+1, j+1) in f32 and times 1/4, a max pool's value its window's maximum — the reference the
/// kernels and the composites are tested against.
#[derive(Debug, Clone, Copy)]
pub struct InferPoolOp(pub InferPool);

fn cpu_infer_pool(x: &[f32], dims: (usize, usize, usize, usize), p: InferPool) -> Vec<f32> {
    let (d0, d1, d2, d3) = dims;
    match p {
        InferPool::Avg2Nchw => {
            let (h, w) = (d2, d3);
            let mut y = Vec::with_capacity(d0 * d1 * (h - 1) * (w - 1));
            for plane in x.chunks(h * w) {
                for i in 0..h - 1 {
                    for j in 0..w - 1 {
                        let o = i * w + j;
                        let s = plane[o] + plane[o + 1] + plane[o + w] + plane[o + w + 1];
                        y.push(s * 0.25);
                    }
                }
            }
            y
        }
        InferPool::Avg2Nhwc => {
            let (h, w, c) = (d1, d2, d3);
            let mut y = Vec::with_capacity(d0 * (h - 1) * (w - 1) * c);
            for img in x.chunks(h * w * c) {
                for i in 0..h - 1 {
                    for j in 0..w - 1 {
                        for ch in 0..c {
                            let o = (i * w + j) * c + ch;
                            let r = w * c;
                            let s = img[o] + img[o + c] + img[o + r] + img[o + r + c];
                            y.push(s * 0.25);
                        }
                    }
                }
            }
            y
        }
        InferPool::MaxSameNhwc(k) => {
            let (h, w, c) = (d1, d2, d3);
            let r = k / 2;
            let mut y = Vec::with_capacity(x.len());
            for img in x.chunks(h * w * c) {
                for i in 0..h {
                    for j in 0..w {
                        for ch in 0..c {
                            let mut best = f32::NEG_INFINITY;
                            for a in i.saturating_sub(r)..(i + r + 1).min(h) {
                                for b in j.saturating_sub(r)..(j + r + 1).min(w) {
                                    best = best.max(img[(a * w + b) * c + ch]);
                                }
                            }
                            y.push(best);
                        }
                    }
                }
            }
            y
        }
    }
}

impl CustomOp1 for InferPoolOp {
    fn name(&self) -> &'static str {
        "infer-pool"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = l.shape().dims4()?;
        let (a, b) = l
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("inference pool: x is not contiguous".into()))?;
        let (d0, d1, d2, d3) = dims;
        let shape = match self.0 {
            InferPool::MaxSameNhwc(k) if k % 2 == 1 => l.shape().clone(),
            InferPool::MaxSameNhwc(k) => candle_core::bail!("max pool: kernel {k} must be odd"),
            InferPool::Avg2Nchw if d2 >= 2 && d3 >= 2 => Shape::from((d0, d1, d2 - 1, d3 - 1)),
            InferPool::Avg2Nhwc if d1 >= 2 && d2 >= 2 => Shape::from((d0, d1 - 1, d2 - 1, d3)),
            _ => candle_core::bail!("avg pool 2x2: input {dims:?} is smaller than the window"),
        };
        let CpuStorage::F32(v) = s else {
            candle_core::bail!(
                "inference pool: dtype {:?} on the CPU (f32 only)",
                s.dtype()
            );
        };
        Ok((
            CpuStorage::F32(cpu_infer_pool(&v[a..b], dims, self.0)),
            shape,
        ))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::pool::infer(s, l, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn seeded(shape: (usize, usize, usize, usize), seed: u64) -> Tensor {
        let n = shape.0 * shape.1 * shape.2 * shape.3;
        // A small LCG: values with ties (quantised to 1/8) so that max pools meet equal maxima.
        let mut s = seed;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) % 64) as f32 / 8.0 - 4.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn avg_pool_backward_op_equals_autograd_of_the_composite_exactly() {
        let x = candle_core::Var::from_tensor(&seeded((2, 3, 5, 6), 7)).unwrap();
        let y = avg_pool_2x2_s1(x.as_tensor(), true).unwrap();
        let dy = seeded((2, 3, 4, 5), 9);
        let g = (&y * &dy).unwrap().sum_all().unwrap().backward().unwrap();
        let want = g.get(x.as_tensor()).unwrap();
        let got = avg_pool_2x2_s1_backward(&dy).unwrap();
        assert_eq!(got.dims(), &[2, 3, 5, 6]);
        assert_eq!(
            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        // An empty gradient plane (a 1-row input) gives a zero input gradient, not a panic.
        let dx = avg_pool_2x2_s1_backward(
            &Tensor::zeros((1, 2, 0, 3), DType::F32, &Device::Cpu).unwrap(),
        )
        .unwrap();
        assert_eq!(dx.dims(), &[1, 2, 1, 4]);
        assert_eq!(
            dx.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![0.0; 8]
        );
        // Hand case: dy = [[4, 8]] on a 2x3 input: corners get 1 and 2, the middle 1 + 2 = 3.
        let dy = Tensor::from_vec(vec![4f32, 8.0], (1, 1, 1, 2), &Device::Cpu).unwrap();
        let dx = avg_pool_2x2_s1_backward(&dy).unwrap();
        assert_eq!(
            dx.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![1.0, 3.0, 2.0, 1.0, 3.0, 2.0]
        );
    }

    #[test]
    fn inference_pool_op_equals_the_composites_exactly() {
        let x = seeded((2, 5, 7, 9), 3);
        // NCHW average: the op's order is the differentiable composite's.
        let want = avg_pool_2x2_s1(&x, true).unwrap();
        let got = infer_pool(&x, InferPool::Avg2Nchw).unwrap();
        assert_eq!(got.dims(), &[2, 5, 6, 8]);
        assert_eq!(
            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        // Channels-last: the same values on the transposed tensor.
        let xl = x.permute((0, 2, 3, 1)).unwrap().contiguous().unwrap();
        let to_nchw = |t: Tensor| t.permute((0, 3, 1, 2)).unwrap().contiguous().unwrap();
        let got = to_nchw(infer_pool(&xl, InferPool::Avg2Nhwc).unwrap());
        assert_eq!(
            got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        for k in [3, 5] {
            let want = max_pool_same(&x, k).unwrap();
            let got = to_nchw(infer_pool(&xl, InferPool::MaxSameNhwc(k)).unwrap());
            assert_eq!(
                got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "k {k}"
            );
        }
        // A hand case: the 2x2 means of [[0, 1, 2], [3, 4, 5]] are 2 and 3.
        let t = Tensor::from_vec(
            (0..6).map(|v| v as f32).collect::<Vec<_>>(),
            (1, 1, 2, 3),
            &Device::Cpu,
        )
        .unwrap();
        let m = infer_pool(&t, InferPool::Avg2Nchw).unwrap();
        assert_eq!(
            m.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            vec![2.0, 3.0]
        );
        // Errors, not panics: an even kernel, a window larger than the input.
        assert!(infer_pool(&xl, InferPool::MaxSameNhwc(4)).is_err());
        assert!(infer_pool(&seeded((1, 1, 1, 4), 1), InferPool::Avg2Nchw).is_err());
    }
}
