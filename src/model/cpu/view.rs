//! The views the engine's kernels work through: where their tasks run ([`Exec`]), an NHWC
//! activation in the arena ([`Act`]) and the per-thread scratch ([`Scratch`]).

use super::pool::Pool;

/// Where a kernel runs its tasks: over the engine's pool, or all on the calling thread (an
/// image of a batch whose images run side by side, one per thread).
#[derive(Clone, Copy)]
pub(crate) struct Exec<'a>(pub Option<&'a Pool>);

impl Exec<'_> {
    /// Threads the tasks are spread over.
    pub fn threads(&self) -> usize {
        self.0.map_or(1, |p| p.threads())
    }

    /// Runs `f(0..n)`, in parallel when there are threads and tasks for it.
    pub(crate) fn each(&self, n: usize, f: impl Fn(usize) + Sync) {
        self.each_on(n, |i, _| f(i))
    }

    /// Runs `f(task, thread)` for tasks `0..n`; `thread` < [`Exec::threads`] names the thread
    /// running the task (its scratch).
    pub(crate) fn each_on(&self, n: usize, f: impl Fn(usize, usize) + Sync) {
        match self.0 {
            Some(pool) => pool.each(n, &f),
            None => (0..n).for_each(|i| f(i, 0)),
        }
    }
}

/// Column blocks of a convolution split into `tiles` row tiles on `threads` threads: `(blocks,
/// width)`, the `cols` output columns in blocks of whole `nr`-column panels, as many as it takes
/// to give every thread two tasks when the rows alone leave threads idle (one block otherwise).
pub(crate) fn column_blocks(
    tiles: usize,
    threads: usize,
    cols: usize,
    nr: usize,
) -> (usize, usize) {
    let panels = cols.div_ceil(nr);
    let nb = if tiles >= 2 * threads {
        1
    } else {
        (2 * threads).div_ceil(tiles).min(panels).max(1)
    };
    let width = panels.div_ceil(nb) * nr;
    (cols.div_ceil(width), width)
}

/// Floats in 64 bytes: one cache line, one AVX-512 vector.
pub(crate) const ALIGN_FLOATS: usize = 16;

/// An NHWC activation: `b × h × w` pixels of `c` channels, pixel `(n, y, x)` at
/// `ptr + ((n·h + y)·w + x)·ld`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Act {
    pub ptr: *mut f32,
    pub ld: usize,
    pub b: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
}

// SAFETY: an Act is a view into the engine's arena; the plan gives concurrently running tasks
// disjoint pixels or channels to write, and nothing frees the arena while a forward runs.
unsafe impl Send for Act {}
unsafe impl Sync for Act {}

impl Act {
    /// The float `i` floats past the base (a method, so that closures capture the whole Act).
    pub(crate) fn at(&self, i: usize) -> *mut f32 {
        self.ptr.wrapping_add(i)
    }
    pub(crate) fn pixels(&self) -> usize {
        self.b * self.h * self.w
    }
    /// The channels of flat pixel `p`.
    ///
    /// SAFETY: `p` < pixels, and the caller holds the only writer of these floats.
    #[inline(always)]
    pub(crate) unsafe fn px<'a>(self, p: usize) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.ptr.add(p * self.ld), self.c)
    }
}

/// Per-thread scratch: `per` floats for each pool thread; and the buffer of an INT8
/// convolution's quantized input ([`super::int8`]), shared by its tasks.
#[derive(Clone, Copy)]
pub(crate) struct Scratch {
    pub ptr: *mut f32,
    pub per: usize,
    pub qbuf: *mut u8,
}
// SAFETY: each thread uses only its own `per`-sized slice (by its pool index).
unsafe impl Send for Scratch {}
unsafe impl Sync for Scratch {}

impl Scratch {
    /// The slice of thread `t` (its index in [`Exec::each_on`]).
    ///
    /// SAFETY: `t` is below the thread count the scratch was sized for, and no other running
    /// task has the same `t`.
    pub(crate) unsafe fn mine<'a>(self, t: usize) -> &'a mut [f32] {
        std::slice::from_raw_parts_mut(self.ptr.add(t * self.per), self.per)
    }
}
