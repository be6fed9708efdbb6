//! The crate's one error type.

use distribute_strategy::StrategyError;
use thiserror::Error;

/// An error of the user's step function or model builder: any error type converts into it with
/// `?` (candle's, this crate's, `anyhow`'s, `std::io`'s, a `String`).
pub type StepError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong while building, training, checking or saving a [`DataParallel`] model.
///
/// [`DataParallel`]: crate::DataParallel
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// A replica's step function (or model builder) returned an error; the replica is the global
    /// replica id, so it names the same replica on every worker.
    #[error("replica {replica}: {source}")]
    Replica {
        /// The global id of the replica that failed first.
        replica: usize,
        /// Its error, as the step returned it.
        #[source]
        source: StepError,
    },
    /// The replicas' (or the workers') models do not have the same variables.
    #[error("the model replicas differ: {0}")]
    ModelMismatch(String),
    /// The copies of the model are no longer bit-identical (see
    /// [`DataParallel::check_in_sync`](crate::DataParallel::check_in_sync)).
    #[error("the model copies are out of sync: {0}")]
    OutOfSync(String),
    /// A variable or input has a dtype that this crate cannot move between replicas.
    #[error("{what}: dtype {dtype:?} cannot be all-reduced or converted (supported: f16, bf16, f32, f64{ints})", ints = if *.integers { ", i32, i64" } else { "" })]
    UnsupportedDType {
        /// The variable or input.
        what: String,
        /// Its candle dtype.
        dtype: candle_core::DType,
        /// Whether integer dtypes would have been accepted here (inputs, not gradients).
        integers: bool,
    },
    /// A replica's device cannot hold candle tensors in this build.
    #[error("replica device '{device}': {reason}")]
    Device {
        /// The strategy's device name.
        device: String,
        /// Why, and what to do.
        reason: String,
    },
    /// A checkpoint does not fit the model.
    #[error("checkpoint '{path}': {reason}")]
    Checkpoint {
        /// The file.
        path: String,
        /// What does not fit.
        reason: String,
    },
    /// A bad argument; the message says which and what is allowed.
    #[error("{0}")]
    InvalidArgument(String),
    /// An earlier step panicked while it held this replica's model, which may be half updated.
    #[error(
        "replica {replica}'s model was left half updated by a panic in an earlier step; rebuild \
         the DataParallel model or restore it from a checkpoint"
    )]
    Poisoned {
        /// The global id of the replica whose model was poisoned.
        replica: usize,
    },
    /// A model method that waits for the replicas' copies (`with_model`, `variable`,
    /// `check_in_sync`, `save`, `load`, `assign`, a checkpoint) was called from inside a step,
    /// where the replicas hold their copies until the step ends: it would wait forever.
    #[error(
        "DataParallel::{method} was called from inside a step, where the replicas hold their \
         copies of the model until the step ends; call it between steps (inside a step, use the \
         step's ReplicaStep)"
    )]
    InStep {
        /// The method called.
        method: &'static str,
    },
    /// A strategy operation failed (a collective, a peer replica or worker, a panic).
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// A candle operation of this crate failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// A tensor conversion failed.
    #[error(transparent)]
    Tensor(#[from] distribute_tensor::TensorError),
}

/// A cross-worker call's error, as the strategy reports it.
impl From<distribute_collectives::CollectiveError> for Error {
    fn from(error: distribute_collectives::CollectiveError) -> Self {
        Error::Strategy(error.into())
    }
}

impl Error {
    /// True for errors that only say another replica or worker failed first: the strategy
    /// reports that one's error instead.
    pub fn is_consequence(&self) -> bool {
        matches!(self, Error::Strategy(e) if e.is_consequence())
    }
}

/// Fails with [`Error::InStep`] on a thread running a replica's step, where waiting for the
/// replicas' copies of the model would never end.
pub(crate) fn outside_step(method: &'static str) -> Result<(), Error> {
    match distribute_strategy::in_replica_step() {
        true => Err(Error::InStep { method }),
        false => Ok(()),
    }
}
