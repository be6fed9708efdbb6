//! The crate's one error type.

use std::time::Duration;

use distribute_device_spec::DeviceSpecError;
use distribute_values::ValuesError;
use thiserror::Error;

use crate::DType;

/// What went wrong in a collective or a cross-device operation.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A bad argument (TF's `ValueError`); the message says which and what is allowed.
    #[error("{0}")]
    InvalidArgument(String),
    /// A tensor of one dtype where another was required.
    #[error("expected a {expected} tensor, got {actual}")]
    DTypeMismatch {
        /// The dtype required.
        expected: DType,
        /// The dtype given.
        actual: DType,
    },
    /// Replicas passed different shapes, dtypes or operations to the same collective call.
    #[error(
        "{op} #{call}: replica {first_replica} passed {first} but replica {other_replica} passed \
         {other}; every replica must pass the same dtype and shape to the same collective"
    )]
    ReplicaMismatch {
        /// The collective, e.g. `all_reduce(SUM)`.
        op: String,
        /// The call's sequence number in this group (0-based).
        call: u64,
        /// The reference replica.
        first_replica: usize,
        /// What it passed.
        first: String,
        /// The replica that differs.
        other_replica: usize,
        /// What that one passed.
        other: String,
    },
    /// Some participants never arrived at a collective (TF's `DeadlineExceeded`).
    #[error(
        "{op}: replicas {missing:?} did not arrive within {waited:?}; every replica must make \
         the same collective calls (raise the deadline if a step is just slow)"
    )]
    DeadlineExceeded {
        /// The collective the arrived replicas were in.
        op: String,
        /// The replicas that never arrived.
        missing: Vec<usize>,
        /// How long the caller waited.
        waited: Duration,
    },
    /// Replicas finished their step without making a call the others are waiting in.
    #[error(
        "{op}: replicas {finished:?} finished their step without making this call; every replica \
         must make the same collective and merge_call calls in the same order"
    )]
    ReplicaFinished {
        /// The call the others wait in.
        op: String,
        /// The replicas that finished.
        finished: Vec<usize>,
    },
    /// The group was aborted (a replica failed or timed out); it needs a reset before reuse.
    #[error("collective group aborted: {reason}")]
    Aborted {
        /// Why, e.g. "replica 1 panicked: …".
        reason: String,
    },
    /// A worker's step (or its part of a collective setup) failed, so it fails on every worker
    /// of a multi-worker run, this one's included, with the same error.
    #[error("worker {worker} failed: {message}")]
    WorkerFailed {
        /// The worker that failed on its own (the first, when several did).
        worker: usize,
        /// Its error, as it reported it.
        message: String,
    },
    /// The workers of a multi-worker run made different cross-worker calls (another operation,
    /// dtype or shape): every worker fails the call with the same description.
    #[error("{0}")]
    WorkersDisagree(String),
    /// `Mean` of an integer tensor where no exact float64 path exists (a tensor's own axis
    /// reduction, the NCCL backend); the other reductions give TF's float64 mean.
    #[error("MEAN of {0} tensors is not supported: cast to a floating type, or reduce with SUM")]
    IntegerMean(DType),
    /// An internal invariant did not hold (TF's `assert`): the input is refused, never ignored.
    #[error("invariant violated: {0}")]
    Invariant(String),
    /// An operation this backend does not provide (TF's `NotImplementedError`).
    #[error("not implemented: {0}")]
    Unimplemented(String),
    /// The unique-id exchange of a multi-process run (`distribute-nccl-exchange`, which returns
    /// this crate's errors and these `Bootstrap*` variants) did not complete within its timeout.
    #[error(
        "unique-id exchange: {task} gave up after {waited:?} waiting for {waiting_for}; start \
         every chief and worker task with the same cluster spec, or raise the timeout"
    )]
    BootstrapTimeout {
        /// The task that gave up, e.g. `chief:0`.
        task: String,
        /// How long it waited.
        waited: Duration,
        /// The tasks known to be missing (on the leader: those that never joined; on another
        /// task: the leader it never reached, or the tasks the leader reported); may be empty.
        missing: Vec<String>,
        /// What it waited for, with the last error seen.
        waiting_for: String,
    },
    /// A task's address in the cluster spec cannot be used for the unique-id exchange.
    #[error("unique-id exchange: {task}'s address '{address}' {reason}")]
    BootstrapAddress {
        /// The task whose address it is, e.g. `chief:0`.
        task: String,
        /// The address, as the cluster spec gives it.
        address: String,
        /// What is wrong: it does not parse, does not resolve, or cannot be bound.
        reason: String,
    },
    /// The leader of the unique-id exchange refused this task.
    #[error("unique-id exchange: the leader {leader} at {address} refused {task}: {reason}")]
    BootstrapRefused {
        /// The refused task.
        task: String,
        /// The leader, e.g. `chief:0`.
        leader: String,
        /// The leader's address.
        address: String,
        /// Why, e.g. a cluster spec that differs from the leader's.
        reason: String,
    },
    /// A peer broke the unique-id exchange: it closed the connection early, sent bytes that are
    /// not this protocol, or could not be written to.
    #[error("unique-id exchange between {task} and {peer}: {reason}")]
    BootstrapProtocol {
        /// The task that saw the failure.
        task: String,
        /// The other side: a task, an address, or both.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// The unique-id exchange has no usable cluster key: a cluster across hosts without one, or a
    /// key that does not parse or cannot be read.
    #[error("unique-id exchange: {0}")]
    BootstrapKey(String),
    /// A peer of the unique-id exchange did not prove it knows the cluster key: a process other
    /// than the leader holds the leader's port, or the leader has another key.
    #[error("unique-id exchange: {task} does not trust {peer}: {reason}")]
    BootstrapUnauthenticated {
        /// The task that checked, e.g. `worker:1`.
        task: String,
        /// The peer that failed, e.g. `the leader chief:0 at 10.0.0.1:2222`.
        peer: String,
        /// What it failed.
        reason: String,
    },
    /// A device name that does not parse.
    #[error(transparent)]
    Device(#[from] DeviceSpecError),
    /// A distributed value that is not well formed.
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// Host elements were asked of a tensor that lives in GPU memory.
    #[error(
        "the tensor on {device} lives in GPU memory: copy it to the host first \
         (Tensor::to_host)"
    )]
    OnGpu {
        /// The tensor's device.
        device: String,
    },
    /// GPU work could not run: no driver, no GPU, a missing library, or a failed CUDA call.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Why GPU work could not run, with what to install where something is missing.
///
/// Availability is probed before the first CUDA call (cudarc panics when a library is missing),
/// so a machine without a driver, a GPU, NVRTC or NCCL gets one of these instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum GpuError {
    /// This build was made without the GPU feature.
    #[error(
        "this build has no GPU support: build distribute-collectives with the cargo feature \
         `{feature}`"
    )]
    FeatureDisabled {
        /// The feature to enable: `cuda` or `nccl`.
        feature: &'static str,
    },
    /// The CUDA driver library (libcuda.so.1) could not be loaded.
    #[error(
        "no NVIDIA driver: libcuda.so.1 could not be loaded. Install the NVIDIA driver (it \
         provides libcuda.so.1) or add its folder to LD_LIBRARY_PATH"
    )]
    NoDriver,
    /// The driver loaded but reports no GPU (or failed to initialise).
    #[error("the NVIDIA driver found no usable GPU: {0}")]
    NoGpu(String),
    /// A GPU index past the last GPU.
    #[error("GPU {ordinal} does not exist: this machine has {count} GPU(s)")]
    NoSuchGpu {
        /// The index asked for.
        ordinal: usize,
        /// How many GPUs the driver reports.
        count: usize,
    },
    /// NVRTC (the run-time CUDA compiler) could not be loaded.
    #[error(
        "NVRTC could not be loaded (libnvrtc.so.13), so the reduction kernels cannot be \
         compiled. Install the CUDA toolkit or `pip install nvidia-cuda-nvrtc==13.0.88`, and put \
         the folder holding libnvrtc.so.13 on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// NCCL could not be loaded; `hint` says where a pip-installed copy was found, if any.
    #[error("NCCL could not be loaded (cudarc looks for libnccl.so): {hint}")]
    NoNccl {
        /// What to do: install it, or link the copy that was found.
        hint: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(String),
    /// NVRTC refused the kernel source (the log is included).
    #[error("NVRTC could not compile the reduction kernels: {0}")]
    Compile(String),
    /// An NCCL call failed.
    #[error("NCCL call failed: {0}")]
    Nccl(String),
}
