//! Element-wise ops of the training graph on row-strided operands: `a + b` (the forward's
//! additions and the tape's gradient sums) and a contiguous copy (channel slices before a
//! convolution or a BatchNorm kernel), one pass each.
//!
//! candle's CUDA add and copy run one element per thread, and on a strided operand (the channel
//! slice that a concatenation's backward or a `chunk` hands on) they decode every element's
//! index through all dimensions: in the bs64 mixed-precision training step (ncu, H200) its
//! `badd`/`ucopy` kernels took 56 and 19 ms of the step's 270 ms at 0.35–1 TB/s. Here an
//! operand is [`Rows`] ([`rows_of`]): `rows` runs of `len` contiguous elements `stride` apart,
//! which covers a contiguous tensor (one row) and a narrow along dimension 1 of a contiguous NCHW
//! tensor (N rows of n·H·W); the kernels (`kernels/ew.cu`) move 16-byte vectors.
//!
//! [`add`] and [`contiguous`] use the ops on CUDA for f32/f16/bf16 operands of that form outside
//! candle's autograd, and candle's ops everywhere else (the CPU, other layouts, other dtypes,
//! tensors candle's autograd tracks), with the same values: the sum is computed in f32 and
//! rounded once to the element type, as candle's.

use crate::op_args::{rows_of, Rows};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Error, Layout, Result, Shape, Tensor};

/// Whether the fast ops apply to `t`: a non-empty CUDA tensor of f32/f16/bf16 in row form that
/// candle's autograd does not track (the ops have no backward: the tape's forward runs on
/// detached tensors and records its own nodes; a plain training forward keeps candle's ops).
fn applies(t: &Tensor) -> bool {
    !t.track_op()
        && t.elem_count() > 0
        && t.device().is_cuda()
        && matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && rows_of(t.layout()).is_some()
}

/// `a + b` for tensors of one shape and dtype (see the module docs for where the row kernel
/// runs). Errors: as candle's add (shape or dtype mismatch, device errors).
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dims() == b.dims() && a.dtype() == b.dtype() && applies(a) && applies(b) {
        return a.apply_op2_no_bwd(b, &AddRows);
    }
    a + b
}

/// `t` in a contiguous layout: `t` itself when it already is, the row kernel's copy for a CUDA
/// row-form tensor, candle's `contiguous` otherwise.
pub fn contiguous(t: &Tensor) -> Result<Tensor> {
    if t.is_contiguous() {
        return Ok(t.clone());
    }
    if applies(t) {
        return t.apply_op1_no_bwd(&CopyRows);
    }
    t.contiguous()
}

fn bail(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("ew: {msg}"))
}

fn rows_or_err(l: &Layout, what: &str) -> Result<Rows> {
    rows_of(l).ok_or_else(|| bail(format!("{what} is not in row form: {l:?}")))
}

/// The elements of row form `r` of an f32 CPU storage, in order.
fn cpu_rows(s: &CpuStorage, r: Rows) -> Result<Vec<f32>> {
    let CpuStorage::F32(v) = s else {
        return Err(bail(format!(
            "the CPU version runs f32, not {:?}",
            s.dtype()
        )));
    };
    let mut out = Vec::with_capacity(r.rows * r.len);
    for i in 0..r.rows {
        let a = r.start + i * r.stride;
        out.extend_from_slice(
            v.get(a..a + r.len)
                .ok_or_else(|| bail("storage is shorter than its layout"))?,
        );
    }
    Ok(out)
}

/// The op of [`add`]: args `a`, `b` (one shape, one dtype, row form) → `a + b`, contiguous.
/// The CPU version (f32) is the reference of the tests.
#[derive(Debug, Clone, Copy)]
pub struct AddRows;

impl CustomOp2 for AddRows {
    fn name(&self) -> &'static str {
        "ew-add-rows"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if l1.dims() != l2.dims() {
            return Err(bail("a and b shapes differ"));
        }
        let a = cpu_rows(s1, rows_or_err(l1, "a")?)?;
        let b = cpu_rows(s2, rows_or_err(l2, "b")?)?;
        let y = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        if l1.dims() != l2.dims() {
            return Err(bail("a and b shapes differ"));
        }
        let (ra, rb) = (rows_or_err(l1, "a")?, rows_or_err(l2, "b")?);
        let (rows, len) = if ra.rows == rb.rows {
            (ra.rows, ra.len)
        } else {
            // One operand contiguous (one row), the other a slice: both as the slice's rows.
            let r = if ra.rows > 1 { ra } else { rb };
            (r.rows, r.len)
        };
        let as_rows = |x: Rows| Rows {
            rows,
            len,
            stride: if x.rows == rows { x.stride } else { len },
            ..x
        };
        crate::cuda::ew::add((s1, as_rows(ra)), (s2, as_rows(rb)), rows, len, l1.shape())
    }
}

/// The op of [`contiguous`]: a row-form tensor → a contiguous copy. The CPU version (f32) is the
/// reference of the tests.
#[derive(Debug, Clone, Copy)]
pub struct CopyRows;

impl CustomOp1 for CopyRows {
    fn name(&self) -> &'static str {
        "ew-copy-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = cpu_rows(s, rows_or_err(l, "x")?)?;
        Ok((CpuStorage::F32(y), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let r = rows_or_err(l, "x")?;
        crate::cuda::ew::copy((s, r), r.rows, r.len, l.shape())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn ramp(shape: &[usize], k: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i as f32) * k - 3.0).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn rows_of_contiguous_channel_slices_and_others() {
        let x = ramp(&[2, 6, 3, 4], 1.0);
        assert_eq!(
            rows_of(x.layout()),
            Some(Rows {
                start: 0,
                rows: 1,
                len: 144,
                stride: 144
            })
        );
        // Channels 2..5 of 6: 2 rows of 3·12 elements, 6·12 apart, from element 2·12.
        let s = x.narrow(1, 2, 3).unwrap();
        assert_eq!(
            rows_of(s.layout()),
            Some(Rows {
                start: 24,
                rows: 2,
                len: 36,
                stride: 72
            })
        );
        // One image of a slice: contiguous again.
        let one = s.narrow(0, 1, 1).unwrap();
        assert_eq!(
            rows_of(one.layout()),
            Some(Rows {
                start: 96,
                rows: 1,
                len: 36,
                stride: 36
            })
        );
        // A width slice, a transpose and a broadcast are not row form.
        assert_eq!(rows_of(x.narrow(3, 1, 2).unwrap().layout()), None);
        assert_eq!(rows_of(x.transpose(2, 3).unwrap().layout()), None);
        let b = ramp(&[1, 6, 1, 1], 1.0).broadcast_as((2, 6, 3, 4)).unwrap();
        assert_eq!(rows_of(b.layout()), None);
    }

    #[test]
    fn add_and_copy_rows_equal_candle_on_channel_slices() {
        let x = ramp(&[3, 8, 2, 5], 0.5);
        let y = ramp(&[3, 4, 2, 5], -0.25);
        let s = x.narrow(1, 3, 4).unwrap();
        // slice + contiguous, contiguous + slice, slice + slice.
        let cases = [
            (s.clone(), y.clone()),
            (y.clone(), s.clone()),
            (s.clone(), x.narrow(1, 0, 4).unwrap()),
        ];
        for (a, b) in cases {
            let want = (&a + &b)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let got = a.apply_op2_no_bwd(&b, &AddRows).unwrap();
            assert!(got.is_contiguous());
            assert_eq!(got.dims(), &[3, 4, 2, 5]);
            assert_eq!(got.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
        }
        let want = s
            .contiguous()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let got = s.apply_op1_no_bwd(&CopyRows).unwrap();
        assert_eq!(got.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
        // Element 0 of the slice is x[0, 3, 0, 0] = 30·0.5 − 3.
        assert_eq!(want[0], 12.0);
    }

    #[test]
    fn public_add_and_contiguous_keep_candle_values_on_the_cpu() {
        let x = ramp(&[2, 4, 3, 3], 1.5);
        let s = x.narrow(1, 1, 2).unwrap();
        let t = x.narrow(1, 2, 2).unwrap();
        let got = add(&s, &t)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let want = (&s + &t)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(got, want);
        let c = contiguous(&s).unwrap();
        assert!(c.is_contiguous());
        assert_eq!(
            c.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            s.contiguous()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        );
    }
}
