//! Data-parallel training: the [`Collective`] operations several training ranks use to stay one
//! model, their implementations, and the per-rank share of a batch.
//!
//! # The protocol
//! Every rank runs the same training loop on its share of each loader batch
//! ([`crate::data::loader::shard_range`]: the global batch of `--batch` images, as a single-device run would load it,
//! split into `world` contiguous slices). Per batch, in this order, every rank calls:
//! 1. [`Collective::agree`] at the batch start: stop requests (any rank's SIGINT/SIGTERM) and
//!    rank 0's mid-epoch checkpoint timer become one decision;
//! 2. its step ([`crate::train::step::step`]) on its share;
//! 3. [`Collective::agree`] on the outcome: a non-finite loss on any rank drops the batch on
//!    every rank (the NaN guard and its rollback then run identically everywhere), and every
//!    rank takes the smallest micro-batch any rank's out-of-memory halving reached;
//! 4. [`Collective::all_reduce_sum`] of the batch's parameter gradients (one flat f32 buffer in
//!    the optimizer's parameter order, with one presence slot per parameter), so that every
//!    rank holds the sum over the whole global batch, as the official DDP (`loss *= WORLD_SIZE`
//!    then DDP's mean, i.e. a sum) and as a single device running the shares as micro-batches;
//! 5. at an optimizer step, [`Collective::broadcast`] of rank 0's BN running statistics (DDP's
//!    `broadcast_buffers`), then the same clip, optimizer and EMA update on every rank.
//!
//! At an epoch's end rank 0 alone validates, writes `results.csv`, the plots and the
//! checkpoints, and broadcasts what the others need (the epoch count after `--time`, the early
//! stop, a stop during validation); the others wait in that broadcast, which has the same
//! timeout as every other operation.
//!
//! # Never hangs
//! Every operation has a timeout ([`Collective::timeout`]); a rank that is gone (its thread or
//! process ended, its connection closed) or that failed ([`Collective::abort`] with the cause)
//! makes every other rank's next operation fail with one [`DistError`] naming that rank.
//!
//! # Implementations
//! - [`local::LocalRank`]: ranks as threads of one process (std channels), for tests;
//! - [`socket::SocketRank`]: ranks as processes over TCP (loopback or a network), rank 0 the
//!   hub (torchrun's `MASTER_ADDR:MASTER_PORT`);
//! - [`nccl::NcclRank`] (`cuda` feature): the sums and broadcasts on the GPUs through NCCL, the
//!   agreements and the naming of a rank at fault through a control-plane rank (the socket one);
//!   chosen by `yolo9 train` for CUDA devices unless [`BACKEND_ENV`] says `tcp`.
//!
//! Every implementation gives every rank bitwise the same sum. The local and socket ones add in
//! rank order (`((r0 + r1) + r2) + …`), which equals a single device's micro-batch accumulation
//! (`prev + next`, in micro-batch order); NCCL does too with one or two ranks, and in its own
//! order with more.

pub mod env;
pub mod launch;
pub mod local;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod socket;
pub mod sync;

use candle_core::{DType, Tensor};
use std::time::Duration;

/// Environment variable: the backend of a group, `nccl` or `tcp` ([`env::Backend`]).
pub const BACKEND_ENV: &str = "YOLO9_DIST_BACKEND";

/// The default timeout of every collective operation (`--dist-timeout`): 30 minutes, as
/// `torch.distributed`'s default. It must cover rank 0's validation, which the others wait for.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Why a collective operation failed. Every variant names the rank at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DistError {
    /// A rank's thread or process ended or its connection closed (it died, was killed, or
    /// returned an error without [`Collective::abort`]).
    #[error(
        "rank {rank} is gone: its connection closed during {op} (the process died, was killed \
         or stopped on an error; see its own output)"
    )]
    Gone {
        /// The rank that is gone.
        rank: usize,
        /// The operation, e.g. `all-reduce #12`.
        op: String,
    },
    /// A rank stopped on an error and said why ([`Collective::abort`]).
    #[error("rank {rank} failed: {why}")]
    Failed {
        /// The rank that failed.
        rank: usize,
        /// Its error.
        why: String,
    },
    /// No word from a rank within the timeout.
    #[error(
        "{op}: no word from rank {rank} within {secs:.1} s (the timeout, --dist-timeout); it \
         hangs or is far behind"
    )]
    Timeout {
        /// The rank waited for.
        rank: usize,
        /// The operation.
        op: String,
        /// The timeout in seconds.
        secs: f64,
    },
    /// The ranks disagree on the sequence of operations or their sizes (a bug), or the group
    /// could not be formed (bad rank/world, address in use, a rank that never connected).
    #[error("{0}")]
    Setup(String),
    /// Moving an operand between this rank's device and the exchange failed (a device error,
    /// e.g. out of memory, on this rank).
    #[error("the exchange's device operation failed: {0}")]
    Device(String),
}

impl DistError {
    /// The rank at fault, or `None` for [`DistError::Setup`] and [`DistError::Device`] (no one
    /// rank, or this one).
    pub fn rank(&self) -> Option<usize> {
        match self {
            DistError::Gone { rank, .. }
            | DistError::Failed { rank, .. }
            | DistError::Timeout { rank, .. } => Some(*rank),
            DistError::Setup(_) | DistError::Device(_) => None,
        }
    }
}

/// What [`Collective::agree`] returns: every rank's flags, the same on every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    /// `flags[r]`: what rank `r` contributed.
    pub flags: Vec<u32>,
}

impl Agreement {
    /// The ranks whose flags have any bit of `mask`, in rank order.
    pub fn ranks_with(&self, mask: u32) -> Vec<usize> {
        (0..self.flags.len())
            .filter(|&r| self.flags[r] & mask != 0)
            .collect()
    }

    /// True when any rank set a bit of `mask`.
    pub fn any(&self, mask: u32) -> bool {
        self.flags.iter().any(|f| f & mask != 0)
    }
}

/// The largest value [`Collective::agree`] carries exactly (it travels as an f32 in a sum).
pub const AGREE_MAX: u32 = 1 << 24;

/// The operations data-parallel training needs, over `world` ranks numbered `0..world`. Every
/// rank must call the same operations in the same order with buffers of the same length; each
/// call blocks until all ranks made it (or fails with a [`DistError`] naming a rank after at most
/// [`Collective::timeout`]). After an error the group is unusable.
pub trait Collective: Send {
    /// This rank, `0..world`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world(&self) -> usize;
    /// The timeout of one operation.
    fn timeout(&self) -> Duration;
    /// Replaces `buf` (f32, any length, the same on every rank) by the element-wise sum over
    /// the ranks, taken in rank order, bitwise the same on every rank.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), DistError>;
    /// Replaces `buf` on every rank by rank 0's.
    fn broadcast(&mut self, buf: &mut [f32]) -> Result<(), DistError>;
    /// Tells the other ranks (best effort, never blocks past the timeout) that this rank stops on
    /// the error `why`: their pending or next operation fails with [`DistError::Failed`].
    fn abort(&mut self, why: &str);

    /// [`Collective::all_reduce_sum`] of a tensor (any shape and float dtype, the same element
    /// count on every rank): the sum as a flat f32 tensor on `t`'s device. Implementations whose
    /// transport is the device (NCCL) sum it there; the default copies it through the host.
    fn all_reduce_sum_tensor(&mut self, t: &Tensor) -> Result<Tensor, DistError> {
        let mut v = host_f32(t)?;
        self.all_reduce_sum(&mut v)?;
        Tensor::from_vec(v, t.elem_count(), t.device()).map_err(device_error)
    }

    /// [`Collective::broadcast`] of a tensor, as [`Collective::all_reduce_sum_tensor`].
    fn broadcast_tensor(&mut self, t: &Tensor) -> Result<Tensor, DistError> {
        let mut v = host_f32(t)?;
        self.broadcast(&mut v)?;
        Tensor::from_vec(v, t.elem_count(), t.device()).map_err(device_error)
    }

    /// Returns once every rank called it.
    fn barrier(&mut self) -> Result<(), DistError> {
        let mut b = [0f32];
        self.all_reduce_sum(&mut b)
    }

    /// [`Collective::all_reduce_sum`] divided by the world size.
    fn all_reduce_mean(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        self.all_reduce_sum(buf)?;
        let w = self.world() as f32;
        buf.iter_mut().for_each(|v| *v /= w);
        Ok(())
    }

    /// Every rank's `flags` (each below [`AGREE_MAX`]), the same [`Agreement`] on every rank, so
    /// that all take the same decision (stop, drop a batch, roll back, the micro-batch).
    fn agree(&mut self, flags: u32) -> Result<Agreement, DistError> {
        if flags >= AGREE_MAX {
            return Err(DistError::Setup(format!(
                "agree: flags {flags} on rank {} are not below {AGREE_MAX}",
                self.rank()
            )));
        }
        let mut buf = vec![0f32; self.world()];
        buf[self.rank()] = flags as f32;
        self.all_reduce_sum(&mut buf)?;
        Ok(Agreement {
            flags: buf.iter().map(|&v| v as u32).collect(),
        })
    }
}

fn device_error(e: candle_core::Error) -> DistError {
    DistError::Device(e.to_string())
}

/// `t`'s elements as f32 on the host, in row-major order.
fn host_f32(t: &Tensor) -> Result<Vec<f32>, DistError> {
    t.flatten_all()
        .and_then(|f| f.to_dtype(DType::F32))
        .and_then(|f| f.to_vec1::<f32>())
        .map_err(device_error)
}

/// A rank's place in a group: `rank` of `world`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
}
