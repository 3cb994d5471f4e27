//! Memory of a device, measured rather than guessed: the high-water mark of a region of work,
//! the memory in use now and the memory still free, in bytes.
//!
//! - **CPU**: the process resident set (Linux `/proc/self/status`: `VmRSS` now, `VmHWM` the
//!   process-lifetime high-water mark); free = `MemAvailable` of `/proc/meminfo`. The kernel's
//!   high-water mark is never reset (writing `/proc/self/clear_refs` would also lower the peak
//!   that `/usr/bin/time` and `getrusage` report for the whole process): a window's peak is
//!   `VmHWM` when the window raised it (exact), otherwise the largest RSS a sampling thread
//!   saw in the window (every [`RSS_SAMPLE_MS`] ms, from [`MemoryProbe::reset_peak`] on; a spike
//!   shorter than that may be missed). Free heap that malloc keeps is returned (`malloc_trim`)
//!   before a window starts, so it is not counted.
//! - **CUDA** (`cuda` feature): the device memory of the **process**, as `nvidia-smi` shows it —
//!   what candle allocates goes through the device's current stream-ordered memory pool
//!   (`cuMemAllocAsync`), and the rest (the CUDA context, loaded kernels, cuBLAS/cuDNN handles)
//!   is outside it. The peak is the pool's *reserved* high-water mark
//!   (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`: what it holds from the driver, fragmentation and cache
//!   included) plus the memory outside the pool (`cuMemGetInfo` total − free − the pool's reserved
//!   memory, read at the end of the window; where that outside memory grows within the window, as
//!   when a CUDA graph is captured, [`MemoryProbe::fold_peak`] splits the window there). Memory
//!   that other processes hold on the same GPU
//!   counts as outside the pool too: on a shared GPU a budget is the more conservative for it.
//!   In use now is the pool's `USED_MEM_CURRENT`; free = `cuMemGetInfo` free + memory the pool
//!   holds but does not use. The probe raises the pool's release threshold so freed blocks are
//!   reused instead of returned to the driver at every synchronization (PyTorch's caching
//!   allocator behaves the same way); [`MemoryProbe::cap_cache`] lowers it again to keep the
//!   cache within a budget, and that cap holds for every probe of the pool created later (until
//!   2026-12-04 a new probe, such as the one a CUDA-graph capture makes, raised it again, so the
//!   cap of `--budget` was lost at the first capture).
//!
//! Used by the memory-budget batch sizing ([`crate::budget`]) and the per-epoch peak in
//! `results.csv`.

use anyhow::{bail, Context, Result};
use candle_core::Device;

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// Parses a memory size as users write it: `8GiB`, `8G`, `8gb`, `512MiB`, `1.5GiB`, or plain
/// bytes `8589934592`. Every unit is binary (K/M/G/T = powers of 1024, with or without `i`/`B`),
/// as GPU memory is quoted that way. Errors name the value and the accepted forms.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.replace('_', "").parse().with_context(|| {
        format!("memory size '{s}': expected a number with a unit, e.g. 8GiB, 512MiB or 6G")
    })?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => {
            bail!("memory size '{s}': unknown unit '{u}'; use B, KiB, MiB, GiB or TiB (e.g. 8GiB)")
        }
    };
    if !(num.is_finite() && num > 0.0) {
        bail!("memory size '{s}' must be positive");
    }
    Ok((num * mult as f64).round() as u64)
}

/// `8.00GiB`-style rendering of a byte count (binary units).
pub fn fmt_size(b: u64) -> String {
    let b = b as f64;
    if b >= GIB as f64 {
        format!("{:.2}GiB", b / GIB as f64)
    } else {
        format!("{:.0}MiB", b / (1u64 << 20) as f64)
    }
}

/// Measures the memory of one device (see the module docs for what is counted where).
pub struct MemoryProbe {
    inner: Inner,
}

enum Inner {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(cuda::Pool),
    /// A device whose memory cannot be queried: every reading is 0.
    #[cfg(feature = "cuda")]
    Unknown,
}

impl MemoryProbe {
    /// A probe for `device`. Where the CUDA pool cannot be queried the probe reads 0 and a
    /// warning says so (training goes on; budget sizing then has nothing to measure).
    pub fn new(device: &Device) -> Result<MemoryProbe> {
        let inner = match device {
            #[cfg(feature = "cuda")]
            Device::Cuda(d) => match cuda::Pool::new(d) {
                Ok(p) => Inner::Cuda(p),
                Err(e) => {
                    tracing::warn!("device memory cannot be measured: {e:#}");
                    Inner::Unknown
                }
            },
            _ => Inner::Cpu,
        };
        Ok(MemoryProbe { inner })
    }

    /// `"RSS"` on the CPU, `"device memory"` on CUDA (for messages).
    pub fn what(&self) -> &'static str {
        match self.inner {
            Inner::Cpu => "process RSS",
            #[cfg(feature = "cuda")]
            Inner::Cuda(_) | Inner::Unknown => "device memory",
        }
    }

    /// Starts a new measurement window: the next [`MemoryProbe::peak_bytes`] reports the peak
    /// from now on (on the CPU, from the current RSS on).
    pub fn reset_peak(&self) {
        match &self.inner {
            Inner::Cpu => {
                // Freed heap that malloc still holds would count as resident: give it back
                // first, so the window starts from what is really in use.
                trim_heap();
                cpu_window::start();
            }
            #[cfg(feature = "cuda")]
            Inner::Cuda(p) => p.reset_peak(),
            #[cfg(feature = "cuda")]
            Inner::Unknown => {}
        }
    }

    /// Peak bytes of the process since the last [`MemoryProbe::reset_peak`] (0 where not
    /// measurable): the RSS high-water mark on the CPU; on CUDA the pool's reserved high-water
    /// mark plus the device memory outside the pool (see the module docs), which is what
    /// `nvidia-smi` shows for the process.
    pub fn peak_bytes(&self) -> u64 {
        match &self.inner {
            Inner::Cpu => cpu_window::peak(),
            #[cfg(feature = "cuda")]
            Inner::Cuda(p) => p.peak(),
            #[cfg(feature = "cuda")]
            Inner::Unknown => 0,
        }
    }

    /// [`MemoryProbe::release_cached`] before the memory outside the pool grows for the rest of
    /// the window (a CUDA-graph capture maps its own memory there): the window's peak so far is
    /// kept, the pool's cache is returned, and the pool's high-water mark starts again from
    /// what it holds then. Without it [`MemoryProbe::peak_bytes`] would add the pool's earlier
    /// high (its cache included) to the larger outside memory of later, though the two never
    /// coexisted. On the CPU the same as `release_cached` (the RSS high-water mark is one
    /// number).
    pub fn fold_peak(&self) {
        #[cfg(feature = "cuda")]
        if let Inner::Cuda(p) = &self.inner {
            p.fold_peak();
            return;
        }
        self.release_cached();
    }

    /// Returns memory the device's allocator keeps cached but unused (on CUDA, trims the pool
    /// to what is in use; nothing on the CPU). Called after budget sizing, whose largest
    /// measured step would otherwise stay reserved for the whole run.
    pub fn release_cached(&self) {
        match &self.inner {
            Inner::Cpu => trim_heap(),
            #[cfg(feature = "cuda")]
            Inner::Cuda(p) => p.trim(),
            #[cfg(feature = "cuda")]
            Inner::Unknown => {}
        }
    }

    /// Device memory in use outside the allocator's pool, bytes: on CUDA the context, loaded
    /// kernels and library handles (and other processes' memory on the same GPU); 0 on the CPU,
    /// where the RSS already counts everything.
    pub fn outside_bytes(&self) -> u64 {
        match &self.inner {
            Inner::Cpu => 0,
            #[cfg(feature = "cuda")]
            Inner::Cuda(p) => p.outside(),
            #[cfg(feature = "cuda")]
            Inner::Unknown => 0,
        }
    }

    /// Keeps the allocator's cache within `bytes`: on CUDA the pool's release threshold, so that
    /// at each synchronization the pool returns what it holds above `bytes` to the driver (the
    /// budget of `--budget` holds for the whole run, not only for the measured step); nothing on
    /// the CPU.
    pub fn cap_cache(&self, bytes: u64) {
        let _ = bytes;
        match &self.inner {
            Inner::Cpu => {}
            #[cfg(feature = "cuda")]
            Inner::Cuda(p) => p.set_release_threshold(bytes),
            #[cfg(feature = "cuda")]
            Inner::Unknown => {}
        }
    }

    /// The allocator's cache limit in bytes (on CUDA the pool's release threshold: `u64::MAX`
    /// unless [`MemoryProbe::cap_cache`] lowered it; a cap holds for every probe of the pool
    /// created later); `u64::MAX` on the CPU.
    pub fn cache_cap(&self) -> u64 {
        #[cfg(feature = "cuda")]
        if let Inner::Cuda(p) = &self.inner {
            return p.release_threshold();
        }
        u64::MAX
    }

    /// Bytes in use now (RSS, or the pool's used memory).
    pub fn current_bytes(&self) -> u64 {
        match &self.inner {
            Inner::Cpu => process_rss_bytes(),
            #[cfg(feature = "cuda")]
            Inner::Cuda(p) => p.current(),
            #[cfg(feature = "cuda")]
            Inner::Unknown => 0,
        }
    }

    /// One line of the memory in use now, for traces: on CUDA the pool's used and reserved
    /// bytes, its reserved high-water mark since the window began ([`MemoryProbe::reset_peak`],
    /// [`MemoryProbe::fold_peak`]) and the device memory outside the pool
    /// (`used … reserved … high … outside …`, MiB), on the CPU the RSS.
    pub fn trace_line(&self) -> String {
        const MIB: u64 = 1 << 20;
        #[cfg(feature = "cuda")]
        if let Inner::Cuda(p) = &self.inner {
            return format!(
                "used {} MiB, reserved {} MiB, high {} MiB, outside {} MiB",
                p.current() / MIB,
                p.reserved() / MIB,
                p.reserved_high() / MIB,
                p.outside() / MIB
            );
        }
        format!("rss {} MiB", self.current_bytes() / MIB)
    }

    /// Bytes that this process could still allocate on the device now (0 where unknown).
    pub fn free_bytes(&self) -> u64 {
        match &self.inner {
            Inner::Cpu => meminfo_kib("MemAvailable:").unwrap_or(0) * 1024,
            #[cfg(feature = "cuda")]
            Inner::Cuda(p) => p.free(),
            #[cfg(feature = "cuda")]
            Inner::Unknown => 0,
        }
    }
}

/// `YOLO9_MEM_TRACE=1` (read once): [`mem_trace`] prints; docs/cuda-build.md ("Diagnostics")
/// documents the lines.
fn mem_trace_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| crate::switches::one("YOLO9_MEM_TRACE"))
}

/// With `YOLO9_MEM_TRACE=1`: one stderr line `mem_trace {what}: {memory now}` (the
/// [`MemoryProbe::trace_line`] of `device`), to find where a run holds more memory than its
/// budget probe measured: the graphed training step writes one after each micro-step
/// (`crate::train::graphed`), the trainer one after each validation. Nothing without it.
pub fn mem_trace(device: &Device, what: std::fmt::Arguments<'_>) {
    if mem_trace_on() {
        if let Ok(p) = MemoryProbe::new(device) {
            crate::text::errln!("mem_trace {what}: {}", p.trace_line());
        }
    }
}

/// Returns free heap memory to the operating system (glibc `malloc_trim`; nothing elsewhere).
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory that malloc itself holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// How often the CPU window's sampling thread reads the RSS, milliseconds.
pub const RSS_SAMPLE_MS: u64 = 2;

/// The CPU measurement window of [`MemoryProbe`]: the kernel's lifetime high-water mark when
/// the window started, and the largest RSS sampled since (one process-wide window, as there is one
/// process RSS).
mod cpu_window {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Once;

    /// `VmHWM` at the window's start, bytes (0 before the first window: the lifetime high-water
    /// mark is then the peak, as it was before windows existed).
    static HWM_AT_START: AtomicU64 = AtomicU64::new(0);
    /// The largest RSS sampled since the window's start, bytes.
    static SAMPLED: AtomicU64 = AtomicU64::new(0);
    static SAMPLER: Once = Once::new();

    /// Starts a window now (and the sampling thread, once per process).
    pub(super) fn start() {
        HWM_AT_START.store(hwm(), Ordering::SeqCst);
        SAMPLED.store(super::process_rss_bytes(), Ordering::SeqCst);
        SAMPLER.call_once(|| {
            let _ = std::thread::Builder::new()
                .name("yolo9-rss".into())
                .spawn(|| loop {
                    std::thread::sleep(std::time::Duration::from_millis(super::RSS_SAMPLE_MS));
                    SAMPLED.fetch_max(super::process_rss_bytes(), Ordering::Relaxed);
                });
        });
    }

    /// The window's peak, bytes: `VmHWM` when the window raised it, else the sampled maximum
    /// (and the RSS now).
    pub(super) fn peak() -> u64 {
        let now = hwm();
        if now > HWM_AT_START.load(Ordering::SeqCst) {
            return now;
        }
        SAMPLED
            .load(Ordering::SeqCst)
            .max(super::process_rss_bytes())
    }

    fn hwm() -> u64 {
        super::proc_status_kib("VmHWM:").unwrap_or(0) * 1024
    }
}

/// Resident set size of this process in bytes (Linux `VmRSS`; 0 where unavailable), whatever
/// device trains: the `rss` column of results.csv.
pub fn process_rss_bytes() -> u64 {
    proc_status_kib("VmRSS:").unwrap_or(0) * 1024
}

fn field_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

fn proc_status_kib(key: &str) -> Option<u64> {
    field_kib(&std::fs::read_to_string("/proc/self/status").ok()?, key)
}

/// Memory the system could still give this process (`MemAvailable` of `/proc/meminfo`), in
/// bytes; `None` where that is not known.
pub fn available_bytes() -> Option<u64> {
    meminfo_kib("MemAvailable:").map(|k| k * 1024)
}

fn meminfo_kib(key: &str) -> Option<u64> {
    field_kib(&std::fs::read_to_string("/proc/meminfo").ok()?, key)
}

/// An allocation that failed: the typed form of out-of-memory inside yolo9 (the fault injector
/// `oom>K` raises it; [`is_oom`] also recognises the driver's own failures, which reach yolo9 as
/// candle errors) and the payload of [`crate::Error::OutOfMemory`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("out of memory: {what}")]
pub struct OutOfMemory {
    /// What ran out (the operation, sizes, and the driver's status when there is one).
    pub what: String,
}

/// True when `err` (anywhere in its chain) is an out-of-memory failure: an [`OutOfMemory`], or a
/// driver status candle passes on as text — CUDA's `CUDA_ERROR_OUT_OF_MEMORY`, a cuDNN/cuBLAS
/// `ALLOC_FAILED`. Used by the trainer's OOM recovery and by [`crate::Error::from`].
pub fn is_oom(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        if e.downcast_ref::<OutOfMemory>().is_some() {
            return true;
        }
        let s = e.to_string();
        s.contains("OUT_OF_MEMORY")
            || s.contains("out of memory")
            || s.contains("ALLOC_FAILED")
            || s.contains("OutOfMemory")
    })
}

/// Runs `attempt(size)`, halving `size` after each out-of-memory failure ([`is_oom`]) while it
/// is above 1: the one "halve and retry" of yolo9 (the training step's micro-batch, the
/// validation batch). `before_retry(old, new)` runs between a failure and the next attempt
/// (release what the failed attempt held, report). Returns the result, the size it succeeded at
/// and the number of halvings; an out-of-memory failure at size 1, or any other error, is
/// returned as it is.
pub fn halve_on_oom<T>(
    mut size: usize,
    mut attempt: impl FnMut(usize) -> anyhow::Result<T>,
    mut before_retry: impl FnMut(usize, usize) -> anyhow::Result<()>,
) -> anyhow::Result<(T, usize, usize)> {
    let mut halvings = 0;
    loop {
        match attempt(size) {
            Ok(v) => return Ok((v, size, halvings)),
            Err(e) if is_oom(&e) && size > 1 => {
                let new = size / 2;
                // `info`: the callers tell their user (the trainer's observer, val's line).
                tracing::info!(
                    from = size,
                    to = new,
                    "out of memory; retrying at half the size"
                );
                before_retry(size, new)?;
                size = new;
                halvings += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use anyhow::{Context, Result};
    use cudarc::driver::result::{device, mem_pool};
    use cudarc::driver::sys;
    use std::sync::Arc;

    /// The current memory pool of one CUDA device.
    pub struct Pool {
        pool: sys::CUmemoryPool,
        ctx: Arc<cudarc::driver::CudaContext>,
    }

    // The pool handle is a driver object usable from any thread once the context is bound.
    unsafe impl Send for Pool {}
    unsafe impl Sync for Pool {}

    /// What every probe of one pool shares, whichever probe object set it: the peak folded by
    /// [`Pool::fold_peak`] since the last reset, and the release threshold set by
    /// [`MemoryProbe::cap_cache`](super::MemoryProbe::cap_cache).
    #[derive(Default)]
    struct Shared {
        folded: u64,
        cap: Option<u64>,
    }

    /// Runs `f` on the shared state of `pool`.
    fn shared<R>(pool: sys::CUmemoryPool, f: impl FnOnce(&mut Shared) -> R) -> R {
        type Map = std::collections::HashMap<usize, Shared>;
        static S: std::sync::OnceLock<std::sync::Mutex<Map>> = std::sync::OnceLock::new();
        let mut m = S
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        f(m.entry(pool as usize).or_default())
    }

    impl Pool {
        pub fn new(d: &candle_core::CudaDevice) -> Result<Pool> {
            let stream = d.cuda_stream();
            let ctx = stream.context().clone();
            ctx.bind_to_thread().context("binding the CUDA context")?;
            // SAFETY: the device comes from a live context.
            let pool = unsafe { device::get_mem_pool(ctx.cu_device()) }
                .context("querying the CUDA memory pool")?;
            // The cap a probe of this pool set (`cap_cache`) holds for every later probe: a
            // new probe raises the threshold only where none was set.
            let mut keep: u64 = shared(pool, |s| s.cap).unwrap_or(u64::MAX);
            // SAFETY: valid pool; the attribute takes a u64.
            unsafe {
                mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut keep as *mut u64 as *mut std::ffi::c_void,
                )
            }
            .context("setting the CUDA pool release threshold")?;
            Ok(Pool { pool, ctx })
        }

        fn get(&self, attr: sys::CUmemPool_attribute) -> u64 {
            let _ = self.ctx.bind_to_thread();
            let mut v: u64 = 0;
            // SAFETY: valid pool; these attributes are u64 (cuuint64_t).
            let ok = unsafe {
                mem_pool::get_attribute(
                    self.pool,
                    attr,
                    &mut v as *mut u64 as *mut std::ffi::c_void,
                )
            };
            if ok.is_ok() {
                v
            } else {
                0
            }
        }

        fn set(&self, attr: sys::CUmemPool_attribute, mut v: u64) {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: valid pool; the attributes set here (the release threshold and the two
            // high-water marks, which only accept 0) take a u64.
            let _ = unsafe {
                mem_pool::set_attribute(
                    self.pool,
                    attr,
                    &mut v as *mut u64 as *mut std::ffi::c_void,
                )
            };
        }

        pub fn fold_peak(&self) {
            let now = self.window_peak();
            shared(self.pool, |s| s.folded = s.folded.max(now));
            self.trim();
            self.set(
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                0,
            );
        }

        pub fn reset_peak(&self) {
            shared(self.pool, |s| s.folded = 0);
            self.set(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0);
            self.set(
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                0,
            );
        }

        pub fn release_threshold(&self) -> u64 {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        }

        pub fn set_release_threshold(&self, bytes: u64) {
            shared(self.pool, |s| s.cap = Some(bytes));
            self.set(
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                bytes,
            );
        }

        pub fn trim(&self) {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: valid pool.
            let _ = unsafe { mem_pool::trim_to(self.pool, 0) };
        }

        /// The pool's reserved high-water mark plus the memory outside the pool now, or a
        /// larger peak folded earlier in the window.
        pub fn peak(&self) -> u64 {
            self.window_peak().max(shared(self.pool, |s| s.folded))
        }

        fn window_peak(&self) -> u64 {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) + self.outside()
        }

        /// Device memory in use that the pool does not hold: total − free − reserved.
        pub fn outside(&self) -> u64 {
            let Ok((free, total)) = self.ctx.mem_get_info() else {
                return 0;
            };
            let reserved = self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
            (total as u64)
                .saturating_sub(free as u64)
                .saturating_sub(reserved)
        }

        pub fn reserved_high(&self) -> u64 {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
        }

        pub fn reserved(&self) -> u64 {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
        }

        pub fn current(&self) -> u64 {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        pub fn free(&self) -> u64 {
            let reserved = self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
            let used = self.current();
            let free = self.ctx.mem_get_info().map(|(f, _)| f as u64).unwrap_or(0);
            free + reserved.saturating_sub(used)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_trace_line_is_the_rss_in_mib() {
        let p = MemoryProbe::new(&Device::Cpu).unwrap();
        let line = p.trace_line();
        let mib: u64 = line
            .strip_prefix("rss ")
            .and_then(|r| r.strip_suffix(" MiB"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected trace line {line:?}"));
        // A test process holds at least a few MiB resident, and far less than 1 TiB.
        assert!((1..1 << 20).contains(&mib), "{line}");
        // No allocator cache to cap on the CPU.
        p.cap_cache(1 << 20);
        assert_eq!(p.cache_cap(), u64::MAX);
        // Folding the peak on the CPU only returns malloc's free heap: the peak stays readable.
        p.fold_peak();
        assert!(p.peak_bytes() >= mib << 20 || p.peak_bytes() == 0);
    }

    #[test]
    fn halving_retries_out_of_memory_only_and_stops_at_one() {
        let oom = |what: &str| -> anyhow::Error { OutOfMemory { what: what.into() }.into() };
        // Fits at 3 images: 12 → 6 → 3, with the retries reported in order.
        let mut seen = vec![];
        let (v, size, n) = halve_on_oom(
            12,
            |b| if b > 3 { Err(oom("x")) } else { Ok(b * 10) },
            |old, new| {
                seen.push((old, new));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!((v, size, n), (30, 3, 2));
        assert_eq!(seen, vec![(12, 6), (6, 3)]);
        // Out of memory even at 1: the error comes back, after 2 halvings.
        let mut tries = vec![];
        let e = halve_on_oom(
            4,
            |b| -> anyhow::Result<()> {
                tries.push(b);
                Err(oom("always"))
            },
            |_, _| Ok(()),
        )
        .unwrap_err();
        assert!(is_oom(&e));
        assert_eq!(tries, vec![4, 2, 1]);
        // Any other error is not retried.
        let mut n = 0;
        let e = halve_on_oom(
            8,
            |_| -> anyhow::Result<()> {
                n += 1;
                anyhow::bail!("disk full")
            },
            |_, _| Ok(()),
        )
        .unwrap_err();
        assert_eq!((n, e.to_string()), (1, "disk full".to_string()));
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert_eq!(parse_size(" 8 gb ").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "GiB", "8XB", "-1G", "0G", "nan"] {
            assert!(parse_size(bad).is_err(), "{bad} accepted");
        }
        let e = parse_size("8XB").unwrap_err().to_string();
        assert!(e.contains("8XB") && e.contains("GiB"), "{e}");
    }

    #[test]
    fn oom_errors_are_recognised_through_context() {
        let e = anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")")
            .context("forward of the training graph");
        assert!(is_oom(&e));
        assert!(!is_oom(&anyhow::anyhow!("shape mismatch")));
    }
}
