//! An NCCL communicator owned by one replica thread (RAII: finalized on a clean end, aborted on
//! failure), and the mapping of dtypes and reduce ops to NCCL's.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::nccl::result::{self as nccl, NcclError};
use cudarc::nccl::sys;
use distribute_values::ReduceOp;

use crate::cuda::Gpu;
use crate::{DType, GpuError};

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

/// An NCCL communicator and the GPU stream its calls are queued to. Aborted (never blocking)
/// when dropped.
pub(super) struct Communicator {
    pub(super) comm: sys::ncclComm_t,
    pub(super) gpu: Gpu,
    pub(super) rank: usize,
    pub(super) world: usize,
    /// Set once `comm` was aborted (released).
    pub(super) aborted: AtomicBool,
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
