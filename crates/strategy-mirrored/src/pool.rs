//! [`ReplicaPool`]: one persistent thread per replica, created once and reused by every `run`,
//! and the calling thread itself as replica 0 when it can be.
//!
//! TF starts a thread per replica on every `run`, which is most of its step overhead. Here each
//! replica thread owns its collectives handle (an NCCL communicator must stay on one thread) and
//! waits for jobs: it spins, then polls (yielding its core) for a short while after each job, so
//! back-to-back steps start in well under a microsecond, then parks so an idle strategy costs no
//! CPU.
//!
//! Replica 0 runs on the thread that calls `run` when its device is the host's and the backend's
//! handles may move between threads ([`CrossDeviceOps::movable_replica_collectives`]), as TF and
//! JAX drive their first replica from the calling thread. A caller that only waited for N replica
//! threads would take one of the cores they need: on 2 cores, 2 replicas plus a waiting caller
//! plus an input pipeline's prefetch thread are 4 runnable threads, and the step pays for their
//! preemptions. One replica then runs with no hand-over at all. A GPU replica 0 keeps its thread:
//! the thread owns the GPU's context and stream.
//!
//! A job borrows from the caller's stack (the step function, the inputs, the output slots), so
//! its lifetime is erased while the threads run it; that is sound because [`ReplicaPool::execute`]
//! does not return until every thread has finished with it, and it cannot unwind in between.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use distribute_collectives::{CrossDeviceOps, ReplicaCollectives};
use distribute_device_spec::{LocalDevice, LocalDevices};
use distribute_strategy::StrategyError;
use distribute_values::Lock;

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
    job: Lock<Option<JobRef>>,
    /// Replica threads still running the current job.
    remaining: AtomicUsize,
    /// The thread waiting in `execute`, woken by the last replica to finish.
    caller: Lock<Option<Thread>>,
    shutdown: AtomicBool,
    idle_spin: Duration,
}

/// Busy-wait iterations before a wait starts yielding: under a microsecond, the time a peer
/// that is running on another core needs to notice a new job or finish a trivial one. Longer
/// spinning keeps a thread that is not running off its core; a yield is a system call (~0.3 µs).
/// The spin is plain loads, without the `pause` hint: in a virtual machine a run of `pause`s
/// past the hypervisor's pause-loop window exits to it, which takes the core away (the
/// rendezvous of `distribute-collectives` measured this).
const SPIN_ITERATIONS: u32 = 512;

/// Waits until `ready()`: spins briefly, then yields its core until `polling` has passed, then
/// parks (a futex wait) for at most `nap` at a time; whoever makes `ready()` true unparks this
/// thread. Yielding rather than spinning past the first microsecond: on a machine whose cores are
/// shared (with other replicas, the caller, an input pipeline, other processes) a spinning
/// thread keeps the thread everyone waits for off its core until the scheduler's next tick, tens
/// to hundreds of µs per step; a yield with nothing else runnable costs a fraction of a µs.
fn wait_until(ready: impl Fn() -> bool, polling: Duration, nap: Option<Duration>) {
    for _ in 0..SPIN_ITERATIONS {
        if ready() {
            return;
        }
    }
    let start = Instant::now();
    while !ready() {
        if start.elapsed() < polling {
            std::thread::yield_now();
        } else {
            match nap {
                Some(nap) => std::thread::park_timeout(nap),
                None => std::thread::park(),
            }
        }
    }
}

/// Persistent replica threads, and replica 0's handle when the caller runs it.
pub(crate) struct ReplicaPool {
    shared: Arc<Shared>,
    /// The threads of replicas `first_threaded..`, in replica order.
    threads: Vec<JoinHandle<()>>,
    /// Replica 0's collectives when the thread calling `execute` runs replica 0 itself; locked
    /// for the whole job, which `running` already makes exclusive. The job's panics are caught
    /// inside the lock (`run_caught`), and the backend behind the handle is reset before every
    /// step.
    caller_replica: Option<Lock<Box<dyn ReplicaCollectives + Send>>>,
    /// One `run` at a time: the threads serve one job.
    running: Lock<()>,
}

impl ReplicaPool {
    /// Starts one thread per replica; each makes its collectives handle from `ops` on itself.
    ///
    /// With feature `cuda`, the thread of a GPU device opens its GPU with a stream of its own and
    /// makes it the thread's current GPU before anything else (NCCL communicators need it).
    ///
    /// With `caller_runs_replica_0`, replica 0 runs on the thread calling
    /// [`ReplicaPool::execute`] instead, when its device is not a GPU and `ops` hands out a
    /// movable handle for it.
    pub(crate) fn start(
        ops: Arc<dyn CrossDeviceOps>,
        devices: &LocalDevices,
        idle_spin: Duration,
        caller_runs_replica_0: bool,
    ) -> Result<ReplicaPool, StrategyError> {
        let caller_replica = match devices.iter().next() {
            Some(first) if caller_runs_replica_0 && first.gpu_index().is_none() => {
                movable_handle(ops.as_ref())?.map(Lock::new)
            }
            _ => None,
        };
        let first_threaded = usize::from(caller_replica.is_some());
        let num_threads = devices.len() - first_threaded;
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Lock::new(None),
            remaining: AtomicUsize::new(0),
            caller: Lock::new(None),
            shutdown: AtomicBool::new(false),
            idle_spin,
        });
        // The pool exists before any thread does, so that every early return below drops it,
        // which stops and joins the threads already started.
        let mut pool = ReplicaPool {
            shared,
            threads: Vec::with_capacity(num_threads),
            caller_replica,
            running: Lock::new(()),
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for (replica, device) in devices.iter().enumerate().skip(first_threaded) {
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
        for _ in 0..num_threads {
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

    /// Runs `job` for every replica (on the replica threads, and replica 0 on this thread when
    /// the caller runs it) and returns when all have finished it.
    ///
    /// A panic that escapes `job` is caught, and the replica still reports back; the job must
    /// record its own outcome to tell the caller.
    pub(crate) fn execute(&self, job: &Job<'_>) -> Result<(), StrategyError> {
        if Self::on_replica_thread() {
            return Err(StrategyError::Runtime(
                "run was called from inside a replica's step; a step cannot start another step \
                 (use merge_call to reach cross-replica context)"
                    .into(),
            ));
        }
        let _one_at_a_time = self.running.lock();
        let shared = &*self.shared;
        let finish = if self.threads.is_empty() {
            None
        } else {
            // SAFETY: erasing the lifetime is sound because the `Finish` guard below, which no
            // path out of this function can skip (returning or unwinding), waits until every
            // replica thread has finished the job (`remaining` reaches 0) and then clears it.
            let erased: *const Job<'static> =
                unsafe { std::mem::transmute::<*const Job<'_>, *const Job<'static>>(job) };
            *shared.job.lock() = Some(JobRef(erased));
            *shared.caller.lock() = Some(std::thread::current());
            shared.remaining.store(self.threads.len(), Ordering::SeqCst);
            shared.epoch.fetch_add(1, Ordering::SeqCst);
            let finish = Finish { shared };
            for thread in &self.threads {
                // No system call unless the thread is parked.
                thread.thread().unpark();
            }
            Some(finish)
        };
        if let Some(collectives) = &self.caller_replica {
            let collectives = collectives.lock();
            let _on_replica = OnReplicaThread::enter();
            run_caught(|| job(0, collectives.as_ref()));
        }
        drop(finish);
        Ok(())
    }
}

/// Replica 0's movable handle from `ops`, or `None` when the backend has none; a panicking
/// backend hook is an error, as on a replica thread.
fn movable_handle(
    ops: &dyn CrossDeviceOps,
) -> Result<Option<Box<dyn ReplicaCollectives + Send>>, StrategyError> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| ops.movable_replica_collectives(0))) {
        Ok(made) => Ok(made?),
        Err(payload) => {
            std::mem::forget(payload);
            Err(StrategyError::Runtime(
                "replica 0's collectives handle panicked while being made".into(),
            ))
        }
    }
}

/// Runs a job for one replica, catching what escapes it: jobs catch their step's panics
/// themselves, so this catches the rest (a panicking user `CrossDeviceOps` hook); the job has
/// then stored no result, which the caller reports as that replica's failure. A payload whose
/// `Drop` panicked would unwind past the replica's report and leave `execute` waiting forever:
/// it is leaked instead (this path is already a bug in a user's hook).
fn run_caught(job: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(AssertUnwindSafe(job)) {
        std::mem::forget(payload);
    }
}

/// Marks the calling thread as running a replica while it runs replica 0's job, so that a step
/// calling `run` fails instead of deadlocking, as on a replica thread.
struct OnReplicaThread;

impl OnReplicaThread {
    fn enter() -> Self {
        ON_REPLICA_THREAD.with(|flag| flag.set(true));
        OnReplicaThread
    }
}

impl Drop for OnReplicaThread {
    fn drop(&mut self) {
        ON_REPLICA_THREAD.with(|flag| flag.set(false));
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
        // The last replica thread to finish unparks this thread; the nap bounds a wake-up lost
        // to a stale unpark token.
        wait_until(
            || shared.remaining.load(Ordering::SeqCst) == 0,
            shared.idle_spin,
            Some(Duration::from_millis(10)),
        );
        *shared.job.lock() = None;
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
    use distribute_tensor::cuda::{Gpu, set_current_gpu};
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
        wait_until(
            || {
                shared.shutdown.load(Ordering::SeqCst)
                    || shared.epoch.load(Ordering::SeqCst) != seen
            },
            shared.idle_spin,
            None,
        );
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        seen = shared.epoch.load(Ordering::SeqCst);
        let job = *shared.job.lock();
        if let Some(JobRef(job)) = job {
            let collectives = collectives.as_ref();
            // SAFETY: `execute` keeps the job alive until `remaining` reaches 0, which cannot
            // happen before this thread's decrement below.
            run_caught(|| unsafe { (*job)(replica, collectives) });
        }
        if shared.remaining.fetch_sub(1, Ordering::SeqCst) == 1
            && let Some(caller) = shared.caller.lock().as_ref()
        {
            caller.unpark();
        }
    }
}
