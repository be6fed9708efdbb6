//! [`Member`]: one replica's handle on a [`CollectiveGroup`] ([`CollectiveGroup::member`]),
//! through which it makes every call. A call publishes the replica's request and waits for the
//! others; then the replica reads the outcome the last arriver planned, sharing its result or
//! first reducing pieces of the sliced work with the others. A member dropped while its thread
//! panics aborts the group.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use distribute_values::ReduceOp;

use super::CollectiveGroup;
use super::call::Request;
use super::outcome::Outcome;
use super::plan::contiguous;
use crate::{CollectiveError, FusionPlan, ReplicaCollectives};
use distribute_tensor::Tensor;
use distribute_tensor::kernel;

/// One replica's handle on a [`CollectiveGroup`]: every collective call goes through it.
///
/// All replicas must make the same calls in the same order; each call returns when every
/// replica has made it.
pub struct Member {
    pub(super) group: CollectiveGroup,
    pub(super) replica: usize,
}

impl CollectiveGroup {
    /// The handle replica `replica` makes its calls through. If the thread holding it panics,
    /// dropping it aborts the group so the other replicas fail instead of waiting.
    ///
    /// A replica has at most one live handle: asking again while it exists is an error (two
    /// strategies cannot share one backend's replicas).
    pub fn member(&self, replica: usize) -> Result<Member, CollectiveError> {
        if replica >= self.shared.num_replicas {
            return Err(CollectiveError::InvalidArgument(format!(
                "replica {replica} is out of range for a group of {} replicas",
                self.shared.num_replicas
            )));
        }
        if self.shared.claimed[replica].swap(true, Ordering::SeqCst) {
            return Err(CollectiveError::InvalidArgument(format!(
                "replica {replica} of this collective group is already in use: a group (and the \
                 cross-device ops holding it) serves one strategy; build one per strategy"
            )));
        }
        Ok(Member {
            group: self.clone(),
            replica,
        })
    }
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Member(replica {} of {})",
            self.replica,
            self.group.num_replicas()
        )
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.group.shared.claimed[self.replica].store(false, Ordering::SeqCst);
        if std::thread::panicking() {
            self.group
                .abort(format!("replica {} panicked", self.replica));
        }
    }
}

impl Member {
    /// This member's replica id.
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// The group.
    pub fn group(&self) -> &CollectiveGroup {
        &self.group
    }

    /// The element-wise reduction of every replica's `tensor`, shared by all replicas and labelled
    /// with this replica's device. `Mean` divides by the replica count.
    pub fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.call(Request::AllReduce(op, tensor.clone()))?;
        Ok(out.swap_remove(0).copy_to_device_of(tensor)?)
    }

    /// [`Member::all_reduce`] of several tensors in one rendezvous; results in input order,
    /// bitwise equal to reducing them one by one. The results of same-dtype tensors share buckets
    /// of about [`GroupConfig::bytes_per_pack`] bytes (one output each, like a fused all-reduce),
    /// but nothing is packed: each tensor is reduced straight from the replicas' own. A batch of
    /// one tensor is that tensor's [`Member::all_reduce`], so every replica must pass one tensor
    /// then, or every replica more.
    ///
    /// [`GroupConfig::bytes_per_pack`]: super::GroupConfig::bytes_per_pack
    pub fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if tensors.is_empty() {
            return Ok(Vec::new());
        }
        if tensors.len() == 1
            || tensors
                .iter()
                .any(|t| t.placement() != distribute_tensor::Placement::Host)
        {
            // Packing works on host memory: GPU tensors are reduced one call each.
            return tensors.iter().map(|t| self.all_reduce(op, t)).collect();
        }
        let plan = Arc::new(FusionPlan::new(tensors, self.group.config().bytes_per_pack));
        let reduced = self.call(Request::BatchAllReduce(op, tensors.to_vec(), plan))?;
        if reduced.len() != tensors.len() {
            return Err(CollectiveError::Invariant(format!(
                "{} tensors were all-reduced but {} came back",
                tensors.len(),
                reduced.len()
            )));
        }
        reduced
            .into_iter()
            .zip(tensors)
            .map(|(r, t)| Ok(r.copy_to_device_of(t)?))
            .collect()
    }

    /// Every replica's `tensor` concatenated along the first axis, in replica order. Tensors may
    /// differ in their first dimension only.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.call(Request::AllGather(tensor.clone()))?;
        Ok(out.swap_remove(0).copy_to(tensor.device())?)
    }

    /// This replica's rows of the reduction: the first dimension is split into N equal parts
    /// and replica r gets part r.
    pub fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.call(Request::ReduceScatter(op, tensor.clone()))?;
        Ok(out.swap_remove(0).copy_to(tensor.device())?)
    }

    /// Replica `root`'s tensor on every replica; the others pass `None`.
    pub fn broadcast(
        &self,
        root: usize,
        tensor: Option<&Tensor>,
    ) -> Result<Tensor, CollectiveError> {
        if root >= self.group.num_replicas() {
            return Err(CollectiveError::InvalidArgument(format!(
                "broadcast root {root} is out of range for {} replicas",
                self.group.num_replicas()
            )));
        }
        let mut out = self.call(Request::Broadcast {
            root,
            tensor: tensor.cloned(),
        })?;
        Ok(out.swap_remove(0))
    }

    fn call(&self, request: Request) -> Result<Vec<Tensor>, CollectiveError> {
        let shared = &*self.group.shared;
        let name = request.name();
        let call = shared.calls.load(Ordering::SeqCst);
        let what = || format!("{} #{call}", name.signature());
        *shared.slots[self.replica].lock() = Some(request);
        shared.rendezvous.arrive(self.replica, &what, || {
            let outcome = shared.plan();
            *shared.outcome.lock() = Some(Arc::new(outcome));
        })?;
        let outcome = {
            let mut slot = shared.outcome.lock();
            let outcome = slot.clone().expect("the last arriver stored an outcome");
            if shared.consumed.fetch_add(1, Ordering::SeqCst) + 1 == shared.num_replicas {
                shared.consumed.store(0, Ordering::SeqCst);
                slot.take();
            }
            outcome
        };
        match &*outcome {
            Outcome::Shared(tensors) => Ok(tensors.clone()),
            Outcome::Failed(error) => Err(error.clone()),
            Outcome::Scatter {
                op,
                inputs,
                rows_per_replica,
            } => {
                let start = self.replica * rows_per_replica;
                let parts = inputs
                    .iter()
                    .map(|t| {
                        t.slice_rows(start..start + rows_per_replica)
                            .map(contiguous)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                let n = shared.num_replicas;
                Ok(vec![kernel::reduce_tensors(
                    *op,
                    &refs,
                    inputs[0].device(),
                    n,
                )?])
            }
            Outcome::Sliced {
                works,
                pieces,
                next,
            } => {
                // Relaxed is enough: the claims only need to be distinct, and the barrier below
                // publishes the outputs.
                while let Some(piece) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                    works[piece.work].reduce_range(piece.start, piece.end, shared.num_replicas);
                }
                shared.rendezvous.arrive(self.replica, &what, || {})?;
                Ok(works.iter().map(|w| w.result.clone()).collect())
            }
        }
    }
}

impl ReplicaCollectives for Member {
    fn replica(&self) -> usize {
        Member::replica(self)
    }
    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::all_reduce(self, op, tensor)
    }
    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        Member::batch_all_reduce(self, op, tensors)
    }
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::all_gather(self, tensor)
    }
    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::reduce_scatter(self, op, tensor)
    }
    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError> {
        Member::broadcast(self, root, tensor)
    }
}

#[cfg(test)]
mod tests {
    use distribute_values::ReduceOp;

    use crate::group::testing::{bits, input, run_on};
    use crate::group::{CollectiveGroup, GroupConfig};

    #[test]
    fn a_batch_of_one_tensor_is_its_all_reduce() {
        let group = CollectiveGroup::new(2, GroupConfig::default()).unwrap();
        let out = run_on(&group, |m| {
            let t = distribute_tensor::flat::reshape(&input(m.replica(), 12), &[3, 4]).unwrap();
            let batched = m
                .batch_all_reduce(ReduceOp::Mean, std::slice::from_ref(&t))
                .unwrap();
            let single = m.all_reduce(ReduceOp::Mean, &t).unwrap();
            (batched, single)
        });
        for (batched, single) in &out {
            assert_eq!(batched.len(), 1);
            assert_eq!(batched[0].shape(), [3, 4]);
            assert!(bits(&batched[0]) == bits(single));
        }
    }
}
