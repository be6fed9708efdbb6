//! [`ReplicaPool`]: one persistent thread per replica, created once and reused by every `run`.
//!
//! TF starts a thread per replica on every `run`, which is most of its step overhead. Here each
//! replica thread owns its collectives handle (an NCCL communicator must stay on one thread) and
//! waits for jobs: it polls (yielding its core) for a short while after
//! each job, so back-to-back steps start in about a microsecond, then parks so an idle strategy
//! costs no CPU.
//!
//! A job borrows from the caller's stack (the step function, the inputs, the output slots), so
//! its lifetime is erased while the threads run it; that is sound because [`ReplicaPool::execute`]
//! does not return until every thread has finished with it, and it cannot unwind in between.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use distribute_collectives::{CrossDeviceOps, ReplicaCollectives, lock_ignoring_poison as lock};
use distribute_device_spec::{LocalDevice, LocalDevices};
use distribute_strategy::StrategyError;

/// Work for every replica: called once per replica thread with its id and collectives.
pub(crate) type Job<'a> = dyn Fn(usize, &dyn ReplicaCollectives) + Sync + 'a;

/// A job with its lifetime erased; only dereferenced while `execute` waits for it.
#[derive(Clone, Copy)]
struct JobRef(*const Job<'static>);

// SAFETY: the pointee is `Sync`, and `execute` keeps it alive until every thread is done with it.
unsafe impl Send for JobRef {}

thread_local! {
    /// Set on replica threads, so a step that calls `run` again fails instead of deadlocking.
    static ON_REPLICA_THREAD: Cell<bool> = const { Cell::new(false) };
}

struct Shared {
    /// Jobs started; a thread runs a job when this moves past the last one it ran.
    epoch: AtomicU64,
    job: Mutex<Option<JobRef>>,
    /// Replica threads still running the current job.
    remaining: AtomicUsize,
    /// The thread waiting in `execute`, woken by the last replica to finish.
    caller: Mutex<Option<Thread>>,
    shutdown: AtomicBool,
    idle_spin: Duration,
}

/// One pause of a short wait. Yielding rather than spinning: on a machine whose cores are
/// shared (with other replicas, the caller, or other processes) a spinning thread keeps the
/// replica everyone waits for off its core until the scheduler's next tick, tens to hundreds of
/// µs per step; a yield with nothing else runnable costs a fraction of a µs.
fn pause() {
    std::thread::yield_now();
}

/// Persistent replica threads.
pub(crate) struct ReplicaPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// One `run` at a time: the threads serve one job.
    running: Mutex<()>,
}

impl ReplicaPool {
    /// Starts one thread per replica; each makes its collectives handle from `ops` on itself.
    ///
    /// With feature `cuda`, the thread of a GPU device opens its GPU with a stream of its own and
    /// makes it the thread's current GPU before anything else (NCCL communicators need it).
    pub(crate) fn start(
        ops: Arc<dyn CrossDeviceOps>,
        devices: &LocalDevices,
        idle_spin: Duration,
    ) -> Result<ReplicaPool, StrategyError> {
        let num_replicas = devices.len();
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            remaining: AtomicUsize::new(0),
            caller: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            idle_spin,
        });
        // The pool exists before any thread does, so that every early return below drops it,
        // which stops and joins the threads already started.
        let mut pool = ReplicaPool {
            shared,
            threads: Vec::with_capacity(num_replicas),
            running: Mutex::new(()),
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for (replica, device) in devices.iter().enumerate() {
            let (shared, ops, ready) =
                (Arc::clone(&pool.shared), Arc::clone(&ops), ready_tx.clone());
            let device = device.clone();
            let thread = std::thread::Builder::new()
                .name(format!("replica-{replica}"))
                .spawn(move || replica_thread(replica, &device, &shared, ops.as_ref(), ready))
                .map_err(|e| {
                    StrategyError::Runtime(format!("cannot start replica thread {replica}: {e}"))
                })?;
            pool.threads.push(thread);
        }
        // Only the threads hold senders now: one that dies without reporting ends `recv`.
        drop(ready_tx);
        // Every thread reports whether it could make its collectives handle.
        for _ in 0..num_replicas {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(error),
                Err(_) => {
                    return Err(StrategyError::Runtime(
                        "a replica thread exited while starting".into(),
                    ));
                }
            }
        }
        Ok(pool)
    }

    /// True on a replica thread of any pool.
    pub(crate) fn on_replica_thread() -> bool {
        ON_REPLICA_THREAD.with(Cell::get)
    }

    /// Runs `job` on every replica thread and returns when all have finished it.
    ///
    /// A panic that escapes `job` is caught on the replica thread, which still reports back; the
    /// job must record its own outcome to tell the caller.
    pub(crate) fn execute(&self, job: &Job<'_>) -> Result<(), StrategyError> {
        if Self::on_replica_thread() {
            return Err(StrategyError::Runtime(
                "run was called from inside a replica's step; a step cannot start another step \
                 (use merge_call to reach cross-replica context)"
                    .into(),
            ));
        }
        let _one_at_a_time = lock(&self.running);
        let shared = &*self.shared;
        // SAFETY: erasing the lifetime is sound because the `Finish` guard below, which no path
        // out of this function can skip (returning or unwinding), waits until every replica
        // thread has finished the job (`remaining` reaches 0) and then clears it.
        let erased: *const Job<'static> =
            unsafe { std::mem::transmute::<*const Job<'_>, *const Job<'static>>(job) };
        *lock(&shared.job) = Some(JobRef(erased));
        *lock(&shared.caller) = Some(std::thread::current());
        shared.remaining.store(self.threads.len(), Ordering::SeqCst);
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        let finish = Finish { shared };
        for thread in &self.threads {
            thread.thread().unpark();
        }
        drop(finish);
        Ok(())
    }
}

/// Waits for every replica thread to finish the current job, then clears it: the end of
/// `execute`, made a guard so that the job's borrowed data outlives every use of it.
struct Finish<'a> {
    shared: &'a Shared,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let shared = self.shared;
        let start = Instant::now();
        while shared.remaining.load(Ordering::SeqCst) != 0 {
            if start.elapsed() < shared.idle_spin {
                pause();
            } else {
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
        *lock(&shared.job) = None;
    }
}

impl Drop for ReplicaPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for thread in &self.threads {
            thread.thread().unpark();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Makes `device`, when it is a GPU, the thread's current GPU, with a stream of its own.
#[cfg(feature = "cuda")]
fn own_device(device: &LocalDevice) -> Result<(), StrategyError> {
    use distribute_collectives::cuda::{Gpu, set_current_gpu};
    if let Some(ordinal) = device.gpu_index() {
        let gpu = Gpu::open(ordinal)
            .and_then(|gpu| gpu.with_new_stream())
            .map_err(distribute_collectives::CollectiveError::from)?;
        set_current_gpu(gpu).map_err(distribute_collectives::CollectiveError::from)?;
    }
    Ok(())
}

/// Without feature `cuda`, every device's values live in host memory.
#[cfg(not(feature = "cuda"))]
fn own_device(_device: &LocalDevice) -> Result<(), StrategyError> {
    Ok(())
}

fn replica_thread(
    replica: usize,
    device: &LocalDevice,
    shared: &Shared,
    ops: &dyn CrossDeviceOps,
    ready: std::sync::mpsc::Sender<Result<(), StrategyError>>,
) {
    ON_REPLICA_THREAD.with(|flag| flag.set(true));
    if let Err(error) = own_device(device) {
        let _ = ready.send(Err(error));
        return;
    }
    // A user's `CrossDeviceOps` may panic here; that must reach `start` as an error, not leave
    // it waiting for a report that never comes.
    let made = std::panic::catch_unwind(AssertUnwindSafe(|| ops.replica_collectives(replica)));
    let collectives = match made {
        Ok(Ok(collectives)) => {
            let _ = ready.send(Ok(()));
            collectives
        }
        Ok(Err(error)) => {
            let _ = ready.send(Err(error.into()));
            return;
        }
        Err(payload) => {
            // Leaked, not dropped: a panicking `Drop` here would end the thread unreported.
            std::mem::forget(payload);
            let _ = ready.send(Err(StrategyError::Runtime(format!(
                "replica {replica}'s collectives handle panicked while being made"
            ))));
            return;
        }
    };
    drop(ready);
    let mut seen = 0;
    loop {
        let idle_since = Instant::now();
        loop {
            if shared.shutdown.load(Ordering::SeqCst) {
                return;
            }
            if shared.epoch.load(Ordering::SeqCst) != seen {
                break;
            }
            if idle_since.elapsed() < shared.idle_spin {
                pause();
            } else {
                std::thread::park();
            }
        }
        seen = shared.epoch.load(Ordering::SeqCst);
        let job = *lock(&shared.job);
        if let Some(JobRef(job)) = job {
            // Jobs catch their step's panics themselves; this catches the rest (a panicking
            // user `CrossDeviceOps` hook), so the thread survives and still reports back below.
            // The job then has stored no result, which the caller reports as this replica's
            // failure.
            let collectives = collectives.as_ref();
            // SAFETY: `execute` keeps the job alive until `remaining` reaches 0, which cannot
            // happen before this thread's decrement below.
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| unsafe {
                (*job)(replica, collectives)
            }));
            // A payload whose `Drop` panicked would unwind this thread past the report below,
            // and `execute` would wait forever: leak it instead (this path is already a bug in
            // a user's hook).
            if let Err(payload) = outcome {
                std::mem::forget(payload);
            }
        }
        if shared.remaining.fetch_sub(1, Ordering::SeqCst) == 1
            && let Some(caller) = lock(&shared.caller).as_ref()
        {
            caller.unpark();
        }
    }
}
