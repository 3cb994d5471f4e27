//! Replays of an inference forward captured as CUDA graphs, one per input shape, with ordinary
//! launches as the fall-back (the capture itself: [`crate::cuda::graph`]).
//!
//! Policy: on a CUDA device (`cuda` feature), an input shape and dtype seen for the third time is
//! captured (a capture costs about two ordinary forwards: a shape seen once or twice, as each
//! image of a folder of mixed sizes or the two full batches of a short validation, never pays for
//! one), and later forwards of that shape replay it.
//! At most [`MAX_GRAPHS`] captures are kept (least recently used dropped). A shape whose capture
//! fails runs ordinary launches from then on, with one warning. `YOLO9_CUDA_GRAPH=0` turns
//! replays off. Forwards through one [`ForwardGraphs`] are serialised (the GPU runs them one after
//! the other anyway, and a capture must not see another thread's work on the stream).

use anyhow::Result;
use candle_core::Tensor;
#[cfg(feature = "cuda")]
use candle_core::{DType, Device};
#[cfg(feature = "cuda")]
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Environment variable that turns CUDA-graph replay of inference forwards off (`0`).
pub const GRAPH_ENV: &str = "YOLO9_CUDA_GRAPH";

/// The sighting of a shape at which it is captured (see the module docs).
pub const CAPTURE_AT: u32 = 3;

/// Captured shapes kept per [`ForwardGraphs`] (each holds its activations' memory).
pub const MAX_GRAPHS: usize = 2;

/// Whether replays are allowed by [`GRAPH_ENV`] (default yes).
pub fn graphs_enabled() -> bool {
    !crate::switches::off(GRAPH_ENV)
}

/// Input shape, dtype, and whether f32 convolutions are strict (the capture records the math
/// type of its cuDNN calls).
#[cfg(feature = "cuda")]
type Key = (Vec<usize>, DType, bool);

#[cfg(feature = "cuda")]
struct Entry(crate::cuda::graph::CapturedForward);

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialised; an
// `Entry` is only touched while the `ForwardGraphs` mutex is held.
#[cfg(feature = "cuda")]
unsafe impl Send for Entry {}

#[derive(Default)]
struct State {
    #[cfg(feature = "cuda")]
    seen: HashMap<Key, u32>,
    #[cfg(feature = "cuda")]
    failed: HashSet<Key>,
    #[cfg(feature = "cuda")]
    graphs: Vec<(Key, Entry)>,
    captures: usize,
    replays: usize,
}

/// The captured forwards of one model (see the module docs). `Send + Sync`.
#[derive(Default)]
pub struct ForwardGraphs {
    state: Mutex<State>,
}

impl std::fmt::Debug for ForwardGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (c, r) = self.counts();
        f.debug_struct("ForwardGraphs")
            .field("captures", &c)
            .field("replays", &r)
            .finish()
    }
}

impl ForwardGraphs {
    /// No captures yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// (captures made, replays run) so far.
    pub fn counts(&self) -> (usize, usize) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.captures, s.replays)
    }

    /// `forward(x)`, replayed from a capture when the policy allows (module docs). `x` must be on
    /// the device the forward runs on; the result is a fresh tensor either way.
    ///
    /// Errors: those of `forward` (a failed capture is not an error: the ordinary forward runs).
    pub fn run(&self, x: &Tensor, forward: &dyn Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = x.device() {
            if graphs_enabled() {
                return self.run_cuda(dev, x, forward);
            }
        }
        forward(x)
    }

    #[cfg(feature = "cuda")]
    fn run_cuda(
        &self,
        dev: &candle_core::CudaDevice,
        x: &Tensor,
        forward: &dyn Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let key: Key = (
            x.dims().to_vec(),
            x.dtype(),
            crate::cuda::conv::strict_fp32(),
        );
        if let Some(i) = s.graphs.iter().position(|(k, _)| *k == key) {
            let e = s.graphs.remove(i);
            let y = e.1 .0.run(x);
            s.graphs.push(e);
            s.replays += 1;
            return Ok(y?);
        }
        let n = s.seen.entry(key.clone()).or_insert(0);
        *n += 1;
        if *n >= CAPTURE_AT && !s.failed.contains(&key) {
            let f = |t: &Tensor| forward(t).map_err(|e| candle_core::Error::Msg(format!("{e:#}")));
            match crate::cuda::graph::CapturedForward::capture(dev, x, &f) {
                Ok((c, y)) => {
                    if s.graphs.len() >= MAX_GRAPHS {
                        s.graphs.remove(0);
                    }
                    s.graphs.push((key, Entry(c)));
                    s.captures += 1;
                    return Ok(y);
                }
                Err(e) => {
                    tracing::warn!(
                        "input {:?}: CUDA graph capture failed, ordinary launches are used for \
                         this shape: {}",
                        key.0,
                        crate::device::error_head(&e)
                    );
                    s.failed.insert(key);
                }
            }
        }
        forward(x)
    }
}
