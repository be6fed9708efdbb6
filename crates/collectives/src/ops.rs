//! The traits every backend implements: [`CrossDeviceOps`] (how values move between devices —
//! reductions and broadcasts made in cross-replica context, where one thread holds every
//! replica's value), [`StepLifecycle`] (what a strategy tells the backend around a step) and
//! [`ReplicaCollectives`] (the collective calls replica threads make).
//!
//! The in-process host backends live in `backends/`, one module each, NCCL's and MPI's in crates
//! of their own; [`OpsPlan`](crate::OpsPlan) says which a strategy's devices get.

use std::fmt;

use distribute_values::{Leaf, ReduceOp};

use crate::cross_replica::simple_broadcast;
use crate::{CollectiveError, Destinations};
use distribute_tensor::{AnyTensor, Tensor};

/// Collective calls made from inside a replica's thread: every replica calls the same methods in
/// the same order, and each call returns when all replicas have made it.
///
/// Not `Send`: a handle may own per-thread resources (an NCCL communicator), so it is created on
/// the replica's thread and stays there.
pub trait ReplicaCollectives: fmt::Debug {
    /// This handle's replica id.
    fn replica(&self) -> usize;
    /// The element-wise reduction of every replica's tensor.
    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError>;
    /// Several all-reduces in one rendezvous.
    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError>;
    /// Every replica's tensor concatenated along the first axis, in replica order.
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError>;
    /// This replica's equal share of the rows of the reduction.
    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError>;
    /// Replica `root`'s tensor on every replica.
    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError>;
}

/// How values move between the devices of a strategy (TF's `CrossDeviceOps`).
///
/// `reduce`, `batch_reduce` and `broadcast` run in cross-replica context with every replica's
/// value in hand; [`CrossDeviceOps::replica_collectives`] gives each replica thread its handle for
/// collective calls. Every backend also tells replica threads about failed steps
/// ([`StepLifecycle`]).
pub trait CrossDeviceOps: StepLifecycle + Send + Sync + fmt::Debug {
    /// The backend's name, e.g. `ReductionToOneDevice`.
    fn name(&self) -> &'static str;

    /// Reduces one value per replica and delivers the result to `destinations`: the plain value
    /// for one destination device, else a `Mirrored` of copies in destination order.
    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError>;

    /// Several reductions; result `i` equals `reduce(op, pairs[i].0, pairs[i].1)`.
    fn batch_reduce(
        &self,
        op: ReduceOp,
        pairs: &[(&[AnyTensor], &Destinations)],
    ) -> Result<Vec<Leaf<AnyTensor>>, CollectiveError> {
        pairs
            .iter()
            .map(|(values, destinations)| self.reduce(op, values, destinations))
            .collect()
    }

    /// A copy of `tensor` on every destination device.
    fn broadcast(
        &self,
        tensor: &Tensor,
        destinations: &Destinations,
    ) -> Result<Leaf<Tensor>, CollectiveError> {
        simple_broadcast(tensor, destinations)
    }

    /// Replica `replica`'s handle for collective calls; call it on the replica's own thread (an
    /// NCCL communicator must stay on the thread that uses it).
    fn replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError>;

    /// Replica `replica`'s handle for collective calls, usable from whichever thread holds it
    /// (one at a time), or `None` when this backend's handles are tied to the thread that made
    /// them (the default; an NCCL communicator is). Host-memory backends return one, so that a
    /// strategy can run a replica on the thread that calls `run` instead of handing every step
    /// to a thread of its own: on a machine with as many cores as replicas, a caller that only
    /// waits takes a core the replicas need.
    ///
    /// A backend hands out one handle per replica: a strategy asks for a replica either here or
    /// through [`CrossDeviceOps::replica_collectives`], never both.
    fn movable_replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Option<Box<dyn ReplicaCollectives + Send>>, CollectiveError> {
        let _ = replica;
        Ok(None)
    }

    /// How many replicas the replica collectives are built for, when the backend has a fixed
    /// count (a strategy checks it against its devices).
    fn num_replicas(&self) -> Option<usize> {
        None
    }
}

/// What a strategy tells a backend around each step, so that replica collectives fail at once
/// instead of waiting for a replica that will never call.
pub trait StepLifecycle {
    /// Fails every pending and future replica collective until [`StepLifecycle::reset`] (used
    /// when a replica fails).
    fn abort(&self, reason: &str);

    /// Makes the replica collectives usable again after an abort.
    fn reset(&self);

    /// Called before the replicas start a step (a strategy's `run`).
    fn begin_step(&self) {}

    /// Called when `replica` has finished its step: collectives it will never join fail at once
    /// instead of waiting for the deadline.
    fn replica_finished(&self, replica: usize) {
        let _ = replica;
    }
}
