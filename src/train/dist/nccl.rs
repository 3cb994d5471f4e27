//! Ranks whose gradients are summed on their GPUs by NCCL ([`NcclRank`], `cuda` feature).
//!
//! A rank keeps a control-plane [`Collective`] (in practice [`super::socket::SocketRank`], over
//! which the NCCL unique id travels and which names a rank that is gone) and an NCCL
//! communicator on its CUDA device:
//! - [`Collective::all_reduce_sum_tensor`] (the batch's gradients, see [`super::sync`]),
//!   [`Collective::all_reduce_sum`], [`Collective::broadcast`] and [`Collective::barrier`] run as
//!   `ncclAllReduce` / `ncclBroadcast` on the device's stream (host buffers pass through the
//!   device);
//! - [`Collective::agree`] and [`Collective::abort`] go through the control plane: every
//!   batch's exchange starts with an agreement, so a rank that died is named there, before any
//!   NCCL operation waits for it.
//!
//! NCCL is loaded when the first group is formed (`libnccl.so.2`, through `LD_LIBRARY_PATH` or
//! the system's library path), not linked: a `cuda` build runs on one GPU without it.
//!
//! Never hangs: the communicator is created on a helper thread waited for with the group's
//! timeout, and every operation is waited for by polling its completion event and
//! `ncclCommGetAsyncError` until the timeout, after which the communicator is aborted
//! (`ncclCommAbort`) and the control plane asked which rank is at fault.
//!
//! The sum is NCCL's (`ncclSum` over `ncclFloat32`): every rank receives bitwise the same result;
//! with one or two ranks it equals the rank-order sum of the other implementations, with three or
//! more its order of additions is NCCL's (a difference at f32 rounding).

use super::{Agreement, Collective, DistError};
use candle_core::{DType, Device, Storage, Tensor};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `ncclUniqueId`: 128 opaque bytes made by rank 0 and given to every rank.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; 128],
}

/// `ncclComm_t`.
type RawComm = *mut c_void;
/// `ncclResult_t`: 0 success, 7 in progress.
type NcclResult = c_int;
const NCCL_SUCCESS: NcclResult = 0;
const NCCL_IN_PROGRESS: NcclResult = 7;
/// `ncclFloat32`.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSum`.
const NCCL_SUM: c_int = 0;

/// The NCCL entry points yolo9 calls (signatures of `nccl.h`, NCCL 2.x).
struct Api {
    _lib: libloading::Library,
    version: c_int,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> NcclResult,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> NcclResult,
    comm_abort: unsafe extern "C" fn(RawComm) -> NcclResult,
    get_async_error: unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult,
    error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

/// The library names tried, in order.
const LIB_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// The error when NCCL cannot be loaded: what to install, or how to do without it.
fn missing(why: &str) -> DistError {
    DistError::Setup(format!(
        "NCCL could not be loaded ({why}): install it (the pip package nvidia-nccl-cu13, or the \
         distribution's libnccl2) and add the folder of libnccl.so.2 to LD_LIBRARY_PATH, or set \
         {}=tcp to sum the gradients through the host instead",
        super::BACKEND_ENV
    ))
}

fn api() -> Result<&'static Api, DistError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(|why| missing(why))
}

fn load() -> Result<Api, String> {
    let mut tried = Vec::new();
    for name in LIB_NAMES {
        // SAFETY: loading NCCL runs its (C) initialisers only; it has no Rust-visible state.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return bind(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(tried.join("; "))
}

fn bind(lib: libloading::Library) -> Result<Api, libloading::Error> {
    // SAFETY: each symbol is read with its signature in nccl.h (stable across NCCL 2.x); the
    // function pointers are kept together with the library, which is never unloaded.
    unsafe {
        let get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult =
            *lib.get(b"ncclGetVersion\0")?;
        let mut version = 0;
        get_version(&mut version);
        Ok(Api {
            version,
            get_unique_id: *lib.get(b"ncclGetUniqueId\0")?,
            comm_init_rank: *lib.get(b"ncclCommInitRank\0")?,
            all_reduce: *lib.get(b"ncclAllReduce\0")?,
            broadcast: *lib.get(b"ncclBroadcast\0")?,
            comm_abort: *lib.get(b"ncclCommAbort\0")?,
            get_async_error: *lib.get(b"ncclCommGetAsyncError\0")?,
            error_string: *lib.get(b"ncclGetErrorString\0")?,
            _lib: lib,
        })
    }
}

impl Api {
    fn describe(&self, r: NcclResult) -> String {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let s = unsafe { (self.error_string)(r) };
        let text = if s.is_null() {
            "unknown".into()
        } else {
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        };
        format!("NCCL error {r}: {text}")
    }
}

/// The NCCL version as `major.minor.patch`, or why NCCL cannot be loaded.
pub fn version() -> Result<String, DistError> {
    let v = api()?.version;
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
}

/// A communicator handle, used by its one rank's thread.
struct Comm(RawComm);
// SAFETY: the handle is used by one thread at a time (the rank's; `ncclCommAbort` is documented
// as callable from another thread).
unsafe impl Send for Comm {}

/// One rank of an NCCL group; see the module documentation.
pub struct NcclRank {
    ctl: Box<dyn Collective>,
    api: &'static Api,
    comm: Comm,
    /// The CUDA device of the communicator (its ordinal must be every tensor's).
    device: candle_core::CudaDevice,
    seq: u64,
    /// Set after a failed operation: the group is unusable (the communicator is aborted).
    broken: Option<DistError>,
}

impl NcclRank {
    /// Forms the NCCL group of the ranks of `ctl` on `device` (this rank's GPU): rank 0 makes the
    /// unique id, [`Collective::broadcast`] gives it to the others, and each creates its
    /// communicator (waited for with the group's timeout). Errors: NCCL cannot be loaded (the
    /// message says what to install), `device` is not a CUDA device, the creation failed or did
    /// not finish within the timeout.
    pub fn new(mut ctl: Box<dyn Collective>, device: &Device) -> Result<Self, DistError> {
        let Device::Cuda(dev) = device else {
            return Err(DistError::Setup(format!(
                "the NCCL backend needs a CUDA device, got {device:?}; set {}=tcp for another \
                 device",
                super::BACKEND_ENV
            )));
        };
        // Every rank learns here whether NCCL loads; one that cannot says so to the others.
        let api = match api() {
            Ok(a) => a,
            Err(e) => {
                ctl.abort(&e.to_string());
                return Err(e);
            }
        };
        let (rank, world, timeout) = (ctl.rank(), ctl.world(), ctl.timeout());
        let mut id = UniqueId { internal: [0; 128] };
        if rank == 0 {
            // SAFETY: writes the 128 bytes of `id`.
            let r = unsafe { (api.get_unique_id)(&mut id) };
            if r != NCCL_SUCCESS {
                let e = DistError::Failed {
                    rank,
                    why: format!("ncclGetUniqueId: {}", api.describe(r)),
                };
                ctl.abort(&e.to_string());
                return Err(e);
            }
        }
        // The id's bytes travel exactly as f32 values (-128..=127).
        let mut buf: Vec<f32> = id.internal.iter().map(|&b| b as f32).collect();
        ctl.broadcast(&mut buf)?;
        for (d, v) in id.internal.iter_mut().zip(&buf) {
            *d = *v as c_char;
        }
        let ctx = dev.cuda_stream().context().clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("nccl-init-{rank}"))
            .spawn(move || {
                let out = ctx
                    .bind_to_thread()
                    .map_err(|e| format!("binding the CUDA context: {e}"))
                    .and_then(|()| {
                        let mut c: RawComm = std::ptr::null_mut();
                        // SAFETY: `c` receives the communicator; `id` is the group's.
                        let r = unsafe {
                            (api.comm_init_rank)(&mut c, world as c_int, id, rank as c_int)
                        };
                        if r == NCCL_SUCCESS {
                            Ok(Comm(c))
                        } else {
                            Err(format!("ncclCommInitRank: {}", api.describe(r)))
                        }
                    });
                let _ = tx.send(out);
            })
            .map_err(|e| DistError::Setup(format!("starting the NCCL set-up thread: {e}")))?;
        let comm = match rx.recv_timeout(timeout) {
            Ok(Ok(c)) => c,
            Ok(Err(why)) => {
                let e = DistError::Failed { rank, why };
                ctl.abort(&e.to_string());
                return Err(e);
            }
            Err(_) => {
                // The creation waits for every rank: ask the control plane who is missing.
                return Err(match ctl.barrier() {
                    Err(e) => e,
                    Ok(()) => DistError::Setup(format!(
                        "rank {rank}: creating the NCCL communicator did not finish within {:.1} s \
                         although every rank is alive (check NCCL_DEBUG=WARN output)",
                        timeout.as_secs_f64()
                    )),
                });
            }
        };
        Ok(NcclRank {
            ctl,
            api,
            comm,
            device: dev.clone(),
            seq: 0,
            broken: None,
        })
    }

    /// The device pointer of the first element of `t`, which must be a contiguous f32 tensor
    /// on this rank's GPU.
    fn pointer(&self, t: &Tensor) -> Result<*mut c_void, DistError> {
        let bad = |what: String| DistError::Device(format!("NCCL operand: {what}"));
        if t.dtype() != DType::F32 || !t.is_contiguous() {
            return Err(bad(format!(
                "expected a contiguous f32 tensor, got {:?}",
                t.dtype()
            )));
        }
        match t.device() {
            // The same GPU (another `CudaDevice` of it is another candle device, with the same
            // context and this thread's stream).
            Device::Cuda(d)
                if d.cuda_stream().context().ordinal()
                    == self.device.cuda_stream().context().ordinal() => {}
            d => return Err(bad(format!("tensor on {d:?}, not the group's GPU"))),
        }
        let (st, l) = t.storage_and_layout();
        let Storage::Cuda(cs) = &*st else {
            return Err(bad("not CUDA storage".into()));
        };
        let s = cs.as_cuda_slice::<f32>().map_err(|e| bad(e.to_string()))?;
        let stream = self.device.cuda_stream();
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(s, &stream);
        Ok((ptr + (l.start_offset() * std::mem::size_of::<f32>()) as u64) as *mut c_void)
    }

    /// Runs `enqueue` (one NCCL call on the device's stream) and waits for it with the timeout.
    fn run(
        &mut self,
        what: &str,
        enqueue: impl FnOnce(&Api, RawComm, *mut c_void) -> NcclResult,
    ) -> Result<(), DistError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.seq += 1;
        let op = format!("NCCL {what} #{}", self.seq);
        let stream = self.device.cuda_stream();
        let r = enqueue(self.api, self.comm.0, stream.cu_stream() as *mut c_void);
        if r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS {
            let why = format!("{op}: {}", self.api.describe(r));
            return Err(self.fail(why));
        }
        let ev = stream
            .record_event(None)
            .map_err(|e| DistError::Device(format!("{op}: recording its event: {e}")))?;
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            match ev.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.fail(format!("{op}: CUDA error {e}"))),
            }
            let mut a = NCCL_SUCCESS;
            // SAFETY: queries the live communicator.
            unsafe { (self.api.get_async_error)(self.comm.0, &mut a) };
            if a != NCCL_SUCCESS && a != NCCL_IN_PROGRESS {
                let why = format!("{op}: {}", self.api.describe(a));
                return Err(self.fail(why));
            }
            if t0.elapsed() > self.ctl.timeout() {
                // SAFETY: aborting unblocks the operation; the communicator is not used again.
                unsafe { (self.api.comm_abort)(self.comm.0) };
                self.comm.0 = std::ptr::null_mut();
                let secs = self.ctl.timeout().as_secs_f64();
                let e = match self.ctl.barrier() {
                    Err(e) => e,
                    Ok(()) => DistError::Setup(format!(
                        "{op} did not finish within {secs:.1} s although every rank is alive"
                    )),
                };
                self.broken = Some(e.clone());
                return Err(e);
            }
            // Gradient sums take milliseconds: spin briefly, then sleep in short steps.
            spins += 1;
            if spins < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Marks the group broken by this rank's NCCL error `why`, tells the others, returns it.
    fn fail(&mut self, why: String) -> DistError {
        let e = DistError::Failed {
            rank: self.ctl.rank(),
            why,
        };
        self.ctl.abort(&e.to_string());
        self.broken = Some(e.clone());
        e
    }

    /// A fresh contiguous f32 copy of `t` on the group's GPU (the operand NCCL overwrites).
    fn operand(&self, t: &Tensor) -> Result<Tensor, DistError> {
        t.flatten_all()
            .and_then(|f| f.to_dtype(DType::F32))
            .and_then(|f| f.copy())
            .map_err(|e| DistError::Device(e.to_string()))
    }

    fn host_through_device(
        &mut self,
        buf: &mut [f32],
        op: fn(&mut Self, &Tensor) -> Result<Tensor, DistError>,
    ) -> Result<(), DistError> {
        let dev = Device::Cuda(self.device.clone());
        let t = Tensor::from_slice(buf, buf.len(), &dev)
            .map_err(|e| DistError::Device(e.to_string()))?;
        let v = op(self, &t)?
            .to_vec1::<f32>()
            .map_err(|e| DistError::Device(e.to_string()))?;
        buf.copy_from_slice(&v);
        Ok(())
    }
}

impl Collective for NcclRank {
    fn rank(&self) -> usize {
        self.ctl.rank()
    }

    fn world(&self) -> usize {
        self.ctl.world()
    }

    fn timeout(&self) -> Duration {
        self.ctl.timeout()
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        self.host_through_device(buf, Self::all_reduce_sum_tensor)
    }

    fn broadcast(&mut self, buf: &mut [f32]) -> Result<(), DistError> {
        self.host_through_device(buf, Self::broadcast_tensor)
    }

    fn abort(&mut self, why: &str) {
        self.ctl.abort(why);
    }

    fn agree(&mut self, flags: u32) -> Result<Agreement, DistError> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.ctl.agree(flags)
    }

    fn all_reduce_sum_tensor(&mut self, t: &Tensor) -> Result<Tensor, DistError> {
        let out = self.operand(t)?;
        let p = self.pointer(&out)?;
        let n = out.elem_count();
        // SAFETY: in place on `out`'s n f32 values, which live until the operation completed.
        self.run("all-reduce", |api, c, s| unsafe {
            (api.all_reduce)(p, p, n, NCCL_FLOAT32, NCCL_SUM, c, s)
        })?;
        Ok(out)
    }

    fn broadcast_tensor(&mut self, t: &Tensor) -> Result<Tensor, DistError> {
        let out = self.operand(t)?;
        let p = self.pointer(&out)?;
        let n = out.elem_count();
        // SAFETY: in place on `out`, as above; root rank 0.
        self.run("broadcast", |api, c, s| unsafe {
            (api.broadcast)(p, p, n, NCCL_FLOAT32, 0, c, s)
        })?;
        Ok(out)
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        if !self.comm.0.is_null() {
            // SAFETY: the communicator is not used again. Abort (rather than destroy) never
            // waits for peers that may be gone.
            unsafe { (self.api.comm_abort)(self.comm.0) };
        }
    }
}
