//! 2-D convolution on cuDNN as candle custom ops: forward, input gradient and weight gradient.
//!
//! [`conv2d`] computes `y = conv2d(x, w)` (cross-correlation, dilation 1, zero padding, optional
//! groups) with `cudnnConvolutionForward`. Its backward pass applies two more custom ops:
//! [`Conv2dBwdData`] (`cudnnConvolutionBackwardData`, dL/dx) and [`Conv2dBwdFilter`]
//! (`cudnnConvolutionBackwardFilter`, dL/dw). All three work on contiguous NCHW tensors of the
//! same dtype:
//!
//! - `f32`: TF32 tensor cores allowed (`CUDNN_TENSOR_OP_MATH`, see [`F32_MATH_ENV`]; TF32 is
//!   PyTorch's default for convolutions), or strict f32 (`CUDNN_FMA_MATH`, what PyTorch with TF32 off gives) when
//!   [`strict_fp32`] is set;
//! - `f16` / `bf16`: `CUDNN_TENSOR_OP_MATH` with f32 accumulation (cuDNN's "pseudo half"
//!   configuration).
//!
//! Per CUDA device (candle [`DeviceId`], which owns one stream) one cuDNN handle is created on first
//! use and kept for the life of the process, together with the chosen algorithms, one map per
//! kind keyed by shape, dtype and search mode, and one workspace buffer that grows when an
//! algorithm needs more. The handle, the maps and the workspace sit behind a mutex, so the ops may
//! be called from any thread; calls on one device are serialized while they enqueue work.
//!
//! Algorithm choice ([`AlgoSearch`]): `Benchmark` (the default) times every algorithm once per
//! shape and keeps the fastest (like `cudnn.benchmark = True`, which the official trainer sets);
//! `Heuristic` takes cuDNN's first suggestion (`cudnnGetConvolution*Algorithm_v7`).
//! `YOLO9_CUDNN_ALGO=heuristic` selects the second at start-up, [`set_algo_search`] at run time.
//!
//! Every failure (cuDNN status, CUDA out of memory, a shape cuDNN cannot describe) is returned as
//! a candle `Error`; nothing here panics on a runtime path.
//!
//! Why one file: the three cuDNN ops (forward, data gradient, filter gradient) share the engine
//! that is most of its length: the handle, the descriptor cache, the workspace, the algorithm
//! search and its cache file.

use super::algo_cache::{AlgoCache, Kind as CacheKind};
use super::conv_params::Conv2dParams;
use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, DeviceId};
use candle_core::{
    CpuStorage, CudaDevice, CudaStorage, CustomOp2, DType, Device, Error, Layout, Result, Shape,
    Tensor,
};
use cudarc::cudnn::sys::{
    cudnnConvolutionBwdDataAlgo_t as BwdDataAlgo, cudnnConvolutionBwdFilterAlgo_t as BwdFilterAlgo,
    cudnnConvolutionFwdAlgo_t as FwdAlgo, cudnnConvolutionMode_t, cudnnMathType_t,
    cudnnTensorFormat_t,
};
use cudarc::cudnn::{
    ConvBackwardData, ConvBackwardFilter, ConvDescriptor, ConvForward, Cudnn, CudnnDataType,
    CudnnError, FilterDescriptor, TensorDescriptor,
};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DeviceRepr};
use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Environment variable that selects the algorithm search at start-up (`heuristic` or
/// `benchmark`; anything else, or unset, means `benchmark`).
pub const ALGO_ENV: &str = "YOLO9_CUDNN_ALGO";
/// Environment variable that turns the cuDNN convolution off (`YOLO9_CONV=candle`: every
/// convolution goes through candle's `Tensor::conv2d`, also on CUDA).
pub const CONV_ENV: &str = "YOLO9_CONV";

/// Largest workspace (bytes) an algorithm may need to be timed in [`AlgoSearch::Benchmark`].
const BENCH_WORKSPACE_LIMIT: usize = 1 << 30;
/// Timed launches per algorithm in [`AlgoSearch::Benchmark`] (after one untimed launch).
const BENCH_REPS: usize = 2;
/// Workspace allocations are rounded up to this many bytes so that small growths reuse a block.
const WORKSPACE_GRAIN: usize = 1 << 20;

/// How the cuDNN algorithm of each (shape, dtype, kind) is chosen, once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgoSearch {
    /// cuDNN's heuristics (`cudnnGetConvolution*Algorithm_v7`), first result.
    Heuristic,
    /// Time every algorithm whose workspace fits in 1 GiB and keep the fastest (the default).
    Benchmark,
}

/// 0 = not yet read from the environment, 1 = heuristic, 2 = benchmark.
static ALGO_SEARCH: AtomicU8 = AtomicU8::new(0);
/// 0 = not yet read from the environment, 1 = cuDNN convolution on, 2 = off.
static CUDNN_CONV: AtomicU8 = AtomicU8::new(0);
/// 0 = not yet read from the environment, 1 = TF32 allowed for f32, 2 = strict f32 (no TF32).
static F32_MATH: AtomicU8 = AtomicU8::new(0);

/// Environment variable that makes f32 convolutions strict f32 at start-up (`YOLO9_STRICT_FP32=1`;
/// `0`, empty or unset allows TF32).
pub const STRICT_FP32_ENV: &str = "YOLO9_STRICT_FP32";

/// Whether f32 convolutions are strict f32 (`CUDNN_FMA_MATH`: no TF32 tensor cores). The default
/// allows TF32 (`CUDNN_TENSOR_OP_MATH`), as PyTorch does for convolutions
/// (`torch.backends.cudnn.allow_tf32 = True`); `yolo9 train --strict-fp32`, [`STRICT_FP32_ENV`]
/// or [`set_strict_fp32`] turn it off (parity runs and the GPU parity tests).
pub fn strict_fp32() -> bool {
    match F32_MATH.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let v = crate::switches::var(STRICT_FP32_ENV).unwrap_or_default();
            let strict = matches!(v.trim(), "1" | "true" | "yes");
            set_strict_fp32(strict);
            strict
        }
    }
}

/// Sets strict f32 (true) or TF32-allowed (false) f32 convolutions for convolutions run from now
/// on (the choice is part of the algorithm cache key).
pub fn set_strict_fp32(strict: bool) {
    F32_MATH.store(if strict { 2 } else { 1 }, Ordering::Relaxed);
}

/// The cuDNN math type of a convolution in `T`: f32 follows [`strict_fp32`], half types use
/// tensor cores.
fn math_of<T: Elem>() -> cudnnMathType_t {
    if T::DTYPE == DType::F32 && !strict_fp32() {
        tf32_math()
    } else {
        T::MATH
    }
}

/// Environment variable naming the cuDNN math type of TF32-allowed f32 convolutions: `tensor`
/// (`CUDNN_TENSOR_OP_MATH`, the default), `default` (`CUDNN_DEFAULT_MATH`) or `convert`
/// (`CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION`). On the H200 (cuDNN 9.19) the bs16 training step took
/// 267.9 ms with `tensor`, 308.5 ms with `default` and 307.3 ms with `convert` (one device
/// command, `benches/train_step.rs`): with `CUDNN_DEFAULT_MATH` the legacy API ran most f32
/// convolutions on its FMA kernels (`implicit_convolve_sgemm`, `wgrad_alg0_engine`).
pub const F32_MATH_ENV: &str = "YOLO9_CUDNN_F32_MATH";

/// The math type of TF32-allowed f32 convolutions ([`F32_MATH_ENV`], read once).
fn tf32_math() -> cudnnMathType_t {
    static M: OnceLock<cudnnMathType_t> = OnceLock::new();
    *M.get_or_init(|| match crate::switches::value(F32_MATH_ENV).as_deref() {
        Some("default") => cudnnMathType_t::CUDNN_DEFAULT_MATH,
        Some("convert") => cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
        _ => cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    })
}

/// Environment variable that makes the algorithm search print, for every convolution shape it
/// times, each candidate's time and workspace and the choice (`YOLO9_CUDNN_TRACE=1`, to stderr).
pub const TRACE_ENV: &str = "YOLO9_CUDNN_TRACE";

pub(crate) fn trace_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| crate::switches::one(TRACE_ENV))
}

/// The current algorithm search (from [`ALGO_ENV`] until [`set_algo_search`] is called).
pub fn algo_search() -> AlgoSearch {
    match ALGO_SEARCH.load(Ordering::Relaxed) {
        1 => AlgoSearch::Heuristic,
        2 => AlgoSearch::Benchmark,
        _ => {
            let v = crate::switches::var(ALGO_ENV).unwrap_or_default();
            let s = match v.trim().to_ascii_lowercase().as_str() {
                "heuristic" | "heuristics" => AlgoSearch::Heuristic,
                _ => AlgoSearch::Benchmark,
            };
            set_algo_search(s);
            s
        }
    }
}

/// Sets the algorithm search for convolutions whose algorithm is not chosen yet (choices already
/// made under the other mode stay cached under that mode).
pub fn set_algo_search(s: AlgoSearch) {
    let v = match s {
        AlgoSearch::Heuristic => 1,
        AlgoSearch::Benchmark => 2,
    };
    ALGO_SEARCH.store(v, Ordering::Relaxed);
}

/// Whether [`conv2d`] uses cuDNN for CUDA tensors (default yes; `YOLO9_CONV=candle` at start-up
/// or [`set_cudnn_conv_enabled`] turn it off).
pub fn cudnn_conv_enabled() -> bool {
    match CUDNN_CONV.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let v = crate::switches::var(CONV_ENV).unwrap_or_default();
            let on = !v.trim().eq_ignore_ascii_case("candle");
            set_cudnn_conv_enabled(on);
            on
        }
    }
}

/// Turns the cuDNN convolution of [`conv2d`] on or off for the rest of the process.
pub fn set_cudnn_conv_enabled(on: bool) {
    CUDNN_CONV.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Cuda(msg.to_string().into())
}

fn cudnn_err(what: &str, e: CudnnError) -> Error {
    err(format!("cuDNN {what}: {e:?}"))
}

/// Element types the ops accept: the cuDNN data type, the scaling constants and the math type.
trait Elem: CudnnDataType + CudaDType + DeviceRepr + Copy + 'static {
    const DTYPE: DType;
    const ONE: Self;
    const ZERO: Self;
    /// FMA for f32 when strict (see [`math_of`]), tensor ops for half types.
    const MATH: cudnnMathType_t;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
    const MATH: cudnnMathType_t = cudnnMathType_t::CUDNN_FMA_MATH;
}

impl Elem for half::f16 {
    const DTYPE: DType = DType::F16;
    const ONE: Self = half::f16::ONE;
    const ZERO: Self = half::f16::ZERO;
    const MATH: cudnnMathType_t = cudnnMathType_t::CUDNN_TENSOR_OP_MATH;
}

impl Elem for half::bf16 {
    const DTYPE: DType = DType::BF16;
    const ONE: Self = half::bf16::ONE;
    const ZERO: Self = half::bf16::ZERO;
    const MATH: cudnnMathType_t = cudnnMathType_t::CUDNN_TENSOR_OP_MATH;
}

/// Whether the cuDNN ops handle `dtype` (f32, f16, bf16).
pub fn dtype_supported(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Shape, dtype, search mode and math type (strict f32 or not).
type AlgoKey = (Conv2dParams, DType, AlgoSearch, bool);

/// The per-device cuDNN state.
struct Engine {
    stream: Arc<CudaStream>,
    cudnn: Arc<Cudnn>,
    fwd: HashMap<AlgoKey, FwdAlgo>,
    bwd_data: HashMap<AlgoKey, BwdDataAlgo>,
    bwd_filter: HashMap<AlgoKey, BwdFilterAlgo>,
    workspace: Option<CudaSlice<u8>>,
    /// The benchmark choices persisted across runs (`None`: disabled).
    file: Option<AlgoCache>,
    /// Descriptors built once per (shape, dtype, math type): each is a `Descs<T>`. Creating and
    /// setting four descriptors per call cost a dozen cuDNN calls per convolution.
    descs: HashMap<(Conv2dParams, DType, u32), Rc<dyn Any>>,
}

impl Engine {
    /// The descriptors of `p` in `T` with the current math type (built on first use).
    fn descs<T: Elem + 'static>(&mut self, p: &Conv2dParams) -> Result<Rc<Descs<T>>> {
        let key = (*p, T::DTYPE, math_of::<T>() as u32);
        if let Some(d) = self.descs.get(&key) {
            if let Ok(d) = d.clone().downcast::<Descs<T>>() {
                return Ok(d);
            }
        }
        let d = Rc::new(descs::<T>(&self.cudnn, p)?);
        self.descs.insert(key, d.clone());
        Ok(d)
    }

    /// The algorithm of a benchmark-mode convolution from the cache file, if it holds one of
    /// `all` (`code` gives an algorithm's cuDNN enum value).
    fn cached_choice<A: Copy>(
        &self,
        kind: CacheKind,
        key: &AlgoKey,
        all: &[A],
        code: impl Fn(A) -> u32,
    ) -> Option<A> {
        if key.2 != AlgoSearch::Benchmark {
            return None;
        }
        let v = self.file.as_ref()?.get(kind, &key.0, key.1, key.3)?;
        all.iter().copied().find(|&a| code(a) == v)
    }

    /// Records a benchmark-mode choice in the cache file.
    fn remember_choice(&mut self, kind: CacheKind, key: &AlgoKey, algo: u32) {
        if key.2 == AlgoSearch::Benchmark {
            if let Some(f) = self.file.as_mut() {
                f.put(kind, &key.0, key.1, key.3, algo);
            }
        }
    }
}

// SAFETY: `Cudnn` is `!Send` only because it holds the raw cuDNN handle. cuDNN allows a handle to
// be used from any host thread as long as two threads do not use it at the same time; every
// `Engine` lives behind a `Mutex` and is only touched (handle, descriptors created from it, the
// workspace) while that mutex is held. The same holds for the cached descriptors and their `Rc`
// counts: they are created, cloned and dropped only under that mutex (no `Rc` leaves it).
unsafe impl Send for Engine {}

type EngineMap = Mutex<HashMap<DeviceId, Arc<Mutex<Engine>>>>;
static ENGINES: OnceLock<EngineMap> = OnceLock::new();

/// The engine of `dev`, created on first use (cuDNN handle bound to candle's stream of `dev`).
fn engine(dev: &CudaDevice) -> Result<Arc<Mutex<Engine>>> {
    let map = ENGINES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map
        .lock()
        .map_err(|_| err("cuDNN engine map: a thread panicked while holding it"))?;
    if let Some(e) = map.get(&dev.id()) {
        return Ok(e.clone());
    }
    let stream = dev.cuda_stream();
    // `Cudnn::new` binds the context itself but unwraps the result; binding here first turns a
    // failure into an error.
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| err(format!("binding the CUDA context: {e:?}")))?;
    let cudnn = Cudnn::new(stream.clone()).map_err(|e| cudnn_err("creating the handle", e))?;
    let file = AlgoCache::for_stream(&stream, &format!("{:?}", tf32_math()));
    let e = Arc::new(Mutex::new(Engine {
        stream,
        cudnn,
        fwd: HashMap::new(),
        bwd_data: HashMap::new(),
        bwd_filter: HashMap::new(),
        workspace: None,
        file,
        descs: HashMap::new(),
    }));
    map.insert(dev.id(), e.clone());
    Ok(e)
}

/// Runs `f` on the engine of `dev` with its mutex held and the device's context current.
fn with_engine<R>(dev: &CudaDevice, f: impl FnOnce(&mut Engine) -> Result<R>) -> Result<R> {
    let e = engine(dev)?;
    let mut g = e
        .lock()
        .map_err(|_| err("cuDNN engine: a thread panicked while holding it"))?;
    g.stream
        .context()
        .bind_to_thread()
        .map_err(|e| err(format!("binding the CUDA context: {e:?}")))?;
    f(&mut g)
}

/// Descriptors of one convolution.
struct Descs<T: Elem> {
    x: TensorDescriptor<T>,
    w: FilterDescriptor<T>,
    y: TensorDescriptor<T>,
    conv: ConvDescriptor<f32>,
}

fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{v} does not fit a cuDNN descriptor (i32)")))
}

fn dims4(a: usize, b: usize, c: usize, d: usize) -> Result<[i32; 4]> {
    Ok([i32_of(a)?, i32_of(b)?, i32_of(c)?, i32_of(d)?])
}

/// Builds the NCHW (or, for [`Conv2dParams::nhwc`], NHWC) tensor/filter descriptors of `p` in
/// dtype `T` and its convolution descriptor (f32 compute, math type [`math_of`], group count).
/// cuDNN takes the dimensions in N, C, H, W order for both formats.
fn descs<T: Elem>(cudnn: &Arc<Cudnn>, p: &Conv2dParams) -> Result<Descs<T>> {
    let nchw = if p.nhwc {
        cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
    } else {
        cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
    };
    let x = cudnn
        .create_4d_tensor::<T>(nchw, dims4(p.batch, p.c_in, p.h, p.w)?)
        .map_err(|e| cudnn_err("input descriptor", e))?;
    let w = cudnn
        .create_4d_filter::<T>(nchw, dims4(p.c_out, p.c_in / p.groups, p.kh, p.kw)?)
        .map_err(|e| cudnn_err("filter descriptor", e))?;
    let y = cudnn
        .create_4d_tensor::<T>(nchw, dims4(p.batch, p.c_out, p.out_h(), p.out_w())?)
        .map_err(|e| cudnn_err("output descriptor", e))?;
    let (pad, stride) = (i32_of(p.padding)?, i32_of(p.stride)?);
    let mut conv = cudnn
        .create_conv2d::<f32>(
            [pad, pad],
            [stride, stride],
            [1, 1],
            cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
        )
        .map_err(|e| cudnn_err("convolution descriptor", e))?;
    conv.set_math_type(math_of::<T>())
        .map_err(|e| cudnn_err("math type", e))?;
    conv.set_group_count(i32_of(p.groups)?)
        .map_err(|e| cudnn_err("group count", e))?;
    Ok(Descs { x, w, y, conv })
}

/// Makes `ws` at least `bytes` long (rounded up to [`WORKSPACE_GRAIN`]). The old buffer is freed
/// first (stream-ordered) so its memory can be reused. Out of memory is an error.
pub(super) fn grow_workspace(
    stream: &Arc<CudaStream>,
    ws: &mut Option<CudaSlice<u8>>,
    bytes: usize,
) -> Result<()> {
    if bytes == 0 || ws.as_ref().is_some_and(|w| w.len() >= bytes) {
        return Ok(());
    }
    *ws = None;
    let size = bytes.div_ceil(WORKSPACE_GRAIN) * WORKSPACE_GRAIN;
    // SAFETY: the workspace is scratch memory for cuDNN, which never reads it before writing.
    let buf = unsafe { stream.alloc::<u8>(size) }
        .map_err(|e| err(format!("cuDNN workspace of {size} bytes: {e:?}")))?;
    *ws = Some(buf);
    Ok(())
}

/// Whether work enqueued on `stream` is being captured into a CUDA graph (see
/// [`crate::cuda::graph`]).
pub(super) fn capturing(stream: &Arc<CudaStream>) -> bool {
    !matches!(
        stream.capture_status(),
        Ok(cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    )
}

/// An algorithm search times candidates with host synchronisations, which a CUDA graph capture
/// does not allow: while capturing, a convolution whose algorithm is not chosen yet is an error
/// (the capture's warm-up run chooses them).
fn refuse_search_in_capture(stream: &Arc<CudaStream>) -> Result<()> {
    if capturing(stream) {
        return Err(err(
            "a convolution shape without a chosen cuDNN algorithm inside a CUDA graph capture \
             (the warm-up forward must run the same shapes first)",
        ));
    }
    Ok(())
}

/// The workspace argument of a launch needing `bytes`. Outside a capture: the shared workspace
/// `shared`, grown when needed. While `stream` is being captured: a buffer of the launch's own,
/// left in `own` (its allocation and release become nodes of the graph, so a replay never points
/// at the shared workspace, which a later, larger algorithm may replace). `None` when the
/// algorithm needs none.
pub(super) fn launch_workspace<'a>(
    stream: &Arc<CudaStream>,
    shared: &'a mut Option<CudaSlice<u8>>,
    own: &'a mut Option<CudaSlice<u8>>,
    bytes: usize,
) -> Result<Option<&'a mut CudaSlice<u8>>> {
    if bytes > 0 && capturing(stream) {
        // SAFETY: scratch memory for cuDNN, which never reads it before writing.
        let buf = unsafe { stream.alloc::<u8>(bytes) }.map_err(|e| {
            err(format!(
                "cuDNN workspace of {bytes} bytes in a graph capture: {e:?}"
            ))
        })?;
        return Ok(Some(own.insert(buf)));
    }
    grow_workspace(stream, shared, bytes)?;
    Ok(ws_arg(shared, bytes))
}

/// The workspace argument of a launch: `None` when the algorithm needs none.
pub(super) fn ws_arg(ws: &mut Option<CudaSlice<u8>>, bytes: usize) -> Option<&mut CudaSlice<u8>> {
    if bytes == 0 {
        None
    } else {
        ws.as_mut()
    }
}

/// Runs a cuDNN algorithm query, turning an error status or a panic inside the wrapper (it
/// asserts that cuDNN returned at least one algorithm) into an error.
fn guarded<A>(what: &str, f: impl FnOnce() -> std::result::Result<A, CudnnError>) -> Result<A> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(cudnn_err(what, e)),
        Err(_) => Err(err(format!("cuDNN {what}: no algorithm returned"))),
    }
}

/// Times each candidate algorithm (one untimed launch, then [`BENCH_REPS`] timed ones, stream
/// synchronized around them) and returns the fastest that ran; candidates whose workspace size
/// is unknown, over [`BENCH_WORKSPACE_LIMIT`], not allocatable, or whose launch fails are
/// skipped. The workspace is released afterwards so that it is sized for the chosen algorithm.
fn benchmark<A: Copy + std::fmt::Debug>(
    what: &dyn Fn() -> String,
    stream: &Arc<CudaStream>,
    ws: &mut Option<CudaSlice<u8>>,
    candidates: &[A],
    ws_size: impl Fn(A) -> std::result::Result<usize, CudnnError>,
    mut launch: impl FnMut(A, Option<&mut CudaSlice<u8>>) -> std::result::Result<(), CudnnError>,
) -> Result<Option<A>> {
    let sync = |s: &Arc<CudaStream>| {
        s.synchronize()
            .map_err(|e| err(format!("synchronize while timing cuDNN algorithms: {e:?}")))
    };
    let mut best: Option<(f64, A)> = None;
    for &a in candidates {
        let bytes = match ws_size(a) {
            Ok(b) if b <= BENCH_WORKSPACE_LIMIT => b,
            _ => continue,
        };
        if grow_workspace(stream, ws, bytes).is_err() {
            continue;
        }
        if launch(a, ws_arg(ws, bytes)).is_err() {
            continue;
        }
        sync(stream)?;
        let t0 = Instant::now();
        let mut ok = true;
        for _ in 0..BENCH_REPS {
            ok &= launch(a, ws_arg(ws, bytes)).is_ok();
        }
        sync(stream)?;
        let dt = t0.elapsed().as_secs_f64();
        if trace_on() {
            crate::text::errln!(
                "cudnn-trace {} {a:?} ws {bytes} ok {ok} ms {:.4}",
                what(),
                dt * 1e3 / BENCH_REPS as f64
            );
        }
        if ok && best.is_none_or(|(b, _)| dt < b) {
            best = Some((dt, a));
        }
    }
    *ws = None;
    if trace_on() {
        crate::text::errln!(
            "cudnn-trace {} chosen {:?} ms {:.4}",
            what(),
            best.map(|b| b.1),
            best.map_or(f64::NAN, |b| b.0 * 1e3 / BENCH_REPS as f64)
        );
    }
    Ok(best.map(|(_, a)| a))
}

const FWD_ALGOS: [FwdAlgo; 8] = [
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
    FwdAlgo::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
];

const BWD_DATA_ALGOS: [BwdDataAlgo; 6] = [
    BwdDataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_0,
    BwdDataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
    BwdDataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT,
    BwdDataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING,
    BwdDataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
    BwdDataAlgo::CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
];

const BWD_FILTER_ALGOS: [BwdFilterAlgo; 6] = [
    BwdFilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
    BwdFilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
    BwdFilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
    BwdFilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3,
    BwdFilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
    BwdFilterAlgo::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING,
];

impl Engine {
    /// `y = conv(x, w)` (`cudnnConvolutionForward`, alpha 1, beta 0).
    fn forward<T: Elem>(
        &mut self,
        p: &Conv2dParams,
        x: &CudaView<T>,
        w: &CudaView<T>,
        y: &mut CudaSlice<T>,
    ) -> Result<()> {
        let d = self.descs::<T>(p)?;
        let op = ConvForward {
            conv: &d.conv,
            x: &d.x,
            w: &d.w,
            y: &d.y,
        };
        let mode = algo_search();
        let key = (*p, T::DTYPE, mode, strict_fp32());
        let cached = self
            .fwd
            .get(&key)
            .copied()
            .or_else(|| self.cached_choice(CacheKind::Forward, &key, &FWD_ALGOS, |a| a as u32));
        let algo = match cached {
            Some(a) => a,
            None => {
                refuse_search_in_capture(&self.stream)?;
                let mut a = None;
                if mode == AlgoSearch::Benchmark {
                    a = benchmark(
                        &|| format!("fwd {p:?} {:?}", T::DTYPE),
                        &self.stream,
                        &mut self.workspace,
                        &FWD_ALGOS,
                        |a| op.get_workspace_size(a),
                        // SAFETY: x, w, y have the dtype and the element counts of the
                        // descriptors (checked by the caller).
                        |a, ws| unsafe { op.launch(a, ws, (T::ONE, T::ZERO), x, w, y) },
                    )?;
                }
                let a = match a {
                    Some(a) => a,
                    None => guarded("forward algorithm", || op.pick_algorithm())?,
                };
                self.fwd.insert(key, a);
                self.remember_choice(CacheKind::Forward, &key, a as u32);
                a
            }
        };
        let bytes = op
            .get_workspace_size(algo)
            .map_err(|e| cudnn_err("forward workspace size", e))?;
        let mut own = None;
        let ws = launch_workspace(&self.stream, &mut self.workspace, &mut own, bytes)?;
        // SAFETY: as above.
        unsafe { op.launch(algo, ws, (T::ONE, T::ZERO), x, w, y) }
            .map_err(|e| cudnn_err("convolution forward", e))
    }

    /// `dx = conv_backward_data(w, dy)` (`cudnnConvolutionBackwardData`, alpha 1, beta 0).
    fn backward_data<T: Elem>(
        &mut self,
        p: &Conv2dParams,
        dy: &CudaView<T>,
        w: &CudaView<T>,
        dx: &mut CudaSlice<T>,
    ) -> Result<()> {
        let d = self.descs::<T>(p)?;
        let op = ConvBackwardData {
            conv: &d.conv,
            dx: &d.x,
            w: &d.w,
            dy: &d.y,
        };
        let mode = algo_search();
        let key = (*p, T::DTYPE, mode, strict_fp32());
        let cached = self.bwd_data.get(&key).copied().or_else(|| {
            self.cached_choice(CacheKind::BackwardData, &key, &BWD_DATA_ALGOS, |a| a as u32)
        });
        let algo = match cached {
            Some(a) => a,
            None => {
                refuse_search_in_capture(&self.stream)?;
                let mut a = None;
                if mode == AlgoSearch::Benchmark {
                    a = benchmark(
                        &|| format!("bwd_data {p:?} {:?}", T::DTYPE),
                        &self.stream,
                        &mut self.workspace,
                        &BWD_DATA_ALGOS,
                        |a| op.get_workspace_size(a),
                        // SAFETY: dx, w, dy match the descriptors (checked by the caller).
                        |a, ws| unsafe { op.launch(a, ws, (T::ONE, T::ZERO), dx, w, dy) },
                    )?;
                }
                let a = match a {
                    Some(a) => a,
                    None => guarded("backward-data algorithm", || op.pick_algorithm())?,
                };
                self.bwd_data.insert(key, a);
                self.remember_choice(CacheKind::BackwardData, &key, a as u32);
                a
            }
        };
        let bytes = op
            .get_workspace_size(algo)
            .map_err(|e| cudnn_err("backward-data workspace size", e))?;
        let mut own = None;
        let ws = launch_workspace(&self.stream, &mut self.workspace, &mut own, bytes)?;
        // SAFETY: as above.
        unsafe { op.launch(algo, ws, (T::ONE, T::ZERO), dx, w, dy) }
            .map_err(|e| cudnn_err("convolution backward data", e))
    }

    /// `dw = conv_backward_filter(x, dy)` (`cudnnConvolutionBackwardFilter`, alpha 1, beta 0).
    fn backward_filter<T: Elem>(
        &mut self,
        p: &Conv2dParams,
        x: &CudaView<T>,
        dy: &CudaView<T>,
        dw: &mut CudaSlice<T>,
    ) -> Result<()> {
        let d = self.descs::<T>(p)?;
        let op = ConvBackwardFilter {
            conv: &d.conv,
            x: &d.x,
            dw: &d.w,
            dy: &d.y,
        };
        let mode = algo_search();
        let key = (*p, T::DTYPE, mode, strict_fp32());
        let cached = self.bwd_filter.get(&key).copied().or_else(|| {
            self.cached_choice(CacheKind::BackwardFilter, &key, &BWD_FILTER_ALGOS, |a| {
                a as u32
            })
        });
        let algo = match cached {
            Some(a) => a,
            None => {
                refuse_search_in_capture(&self.stream)?;
                let mut a = None;
                if mode == AlgoSearch::Benchmark {
                    a = benchmark(
                        &|| format!("bwd_filter {p:?} {:?}", T::DTYPE),
                        &self.stream,
                        &mut self.workspace,
                        &BWD_FILTER_ALGOS,
                        |a| op.get_workspace_size(a),
                        // SAFETY: x, dw, dy match the descriptors (checked by the caller).
                        |a, ws| unsafe { op.launch(a, ws, (T::ONE, T::ZERO), x, dw, dy) },
                    )?;
                }
                let a = match a {
                    Some(a) => a,
                    None => guarded("backward-filter algorithm", || op.pick_algorithm())?,
                };
                self.bwd_filter.insert(key, a);
                self.remember_choice(CacheKind::BackwardFilter, &key, a as u32);
                a
            }
        };
        let bytes = op
            .get_workspace_size(algo)
            .map_err(|e| cudnn_err("backward-filter workspace size", e))?;
        let mut own = None;
        let ws = launch_workspace(&self.stream, &mut self.workspace, &mut own, bytes)?;
        // SAFETY: as above.
        unsafe { op.launch(algo, ws, (T::ONE, T::ZERO), x, dw, dy) }
            .map_err(|e| cudnn_err("convolution backward filter", e))
    }
}

/// The contiguous elements of an op argument as a device view, after checking its layout and
/// shape (`what` names the argument in errors).
fn view<'a, T: Elem>(
    s: &'a CudaStorage,
    l: &Layout,
    shape: &Shape,
    what: &str,
) -> Result<CudaView<'a, T>> {
    if l.shape() != shape {
        return Err(err(format!(
            "cuDNN conv: {what} has shape {:?}, expected {:?}",
            l.shape(),
            shape
        )));
    }
    if !l.is_contiguous() {
        return Err(err(format!("cuDNN conv: {what} is not contiguous")));
    }
    let n = shape.elem_count();
    let off = l.start_offset();
    s.as_cuda_slice::<T>()?
        .try_slice(off..off + n)
        .ok_or_else(|| {
            err(format!(
                "cuDNN conv: {what} storage is shorter than its layout"
            ))
        })
}

/// Which of the three convolutions an op runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// args (x, w) → y.
    Forward,
    /// args (dy, w) → dx.
    BackwardData,
    /// args (x, dy) → dw.
    BackwardFilter,
}

/// Runs `kind` on the two argument storages and wraps the new output.
fn run<T: Elem>(
    kind: Kind,
    p: &Conv2dParams,
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let dev = s1.device().clone();
    let (sh1, sh2, out) = match kind {
        Kind::Forward => (p.x_shape(), p.w_shape(), p.y_shape()),
        Kind::BackwardData => (p.y_shape(), p.w_shape(), p.x_shape()),
        Kind::BackwardFilter => (p.x_shape(), p.y_shape(), p.w_shape()),
    };
    let a = view::<T>(s1, l1, &sh1, "first argument")?;
    let b = view::<T>(s2, l2, &sh2, "second argument")?;
    // SAFETY: cuDNN writes every output element (beta = 0 means the output is not read).
    let mut dst = unsafe { dev.alloc::<T>(out.elem_count())? };
    with_engine(&dev, |e| match kind {
        Kind::Forward => e.forward(p, &a, &b, &mut dst),
        Kind::BackwardData => e.backward_data(p, &a, &b, &mut dst),
        Kind::BackwardFilter => e.backward_filter(p, &a, &b, &mut dst),
    })?;
    Ok((CudaStorage::wrap_cuda_slice(dst, dev), out))
}

fn dispatch(
    kind: Kind,
    p: &Conv2dParams,
    s1: &CudaStorage,
    l1: &Layout,
    s2: &CudaStorage,
    l2: &Layout,
) -> Result<(CudaStorage, Shape)> {
    if s1.dtype() != s2.dtype() {
        return Err(err(format!(
            "cuDNN conv: arguments of dtypes {:?} and {:?}",
            s1.dtype(),
            s2.dtype()
        )));
    }
    match s1.dtype() {
        DType::F32 => run::<f32>(kind, p, s1, l1, s2, l2),
        DType::F16 => run::<half::f16>(kind, p, s1, l1, s2, l2),
        DType::BF16 => run::<half::bf16>(kind, p, s1, l1, s2, l2),
        d => Err(err(format!("cuDNN conv: dtype {d:?} is not supported"))),
    }
}

fn cpu_refused(name: &str) -> Result<(CpuStorage, Shape)> {
    Err(err(format!(
        "{name} runs on CUDA tensors only (use model::conv::conv2d_any)"
    )))
}

/// The forward convolution as a candle op: args `x` `(N, C_in, H, W)` and `w`
/// `(C_out, C_in/groups, kh, kw)`, contiguous, same dtype (f32/f16/bf16) on one CUDA device;
/// result `(N, C_out, H', W')`. Follows `cudnnConvolutionForward`. Its backward pass returns
/// `dx` through [`Conv2dBwdData`] (only when `x` is tracked) and `dw` through
/// [`Conv2dBwdFilter`] (only when `w` is tracked).
#[derive(Debug, Clone, Copy)]
pub struct Conv2dFwd(pub Conv2dParams);

/// The input gradient as a candle op: args `dy` `(N, C_out, H', W')` and `w`; result `dx`
/// `(N, C_in, H, W)`. Follows `cudnnConvolutionBackwardData`. Not differentiable.
#[derive(Debug, Clone, Copy)]
pub struct Conv2dBwdData(pub Conv2dParams);

/// The weight gradient as a candle op: args `x` and `dy`; result `dw`
/// `(C_out, C_in/groups, kh, kw)`. Follows `cudnnConvolutionBackwardFilter`. Not differentiable.
#[derive(Debug, Clone, Copy)]
pub struct Conv2dBwdFilter(pub Conv2dParams);

impl CustomOp2 for Conv2dFwd {
    fn name(&self) -> &'static str {
        "cudnn-conv2d"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_refused(self.name())
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        dispatch(Kind::Forward, &self.0, s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let dx = if x.track_op() {
            Some(dy.apply_op2_no_bwd(w, &Conv2dBwdData(self.0))?)
        } else {
            None
        };
        let dw = if w.track_op() {
            Some(x.apply_op2_no_bwd(&dy, &Conv2dBwdFilter(self.0))?)
        } else {
            None
        };
        Ok((dx, dw))
    }
}

impl CustomOp2 for Conv2dBwdData {
    fn name(&self) -> &'static str {
        "cudnn-conv2d-bwd-data"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_refused(self.name())
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        dispatch(Kind::BackwardData, &self.0, s1, l1, s2, l2)
    }
}

impl CustomOp2 for Conv2dBwdFilter {
    fn name(&self) -> &'static str {
        "cudnn-conv2d-bwd-filter"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_refused(self.name())
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        dispatch(Kind::BackwardFilter, &self.0, s1, l1, s2, l2)
    }
}

/// 2-D convolution `x (N, C_in, H, W) ⊛ w (C_out, C_in/groups, k_h, k_w) → (N, C_out, H', W')`,
/// zero `padding` on every side, `stride` in both directions, dilation 1, `groups` ≥ 1,
/// `H' = (H + 2·padding − k_h)/stride + 1`.
///
/// For tensors on a CUDA device in f32, f16 or bf16 (and unless [`cudnn_conv_enabled`] is off)
/// this is the cuDNN op [`Conv2dFwd`], differentiable through cuDNN's backward-data and
/// backward-filter; the arguments are made contiguous first. Everything else (CPU tensors, other
/// dtypes) goes to candle's `Tensor::conv2d`, so callers need no `cfg`.
///
/// Errors: mismatched shapes or dtypes, tensors on different devices, cuDNN failures and CUDA out
/// of memory.
pub fn conv2d(
    x: &Tensor,
    w: &Tensor,
    padding: usize,
    stride: usize,
    groups: usize,
) -> Result<Tensor> {
    let on_cuda = matches!(x.device(), Device::Cuda(_));
    if !on_cuda || !dtype_supported(x.dtype()) || !cudnn_conv_enabled() {
        return x.conv2d(w, padding, stride, 1, groups);
    }
    same_device_and_dtype("conv2d", x, w)?;
    let p = Conv2dParams::new(x.dims4()?, w.dims4()?, padding, stride, groups)?;
    let x = x.contiguous()?;
    let w = w.contiguous()?;
    x.apply_op2(&w, Conv2dFwd(p))
}

/// The check that [`conv2d`] and [`conv2d_nhwc`] share: input and kernel on one device, of one
/// dtype. Errors name the function and both dtypes.
fn same_device_and_dtype(what: &str, x: &Tensor, w: &Tensor) -> Result<()> {
    if !x.device().same_device(w.device()) {
        return Err(err(format!(
            "{what}: input and kernel are on different devices"
        )));
    }
    if x.dtype() != w.dtype() {
        return Err(err(format!(
            "{what}: input dtype {:?} and kernel dtype {:?} differ",
            x.dtype(),
            w.dtype()
        )));
    }
    Ok(())
}

/// [`conv2d`] on channels-last tensors, forward only: `x (N, H, W, C_in)` and the kernel
/// `w (C_out, kh, kw, C_in/groups)` (the usual kernel permuted by `(0, 2, 3, 1)`) →
/// `(N, H', W', C_out)`, on a CUDA device in f32, f16 or bf16 (cuDNN's NHWC format, whose
/// tensor-core kernels need no layout transposes around them). Not differentiable (inference).
///
/// Errors: not a CUDA tensor of those dtypes, mismatched shapes or dtypes, cuDNN failures and
/// CUDA out of memory.
pub fn conv2d_nhwc(
    x: &Tensor,
    w: &Tensor,
    padding: usize,
    stride: usize,
    groups: usize,
) -> Result<Tensor> {
    if !matches!(x.device(), Device::Cuda(_)) || !dtype_supported(x.dtype()) {
        return Err(err(format!(
            "conv2d_nhwc: {:?} on {:?}: CUDA f32/f16/bf16 only",
            x.dtype(),
            x.device()
        )));
    }
    same_device_and_dtype("conv2d_nhwc", x, w)?;
    let (n, h, wd, c) = x.dims4()?;
    let (k, kh, kw, cg) = w.dims4()?;
    let p =
        Conv2dParams::new((n, c, h, wd), (k, cg, kh, kw), padding, stride, groups)?.channels_last();
    let x = x.contiguous()?;
    let w = w.contiguous()?;
    x.apply_op2_no_bwd(&w, &Conv2dFwd(p))
}

/// The backward of [`conv2d`] on cuDNN without autograd: for `y = conv2d(x, w)` and the output
/// gradient `dy`, returns `dx` (only when `need_dx`; [`Conv2dBwdData`]) and `dw`
/// ([`Conv2dBwdFilter`]), or `None` when the cuDNN path does not apply to these tensors (not on
/// CUDA, a dtype cuDNN does not run, `YOLO9_CONV=candle`), for the caller to differentiate
/// otherwise. Used by the training graph's tape (`crate::model::tape`).
///
/// Errors: as [`conv2d`].
pub fn conv2d_backward(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    padding: usize,
    stride: usize,
    groups: usize,
    need_dx: bool,
) -> Result<Option<(Option<Tensor>, Tensor)>> {
    let on_cuda = matches!(x.device(), Device::Cuda(_));
    if !on_cuda || !dtype_supported(x.dtype()) || !cudnn_conv_enabled() {
        return Ok(None);
    }
    let p = Conv2dParams::new(x.dims4()?, w.dims4()?, padding, stride, groups)?;
    let dy = dy.contiguous()?;
    let dx = if need_dx {
        Some(dy.apply_op2_no_bwd(&w.contiguous()?, &Conv2dBwdData(p))?)
    } else {
        None
    };
    let dw = x.contiguous()?.apply_op2_no_bwd(&dy, &Conv2dBwdFilter(p))?;
    Ok(Some((dx, dw)))
}
