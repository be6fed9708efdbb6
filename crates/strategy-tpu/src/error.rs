//! [`TpuError`], the crate's one error type. Its kinds follow TF's exceptions (see the reference
//! behaviours' conventions): `InvalidArgument` for `ValueError`, `Type` for `TypeError`,
//! `Unimplemented` for `NotImplementedError`.

use distribute_input::InputError;
use distribute_pjrt::PjrtError;
use distribute_strategy::StrategyError;
use distribute_tensor::TensorError;
use distribute_values::ValuesError;

/// What can go wrong in a TPU topology, device assignment or compiled step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TpuError {
    /// A bad argument (TF's `ValueError`); the message says which and what is allowed.
    #[error("{0}")]
    InvalidArgument(String),
    /// A value of the wrong kind (TF's `TypeError`).
    #[error("{0}")]
    Type(String),
    /// Not supported on TPU, or not by this implementation (TF's `NotImplementedError`).
    #[error("not implemented: {0}")]
    Unimplemented(String),
    /// The PJRT plugin or the program builder failed (compiler messages included).
    #[error(transparent)]
    Pjrt(#[from] PjrtError),
    /// A strategy operation (eager step, host-side reduce) failed.
    #[error(transparent)]
    Strategy(#[from] StrategyError),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// A distributed value operation failed.
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// An input pipeline failed or was misconfigured.
    #[error(transparent)]
    Input(#[from] InputError),
}

impl From<TpuError> for StrategyError {
    fn from(err: TpuError) -> StrategyError {
        match err {
            TpuError::InvalidArgument(m) | TpuError::Type(m) => StrategyError::InvalidArgument(m),
            TpuError::Unimplemented(m) => StrategyError::Unimplemented(m),
            TpuError::Strategy(e) => e,
            TpuError::Tensor(e) => StrategyError::Tensor(e),
            TpuError::Values(e) => StrategyError::Values(e),
            TpuError::Input(e) => StrategyError::Input(e),
            TpuError::Pjrt(e) => StrategyError::step(e),
        }
    }
}
