//! Arguments of the custom ops that both their CPU implementations (`model`, `loss`) and their
//! CUDA launches (`cuda`) read: layout checks of NCHW activations and parameter blocks, the
//! in-place running-statistics update of train-mode BatchNorm, which inference pool runs, and
//! the row-strided layout of the element-wise ops ([`Rows`]). A module of its own so that
//! `cuda` depends on no higher layer (`model` and `loss` call `cuda`, never the reverse).

use candle_core::{Layout, Result};

fn bail(msg: String) -> candle_core::Error {
    candle_core::Error::Msg(msg)
}

/// (N, C, H·W) of an NCHW tensor.
pub type Geometry = (usize, usize, usize);

/// (N, C, H·W) of a contiguous 4-D layout, and the element range it covers in its storage.
/// Errors name `what` (a rank other than 4, a non-contiguous layout).
pub fn geometry(l: &Layout, what: &str) -> Result<(Geometry, (usize, usize))> {
    let (n, c, h, w) = l.shape().dims4()?;
    let range = l
        .contiguous_offsets()
        .ok_or_else(|| bail(format!("{what} is not contiguous")))?;
    Ok(((n, c, h * w), range))
}

/// The element range of a contiguous (rows, C) parameter block. Errors name `what` (another
/// shape, a non-contiguous layout).
pub fn params_range(l: &Layout, rows: usize, c: usize, what: &str) -> Result<(usize, usize)> {
    if l.shape().dims() != [rows, c] {
        return Err(bail(format!(
            "{what} has shape {:?}, expected [{rows}, {c}]",
            l.shape().dims()
        )));
    }
    l.contiguous_offsets()
        .ok_or_else(|| bail(format!("{what} is not contiguous")))
}

/// Device addresses and factors of an in-place running-statistics update of train-mode BN (see
/// `model::bn_act::stats_block_updating`). The addresses must stay valid for the op's launch:
/// they are the storages of the BN's running-statistics variables, which the model owns.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunningUpdate {
    /// Address of the running mean (C,) f32.
    pub mean: u64,
    /// Address of the running variance (C,) f32.
    pub var: u64,
    /// Weight of the batch statistic.
    pub momentum: f64,
    /// Factor that makes the biased batch variance unbiased.
    pub unbiased: f64,
}

/// The pools of inference (no backward), on contiguous tensors: the op
/// [`crate::model::pool::InferPoolOp`] and its CUDA launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferPool {
    /// `MaxPool2d(k, 1, k/2)`, odd `k` ≤ 15, on channels-last (N, H, W, C).
    MaxSameNhwc(usize),
    /// `avg_pool2d(2, stride 1)` on NCHW: (N, C, H, W) → (N, C, H−1, W−1).
    Avg2Nchw,
    /// `avg_pool2d(2, stride 1)` on channels-last: (N, H, W, C) → (N, H−1, W−1, C).
    Avg2Nhwc,
}

/// A row-strided layout, in elements of the operand's storage: `rows` runs of `len` contiguous
/// elements, `stride` apart (`crate::model::ew`, `crate::cuda::ew`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    /// Offset of the first element.
    pub start: usize,
    /// Number of rows.
    pub rows: usize,
    /// Contiguous elements per row.
    pub len: usize,
    /// Distance between row starts (`len` or more).
    pub stride: usize,
}

/// The row form of `l`: a contiguous layout is one row; otherwise dimensions 1.. must be packed
/// (stride 1 innermost, each outer stride the product of the inner sizes) and dimension 0 gives
/// the rows. `None` for any other layout (broadcasts, transposes, narrows of inner dimensions).
pub fn rows_of(l: &Layout) -> Option<Rows> {
    let dims = l.dims();
    let n = l.shape().elem_count();
    if l.is_contiguous() {
        return Some(Rows {
            start: l.start_offset(),
            rows: 1,
            len: n,
            stride: n,
        });
    }
    let strides = l.stride();
    if dims.len() < 2 {
        return None;
    }
    let mut packed = 1usize;
    for i in (1..dims.len()).rev() {
        if dims[i] != 1 && strides[i] != packed {
            return None;
        }
        packed *= dims[i];
    }
    if dims[0] > 1 && strides[0] < packed {
        return None;
    }
    Some(Rows {
        start: l.start_offset(),
        rows: dims[0],
        len: packed,
        stride: if dims[0] > 1 { strides[0] } else { packed },
    })
}
