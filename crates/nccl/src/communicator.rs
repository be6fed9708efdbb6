//! An NCCL communicator owned by one replica thread (RAII: finalized on a clean end, aborted on
//! failure), its collectives as safe methods (every `unsafe` NCCL call of a replica is here, next
//! to the checks that make it sound), and the mapping of dtypes and reduce ops to NCCL's.
//!
//! Communicators across processes are made in NCCL's non-blocking mode (a config with
//! `blocking = 0`): their setup, the lazy connections of their first collectives and their
//! finalization return at once and are polled ([`Communicator::settle`]) with
//! `ncclCommGetAsyncError` against the deadline, then `ncclCommAbort`ed past it, so a frozen
//! peer process cannot hang this one in NCCL.

use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use cudarc::nccl::NcclType;
use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys;
use distribute_values::ReduceOp;

use distribute_collectives::CollectiveError;
use distribute_tensor::cuda::{Gpu, GpuArray};
use distribute_tensor::{DType, GpuError};

/// The bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub(super) const UNIQUE_ID_BYTES: usize = 128;

/// NCCL's failed `what` as this crate reports it, in NCCL's words.
fn nccl_error(what: &str, e: NcclError) -> GpuError {
    // SAFETY: ncclGetErrorString returns a static C string for every result code.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    GpuError::LibraryCall {
        library: "NCCL",
        message: format!("{what}: {} ({:?})", text.to_string_lossy(), e.0),
    }
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

/// `NCCL_CONFIG_UNDEF_INT`: a config field NCCL chooses itself.
const UNDEF_INT: std::ffi::c_int = std::ffi::c_int::MIN;

/// `NCCL_VERSION(2, 17, 0)`: the config version this crate fills in. NCCL reads the fields of
/// that version (`blocking` among them) and gives later ones their defaults, whatever NCCL
/// library version loads.
const CONFIG_VERSION: std::ffi::c_uint = 21700;

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`: a communicator whose calls return at once
/// (`ncclInProgress`) and are polled. Every other field is NCCL's choice (undefined); the
/// `size` and `version` fields let any NCCL from 2.17 on read it.
fn non_blocking_config() -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: CONFIG_VERSION,
        blocking: 0,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
        graphUsageMode: UNDEF_INT,
        numRmaCtx: UNDEF_INT,
        maxP2pPeers: UNDEF_INT,
    }
}

/// How a poll of NCCL or the GPU waits between two looks: a thousand spins (a call that ends
/// in microseconds is seen at once), then 50 µs sleeps (a long wait leaves the core).
#[derive(Default)]
pub(super) struct Backoff {
    spins: u32,
}

impl Backoff {
    /// Waits before the next look.
    pub(super) fn pause(&mut self) {
        self.spins = self.spins.saturating_add(1);
        if self.spins < 1000 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Fails the way NCCL fails a bad argument unless `buffer` holds `bytes`: the check that keeps
/// NCCL inside the buffers it is given.
fn holds<T>(buffer: &CudaSlice<T>, bytes: usize) -> Result<(), NcclError> {
    if buffer.num_bytes() >= bytes {
        Ok(())
    } else {
        Err(NcclError(sys::ncclResult_t::ncclInvalidArgument))
    }
}

/// An NCCL communicator and the GPU stream its calls are queued to. Aborted (never blocking)
/// when dropped.
pub(super) struct Communicator {
    comm: sys::ncclComm_t,
    pub(super) gpu: Gpu,
    pub(super) rank: usize,
    pub(super) world: usize,
    /// Set once `comm` was aborted (released).
    aborted: AtomicBool,
    /// How long [`Communicator::settle`] waits when finalizing on drop.
    deadline: Duration,
}

// SAFETY: an NCCL communicator may be used from any thread as long as no two threads use it at
// once. A Communicator moves to exactly one replica thread, which alone uses it from then on (the
// `ReplicaCollectives` handle that owns it is not Send).
unsafe impl Send for Communicator {}

/// Making communicators: every NCCL call that creates one is a method here, so no other file of
/// the crate calls NCCL.
impl Communicator {
    /// One communicator per GPU of `gpus` (their handles, in rank order) in this process, made
    /// together with `ncclCommInitAll` (blocking: there is no other process to wait for).
    pub(super) fn init_all(
        gpus: Vec<Gpu>,
        deadline: Duration,
    ) -> Result<Vec<Communicator>, GpuError> {
        let ordinals: Vec<i32> = gpus.iter().map(|g| g.ordinal() as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); gpus.len()];
        // SAFETY: `comms` has room for one communicator per listed device.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), gpus.len() as i32, ordinals.as_ptr()) }
            .map_err(|e| nccl_error("ncclCommInitAll", e))?;
        let world = gpus.len();
        Ok(comms
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (comm, gpu))| Communicator::owning(comm, gpu, rank, world, deadline))
            .collect())
    }

    /// A fresh NCCL unique id (`ncclGetUniqueId`), made by the one rank that hands it to the
    /// others.
    pub(super) fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES], GpuError> {
        let id = nccl::get_uniqueid().map_err(|e| nccl_error("ncclGetUniqueId", e))?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// Rank `rank` of a world of `world` ranks that share `id`, on `gpu` (bound to the calling
    /// thread), in non-blocking mode: the setup, which waits for every other rank, is polled
    /// against `deadline` and aborted past it.
    pub(super) fn init_rank(
        gpu: Gpu,
        id: [u8; UNIQUE_ID_BYTES],
        world: usize,
        rank: usize,
        deadline: Duration,
    ) -> Result<Communicator, CollectiveError> {
        gpu.bind_to_thread()?;
        let mut comm = std::ptr::null_mut();
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut config = non_blocking_config();
        let start = Instant::now();
        // SAFETY: `comm` receives the new communicator; the id is the world's; the config is a
        // valid NCCL_CONFIG_INITIALIZER-style value NCCL copies.
        unsafe {
            nccl::comm_init_rank_config(&mut comm, world as i32, id, rank as i32, &mut config)
        }
        .map_err(|e| nccl_error("ncclCommInitRankConfig", e))?;
        let communicator = Communicator::owning(comm, gpu, rank, world, deadline);
        communicator.settle("communicator setup", start, deadline, &|| None)?;
        Ok(communicator)
    }

    /// The owner of `comm`, which NCCL just made.
    fn owning(
        comm: sys::ncclComm_t,
        gpu: Gpu,
        rank: usize,
        world: usize,
        deadline: Duration,
    ) -> Communicator {
        Communicator {
            comm,
            gpu,
            rank,
            world,
            aborted: AtomicBool::new(false),
            deadline,
        }
    }

    /// NCCL's failed `what` as this crate reports it, in NCCL's words.
    pub(super) fn error(what: &str, e: NcclError) -> GpuError {
        nccl_error(what, e)
    }

    /// The linked NCCL's version code (`ncclGetVersion`).
    pub(super) fn version() -> Result<i32, GpuError> {
        nccl::get_nccl_version().map_err(|e| nccl_error("ncclGetVersion", e))
    }
}

impl Communicator {
    /// Aborts the communicator (frees it, and ends NCCL kernels still waiting for peers); later
    /// calls do nothing. NCCL cannot use it again.
    pub(super) fn abort(&self) {
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: `comm` came from ncclCommInit* and is released exactly once, here.
            let _ = unsafe { nccl::comm_abort(self.comm) };
        }
    }

    pub(super) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// The handle while it is live: every call below takes it from here, so none reaches NCCL
    /// after [`Communicator::abort`] released it.
    fn live(&self) -> Result<sys::ncclComm_t, NcclError> {
        if self.is_aborted() {
            Err(NcclError(sys::ncclResult_t::ncclInvalidUsage))
        } else {
            Ok(self.comm)
        }
    }

    /// This communicator's stream, as NCCL takes it.
    fn raw_stream(&self) -> sys::cudaStream_t {
        self.gpu.stream().cu_stream() as sys::cudaStream_t
    }

    /// NCCL's asynchronous state of the communicator: `Ok(true)` while work it returned
    /// `ncclInProgress` for (setup, a call's enqueue, finalize) is still under way, `Ok(false)`
    /// once it is done, the error when it failed (a running collective's included).
    pub(super) fn in_progress(&self) -> Result<bool, NcclError> {
        let comm = self.live()?;
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator and a valid out-pointer.
        let called = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
        match (called, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess) => Ok(false),
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => Ok(true),
            (sys::ncclResult_t::ncclSuccess, failed) | (failed, _) => Err(NcclError(failed)),
        }
    }

    /// Waits, from `start`, until the communicator's asynchronous work is done, polling
    /// `ncclCommGetAsyncError`; `stop` ends the wait early with its error (the step was
    /// aborted). Past `deadline`, or on an NCCL error, aborts the communicator (the only way to
    /// end NCCL work that waits for a frozen peer) and fails naming `what` and this rank.
    pub(super) fn settle(
        &self,
        what: &str,
        start: Instant,
        deadline: Duration,
        stop: &dyn Fn() -> Option<CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let mut backoff = Backoff::default();
        loop {
            if self.is_aborted() {
                return Err(CollectiveError::Aborted {
                    reason: format!("NCCL {what}: the communicator was aborted"),
                });
            }
            let failure = match self.in_progress() {
                Ok(false) => return Ok(()),
                Err(e) => Some(CollectiveError::from(nccl_error(what, e))),
                Ok(true) if start.elapsed() >= deadline => {
                    // NCCL does not say which peer it waits for: every other rank is a suspect.
                    Some(CollectiveError::DeadlineExceeded {
                        op: format!("NCCL {what} (rank {} of {})", self.rank, self.world),
                        missing: (0..self.world).filter(|&r| r != self.rank).collect(),
                        waited: start.elapsed(),
                    })
                }
                Ok(true) => stop(),
            };
            if let Some(error) = failure {
                self.abort();
                return Err(error);
            }
            backoff.pause();
        }
    }
}

/// The collectives, queued on this communicator's stream; each returns once NCCL has taken the
/// call (a non-blocking communicator may still be queuing it: [`Communicator::settle`]). Buffers
/// are device memory of this communicator's GPU; sizes count elements, never the buffers' length
/// (a buffer may be longer), and a buffer too small for them fails with `ncclInvalidArgument`
/// before NCCL sees it.
impl Communicator {
    /// All-gathers `count` elements of `T` from `send` into `recv`, `count` per rank in rank
    /// order.
    pub(super) fn all_gather<T: NcclType>(
        &self,
        send: &CudaSlice<T>,
        recv: &mut CudaSlice<T>,
        count: usize,
    ) -> Result<(), NcclError> {
        let comm = self.live()?;
        let bytes = count.saturating_mul(std::mem::size_of::<T>());
        holds(send, bytes)?;
        holds(recv, bytes.saturating_mul(self.world))?;
        let stream = self.gpu.stream();
        let (src, _read) = send.device_ptr(stream);
        let (dst, _write) = recv.device_ptr_mut(stream);
        // SAFETY: a live communicator; `send` holds `count` elements and `recv` `world * count`
        // (checked above); the guards, dropped after the call is queued, order the buffers'
        // later use and freeing after it on the stream.
        unsafe {
            nccl::all_gather(
                src as *const c_void,
                dst as *mut c_void,
                count,
                T::as_nccl_type(),
                comm,
                self.raw_stream(),
            )
        }
        .map(drop)
    }

    /// All-reduces (`op`) each of `inputs` into the matching buffer of `outputs` (as many
    /// elements of the input's dtype), as one NCCL group call; empty inputs are skipped.
    pub(super) fn all_reduce(
        &self,
        op: ReduceOp,
        inputs: &[GpuArray],
        outputs: &mut [CudaSlice<u8>],
    ) -> Result<(), NcclError> {
        let comm = self.live()?;
        let stream = self.gpu.stream();
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
            result = holds(&input.bytes, input.num_bytes()).and_then(|()| {
                holds(output, input.num_bytes())?;
                let (src, read) = input.bytes.device_ptr(stream);
                let (dst, write) = output.device_ptr_mut(stream);
                guards.extend([read, write]);
                // SAFETY: a live communicator; both buffers hold `count` elements of the dtype
                // (checked above); the guards outlive the group (see above).
                unsafe {
                    nccl::all_reduce(
                        src as *const c_void,
                        dst as *mut c_void,
                        count,
                        nccl_dtype(input.dtype),
                        nccl_op(op),
                        comm,
                        self.raw_stream(),
                    )
                }
                .map(drop)
            });
            if result.is_err() {
                break;
            }
        }
        nccl::group_end()?;
        drop(guards);
        result
    }

    /// Reduce-scatters (`op`): `send` holds `world * count` elements of `dtype`, `recv` gets
    /// this rank's `count` reduced ones.
    pub(super) fn reduce_scatter(
        &self,
        op: ReduceOp,
        dtype: DType,
        send: &CudaSlice<u8>,
        recv: &mut CudaSlice<u8>,
        count: usize,
    ) -> Result<(), NcclError> {
        let comm = self.live()?;
        let bytes = count.saturating_mul(dtype.size_in_bytes());
        holds(send, bytes.saturating_mul(self.world))?;
        holds(recv, bytes)?;
        let stream = self.gpu.stream();
        let (src, _read) = send.device_ptr(stream);
        let (dst, _write) = recv.device_ptr_mut(stream);
        // SAFETY: a live communicator; `send` holds `world * count` elements and `recv` `count`
        // (checked above); the guards order the buffers' later use after the call.
        unsafe {
            nccl::reduce_scatter(
                src as *const c_void,
                dst as *mut c_void,
                count,
                nccl_dtype(dtype),
                nccl_op(op),
                comm,
                self.raw_stream(),
            )
        }
        .map(drop)
    }

    /// Broadcasts `count` elements of `dtype` from rank `root` into every rank's `recv`: the
    /// root sends its `send`, or its `recv` in place where `send` is `None` (receivers pass
    /// `None`).
    pub(super) fn broadcast<T>(
        &self,
        root: usize,
        dtype: DType,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        count: usize,
    ) -> Result<(), NcclError> {
        let comm = self.live()?;
        let bytes = count.saturating_mul(dtype.size_in_bytes());
        holds(recv, bytes)?;
        send.map_or(Ok(()), |send| holds(send, bytes))?;
        let stream = self.gpu.stream();
        let (dst, _write) = recv.device_ptr_mut(stream);
        let read = send.map(|send| send.device_ptr(stream));
        let src = read.as_ref().map_or(dst, |(ptr, _)| *ptr);
        // SAFETY: a live communicator; the send buffer (or `recv`, in place) and `recv` hold
        // `count` elements of `dtype` (checked above); the guards order their later use after
        // the call.
        unsafe {
            nccl::broadcast(
                src as *const c_void,
                dst as *mut c_void,
                count,
                nccl_dtype(dtype),
                root as i32,
                comm,
                self.raw_stream(),
            )
        }
        .map(drop)
    }
}

impl Drop for Communicator {
    /// A clean end finalizes (flushing what NCCL still sends to peers, which abort would cut off)
    /// and then destroys. A non-blocking communicator's finalize is polled against the deadline
    /// (a frozen peer cannot hold this one's teardown); past it, or on an error, it is aborted.
    fn drop(&mut self) {
        if self.is_aborted() {
            return;
        }
        let _ = self.gpu.bind_to_thread();
        // SAFETY: a live communicator; finalize is called once, here.
        let finalized = unsafe { nccl::comm_finalize(self.comm) }.is_ok()
            && self
                .settle("finalize", Instant::now(), self.deadline, &|| None)
                .is_ok();
        // `settle` aborts (and marks) the communicator when it gives up.
        if finalized && !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: a live, finalized communicator, released exactly once, here.
            let _ = unsafe { nccl::comm_destroy(self.comm) };
        } else {
            self.abort();
        }
    }
}
