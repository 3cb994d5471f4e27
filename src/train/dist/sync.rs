//! What the training loop exchanges through a [`Collective`]: a batch's outcome (the agreed NaN
//! decision and micro-batch, then the gradients and loss items summed over the ranks) and rank
//! 0's BN running statistics. See the protocol in [`crate::train::dist`].

use super::Collective;
use crate::model::yolov9::YoloV9Train;
use crate::train::optimizer::Optimizer;
use anyhow::Result;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};

/// A batch's outcome on this rank, before the exchange.
pub struct Local {
    /// The parameter gradients of this rank's share (`None`: a non-finite loss).
    pub grads: Option<GradStore>,
    /// Mean loss items `[box, cls, dfl, seg]` of this rank's share.
    pub items: [f64; 4],
    /// Images in this rank's share.
    pub len: usize,
    /// This rank's micro-batch after its out-of-memory halvings.
    pub micro: usize,
}

/// The outcome every rank agrees on.
pub struct Global {
    /// The gradients summed over the ranks (parameters that no rank has a gradient for stay
    /// absent); `None` when any rank's loss was not finite (the batch is dropped everywhere).
    pub grads: Option<GradStore>,
    /// Loss items averaged over the whole global batch (image-weighted), or this rank's own
    /// (NaN) items when the batch is dropped.
    pub items: [f64; 4],
    /// Images of the global batch.
    pub len: usize,
    /// The ranks whose loss was not finite.
    pub nan_ranks: Vec<usize>,
    /// The smallest micro-batch of any rank: every rank continues with it.
    pub micro: usize,
}

const NAN: u32 = 1;

/// Exchanges this rank's batch outcome: one [`Collective::agree`] (NaN flags and micro-batches),
/// then, unless a rank's loss was not finite, one [`Collective::all_reduce_sum_tensor`] of the
/// flat f32 tensor `[gradients of opt.params() in order (zeros where absent) | one presence count
/// per parameter | items · len | len]`, built on `device` (so that NCCL sums it there). The summed
/// gradients come back on `device` with their parameters' shapes and dtypes.
pub fn exchange(
    comm: &mut dyn Collective,
    local: Local,
    opt: &Optimizer,
    device: &Device,
) -> Result<Global> {
    let micro = local.micro.clamp(1, (super::AGREE_MAX >> 2) as usize - 1) as u32;
    let a = comm.agree(u32::from(local.grads.is_none()) | (micro << 1))?;
    let nan_ranks = a.ranks_with(NAN);
    let micro = a.flags.iter().map(|f| (f >> 1) as usize).min().unwrap_or(1);
    if !nan_ranks.is_empty() {
        return Ok(Global {
            grads: None,
            items: local.items,
            len: local.len,
            nan_ranks,
            micro,
        });
    }
    let params = opt.params();
    let grads = local.grads.unwrap_or_default();
    // One flat f32 tensor on the device: the gradients, zeros where absent, then the tail.
    let mut parts = Vec::with_capacity(params.len() + 1);
    let mut tail = vec![0f32; params.len() + 5];
    for (k, p) in params.iter().enumerate() {
        let n = p.var.elem_count();
        match grads.get(p.var.as_tensor()) {
            Some(g) => {
                parts.push(g.to_dtype(DType::F32)?.flatten_all()?);
                tail[k] = 1.0;
            }
            None => parts.push(Tensor::zeros(n, DType::F32, device)?),
        }
    }
    let t0 = params.len();
    for (j, v) in local.items.iter().enumerate() {
        tail[t0 + j] = (*v * local.len as f64) as f32;
    }
    tail[t0 + 4] = local.len as f32;
    parts.push(Tensor::from_vec(tail, params.len() + 5, device)?);
    let flat = Tensor::cat(&parts, 0)?;
    drop(parts);
    let total = flat.elem_count() - (params.len() + 5);
    let sum = comm.all_reduce_sum_tensor(&flat)?;
    drop(flat);
    let buf = sum.narrow(0, total, params.len() + 5)?.to_vec1::<f32>()?;
    let mut out = GradStore::default();
    let mut off = 0;
    for (k, p) in params.iter().enumerate() {
        let n = p.var.elem_count();
        if buf[k] > 0.0 {
            let t = sum
                .narrow(0, off, n)?
                .reshape(p.var.shape())?
                .to_dtype(p.var.dtype())?;
            out.insert(p.var.as_tensor(), t);
        }
        off += n;
    }
    // `buf`: the presence counts, then the items and the image count.
    let at = params.len();
    let len = buf[at + 4] as usize;
    let items = std::array::from_fn(|j| buf[at + j] as f64 / len.max(1) as f64);
    Ok(Global {
        grads: Some(out),
        items,
        len,
        nan_ranks,
        micro,
    })
}

/// Every rank takes rank 0's BN running statistics and batch counter (DDP's
/// `broadcast_buffers`): one [`Collective::broadcast`].
pub fn broadcast_bn(comm: &mut dyn Collective, model: &YoloV9Train) -> Result<()> {
    let mut buf = model.bn_flat()?;
    comm.broadcast(&mut buf)?;
    model.set_bn_flat(&buf)
}

/// A rank's [`Collective`] as the BN layers' synchronisation under `--sync-bn`
/// ([`crate::model::bn_sync::BnSync`]): its sum is [`Collective::all_reduce_sum_tensor`], an
/// error of the group becoming the op's error (prefixed `--sync-bn:`).
pub struct BnSyncOf<'a>(pub &'a mut dyn Collective);

impl crate::model::bn_sync::BnSync for BnSyncOf<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world(&self) -> usize {
        self.0.world()
    }
    fn sum(&mut self, t: &Tensor) -> candle_core::Result<Tensor> {
        self.0
            .all_reduce_sum_tensor(t)
            .map_err(|e| candle_core::Error::Msg(format!("--sync-bn: {e}")))
    }
}
