//! Convolution + folded bias + SiLU as one cuDNN operation graph (the backend API), for
//! channels-last inference activations in f16 or bf16: `y = silu(conv(x, w) + b)` (or
//! `conv(x, w) + b`), with the sum and the activation applied to the f32 accumulator inside the
//! convolution's kernel, so the output is written once and never read back by a separate
//! epilogue pass (the pass [`super::bias_act`] makes otherwise).
//!
//! The graph is cuDNN's "convolution forward followed by pointwise operations" pattern:
//! `CONVOLUTION_FORWARD (x, w) → t1 (virtual, f32)`, `POINTWISE_ADD (t1, b) → t2 (virtual, f32)`,
//! `POINTWISE_SWISH_FWD (t2) → y` (β = 1: `t · σ(t)`, SiLU), and for RepNBottleneck's shortcut a last
//! `POINTWISE_ADD` of the residual `r`. cuDNN's engines that run it (its
//! runtime-fusion engines compile the kernel for the shape, with NVRTC) are found by its heuristics
//! (`CUDNN_HEUR_MODE_A`); each candidate that builds an execution plan is timed once per shape
//! and the fastest is kept for the process (as [`super::conv`] times its algorithms). A shape no
//! engine runs is remembered as such and the caller takes the unfused path.
//!
//! `x` is `(N, H, W, C)` whose pixels are evenly spaced ([`super::gemm::row_stride`]): contiguous,
//! or a channel slice of a larger tensor (ELAN1's and RepNCSP's halves), read where it lies through
//! its strides. `w` is the `(K, kh, kw, C)` kernel (groups 1), `b` the `(K,)` bias, both of `x`'s
//! dtype; the output is a new contiguous `(N, H', W', K)`. Zero padding `p` on every side,
//! stride `s`, dilation 1 (cross-correlation, as `torch.nn.Conv2d`).
//!
//! Plans are built outside CUDA graph captures (a shape without a plan inside a capture is an
//! error, as for the algorithm search); a launch inside a capture takes a workspace of its own.
//! Every cuDNN failure is an error or, while building, a shape left to the unfused path; nothing
//! here panics on a runtime path.

use super::algo_cache::{AlgoCache, Kind as CacheKind};
use super::conv::{capturing, grow_workspace, launch_workspace, ws_arg};
use super::conv_params::Conv2dParams;
use super::gemm::row_stride;
use candle_core::backend::BackendStorage;
use candle_core::cuda::DeviceId;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr,
};
use candle_core::{
    CpuStorage, CudaDevice, CudaStorage, CustomOp1, DType, Device, Error, Layout, Result, Shape,
    Storage, Tensor,
};
use cudarc::cudnn::sys;
use cudarc::cudnn::sys::cudnnBackendAttributeName_t as A;
use cudarc::cudnn::sys::cudnnBackendAttributeType_t as T;
use cudarc::cudnn::sys::cudnnBackendDescriptorType_t as D;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

/// Environment variable choosing which convolutions run fused: `off` (none: the convolution, then
/// the bias + SiLU pass), `3x3` (those with a kernel larger than 1×1), `all` (also 1×1 ones of a
/// single input, which otherwise run as cuBLAS products).
pub const FUSED_ENV: &str = "YOLO9_CUDNN_FUSED";

/// Which convolutions run fused ([`FUSED_ENV`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fused {
    /// None.
    Off,
    /// Kernels larger than 1×1.
    Spatial,
    /// Every convolution of one input.
    All,
}

/// 0 = not yet read, 1 = off, 2 = spatial, 3 = all.
static FUSED: AtomicU8 = AtomicU8::new(0);

/// The current choice ([`FUSED_ENV`] until [`set_fused`] is called; default [`Fused::All`]).
pub fn fused() -> Fused {
    match FUSED.load(Ordering::Relaxed) {
        1 => Fused::Off,
        2 => Fused::Spatial,
        3 => Fused::All,
        _ => {
            let v = crate::switches::value(FUSED_ENV).unwrap_or_default();
            let f = match v.trim().to_ascii_lowercase().as_str() {
                "off" | "0" | "no" => Fused::Off,
                "3x3" | "spatial" => Fused::Spatial,
                _ => Fused::All,
            };
            set_fused(f);
            f
        }
    }
}

/// Sets which convolutions run fused from now on.
pub fn set_fused(f: Fused) {
    let v = match f {
        Fused::Off => 1,
        Fused::Spatial => 2,
        Fused::All => 3,
    };
    FUSED.store(v, Ordering::Relaxed);
}

/// Timed launches per candidate engine (after one untimed launch).
const BENCH_REPS: usize = 3;
/// Candidates (heuristics results that build a plan) timed per shape.
const MAX_CANDIDATES: usize = 6;
/// Largest workspace a candidate may need.
const WORKSPACE_LIMIT: i64 = 1 << 30;

fn err(msg: impl std::fmt::Display) -> Error {
    Error::Cuda(format!("fused convolution (cuDNN graph): {msg}").into())
}

fn check(s: sys::cudnnStatus_t, what: &str) -> Result<()> {
    if s == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(err(format!("{what}: {s:?}")))
    }
}

/// One backend descriptor, destroyed on drop.
struct Desc(sys::cudnnBackendDescriptor_t);

impl Desc {
    fn new(kind: D) -> Result<Self> {
        let mut d: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: `d` is a valid out-pointer; cuDNN allocates the descriptor.
        check(
            unsafe { sys::cudnnBackendCreateDescriptor(kind, &mut d) },
            "create descriptor",
        )?;
        Ok(Self(d))
    }

    /// Sets attribute `name` of type `ty` to `vals` (elements of the C type `ty` names).
    fn set<V>(&self, name: A, ty: T, vals: &[V]) -> Result<()> {
        // SAFETY: `vals` holds `vals.len()` elements of the type `ty` names (every caller passes
        // the matching Rust type: i64, f32, bool, enums of repr(u32), descriptor or raw pointers).
        let s = unsafe {
            sys::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                vals.len() as i64,
                vals.as_ptr().cast::<c_void>(),
            )
        };
        check(s, &format!("set {name:?}"))
    }

    fn desc(&self, name: A, d: &Desc) -> Result<()> {
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &[d.0])
    }

    fn finalize(&self, what: &str) -> Result<()> {
        // SAFETY: a descriptor created by `new` whose attributes were set.
        check(unsafe { sys::cudnnBackendFinalize(self.0) }, what)
    }

    fn get_i64(&self, name: A) -> Result<i64> {
        let mut v = 0i64;
        let mut n = 0i64;
        // SAFETY: one i64 out-value.
        let s = unsafe {
            sys::cudnnBackendGetAttribute(
                self.0,
                name,
                T::CUDNN_TYPE_INT64,
                1,
                &mut n,
                (&mut v as *mut i64).cast(),
            )
        };
        check(s, &format!("get {name:?}"))?;
        Ok(v)
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
            unsafe { sys::cudnnBackendDestroyDescriptor(self.0) };
        }
    }
}

/// The cuDNN data type of a dtype the fused path runs.
fn data_type(d: DType) -> Option<sys::cudnnDataType_t> {
    match d {
        DType::F16 => Some(sys::cudnnDataType_t::CUDNN_DATA_HALF),
        DType::BF16 => Some(sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        _ => None,
    }
}

/// A tensor descriptor: dimensions in N, C, H, W order with the given strides (elements).
fn tensor(
    uid: i64,
    ty: sys::cudnnDataType_t,
    dims: [i64; 4],
    strides: [i64; 4],
    align: i64,
    virt: bool,
) -> Result<Desc> {
    let t = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[ty],
    )?;
    t.set(A::CUDNN_ATTR_TENSOR_DIMENSIONS, T::CUDNN_TYPE_INT64, &dims)?;
    t.set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, &strides)?;
    t.set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[uid])?;
    t.set(
        A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        T::CUDNN_TYPE_INT64,
        &[align],
    )?;
    t.set(
        A::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
        T::CUDNN_TYPE_BOOLEAN,
        &[virt],
    )?;
    t.finalize("tensor descriptor")?;
    Ok(t)
}

fn pointwise(mode: sys::cudnnPointwiseMode_t) -> Result<Desc> {
    let p = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
    p.set(
        A::CUDNN_ATTR_POINTWISE_MODE,
        T::CUDNN_TYPE_POINTWISE_MODE,
        &[mode],
    )?;
    p.set(
        A::CUDNN_ATTR_POINTWISE_MATH_PREC,
        T::CUDNN_TYPE_DATA_TYPE,
        &[sys::cudnnDataType_t::CUDNN_DATA_FLOAT],
    )?;
    p.finalize("pointwise descriptor")?;
    Ok(p)
}

/// Unique ids of the tensors a launch binds.
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_B: i64 = 3;
const UID_Y: i64 = 4;
const UID_R: i64 = 5;

/// The shape of one fused convolution: the convolution, `x`'s row stride (elements) and the
/// byte alignment of its first element, the dtype, whether SiLU follows the bias, whether a
/// residual (contiguous, the output's shape) is added last, and the output's row stride where
/// it is a channel slice of a larger tensor (0: contiguous; the slice starts 16-byte aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    p: Conv2dParams,
    ld: usize,
    align: u8,
    dtype: DType,
    silu: bool,
    residual: bool,
    yld: usize,
}

impl Key {
    /// The algorithm cache's kind of this key (the fields beyond the convolution).
    fn cache_kind(&self) -> CacheKind {
        CacheKind::Fused {
            ld: self.ld,
            align: self.align,
            silu: self.silu,
            residual: self.residual,
            yld: self.yld,
        }
    }
}

/// An operation graph and the descriptors it is made of (kept alive with its plans).
struct Graph {
    graph: Desc,
    _parts: Vec<Desc>,
}

/// A built execution plan: its position in the heuristics' list, its workspace (bytes).
struct Plan {
    plan: Desc,
    workspace: usize,
    index: usize,
    _cfg: Desc,
}

/// Adds `op_type(x [, b]) → y` to `ops` (a pointwise operation of `mode`).
fn pointwise_op(
    mode: sys::cudnnPointwiseMode_t,
    x: &Desc,
    b: Option<&Desc>,
    y: &Desc,
    keep: &mut Vec<Desc>,
) -> Result<sys::cudnnBackendDescriptor_t> {
    let pw = pointwise(mode)?;
    let op = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
    op.desc(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &pw)?;
    op.desc(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)?;
    if let Some(b) = b {
        op.desc(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b)?;
    }
    op.desc(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)?;
    op.finalize("pointwise operation")?;
    let raw = op.0;
    keep.push(pw);
    keep.push(op);
    Ok(raw)
}

/// The convolution descriptor of `p` (f32 accumulation, cross-correlation, dilation 1).
fn conv_desc(p: &Conv2dParams) -> Result<Desc> {
    let f32t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let (pad, st) = (p.padding as i64, p.stride as i64);
    let conv = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[f32t],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        T::CUDNN_TYPE_CONVOLUTION_MODE,
        &[sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
        T::CUDNN_TYPE_INT64,
        &[2i64],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        T::CUDNN_TYPE_INT64,
        &[1i64, 1],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        T::CUDNN_TYPE_INT64,
        &[st, st],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        T::CUDNN_TYPE_INT64,
        &[pad, pad],
    )?;
    conv.set(
        A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        T::CUDNN_TYPE_INT64,
        &[pad, pad],
    )?;
    conv.finalize("convolution descriptor")?;
    Ok(conv)
}

/// The operation graph of `key` (module docs); `None` when cuDNN does not take it.
fn graph(handle: sys::cudnnHandle_t, key: &Key) -> Result<Option<Graph>> {
    let p = key.p;
    let ty = data_type(key.dtype).ok_or_else(|| err(format!("dtype {:?}", key.dtype)))?;
    let f32t = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let i = |v: usize| v as i64;
    let (n, c, h, w) = (i(p.batch), i(p.c_in), i(p.h), i(p.w));
    let (k, kh, kw) = (i(p.c_out), i(p.kh), i(p.kw));
    let (oh, ow) = (i(p.out_h()), i(p.out_w()));
    let ld = i(key.ld);
    let xs = [h * w * ld, 1, w * ld, ld];
    let x = tensor(UID_X, ty, [n, c, h, w], xs, i64::from(key.align), false)?;
    let ws = [kh * kw * c, 1, kw * c, c];
    let wt = tensor(UID_W, ty, [k, c, kh, kw], ws, 16, false)?;
    let ys = [oh * ow * k, 1, ow * k, k];
    let yd = [n, k, oh, ow];
    let b = tensor(UID_B, ty, [1, k, 1, 1], [k, 1, k, k], 16, false)?;
    let yld = if key.yld == 0 { k } else { i(key.yld) };
    let y = tensor(UID_Y, ty, yd, [oh * ow * yld, 1, ow * yld, yld], 16, false)?;
    let conv = conv_desc(&p)?;

    let t_conv = tensor(101, f32t, yd, ys, 16, true)?;
    let op_conv = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
    op_conv.desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &x)?;
    op_conv.desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &wt)?;
    op_conv.desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &t_conv)?;
    op_conv.desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, &conv)?;
    let float = T::CUDNN_TYPE_FLOAT;
    op_conv.set(
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
        float,
        &[1f32],
    )?;
    op_conv.set(
        A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
        float,
        &[0f32],
    )?;
    op_conv.finalize("convolution operation")?;

    // conv → + b → [SiLU] → [+ r] → y; every intermediate a virtual f32 tensor.
    let mut keep = Vec::new();
    let mut ops = vec![op_conv.0];
    let steps = 1 + usize::from(key.silu) + usize::from(key.residual);
    let mut cur = t_conv;
    let r = if key.residual {
        Some(tensor(UID_R, ty, yd, ys, 16, false)?)
    } else {
        None
    };
    for step in 0..steps {
        let last = step + 1 == steps;
        let next = if last {
            None
        } else {
            Some(tensor(102 + step as i64, f32t, yd, ys, 16, true)?)
        };
        let out = next.as_ref().unwrap_or(&y);
        let (mode, other) = match step {
            0 => (sys::cudnnPointwiseMode_t::CUDNN_POINTWISE_ADD, Some(&b)),
            1 if key.silu => (sys::cudnnPointwiseMode_t::CUDNN_POINTWISE_SWISH_FWD, None),
            _ => (sys::cudnnPointwiseMode_t::CUDNN_POINTWISE_ADD, r.as_ref()),
        };
        ops.push(pointwise_op(mode, &cur, other, out, &mut keep)?);
        keep.push(cur);
        match next {
            Some(t) => cur = t,
            None => break,
        }
    }

    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    graph.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_OPS,
        T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
        &ops,
    )?;
    if graph.finalize("operation graph").is_err() {
        return Ok(None);
    }
    keep.extend([x, wt, b, y, conv, op_conv]);
    keep.extend(r);
    Ok(Some(Graph {
        graph,
        _parts: keep,
    }))
}

/// The engine configurations cuDNN's heuristics (`CUDNN_HEUR_MODE_A`) propose for `g`, best
/// first; none when the heuristics refuse the graph.
fn heuristics(g: &Graph) -> Result<Vec<Desc>> {
    let heur = Desc::new(D::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.desc(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &g.graph)?;
    heur.set(
        A::CUDNN_ATTR_ENGINEHEUR_MODE,
        T::CUDNN_TYPE_HEUR_MODE,
        &[sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
    )?;
    if heur.finalize("engine heuristics").is_err() {
        return Ok(Vec::new());
    }
    let results = A::CUDNN_ATTR_ENGINEHEUR_RESULTS;
    let desc_t = T::CUDNN_TYPE_BACKEND_DESCRIPTOR;
    let mut count = 0i64;
    // SAFETY: a count query (no elements requested).
    let s = unsafe {
        sys::cudnnBackendGetAttribute(heur.0, results, desc_t, 0, &mut count, std::ptr::null_mut())
    };
    check(s, "engine heuristics count")?;
    let cfgs: Vec<Desc> = (0..count.max(0))
        .map(|_| Desc::new(D::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<_>>()?;
    if cfgs.is_empty() {
        return Ok(cfgs);
    }
    let mut raw: Vec<sys::cudnnBackendDescriptor_t> = cfgs.iter().map(|d| d.0).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `count` engine-config descriptors for cuDNN to fill.
    let s = unsafe {
        sys::cudnnBackendGetAttribute(
            heur.0,
            results,
            desc_t,
            count,
            &mut got,
            raw.as_mut_ptr().cast(),
        )
    };
    check(s, "engine heuristics results")?;
    let mut cfgs = cfgs;
    cfgs.truncate(got.max(0) as usize);
    Ok(cfgs)
}

/// The execution plan of engine configuration `cfg` (position `index` in the heuristics'
/// list); `None` when it does not build or needs more than [`WORKSPACE_LIMIT`].
fn build_plan(handle: sys::cudnnHandle_t, cfg: Desc, index: usize) -> Result<Option<Plan>> {
    let plan = Desc::new(D::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set(
        A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    plan.desc(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &cfg)?;
    if plan.finalize("execution plan").is_err() {
        return Ok(None);
    }
    let ws = plan.get_i64(A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
    if !(0..=WORKSPACE_LIMIT).contains(&ws) {
        return Ok(None);
    }
    Ok(Some(Plan {
        plan,
        workspace: ws as usize,
        index,
        _cfg: cfg,
    }))
}

/// The graph of `key` and its candidate plans: only the configuration at `only` (a choice kept
/// from an earlier run) or the first [`MAX_CANDIDATES`] that build. No graph when cuDNN refuses
/// it.
fn candidates(
    handle: sys::cudnnHandle_t,
    key: &Key,
    only: Option<usize>,
) -> Result<Option<(Graph, Vec<Plan>)>> {
    let Some(g) = graph(handle, key)? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (index, cfg) in heuristics(&g)?.into_iter().enumerate() {
        if out.len() >= MAX_CANDIDATES || only.is_some_and(|o| o != index) {
            continue;
        }
        if let Some(p) = build_plan(handle, cfg, index)? {
            out.push(p);
        }
    }
    Ok(Some((g, out)))
}

/// The per-device state: a cuDNN handle bound to candle's stream, the chosen plan of every shape
/// (`None`: no engine runs it), a workspace and the choices kept across runs.
struct Engine {
    handle: sys::cudnnHandle_t,
    stream: Arc<CudaStream>,
    plans: HashMap<Key, Option<(Plan, Graph)>>,
    workspace: Option<CudaSlice<u8>>,
    file: Option<AlgoCache>,
}

// SAFETY: the raw handle and descriptors are used only with the engine's mutex held (cuDNN allows
// a handle on any thread, one thread at a time).
unsafe impl Send for Engine {}

type Engines = Mutex<HashMap<DeviceId, Arc<Mutex<Engine>>>>;
static ENGINES: OnceLock<Engines> = OnceLock::new();

fn engine(dev: &CudaDevice) -> Result<Arc<Mutex<Engine>>> {
    let map = ENGINES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().map_err(|_| err("engine map poisoned"))?;
    if let Some(e) = map.get(&dev.id()) {
        return Ok(e.clone());
    }
    let stream = dev.cuda_stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| err(format!("binding the CUDA context: {e:?}")))?;
    let handle = cudarc::cudnn::result::create_handle()
        .map_err(|e| err(format!("creating a handle: {e:?}")))?;
    // SAFETY: a live handle and candle's stream of this device.
    unsafe { cudarc::cudnn::result::set_stream(handle, stream.cu_stream() as *mut _) }
        .map_err(|e| err(format!("setting the stream: {e:?}")))?;
    let file = AlgoCache::for_stream(&stream, "graph");
    let e = Arc::new(Mutex::new(Engine {
        handle,
        stream,
        plans: HashMap::new(),
        workspace: None,
        file,
    }));
    map.insert(dev.id(), e.clone());
    Ok(e)
}

/// The device address of a launch's workspace (`0`: none).
fn ws_addr(ws: Option<&mut CudaSlice<u8>>, stream: &Arc<CudaStream>) -> u64 {
    ws.map_or(0, |w| w.device_ptr(stream).0)
}

impl Engine {
    /// Runs `plan` on `ptrs` (x, w, b, y and, with a residual, r) with workspace `ws`.
    fn execute(&self, plan: &Plan, ptrs: &[u64], ws: u64) -> Result<()> {
        let vp = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        let raw: Vec<*mut c_void> = ptrs.iter().map(|&p| p as *mut c_void).collect();
        let uids = &[UID_X, UID_W, UID_B, UID_Y, UID_R][..ptrs.len()];
        let void = T::CUDNN_TYPE_VOID_PTR;
        vp.set(A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, void, &raw)?;
        vp.set(
            A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            T::CUDNN_TYPE_INT64,
            uids,
        )?;
        vp.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            void,
            &[ws as *mut c_void],
        )?;
        vp.finalize("variant pack")?;
        // SAFETY: the plan was built on this handle; the pointers hold tensors of the plan's
        // shapes (checked by the op) and the workspace has the plan's size.
        check(
            unsafe { sys::cudnnBackendExecute(self.handle, plan.plan.0, vp.0) },
            "execute",
        )
    }

    /// Times each candidate on `ptrs` ([`BENCH_REPS`] launches after one) and returns the
    /// position of the fastest in `cands`.
    fn fastest(&mut self, key: &Key, cands: &[Plan], ptrs: &[u64]) -> Result<Option<usize>> {
        let sync = |s: &Arc<CudaStream>| {
            s.synchronize()
                .map_err(|e| err(format!("synchronize while timing: {e:?}")))
        };
        let mut best: Option<(f64, usize)> = None;
        for (i, c) in cands.iter().enumerate() {
            if grow_workspace(&self.stream, &mut self.workspace, c.workspace).is_err() {
                continue;
            }
            let ws = ws_addr(ws_arg(&mut self.workspace, c.workspace), &self.stream);
            if self.execute(c, ptrs, ws).is_err() {
                continue;
            }
            sync(&self.stream)?;
            let t = Instant::now();
            let mut ok = true;
            for _ in 0..BENCH_REPS {
                ok &= self.execute(c, ptrs, ws).is_ok();
            }
            sync(&self.stream)?;
            let dt = t.elapsed().as_secs_f64() / BENCH_REPS as f64;
            if super::conv::trace_on() {
                crate::text::errln!(
                    "cudnn-fused {key:?} engine {} ws {} ok {ok} ms {:.4}",
                    c.index,
                    c.workspace,
                    dt * 1e3
                );
            }
            if ok && best.is_none_or(|(b, _)| dt < b) {
                best = Some((dt, i));
            }
        }
        Ok(best.map(|b| b.1))
    }

    /// The workspace (bytes) of the plan of `key`, built on first use: the configuration kept
    /// from an earlier run, or the fastest candidate, timed on `ptrs`. `None`: no engine runs it.
    fn plan(&mut self, key: &Key, ptrs: &[u64]) -> Result<Option<usize>> {
        if let Some(p) = self.plans.get(key) {
            return Ok(p.as_ref().map(|(p, _)| p.workspace));
        }
        if capturing(&self.stream) {
            return Err(err(
                "a convolution shape without a fused plan inside a CUDA graph capture (the \
                 warm-up forward must run the same shapes first)",
            ));
        }
        let t0 = Instant::now();
        let trace = super::conv::trace_on();
        let kind = key.cache_kind();
        let kept = self
            .file
            .as_ref()
            .and_then(|f| f.get(kind, &key.p, key.dtype, false));
        let kept = kept.map(|v| v as usize);
        // A graph cuDNN cannot describe is a shape left to the unfused path, not a failure.
        let mut built = candidates(self.handle, key, kept).unwrap_or_else(|e| {
            if trace {
                crate::text::errln!("cudnn-fused {key:?} not built: {e}");
            }
            None
        });
        if kept.is_some() && built.as_ref().is_none_or(|(_, c)| c.is_empty()) {
            built = candidates(self.handle, key, None).ok().flatten();
        }
        let entry = match built {
            Some((g, mut cands)) if !cands.is_empty() => {
                let pick = if cands.len() == 1 {
                    Some(0)
                } else {
                    self.fastest(key, &cands, ptrs)?
                };
                pick.map(|i| (cands.swap_remove(i), g))
            }
            _ => None,
        };
        if let (Some((p, _)), Some(f)) = (&entry, self.file.as_mut()) {
            if kept != Some(p.index) {
                f.put(kind, &key.p, key.dtype, false, p.index as u32);
            }
        }
        if trace {
            crate::text::errln!(
                "cudnn-fused {key:?} built in {:.1} ms (kept {kept:?}), engine {:?}",
                t0.elapsed().as_secs_f64() * 1e3,
                entry.as_ref().map(|(p, _)| p.index)
            );
        }
        let ws = entry.as_ref().map(|(p, _)| p.workspace);
        self.plans.insert(*key, entry);
        Ok(ws)
    }
}

/// `silu(conv(x, w) + b) [+ r]` (or without SiLU) as one cuDNN graph (module docs):
/// `x (N, H, W, C)` f16/bf16 on CUDA with evenly spaced pixels, `w (K, kh, kw, C)`, `b (K,)`,
/// `r` a contiguous `(N, H', W', K)` → `(N, H', W', K)`. `Ok(None)` where the fused path does not
/// apply ([`fused`] off for this kernel size, another dtype or device, groups, pixels not evenly
/// spaced, a residual not contiguous, or no cuDNN engine runs the shape): the caller then runs
/// the convolution and the separate passes.
///
/// Errors: cuDNN failures of a launch, CUDA out of memory, a shape first seen inside a graph
/// capture.
pub fn conv_bias_act_nhwc(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    geometry: (usize, usize, usize),
    silu: bool,
    residual: Option<&Tensor>,
) -> Result<Option<Tensor>> {
    let Some(op) = fused_op(x, w, b, geometry, silu, residual)? else {
        return Ok(None);
    };
    match x.apply_op1_no_bwd(&op) {
        Ok(y) => Ok(Some(y)),
        Err(e) if e.to_string().contains(NO_ENGINE) => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`conv_bias_act_nhwc`] written into channels `c_off .. c_off + K` of `out`, a contiguous
/// `(N, H', W', C_total)` CUDA tensor of `x`'s dtype (a concatenation built in place: the
/// other channels are left as they are). `Ok(false)` where the fused path does not apply (as
/// [`conv_bias_act_nhwc`]'s `None`; also `out` of another dtype or device, not contiguous, or a
/// slice not 16-byte aligned): `out` is then unchanged.
///
/// `out` is written through its device address while only a shared reference is held: nothing
/// may read those channels until this returns (the stream orders the GPU's work).
///
/// Errors: as [`conv_bias_act_nhwc`]; `out` of another batch or spatial size than the output, or
/// too few channels for `c_off + K`.
pub fn conv_bias_act_nhwc_into(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    geometry: (usize, usize, usize),
    silu: bool,
    residual: Option<&Tensor>,
    (out, c_off): (&Tensor, usize),
) -> Result<bool> {
    let Some(op) = fused_op(x, w, b, geometry, silu, residual)? else {
        return Ok(false);
    };
    let p = op.p;
    let (on, oh, ow, oc) = out.dims4()?;
    if (on, oh, ow) != (p.batch, p.out_h(), p.out_w()) || c_off + p.c_out > oc {
        return Err(err(format!(
            "fused convolution into {:?} at channel {c_off}: output {:?}",
            out.dims(),
            (p.batch, p.out_h(), p.out_w(), p.c_out)
        )));
    }
    let size = out.dtype().size_in_bytes();
    if out.dtype() != x.dtype()
        || !out.is_contiguous()
        || !out.device().same_device(x.device())
        || !(c_off * size).is_multiple_of(16)
        || !(oc * size).is_multiple_of(16)
    {
        return Ok(false);
    }
    let (sx, lx) = x.storage_and_layout();
    let Storage::Cuda(sx) = &*sx else {
        return Ok(false);
    };
    let r = match sx.dtype() {
        DType::F16 => op.launch::<half::f16>(sx, lx, Some((out, c_off))),
        DType::BF16 => op.launch::<half::bf16>(sx, lx, Some((out, c_off))),
        d => Err(err(format!("dtype {d:?}"))),
    };
    match r {
        Ok(_) => Ok(true),
        Err(e) if e.to_string().contains(NO_ENGINE) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The op of a fused convolution when it applies (module docs; [`conv_bias_act_nhwc`]).
fn fused_op(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (padding, stride, groups): (usize, usize, usize),
    silu: bool,
    residual: Option<&Tensor>,
) -> Result<Option<FusedOp>> {
    let mode = fused();
    let Device::Cuda(_) = x.device() else {
        return Ok(None);
    };
    let (k, kh, kw, c) = w.dims4()?;
    let spatial = kh > 1 || kw > 1;
    if mode == Fused::Off
        || (mode == Fused::Spatial && !spatial)
        || groups != 1
        || data_type(x.dtype()).is_none()
        || w.dtype() != x.dtype()
        || b.dtype() != x.dtype()
        || b.elem_count() != k
    {
        return Ok(None);
    }
    let (n, h, wd, cx) = x.dims4()?;
    if cx != c || row_stride(x.layout()).is_none() {
        return Ok(None);
    }
    let p = Conv2dParams::new((n, c, h, wd), (k, c, kh, kw), padding, stride, 1)?.channels_last();
    if let Some(r) = residual {
        let want = [n, p.out_h(), p.out_w(), k];
        if r.dims() != want || r.dtype() != x.dtype() || !r.is_contiguous() {
            return Ok(None);
        }
    }
    Ok(Some(FusedOp {
        p,
        silu,
        w: w.contiguous()?,
        b: b.contiguous()?.flatten_all()?,
        r: residual.cloned(),
    }))
}

/// The marker of the error that means "no engine runs this fused convolution" (the caller
/// falls back to the unfused path).
const NO_ENGINE: &str = "no cuDNN engine runs this fused convolution";

/// The op of [`conv_bias_act_nhwc`] on `x`, holding the kernel, the bias and the residual.
struct FusedOp {
    p: Conv2dParams,
    silu: bool,
    w: Tensor,
    b: Tensor,
    r: Option<Tensor>,
}

impl CustomOp1 for FusedOp {
    fn name(&self) -> &'static str {
        "cudnn-conv-bias-silu"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Err(err("CUDA only"))
    }

    fn cuda_fwd(&self, sx: &CudaStorage, lx: &Layout) -> Result<(CudaStorage, Shape)> {
        let y = match sx.dtype() {
            DType::F16 => self.launch::<half::f16>(sx, lx, None)?,
            DType::BF16 => self.launch::<half::bf16>(sx, lx, None)?,
            d => return Err(err(format!("dtype {d:?}"))),
        };
        let y = y.ok_or_else(|| err("no output"))?;
        let p = self.p;
        Ok((y, Shape::from((p.batch, p.out_h(), p.out_w(), p.c_out))))
    }
}

/// The device address of the first element of a contiguous CUDA tensor of `E`, with the
/// storage guard that keeps it alive.
fn address<E: candle_core::cuda::CudaDType + DeviceRepr>(
    t: &Tensor,
    stream: &Arc<CudaStream>,
) -> Result<u64> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*st else {
        return Err(err("an operand is not on the GPU"));
    };
    let (start, _) = l
        .contiguous_offsets()
        .ok_or_else(|| err("an operand is not contiguous"))?;
    let (p, _g) = cs.as_cuda_slice::<E>()?.device_ptr(stream);
    Ok(p + (start * std::mem::size_of::<E>()) as u64)
}

impl FusedOp {
    /// Launches the plan of this op on `sx`: into a new contiguous output (returned), or into
    /// channels `c_off ..` of `into` (checked by [`conv_bias_act_nhwc_into`]; returns `None`).
    fn launch<E: candle_core::cuda::CudaDType + DeviceRepr>(
        &self,
        sx: &CudaStorage,
        lx: &Layout,
        into: Option<(&Tensor, usize)>,
    ) -> Result<Option<CudaStorage>> {
        let p = self.p;
        let dev = sx.device().clone();
        let stream = dev.cuda_stream();
        let ld = row_stride(lx).ok_or_else(|| err("input pixels not evenly spaced"))?;
        let elems = p.batch * p.out_h() * p.out_w() * p.c_out;
        let mut y = match into {
            // SAFETY: the plan writes every output element (β = 0).
            None => Some(unsafe { dev.alloc::<E>(elems)? }),
            Some(_) => None,
        };
        let (into_ptr, yld) = match into {
            Some((out, c_off)) => (
                Some(address::<E>(out, &stream)? + (c_off * std::mem::size_of::<E>()) as u64),
                out.dim(3)?,
            ),
            None => (None, 0),
        };
        let (xp, _xg) = sx.as_cuda_slice::<E>()?.device_ptr(&stream);
        let xp = xp + (lx.start_offset() * std::mem::size_of::<E>()) as u64;
        // The operands stay alive (and unwritten) for the call: `self` holds them.
        let wp = address::<E>(&self.w, &stream)?;
        let bp = address::<E>(&self.b, &stream)?;
        let rp = self
            .r
            .as_ref()
            .map(|r| address::<E>(r, &stream))
            .transpose()?;
        // The largest power of two (≤ 16) dividing x's address: a plan assumes it.
        let align = [16u64, 8, 4, 2]
            .into_iter()
            .find(|a| xp.is_multiple_of(*a))
            .unwrap_or(2) as u8;
        let key = Key {
            p,
            ld,
            align,
            dtype: sx.dtype(),
            silu: self.silu,
            residual: rp.is_some(),
            yld,
        };
        {
            let mut yg = None;
            let yp = match (&mut y, into_ptr) {
                (Some(y), _) => {
                    let (yp, g) = y.device_ptr_mut(&stream);
                    yg = Some(g);
                    yp
                }
                (None, Some(p)) => p,
                (None, None) => return Err(err("no output")),
            };
            let mut ptrs = vec![xp, wp, bp, yp];
            ptrs.extend(rp);
            let e = engine(&dev)?;
            let mut e = e.lock().map_err(|_| err("engine poisoned"))?;
            e.stream
                .context()
                .bind_to_thread()
                .map_err(|e| err(format!("binding the CUDA context: {e:?}")))?;
            let Some(bytes) = e.plan(&key, &ptrs)? else {
                return Err(err(NO_ENGINE));
            };
            // The shared workspace, or inside a graph capture one of the launch's own (kept in
            // `own` until the launch is enqueued).
            let mut own = None;
            let e = &mut *e;
            let ws = launch_workspace(&e.stream, &mut e.workspace, &mut own, bytes)?;
            let ws = ws_addr(ws, &stream);
            let Some(Some((plan, _))) = e.plans.get(&key) else {
                return Err(err(NO_ENGINE));
            };
            e.execute(plan, &ptrs, ws)?;
            drop(yg);
        }
        Ok(y.map(|y| CudaStorage::wrap_cuda_slice(y, dev)))
    }
}
