//! Reverse mode of the training graph, written for it: one node per layer op instead of candle's
//! one node per tensor op.
//!
//! In a taped forward ([`Ctx::taped`]) every op runs on detached tensors, so candle records no
//! autograd graph; instead each layer op records one node on the [`Tape`]: the ids of its
//! activation inputs and parameters, the id of its output and a backward function that owns what
//! it saved. [`Tape::backward`] walks the nodes in reverse (the forward order is a topological
//! order), starting from the gradients of the graph outputs, and accumulates the contributions to
//! each tensor: the first is kept as it is and later ones are added. Each gradient is dropped as
//! soon as its producer's backward has used it, and each node's saved tensors with the node.
//!
//! What this saves against candle's `Tensor::backward` (measured in `benches/train_step.rs`):
//! candle adds every gradient contribution to a fresh zero tensor (a full-size memset and add per
//! graph edge: 2,513 `badd` launches, 37 ms of kernel time per bs16 step on the H200 in the
//! profile of the training-speed issue), keeps every intermediate gradient until the end, and
//! walks thousands of small nodes (casts, reshapes, narrows) on the host.
//!
//! The nodes' backward functions are the closed forms of the ops (cuDNN backward-data/filter on
//! CUDA, the fused BN + SiLU backward, cat/narrow/add/upsample/pool by hand); where an op has no
//! hand-written backward on a device ([`vjp`]: the CPU convolution, the max-pool), it is
//! differentiated by candle's autograd on a local graph of that op alone, so the math is
//! candle's. `tests/model/train.rs` checks every parameter gradient of the whole training graph
//! against candle's autograd on the CPU; `tests/gpu_parity.rs` does the same on
//! CUDA.

use super::trace::{Trace, TracedOp};
use anyhow::{ensure, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, TensorId, Var};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

/// Environment variable choosing the training step's reverse mode: `1` the tape, `0` candle's
/// autograd. Unset: the tape on CUDA devices, candle's autograd on the CPU (where the tape's
/// convolution backward is candle's own through [`vjp`], which recomputes the forward).
pub const TAPE_ENV: &str = "YOLO9_TAPE";

/// Whether the training step on `dev` runs the taped forward and [`Tape::backward`] (see
/// [`TAPE_ENV`]).
pub fn enabled_for(dev: &candle_core::Device) -> bool {
    match crate::switches::value(TAPE_ENV).as_deref() {
        Some("1") => true,
        Some("0") => false,
        _ => dev.is_cuda(),
    }
}

thread_local! {
    /// The hook [`with_node_hook`] sets for this thread.
    static NODE_HOOK: RefCell<Option<Box<dyn Fn()>>> = const { RefCell::new(None) };
}

/// Runs `f` with `hook` called after each node a taped forward records, after each node's
/// backward and at each [`node_done`] (on this thread; nested calls keep the outer hook).
/// The graphed training step's warm-up passes a hook that settles the device memory pool
/// (`crate::train::graphed`).
pub fn with_node_hook<R>(hook: impl Fn() + 'static, f: impl FnOnce() -> R) -> R {
    let set = NODE_HOOK.with(|h| {
        let mut h = h.borrow_mut();
        if h.is_some() {
            return false;
        }
        *h = Some(Box::new(hook));
        true
    });
    // Cleared on return and on unwind alike.
    struct Clear(bool);
    impl Drop for Clear {
        fn drop(&mut self) {
            if self.0 {
                NODE_HOOK.with(|h| *h.borrow_mut() = None);
            }
        }
    }
    let _clear = Clear(set);
    f()
}

/// Calls this thread's [`with_node_hook`] hook, if any (nothing otherwise).
pub fn node_done() {
    NODE_HOOK.with(|h| {
        if let Some(h) = &*h.borrow() {
            h()
        }
    });
}

/// A node's backward: given the gradient of its output and which of its inputs need one
/// (activations first, then parameters, in the order recorded), the gradient of each input
/// (`None` where not needed).
type Backward = Box<dyn FnOnce(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>>>;

struct Node {
    inputs: Vec<TensorId>,
    need: Vec<bool>,
    output: TensorId,
    backward: Backward,
}

/// The recorded nodes of one taped forward (see the module docs). Not `Send`: a tape lives in
/// the thread that runs the step.
#[derive(Default)]
pub struct Tape {
    nodes: RefCell<Vec<Node>>,
    /// Tensors that need a gradient: outputs of recorded nodes (parameters always do).
    tracked: RefCell<HashSet<TensorId>>,
    /// Graph outputs handed to candle ([`Tape::output`]): variable id → recorded tensor id.
    outputs: RefCell<Vec<(Tensor, TensorId)>>,
}

impl Tape {
    /// An empty tape.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of recorded nodes.
    pub fn len(&self) -> usize {
        self.nodes.borrow().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records that `output` was computed from the activations `inputs` and the parameters
    /// `params` (the model's variables, by id); `backward` maps the output's gradient to one
    /// gradient per input then per parameter.
    pub fn record(
        &self,
        inputs: &[&Tensor],
        params: &[&Tensor],
        output: &Tensor,
        backward: impl FnOnce(&Tensor, &[bool]) -> Result<Vec<Option<Tensor>>> + 'static,
    ) {
        let tracked = self.tracked.borrow();
        let mut need: Vec<bool> = inputs.iter().map(|t| tracked.contains(&t.id())).collect();
        drop(tracked);
        need.extend(params.iter().map(|_| true));
        if !need.iter().any(|&n| n) {
            return;
        }
        let ids = inputs.iter().chain(params).map(|t| t.id()).collect();
        self.tracked.borrow_mut().insert(output.id());
        self.nodes.borrow_mut().push(Node {
            inputs: ids,
            need,
            output: output.id(),
            backward: Box::new(backward),
        });
        node_done();
    }

    /// A graph output handed to candle (e.g. to the loss): a variable copy of `t`, so candle's
    /// autograd computes the loss gradient with respect to it; [`Tape::backward`] takes that
    /// gradient from candle's store.
    pub fn output(&self, t: &Tensor) -> Result<Tensor> {
        let v = Var::from_tensor(t)?.as_tensor().clone();
        self.outputs.borrow_mut().push((v.clone(), t.id()));
        Ok(v)
    }

    /// Runs the backward pass. `loss_grads` is candle's gradient store of the loss (the
    /// gradients of the [`Tape::output`] variables are taken out of it). Returns the gradients of
    /// every parameter that received one, keyed by the parameter tensors' ids.
    ///
    /// Errors: an op's backward failing (CUDA out of memory included), or a backward returning
    /// the wrong number of gradients (a bug).
    pub fn backward(self, loss_grads: &mut GradStore) -> Result<GradStore> {
        let mut grads: HashMap<TensorId, Tensor> = HashMap::new();
        for (var, id) in self.outputs.into_inner() {
            if let Some(g) = loss_grads.remove(&var) {
                accumulate(&mut grads, id, g)?;
            }
        }
        let nodes = self.nodes.into_inner();
        for node in nodes.into_iter().rev() {
            let Some(dy) = grads.remove(&node.output) else {
                continue;
            };
            let gs = (node.backward)(&dy, &node.need)?;
            drop(dy);
            ensure!(
                gs.len() == node.inputs.len(),
                "tape: a backward returned {} gradients for {} inputs",
                gs.len(),
                node.inputs.len()
            );
            for ((id, g), need) in node.inputs.iter().zip(gs).zip(&node.need) {
                if let (Some(g), true) = (g, need) {
                    accumulate(&mut grads, *id, g)?;
                }
            }
            // The node's backward (with what it saved) and its output's gradient are dropped.
            node_done();
        }
        let mut out = GradStore::default();
        for (id, g) in grads {
            out.insert_id(id, g);
        }
        Ok(out)
    }
}

/// Adds `g` to the gradient of `id` (stores it when it is the first contribution).
fn accumulate(grads: &mut HashMap<TensorId, Tensor>, id: TensorId, g: Tensor) -> Result<()> {
    use std::collections::hash_map::Entry;
    match grads.entry(id) {
        Entry::Vacant(e) => {
            e.insert(g);
        }
        Entry::Occupied(mut e) => {
            let s = super::ew::add(e.get(), &g)?;
            e.insert(s);
        }
    }
    Ok(())
}

/// The gradients of `f` at `inputs` contracted with `dy` (a vector-Jacobian product), by
/// candle's autograd on a graph of `f` alone: `f` runs on variable copies of the inputs and
/// `(f(inputs) · dy)` is differentiated (candle seeds its backward with ones, so no reduction is
/// needed). Inputs that receive no gradient get zeros.
pub fn vjp(
    f: impl FnOnce(&[Tensor]) -> candle_core::Result<Tensor>,
    inputs: &[&Tensor],
    dy: &Tensor,
) -> Result<Vec<Tensor>> {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t))
        .collect::<candle_core::Result<_>>()?;
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&ts)?;
    let g = (y * dy.detach())?.backward()?;
    ts.iter()
        .map(|t| match g.get(t) {
            Some(d) => Ok(d.detach()),
            None => Ok(t.zeros_like()?),
        })
        .collect()
}

/// How a forward runs: `train` (batch-statistics BN, differentiable pooling) and, for a taped
/// training forward, the tape that records it. Without a tape every op is the plain candle op
/// (candle's autograd records what needs it), which is what inference, validation and the CPU
/// training path use.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    /// Train mode.
    pub train: bool,
    /// The tape of a taped forward.
    pub tape: Option<&'a Tape>,
    /// Channels-last activations (B, H, W, C): the inference forward on tensor-core layouts
    /// ([`Ctx::plain_nhwc`]). Channel arguments (`dim` 1) of [`Ctx::cat`] and [`Ctx::narrow`]
    /// then mean the last dimension.
    pub nhwc: bool,
    /// The trace of a traced eval forward ([`Ctx::tracing`]).
    pub trace: Option<&'a Trace>,
}

impl<'a> Ctx<'a> {
    /// A plain (untaped) forward in train or eval mode.
    pub fn plain(train: bool) -> Self {
        Ctx {
            train,
            tape: None,
            nhwc: false,
            trace: None,
        }
    }

    /// The plain eval-mode forward on channels-last (B, H, W, C) activations (CUDA inference:
    /// convolutions through [`crate::model::conv::Conv::run`] on cuDNN's NHWC format).
    pub fn plain_nhwc() -> Self {
        Ctx {
            train: false,
            tape: None,
            nhwc: true,
            trace: None,
        }
    }

    /// Whether this is the untaped, untraced channels-last forward of [`Ctx::plain_nhwc`], where
    /// ops may take their fused inference forms (nothing records or differentiates them).
    pub fn is_plain_nhwc(&self) -> bool {
        self.nhwc && self.tape.is_none() && self.trace.is_none()
    }

    /// A taped train-mode forward recording on `tape`.
    pub fn taped(tape: &'a Tape) -> Self {
        Ctx {
            train: true,
            tape: Some(tape),
            nhwc: false,
            trace: None,
        }
    }

    /// The plain eval-mode NCHW forward recording every layer op on `trace` (for export; see
    /// [`super::trace`]).
    pub fn tracing(trace: &'a Trace) -> Self {
        Ctx {
            train: false,
            tape: None,
            nhwc: false,
            trace: Some(trace),
        }
    }

    /// Records `op` when tracing.
    pub fn record(&self, op: impl FnOnce() -> TracedOp) {
        if let Some(t) = self.trace {
            t.push(op());
        }
    }

    /// `x` in a contiguous layout when the forward is a plain eval one (a copy made once where
    /// several ops read a strided view); `x` itself otherwise.
    pub fn contiguous_for_eval(&self, x: &Tensor) -> Result<Tensor> {
        if self.tape.is_some() || self.train {
            return Ok(x.clone());
        }
        let y = x.contiguous()?;
        self.record(|| TracedOp::Alias {
            x: x.id(),
            y: y.id(),
        });
        Ok(y)
    }

    /// The dimension of an NCHW `dim` in this context's layout (channels last: 1 → 3).
    fn dim(&self, dim: usize) -> usize {
        if self.nhwc && dim == 1 {
            3
        } else {
            dim
        }
    }

    /// `a + b` (same shapes).
    pub fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let y = super::ew::add(a, b)?;
        self.record(|| TracedOp::Add {
            a: a.id(),
            b: b.id(),
            y: y.id(),
        });
        if let Some(t) = self.tape {
            t.record(&[a, b], &[], &y, |dy, _| {
                Ok(vec![Some(dy.clone()), Some(dy.clone())])
            });
        }
        Ok(y)
    }

    /// Concatenation along `dim`; the backward hands each input its slice of the gradient.
    pub fn cat(&self, xs: &[&Tensor], dim: usize) -> Result<Tensor> {
        let dim = self.dim(dim);
        let y = Tensor::cat(xs, dim)?;
        self.record(|| TracedOp::Cat {
            xs: xs.iter().map(|x| x.id()).collect(),
            y: y.id(),
            dim,
        });
        if let Some(t) = self.tape {
            let sizes: Vec<usize> = xs
                .iter()
                .map(|x| x.dim(dim))
                .collect::<candle_core::Result<_>>()?;
            t.record(xs, &[], &y, move |dy, need| {
                let mut off = 0;
                let mut out = Vec::with_capacity(sizes.len());
                for (&n, &nd) in sizes.iter().zip(need) {
                    out.push(if nd {
                        Some(dy.narrow(dim, off, n)?)
                    } else {
                        None
                    });
                    off += n;
                }
                Ok(out)
            });
        }
        Ok(y)
    }

    /// `x.narrow(dim, start, len)`; the backward pads the gradient with zeros to x's shape.
    pub fn narrow(&self, x: &Tensor, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        let dim = self.dim(dim);
        let y = x.narrow(dim, start, len)?;
        self.record(|| TracedOp::Narrow {
            x: x.id(),
            y: y.id(),
            dim,
            start,
            len,
        });
        if let Some(t) = self.tape {
            let total = x.dim(dim)?;
            t.record(&[x], &[], &y, move |dy, _| {
                Ok(vec![Some(dy.pad_with_zeros(
                    dim,
                    start,
                    total - start - len,
                )?)])
            });
        }
        Ok(y)
    }

    /// SiLU `x·σ(x)`; backward `dy·σ(x)·(1 + x·(1 − σ(x)))` (one op,
    /// [`super::bn_act::silu_backward`], where the fused kernels run).
    pub fn silu(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.silu()?;
        self.record(|| TracedOp::Silu {
            x: x.id(),
            y: y.id(),
        });
        if let Some(t) = self.tape {
            let xs = x.clone();
            t.record(&[x], &[], &y, move |dy, _| {
                if super::bn_act::bn_act_supported(xs.device(), xs.dtype()) && xs.rank() == 4 {
                    return Ok(vec![Some(super::bn_act::silu_backward(&xs, dy)?)]);
                }
                let s = candle_nn::ops::sigmoid(&xs)?;
                let d = (&s * ((&xs * (1.0 - &s)?)? + 1.0)?)?;
                Ok(vec![Some((dy * d)?)])
            });
        }
        Ok(y)
    }

    /// dtype cast (mixed precision); the backward casts the gradient back.
    pub fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        if x.dtype() == dtype {
            return Ok(x.clone());
        }
        let y = x.to_dtype(dtype)?;
        if let Some(t) = self.tape {
            let from = x.dtype();
            t.record(&[x], &[], &y, move |dy, _| {
                Ok(vec![Some(dy.to_dtype(from)?)])
            });
        }
        Ok(y)
    }

    /// `nn.Upsample(scale_factor=2, mode='nearest')` ([`super::pool::upsample_nearest_2x`]);
    /// the backward sums each 2×2 block of the gradient.
    pub fn upsample_nearest_2x(&self, x: &Tensor) -> Result<Tensor> {
        self.upsample_nearest(x, 2)
    }

    /// Nearest upsampling by the integer factor `f` ([`super::pool::upsample_nearest`]; what
    /// `F.interpolate(mode='nearest')` does in `CBFuse` when the target size is `f` times the
    /// input's); the backward sums each f×f block of the gradient. `f = 1` is the identity.
    pub fn upsample_nearest(&self, x: &Tensor, f: usize) -> Result<Tensor> {
        if f == 1 {
            return Ok(x.clone());
        }
        if self.nhwc {
            return super::pool::nhwc::upsample_nearest(x, f);
        }
        let y = super::pool::upsample_nearest(x, f)?;
        self.record(|| TracedOp::Upsample {
            x: x.id(),
            y: y.id(),
            factor: f,
        });
        if let Some(t) = self.tape {
            let (b, c, h, w) = x.dims4()?;
            t.record(&[x], &[], &y, move |dy, _| {
                let g = dy.reshape((b, c, h, f, w, f))?.sum(5)?.sum(3)?;
                Ok(vec![Some(g)])
            });
        }
        Ok(y)
    }

    /// The even rows and columns of x ([`super::pool::take_even`]): (B, C, H, W) →
    /// (B, C, ⌈H/2⌉, ⌈W/2⌉). With [`Ctx::max_pool_same`] of kernel 3 it is
    /// `max_pool2d(3, stride 2, padding 1)` (official `ADown`): each stride-2 window is the
    /// stride-1 window centred on an even cell. The backward puts each gradient back on its cell.
    pub fn take_even(&self, x: &Tensor) -> Result<Tensor> {
        if self.nhwc {
            return super::pool::nhwc::take_even(x);
        }
        let y = super::pool::take_even(x)?;
        self.record(|| TracedOp::TakeEven {
            x: x.id(),
            y: y.id(),
        });
        if let Some(t) = self.tape {
            let (b, c, h, w) = x.dims4()?;
            t.record(&[x], &[], &y, move |dy, _| {
                let (h2, w2) = (h.div_ceil(2), w.div_ceil(2));
                let g = dy
                    .reshape((b, c, h2, 1, w2, 1))?
                    .pad_with_zeros(3, 0, 1)?
                    .pad_with_zeros(5, 0, 1)?
                    .reshape((b, c, 2 * h2, 2 * w2))?
                    .narrow(2, 0, h)?
                    .narrow(3, 0, w)?
                    .contiguous()?;
                Ok(vec![Some(g)])
            });
        }
        Ok(y)
    }

    /// `avg_pool2d(2, stride 1)` ([`super::pool::avg_pool_2x2_s1`]). Taped, the forward is the
    /// untaped train-mode one (the same additions, so the same rounding) and the backward spreads
    /// a quarter of each output gradient over its 2×2 window: with `g` the gradient padded by one
    /// zero row and column on every side, `dx[i, j] = (g[i, j] + g[i, j+1] + g[i+1, j] +
    /// g[i+1, j+1]) / 4`. On CUDA both are one kernel (the inference pool's forward and
    /// [`super::pool::avg_pool_2x2_s1_backward`]): the same f32 sums in the same order; in bf16
    /// each result is rounded once instead of after every addition.
    pub fn avg_pool_2x2_s1(&self, x: &Tensor) -> Result<Tensor> {
        if self.nhwc {
            return super::pool::nhwc::avg_pool_2x2_s1(x);
        }
        let Some(t) = self.tape else {
            let y = super::pool::avg_pool_2x2_s1(x, self.train)?;
            self.record(|| TracedOp::AvgPool2x2S1 {
                x: x.id(),
                y: y.id(),
            });
            return Ok(y);
        };
        // On CUDA one kernel each way (the same f32 arithmetic as the composite below; in bf16
        // the sum is rounded once instead of after each addition).
        if super::pool::infer_pool_runs(x) {
            let y = super::pool::infer_pool(x, crate::op_args::InferPool::Avg2Nchw)?;
            t.record(&[x], &[], &y, move |dy, _| {
                Ok(vec![Some(super::pool::avg_pool_2x2_s1_backward(dy)?)])
            });
            return Ok(y);
        }
        let y = super::pool::avg_pool_2x2_s1(x, true)?;
        let (_, _, h, w) = x.dims4()?;
        t.record(&[x], &[], &y, move |dy, _| {
            let g = dy.pad_with_zeros(2, 1, 1)?.pad_with_zeros(3, 1, 1)?;
            let top = g.narrow(2, 0, h)?;
            let bot = g.narrow(2, 1, h)?;
            let s = (top.narrow(3, 0, w)? + top.narrow(3, 1, w)?)?;
            let s = ((s + bot.narrow(3, 0, w)?)? + bot.narrow(3, 1, w)?)?;
            Ok(vec![Some((s * 0.25)?)])
        });
        Ok(y)
    }

    /// `MaxPool2d(k, 1, k/2)` ([`super::pool::max_pool_same`]). Taped (where the op runs,
    /// [`super::pool::max_pool_op_supported`]) it is one op forward and one backward
    /// ([`super::pool::max_pool_same_op`], [`super::pool::max_pool_same_backward`]: each window's
    /// gradient to its first maximum, as PyTorch; the untaped composite splits ties).
    pub fn max_pool_same(&self, x: &Tensor, k: usize) -> Result<Tensor> {
        if self.nhwc {
            return super::pool::nhwc::max_pool_same(x, k);
        }
        let Some(t) = self.tape else {
            // Eval on CUDA: one launch per pool instead of the separable composite.
            let y = if !self.train && super::pool::infer_pool_runs(x) && k <= 15 {
                super::pool::max_pool_same_op(x, k)?
            } else {
                super::pool::max_pool_same(x, k)?
            };
            self.record(|| TracedOp::MaxPoolSame {
                x: x.id(),
                y: y.id(),
                k,
            });
            return Ok(y);
        };
        if !super::pool::max_pool_op_supported(x) {
            let y = super::pool::max_pool_same(x, k)?;
            let xs = x.clone();
            t.record(&[x], &[], &y, move |dy, _| {
                let g = vjp(
                    |v| {
                        super::pool::max_pool_same(&v[0], k)
                            .map_err(|e| candle_core::Error::Msg(e.to_string()))
                    },
                    &[&xs],
                    dy,
                )?;
                Ok(g.into_iter().map(Some).collect())
            });
            return Ok(y);
        }
        let y = super::pool::max_pool_same_op(x, k)?;
        let xs = x.clone();
        t.record(&[x], &[], &y, move |dy, _| {
            Ok(vec![Some(super::pool::max_pool_same_backward(&xs, dy, k)?)])
        });
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use std::rc::Rc;

    /// The hook of `with_node_hook` runs after each recorded node, after each node's backward
    /// (by then its saved tensors are dropped) and at `node_done`; only within the call, and a
    /// nested call keeps the outer hook.
    #[test]
    fn node_hook_runs_after_each_node_forward_and_backward() -> Result<()> {
        let dev = Device::Cpu;
        let w = Var::new(&[2f32, 3.0], &dev)?;
        let x = Tensor::new(&[1f32, 4.0], &dev)?;
        let calls = Rc::new(std::cell::Cell::new(0usize));
        let c = calls.clone();
        let grads = with_node_hook(
            move || c.set(c.get() + 1),
            || -> Result<GradStore> {
                let tape = Tape::new();
                // y = x · w, z = 2 · y: two nodes.
                let y = (&x * w.as_tensor())?;
                let xs = x.clone();
                tape.record(&[], &[w.as_tensor()], &y, move |dy, _| {
                    Ok(vec![Some((dy * &xs)?)])
                });
                let z = (&y * 2.0)?;
                tape.record(&[&y], &[], &z, |dy, _| Ok(vec![Some((dy * 2.0)?)]));
                assert_eq!(tape.len(), 2);
                let out = tape.output(&z)?;
                node_done();
                // A nested hook is ignored: the outer one still counts.
                with_node_hook(|| panic!("inner hook called"), node_done);
                let mut lg = out.sum_all()?.backward()?;
                tape.backward(&mut lg)
            },
        )?;
        // 2 records + node_done + the nested node_done + 2 backward nodes.
        assert_eq!(calls.get(), 6);
        // dz/dw = 2 · x.
        let g = grads.get(w.as_tensor()).expect("gradient of w");
        assert_eq!(g.to_vec1::<f32>()?, vec![2.0, 8.0]);
        // Outside the call there is no hook.
        node_done();
        assert_eq!(calls.get(), 6);
        Ok(())
    }
}
