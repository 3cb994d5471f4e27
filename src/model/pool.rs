//! Pooling and upsampling used by YOLOv9, written so that they match PyTorch numerically and
//! have correct gradients under candle's autograd (candle's own backward refuses
//! `avg_pool2d(2, stride 1)` and `max_pool2d(5, stride 1, pad 2)`).

use anyhow::Result;
use candle_core::Tensor;

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
    let (b, c, h, w) = x.dims4()?;
    let y = x
        .reshape((b, c, h, 1, w, 1))?
        .broadcast_as((b, c, h, 2, w, 2))?
        .reshape((b, c, 2 * h, 2 * w))?;
    Ok(y)
}
