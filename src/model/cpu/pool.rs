//! The CPU engine's thread pool: `threads − 1` workers of its own and the calling thread, each
//! op's tasks split into one contiguous range per thread, workers that spin briefly between
//! ops instead of sleeping.
//!
//! Why not rayon (which the engine used before): an op of the inference graph lasts 0.05–10 ms
//! and a forward runs ~230 of them back to back. Under rayon a worker that finished its share
//! early went to sleep and had to be woken for the next op (a futex round trip, tens of µs on
//! a virtual machine), and which thread ran which tiles changed from op to op, so a layer read
//! its input from the other core's L2 about half the time. Here thread `t` first takes tasks
//! `[n·t/T, n·(t+1)/T)` of every op (the same band of output rows from layer to layer: its own
//! writes of the previous layer, still in its cache), then steals what is left of the others'
//! ranges, so a thread slowed by the machine still finishes together with the rest.
//!
//! One op runs at a time (a mutex): forwards called from several threads at once take turns
//! op by op, each on its own arena.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins for the next op before it sleeps (the ops of one forward
/// follow each other within microseconds; a forward's last op is followed by post-processing).
const SPIN: Duration = Duration::from_micros(300);

/// A task body: `f(task, thread)`, `thread` in `0..threads` (0: the calling thread).
type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// Bits of [`Shared::gate`]: workers inside the current op (low 16 bits), the op still open to
/// joiners, and the op's number above.
const ACTIVE: usize = 0xFFFF;
const OPEN: usize = 1 << 16;
const EPOCH: usize = 1 << 17;

/// One cache line per counter (threads claim tasks from each other's ranges).
#[repr(align(128))]
#[derive(Default)]
struct Padded(AtomicUsize);

struct Shared {
    threads: usize,
    /// Op number, open flag and active workers (see [`ACTIVE`]). A worker joins an op only
    /// while it is open (a compare-exchange), so no worker reads an op's job after its caller
    /// closed it and returned.
    gate: AtomicUsize,
    /// The current op's `&Job` (a thin pointer to the caller's fat reference).
    job: AtomicPtr<()>,
    /// Per thread: next task of its range, and the range's end.
    next: Vec<Padded>,
    end: Vec<Padded>,
    /// A task panicked on a worker (the caller panics after the op).
    panicked: AtomicBool,
    /// Workers asleep, and what they sleep on.
    sleepers: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Shared {
    /// Runs tasks as thread `me`: its own range, then what is left of the others'.
    fn work(&self, f: &Job, me: usize) {
        for k in 0..self.threads {
            let o = (me + k) % self.threads;
            let end = self.end[o].0.load(Ordering::Relaxed);
            loop {
                let i = self.next[o].0.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                f(i, me);
            }
        }
    }

    /// Worker `me`'s life: wait for an op, join it if still open, run tasks, repeat.
    fn worker(&self, me: usize) {
        let mut seen = self.gate.load(Ordering::Acquire) / EPOCH;
        loop {
            let g = self.wait_past(seen);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            seen = g / EPOCH;
            if !self.join(g) {
                continue;
            }
            // SAFETY: joined while the op was open: its caller waits for this worker before
            // its closure goes out of scope.
            let f = unsafe { *(self.job.load(Ordering::Acquire) as *const &Job) };
            if catch_unwind(AssertUnwindSafe(|| self.work(f, me))).is_err() {
                self.panicked.store(true, Ordering::Release);
            }
            self.gate.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Spins, then sleeps, until the op number passes `seen` (or the pool stops); returns the
    /// gate.
    fn wait_past(&self, seen: usize) -> usize {
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = self.gate.load(Ordering::Acquire);
            if g / EPOCH != seen || self.stop.load(Ordering::Acquire) {
                return g;
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                let waited = t0.elapsed();
                if waited > SPIN {
                    break;
                }
                if waited > SPIN / 8 {
                    // Past the gaps between one forward's ops: leave the core to others (more
                    // threads than cores) while still answering within a scheduler slice.
                    std::thread::yield_now();
                }
            }
            std::hint::spin_loop();
        }
        let mut guard = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        loop {
            let g = self.gate.load(Ordering::SeqCst);
            if g / EPOCH != seen || self.stop.load(Ordering::SeqCst) {
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                return g;
            }
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Joins the op of gate value `g` if it is still that op and open.
    fn join(&self, mut g: usize) -> bool {
        let epoch = g / EPOCH;
        while g / EPOCH == epoch && g & OPEN != 0 {
            match self
                .gate
                .compare_exchange_weak(g, g + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => g = now,
            }
        }
        false
    }
}

/// The engine's threads (see the module docs). Dropping it stops and joins the workers.
pub(crate) struct Pool {
    shared: Arc<Shared>,
    /// One op at a time.
    busy: Mutex<()>,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.shared.threads)
    }
}

impl Pool {
    /// A pool of `threads` (≥ 1) threads: the caller of [`Pool::each`] and `threads − 1`
    /// workers named `yolo9-cpu-1…`. Errors: a thread that cannot start.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let threads = threads.clamp(1, ACTIVE);
        let shared = Arc::new(Shared {
            threads,
            gate: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            next: (0..threads).map(|_| Padded::default()).collect(),
            end: (0..threads).map(|_| Padded::default()).collect(),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut pool = Self {
            shared: shared.clone(),
            busy: Mutex::new(()),
            handles: Vec::new(),
        };
        for me in 1..threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("yolo9-cpu-{me}"))
                .spawn(move || s.worker(me))?;
            // Pushed one by one: a failed spawn drops `pool`, which stops those started.
            pool.handles.push(h);
        }
        Ok(pool)
    }

    /// Threads, the caller included.
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Runs `f(task, thread)` for every task in `0..n`, spread over the threads, and returns
    /// when all have run. A panic in a task is raised here after the others finished. Not to
    /// be called from inside a task (one op at a time: it would wait for itself).
    pub fn each(&self, n: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let s = &*self.shared;
        if n == 0 {
            return;
        }
        if s.threads == 1 || n == 1 {
            (0..n).for_each(|i| f(i, 0));
            return;
        }
        let _one = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        let t = s.threads;
        for k in 0..t {
            s.next[k].0.store(n * k / t, Ordering::Relaxed);
            s.end[k].0.store(n * (k + 1) / t, Ordering::Relaxed);
        }
        let fat: &Job = f;
        s.job
            .store(&fat as *const &Job as *mut (), Ordering::Relaxed);
        // Publish: a new op number, open, no worker inside (the last op's were waited for).
        let epoch = s.gate.load(Ordering::Relaxed) / EPOCH + 1;
        s.gate.store((epoch * EPOCH) | OPEN, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| s.work(fat, 0)));
        // Every task is claimed now; close the op and wait for the workers inside it.
        s.gate.fetch_and(!OPEN, Ordering::AcqRel);
        let t0 = Instant::now();
        let mut spins = 0u32;
        while s.gate.load(Ordering::Acquire) & ACTIVE != 0 {
            std::hint::spin_loop();
            spins += 1;
            if spins.is_multiple_of(64) && t0.elapsed() > SPIN {
                std::thread::yield_now();
            }
        }
        let worker_panicked = s.panicked.swap(false, Ordering::AcqRel);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if worker_panicked {
            panic!("cpu engine: a task panicked on a worker thread");
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Every task runs exactly once, on a valid thread index, for task counts below, at and
    /// above the thread count, op after op (the workers spin or sleep in between).
    #[test]
    fn every_task_runs_once() {
        for threads in [1, 2, 3, 5] {
            let pool = Pool::new(threads).unwrap();
            for (round, n) in [0usize, 1, 2, 3, 7, 64, 1000].into_iter().enumerate() {
                let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
                pool.each(n, &|i, t| {
                    assert!(t < threads);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "threads {threads}, n {n}"
                );
                if round == 3 {
                    // Past the spin time: the workers sleep and must be woken.
                    std::thread::sleep(SPIN * 4);
                }
            }
        }
    }

    /// Two threads calling one pool at once: each call's tasks run once, with its own closure.
    #[test]
    fn concurrent_callers_take_turns() {
        let pool = Pool::new(3).unwrap();
        let sums: Vec<u64> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2u64)
                .map(|c| {
                    let pool = &pool;
                    sc.spawn(move || {
                        let total = AtomicU64::new(0);
                        for _ in 0..200 {
                            pool.each(50, &|i, _| {
                                total.fetch_add(i as u64 + c * 1000, Ordering::Relaxed);
                            });
                        }
                        total.into_inner()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(sums, vec![200 * 1225, 200 * (1225 + 50_000)]);
    }

    /// A task that panics on a worker is raised to the caller, and the pool still works.
    #[test]
    fn a_panicking_task_is_raised_and_the_pool_survives() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.each(8, &|i, _| {
                if i == 7 {
                    panic!("task 7");
                }
            })
        }));
        assert!(r.is_err());
        let ran = AtomicU64::new(0);
        pool.each(8, &|_, _| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.into_inner(), 8);
    }
}
