//! The `Outcome` of a call: what the last replica to arrive planned (`plan`) and every replica
//! then reads (`member`) — a result shared without copying, an error, the sliced work they
//! reduce together, or their rows of a reduce-scatter. The group's state holds the current one
//! until every replica has read it.

use std::sync::atomic::AtomicUsize;

use distribute_values::ReduceOp;

use super::sliced::{Piece, SlicedWork};
use crate::CollectiveError;
use distribute_tensor::Tensor;

/// The result of a call, computed by the last replica to arrive.
pub(super) enum Outcome {
    /// Every replica returns these, one entry per tensor of the call.
    Shared(Vec<Tensor>),
    /// Every replica returns this error.
    Failed(CollectiveError),
    /// The replicas reduce the pieces of every output, each claiming the next unclaimed one,
    /// then all wait, then all share the outputs.
    Sliced {
        works: Vec<SlicedWork>,
        pieces: Vec<Piece>,
        /// The next piece to claim.
        next: AtomicUsize,
    },
    /// Each replica reduces its own rows of the inputs.
    Scatter {
        op: ReduceOp,
        inputs: Vec<Tensor>,
        rows_per_replica: usize,
    },
}
