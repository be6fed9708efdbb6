//! [`NcclAllReduce`]: the NCCL backend (feature `nccl`) — all-reduce, batched all-reduce (one
//! NCCL group call), all-gather, reduce-scatter and broadcast between GPU replicas.
//!
//! Part of layer 3 (collectives); knows nothing about strategies. Two ways to build it:
//! - one process driving several GPUs ([`NcclAllReduce::new`]): the communicators are made
//!   together with `ncclCommInitAll` (cudarc's `Comm::from_devices`), and each replica thread
//!   takes its own;
//! - one rank per process or per GPU across machines ([`NcclAllReduce::from_unique_id`], or
//!   [`NcclAllReduce::for_cluster`], which hands the NCCL unique id from the cluster's leader to
//!   every task through [`exchange_unique_id`](crate::exchange_unique_id)).
//!
//! A call returns when its result is on the GPU: the replica thread waits for the stream, polling
//! NCCL's asynchronous error and the backend's abort flag, and gives up at the deadline by
//! aborting the communicator. A replica that never makes a call, or makes a different one, is
//! reported as an error rather than hanging the others: every call first gathers each rank's
//! dtype and shape (a 32-byte all-gather) and fails on every rank when they disagree.
//!
//! Not covered by the deadline: NCCL's own blocking steps — joining a communicator
//! (`ncclCommInitRank` waits for every rank) and, with NCCL's default lazy connection setup
//! (`NCCL_RUNTIME_CONNECT=1`), connecting peers inside the first collective. A rank that never
//! starts can hang the others there; set `NCCL_RUNTIME_CONNECT=0` to connect at init. A replica
//! that skips a call is caught by the deadline (`GroupConfig::deadline`), not at once.
//!
//! NCCL reduces in its own order (rings, trees), so results are not bitwise equal to the
//! replica-order host kernel beyond two ranks; use [`ReductionToOneDevice`](crate::ReductionToOneDevice)
//! on GPUs where bits matter more than bandwidth.

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys;
use distribute_values::{Leaf, ReduceOp};

use crate::cuda::{Gpu, GpuArray, require_nccl};
use crate::ops::{CrossDeviceOps, Destinations, ReplicaCollectives, reduce_and_deliver};
use crate::{AnyTensor, CollectiveError, DType, GpuError, Placement, Tensor, kernel};

/// The NCCL unique id's size.
pub const NCCL_ID_BYTES: usize = 128;

fn nccl_error(what: &str, e: NcclError) -> GpuError {
    // SAFETY: ncclGetErrorString returns a static C string for every result code.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    GpuError::Nccl(format!("{what}: {} ({:?})", text.to_string_lossy(), e.0))
}

fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as N;
    match dtype {
        DType::F16 => N::ncclFloat16,
        DType::BF16 => N::ncclBfloat16,
        DType::F32 => N::ncclFloat32,
        DType::F64 => N::ncclFloat64,
        DType::I32 => N::ncclInt32,
        DType::I64 => N::ncclInt64,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as N;
    match op {
        ReduceOp::Sum => N::ncclSum,
        ReduceOp::Mean => N::ncclAvg,
        ReduceOp::Min => N::ncclMin,
        ReduceOp::Max => N::ncclMax,
    }
}

/// An NCCL communicator and the GPU stream its calls are queued to. Aborted (never blocking)
/// when dropped.
struct Communicator {
    comm: sys::ncclComm_t,
    gpu: Gpu,
    rank: usize,
    world: usize,
    /// Set once `comm` was aborted (released).
    aborted: AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread as long as no two threads use it at
// once. A Communicator moves to exactly one replica thread, which alone uses it from then on (the
// `ReplicaCollectives` handle that owns it is not Send).
unsafe impl Send for Communicator {}

impl Communicator {
    /// Aborts the communicator (frees it, and ends NCCL kernels still waiting for peers); later
    /// calls do nothing. NCCL cannot use it again.
    fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: `comm` came from ncclCommInit* and is released exactly once, here.
            let _ = unsafe { nccl::comm_abort(self.comm) };
        }
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }
}

impl Drop for Communicator {
    /// A clean end finalizes (flushing what NCCL still sends to peers, which abort would cut off)
    /// and then destroys; every call has completed by now, so finalizing waits for nothing.
    fn drop(&mut self) {
        if self.aborted.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.gpu.bind_to_thread();
        // SAFETY: a live communicator, released exactly once, here.
        unsafe {
            if nccl::comm_finalize(self.comm).is_ok() {
                let _ = nccl::comm_destroy(self.comm);
            } else {
                let _ = nccl::comm_abort(self.comm);
            }
        }
    }
}

/// How replica threads get their communicators.
enum Setup {
    /// Made together on construction; replica `r` takes slot `r`.
    Local(Mutex<Vec<Option<Communicator>>>),
    /// Each replica thread joins the world with its rank.
    Ranked {
        id: [u8; NCCL_ID_BYTES],
        world: usize,
        first_rank: usize,
    },
}

struct Shared {
    gpus: Vec<usize>,
    setup: Setup,
    aborted: AtomicBool,
    reason: Mutex<String>,
    deadline: Duration,
}

/// The NCCL backend (TF's `NcclAllReduce`): replica threads reduce GPU tensors with NCCL; values
/// reduced in cross-replica context go through the reduction kernel on the destination GPU, as
/// with [`ReductionToOneDevice`](crate::ReductionToOneDevice).
pub struct NcclAllReduce {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NcclAllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclAllReduce")
            .field("gpus", &self.shared.gpus)
            .finish_non_exhaustive()
    }
}

impl NcclAllReduce {
    /// One replica per GPU of `gpus` (indices), all in this process: the communicators are made
    /// now with `ncclCommInitAll`. NCCL before 2.30 refuses the same GPU twice.
    pub fn new(gpus: &[usize], deadline: Duration) -> Result<NcclAllReduce, CollectiveError> {
        require_nccl()?;
        if gpus.is_empty() {
            return Err(CollectiveError::InvalidArgument(
                "NcclAllReduce needs at least one GPU".into(),
            ));
        }
        let handles = gpus
            .iter()
            .map(|&g| Gpu::open(g)?.with_new_stream())
            .collect::<Result<Vec<_>, _>>()?;
        let ordinals: Vec<i32> = gpus.iter().map(|&g| g as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); gpus.len()];
        // SAFETY: `comms` has room for one communicator per listed device.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), gpus.len() as i32, ordinals.as_ptr()) }
            .map_err(|e| nccl_error("ncclCommInitAll", e))?;
        let world = gpus.len();
        let communicators = comms
            .into_iter()
            .zip(handles)
            .enumerate()
            .map(|(rank, (comm, gpu))| {
                Some(Communicator {
                    comm,
                    gpu,
                    rank,
                    world,
                    aborted: AtomicBool::new(false),
                })
            })
            .collect();
        Ok(NcclAllReduce::with_setup(
            gpus,
            Setup::Local(Mutex::new(communicators)),
            deadline,
        ))
    }

    /// A fresh NCCL unique id, made by the one task (the leader) that hands it to the others.
    pub fn new_unique_id() -> Result<[u8; NCCL_ID_BYTES], CollectiveError> {
        require_nccl()?;
        let id = nccl::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// This process's replicas in a world of `world` ranks: local replica `r` runs on GPU
    /// `gpus[r]` as rank `first_rank + r`. Every process passes the same `id`; each replica thread
    /// joins when it takes its collectives handle, and the join waits until every rank has.
    pub fn from_unique_id(
        id: [u8; NCCL_ID_BYTES],
        world: usize,
        first_rank: usize,
        gpus: &[usize],
        deadline: Duration,
    ) -> Result<NcclAllReduce, CollectiveError> {
        require_nccl()?;
        if gpus.is_empty() || first_rank + gpus.len() > world {
            return Err(CollectiveError::InvalidArgument(format!(
                "ranks {first_rank}..{} do not fit a world of {world}",
                first_rank + gpus.len()
            )));
        }
        for &g in gpus {
            Gpu::open(g)?;
        }
        Ok(NcclAllReduce::with_setup(
            gpus,
            Setup::Ranked {
                id,
                world,
                first_rank,
            },
            deadline,
        ))
    }

    /// This task's replicas of a multi-process run over `cluster` (chief and workers; every task
    /// drives `gpus.len()` GPUs, the same count everywhere): task rank `t` owns NCCL ranks
    /// `t·k .. t·k + k`. The leader (chief, else worker 0) makes the NCCL unique id and hands it
    /// to the other tasks through [`exchange_unique_id`](crate::exchange_unique_id), waiting at
    /// most `deadline` for them.
    pub fn for_cluster(
        cluster: &distribute_device_spec::ClusterSpec,
        me: distribute_device_spec::TaskId,
        gpus: &[usize],
        deadline: Duration,
    ) -> Result<NcclAllReduce, CollectiveError> {
        require_nccl()?;
        let task = crate::nccl_rank(cluster, me)?;
        let id = if task.is_leader() {
            Some(NcclAllReduce::new_unique_id()?)
        } else {
            None
        };
        let id = crate::exchange_unique_id(cluster, me, id, deadline)?;
        let k = gpus.len();
        NcclAllReduce::from_unique_id(id, task.world_size * k, task.rank * k, gpus, deadline)
    }

    fn with_setup(gpus: &[usize], setup: Setup, deadline: Duration) -> NcclAllReduce {
        NcclAllReduce {
            shared: Arc::new(Shared {
                gpus: gpus.to_vec(),
                setup,
                aborted: AtomicBool::new(false),
                reason: Mutex::new(String::new()),
                deadline,
            }),
        }
    }

    /// The NCCL library's version, e.g. 22809 for 2.28.9.
    pub fn nccl_version() -> Result<i32, CollectiveError> {
        require_nccl()?;
        Ok(nccl::get_nccl_version().map_err(|e| nccl_error("ncclGetVersion", e))?)
    }
}

impl CrossDeviceOps for NcclAllReduce {
    fn name(&self) -> &'static str {
        "NcclAllReduce"
    }

    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        // In cross-replica context one thread holds every value: the communicators belong to
        // the replica threads, so this reduces with the kernel on the first destination's GPU.
        reduce_and_deliver(op, values, destinations, &destinations.as_slice()[0])
    }

    fn replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError> {
        let shared = &self.shared;
        let Some(&ordinal) = shared.gpus.get(replica) else {
            return Err(CollectiveError::InvalidArgument(format!(
                "replica {replica} is out of range for {} replicas",
                shared.gpus.len()
            )));
        };
        let comm = match &shared.setup {
            Setup::Local(slots) => slots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(replica)
                .and_then(Option::take)
                .ok_or_else(|| {
                    CollectiveError::InvalidArgument(format!(
                        "replica {replica}'s NCCL communicator is already taken: one strategy \
                         per NcclAllReduce"
                    ))
                })?,
            Setup::Ranked {
                id,
                world,
                first_rank,
            } => {
                let gpu = Gpu::open(ordinal)?.with_new_stream()?;
                gpu.bind_to_thread()?;
                let rank = first_rank + replica;
                let mut comm = std::ptr::null_mut();
                let id = sys::ncclUniqueId {
                    internal: id.map(|b| b as std::ffi::c_char),
                };
                // SAFETY: `comm` receives the new communicator; the id is the world's.
                unsafe { nccl::comm_init_rank(&mut comm, *world as i32, id, rank as i32) }
                    .map_err(|e| nccl_error("ncclCommInitRank", e))?;
                Communicator {
                    comm,
                    gpu,
                    rank,
                    world: *world,
                    aborted: AtomicBool::new(false),
                }
            }
        };
        Ok(Box::new(NcclMember {
            replica,
            comm,
            shared: self.shared.clone(),
        }))
    }

    fn abort(&self, reason: &str) {
        *self.shared.reason.lock().unwrap_or_else(|p| p.into_inner()) = reason.to_owned();
        self.shared.aborted.store(true, Ordering::SeqCst);
    }

    fn reset(&self) {
        self.shared.aborted.store(false, Ordering::SeqCst);
    }

    fn num_replicas(&self) -> Option<usize> {
        Some(self.shared.gpus.len())
    }
}

/// A replica's NCCL handle: its communicator and stream.
struct NcclMember {
    replica: usize,
    comm: Communicator,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NcclMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclMember(replica {}, rank {} of {}, {:?})",
            self.replica, self.comm.rank, self.comm.world, self.comm.gpu
        )
    }
}

/// What a rank passes to a call, gathered from every rank before the call itself.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Signature {
    /// The collective and its reduce op: `kind * 16 + op`.
    call: i64,
    /// The dtypes, hashed (broadcast: the root).
    dtype: i64,
    /// The first dimension (all-gather lets it differ); for a batch, the element count.
    rows: i64,
    /// The rest of the shapes, hashed.
    rest: i64,
    /// 1 when this rank refused its own arguments: every rank then fails the call alike.
    refused: i64,
}

impl Signature {
    const WORDS: usize = 5;

    fn of(kind: i64, op: Option<ReduceOp>, tensors: &[&Tensor]) -> Signature {
        let (mut dtype, mut rest) = (Fnv::new(), Fnv::new());
        let batch = tensors.len() > 1;
        for t in tensors {
            dtype.word(t.dtype() as u64);
            rest.word(t.rank() as u64);
            // A single all-gather input may differ in its first dimension; nothing else may.
            let skip = usize::from(!batch);
            t.shape()
                .iter()
                .skip(skip)
                .for_each(|&d| rest.word(d as u64));
        }
        let rows = match tensors {
            [one] => one.shape().first().copied().unwrap_or(0) as i64,
            many => many.iter().map(|t| t.num_elements() as i64).sum(),
        };
        Signature {
            call: kind * 16 + op.map_or(0, |op| op as i64 + 1),
            dtype: dtype.0 as i64,
            rows,
            rest: rest.0 as i64,
            refused: 0,
        }
    }

    fn words(&self) -> [i64; Signature::WORDS] {
        [self.call, self.dtype, self.rows, self.rest, self.refused]
    }

    fn from_words(w: &[i64]) -> Signature {
        Signature {
            call: w[0],
            dtype: w[1],
            rows: w[2],
            rest: w[3],
            refused: w[4],
        }
    }

    fn kind(&self) -> i64 {
        self.call / 16
    }
}

/// FNV-1a: the same hash in every process and build, unlike std's `DefaultHasher`.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn word(&mut self, word: u64) {
        for byte in word.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

const CALL_ALL_REDUCE: i64 = 1;
const CALL_ALL_GATHER: i64 = 2;
const CALL_REDUCE_SCATTER: i64 = 3;
const CALL_BROADCAST: i64 = 4;

impl NcclMember {
    fn gpu(&self) -> &Gpu {
        &self.comm.gpu
    }

    /// Fails when the backend was aborted or this communicator is dead.
    fn check_usable(&self) -> Result<(), CollectiveError> {
        if self.comm.is_aborted() {
            return Err(CollectiveError::Aborted {
                reason: "this replica's NCCL communicator was aborted after an earlier failure; \
                         NCCL cannot continue on it — build a new strategy"
                    .into(),
            });
        }
        if self.shared.aborted.load(Ordering::SeqCst) {
            return Err(CollectiveError::Aborted {
                reason: self
                    .shared
                    .reason
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
            });
        }
        Ok(())
    }

    /// Queues NCCL work with `enqueue` and waits for the stream, giving up at the deadline.
    fn run(
        &self,
        what: &str,
        enqueue: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<(), NcclError>,
    ) -> Result<(), CollectiveError> {
        self.check_usable()?;
        self.gpu().bind_to_thread()?;
        let stream = self.gpu().stream();
        if let Err(e) = enqueue(self.comm.comm, stream.cu_stream() as sys::cudaStream_t) {
            // A failed enqueue may leave the communicator half way through a call.
            self.comm.abort();
            return Err(nccl_error(what, e).into());
        }
        let done = stream
            .record_event(None)
            .map_err(crate::cuda::driver_error)?;
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if done.try_is_complete().map_err(crate::cuda::driver_error)? {
                return Ok(());
            }
            let mut async_error = sys::ncclResult_t::ncclSuccess;
            // SAFETY: a live communicator and a valid out-pointer.
            let _ = unsafe { sys::ncclCommGetAsyncError(self.comm.comm, &mut async_error) };
            let failure = if async_error != sys::ncclResult_t::ncclSuccess
                && async_error != sys::ncclResult_t::ncclInProgress
            {
                Some(CollectiveError::from(nccl_error(
                    what,
                    NcclError(async_error),
                )))
            } else if self.shared.aborted.load(Ordering::SeqCst) {
                Some(self.check_usable().unwrap_err())
            } else if start.elapsed() >= self.shared.deadline {
                Some(CollectiveError::DeadlineExceeded {
                    op: format!(
                        "NCCL {what} (rank {} of {})",
                        self.comm.rank, self.comm.world
                    ),
                    missing: Vec::new(),
                    waited: start.elapsed(),
                })
            } else {
                None
            };
            if let Some(error) = failure {
                // NCCL kernels waiting for a peer never finish: aborting the communicator is
                // the only way to free the stream.
                self.comm.abort();
                return Err(error);
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Gathers every rank's signature and fails on every rank alike when they differ, or when
    /// any rank refused its own arguments (`local`, checked before: a rank that returned early
    /// would leave the others waiting in this very call).
    fn agree(
        &self,
        what: &str,
        mut mine: Signature,
        local: Result<(), CollectiveError>,
    ) -> Result<Vec<Signature>, CollectiveError> {
        const W: usize = Signature::WORDS;
        let world = self.comm.world;
        mine.refused = i64::from(local.is_err());
        let stream = self.gpu().stream();
        let send = stream
            .clone_htod(&mine.words())
            .map_err(crate::cuda::driver_error)?;
        let mut recv = stream
            .alloc_zeros::<i64>(W * world)
            .map_err(crate::cuda::driver_error)?;
        self.run(&format!("{what} (agreement)"), |comm, raw| {
            let (src, _g1) = send.device_ptr(stream);
            let (dst, _g2) = recv.device_ptr_mut(stream);
            // SAFETY: W i64 sent, W per rank received.
            unsafe {
                nccl::all_gather(
                    src as *const c_void,
                    dst as *mut c_void,
                    W,
                    sys::ncclDataType_t::ncclInt64,
                    comm,
                    raw,
                )
            }
            .map(|_| ())
        })?;
        let all = stream
            .clone_dtoh(&recv)
            .map_err(crate::cuda::driver_error)?;
        let signatures: Vec<Signature> = all.chunks(W).map(Signature::from_words).collect();
        local?;
        if let Some(rank) = signatures.iter().position(|s| s.refused != 0) {
            return Err(CollectiveError::InvalidArgument(format!(
                "NCCL {what}: rank {rank} refused its arguments, so every rank fails this call"
            )));
        }
        let first = signatures[0];
        let gather = first.kind() == CALL_ALL_GATHER;
        if let Some((other, sig)) = signatures.iter().enumerate().find(|(_, s)| {
            s.call != first.call
                || s.dtype != first.dtype
                || s.rest != first.rest
                || (!gather && s.rows != first.rows)
        }) {
            return Err(CollectiveError::ReplicaMismatch {
                op: format!("NCCL {what}"),
                call: 0,
                first_replica: 0,
                first: describe(&first),
                other_replica: other,
                other: describe(sig),
            });
        }
        Ok(signatures)
    }

    /// The GPU storage of `tensor` on this replica's GPU.
    fn input(&self, tensor: &Tensor) -> Result<GpuArray, CollectiveError> {
        tensor.gpu_array_on(self.gpu())
    }

    /// A result shaped `shape`, placed like `like` (a host input gets a host result).
    fn output(
        &self,
        like: Option<&Tensor>,
        dtype: DType,
        shape: &[usize],
        bytes: CudaSlice<u8>,
    ) -> Result<Tensor, CollectiveError> {
        let array = GpuArray::new(self.gpu(), dtype, shape, bytes);
        let label = match like {
            Some(t) => t.gpu_label(self.gpu()),
            None => self.gpu().device_name().into(),
        };
        let result = Tensor::from_gpu_array(label, array);
        match like {
            Some(t) if t.placement() == Placement::Host => {
                Ok(result.to_host()?.to_device(t.device()))
            }
            _ => Ok(result),
        }
    }

    fn all_reduce_many(
        &self,
        op: ReduceOp,
        tensors: &[&Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let local = tensors
            .iter()
            .try_for_each(|t| kernel::check_op(op, t.dtype()));
        self.agree(
            "all_reduce",
            Signature::of(CALL_ALL_REDUCE, Some(op), tensors),
            local,
        )?;
        let inputs = tensors
            .iter()
            .map(|t| self.input(t))
            .collect::<Result<Vec<_>, _>>()?;
        let mut outputs = inputs
            .iter()
            .map(|a| GpuArray::alloc(self.gpu(), a.dtype, &a.shape))
            .collect::<Result<Vec<_>, _>>()?;
        self.run("all_reduce", |comm, stream| {
            let s = self.gpu().stream();
            // The guards record each buffer's use when dropped, so they must outlive group_end,
            // where NCCL actually queues the work.
            let mut guards = Vec::with_capacity(2 * inputs.len());
            nccl::group_start()?;
            let mut result = Ok(());
            for (input, output) in inputs.iter().zip(outputs.iter_mut()) {
                let count = input.shape.iter().product::<usize>();
                if count == 0 {
                    continue;
                }
                let (src, g1) = input.bytes.device_ptr(s);
                let (dst, g2) = output.device_ptr_mut(s);
                guards.extend([g1, g2]);
                // SAFETY: both buffers hold `count` elements of the dtype.
                result = unsafe {
                    nccl::all_reduce(
                        src as *const c_void,
                        dst as *mut c_void,
                        count,
                        nccl_dtype(input.dtype),
                        nccl_op(op),
                        comm,
                        stream,
                    )
                }
                .map(|_| ());
                if result.is_err() {
                    break;
                }
            }
            nccl::group_end()?;
            drop(guards);
            result
        })?;
        tensors
            .iter()
            .zip(inputs.iter().zip(outputs))
            .map(|(t, (input, bytes))| self.output(Some(t), input.dtype, &input.shape, bytes))
            .collect()
    }
}

fn describe(s: &Signature) -> String {
    let op = match s.call % 16 {
        1 => "(SUM)",
        2 => "(MEAN)",
        3 => "(MIN)",
        4 => "(MAX)",
        _ => "",
    };
    match s.kind() {
        CALL_BROADCAST => format!("broadcast from root {}", s.dtype),
        kind => {
            let call = match kind {
                CALL_ALL_REDUCE => "all_reduce",
                CALL_ALL_GATHER => "all_gather",
                CALL_REDUCE_SCATTER => "reduce_scatter",
                _ => "an unknown call",
            };
            format!(
                "{call}{op} (dtype hash {:x}, rows {}, shape hash {:x})",
                s.dtype, s.rows, s.rest
            )
        }
    }
}

impl ReplicaCollectives for NcclMember {
    fn replica(&self) -> usize {
        self.replica
    }

    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Ok(self.all_reduce_many(op, &[tensor])?.swap_remove(0))
    }

    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if tensors.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        self.all_reduce_many(op, &refs)
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let local = if tensor.rank() == 0 {
            Err(CollectiveError::InvalidArgument(
                "all_gather concatenates along the first axis: a rank-0 tensor has none".into(),
            ))
        } else {
            Ok(())
        };
        let signatures = self.agree(
            "all_gather",
            Signature::of(CALL_ALL_GATHER, None, &[tensor]),
            local,
        )?;
        let rows: Vec<usize> = signatures.iter().map(|s| s.rows as usize).collect();
        let max_rows = rows.iter().copied().max().unwrap_or(0);
        let row_elems: usize = tensor.shape()[1..].iter().product();
        let row_bytes = row_elems * tensor.dtype().size_in_bytes();
        let input = self.input(tensor)?;
        let stream = self.gpu().stream().clone();
        // Every rank sends max_rows rows (NCCL needs equal counts): shorter inputs are padded.
        let mut send = GpuArray::alloc_bytes(self.gpu(), max_rows * row_bytes)?;
        if max_rows * row_bytes > 0 {
            stream
                .memset_zeros(&mut send)
                .map_err(crate::cuda::driver_error)?;
            let mine = rows[self.comm.rank] * row_bytes;
            if mine > 0 {
                stream
                    .memcpy_dtod(&input.bytes.slice(..mine), &mut send.slice_mut(..mine))
                    .map_err(crate::cuda::driver_error)?;
            }
        }
        let world = self.comm.world;
        let chunk = max_rows * row_bytes;
        let mut gathered = GpuArray::alloc_bytes(self.gpu(), world * chunk)?;
        self.run("all_gather", |comm, stream_raw| {
            if chunk == 0 {
                return Ok(());
            }
            let (src, _g1) = send.device_ptr(&stream);
            let (dst, _g2) = gathered.device_ptr_mut(&stream);
            // SAFETY: `chunk` bytes sent, `chunk` per rank received.
            unsafe {
                nccl::all_gather(
                    src as *const c_void,
                    dst as *mut c_void,
                    chunk,
                    sys::ncclDataType_t::ncclUint8,
                    comm,
                    stream_raw,
                )
            }
            .map(|_| ())
        })?;
        let total_rows: usize = rows.iter().sum();
        let mut shape = tensor.shape().to_vec();
        shape[0] = total_rows;
        let mut out = GpuArray::alloc(self.gpu(), tensor.dtype(), &shape)?;
        let mut at = 0;
        for (rank, &r) in rows.iter().enumerate() {
            let len = r * row_bytes;
            if len > 0 {
                let from = rank * chunk;
                stream
                    .memcpy_dtod(
                        &gathered.slice(from..from + len),
                        &mut out.slice_mut(at..at + len),
                    )
                    .map_err(crate::cuda::driver_error)?;
            }
            at += len;
        }
        self.output(Some(tensor), tensor.dtype(), &shape, out)
    }

    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let world = self.comm.world;
        let rows = tensor.shape().first().copied().unwrap_or(0);
        let local = kernel::check_op(op, tensor.dtype()).and_then(|()| {
            if tensor.rank() == 0 || rows % world != 0 {
                return Err(CollectiveError::InvalidArgument(format!(
                    "reduce_scatter needs a first dimension divisible by the {world} ranks, got \
                     shape {:?}",
                    tensor.shape()
                )));
            }
            Ok(())
        });
        self.agree(
            "reduce_scatter",
            Signature::of(CALL_REDUCE_SCATTER, Some(op), &[tensor]),
            local,
        )?;
        let input = self.input(tensor)?;
        let mut shape = tensor.shape().to_vec();
        shape[0] = rows / world;
        let count: usize = shape.iter().product();
        let mut out = GpuArray::alloc(self.gpu(), tensor.dtype(), &shape)?;
        self.run("reduce_scatter", |comm, stream| {
            if count == 0 {
                return Ok(());
            }
            let s = self.gpu().stream();
            let (src, _g1) = input.bytes.device_ptr(s);
            let (dst, _g2) = out.device_ptr_mut(s);
            // SAFETY: `world * count` elements sent, `count` received.
            unsafe {
                nccl::reduce_scatter(
                    src as *const c_void,
                    dst as *mut c_void,
                    count,
                    nccl_dtype(tensor.dtype()),
                    nccl_op(op),
                    comm,
                    stream,
                )
            }
            .map(|_| ())
        })?;
        self.output(Some(tensor), tensor.dtype(), &shape, out)
    }

    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError> {
        // The root's dtype and shape go first (the others do not know them): rank, dtype, dims.
        const MAX_RANK: usize = 14;
        let world = self.comm.world;
        let is_root = self.comm.rank == root;
        let tensor = tensor.filter(|_| is_root);
        let local = if root >= world {
            Err(CollectiveError::InvalidArgument(format!(
                "broadcast root {root} is out of range for {world} ranks"
            )))
        } else if is_root && tensor.is_none() {
            Err(CollectiveError::InvalidArgument(format!(
                "broadcast: the root rank {root} passed no tensor"
            )))
        } else if tensor.is_some_and(|t| t.rank() > MAX_RANK) {
            Err(CollectiveError::InvalidArgument(format!(
                "NCCL broadcast supports tensors of rank up to {MAX_RANK}"
            )))
        } else {
            Ok(())
        };
        // Every rank must name the same root: the root goes where the dtype hash would.
        let signature = Signature {
            call: CALL_BROADCAST * 16,
            dtype: root as i64,
            rows: 0,
            rest: 0,
            refused: 0,
        };
        self.agree("broadcast", signature, local)?;
        let mut header = [0i64; MAX_RANK + 2];
        if let Some(t) = tensor {
            header[0] = t.rank() as i64;
            header[1] = t.dtype() as i64;
            for (slot, &d) in header[2..].iter_mut().zip(t.shape()) {
                *slot = d as i64;
            }
        }
        let stream = self.gpu().stream().clone();
        let mut meta = stream
            .clone_htod(&header)
            .map_err(crate::cuda::driver_error)?;
        self.run("broadcast (shape)", |comm, raw| {
            let (ptr, _g) = meta.device_ptr_mut(&stream);
            // SAFETY: in place, MAX_RANK + 2 i64 on every rank.
            unsafe {
                nccl::broadcast(
                    ptr as *const c_void,
                    ptr as *mut c_void,
                    MAX_RANK + 2,
                    sys::ncclDataType_t::ncclInt64,
                    root as i32,
                    comm,
                    raw,
                )
            }
            .map(|_| ())
        })?;
        let header = stream
            .clone_dtoh(&meta)
            .map_err(crate::cuda::driver_error)?;
        let rank = usize::try_from(header[0])
            .ok()
            .filter(|&r| r <= MAX_RANK)
            .ok_or_else(|| {
                CollectiveError::Invariant(format!("broadcast header names rank {}", header[0]))
            })?;
        let dtype = [
            DType::F16,
            DType::BF16,
            DType::F32,
            DType::F64,
            DType::I32,
            DType::I64,
        ]
        .into_iter()
        .find(|d| *d as i64 == header[1])
        .ok_or_else(|| CollectiveError::Invariant("broadcast header names no dtype".into()))?;
        let shape: Vec<usize> = header[2..2 + rank].iter().map(|&d| d as usize).collect();
        let count: usize = shape.iter().product();
        let mut out = GpuArray::alloc(self.gpu(), dtype, &shape)?;
        let input = tensor.map(|t| self.input(t)).transpose()?;
        self.run("broadcast", |comm, raw| {
            if count == 0 {
                return Ok(());
            }
            let (dst, _g2) = out.device_ptr_mut(&stream);
            let read = input.as_ref().map(|a| a.bytes.device_ptr(&stream));
            let src = read.as_ref().map_or(dst, |(p, _)| *p);
            // SAFETY: `count` elements on the root's send buffer and every receive buffer.
            unsafe {
                nccl::broadcast(
                    src as *const c_void,
                    dst as *mut c_void,
                    count,
                    nccl_dtype(dtype),
                    root as i32,
                    comm,
                    raw,
                )
            }
            .map(|_| ())
        })?;
        self.output(tensor, dtype, &shape, out)
    }
}
