//! How the last replica to arrive plans a call the replicas agree on: the group's [`ReducePlan`]
//! says who reduces, and the plan is the `Outcome` (`outcome`) every replica then reads (a result
//! shared without copying, an error, the sliced work they reduce together, or their rows of a
//! reduce-scatter). A call with GPU tensors is reduced on a GPU; host outputs are reused from
//! call to call once no one holds them any more.

use std::sync::atomic::{AtomicUsize, Ordering};

use distribute_values::ReduceOp;
use ndarray::{Array, IxDyn};

use super::call::{Request, check_agreement};
use super::outcome::Outcome;
use super::sliced::{Output, SlicedWork, pieces, reduce_into};
use super::{ReducePlan, SPARES, Shared};
use crate::{CollectiveError, FusionPlan};
use distribute_tensor::kernel::{self, Arith, Stores};
use distribute_tensor::with_dtype;
use distribute_tensor::{DType, Tensor};

impl Shared {
    /// Runs on the last arriver: checks that every replica made the same call, then plans it.
    pub(super) fn plan(&self) -> Outcome {
        let requests: Vec<Request> = self
            .slots
            .iter()
            .map(|slot| {
                slot.lock()
                    .take()
                    .expect("every replica published a request")
            })
            .collect();
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if let Err(error) = check_agreement(&requests, call) {
            return Outcome::Failed(error);
        }
        match self.plan_checked(requests) {
            Ok(outcome) => outcome,
            Err(error) => Outcome::Failed(error),
        }
    }

    fn plan_checked(&self, requests: Vec<Request>) -> Result<Outcome, CollectiveError> {
        let n = self.num_replicas;
        if requests.iter().any(|r| {
            r.tensors()
                .iter()
                .any(|t| t.placement() != distribute_tensor::Placement::Host)
        }) {
            return plan_on_gpu(requests, n);
        }
        match &requests[0] {
            Request::AllReduce(op, first) => {
                let op = *op;
                let dtype = kernel::reduced_dtype(op, first.dtype());
                let bytes = first.num_elements() * dtype.size_in_bytes();
                if !self.splits(bytes) && requests.iter().all(|r| r.tensors()[0].is_contiguous()) {
                    // The common small case: reduced here and now, straight from the requests.
                    let inputs: Vec<&Tensor> = requests.iter().map(|r| &r.tensors()[0]).collect();
                    let (output, ptr) = self.output_buffer(dtype, first.shape(), first);
                    let target = Output {
                        dtype,
                        ptr,
                        stores: Stores::for_output(bytes),
                    };
                    let len = output.num_elements();
                    // SAFETY: `ptr` points at the elements of `output`, just made or taken from
                    // the spares because no one else held it, and no one sees it before the
                    // outcome is published.
                    unsafe { reduce_into(op, &inputs, target, 0, len, n) };
                    return Ok(Outcome::Shared(vec![output]));
                }
                let inputs: Vec<Tensor> = requests
                    .into_iter()
                    .map(|r| match r {
                        Request::AllReduce(_, t) => t,
                        _ => unreachable!("agreement checked"),
                    })
                    .collect();
                let works = vec![self.plan_sliced(op, inputs)?];
                Ok(self.sliced_or_shared(works))
            }
            Request::BatchAllReduce(op, first, plan) => {
                let works = self.plan_batch(*op, first, plan, &requests)?;
                Ok(self.sliced_or_shared(works))
            }
            Request::AllGather(first) => {
                let inputs: Vec<Tensor> = requests.iter().map(|r| r.tensors()[0].clone()).collect();
                Ok(Outcome::Shared(vec![Tensor::concat_rows(
                    first.device(),
                    &inputs,
                )?]))
            }
            Request::ReduceScatter(op, first) => {
                let rows = first.shape().first().copied().unwrap_or(0);
                if first.rank() == 0 || rows % n != 0 {
                    return Err(CollectiveError::InvalidArgument(format!(
                        "reduce_scatter needs a first dimension divisible by the {n} replicas, \
                         got shape {:?}",
                        first.shape()
                    )));
                }
                Ok(Outcome::Scatter {
                    op: *op,
                    inputs: requests.iter().map(|r| r.tensors()[0].clone()).collect(),
                    rows_per_replica: rows / n,
                })
            }
            Request::Broadcast { root, .. } => broadcast_outcome(&requests, *root),
        }
    }

    /// Splits the work among the replicas when it is big enough to pay for the second barrier;
    /// otherwise the last arriver (this thread) does it all now.
    fn sliced_or_shared(&self, works: Vec<SlicedWork>) -> Outcome {
        let bytes: usize = works
            .iter()
            .map(|w| w.len * w.result.dtype().size_in_bytes())
            .sum();
        if self.splits(bytes) {
            let pieces = pieces(&works, self.num_replicas);
            return Outcome::Sliced {
                works,
                pieces,
                next: AtomicUsize::new(0),
            };
        }
        let mut outputs = Vec::with_capacity(works.len());
        for work in works {
            work.reduce_range(0, work.len, self.num_replicas);
            outputs.push(work.result);
        }
        Outcome::Shared(outputs)
    }

    /// Whether outputs of `bytes` bytes in all are reduced by every replica in parallel.
    fn splits(&self, bytes: usize) -> bool {
        matches!(self.config.plan, ReducePlan::Sliced { min_bytes }
            if self.num_replicas > 1 && bytes >= min_bytes)
    }

    /// Lays out the reduction of `inputs` (one per replica) into one output, reusing a spare
    /// output that no one holds any more.
    pub(super) fn plan_sliced(
        &self,
        op: ReduceOp,
        inputs: Vec<Tensor>,
    ) -> Result<SlicedWork, CollectiveError> {
        // An integer `Mean` writes float64 (TF's true division).
        let dtype = kernel::reduced_dtype(op, inputs[0].dtype());
        // Strided inputs (transposed views) are made contiguous once, here.
        let inputs: Vec<Tensor> = inputs.into_iter().map(contiguous).collect();
        let (output, output_ptr) = self.output_buffer(dtype, inputs[0].shape(), &inputs[0]);
        let stores = Stores::for_output(output.size_in_bytes());
        Ok(SlicedWork {
            op,
            inputs,
            len: output.num_elements(),
            result: output,
            output_ptr,
            stores,
        })
    }

    /// Lays out a batch: each bucket of `plan` is one output (reused like any other), and each
    /// tensor of the batch is reduced straight from the replicas' tensors into its part of it,
    /// so nothing is packed (copied) first. Every replica gets the parts, shaped as the
    /// tensors they reduce.
    fn plan_batch(
        &self,
        op: ReduceOp,
        first: &[Tensor],
        plan: &FusionPlan,
        requests: &[Request],
    ) -> Result<Vec<SlicedWork>, CollectiveError> {
        let mut works = Vec::with_capacity(first.len());
        for b in 0..plan.num_buckets() {
            let members = plan.members(b).ok_or_else(|| {
                CollectiveError::Invariant(format!("the fusion plan has no bucket {b}"))
            })?;
            let like = &first[members.start];
            let dtype = kernel::reduced_dtype(op, like.dtype());
            let size = dtype.size_in_bytes();
            let total: usize = first[members.clone()]
                .iter()
                .map(Tensor::num_elements)
                .sum();
            let (bucket, ptr) = self.output_buffer(dtype, &[total], like);
            let stores = Stores::for_output(total * size);
            let mut offset = 0;
            for m in members {
                let len = first[m].num_elements();
                let part = distribute_tensor::flat::reshape(
                    &bucket.slice_rows(offset..offset + len)?,
                    first[m].shape(),
                )?;
                works.push(SlicedWork {
                    op,
                    // Strided inputs (transposed views) are made contiguous once, here.
                    inputs: requests
                        .iter()
                        .map(|r| contiguous(r.tensors()[m].clone()))
                        .collect(),
                    result: part,
                    output_ptr: ptr + offset * size,
                    len,
                    stores,
                });
                offset += len;
            }
        }
        Ok(works)
    }

    /// A writable output of `dtype` shaped and labelled like `like`: a spare of that dtype and
    /// shape that no one else holds, else a new one, which becomes a spare.
    fn output_buffer(&self, dtype: DType, shape: &[usize], like: &Tensor) -> (Tensor, usize) {
        let mut spares = self.spares.lock();
        let found = spares
            .iter()
            .position(|t| t.dtype() == dtype && t.shape() == shape && t.is_sole_holder());
        let (tensor, ptr) = match found {
            // Taken out so that the spare list does not count as a holder.
            Some(i) => {
                let spare = spares.swap_remove(i);
                with_dtype!(dtype, T => writable::<T>(Some(spare), shape, like))
            }
            None => {
                if spares.len() == SPARES {
                    spares.remove(0);
                }
                with_dtype!(dtype, T => writable::<T>(None, shape, like))
            }
        };
        spares.push(tensor.clone());
        (tensor, ptr)
    }
}

/// The outcome of a call where some replica passed a GPU tensor: the last arriver reduces on a
/// GPU (the reduction kernel folds in replica order, as on the host), and every replica copies the
/// result to its own device. Gathers and scatters of GPU tensors are the NCCL backend's.
fn plan_on_gpu(requests: Vec<Request>, n: usize) -> Result<Outcome, CollectiveError> {
    let reduce_bucket = |op: ReduceOp, b: usize| {
        let inputs: Vec<&Tensor> = requests.iter().map(|r| &r.tensors()[b]).collect();
        // On the first GPU input's device, so the result stays in GPU memory: each replica then
        // shares it, copies it to its own GPU, or downloads it for a CPU device.
        let device = inputs
            .iter()
            .find(|t| t.placement() != distribute_tensor::Placement::Host)
            .unwrap_or(&inputs[0])
            .device();
        kernel::reduce_tensors(op, &inputs, device, n)
    };
    match &requests[0] {
        Request::AllReduce(op, _) => Ok(Outcome::Shared(vec![reduce_bucket(*op, 0)?])),
        Request::BatchAllReduce(op, first, _) => Ok(Outcome::Shared(
            (0..first.len())
                .map(|b| reduce_bucket(*op, b))
                .collect::<Result<_, _>>()?,
        )),
        Request::Broadcast { root, .. } => broadcast_outcome(&requests, *root),
        Request::AllGather(_) | Request::ReduceScatter(..) => Err(CollectiveError::Unimplemented(
            "all_gather and reduce_scatter of GPU tensors need the NCCL backend (feature `nccl`); \
             copy the tensors to the host, or use NcclAllReduce"
                .into(),
        )),
    }
}

/// Every replica gets the root's tensor, wherever it lives.
fn broadcast_outcome(requests: &[Request], root: usize) -> Result<Outcome, CollectiveError> {
    let tensor = requests[root].tensors().first().cloned().ok_or_else(|| {
        CollectiveError::InvalidArgument(format!(
            "broadcast: the root replica {root} passed no tensor"
        ))
    })?;
    Ok(Outcome::Shared(vec![tensor]))
}

/// A tensor of `shape` labelled like `like` and the address of its elements: `spare`'s buffer
/// when it is held by nothing else, else a new one.
fn writable<T: Arith>(spare: Option<Tensor>, shape: &[usize], like: &Tensor) -> (Tensor, usize) {
    let reusable = spare
        .and_then(|t| t.array::<T>().ok().cloned())
        .filter(|a| a.is_unique() && a.is_standard_layout());
    let mut array =
        reusable.unwrap_or_else(|| Array::from_elem(IxDyn(shape), T::zero()).into_shared());
    // The array is its buffer's only holder, so this does not copy; the buffer stays where it
    // is for as long as the tensor lives.
    let ptr = array.as_mut_ptr() as usize;
    (Tensor::from_shared_like(array, like), ptr)
}

/// The tensor itself if its elements are contiguous, else a contiguous copy.
pub(super) fn contiguous(tensor: Tensor) -> Tensor {
    fn typed<T: Arith>(tensor: Tensor) -> Tensor {
        let array = tensor.array::<T>().expect("dtype dispatched");
        if array.is_standard_layout() {
            return tensor;
        }
        let owned = array.as_standard_layout().into_owned();
        Tensor::from_shared(tensor.device(), owned.into_shared())
    }
    with_dtype!(tensor.dtype(), T => typed::<T>(tensor))
}

#[cfg(test)]
mod tests {
    use distribute_values::ReduceOp;

    use crate::group::testing::{input, run_on};
    use crate::group::{CollectiveGroup, GroupConfig};
    use distribute_tensor::Tensor;

    #[test]
    fn a_batch_reduces_strided_tensors_into_shared_buckets_without_packing() {
        let group = CollectiveGroup::new(2, GroupConfig::default()).unwrap();
        let out = run_on(&group, |m| {
            let r = m.replica();
            let values: Vec<f32> = input(r, 12).to_vec().unwrap();
            // A transposed view: its elements are not in row-major order in memory.
            let strided = Tensor::from_array(
                &format!("/cpu:{r}"),
                ndarray::Array2::from_shape_vec((3, 4), values)
                    .unwrap()
                    .reversed_axes(),
            );
            let tensors = [input(r, 5), strided.clone(), input(r + 7, 9)];
            let batched = m.batch_all_reduce(ReduceOp::Sum, &tensors).unwrap();
            let single: Vec<Tensor> = tensors
                .iter()
                .map(|t| m.all_reduce(ReduceOp::Sum, t).unwrap())
                .collect();
            (batched, single)
        });
        for (batched, single) in &out {
            for (b, s) in batched.iter().zip(single) {
                assert_eq!(b.shape(), s.shape());
                assert!(b.bitwise_eq(s), "{b} vs {s}");
            }
            // One bucket: the results are consecutive parts of one output.
            let address = |t: &Tensor| t.array::<f32>().unwrap().as_ptr() as usize;
            assert_eq!(address(&batched[2]), address(&batched[0]) + (5 + 12) * 4);
        }
    }
}
