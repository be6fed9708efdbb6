//! An NCCL communicator owned by one replica thread (RAII: finalized on a clean end, aborted on
//! failure), and the mapping of dtypes and reduce ops to NCCL's.
//!
//! Communicators across processes are made in NCCL's non-blocking mode (a config with
//! `blocking = 0`): their setup, the lazy connections of their first collectives and their
//! finalization return at once and are polled ([`Communicator::settle`]) with
//! `ncclCommGetAsyncError` against the deadline, then `ncclCommAbort`ed past it, so a frozen
//! peer process cannot hang this one in NCCL.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys;
use distribute_values::ReduceOp;

use crate::cuda::Gpu;
use crate::{CollectiveError, DType, GpuError};

pub(super) fn nccl_error(what: &str, e: NcclError) -> GpuError {
    // SAFETY: ncclGetErrorString returns a static C string for every result code.
    let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
    GpuError::Nccl(format!("{what}: {} ({:?})", text.to_string_lossy(), e.0))
}

pub(super) fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
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

pub(super) fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
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
pub(super) fn non_blocking_config() -> sys::ncclConfig_t {
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

/// An NCCL communicator and the GPU stream its calls are queued to. Aborted (never blocking)
/// when dropped.
pub(super) struct Communicator {
    pub(super) comm: sys::ncclComm_t,
    pub(super) gpu: Gpu,
    pub(super) rank: usize,
    pub(super) world: usize,
    /// Set once `comm` was aborted (released).
    pub(super) aborted: AtomicBool,
    /// How long [`Communicator::settle`] waits when finalizing on drop.
    pub(super) deadline: Duration,
}

// SAFETY: an NCCL communicator may be used from any thread as long as no two threads use it at
// once. A Communicator moves to exactly one replica thread, which alone uses it from then on (the
// `ReplicaCollectives` handle that owns it is not Send).
unsafe impl Send for Communicator {}

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

    /// NCCL's asynchronous state of the communicator: `Ok(true)` while work it returned
    /// `ncclInProgress` for (setup, a call's enqueue, finalize) is still under way, `Ok(false)`
    /// once it is done, the error when it failed.
    pub(super) fn in_progress(&self) -> Result<bool, NcclError> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator (not aborted: callers check) and a valid out-pointer.
        let called = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
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
