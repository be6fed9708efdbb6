//! The crate's one error type, shared by every strategy.

use distribute_collectives::CollectiveError;
use distribute_device_spec::DeviceSpecError;
use distribute_tensor::TensorError;
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
    /// A collective or cross-device operation failed (a tensor error inside it arrives as
    /// [`StrategyError::Tensor`]).
    #[error(transparent)]
    Collective(CollectiveError),
    /// A tensor operation refused its input or could not run, in a step, a collective or the
    /// strategy itself.
    #[error(transparent)]
    Tensor(#[from] TensorError),
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

/// A collective's error, with a tensor error inside it lifted to [`StrategyError::Tensor`]: one
/// variant for each kind of error, however it reached the strategy.
impl From<CollectiveError> for StrategyError {
    fn from(error: CollectiveError) -> Self {
        match error {
            CollectiveError::Tensor(error) => StrategyError::Tensor(error),
            error => StrategyError::Collective(error),
        }
    }
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

/// Why [`Strategy::run_each`](crate::Strategy::run_each) failed: the first replica that failed
/// on its own, with the error its step returned, or the strategy's own error.
///
/// The replicas that a failed replica released from their collectives and `merge_call`s fail
/// too, as consequences; the strategy reports the replica whose failure came first, whatever
/// the step's error type (it records the order itself, it does not look inside `E`).
///
/// ```
/// use distribute_strategy::{DefaultStrategy, RunError, Strategy};
///
/// #[derive(Debug)]
/// struct BadBatch(usize);
///
/// impl std::fmt::Display for BadBatch {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "batch {} has no rows", self.0)
///     }
/// }
///
/// let strategy = DefaultStrategy::new()?;
/// let failed = strategy.run_each(|_, ()| Err::<(), _>(BadBatch(7)), &());
/// let Err(RunError::Replica { replica, error }) = failed else { panic!("the step failed") };
/// assert_eq!((replica, error.0), (0, 7));
/// # Ok::<(), distribute_strategy::StrategyError>(())
/// ```
#[derive(Debug)]
pub enum RunError<E> {
    /// A replica's step returned `error`.
    Replica {
        /// The global id of the replica that failed first (the same on every worker).
        replica: usize,
        /// What its step returned.
        error: E,
    },
    /// The strategy failed the step: a replica panicked
    /// ([`StrategyError::ReplicaPanicked`]), another worker's step failed
    /// ([`CollectiveError::WorkerFailed`]), the inputs did not fit the replicas, or `run` was
    /// called from inside a step.
    Strategy(StrategyError),
}

impl<E> RunError<E> {
    /// Maps the replica's error, keeping the replica.
    pub fn map<F>(self, f: impl FnOnce(E) -> F) -> RunError<F> {
        match self {
            RunError::Replica { replica, error } => RunError::Replica {
                replica,
                error: f(error),
            },
            RunError::Strategy(error) => RunError::Strategy(error),
        }
    }
}

impl RunError<StrategyError> {
    /// The error `run` reports: the failed replica's own error, or the strategy's.
    pub fn into_strategy_error(self) -> StrategyError {
        match self {
            RunError::Replica { error, .. } | RunError::Strategy(error) => error,
        }
    }
}

impl<E> From<StrategyError> for RunError<E> {
    fn from(error: StrategyError) -> Self {
        RunError::Strategy(error)
    }
}

impl<E: std::fmt::Display> std::fmt::Display for RunError<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Replica { replica, error } => write!(f, "replica {replica}: {error}"),
            RunError::Strategy(error) => error.fmt(f),
        }
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for RunError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Replica { .. } => None,
            RunError::Strategy(error) => Some(error),
        }
    }
}
