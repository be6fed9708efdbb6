//! [`SharedMemoryAllReduce`]: the in-process all-reduce, where replica threads reduce slices of
//! their inputs in parallel in shared memory (the group's sliced plan).

use distribute_values::{Leaf, ReduceOp};

use super::{group_backed_ops, group_lifecycle};
use crate::cross_replica::reduce_and_deliver;
use crate::group::{CollectiveGroup, GroupConfig};
use crate::{CollectiveError, CrossDeviceOps, Destinations};
use distribute_tensor::AnyTensor;

/// The in-process shared-memory all-reduce: for large tensors the replica threads reduce pieces
/// of all inputs in parallel (each claiming the next piece) and all replicas share the result
/// buffer; small tensors are reduced by the last replica to arrive. Falls back to
/// [`ReductionToOneDevice`](crate::ReductionToOneDevice)'s path when the values' devices differ
/// from the destinations or values are sparse, as TF's `AllReduceCrossDeviceOps` does.
#[derive(Debug)]
pub struct SharedMemoryAllReduce {
    group: CollectiveGroup,
}

impl SharedMemoryAllReduce {
    /// A backend for `num_replicas` replica threads.
    pub fn new(num_replicas: usize, config: GroupConfig) -> Result<Self, CollectiveError> {
        Ok(SharedMemoryAllReduce {
            group: CollectiveGroup::new(num_replicas, config)?,
        })
    }

    /// The group replica threads meet in.
    pub fn group(&self) -> &CollectiveGroup {
        &self.group
    }
}

impl CrossDeviceOps for SharedMemoryAllReduce {
    fn name(&self) -> &'static str {
        "SharedMemoryAllReduce"
    }

    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        // In cross-replica context one thread holds every value, so the reduction runs here, in
        // the same order as the replicas' all-reduce: both give the same bits.
        reduce_and_deliver(op, values, destinations, None)
    }

    group_backed_ops!();
}

group_lifecycle!(SharedMemoryAllReduce);
