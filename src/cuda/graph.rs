//! A fixed-shape forward pass captured once as a CUDA graph and replayed per call.
//!
//! An inference forward of YOLOv9-s is a few hundred small kernels; launched one by one from the
//! host, the host's enqueue time, not the GPU, sets the latency at small batches. A CUDA graph
//! (CUDA programming guide, "CUDA Graphs"; what `torch.cuda.CUDAGraph` does) records the whole
//! sequence once and replays it with one launch.
//!
//! [`CapturedForward::capture`] runs the forward once normally (the warm-up: cuDNN algorithms
//! are chosen, and candle's small host-to-device parameter uploads are cached, see
//! `CudaDevice::enable_cuda_graph_htod_cache`), then again with candle's stream in capture mode,
//! and instantiates the graph with `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`. Memory the
//! forward allocates and frees becomes allocation and free nodes of the graph (cudarc allocates
//! stream-ordered, `cuMemAllocAsync`), at addresses that stay fixed for the graph's life, so the
//! input buffer, the weights and the output tensor held here are the same memory at every
//! replay. [`CapturedForward::run`] copies a new input into the input buffer, replays, and
//! returns a copy of the output, so every call's result is independent of the next replay.
//!
//! The first replay is compared with the warm-up's output; a capture that does not reproduce it
//! (beyond `1e-3` of the output's scale) is refused, and callers fall back to the ordinary
//! forward. Requirements: the device's event tracking is off (yolo9's devices, see
//! [`crate::device`]) and no other thread enqueues work on the device's stream while capturing
//! (callers serialise their forwards).

use candle_core::{CudaDevice, DType, Error, Result, Tensor};
use cudarc::driver::safe::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Msg(format!("CUDA graph: {msg}"))
}

/// A forward pass captured for one input shape and dtype.
pub struct CapturedForward {
    // Dropped first: the graph is destroyed before the memory its last replay left allocated
    // (the output) is freed.
    graph: CudaGraph,
    input: Tensor,
    output: Tensor,
}

impl std::fmt::Debug for CapturedForward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedForward")
            .field("input", &self.input.shape())
            .field("output", &self.output.shape())
            .finish()
    }
}

/// Largest difference between `a` and `b` relative to `b`'s largest magnitude (at least 1).
fn relative_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    let a = a.to_dtype(DType::F32)?;
    let b = b.to_dtype(DType::F32)?;
    let scale = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?.max(1.0);
    let d = (a - &b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    Ok(d / scale)
}

impl CapturedForward {
    /// Captures `forward` for inputs shaped and typed like `x` (a contiguous tensor on `dev`);
    /// returns the capture and the output of its first replay on `x`.
    ///
    /// Errors: the device tracks events, `forward` fails in the warm-up or inside the capture
    /// (e.g. an operation that copies to the host), instantiation fails, or the first replay
    /// differs from the warm-up. The stream is out of capture mode afterwards in every case.
    pub fn capture(
        dev: &CudaDevice,
        x: &Tensor,
        forward: &dyn Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<(Self, Tensor)> {
        if dev.is_event_tracking() {
            return Err(err(
                "the device tracks CUDA events (yolo9::device::select turns that off)",
            ));
        }
        let stream = dev.cuda_stream();
        let _cache = dev.enable_cuda_graph_htod_cache();
        let input = x.contiguous()?.copy()?;
        let warm = forward(&input)?;
        stream
            .synchronize()
            .map_err(|e| err(format!("synchronize after the warm-up: {e:?}")))?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| err(format!("begin capture: {e:?}")))?;
        let captured = forward(&input);
        // End the capture whatever happened inside it, so the stream is usable again.
        let graph = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        let output = captured?;
        let graph = graph
            .map_err(|e| err(format!("end capture / instantiate: {e:?}")))?
            .ok_or_else(|| err("the capture recorded nothing"))?;
        graph
            .launch()
            .map_err(|e| err(format!("first replay: {e:?}")))?;
        let first = output.copy()?;
        let d = relative_diff(&first, &warm)?;
        // NaN counts as a difference.
        if d.is_nan() || d > 1e-3 {
            return Err(err(format!(
                "the first replay differs from the warm-up forward by {d:e} (relative)"
            )));
        }
        Ok((
            Self {
                graph,
                input,
                output,
            },
            first,
        ))
    }

    /// Whether `x` has the captured input's shape and dtype.
    pub fn accepts(&self, x: &Tensor) -> bool {
        x.dims() == self.input.dims() && x.dtype() == self.input.dtype()
    }

    /// Replays the forward on `x` (shape and dtype of the capture, on the capture's device):
    /// copies `x` into the input buffer, launches the graph and returns a copy of the output.
    pub fn run(&self, x: &Tensor) -> Result<Tensor> {
        if !self.accepts(x) {
            return Err(err(format!(
                "input {:?} {:?} does not match the captured {:?} {:?}",
                x.dims(),
                x.dtype(),
                self.input.dims(),
                self.input.dtype()
            )));
        }
        copy_into(&self.input, &x.contiguous()?)?;
        self.graph
            .launch()
            .map_err(|e| err(format!("replay: {e:?}")))?;
        self.output.copy()
    }
}

/// Copies `src` into `dst`, both contiguous CUDA tensors of one shape and dtype on one device,
/// as one device-to-device memcpy on the device's stream (candle's `slice_set` runs a copy
/// kernel: ~0.17 ms of a batch-32 f32 640×640 input on an H100, a memcpy a quarter of it).
/// Other dtypes take `slice_set`.
fn copy_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    use candle_core::Storage;
    if dst.dims() != src.dims()
        || dst.dtype() != src.dtype()
        || !dst.is_contiguous()
        || !src.is_contiguous()
    {
        return Err(err("copy into a buffer of another shape, dtype or layout"));
    }
    if !matches!(dst.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return dst.slice_set(src, 0, 0);
    }
    let (ds, dl) = dst.storage_and_layout();
    let (ss, sl) = src.storage_and_layout();
    let (Storage::Cuda(ds), Storage::Cuda(ss)) = (&*ds, &*ss) else {
        return Err(err("copy between tensors not both on the GPU"));
    };
    let stream = ds.device.cuda_stream();
    let size = dst.dtype().size_in_bytes();
    let bytes = dst.elem_count() * size;
    let (d, s) = match dst.dtype() {
        DType::F32 => (
            ds.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
            ss.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
        ),
        DType::F16 => (
            ds.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
            ss.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
        ),
        _ => (
            ds.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
            ss.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
        ),
    };
    let d = d + (dl.start_offset() * size) as u64;
    let s = s + (sl.start_offset() * size) as u64;
    // SAFETY: both ranges hold `bytes` bytes from their layouts' start (same shape and dtype,
    // contiguous); the copy is ordered on the stream the graph replays on; `dst` is written
    // through a shared borrow's pointer, as candle's own kernels write their outputs.
    unsafe {
        candle_core::cuda_backend::cudarc::driver::result::memcpy_dtod_async(
            d,
            s,
            bytes,
            stream.cu_stream(),
        )
    }
    .map_err(|e| err(format!("input copy: {e:?}")))
}

/// The high-water mark of the device memory that CUDA graphs have reserved on `dev` since the
/// process started, in bytes (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH`: graph allocations come from
/// a pool of their own, which the stream-ordered pool's counters do not include).
pub fn graph_reserved_high(dev: &CudaDevice) -> Result<u64> {
    use cudarc::driver::sys;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread()
        .map_err(|e| err(format!("binding the context: {e:?}")))?;
    let mut v: u64 = 0;
    // SAFETY: the attribute is a u64 (cuuint64_t) written into `v`.
    let r = unsafe {
        sys::cuDeviceGetGraphMemAttribute(
            ctx.cu_device(),
            sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH,
            (&mut v as *mut u64).cast(),
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(err(format!("cuDeviceGetGraphMemAttribute: {r:?}")));
    }
    Ok(v)
}

/// Returns the memory cached for CUDA graphs on `dev` that no graph uses any more to the device
/// (`cuDeviceGraphMemTrim`), e.g. after a captured forward was dropped.
pub fn trim_graph_pool(dev: &CudaDevice) -> Result<()> {
    use cudarc::driver::sys;
    let ctx = dev.cuda_stream().context().clone();
    ctx.bind_to_thread()
        .map_err(|e| err(format!("binding the context: {e:?}")))?;
    // SAFETY: the device belongs to a live context.
    let r = unsafe { sys::cuDeviceGraphMemTrim(ctx.cu_device()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(err(format!("cuDeviceGraphMemTrim: {r:?}")));
    }
    Ok(())
}
