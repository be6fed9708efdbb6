//! [`InputPosition`]: where in its data a training job stopped, so that a resumed job reads the
//! batches an uninterrupted one would have read next.

/// A position in a distributed dataset's steps: iteration (epoch) `epoch`, after its first
/// `step` steps. Saved in a checkpoint and given back to
/// [`DistributedDataset::resume_from`](crate::DistributedDataset::resume_from).
///
/// Steps count global batches, so a position means the same data on any number of replicas
/// and workers when each step is one global batch (the default
/// [`BatchSplit::SplitGlobalBatch`](crate::BatchSplit::SplitGlobalBatch)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct InputPosition {
    /// The iteration over the dataset, from 0: what a shuffle with
    /// `reshuffle_each_iteration` draws its order from.
    pub epoch: u64,
    /// Steps of that iteration already taken.
    pub step: u64,
}

impl InputPosition {
    /// Step `step` of the first iteration: the position of a job that iterates its dataset
    /// once.
    pub fn at_step(step: u64) -> Self {
        InputPosition { epoch: 0, step }
    }
}
