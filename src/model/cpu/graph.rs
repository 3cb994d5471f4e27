//! The inference graph as the CPU engine runs it: the traced ops of [`crate::model::trace`]
//! turned into nodes over numbered values, with the convolution weights repacked once, two
//! fusions applied, and every concatenation resolved into writes straight into its destination.
//!
//! - **Values** are the tensors the forward produces (NHWC inside the engine). A narrow or a
//!   layout copy produces no value: it is an [`Operand`], a channel range of a value.
//! - **Fusions**: a residual `x + conv(..)` whose conv output has no other reader becomes the
//!   conv's epilogue (the conv moves to the add's place, where `x` is ready); a max pool followed
//!   by "take the even cells" (official `ADown`: `max_pool2d(3, 2, 1)`) becomes one stride-2 pool.
//! - **In-place concatenation**: the values a concatenation joins are *placed* in its storage at
//!   their channel offset, so their producers write there and the concatenation costs nothing.
//!   A value read through narrows that cover it in order (the two `chunk` halves of
//!   `RepNCSPELAN4`) is placed as a whole. What cannot be placed (the network input, a value
//!   already placed elsewhere, a head output) is copied into its slot.
//!
//! The graph is shape-free: spatial sizes come from the input shape of each plan
//! ([`super::plan`]).

use super::kernels::ConvWeights;
use crate::model::quant::ConvRange;
use crate::model::trace::TracedOp;
use anyhow::{bail, ensure, Context, Result};
use candle_core::{Tensor, TensorId};
use std::collections::HashMap;

/// Channels `start..start + len` of value `v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand {
    pub v: usize,
    pub start: usize,
    pub len: usize,
}

/// What a node computes; its input is [`Node::x`] and its output value [`Node::y`].
#[derive(Debug)]
pub(crate) enum Kind {
    /// `y = act(conv(x, w) + b) (+ residual)`.
    Conv {
        w: Box<ConvWeights>,
        residual: Option<Operand>,
    },
    /// `y = x + b`.
    Add { b: Operand },
    /// Nearest upsampling by `f`.
    Upsample { f: usize },
    /// The even rows and columns.
    TakeEven,
    /// `avg_pool2d(2, stride 1)`.
    AvgPool2,
    /// `max_pool2d(k, stride, padding k/2)` (stride 1, or 2 after fusing a take-even).
    MaxPool { k: usize, stride: usize },
    /// `y = x·σ(x)`.
    Silu,
    /// Concatenation of `parts` along channels; `copy[i]` tells which parts were not placed in
    /// `y` and are copied there when the node runs.
    Cat {
        parts: Vec<Operand>,
        copy: Vec<bool>,
    },
}

/// One step of the forward.
#[derive(Debug)]
pub(crate) struct Node {
    pub kind: Kind,
    /// The main input (unused by `Cat`, which reads `parts`).
    pub x: Operand,
    pub y: usize,
}

/// Where a value lives: channel `off` onward of the storage of value `root`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub root: usize,
    pub off: usize,
}

/// The engine's graph (see the module docs).
#[derive(Debug)]
pub(crate) struct Graph {
    /// Nodes in execution order.
    pub nodes: Vec<Node>,
    /// Channels of every value; value 0 is the network input (3 channels).
    pub chans: Vec<usize>,
    /// Storage of every value (`root == v` for a value with storage of its own).
    pub place: Vec<Place>,
    /// The head's raw outputs per level (P3, P4, P5): (64 + nc) channels each.
    pub outputs: Vec<usize>,
    /// A segmentation head's other outputs: the mask coefficients per level (nm channels each),
    /// then the prototypes (nm channels); empty for a detection model.
    pub extra: Vec<usize>,
}

impl Graph {
    /// The graph of a traced forward: `ops` in execution order, `input` the traced input's id,
    /// `outputs` the ids of the head's raw outputs, `extra` those of a segmentation head's
    /// coefficient maps and prototypes (kept whole, in storage of their own, to the end of the
    /// forward). With `int8`, the calibrated input range of
    /// every convolution in trace order, the convolutions run in INT8 except those marked
    /// [`ConvRange::keep_f32`] (and all of them on a CPU without AVX-512 VNNI, where the portable
    /// INT8 loop would be slower than f32), those that write the head's outputs (the box and class
    /// convolutions of each level: [`keeps_f32`]) and the first one, on the image (over 3
    /// channels, 27 weights per output channel: in INT8 it cost the shipped BCCD weights 0.010
    /// of test mAP50-95, 0.519 against 0.529, and nothing in f32). Errors: a calibration made
    /// for another model (count or shapes differ).
    pub fn from_trace(
        ops: Vec<TracedOp>,
        input: TensorId,
        outputs: &[Tensor],
        extra: &[Tensor],
        int8: Option<&[ConvRange]>,
    ) -> Result<Self> {
        let mut b = Builder {
            int8,
            keep: keeps_f32(&ops, &[outputs, extra].concat()),
            ..Default::default()
        };
        b.ids.insert(
            input,
            Operand {
                v: 0,
                start: 0,
                len: 3,
            },
        );
        b.chans.push(3);
        for op in ops {
            b.op(op)?;
        }
        if let Some(r) = int8 {
            ensure!(
                r.len() == b.convs,
                "int8 calibration: {} convolutions recorded, the model has {}: it was made for another model",
                r.len(),
                b.convs
            );
        }
        let whole = |ts: &[Tensor]| {
            ts.iter()
                .map(|t| {
                    let o = b.get(t.id())?;
                    ensure!(
                        o.start == 0 && o.len == b.chans[o.v],
                        "cpu engine: a head output is a slice of a value"
                    );
                    Ok(o.v)
                })
                .collect::<Result<Vec<_>>>()
        };
        let (outputs, extra) = (whole(outputs)?, whole(extra)?);
        let mut g = Graph {
            nodes: b.nodes,
            place: (0..b.chans.len())
                .map(|v| Place { root: v, off: 0 })
                .collect(),
            chans: b.chans,
            outputs,
            extra,
        };
        g.fuse_residuals();
        g.fuse_strided_pools();
        g.place_concatenations();
        Ok(g)
    }

    /// How many times each value is read (node inputs, concatenation parts, outputs).
    fn readers(&self) -> Vec<usize> {
        let mut n = vec![0; self.chans.len()];
        for node in &self.nodes {
            for o in node.inputs() {
                n[o.v] += 1;
            }
        }
        for &o in self.outputs.iter().chain(&self.extra) {
            n[o] += 1;
        }
        n
    }

    /// `a + conv(..)` → the conv with a residual epilogue, run where the add was.
    fn fuse_residuals(&mut self) {
        let mut i = 0;
        while i < self.nodes.len() {
            let readers = self.readers();
            let Kind::Add { b } = self.nodes[i].kind else {
                i += 1;
                continue;
            };
            let a = self.nodes[i].x;
            let y = self.nodes[i].y;
            let whole = |o: Operand, g: &Graph| o.start == 0 && o.len == g.chans[o.v];
            let conv_of = |o: Operand, g: &Graph| {
                g.nodes[..i]
                    .iter()
                    .position(|n| n.y == o.v && matches!(n.kind, Kind::Conv { residual: None, .. }))
            };
            let pick = [(b, a), (a, b)].into_iter().find_map(|(c, r)| {
                (whole(c, self) && readers[c.v] == 1)
                    .then(|| conv_of(c, self).map(|j| (j, r)))
                    .flatten()
            });
            let Some((j, res)) = pick else {
                i += 1;
                continue;
            };
            let mut conv = self.nodes.remove(j);
            if let Kind::Conv { residual, .. } = &mut conv.kind {
                *residual = Some(res);
            }
            conv.y = y;
            // The add was at i; with j < i removed it is now at i - 1.
            self.nodes[i - 1] = conv;
        }
    }

    /// `max_pool(k, 1)` whose only reader takes the even cells → `max_pool(k, 2)`.
    fn fuse_strided_pools(&mut self) {
        let mut i = 0;
        while i < self.nodes.len() {
            let readers = self.readers();
            let is_pool = matches!(self.nodes[i].kind, Kind::MaxPool { stride: 1, .. });
            let v = self.nodes[i].y;
            let next = self.nodes.iter().position(|n| {
                matches!(n.kind, Kind::TakeEven)
                    && n.x
                        == (Operand {
                            v,
                            start: 0,
                            len: self.chans[v],
                        })
            });
            match (is_pool, next) {
                (true, Some(j)) if readers[v] == 1 && j > i => {
                    let te = self.nodes.remove(j);
                    if let Kind::MaxPool { stride, .. } = &mut self.nodes[i].kind {
                        *stride = 2;
                    }
                    self.nodes[i].y = te.y;
                }
                _ => i += 1,
            }
        }
    }

    /// Places the parts of every concatenation in its storage where it can (module docs).
    fn place_concatenations(&mut self) {
        let mut producer = vec![usize::MAX; self.chans.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            producer[n.y] = i;
        }
        let mut placed = vec![false; self.chans.len()];
        for &o in self.outputs.iter().chain(&self.extra) {
            placed[o] = true; // outputs keep their own storage
        }
        for i in (0..self.nodes.len()).rev() {
            let y = self.nodes[i].y;
            let Kind::Cat { parts, .. } = &self.nodes[i].kind else {
                continue;
            };
            let parts = parts.clone();
            let base = self.place[y];
            let mut copy = vec![true; parts.len()];
            let mut offs = Vec::with_capacity(parts.len());
            let mut o = 0;
            for p in &parts {
                offs.push(o);
                o += p.len;
            }
            for k in 0..parts.len() {
                if !copy[k] {
                    continue;
                }
                let p = parts[k];
                let v = p.v;
                if placed[v] || producer[v] == usize::MAX || producer[v] > i {
                    continue;
                }
                // v would sit at channel q of y; every part overlapping [q, q + C_v) must be
                // the matching slice of v.
                let Some(q) = offs[k].checked_sub(p.start) else {
                    continue;
                };
                let cv = self.chans[v];
                if q + cv > self.chans[y] {
                    continue;
                }
                let fits = parts.iter().zip(&offs).all(|(pp, &po)| {
                    let overlaps = po < q + cv && q < po + pp.len;
                    !overlaps || (pp.v == v && po == q + pp.start)
                });
                let covered: usize = parts
                    .iter()
                    .zip(&offs)
                    .filter(|(pp, &po)| pp.v == v && po == q + pp.start)
                    .map(|(pp, _)| pp.len)
                    .sum();
                if !fits || covered != cv {
                    continue;
                }
                placed[v] = true;
                self.place[v] = Place {
                    root: base.root,
                    off: base.off + q,
                };
                self.move_members(v);
                for (kk, (pp, &po)) in parts.iter().zip(&offs).enumerate() {
                    if pp.v == v && po == q + pp.start {
                        copy[kk] = false;
                    }
                }
            }
            if let Kind::Cat { copy: c, .. } = &mut self.nodes[i].kind {
                *c = copy;
            }
        }
    }

    /// After value `v` moved: the values already placed in `v`'s storage follow it.
    fn move_members(&mut self, v: usize) {
        let to = self.place[v];
        for u in 0..self.place.len() {
            if u != v && self.place[u].root == v {
                self.place[u] = Place {
                    root: to.root,
                    off: to.off + self.place[u].off,
                };
            }
        }
    }
}

impl Node {
    /// The operands the node reads.
    pub fn inputs(&self) -> Vec<Operand> {
        match &self.kind {
            Kind::Cat { parts, .. } => parts.clone(),
            Kind::Add { b } => vec![self.x, *b],
            Kind::Conv {
                residual: Some(r), ..
            } => vec![self.x, *r],
            _ => vec![self.x],
        }
    }
}

/// The traced tensors that a concatenation joins into a head output: their convolutions stay
/// f32 in an INT8 model (the box distribution and class logits, whose rounding the decode and
/// the scores would feel most; the official DFL and sigmoid follow them).
fn keeps_f32(ops: &[TracedOp], outputs: &[Tensor]) -> std::collections::HashSet<TensorId> {
    let outs: std::collections::HashSet<TensorId> = outputs.iter().map(|t| t.id()).collect();
    let mut keep = std::collections::HashSet::new();
    for op in ops {
        if let TracedOp::Cat { xs, y, .. } = op {
            if outs.contains(y) {
                keep.extend(xs.iter().copied());
            }
        }
    }
    keep.extend(outs);
    keep
}

#[derive(Default)]
struct Builder<'a> {
    ids: HashMap<TensorId, Operand>,
    chans: Vec<usize>,
    nodes: Vec<Node>,
    /// Convolutions seen so far (the next one's id).
    convs: usize,
    /// The calibrated input ranges of the convolutions, by id.
    int8: Option<&'a [ConvRange]>,
    /// Outputs whose convolutions stay f32 ([`keeps_f32`]).
    keep: std::collections::HashSet<TensorId>,
}

impl Builder<'_> {
    fn get(&self, id: TensorId) -> Result<Operand> {
        self.ids
            .get(&id)
            .copied()
            .context("cpu engine: an op reads a value no traced op produced")
    }

    fn value(&mut self, id: TensorId, c: usize) -> usize {
        let v = self.chans.len();
        self.chans.push(c);
        self.ids.insert(
            id,
            Operand {
                v,
                start: 0,
                len: c,
            },
        );
        v
    }

    fn node(&mut self, kind: Kind, x: Operand, y: TensorId, c: usize) {
        let y = self.value(y, c);
        self.nodes.push(Node { kind, x, y });
    }

    fn op(&mut self, op: TracedOp) -> Result<()> {
        match op {
            TracedOp::Conv {
                x,
                y,
                weight,
                bias,
                stride,
                padding,
                groups,
                act,
            } => {
                let x = self.get(x)?;
                let id = self.convs;
                self.convs += 1;
                let range = match self.int8 {
                    // The portable INT8 loop is several times slower than the f32 kernels: a CPU
                    // without a vector INT8 kernel runs the calibrated model in f32.
                    Some(_) if super::igemm::kernel() == super::igemm::Kernel::Generic => None,
                    Some(r) => {
                        let c = r.get(id).with_context(|| {
                            format!("int8 calibration: {} convolutions recorded, the model has more: it was made for another model", r.len())
                        })?;
                        let (co, ci, k, _) = weight.dims4()?;
                        ensure!(
                            (c.co, c.ci, c.k, c.stride) == (co, ci * groups, k, stride),
                            "int8 calibration: convolution {id} was recorded as {}->{} k{} s{}, the model's is {co}->{} k{k} s{stride}: it was made for another model",
                            c.co,
                            c.ci,
                            c.k,
                            c.stride,
                            ci * groups
                        );
                        (!c.keep_f32 && x.v != 0 && !self.keep.contains(&y))
                            .then_some((c.min, c.max))
                    }
                    None => None,
                };
                let mut w = ConvWeights::pack(
                    &weight,
                    bias.as_ref(),
                    (stride, padding, groups),
                    act,
                    range,
                )?;
                w.id = id;
                ensure!(
                    w.ci() == x.len,
                    "cpu engine: a conv expects {} channels, gets {}",
                    w.ci(),
                    x.len
                );
                let co = w.co;
                self.node(
                    Kind::Conv {
                        w: Box::new(w),
                        residual: None,
                    },
                    x,
                    y,
                    co,
                );
            }
            TracedOp::Add { a, b, y } => {
                let (a, b) = (self.get(a)?, self.get(b)?);
                ensure!(
                    a.len == b.len,
                    "cpu engine: add of {} and {} channels",
                    a.len,
                    b.len
                );
                self.node(Kind::Add { b }, a, y, a.len);
            }
            TracedOp::Cat { xs, y, dim } => {
                ensure!(
                    dim == 1,
                    "cpu engine: concatenation along dim {dim} (only channels)"
                );
                let parts = xs
                    .iter()
                    .map(|&x| self.get(x))
                    .collect::<Result<Vec<_>>>()?;
                let c = parts.iter().map(|p| p.len).sum();
                let copy = vec![true; parts.len()];
                self.node(Kind::Cat { parts, copy }, parts_first(&xs, self)?, y, c);
            }
            TracedOp::Narrow {
                x,
                y,
                dim,
                start,
                len,
            } => {
                ensure!(
                    dim == 1,
                    "cpu engine: narrow along dim {dim} (only channels)"
                );
                let x = self.get(x)?;
                ensure!(start + len <= x.len, "cpu engine: narrow past the channels");
                self.ids.insert(
                    y,
                    Operand {
                        v: x.v,
                        start: x.start + start,
                        len,
                    },
                );
            }
            TracedOp::Alias { x, y } => {
                let x = self.get(x)?;
                self.ids.insert(y, x);
            }
            TracedOp::Silu { x, y } => {
                let x = self.get(x)?;
                self.node(Kind::Silu, x, y, x.len);
            }
            TracedOp::Upsample { x, y, factor } => {
                let x = self.get(x)?;
                self.node(Kind::Upsample { f: factor }, x, y, x.len);
            }
            TracedOp::TakeEven { x, y } => {
                let x = self.get(x)?;
                self.node(Kind::TakeEven, x, y, x.len);
            }
            TracedOp::AvgPool2x2S1 { x, y } => {
                let x = self.get(x)?;
                self.node(Kind::AvgPool2, x, y, x.len);
            }
            TracedOp::MaxPoolSame { x, y, k } => {
                let x = self.get(x)?;
                if k % 2 == 0 {
                    bail!("cpu engine: max pool with an even kernel {k}");
                }
                self.node(Kind::MaxPool { k, stride: 1 }, x, y, x.len);
            }
        }
        Ok(())
    }
}

/// The first part of a concatenation (its `x`, for uniformity; `Cat` reads `parts`).
fn parts_first(xs: &[TensorId], b: &Builder) -> Result<Operand> {
    b.get(*xs.first().context("cpu engine: an empty concatenation")?)
}
