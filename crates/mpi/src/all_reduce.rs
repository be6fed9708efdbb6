//! [`MpiAllReduce`]: the hierarchical cross-worker backend. Local replicas reduce in shared
//! memory (the process's [`CollectiveGroup`]), local replica 0's thread makes one agreement and
//! one cross-process collective per fused bucket, and the result goes back to every local
//! replica through the group.
//!
//! Bit-identical everywhere: every element of a cross-worker reduction is folded exactly once,
//! in worker order, by the same code. Below [`SCATTER_MIN_BYTES`] every worker all-gathers every
//! worker's local result and folds the W blocks in worker order itself (one round). From it the
//! buffer is cut into W parts and the workers reduce-scatter then all-gather, point to point
//! between their own buffers: worker `p` receives every worker's part `p`, folds them in worker
//! order straight into its result, and sends that part to every other worker, which receives it
//! straight into its result. Both paths fold element `i` as `x₀ ⊕ x₁ ⊕ … ⊕ x_{W-1}` (`Mean`
//! divided in the same pass) with the same kernel, so they give the same bits, and no MPI
//! reduction (whose fold order the standard leaves to each rank) is involved.
//!
//! Measured on 2 workers (shared memory; the multi-worker bench's `mpi_ratio`, runs alternating
//! between the variants, 1 MiB / 64 MiB): all-gathering whole buffers into fresh results
//! 0.71–0.97 / 0.74–0.94; the same writing into released earlier results' buffers (see
//! [`MpiAllReduce`]; a fresh 64 MiB buffer's page faults cost as much as its transfer)
//! 0.78–1.02 / 1.06–1.13; reduce-scatter + all-gather into fresh results 0.90–1.05 / 0.77; both
//! 0.96–0.99 / 1.85–2.05.
//!
//! Every cross-worker call starts with an agreement: one all-gather of a fixed-size slot per
//! worker (its record, see `agreement`, and an inline payload). A reduction of at most
//! [`INLINE_BYTES`] travels in that slot, so small all-reduces cost one round trip, agreement
//! included; larger ones move afterwards (an all-gather, or the two point-to-point rounds).
//!
//! [`SCATTER_MIN_BYTES`]: crate::SCATTER_MIN_BYTES
//! [`INLINE_BYTES`]: crate::INLINE_BYTES
use crate::communicator::{MpiWorld, gather_layout};
use crate::folds::local_op;
use crate::member::MpiMember;
use crate::shared::Shared;
use distribute_collectives::backend::{Call, CollectiveGroup, Record, Status, deliver};
use distribute_collectives::{
    CollectiveError, CrossDeviceOps, Destinations, FusionPlan, GroupConfig, ReplicaCollectives,
    StepLifecycle,
};
use distribute_tensor::{AnyTensor, Element, Tensor};
use distribute_tensor::{
    bytes::{element_bytes as as_bytes, element_bytes_mut as as_bytes_mut},
    kernel::{check_op, reduce_tensors},
    with_dtype,
};
use distribute_values::{Leaf, Lock, ReduceOp};
use std::sync::Arc;

/// The hierarchical all-reduce across the worker processes of an MPI job (see the module docs):
/// reductions span every local replica of every worker, and every replica of every worker gets
/// bit-identical results.
///
/// Global replica `w·R + r` is worker `w`'s local replica `r` (R local replicas per worker, the
/// same on every worker). A strategy calls [`MpiAllReduce::finish_step`] after each step, so a
/// worker whose step failed is named on every worker.
///
/// Results of at least 256 KiB share their buffer with the backend, which keeps the last four:
/// once every holder has dropped one, the next reduction of its dtype and shape writes into it
/// instead of a fresh buffer (whose page faults cost as much as the transfer). Reading is
/// unaffected; writing into such a result in place (`Tensor::array_mut`) copies it first, as for
/// any shared buffer.
#[derive(Debug, Clone)]
pub struct MpiAllReduce {
    pub(crate) shared: Arc<Shared>,
}

impl MpiAllReduce {
    /// Replica `replica`'s handle: its member of the local group and the shared backend.
    fn member(&self, replica: usize) -> Result<MpiMember, CollectiveError> {
        Ok(MpiMember {
            member: self.shared.group.member(replica)?,
            shared: Arc::clone(&self.shared),
            device: self.shared.devices[replica].clone(),
        })
    }

    /// A backend for this process's replicas on `devices` (host devices, one replica thread
    /// each), initialising MPI if no one has. Every worker must have the same number of local
    /// replicas: they check it here, together, so every worker of the job must build its
    /// backend (a collective call).
    ///
    /// `config.deadline` bounds every wait, local and cross-process; a cross-process wait past it
    /// aborts the job.
    pub fn new<S: AsRef<str>>(devices: &[S], config: GroupConfig) -> Result<Self, CollectiveError> {
        let world = MpiWorld::get()?;
        let local_replicas = devices.len();
        let backend = MpiAllReduce {
            shared: Arc::new(Shared {
                group: CollectiveGroup::new(local_replicas, config)?,
                devices: devices.iter().map(|d| d.as_ref().to_owned()).collect(),
                world,
                deadline: config.deadline,
                bytes_per_pack: config.bytes_per_pack,
                remote_failure: Lock::new(None),
                scratch: Lock::new(Vec::new()),
                kept_outputs: Lock::new(Vec::new()),
            }),
        };
        // Every worker checks that all have the same local replica count before any step.
        let record = Record::bare(Call::Exchange, Status::Ok).with_extra(local_replicas as i64);
        backend.shared.agree(record, "").map_err(|e| match e {
            CollectiveError::WorkersDisagree(_) => CollectiveError::InvalidArgument(format!(
                "every worker must run the same number of local replicas; this worker has \
                 {local_replicas} ({e})"
            )),
            other => other,
        })?;
        Ok(backend)
    }

    /// The process world (rank = worker, size = workers).
    pub fn world(&self) -> &'static MpiWorld {
        self.shared.world
    }

    /// This process's worker index.
    pub fn worker(&self) -> usize {
        self.shared.world.rank()
    }

    /// The number of workers.
    pub fn num_workers(&self) -> usize {
        self.shared.world.size()
    }

    /// Local replicas per worker.
    pub fn local_replicas(&self) -> usize {
        self.shared.group.num_replicas()
    }

    /// Every replica of every worker.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.num_workers() * self.local_replicas()
    }

    /// The local group (shared-memory rendezvous of this process's replicas).
    pub fn group(&self) -> &CollectiveGroup {
        &self.shared.group
    }
}

impl MpiAllReduce {
    /// Every worker's `tensor` joined along `axis`, in worker order, on the host (each worker
    /// passes one value, e.g. its local replicas' already joined): the length of `axis` may
    /// differ per worker, the dtype, rank and other dimensions may not (a mismatch is an error
    /// on every worker).
    pub fn all_gather_across_workers(
        &self,
        tensor: &Tensor,
        axis: usize,
    ) -> Result<Tensor, CollectiveError> {
        let shared = &self.shared;
        let local = tensor.to_host()?;
        // Agreed first, so a bad axis (the same on every worker, or a disagreement) fails
        // every worker alike.
        let records = shared.agree(Record::gather_along(&local, axis), "")?;
        if axis >= local.rank() {
            return Err(CollectiveError::InvalidArgument(format!(
                "an all-gather along axis {axis} of a tensor of rank {}: the axis must be below \
                 the rank",
                local.rank()
            )));
        }
        if shared.workers() == 1 {
            return Ok(local);
        }
        let lengths: Vec<usize> = records.iter().map(|r| r.rows as usize).collect();
        let shape = local.shape();
        let outside: usize = shape
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != axis)
            .map(|(_, &d)| d)
            .product();
        let (counts, displs) = gather_layout(
            lengths.iter().map(|&l| l * outside),
            local.dtype().size_in_bytes(),
        )?;
        let total: usize = lengths.iter().sum::<usize>() * outside;
        let parts = with_dtype!(local.dtype(), T => {
            let mine: Vec<T> = local.to_vec::<T>()?;
            let mut all = vec![T::zero(); total];
            shared.world.all_gather_varcount(
                as_bytes(&mine),
                as_bytes_mut(&mut all),
                &counts,
                &displs,
                shared.deadline,
                &|| format!("the all-gather of {local} along axis {axis}"),
            );
            let mut at = 0;
            lengths
                .iter()
                .map(|&l| {
                    let mut part_shape = shape.to_vec();
                    part_shape[axis] = l;
                    let part = all[at..at + l * outside].to_vec();
                    at += l * outside;
                    Tensor::from_vec(local.device(), &part_shape, part)
                })
                .collect::<Result<Vec<Tensor>, _>>()?
        });
        Ok(Tensor::concat(local.device(), &parts, axis)?)
    }

    /// The reduction of `tensor` across workers only (each worker passes one value, already
    /// reduced over its local replicas): `Sum`, `Min`, `Max`, or `Mean` over the workers.
    pub fn all_reduce_across_workers(
        &self,
        op: ReduceOp,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let shared = &self.shared;
        check_op(op, tensor.dtype())?;
        let record = Record::of(Call::Reduce, Some(op), &[tensor]).with_extra(1);
        let mut out = shared.reduce_across(record, op, shared.workers(), &[tensor.to_host()?])?;
        Ok(out.swap_remove(0))
    }
}

impl CrossDeviceOps for MpiAllReduce {
    fn name(&self) -> &'static str {
        "MpiAllReduce"
    }

    /// The reduction of this worker's `values` and every other worker's (each worker passes its
    /// local replicas' values, dense), delivered to this worker's `destinations`.
    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        let mut out = self.batch_reduce(op, &[(values, destinations)])?;
        Ok(out.swap_remove(0))
    }

    /// Every pair reduced over its local values, then one agreement and one cross-process
    /// collective per fused bucket of the local results.
    fn batch_reduce(
        &self,
        op: ReduceOp,
        pairs: &[(&[AnyTensor], &Destinations)],
    ) -> Result<Vec<Leaf<AnyTensor>>, CollectiveError> {
        let shared = &self.shared;
        let mut local = Vec::with_capacity(pairs.len());
        let mut count = None;
        for (values, destinations) in pairs {
            let dense: Vec<&Tensor> = values
                .iter()
                .map(|v| match v {
                    AnyTensor::Dense(t) => Ok(t),
                    AnyTensor::Sparse(_) => Err(CollectiveError::Unimplemented(
                        "sparse (IndexedSlices) values across workers: densify them first".into(),
                    )),
                })
                .collect::<Result<_, _>>()?;
            if count.is_some_and(|c| c != dense.len()) {
                return Err(CollectiveError::InvalidArgument(
                    "a batch_reduce across workers needs the same number of values in every pair"
                        .into(),
                ));
            }
            count = Some(dense.len());
            let first = dense.first().ok_or_else(|| {
                CollectiveError::InvalidArgument("cannot reduce an empty list of values".into())
            })?;
            check_op(op, first.dtype())?;
            let host: Vec<Tensor> = dense
                .iter()
                .map(|t| t.to_host())
                .collect::<Result<_, _>>()?;
            let refs: Vec<&Tensor> = host.iter().collect();
            local.push(reduce_tensors(
                local_op(op),
                &refs,
                &destinations.as_slice()[0],
                1,
            )?);
        }
        let count = count.unwrap_or(0);
        let refs: Vec<&Tensor> = local.iter().collect();
        let record = Record::of(Call::Reduce, Some(op), &refs).with_extra(count as i64);
        let plan = FusionPlan::new(&local, shared.bytes_per_pack);
        let buckets =
            shared.reduce_across(record, op, count * shared.workers(), &plan.pack(&local)?)?;
        plan.unpack(&buckets)?
            .into_iter()
            .zip(pairs)
            .map(|(reduced, (_, destinations))| {
                let reduced = AnyTensor::Dense(reduced);
                deliver(destinations, |device| Ok(reduced.copy_to(device)?))
            })
            .collect()
    }

    fn replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError> {
        Ok(Box::new(self.member(replica)?))
    }

    fn movable_replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Option<Box<dyn ReplicaCollectives + Send>>, CollectiveError> {
        // MPI runs with MPI_THREAD_SERIALIZED and every cross-process call is made under one
        // lock, so the thread that makes it may change from call to call.
        Ok(Some(Box::new(self.member(replica)?)))
    }

    fn num_replicas(&self) -> Option<usize> {
        Some(self.local_replicas())
    }
}

impl StepLifecycle for MpiAllReduce {
    fn abort(&self, reason: &str) {
        self.shared.group.abort(reason);
    }

    fn reset(&self) {
        self.shared.group.reset();
        *self.shared.remote_failure.lock() = None;
    }

    fn begin_step(&self) {
        self.shared.group.rendezvous().begin_step();
    }

    fn replica_finished(&self, replica: usize) {
        // The hook has no error channel; a replica outside the group has no barrier to leave.
        let _ = self.shared.group.rendezvous().finish(replica);
    }
}
