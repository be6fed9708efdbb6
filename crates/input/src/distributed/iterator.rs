//! The iterators of a distributed dataset: [`DistributedIterator`], one step per item in the
//! regrouped form a strategy's `run` takes, and [`MaskedDistributedIterator`], each replica's
//! batch paired with its mask, the same way; [`PerReplicaIterator`] and
//! [`MaskedPerReplicaIterator`] give the same steps as one `PerReplica` of whole batches.

use std::sync::Arc;

use distribute_values::{PerReplica, Regroup, RegroupOptions, regroup_with};

use super::agreement::Agreement;
use super::steps::Steps;
use crate::{Batch, InputError, Masked};

/// The steps of a [`DistributedDataset`] as one [`PerReplica`] batch per step (each replica's
/// whole batch), `None` at the end of data (TF's `OutOfRange`), an `Err` for bad data, after
/// which iteration ends. Dropping it stops and joins its prefetch threads.
///
/// [`DistributedIterator`] gives the same steps in the form a strategy's `run` takes.
///
/// In a multi-worker run whose processes read different streams, a dataset given a
/// [`SumAcrossProcesses`](crate::SumAcrossProcesses) ends on the same step on every process,
/// agreeing once per window of steps (see
/// [`DistributedDataset::with_sum_across_processes`](crate::DistributedDataset::with_sum_across_processes)).
///
/// [`DistributedDataset`]: crate::DistributedDataset
pub struct PerReplicaIterator<B: Batch> {
    pub(super) steps: Steps<B>,
    /// Steps still to read and drop before the first one handed out (a resumed iteration).
    pub(super) skip: u64,
    /// Processes feeding replicas of each step, this one included.
    pub(super) num_processes: usize,
    /// Whether `next_across_processes` has returned the end or an error, after which it takes
    /// part in no more exchanges.
    pub(super) finished: bool,
    /// The windowed agreement on the end of data with the other processes, when the dataset
    /// has a sum across processes and they do not all read the same stream.
    pub(super) agreement: Option<Agreement<B>>,
}

impl<B: Batch> Iterator for PerReplicaIterator<B> {
    type Item = Result<PerReplica<B>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.skip > 0 {
            self.skip -= 1;
            match self.next_step()? {
                Ok(_) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        self.next_step()
    }
}

impl<B: Batch> PerReplicaIterator<B> {
    fn next_step(&mut self) -> Option<Result<PerReplica<B>, InputError>> {
        if let Some(agreement) = &mut self.agreement {
            return agreement.next(&mut self.steps);
        }
        let step = self.steps.next_step()?;
        Some(step.and_then(|step| self.steps.per_replica(step)))
    }
}

/// The steps of a [`DistributedDataset`] with each replica's batch paired with its mask, as one
/// [`PerReplica`] per step; [`MaskedDistributedIterator::into_per_replica`] gives it.
///
/// [`DistributedDataset`]: crate::DistributedDataset
pub struct MaskedPerReplicaIterator<B: Batch> {
    pub(super) steps: Steps<B>,
    /// As [`PerReplicaIterator`]'s.
    pub(super) skip: u64,
    /// As [`PerReplicaIterator`]'s.
    pub(super) agreement: Option<Agreement<B>>,
}

impl<B: Batch> Iterator for MaskedPerReplicaIterator<B> {
    type Item = Result<PerReplica<Masked<B>>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.skip > 0 {
            self.skip -= 1;
            let skipped = match &mut self.agreement {
                Some(agreement) => agreement.next_local(&mut self.steps)?,
                None => self.steps.next_step()?,
            };
            if let Err(e) = skipped {
                return Some(Err(e));
            }
        }
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

/// The steps of a [`DistributedDataset`] in the form a strategy's `run` takes: each step is the
/// batch's structure with every tensor a [`PerReplica`] leaf (`B::Regrouped`, e.g.
/// `(Leaf<Tensor>, Leaf<Tensor>)` for a batch `(Tensor, Tensor)`), replica `r`'s being its
/// chunk. Leaves stay per replica even where two chunks happen to be equal. `None` at the end
/// of data, an `Err` for bad data, after which iteration ends.
///
/// ```
/// use distribute_input::{Dataset, DistributedDataset, InputOptions, InputWorkers};
/// use distribute_values::{Leaf, select_replica};
///
/// let workers = InputWorkers::local(["/cpu:0", "/cpu:1"])?;
/// let dataset = Dataset::range(8).batch(4, false)?;
/// let dist = DistributedDataset::new(dataset, &workers, InputOptions::default())?;
/// let step = dist.iter().next().unwrap()?;
/// assert!(matches!(step, Leaf::PerReplica(_)));
/// // What replica 1's step function gets.
/// assert_eq!(select_replica::<distribute_tensor::Tensor>(1, &step)?.to_vec::<i64>()?, [2, 3]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`DistributedDataset`]: crate::DistributedDataset
pub struct DistributedIterator<B: Batch> {
    pub(super) inner: PerReplicaIterator<B>,
}

impl<B: Batch> DistributedIterator<B> {
    /// The same steps as one [`PerReplica`] of whole batches each (the form before regrouping).
    pub fn into_per_replica(self) -> PerReplicaIterator<B> {
        self.inner
    }
}

impl<B: Batch> Iterator for DistributedIterator<B> {
    type Item = Result<B::Regrouped, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let step = self.inner.next()?;
        Some(step.and_then(regroup_step))
    }
}

/// The steps of a [`DistributedDataset`] with each replica's batch paired with its mask, in the
/// form a strategy's `run` takes ([`MaskedRegrouped`](crate::MaskedRegrouped)); see
/// [`DistributedDataset::iter_masked`].
///
/// [`DistributedDataset`]: crate::DistributedDataset
/// [`DistributedDataset::iter_masked`]: crate::DistributedDataset::iter_masked
pub struct MaskedDistributedIterator<B: Batch> {
    pub(super) inner: MaskedPerReplicaIterator<B>,
}

impl<B: Batch> MaskedDistributedIterator<B> {
    /// The same steps as one [`PerReplica`] of masked batches each (what feeding device buffers
    /// needs).
    pub fn into_per_replica(self) -> MaskedPerReplicaIterator<B> {
        self.inner
    }
}

impl<B: Batch> Iterator for MaskedDistributedIterator<B> {
    type Item = Result<<Masked<B> as Regroup>::Regrouped, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let step = self.inner.next()?;
        Some(step.and_then(regroup_step))
    }
}

/// A step as `run`'s inputs: every leaf per replica, even where chunks happen to be equal.
fn regroup_step<B: Regroup>(step: PerReplica<B>) -> Result<B::Regrouped, InputError> {
    let (values, devices) = step.into_parts();
    let options = RegroupOptions {
        always_wrap: true,
        ..RegroupOptions::default()
    };
    Ok(regroup_with(&devices, values, options)?)
}
