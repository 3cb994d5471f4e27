//! The CPU inference engine: the inference graph of a [`crate::model::YoloV9`] run on NHWC
//! activations with its own kernels instead of candle's generic CPU ops.
//!
//! How it is built (each part in its own file):
//! - [`graph`]: the traced forward ([`crate::model::trace`], the same ops `yolo9 export`
//!   writes) as nodes over values, convolution weights repacked once for the GEMM, the residual
//!   add and the stride-2 max pool fused, and each concatenation done by its producers writing
//!   straight into their slice of its storage.
//! - [`plan`]: per input shape `(B, H, W)`, every value's size and place in one arena; made once
//!   and kept, so a forward allocates only its output (a service's memory stays flat).
//! - [`kernels`]: the convolution as a GEMM on cache-sized tiles of output pixels (1×1: straight
//!   on the NHWC rows; k > 1: im2col per tile), pools, upsampling, copies and the DFL/box decode,
//!   all split over the engine's threads.
//! - [`gemm`]: the GEMM on weights packed once in 32-column panels: micro-kernels with the bias,
//!   SiLU and residual applied in their registers, AVX-512 (12 × 32), AVX2+FMA or NEON (6 × 16),
//!   chosen at run time ([`isa`]); the `gemm` crate on other CPUs.
//! - [`math`]: the vectorised `exp`, SiLU and sigmoid.
//! - [`pool`]: the engine's threads: each op's tasks in one contiguous range per thread (the
//!   same rows from layer to layer), stolen from when a thread falls behind; workers spin
//!   between ops.
//!
//! The engine owns its thread pool ([`CpuEngine::new`]'s `threads`), so a process embedding
//! several detectors decides how many cores each takes and none competes with rayon's global
//! pool. A batch runs image by image through the plan for one image: side by side, one image
//! per thread, when the batch has at least as many images as there are threads; else one after
//! another with each op spread over every thread.
//!
//! Results equal the candle forward to f32 rounding (another summation order: within 1e-5 of
//! the output's largest value on the official oracle, `tests/model/cpu_engine.rs`) and do not depend
//! on the thread count, bit for bit (on the AVX-512, AVX2 and NEON kernels).

mod gemm;
mod graph;
mod igemm;
mod int8;
mod isa;
mod kernels;
mod math;
mod plan;
mod pool;
mod view;
mod winograd;

use self::graph::{Graph, Kind};
use self::kernels::{Exec, Scratch};
use self::plan::Plan;
use self::pool::Pool;
use crate::model::arch::STRIDES;
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Plans kept per engine (input shapes); the oldest is dropped past this.
const MAX_PLANS: usize = 16;
/// Spare arenas kept per plan beyond one per thread (one per image in flight).
const MAX_SPARE_ARENAS: usize = 4;
/// Floats an arena is allocated beyond its plan's length, so that its used part can start on a
/// 64-byte boundary ([`kernels::ALIGN_FLOATS`]).
const ARENA_SLACK: usize = kernels::ALIGN_FLOATS;

/// The number of threads a CPU engine uses when none is set: `YOLO9_THREADS`, else the
/// number of CPUs this process may run on.
pub fn default_threads() -> usize {
    crate::switches::value("YOLO9_THREADS")
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The input of a forward, `x` (B, 3, H, W) with H and W multiples of 32: its `(B, H, W)` and
/// its values as f32, NCHW. Errors name the shape.
fn read_input(x: &Tensor) -> Result<((usize, usize, usize), Vec<f32>)> {
    let (b, c, h, w) = x.dims4()?;
    ensure!(c == 3, "cpu engine: input has {c} channels, expected 3");
    ensure!(
        b > 0 && h > 0 && w > 0 && h % 32 == 0 && w % 32 == 0,
        "cpu engine: input {b}x{c}x{h}x{w}: batch ≥ 1, and H and W multiples of 32"
    );
    let src = x
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()
        .context("reading the input")?;
    Ok(((b, h, w), src))
}

struct Planned {
    plan: Arc<Plan>,
    spare: Vec<Vec<f32>>,
    used: u64,
}

/// A model's inference graph compiled for the CPU (see the module docs). `Send + Sync`:
/// forwards from several threads run at once, each in an arena of its own.
pub struct CpuEngine {
    graph: Graph,
    pool: Pool,
    plans: Mutex<HashMap<(usize, usize, usize), Planned>>,
    calls: std::sync::atomic::AtomicU64,
    arenas_made: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for CpuEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuEngine")
            .field("nodes", &self.graph.nodes.len())
            .field("threads", &self.threads())
            .finish()
    }
}

impl CpuEngine {
    /// Compiles a traced inference forward ([`crate::model::YoloV9::trace_raw`]: `ops` in
    /// execution order, the id of the traced input, the head's raw outputs; for a segmentation
    /// model [`crate::model::YoloV9::trace_seg`]'s, with `extra` its coefficient maps and
    /// prototypes, which [`CpuEngine::forward_seg`] returns) for `threads` threads (0: the
    /// [`default_threads`]). The weights are copied out of the trace and repacked; the trace's
    /// input size does not matter (plans are made per input shape).
    ///
    /// With `int8` (a calibration of this model, [`crate::model::quant`]) the convolutions
    /// run in INT8.
    ///
    /// Errors: an op the engine does not run, a head that is not three levels of 64 + nc
    /// channels, a thread pool that cannot start, a calibration of another model.
    pub fn new(
        ops: Vec<crate::model::trace::TracedOp>,
        input: candle_core::TensorId,
        raw: &[Tensor],
        extra: &[Tensor],
        threads: usize,
        int8: Option<&[crate::model::quant::ConvRange]>,
    ) -> Result<Self> {
        let t0 = Instant::now();
        let graph = Graph::from_trace(ops, input, raw, extra, int8)?;
        ensure!(
            extra.is_empty() || extra.len() == STRIDES.len() + 1,
            "cpu engine: {} mask outputs, expected {} coefficient maps and the prototypes",
            extra.len(),
            STRIDES.len()
        );
        ensure!(
            graph.outputs.len() == STRIDES.len()
                && graph.chans[graph.outputs[0]] > 4 * crate::model::head::REG_MAX,
            "cpu engine: the head has {} levels, expected {} of 64 + nc channels",
            graph.outputs.len(),
            STRIDES.len()
        );
        let threads = if threads == 0 {
            default_threads()
        } else {
            threads
        };
        let pool = Pool::new(threads).context("starting the CPU engine's threads")?;
        tracing::debug!(
            nodes = graph.nodes.len(),
            threads,
            ms = t0.elapsed().as_secs_f64() * 1e3,
            "cpu engine compiled"
        );
        Ok(Self {
            graph,
            pool,
            plans: Mutex::new(HashMap::new()),
            calls: Default::default(),
            arenas_made: Default::default(),
        })
    }

    /// The GEMM micro-kernel this CPU runs: `"avx512"`, `"avx2"`, `"neon"` or `"generic"` (the `gemm`
    /// crate; there the sums' order, and so the last bits, can change with the thread count).
    pub fn kernel(&self) -> &'static str {
        match isa::kernel() {
            isa::Kernel::Avx512 => "avx512",
            isa::Kernel::Avx2 => "avx2",
            isa::Kernel::Neon => "neon",
            isa::Kernel::Generic => "generic",
        }
    }

    /// Threads of the engine's pool.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// (plans kept, arenas allocated so far): one arena per input shape for forwards that
    /// run one at a time, so a loop of calls allocates no activations after its first.
    pub fn stats(&self) -> (usize, usize) {
        let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner()).len();
        (
            plans,
            self.arenas_made.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Floats in the arena of the plan for `(b, h, w)` (activations and scratch), and what the
    /// activations would take if no two shared space; `None` if that shape is not planned.
    pub fn arena_len(&self, b: usize, h: usize, w: usize) -> Option<(usize, usize)> {
        let plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.get(&(b, h, w)).map(|p| (p.plan.len, p.plan.unshared))
    }

    /// Nodes in the compiled graph (after fusion; concatenations that copy nothing included).
    pub fn nodes(&self) -> usize {
        self.graph.nodes.len()
    }

    /// The decoded forward: `x` `(B, 3, H, W)` f32 RGB 0..1 on the CPU, H and W multiples of 32
    /// → `(B, 4 + nc, A)` f32: rows cx, cy, w, h in input pixels, then sigmoid class scores,
    /// anchors P3, P4, P5 row-major (as [`crate::model::YoloV9::forward`]).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let ((b, h, w), src) = read_input(x)?;
        // Every image through the plan for one image: an arena holds one image's activations
        // (a validation batch of 32 needs no more memory per image in flight than 1). A batch
        // of at least as many images as threads runs its images side by side, each on one
        // thread (no synchronisation between ops); a smaller one runs image after image, each
        // op spread over every thread (8 images side by side on 16 threads left half of them
        // idle: 441 ms against 258 ms for ONNX Runtime, `.dev/cpu16b.sh`).
        let per_in = 3 * h * w;
        let threads = self.threads();
        let side_by_side = b > 1 && threads > 1 && b >= threads;
        let rows = 4 + self.nc();
        let (plan, mut arena) = self.checkout(1, h, w)?;
        let per_out = rows * plan.anchors;
        // The call's large buffers (input copy, arena, output) are made on the calling thread
        // (one malloc arena), never on a worker: a loop of calls then keeps a flat resident size.
        let mut out = vec![0f32; b * per_out];
        if side_by_side {
            // One arena per thread: a thread runs one image at a time, each op on itself.
            let mut arenas = vec![arena];
            for _ in 1..threads {
                arenas.push(self.checkout(1, h, w)?.1);
            }
            let slots: Vec<Mutex<Vec<f32>>> = arenas.into_iter().map(Mutex::new).collect();
            let outs: Vec<Mutex<&mut [f32]>> = out.chunks_mut(per_out).map(Mutex::new).collect();
            self.pool.each(b, &|i, t| {
                // Uncontended: thread t alone takes slot t, and image i alone its output.
                let mut arena = slots[t].lock().unwrap_or_else(|e| e.into_inner());
                let mut o = outs[i].lock().unwrap_or_else(|e| e.into_inner());
                let src = &src[i * per_in..(i + 1) * per_in];
                self.run(Exec(None), &plan, &mut arena, src, &mut o, None, None, None);
            });
            drop(outs);
            for arena in slots {
                self.checkin(
                    (1, h, w),
                    arena.into_inner().unwrap_or_else(|e| e.into_inner()),
                );
            }
        } else {
            // The ops run one after another on this thread, each split over the pool.
            let ex = Exec(Some(&self.pool));
            for (i, o) in out.chunks_mut(per_out).enumerate() {
                let src = &src[i * per_in..(i + 1) * per_in];
                self.run(ex, &plan, &mut arena, src, o, None, None, None);
            }
            self.checkin((1, h, w), arena);
        }
        Ok(Tensor::from_vec(
            out,
            (b, rows, plan.anchors),
            &Device::Cpu,
        )?)
    }

    /// Whether the engine computes a segmentation head's masks ([`CpuEngine::forward_seg`]).
    pub fn is_seg(&self) -> bool {
        !self.graph.extra.is_empty()
    }

    /// [`crate::model::YoloV9::forward_seg`] on the engine: x (B, 3, H, W) f32 →
    /// `(pred (B, 4+nc+nm, A), proto (B, nm, Hp, Wp))` f32, the decoded boxes and scores as
    /// [`CpuEngine::forward`] with the raw mask coefficients after them, and the prototypes.
    /// The images run one after another, each op split over the engine's threads. Errors: those
    /// of [`CpuEngine::forward`], or an engine compiled without the mask outputs.
    pub fn forward_seg(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        ensure!(
            self.is_seg(),
            "cpu engine: compiled without the mask outputs"
        );
        let ((b, h, w), src) = read_input(x)?;
        let (plan, mut arena) = self.checkout(1, h, w)?;
        let g = &self.graph;
        let nm = g.chans[g.extra[0]];
        let (ph, pw) = plan.hw[*g.extra.last().expect("checked above")];
        let (rows, anchors) = (4 + self.nc(), plan.anchors);
        let per_out = (rows + nm) * anchors;
        let per_proto = nm * ph * pw;
        let mut out = vec![0f32; b * per_out];
        let mut proto = vec![0f32; b * per_proto];
        let ex = Exec(Some(&self.pool));
        let per_in = 3 * h * w;
        for (i, (o, p)) in out
            .chunks_mut(per_out)
            .zip(proto.chunks_mut(per_proto))
            .enumerate()
        {
            let (det, coeffs) = o.split_at_mut(rows * anchors);
            let src = &src[i * per_in..(i + 1) * per_in];
            self.run(
                ex,
                &plan,
                &mut arena,
                src,
                det,
                Some((coeffs, p)),
                None,
                None,
            );
        }
        self.checkin((1, h, w), arena);
        Ok((
            Tensor::from_vec(out, (b, rows + nm, anchors), &Device::Cpu)?,
            Tensor::from_vec(proto, (b, nm, ph, pw), &Device::Cpu)?,
        ))
    }

    /// Time per node of one forward of `x`'s first image (as [`CpuEngine::forward`]), summed by
    /// kind of op (by layer with `YOLO9_CPU_PROFILE_SHAPES=1`):
    /// `(label, milliseconds, share of the GFLOP)` sorted by time, then `("total", ms, GFLOP)`.
    /// Labels name the op and, for convolutions, kernel and stride (`conv3x3/s1`).
    pub fn profile(&self, x: &Tensor) -> Result<Vec<(String, f64, f64)>> {
        let b = 1;
        let mut times = vec![0f64; self.graph.nodes.len() + 2];
        let plan = self.probed(x, 0, Some(&mut times), None)?;
        let mut by: HashMap<String, (f64, f64)> = HashMap::new();
        let mut total = (0.0, 0.0);
        for (i, n) in self.graph.nodes.iter().enumerate() {
            let (label, flop) = match &n.kind {
                Kind::Conv { w, residual } => {
                    let (oh, ow) = plan.hw[n.y];
                    let f = 2.0 * (b * oh * ow * w.co * w.k * w.k * w.cig) as f64 / 1e9;
                    let r = if residual.is_some() { "+res" } else { "" };
                    if crate::switches::var("YOLO9_CPU_PROFILE_SHAPES").is_some() {
                        (
                            format!(
                                "conv{}x{}/s{}{r} {}->{} g{} {oh}x{ow} #{i}",
                                w.k,
                                w.k,
                                w.stride,
                                w.ci(),
                                w.co,
                                w.groups
                            ),
                            f,
                        )
                    } else {
                        (format!("conv{}x{}/s{}{r}", w.k, w.k, w.stride), f)
                    }
                }
                Kind::Cat { copy, .. } if copy.iter().all(|c| !c) => ("cat (in place)".into(), 0.0),
                Kind::Cat { .. } => ("cat (copy)".into(), 0.0),
                k => (
                    format!("{k:?}")
                        .split([' ', '{'])
                        .next()
                        .unwrap_or("")
                        .to_lowercase(),
                    0.0,
                ),
            };
            let e = by.entry(label).or_default();
            e.0 += times[i];
            e.1 += flop;
            total.0 += times[i];
            total.1 += flop;
        }
        for (label, t) in [
            ("input", times[self.graph.nodes.len()]),
            ("decode", times[self.graph.nodes.len() + 1]),
        ] {
            by.insert(label.into(), (t, 0.0));
            total.0 += t;
        }
        let mut v: Vec<_> = by.into_iter().map(|(k, (t, f))| (k, t, f)).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v.push(("total".into(), total.0, total.1));
        Ok(v)
    }

    /// The range of every convolution's input over one forward of `x`'s images (as
    /// [`CpuEngine::forward`], image by image), by convolution id (trace order): the
    /// calibration of [`crate::convert::int8::calibrate`].
    pub fn conv_input_ranges(&self, x: &Tensor) -> Result<Vec<crate::model::quant::ConvRange>> {
        let mut convs: Vec<&kernels::ConvWeights> = self
            .graph
            .nodes
            .iter()
            .filter_map(|n| match &n.kind {
                Kind::Conv { w, .. } => Some(w.as_ref()),
                _ => None,
            })
            .collect();
        convs.sort_by_key(|w| w.id);
        let mut ranges = vec![(f32::INFINITY, f32::NEG_INFINITY); convs.len()];
        for i in 0..x.dims4()?.0 {
            self.probed(x, i, None, Some(&mut ranges))?;
        }
        Ok(convs
            .iter()
            .zip(ranges)
            .map(|(w, (min, max))| crate::model::quant::ConvRange {
                co: w.co,
                ci: w.ci(),
                k: w.k,
                stride: w.stride,
                min,
                max,
                keep_f32: false,
            })
            .collect())
    }

    /// One forward of image `i` of `x` (as [`CpuEngine::forward`], each op over the pool) for
    /// its probes, `times` and `ranges` filled as [`CpuEngine::run`] fills them; returns the plan
    /// it ran.
    fn probed(
        &self,
        x: &Tensor,
        i: usize,
        times: Option<&mut Vec<f64>>,
        ranges: Option<&mut [(f32, f32)]>,
    ) -> Result<Arc<Plan>> {
        let (_, _, h, w) = x.dims4()?;
        let src = x
            .get(i)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let (plan, mut arena) = self.checkout(1, h, w)?;
        let mut out = vec![0f32; (4 + self.nc()) * plan.anchors];
        let ex = Exec(Some(&self.pool));
        self.run(ex, &plan, &mut arena, &src, &mut out, None, times, ranges);
        self.checkin((1, h, w), arena);
        Ok(plan)
    }

    /// Whether the engine runs convolutions in INT8, and on which kernel (`"vnni512"`,
    /// `"avxvnni"`, `"vnni256"`: the ymm kernel on AVX-512 VNNI under `YOLO9_CPU_GEMM=avx2`, or
    /// `"avx2"`: AVX2 without VNNI, 7-bit weights); `None` for an f32 engine, and for a
    /// calibrated model on a CPU that has neither (which runs it in f32).
    pub fn int8_kernel(&self) -> Option<&'static str> {
        let any = self
            .graph
            .nodes
            .iter()
            .any(|n| matches!(&n.kind, Kind::Conv { w, .. } if w.q.is_some()));
        any.then(|| match igemm::kernel() {
            igemm::Kernel::Vnni512 => "vnni512",
            igemm::Kernel::Vnni256 => "avxvnni",
            igemm::Kernel::Vnni256Evex => "vnni256",
            igemm::Kernel::Avx2 => "avx2",
            igemm::Kernel::Generic => "generic",
        })
    }

    /// Classes of the model's head.
    fn nc(&self) -> usize {
        self.graph.chans[self.graph.outputs[0]] - 4 * crate::model::head::REG_MAX
    }

    /// The plan for `(b, h, w)` and an arena for it (a spare one, or new).
    fn checkout(&self, b: usize, h: usize, w: usize) -> Result<(Arc<Plan>, Vec<f32>)> {
        let n = self
            .calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if !plans.contains_key(&(b, h, w)) {
            let t0 = Instant::now();
            let plan = Plan::new(&self.graph, b, h, w, self.threads())?;
            tracing::debug!(
                batch = b,
                height = h,
                width = w,
                arena_mib = plan.len as f64 * 4.0 / (1 << 20) as f64,
                ms = t0.elapsed().as_secs_f64() * 1e3,
                "cpu engine: plan built"
            );
            if plans.len() >= MAX_PLANS {
                if let Some(old) = plans.iter().min_by_key(|(_, p)| p.used).map(|(k, _)| *k) {
                    plans.remove(&old);
                }
            }
            plans.insert(
                (b, h, w),
                Planned {
                    plan: Arc::new(plan),
                    spare: Vec::new(),
                    used: n,
                },
            );
        }
        let p = plans.get_mut(&(b, h, w)).expect("inserted above");
        p.used = n;
        let plan = p.plan.clone();
        let arena = p.spare.pop().unwrap_or_else(|| {
            self.arenas_made
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            vec![0f32; plan.len + ARENA_SLACK]
        });
        Ok((plan, arena))
    }

    fn checkin(&self, key: (usize, usize, usize), arena: Vec<f32>) {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get_mut(&key) {
            if p.spare.len() < MAX_SPARE_ARENAS + self.threads()
                && arena.len() == p.plan.len + ARENA_SLACK
            {
                p.spare.push(arena);
            }
        }
    }

    /// One forward of `plan` in `arena` on the NCHW input `src`, the decoded output written
    /// into `out` (`(4 + nc) × anchors`). With `times` (nodes + 2 entries), each node's
    /// milliseconds, then the input conversion's and the decode's; with `ranges` (one entry per
    /// convolution id), each convolution's input range widened to the values it reads.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        ex: kernels::Exec,
        plan: &Plan,
        arena: &mut [f32],
        src: &[f32],
        out: &mut [f32],
        masks: Option<(&mut [f32], &mut [f32])>,
        mut times: Option<&mut Vec<f64>>,
        mut ranges: Option<&mut [(f32, f32)]>,
    ) {
        let mut t = Instant::now();
        let mut lap = |i: usize, times: &mut Option<&mut Vec<f64>>| {
            if let Some(ts) = times {
                ts[i] += t.elapsed().as_secs_f64() * 1e3;
                t = Instant::now();
            }
        };
        let g = &self.graph;
        let pool = ex;
        // The plan's storages start at 64-byte multiples from the base, so on a 64-byte aligned
        // base every AVX-512 load and store of a pixel's channels stays within one cache line.
        let base = kernels::aligned(arena, plan.len).as_mut_ptr();
        let act = |o| plan.act(g, base, o);
        let whole = |v: usize| graph::Operand {
            v,
            start: 0,
            len: g.chans[v],
        };
        kernels::from_nchw(pool, src, act(whole(0)));
        lap(g.nodes.len(), &mut times);
        let scratch = Scratch {
            ptr: base.wrapping_add(plan.scratch_at),
            per: plan.scratch_per,
            qbuf: base.wrapping_add(plan.qbuf_at) as *mut u8,
        };
        for (i, n) in g.nodes.iter().enumerate() {
            let x = act(n.x);
            let y = act(whole(n.y));
            match &n.kind {
                Kind::Conv { w, residual } => {
                    if let Some(r) = ranges.as_deref_mut() {
                        r[w.id] = kernels::min_max(x, r[w.id]);
                    }
                    kernels::conv(pool, x, y, residual.map(act), w, scratch)
                }
                Kind::Add { b } => kernels::add(pool, x, act(*b), y),
                Kind::Silu => kernels::silu(pool, x, y),
                Kind::Upsample { f } => kernels::upsample(pool, x, y, *f),
                Kind::TakeEven => kernels::take_even(pool, x, y),
                Kind::AvgPool2 => kernels::avg_pool2(pool, x, y),
                Kind::MaxPool { k, stride } => kernels::max_pool(pool, x, y, *k, *stride),
                Kind::Cat { parts, copy } => {
                    let mut off = 0;
                    for (p, &c) in parts.iter().zip(copy) {
                        if c {
                            let mut slot = y;
                            slot.ptr = y.ptr.wrapping_add(off);
                            slot.c = p.len;
                            kernels::copy(pool, act(*p), slot);
                        }
                        off += p.len;
                    }
                }
            }
            lap(i, &mut times);
        }
        let levels: Vec<_> = g.outputs.iter().map(|&o| act(whole(o))).collect();
        kernels::decode(pool, &levels, &STRIDES, out);
        if let Some((coeffs, proto)) = masks {
            // NHWC maps → channel-major rows: the coefficients (nm, A) in the anchors' order
            // (levels one after another, row-major within a level), the prototypes (nm, Hp, Wp).
            let (maps, p) = g.extra.split_at(g.extra.len() - 1);
            let mut at = 0;
            for &m in maps {
                let a = act(whole(m));
                let anchors = coeffs.len() / a.c;
                kernels::to_channel_rows(a, &mut coeffs[at..], anchors);
                at += a.h * a.w;
            }
            let a = act(whole(p[0]));
            kernels::to_channel_rows(a, proto, a.h * a.w);
        }
        lap(g.nodes.len() + 1, &mut times);
    }
}

#[cfg(test)]
mod tests {
    use crate::model::YoloV9;
    use crate::Weights;
    use candle_core::{Device, Tensor};

    /// The whole engine on this CPU's micro-kernel (AVX-512, AVX2 or the generic one as CI
    /// forces them; NEON in CI's aarch64 run under emulation) against candle's forward of the
    /// same model: the shipped BCCD weights on a 96x128 pattern, decoded outputs within 1e-5 of
    /// their largest value; 1 and 3 threads give the same bits on the engine's own kernels.
    #[test]
    fn engine_equals_the_candle_forward() {
        let w = Weights::load(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/weights/yolov9-s-bccd.safetensors"
        ))
        .unwrap();
        let (h, wd) = (96, 128);
        let px: Vec<f32> = (0..3 * h * wd)
            .map(|i| ((i * 7919) % 251) as f32 / 251.0)
            .collect();
        let x = Tensor::from_vec(px, (1, 3, h, wd), &Device::Cpu).unwrap();
        let m1 = YoloV9::load(&w, &Device::Cpu).unwrap().with_threads(1);
        let e1 = m1.cpu_engine().expect("the engine compiles yolov9-s");
        let y1 = e1.forward(&x).unwrap();
        let want = m1.forward_launched(&x).unwrap();
        assert_eq!(y1.dims(), want.dims());
        let err = (&y1 - &want).unwrap().abs().unwrap().max_all().unwrap();
        let top = want.abs().unwrap().max_all().unwrap();
        let (err, top) = (
            err.to_scalar::<f32>().unwrap(),
            top.to_scalar::<f32>().unwrap(),
        );
        println!("kernel {}: engine vs candle {err:e} of {top}", e1.kernel());
        assert!(top > 10.0 && err <= 1e-5 * top, "{err} of {top}");

        let m3 = YoloV9::load(&w, &Device::Cpu).unwrap().with_threads(3);
        let y3 = m3.cpu_engine().unwrap().forward(&x).unwrap();
        let d = (&y1 - &y3).unwrap().abs().unwrap().max_all().unwrap();
        let d = d.to_scalar::<f32>().unwrap();
        if e1.kernel() == "generic" {
            assert!(d <= 1e-5 * top, "1 vs 3 threads: {d}");
        } else {
            assert_eq!(d, 0.0, "1 vs 3 threads");
        }
    }
}
