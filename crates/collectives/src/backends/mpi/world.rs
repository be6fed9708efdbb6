//! The MPI process world: MPI initialised once per process, this process's rank and the world's
//! size, and the few cross-process calls the backend makes, each a non-blocking MPI call polled
//! against a deadline.
//!
//! Threading level: `MPI_THREAD_SERIALIZED`. The cross-process step of a collective is made by
//! whichever thread gets there (local replica 0's thread inside a step, the caller's thread for
//! the end-of-step agreement and for cross-replica reductions), never by two at once: every MPI
//! call goes through [`MpiWorld`]'s lock. `SERIALIZED` allows exactly that, and costs Open MPI
//! none of the locking `MPI_THREAD_MULTIPLE` adds to every call.
//!
//! Waits: a call that may wait for a worker that never comes (the agreement every cross-worker
//! call starts with, the NCCL id broadcast) is a non-blocking MPI call polled against the
//! deadline; past it the job is aborted (`MPI_Abort`) with a message naming what was waited for —
//! a peer that will never come cannot be told apart from a slow one, and a started collective
//! cannot be cancelled, so ending the job is the only way not to hang. The data collective right
//! after a successful agreement is a plain blocking call ([`Wait::Committed`]): every worker has
//! agreed to make it and nothing of the user's runs in between, so the only way a peer misses it
//! is by dying, which ends the job under `mpirun`; Open MPI's blocking collectives are also
//! faster than its non-blocking ones (measured: 1 MiB all-gather ≈ 1.3× faster).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mpi::Threading;
use mpi::request::{Request, Scope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;

use crate::CollectiveError;

/// How a call waits.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    /// Non-blocking, polled; past the deadline the job is aborted.
    Polled(Duration),
    /// Blocking: every worker has agreed to make this call (see the module docs).
    Committed,
}
use crate::rendezvous::lock_ignoring_poison as lock;

/// This process in the MPI world: initialised on first use, finalised when the process exits.
#[derive(Debug)]
pub struct MpiWorld {
    rank: usize,
    size: usize,
    /// One MPI call at a time (`MPI_THREAD_SERIALIZED`).
    calls: Mutex<()>,
    /// Nanoseconds spent in cross-process calls, for [`Self::time_in_calls`].
    busy_nanos: AtomicU64,
}

static WORLD: OnceLock<Result<MpiWorld, String>> = OnceLock::new();

unsafe extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// `MPI_Finalize` at process exit: a process that leaves without it makes `mpirun` report an
/// error and exit non-zero, and statics (where the world lives) are never dropped.
extern "C" fn finalize_at_exit() {
    let mut finalized = 0;
    // SAFETY: plain MPI calls with a valid out-pointer; MPI was initialised before this was
    // registered.
    unsafe {
        mpi::ffi::MPI_Finalized(&mut finalized);
        if finalized == 0 {
            mpi::ffi::MPI_Finalize();
        }
    }
}

impl MpiWorld {
    /// The world of this process, initialising MPI on the first call (`MPI_THREAD_SERIALIZED`).
    ///
    /// Started by `mpirun`, this is the job's world; started alone, a world of one. Fails when
    /// MPI was initialised by someone else in this process, or does not offer the threading
    /// level.
    pub fn get() -> Result<&'static MpiWorld, CollectiveError> {
        WORLD
            .get_or_init(|| {
                raise_shared_memory_eager_limit();
                let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
                    .ok_or_else(|| {
                        "MPI was already initialised in this process by another library; \
                         distribute initialises it itself (MPI_THREAD_SERIALIZED)"
                            .to_owned()
                    })?;
                // The universe would finalise MPI when dropped; the world lives until the
                // process exits, where `finalize_at_exit` does it instead.
                std::mem::forget(universe);
                // SAFETY: registers a plain `extern "C" fn` with the C library.
                unsafe {
                    atexit(finalize_at_exit);
                }
                if provided < Threading::Serialized {
                    return Err(format!(
                        "this MPI offers only {provided:?} threading; distribute needs \
                         MPI_THREAD_SERIALIZED (replica threads take turns making MPI calls)"
                    ));
                }
                let world = SimpleCommunicator::world();
                Ok(MpiWorld {
                    rank: world.rank() as usize,
                    size: world.size() as usize,
                    calls: Mutex::new(()),
                    busy_nanos: AtomicU64::new(0),
                })
            })
            .as_ref()
            .map_err(|reason| CollectiveError::InvalidArgument(reason.clone()))
    }

    /// This process's rank: its worker index.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes: the worker count.
    pub fn size(&self) -> usize {
        self.size
    }

    /// How long this process has waited in cross-process calls (all-reduces, agreements,
    /// exchanges) since MPI started, from every thread: a program's "cross-worker
    /// communication" time, read before and after a step.
    pub fn time_in_calls(&self) -> Duration {
        Duration::from_nanos(self.busy_nanos.load(Ordering::Relaxed))
    }

    /// Ends every process of the job with `message` on stderr (`MPI_Abort`, exit code 1).
    pub fn abort_job(&self, message: &str) -> ! {
        eprintln!(
            "distribute: worker {} of {}: {message}; aborting the MPI job",
            self.rank, self.size
        );
        SimpleCommunicator::world().abort(1)
    }

    /// Every process's `send` (all the same length) into `recv`, in rank order.
    pub(crate) fn all_gather<T: Equivalence + Copy>(
        &self,
        send: &[T],
        recv: &mut [T],
        wait: Wait,
        what: &dyn Fn() -> String,
    ) {
        let _one = lock(&self.calls);
        let _busy = Busy::start(&self.busy_nanos);
        let world = SimpleCommunicator::world();
        let Wait::Polled(deadline) = wait else {
            return world.all_gather_into(send, recv);
        };
        if self.size > POINT_TO_POINT_GATHER_MAX_WORKERS {
            return mpi::request::scope(|scope| {
                let request = world.immediate_all_gather_into(scope, send, recv);
                self.wait_all(vec![request], deadline, what);
            });
        }
        // A few workers exchange directly: Open MPI's non-blocking all-gather builds a schedule
        // per call, which costs more than the exchange itself at the size of an agreement.
        let mut blocks: Vec<&mut [T]> = recv.chunks_mut(send.len().max(1)).collect();
        if let Some(own) = blocks.get_mut(self.rank) {
            own.copy_from_slice(send);
        }
        mpi::request::scope(|scope| {
            let mut requests = Vec::with_capacity(2 * self.size);
            for (peer, block) in blocks.into_iter().enumerate() {
                if peer != self.rank && !send.is_empty() {
                    let process = world.process_at_rank(peer as i32);
                    requests
                        .push(process.immediate_receive_into_with_tag(scope, block, GATHER_TAG));
                }
            }
            for peer in (0..self.size).filter(|&p| p != self.rank && !send.is_empty()) {
                let process = world.process_at_rank(peer as i32);
                requests.push(process.immediate_send_with_tag(scope, send, GATHER_TAG));
            }
            self.wait_all(requests, deadline, what);
        });
    }

    /// Every process's `send` into `recv`, process `p`'s `counts[p]` elements at `displs[p]`.
    pub(crate) fn all_gather_varcount(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[i32],
        displs: &[i32],
        wait: Wait,
        what: &dyn Fn() -> String,
    ) {
        let _one = lock(&self.calls);
        let _busy = Busy::start(&self.busy_nanos);
        let world = SimpleCommunicator::world();
        let mut partition = mpi::datatype::PartitionMut::new(recv, counts, displs);
        let Wait::Polled(deadline) = wait else {
            return world.all_gather_varcount_into(send, &mut partition);
        };
        mpi::request::scope(|scope| {
            let request = world.immediate_all_gather_varcount_into(scope, send, &mut partition);
            self.wait_all(vec![request], deadline, what);
        });
    }

    /// Process `root`'s `buffer` into every process's.
    pub(crate) fn broadcast(
        &self,
        root: usize,
        buffer: &mut [u8],
        wait: Wait,
        what: &dyn Fn() -> String,
    ) {
        let _one = lock(&self.calls);
        let _busy = Busy::start(&self.busy_nanos);
        let world = SimpleCommunicator::world();
        let root = world.process_at_rank(root as i32);
        let Wait::Polled(deadline) = wait else {
            return root.broadcast_into(buffer);
        };
        mpi::request::scope(|scope| {
            let request = root.immediate_broadcast_into(scope, buffer);
            self.wait_all(vec![request], deadline, what);
        });
    }

    /// Point to point: every `receives` buffer filled from its peer and every `sends` buffer
    /// sent to its peer, all under `tag`, returning when all are done. Every receive is posted
    /// before any send, so peers exchanging with each other cannot block one another; the
    /// buffers are the caller's own (no copy into or out of MPI's), which is why the folds use
    /// this rather than a collective that also copies this process's own block. Only after an
    /// agreement ([`Wait::Committed`]): each peer makes the matching calls.
    pub(crate) fn send_receive(
        &self,
        sends: &[(usize, &[u8])],
        receives: Vec<(usize, &mut [u8])>,
        tag: i32,
    ) {
        let _one = lock(&self.calls);
        let _busy = Busy::start(&self.busy_nanos);
        let world = SimpleCommunicator::world();
        mpi::request::scope(|scope| {
            let mut requests = Vec::with_capacity(sends.len() + receives.len());
            // Pieces keep every count within MPI's `int`; a peer cuts the same lengths alike,
            // and messages between two processes under one tag arrive in order.
            for (peer, buffer) in receives {
                let process = world.process_at_rank(peer as i32);
                for piece in buffer.chunks_mut(MAX_MESSAGE_BYTES) {
                    requests.push(process.immediate_receive_into_with_tag(scope, piece, tag));
                }
            }
            for &(peer, buffer) in sends {
                let process = world.process_at_rank(peer as i32);
                for piece in buffer.chunks(MAX_MESSAGE_BYTES) {
                    requests.push(process.immediate_send_with_tag(scope, piece, tag));
                }
            }
            for request in requests {
                request.wait_without_status();
            }
        });
    }

    /// A plain blocking `MPI_Allreduce` (f32 sum), the reference a benchmark compares with.
    pub fn raw_all_reduce_sum_f32(&self, send: &[f32], recv: &mut [f32]) {
        let _one = lock(&self.calls);
        SimpleCommunicator::world().all_reduce_into(
            send,
            recv,
            mpi::collective::SystemOperation::sum(),
        );
    }

    /// Polls `requests` until they all complete; past `deadline`, aborts the job.
    fn wait_all<'a, R: ?Sized, S: Scope<'a>>(
        &self,
        mut requests: Vec<Request<'a, R, S>>,
        deadline: Duration,
        what: &dyn Fn() -> String,
    ) {
        let start = Instant::now();
        let mut polls = 0u32;
        while !requests.is_empty() {
            requests = requests
                .into_iter()
                .filter_map(|request| request.test().err())
                .collect();
            polls = polls.wrapping_add(1);
            // Checking the clock on every poll would cost more than the poll.
            if polls.is_multiple_of(1024) {
                if start.elapsed() > deadline {
                    self.abort_job(&format!(
                        "waited {deadline:?} for the other workers in {}",
                        what()
                    ));
                }
                std::thread::yield_now();
            }
        }
    }
}

/// Up to this many workers a polled all-gather (an agreement) is a direct exchange between
/// every pair; more use MPI's non-blocking all-gather, whose algorithms need fewer messages.
const POINT_TO_POINT_GATHER_MAX_WORKERS: usize = 8;

/// The tag of a polled all-gather's messages (the folds use 1 and 2).
const GATHER_TAG: i32 = 3;

/// The largest message [`MpiWorld::send_receive`] posts: counts are C `int`s.
const MAX_MESSAGE_BYTES: usize = 1 << 30;

/// The eager limit asked of Open MPI's shared-memory transport: an agreement slot (a record and
/// up to 4 KiB of inline payload) must fit one eager message.
pub(crate) const EAGER_LIMIT_BYTES: usize = 8192;

/// Asks Open MPI's shared-memory transport (`vader`, `sm` from 5.0) to send messages up to
/// [`EAGER_LIMIT_BYTES`] eagerly, unless the user chose a limit (`--mca` or the environment).
/// Its default, 4 KiB, sends an agreement slot (4 KiB payload plus a 112-byte record) through
/// the single-copy path (`process_vm_readv`, pinned pages): measured here, a 4 KiB all-reduce
/// took 7.3 µs with the default and 3.5 µs with this limit, against 3.1 µs for a raw
/// `MPI_Allreduce` of the same bytes in the same runs. Other MPIs ignore these variables.
fn raise_shared_memory_eager_limit() {
    let chosen = [
        "OMPI_MCA_btl_vader_eager_limit",
        "OMPI_MCA_btl_sm_eager_limit",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some());
    if chosen {
        return;
    }
    for name in [
        "OMPI_MCA_btl_vader_eager_limit",
        "OMPI_MCA_btl_sm_eager_limit",
    ] {
        // SAFETY: runs once, while MPI is initialised, before the strategy starts its replica
        // threads; glibc's `setenv` never frees a string a concurrent `getenv` may be reading.
        unsafe { std::env::set_var(name, EAGER_LIMIT_BYTES.to_string()) };
    }
}

/// Adds the time from its start to its drop to a counter: one cross-process call, blocking or
/// polled, for [`MpiWorld::time_in_calls`].
struct Busy<'a> {
    nanos: &'a AtomicU64,
    start: Instant,
}

impl<'a> Busy<'a> {
    fn start(nanos: &'a AtomicU64) -> Self {
        Busy {
            nanos,
            start: Instant::now(),
        }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let nanos = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}
