//! Synchronised batch normalisation across data-parallel ranks (`yolo9 train --sync-bn`, the
//! official `--sync-bn`, i.e. PyTorch's `SyncBatchNorm`): in a training forward every BN layer
//! normalises with the mean and variance of the whole global micro-batch (all ranks' images),
//! and its backward sums the two per-channel gradient reductions over the ranks, so that `dx`
//! is the gradient of the normalisation over all ranks (the parameter gradients `dγ`, `dβ` stay
//! each rank's own, summed later with the other gradients).
//!
//! The model does not know about ranks: the trainer installs a [`BnSync`] for the duration of a
//! training step ([`with_sync`], thread-local), and the fused BN op
//! ([`crate::model::conv::BatchNorm2d::fused_block`] forward, [`crate::model::bn_act::bn_act_backward`])
//! asks [`active`] and [`sum`]. Every rank must run the same BN layers in the same order, which
//! the same model and the same number of micro-batches ([`agreed_split`]) guarantee.

use candle_core::{Result, Tensor};
use std::cell::Cell;

/// The collective the BN layers use: the element-wise sum over the ranks of a flat f32 tensor.
pub trait BnSync {
    /// This rank, `0..world`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world(&self) -> usize;
    /// The element-wise sum over the ranks of `t` (flat f32, the same length on every rank), on
    /// `t`'s device.
    fn sum(&mut self, t: &Tensor) -> Result<Tensor>;
}

type Hook = *mut (dyn BnSync + 'static);

thread_local! {
    static HOOK: Cell<Option<Hook>> = const { Cell::new(None) };
}

/// Runs `f` with `s` as this thread's BN synchronisation (nested calls are refused: `f` runs
/// unsynchronised inside another's scope is a bug, so it panics).
pub fn with_sync<R>(s: &mut dyn BnSync, f: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            HOOK.with(|h| h.set(None));
        }
    }
    // SAFETY: the pointer is only dereferenced by `sum`/`rank`/`world` below while `f` runs (the
    // hook is cleared when this function returns or unwinds), during which `s` is borrowed
    // mutably by this function and so used by no one else.
    let p: Hook = unsafe { std::mem::transmute::<*mut (dyn BnSync + '_), Hook>(s) };
    HOOK.with(|h| {
        assert!(h.get().is_none(), "BN synchronisation installed twice");
        h.set(Some(p));
    });
    let _reset = Reset;
    f()
}

/// Whether a [`with_sync`] scope is active on this thread.
pub fn active() -> bool {
    HOOK.with(|h| h.get().is_some())
}

fn with_hook<R>(f: impl FnOnce(&mut dyn BnSync) -> Result<R>) -> Result<Option<R>> {
    match HOOK.with(|h| h.get()) {
        // SAFETY: see `with_sync`; the reference does not outlive this call.
        Some(p) => f(unsafe { &mut *p }).map(Some),
        None => Ok(None),
    }
}

/// The sum over the ranks of `t` (flat f32), or `None` outside a [`with_sync`] scope.
pub fn sum(t: &Tensor) -> Result<Option<Tensor>> {
    with_hook(|s| s.sum(t))
}

/// Every rank's `values` (the same count on each), in rank order, or `None` outside a scope:
/// an all-gather made of one sum (each rank fills its own slot of a zero buffer).
pub fn gather(values: &[f32], device: &candle_core::Device) -> Result<Option<Vec<Vec<f32>>>> {
    with_hook(|s| {
        let (r, w, k) = (s.rank(), s.world(), values.len());
        let mut buf = vec![0f32; w * k];
        buf[r * k..(r + 1) * k].copy_from_slice(values);
        let t = s.sum(&Tensor::from_vec(buf, w * k, device)?)?;
        let v = t.to_vec1::<f32>()?;
        Ok(v.chunks(k.max(1)).map(|c| c.to_vec()).collect())
    })
}

/// The micro-batch sizes of a rank's `n` images at micro-batch `micro`: outside a scope,
/// `micro`-sized chunks (the last smaller); inside one, every rank takes the same number of
/// micro-batches — the most any rank needs, but no more than the fewest images any rank has —
/// and splits its images into that many near-equal parts (the first ones one larger), so that
/// the BN layers of every micro-batch meet on every rank.
pub fn agreed_split(n: usize, micro: usize, device: &candle_core::Device) -> Result<Vec<usize>> {
    let micro = micro.max(1);
    let own = n.div_ceil(micro);
    let k = match gather(&[own as f32, n as f32], device)? {
        None => {
            return Ok((0..own)
                .map(|i| micro.min(n - i * micro))
                .collect::<Vec<_>>())
        }
        Some(all) => {
            let most = all.iter().map(|v| v[0] as usize).max().unwrap_or(own);
            let fewest = all.iter().map(|v| v[1] as usize).min().unwrap_or(n);
            most.min(fewest).max(1)
        }
    };
    Ok((0..k).map(|i| n / k + usize::from(i < n % k)).collect())
}

/// The parameter block `p` (4, C) = [γ; β; μ; σ²] of this rank's `n` values per channel, with
/// μ and σ² (biased) replaced by those of every rank's values together (the pooled mean and
/// variance, computed in f64 from each rank's, in rank order, so every rank gets the same);
/// returns the block and the count of all values. Outside a scope: `p` and `n`.
pub fn pooled_block(p: &Tensor, n: f64) -> Result<(Tensor, f64)> {
    let c = p.dim(1)?;
    let stats = p.narrow(0, 2, 2)?.to_dtype(candle_core::DType::F32)?;
    let mut mine = stats.flatten_all()?.to_vec1::<f32>()?;
    mine.push(n as f32);
    let Some(all) = gather(&mine, p.device())? else {
        return Ok((p.clone(), n));
    };
    let total: f64 = all.iter().map(|v| v[2 * c] as f64).sum();
    let mut mean = vec![0f64; c];
    let mut var = vec![0f64; c];
    for v in &all {
        let w = v[2 * c] as f64 / total;
        for k in 0..c {
            mean[k] += w * v[k] as f64;
        }
    }
    for v in &all {
        let w = v[2 * c] as f64 / total;
        for k in 0..c {
            let d = v[k] as f64 - mean[k];
            var[k] += w * (v[c + k] as f64 + d * d);
        }
    }
    let pooled: Vec<f32> = mean.iter().chain(&var).map(|&v| v as f32).collect();
    let pooled = Tensor::from_vec(pooled, (2, c), p.device())?.to_dtype(p.dtype())?;
    Ok((Tensor::cat(&[&p.narrow(0, 0, 2)?, &pooled], 0)?, total))
}

/// The backward block `q` (6, C) = [p; Σg; Σg·x̂] of this rank's `m` values per channel with
/// rows 4 and 5 summed over the ranks and scaled by `m / M` (M the values of all ranks), so
/// that the input-gradient kernel's division by `m` divides the sums by `M`. `None` outside a
/// scope.
pub fn global_grad_sums(q: &Tensor, m: f64) -> Result<Option<Tensor>> {
    if !active() {
        return Ok(None);
    }
    let c = q.dim(1)?;
    let dev = q.device();
    let rows = q.narrow(0, 4, 2)?.to_dtype(candle_core::DType::F32)?;
    let t = Tensor::cat(
        &[
            &rows.flatten_all()?,
            &Tensor::from_vec(vec![m as f32], 1, dev)?,
        ],
        0,
    )?;
    let Some(s) = sum(&t)? else {
        return Ok(None);
    };
    let m_all = s.narrow(0, 2 * c, 1)?.to_vec1::<f32>()?[0] as f64;
    let rows = (s.narrow(0, 0, 2 * c)?.reshape((2, c))? * (m / m_all))?.to_dtype(q.dtype())?;
    Ok(Some(Tensor::cat(&[&q.narrow(0, 0, 4)?, &rows], 0)?))
}

/// Whether any rank's `flag` is set (every rank learns the same), or `flag` outside a scope:
/// under `--sync-bn` a rank whose loss is not finite and skips its backward would leave the
/// others waiting in theirs, so the ranks decide together.
pub fn any(flag: bool, device: &candle_core::Device) -> Result<bool> {
    Ok(match gather(&[f32::from(u8::from(flag))], device)? {
        None => flag,
        Some(all) => all.iter().any(|v| v[0] > 0.0),
    })
}
