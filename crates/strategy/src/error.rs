//! The crate's one error type, shared by every strategy.

use distribute_collectives::CollectiveError;
use distribute_device_spec::DeviceSpecError;
use distribute_values::ValuesError;
use thiserror::Error;

/// What went wrong in a strategy: building it, running a step, or a cross-replica operation.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StrategyError {
    /// A bad argument (TF's `ValueError`); the message says which and what is allowed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The protocol between replicas was broken (TF's `RuntimeError`), e.g. replicas made
    /// different numbers of `merge_call` calls.
    #[error("{0}")]
    Runtime(String),
    /// An internal consistency check failed (TF's `assert`); the input is rejected.
    #[error("{0}")]
    Invariant(String),
    /// The input ran out (TF's `OutOfRangeError`): no step could start.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// Not supported by this strategy (TF's `NotImplementedError`).
    #[error("not implemented: {0}")]
    Unimplemented(String),
    /// A cross-replica operation was called from inside a replica's step, through a strategy or
    /// cross-replica context the step captured: only a merge function may run them there.
    #[error(
        "`{operation}` is a cross-replica operation but was called inside a replica's step (through \
         a captured strategy or cross-replica context); call it from a merge function \
         (ctx.merge_call) or outside run"
    )]
    CrossReplicaInReplica {
        /// The operation, e.g. `update`.
        operation: &'static str,
    },
    /// A replica's step function panicked.
    #[error("replica {replica} panicked: {message}")]
    ReplicaPanicked {
        /// The replica.
        replica: usize,
        /// The panic's message.
        message: String,
    },
    /// This replica stopped because another one failed; the caller gets that one's error.
    #[error("replica {replica} failed, so this replica stopped")]
    PeerFailed {
        /// The replica that failed first.
        replica: usize,
    },
    /// An error of the user's step or merge function.
    #[error(transparent)]
    Step(Box<dyn std::error::Error + Send + Sync>),
    /// A collective or cross-device operation failed.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// A distributed value or variable operation failed.
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// An input pipeline failed: a malformed dataset, an unreadable file, a bad option.
    #[error(transparent)]
    Input(#[from] distribute_input::InputError),
    /// A checkpoint file (or directory) could not be written, read or restored.
    #[error("checkpoint {}: {reason}", path.display())]
    Checkpoint {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// A device name is malformed.
    #[error(transparent)]
    Device(#[from] DeviceSpecError),
}

impl StrategyError {
    /// Wraps an error of the user's own step function.
    ///
    /// ```
    /// use distribute_strategy::StrategyError;
    ///
    /// let err = StrategyError::step(std::io::Error::other("disk full"));
    /// assert_eq!(err.to_string(), "disk full");
    /// ```
    pub fn step(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StrategyError {
        StrategyError::Step(error.into())
    }

    /// True for errors that only report another replica's failure; a strategy hands its caller
    /// the original instead.
    pub fn is_consequence(&self) -> bool {
        matches!(
            self,
            StrategyError::PeerFailed { .. }
                | StrategyError::Collective(CollectiveError::Aborted { .. })
        )
    }
}
