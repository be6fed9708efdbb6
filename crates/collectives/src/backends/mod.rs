//! The in-process backends, one module each:
//!
//! - [`reduction_to_one`]: reduce on one device, copy to the destinations (TF's default).
//! - [`shared_memory`]: the in-process all-reduce, each replica thread reducing a slice.
//!
//! Both build on the group engine ([`crate::group`]), which is no backend. The backends with an
//! engine of their own live in crates of their own, built from the same kit
//! ([`crate::backend`]): NCCL in `distribute-nccl`, MPI in `distribute-mpi`.

pub(crate) mod reduction_to_one;
pub(crate) mod shared_memory;

pub use reduction_to_one::ReductionToOneDevice;
pub use shared_memory::SharedMemoryAllReduce;

/// The [`CrossDeviceOps`](crate::CrossDeviceOps) methods of a backend whose replica collectives
/// meet in its `group: CollectiveGroup`: fused batches, per-replica handles and the replica count.
macro_rules! group_backed_ops {
    () => {
        fn batch_reduce(
            &self,
            op: ReduceOp,
            pairs: &[(&[AnyTensor], &Destinations)],
        ) -> Result<Vec<Leaf<AnyTensor>>, CollectiveError> {
            let bytes = self.group.config().bytes_per_pack;
            $crate::cross_replica::fused_batch_reduce(op, pairs, bytes, |values, destinations| {
                self.reduce(op, values, destinations)
            })
        }

        fn replica_collectives(
            &self,
            replica: usize,
        ) -> Result<Box<dyn $crate::ReplicaCollectives>, CollectiveError> {
            Ok(Box::new(self.group.member(replica)?))
        }

        fn movable_replica_collectives(
            &self,
            replica: usize,
        ) -> Result<Option<Box<dyn $crate::ReplicaCollectives + Send>>, CollectiveError> {
            // A group member is a handle on shared host memory, tied to no thread.
            Ok(Some(Box::new(self.group.member(replica)?)))
        }

        fn num_replicas(&self) -> Option<usize> {
            Some(self.group.num_replicas())
        }
    };
}
pub(crate) use group_backed_ops;

/// The [`StepLifecycle`](crate::StepLifecycle) of a backend whose replica collectives meet in its
/// `group: CollectiveGroup`: the group's abort, reset and rendezvous step hooks.
macro_rules! group_lifecycle {
    ($backend:ty) => {
        impl $crate::StepLifecycle for $backend {
            fn abort(&self, reason: &str) {
                self.group.abort(reason);
            }

            fn reset(&self) {
                self.group.reset();
            }

            fn begin_step(&self) {
                self.group.rendezvous().begin_step();
            }

            fn replica_finished(&self, replica: usize) {
                // The hook has no error channel; a replica outside the group has no barrier
                // to leave, so there is nothing to mark.
                let _ = self.group.rendezvous().finish(replica);
            }
        }
    };
}
pub(crate) use group_lifecycle;
