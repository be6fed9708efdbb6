//! The iterators of a distributed dataset: [`DistributedIterator`], one `PerReplica` batch per
//! step, and [`MaskedDistributedIterator`], each replica's batch paired with its mask.

use std::sync::Arc;

use distribute_values::PerReplica;

use super::agreement::Agreement;
use super::steps::Steps;
use crate::{Batch, InputError, Masked};

/// The steps of a [`DistributedDataset`]: one [`PerReplica`] batch per step, `None` at the end
/// of data (TF's `OutOfRange`), an `Err` for bad data, after which iteration ends. Dropping it
/// stops and joins its prefetch threads.
///
/// In a multi-worker run whose processes read different streams, a dataset given a
/// [`SumAcrossProcesses`](crate::SumAcrossProcesses) ends on the same step on every process,
/// agreeing once per window of steps (see
/// [`DistributedDataset::with_sum_across_processes`](crate::DistributedDataset::with_sum_across_processes)).
///
/// [`DistributedDataset`]: crate::DistributedDataset
pub struct DistributedIterator<B: Batch> {
    pub(super) steps: Steps<B>,
    /// Processes feeding replicas of each step, this one included.
    pub(super) num_processes: usize,
    /// Whether `next_across_processes` has returned the end or an error, after which it takes
    /// part in no more exchanges.
    pub(super) finished: bool,
    /// The windowed agreement on the end of data with the other processes, when the dataset
    /// has a sum across processes and they do not all read the same stream.
    pub(super) agreement: Option<Agreement<B>>,
}

impl<B: Batch> Iterator for DistributedIterator<B> {
    type Item = Result<PerReplica<B>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(agreement) = &mut self.agreement {
            return agreement.next(&mut self.steps);
        }
        let step = self.steps.next_step()?;
        Some(step.and_then(|step| self.steps.per_replica(step)))
    }
}

/// The steps of a [`DistributedDataset`] with each replica's batch paired with its mask; see
/// [`DistributedDataset::iter_masked`].
///
/// [`DistributedDataset`]: crate::DistributedDataset
/// [`DistributedDataset::iter_masked`]: crate::DistributedDataset::iter_masked
pub struct MaskedDistributedIterator<B: Batch> {
    pub(super) steps: Steps<B>,
    /// As [`DistributedIterator`]'s.
    pub(super) agreement: Option<Agreement<B>>,
}

impl<B: Batch> Iterator for MaskedDistributedIterator<B> {
    type Item = Result<PerReplica<Masked<B>>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let step = match &mut self.agreement {
            Some(agreement) => agreement.next_local(&mut self.steps)?,
            None => self.steps.next_step()?,
        };
        Some(step.and_then(|step| {
            Ok(PerReplica::new(
                Arc::clone(&self.steps.device_map),
                step.masked()?,
            )?)
        }))
    }
}
