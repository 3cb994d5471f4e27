//! Host-to-device upload of a training batch's image bytes through page-locked (pinned) staging
//! memory, queued on the stream without a host synchronization.
//!
//! `Tensor::from_slice` copies from pageable memory, which cudarc follows with a synchronization
//! of the stream (the host slice must outlive the copy): the host waits for the kernels already
//! queued, then the copy runs while the GPU idles. From pinned memory the copy is asynchronous:
//! the bytes are copied into a staging buffer kept per thread and size (cudarc's
//! `PinnedHostSlice`, whose event makes the next write into it wait until the copy has read it),
//! and the device copy is queued after the work already on the stream. The training loop uses it
//! to upload the next batch while the current step's replay runs (`crate::train::step`,
//! `StepInput::next`). Used in place of `from_slice` for the batch about to run, it gained
//! nothing: the host copy into the staging buffer then sits where the pageable copy did (16x
//! BCCD on the H200, 2026-12-04: 0.85 against 0.64 s of upload per epoch).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Error, Layout, Result, Shape, Tensor};
use std::cell::RefCell;
use std::sync::Arc;

/// Staging buffers kept per thread: at most this many sizes (a full and a last partial batch).
const KEEP: usize = 2;

thread_local! {
    static STAGING: RefCell<Vec<PinnedHostSlice<u8>>> = const { RefCell::new(Vec::new()) };
}

/// `data` (u8, `shape`'s element count) as a new u8 tensor on the CUDA `device`, copied through
/// pinned staging memory (module docs). Errors: `device` is not CUDA, the length does not match
/// `shape`, CUDA errors (out of memory included).
pub fn upload_u8(data: &[u8], shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
    upload_u8_parts(&[data], shape, device)
}

/// [`upload_u8`] of the concatenation of `parts` (a batch's images, each its own buffer),
/// gathered straight into the staging memory: one host copy of each byte, not two.
pub fn upload_u8_parts(
    parts: &[&[u8]],
    shape: impl Into<Shape>,
    device: &Device,
) -> Result<Tensor> {
    let shape = shape.into();
    let n: usize = parts.iter().map(|p| p.len()).sum();
    if shape.elem_count() != n {
        return Err(Error::Msg(format!(
            "pinned upload: {n} bytes for shape {shape:?}"
        )));
    }
    if !device.is_cuda() {
        return Err(Error::Msg("pinned upload: not a CUDA device".into()));
    }
    // The op's input only carries the device; the result is the uploaded bytes.
    Tensor::zeros(1, DType::U8, device)?.apply_op1_no_bwd(&UploadU8 { parts, shape })
}

/// The op of [`upload_u8_parts`].
struct UploadU8<'a> {
    parts: &'a [&'a [u8]],
    shape: Shape,
}

impl CustomOp1 for UploadU8<'_> {
    fn name(&self) -> &'static str {
        "pinned-upload-u8"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(Error::Msg("pinned upload: CUDA only".into()))
    }

    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let dev = s.device().clone();
        let stream = dev.cuda_stream();
        let n = self.shape.elem_count();
        STAGING.with(|st| {
            let mut st = st.borrow_mut();
            let found = st
                .iter()
                .position(|b| b.len() == n && Arc::ptr_eq(b.context(), stream.context()));
            let i = match found {
                Some(i) => i,
                None => {
                    if st.len() >= KEEP {
                        st.remove(0);
                    }
                    // SAFETY: every byte is written below before the copy reads it.
                    st.push(unsafe { stream.context().alloc_pinned::<u8>(n) }.w()?);
                    st.len() - 1
                }
            };
            let buf = &mut st[i];
            // Waits until the previous copy from this buffer has read it.
            gather(self.parts, buf.as_mut_slice().w()?);
            // SAFETY: the copy below writes all n bytes before anything reads them.
            let mut dst = unsafe { dev.alloc::<u8>(n)? };
            stream.memcpy_htod(&*buf, &mut dst).w()?;
            Ok((
                candle_core::CudaStorage::wrap_cuda_slice(dst, dev.clone()),
                self.shape.clone(),
            ))
        })
    }
}

/// Below this many bytes a batch is gathered on the calling thread.
const PARALLEL_GATHER: usize = 8 << 20;

/// Copies `parts`, one after the other, into `host` (their summed length). A large batch's
/// images are copied on rayon's threads, one image each (a 32-image 480x640 batch is 29 MB: a
/// few ms on one core, in the serving worker's path between two forwards).
fn gather(parts: &[&[u8]], host: &mut [u8]) {
    use rayon::prelude::*;
    let host_len = host.len();
    let mut dst = Vec::with_capacity(parts.len());
    let mut rest = host;
    for p in parts {
        let (head, tail) = rest.split_at_mut(p.len());
        dst.push(head);
        rest = tail;
    }
    if parts.len() > 1 && host_len >= PARALLEL_GATHER {
        dst.into_par_iter()
            .zip(parts.par_iter())
            .for_each(|(d, p)| d.copy_from_slice(p));
    } else {
        for (d, p) in dst.into_iter().zip(parts) {
            d.copy_from_slice(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gather;

    /// Both paths (one thread below `PARALLEL_GATHER`, rayon above) lay the parts end to end.
    #[test]
    fn gather_lays_parts_end_to_end() {
        for (n, len) in [(3usize, 1000usize), (4, 3 << 20)] {
            let parts: Vec<Vec<u8>> = (0..n)
                .map(|k| (0..len + k).map(|i| (i * 7 + k * 31) as u8).collect())
                .collect();
            let refs: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
            let mut host = vec![0u8; refs.iter().map(|p| p.len()).sum()];
            gather(&refs, &mut host);
            assert_eq!(host, parts.concat(), "{n} parts of {len} bytes");
        }
    }
}
