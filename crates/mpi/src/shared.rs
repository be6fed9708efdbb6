//! [`Shared`]: what the backend and every local replica's handle share — the local group, the MPI
//! world, the deadline, a failure another worker reported, and the buffers the folds reuse.
//! The backend (`all_reduce`) makes it; the handles (`member`), the agreement, the folds and the
//! worker services use it.

use std::time::Duration;

use distribute_collectives::backend::CollectiveGroup;
use distribute_tensor::Tensor;
use distribute_values::Lock;

use crate::communicator::MpiWorld;

/// The state of one [`MpiAllReduce`](crate::MpiAllReduce), shared by the backend and every
/// local replica's handle (`MpiMember`). Its calls across workers are the agreement's
/// (`agreement`) and the folds' (`folds`).
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) group: CollectiveGroup,
    pub(crate) devices: Vec<String>,
    pub(crate) world: &'static MpiWorld,
    pub(crate) deadline: Duration,
    pub(crate) bytes_per_pack: usize,
    /// Set when an agreement showed another worker's failure: this worker's failure in the same
    /// step is then a consequence. Cleared by `reset` before the next step.
    pub(crate) remote_failure: Lock<Option<usize>>,
    /// The receive buffer of cross-worker folds, kept between calls: a fresh one per call costs
    /// a page fault per 4 KiB, as much as the transfer itself. Grows to the largest fold's need
    /// (W × bytes below [`SCATTER_MIN_BYTES`](crate::SCATTER_MIN_BYTES), (W−1)/W × bytes from
    /// it) and stays. Every fold overwrites what it reads, so a fold that panicked leaves nothing
    /// the next one sees.
    pub(crate) scratch: Lock<Vec<u64>>,
    /// Shares of recent large fold results (see
    /// [`REUSE_MIN_BYTES`](crate::folds::REUSE_MIN_BYTES)).
    pub(crate) kept_outputs: Lock<Vec<Tensor>>,
}
