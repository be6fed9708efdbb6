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

/// The error a replica's failed step hands the strategy: the user's error with the replica that
/// returned it, so that `run` can name it. Errors that only report another replica's failure
/// pass through unwrapped, so the strategy still finds the root cause.
#[derive(Debug, Error)]
#[error("replica {replica}: {source}")]
pub(crate) struct ReplicaFailed {
    pub(crate) replica: usize,
    #[source]
    pub(crate) source: StepError,
}

/// `error` (of replica `replica`'s step) as the strategy should see it: an error that only says
/// another replica or worker failed first — at the top or anywhere in its `source` chain, as
/// when the user added context to it — stays a consequence, so the strategy reports the root
/// cause; any other error is wrapped with the replica.
pub(crate) fn into_strategy_error(replica: usize, error: StepError) -> StrategyError {
    let error = match error.downcast::<StrategyError>() {
        Ok(strategy) if strategy.is_consequence() => return *strategy,
        Ok(strategy) => strategy as StepError,
        Err(other) => other,
    };
    let error = match error.downcast::<Error>() {
        Ok(ours) => match *ours {
            Error::Strategy(strategy) if strategy.is_consequence() => return strategy,
            // A nested `run` already named its replica.
            Error::Replica { replica, source } => {
                return StrategyError::step(ReplicaFailed { replica, source });
            }
            other => Box::new(other) as StepError,
        },
        Err(other) => other,
    };
    if let Some(consequence) = consequence_in(error.as_ref()) {
        return StrategyError::Collective(distribute_collectives::CollectiveError::Aborted {
            reason: format!("{error} ({consequence})"),
        });
    }
    StrategyError::step(ReplicaFailed {
        replica,
        source: error,
    })
}

/// The message of the first error in `error`'s `source` chain that only reports another
/// replica's or worker's failure.
fn consequence_in(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current = error.source();
    while let Some(e) = current {
        let consequence = match (e.downcast_ref::<StrategyError>(), e.downcast_ref::<Error>()) {
            (Some(strategy), _) => strategy.is_consequence(),
            (_, Some(ours)) => ours.is_consequence(),
            _ => false,
        };
        if consequence {
            return Some(e.to_string());
        }
        current = e.source();
    }
    None
}

/// A strategy's error of `run` as this crate reports it: a replica's own error names the replica.
pub(crate) fn from_strategy_error(error: StrategyError) -> Error {
    match error {
        StrategyError::Step(boxed) => match boxed.downcast::<ReplicaFailed>() {
            Ok(failed) => Error::Replica {
                replica: failed.replica,
                source: failed.source,
            },
            Err(other) => Error::Strategy(StrategyError::Step(other)),
        },
        other => Error::Strategy(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_error_names_its_replica_and_keeps_its_source() {
        let candle = candle_core::Error::Msg("shape mismatch in matmul".into());
        let strategy = into_strategy_error(3, Box::new(candle));
        let ours = from_strategy_error(strategy);
        assert_eq!(ours.to_string(), "replica 3: shape mismatch in matmul");
        let Error::Replica { replica, source } = ours else {
            panic!("a replica error");
        };
        assert_eq!(replica, 3);
        assert!(source.downcast_ref::<candle_core::Error>().is_some());
    }

    #[test]
    fn a_peer_failure_passes_through_so_the_root_cause_wins() {
        let peer = StrategyError::PeerFailed { replica: 0 };
        assert!(into_strategy_error(1, Box::new(peer)).is_consequence());
        let wrapped = Error::Strategy(StrategyError::PeerFailed { replica: 0 });
        assert!(into_strategy_error(1, Box::new(wrapped)).is_consequence());
        let own = into_strategy_error(1, "disk full".into());
        assert!(!own.is_consequence());
    }

    #[test]
    fn a_peer_failure_under_the_users_context_is_still_a_consequence() {
        let released = anyhow::Error::new(StrategyError::PeerFailed { replica: 1 })
            .context("the backward step");
        let error = into_strategy_error(0, released.into());
        assert!(error.is_consequence(), "{error:?}");
        let own = anyhow::anyhow!("bad batch").context("the backward step");
        assert!(!into_strategy_error(0, own.into()).is_consequence());
    }
}
