//! The crate's one error type.

use std::time::Duration;

use distribute_device_spec::DeviceSpecError;
use distribute_values::ValuesError;
use thiserror::Error;

use distribute_tensor::{DType, GpuError, TensorError};

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
    /// An internal invariant did not hold (TF's `assert`): the input is refused, never ignored.
    #[error("invariant violated: {0}")]
    Invariant(String),
    /// An operation this backend does not provide (TF's `NotImplementedError`).
    #[error("not implemented: {0}")]
    Unimplemented(String),
    /// A device name that does not parse.
    #[error(transparent)]
    Device(#[from] DeviceSpecError),
    /// A distributed value that is not well formed.
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// A tensor operation refused its input or could not run (a GPU missing, a tensor in GPU
    /// memory where host elements were needed).
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

impl From<GpuError> for CollectiveError {
    fn from(error: GpuError) -> Self {
        CollectiveError::Tensor(TensorError::Gpu(error))
    }
}
