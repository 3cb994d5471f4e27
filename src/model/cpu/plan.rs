//! A plan: the engine's graph ([`super::graph`]) laid out for one input shape `(B, H, W)` and
//! thread count. It fixes every value's spatial size, gives every storage (a value with storage
//! of its own, together with the values placed in it) a place in one arena of floats, and sizes
//! the per-thread im2col scratch after the storages. Storages whose lifetimes (first write to
//! last read, in node order) do not overlap share arena space: the greedy first-fit of the
//! largest storages first. A forward then allocates nothing but its output.

use super::graph::{Graph, Kind, Operand};
use super::kernels::Act;
use anyhow::{ensure, Result};

/// Floats between the arena offsets of two storages (64 bytes).
const ALIGN: usize = 16;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Plan {
    pub b: usize,
    /// Spatial size of every value (0 × 0 for values nothing produces any more).
    pub hw: Vec<(usize, usize)>,
    /// Arena offset of every storage root (`usize::MAX` for non-roots).
    pub offset: Vec<usize>,
    /// Arena offset of the scratch, and floats per thread.
    pub scratch_at: usize,
    pub scratch_per: usize,
    /// Arena offset of the INT8 convolutions' quantized-input buffer (sized for the largest).
    pub qbuf_at: usize,
    /// Floats in the arena.
    pub len: usize,
    /// Floats the storages would take without sharing (for reports and tests).
    pub unshared: usize,
    /// Anchors in the output.
    pub anchors: usize,
}

impl Plan {
    /// The plan of `g` for a `(b, 3, h, w)` input on `threads` threads. Errors: a shape for
    /// which the graph's spatial sizes disagree (H or W not a multiple of 32).
    pub fn new(g: &Graph, b: usize, h: usize, w: usize, threads: usize) -> Result<Self> {
        let nv = g.chans.len();
        let mut hw = vec![(0, 0); nv];
        hw[0] = (h, w);
        let mut producer = vec![None; nv];
        let mut scratch_per = 0;
        let mut qbuf = 0;
        for (i, n) in g.nodes.iter().enumerate() {
            let (xh, xw) = hw[n.x.v];
            ensure!(xh > 0 && xw > 0, "cpu plan: node {i} reads an empty value");
            let out = match &n.kind {
                Kind::Conv { w, .. } => {
                    scratch_per = scratch_per.max(w.scratch());
                    if let Some(q) = &w.q {
                        qbuf = qbuf.max(q.buf_len(b, xh, xw));
                    }
                    ensure!(
                        xh + 2 * w.pad >= w.k && xw + 2 * w.pad >= w.k,
                        "cpu plan: a {}x{} kernel on a {xh}x{xw} map",
                        w.k,
                        w.k
                    );
                    w.out_hw(xh, xw)
                }
                Kind::Upsample { f } => (xh * f, xw * f),
                Kind::TakeEven => (xh.div_ceil(2), xw.div_ceil(2)),
                Kind::AvgPool2 => {
                    ensure!(xh >= 2 && xw >= 2, "cpu plan: 2x2 pool on a {xh}x{xw} map");
                    (xh - 1, xw - 1)
                }
                Kind::MaxPool { stride, .. } => (xh.div_ceil(*stride), xw.div_ceil(*stride)),
                Kind::Add { .. } | Kind::Silu | Kind::Cat { .. } => (xh, xw),
            };
            // Every operand has the input's size; a conv's residual has its output's.
            let mut reads: Vec<(Operand, (usize, usize))> =
                n.inputs().into_iter().map(|o| (o, (xh, xw))).collect();
            if let Kind::Conv {
                residual: Some(_), ..
            } = &n.kind
            {
                reads[1].1 = out; // [x, residual]
            }
            for (o, want) in reads {
                ensure!(
                    hw[o.v] == want,
                    "cpu plan: node {i} reads a map of {:?} where {want:?} belongs (input sizes must be multiples of 32)",
                    hw[o.v]
                );
            }
            hw[n.y] = out;
            producer[n.y] = Some(i);
        }
        // Placed values share their root's spatial size.
        for v in 0..nv {
            let r = g.place[v].root;
            if producer[v].is_some() && r != v {
                ensure!(
                    hw[r] == hw[v],
                    "cpu plan: a concatenation joins maps of {:?} and {:?} (input sizes must be multiples of 32)",
                    hw[r],
                    hw[v]
                );
            }
        }
        // Lifetimes of the storage roots, in node steps (the input is live from step 0, the
        // outputs to the end).
        let end = g.nodes.len();
        let mut first = vec![usize::MAX; nv];
        let mut last = vec![0usize; nv];
        first[0] = 0;
        for (i, n) in g.nodes.iter().enumerate() {
            let r = g.place[n.y].root;
            first[r] = first[r].min(i);
            last[r] = last[r].max(i);
            for o in n.inputs() {
                let r = g.place[o.v].root;
                last[r] = last[r].max(i);
            }
        }
        for &o in g.outputs.iter().chain(&g.extra) {
            last[g.place[o].root] = end;
        }
        let mut roots: Vec<usize> = (0..nv)
            .filter(|&v| g.place[v].root == v && first[v] != usize::MAX)
            .collect();
        let size = |v: usize| (b * hw[v].0 * hw[v].1 * g.chans[v]).div_ceil(ALIGN) * ALIGN;
        roots.sort_by_key(|&v| std::cmp::Reverse(size(v)));
        let mut offset = vec![usize::MAX; nv];
        let mut done: Vec<usize> = Vec::new();
        let mut len = 0;
        for &v in &roots {
            // Intervals of arena already taken by storages live at the same time, by offset.
            let mut busy: Vec<(usize, usize)> = done
                .iter()
                .filter(|&&u| first[u] <= last[v] && first[v] <= last[u])
                .map(|&u| (offset[u], offset[u] + size(u)))
                .collect();
            busy.sort_unstable();
            let mut at = 0;
            for (s, e) in busy {
                if at + size(v) <= s {
                    break;
                }
                at = at.max(e);
            }
            offset[v] = at;
            len = len.max(at + size(v));
            done.push(v);
        }
        let unshared = roots.iter().map(|&v| size(v)).sum();
        let scratch_at = len;
        let qbuf_at = (scratch_at + scratch_per * threads.max(1)).next_multiple_of(ALIGN);
        let len = qbuf_at + qbuf.div_ceil(4);
        let anchors = g.outputs.iter().map(|&o| hw[o].0 * hw[o].1).sum();
        Ok(Self {
            b,
            hw,
            offset,
            scratch_at,
            scratch_per,
            qbuf_at,
            len,
            unshared,
            anchors,
        })
    }

    /// The activation of operand `o` in the arena at `base`.
    pub fn act(&self, g: &Graph, base: *mut f32, o: Operand) -> Act {
        let p = g.place[o.v];
        let (h, w) = self.hw[o.v];
        Act {
            // SAFETY (of the later accesses): the offset lies inside the arena of `len` floats.
            ptr: base.wrapping_add(self.offset[p.root] + p.off + o.start),
            ld: g.chans[p.root],
            b: self.b,
            h,
            w,
            c: o.len,
        }
    }
}
