//! [`MpiMember`]: one local replica's handle, its member of the local group and the backend's
//! cross-process step, made by local replica 0's thread.
use crate::communicator::gather_layout;
use crate::folds::local_op;
use crate::shared::Shared;
use distribute_collectives::backend::{Call, Member, Record, Status};
use distribute_collectives::{CollectiveError, FusionPlan, ReplicaCollectives};
use distribute_tensor::{Element, Tensor};
use distribute_tensor::{
    bytes::{element_bytes as as_bytes, element_bytes_mut as as_bytes_mut},
    kernel::check_op,
    with_dtype,
};
use distribute_values::ReduceOp;
use std::sync::Arc;

/// One local replica's handle: the local group's member, and the backend for the cross-process
/// step its thread makes when it is local replica 0.
#[derive(Debug)]
pub(crate) struct MpiMember {
    pub(crate) member: Member,
    pub(crate) shared: Arc<Shared>,
    /// This replica's device, for results of calls it passed no tensor to.
    pub(crate) device: String,
}

impl MpiMember {
    fn local_replicas(&self) -> usize {
        self.shared.group.num_replicas()
    }

    /// Runs `cross` on local replica 0's thread and hands its `count` tensors to every local
    /// replica, each labelled with `device`. A failure of `cross` aborts the local group, so the
    /// other local replicas fail too instead of waiting.
    fn via_leader(
        &self,
        count: usize,
        device: &str,
        cross: impl FnOnce() -> Result<Vec<Tensor>, CollectiveError>,
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if self.local_replicas() == 1 {
            return cross();
        }
        if self.member.replica() == 0 {
            let results = cross().inspect_err(|e| self.shared.group.abort(e.to_string()))?;
            for t in &results {
                self.member.broadcast(0, Some(t))?;
            }
            return Ok(results);
        }
        (0..count)
            .map(|_| Ok(self.member.broadcast(0, None)?.copy_to(device)?))
            .collect()
    }

    /// The local reduction of every local replica's `tensors` (themselves with one replica).
    fn local_batch(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if self.local_replicas() == 1 {
            return tensors.iter().map(|t| Ok(t.to_host()?)).collect();
        }
        self.member
            .batch_all_reduce(op, tensors)?
            .iter()
            .map(|t| Ok(t.to_host()?))
            .collect()
    }
}

impl ReplicaCollectives for MpiMember {
    fn replica(&self) -> usize {
        self.member.replica()
    }

    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.batch_all_reduce(op, std::slice::from_ref(tensor))?;
        Ok(out.swap_remove(0))
    }

    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if let Some(t) = tensors.first() {
            check_op(op, t.dtype())?;
        }
        let local = self.local_batch(local_op(op), tensors)?;
        let shared = &self.shared;
        let plan = FusionPlan::new(&local, shared.bytes_per_pack);
        let total = shared.workers() * self.local_replicas();
        let device = tensors.first().map_or("", |t| t.device());
        // One tensor is its own bucket: no packing, no unpacking (a copy each way saved).
        let single = local.len() == 1;
        let buckets = self.via_leader(plan.num_buckets(), device, || {
            let refs: Vec<&Tensor> = local.iter().collect();
            let record = Record::of(Call::AllReduce, Some(op), &refs);
            match single {
                true => shared.reduce_across(record, op, total, &local),
                false => shared.reduce_across(record, op, total, &plan.pack(&local)?),
            }
        })?;
        let reduced = match single {
            true => buckets,
            false => plan.unpack(&buckets)?,
        };
        reduced
            .into_iter()
            .zip(tensors)
            .map(|(r, t)| Ok(r.copy_to(t.device())?))
            .collect()
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let local = if self.local_replicas() == 1 {
            tensor.to_host()?
        } else {
            self.member.all_gather(tensor)?.to_host()?
        };
        let shared = &self.shared;
        let mut out = self.via_leader(1, tensor.device(), || {
            let records = shared.agree(Record::of(Call::AllGather, None, &[&local]), "")?;
            if local.rank() == 0 {
                return Err(CollectiveError::InvalidArgument(
                    "all_gather concatenates along the first axis: a scalar has none; reshape \
                     it to [1]"
                        .into(),
                ));
            }
            if shared.workers() == 1 {
                return Ok(vec![local.clone()]);
            }
            let row: usize = local.shape()[1..].iter().product();
            let rows: Vec<usize> = records.iter().map(|r| r.rows as usize).collect();
            let (counts, displs) =
                gather_layout(rows.iter().map(|&r| r * row), local.dtype().size_in_bytes())?;
            let total_rows: usize = rows.iter().sum();
            let mut shape = local.shape().to_vec();
            shape[0] = total_rows;
            with_dtype!(local.dtype(), T => {
                let mine: Vec<T> = local.to_vec::<T>()?;
                let mut all = vec![T::zero(); total_rows * row];
                shared.world.all_gather_varcount(
                    as_bytes(&mine),
                    as_bytes_mut(&mut all),
                    &counts,
                    &displs,
                    shared.deadline,
                    &|| format!("the all_gather of {local}"),
                );
                Ok(vec![Tensor::from_vec(tensor.device(), &shape, all)?])
            })
        })?;
        Ok(out.swap_remove(0).copy_to(tensor.device())?)
    }

    /// The local replicas' sum, then across workers a reduce-scatter: each worker folds and
    /// keeps only its part (its replicas' rows), in worker order as the all-reduce folds, so
    /// each replica's rows are the same bits as its slice of the all-reduce.
    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        check_op(op, tensor.dtype())?;
        let r = self.local_replicas();
        let n = self.shared.workers() * r;
        let rows = tensor.shape().first().copied().unwrap_or(0);
        if tensor.rank() == 0 || rows % n != 0 {
            return Err(CollectiveError::InvalidArgument(format!(
                "reduce_scatter: the first dimension ({rows}) must divide evenly among the {n} \
                 replicas of every worker"
            )));
        }
        let local = self
            .local_batch(local_op(op), std::slice::from_ref(tensor))?
            .swap_remove(0);
        let shared = &self.shared;
        let mut part = self.via_leader(1, tensor.device(), || {
            shared.agree(Record::of(Call::ReduceScatter, Some(op), &[&local]), "")?;
            Ok(vec![shared.fold_part(op, n, &local)?])
        })?;
        let part = part.swap_remove(0);
        let per = rows / n;
        let mine = self.member.replica() * per..(self.member.replica() + 1) * per;
        Ok(part.slice_rows(mine)?.copy_to(tensor.device())?)
    }

    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError> {
        let shared = &self.shared;
        let r = self.local_replicas();
        if root >= shared.workers() * r {
            return Err(CollectiveError::InvalidArgument(format!(
                "broadcast root {root} is out of range for {} replicas ({} workers × {r})",
                shared.workers() * r,
                shared.workers()
            )));
        }
        let (root_worker, local_root) = (root / r, root % r);
        let device = tensor.map_or_else(|| self.device.clone(), |t| t.device().to_owned());
        let local = if shared.world.rank() != root_worker {
            None
        } else if r == 1 {
            Some(
                tensor
                    .ok_or_else(|| {
                        CollectiveError::InvalidArgument(format!(
                            "broadcast: the root replica {root} passed no tensor"
                        ))
                    })?
                    .to_host()?,
            )
        } else {
            Some(self.member.broadcast(local_root, tensor)?.to_host()?)
        };
        let mut out = self.via_leader(1, &device, || {
            let record = match &local {
                Some(t) => Record::of(Call::Broadcast, None, &[t]),
                None => Record::bare(Call::Broadcast, Status::Ok),
            };
            let records = shared.agree(record.with_extra(root as i64), "")?;
            let source = &records[root_worker];
            let (Some(dtype), Some(shape)) = (source.single_dtype(), source.shape()) else {
                return Err(CollectiveError::InvalidArgument(format!(
                    "broadcast across workers carries tensors of rank up to {}",
                    distribute_collectives::backend::MAX_DIMS
                )));
            };
            if shared.workers() == 1 {
                return Ok(vec![local.clone().expect("one worker is the root")]);
            }
            with_dtype!(dtype, T => {
                let mut values: Vec<T> = match &local {
                    Some(t) => t.to_vec::<T>()?,
                    None => vec![T::zero(); shape.iter().product()],
                };
                let what = || format!("the broadcast from replica {root}");
                shared.world.broadcast(root_worker, as_bytes_mut(&mut values), shared.deadline, &what);
                Ok(vec![Tensor::from_vec(&device, &shape, values)?])
            })
        })?;
        Ok(out.swap_remove(0).copy_to(&device)?)
    }
}
