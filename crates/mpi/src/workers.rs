//! The worker services of [`MpiAllReduce`]: the cross-worker seam ([`Workers`]) a strategy and
//! input pipelines use (the end-of-step agreement, bytes exchanged or sent from the chief,
//! the chief's tensors), each agreed on before its bytes move.
use crate::agreement::Gathered;
use crate::all_reduce::MpiAllReduce;
use distribute_collectives::backend::{Call, Record, Status, Verdict};
use distribute_collectives::{CollectiveError, Workers};
use distribute_tensor::Tensor;
use distribute_tensor::{bytes::element_bytes_mut as as_bytes_mut, with_dtype};

impl Workers for MpiAllReduce {
    fn rank(&self) -> usize {
        self.shared.world.rank()
    }

    fn size(&self) -> usize {
        self.shared.world.size()
    }

    fn on_this_host(&self) -> usize {
        self.shared.world.on_this_host()
    }

    /// The end-of-step agreement: every worker calls it once after each step, with its step's
    /// error message if it failed. Returns `Ok` when every worker's step succeeded, else
    /// [`CollectiveError::WorkerFailed`] naming the first worker that failed on its own, with its
    /// message — the same error on every worker. A worker still in a collective when another
    /// ends fails that collective and comes here too; ending waits for it (within the deadline).
    fn finish_step(&self, failure: Option<&str>) -> Result<(), CollectiveError> {
        let status = match failure {
            None => Status::Ok,
            Some(_) if self.shared.remote_failure.lock().is_some() => Status::FailedAsConsequence,
            Some(_) => Status::Failed,
        };
        let message = failure.unwrap_or("");
        loop {
            let Gathered {
                verdict, failed, ..
            } = self
                .shared
                .agree_raw(Record::bare(Call::EndStep, status), message, &[]);
            match verdict {
                Verdict::AllEnded => return Ok(()),
                Verdict::WorkerFailed {
                    all_ended: true, ..
                } => {
                    let (worker, message) = failed.expect("a failure carries its message");
                    return Err(CollectiveError::WorkerFailed { worker, message });
                }
                // Some workers are still in a call: they fail it now and come here next.
                Verdict::WorkerFailed { .. } | Verdict::Disagree(_) | Verdict::Agreed => {}
            }
        }
    }

    /// Every worker's `bytes` (the same length on every worker), in worker order: a hook for
    /// what must be agreed between steps or inside one (e.g. an input pipeline's end of data).
    /// Call it from one thread per worker, in the same order relative to the other cross-worker
    /// calls on every worker.
    fn exchange(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let record = Record::bare(Call::Exchange, Status::Ok).with_extra(bytes.len() as i64);
        let shared = &self.shared;
        shared.agree(record, "")?;
        let mut all = vec![0u8; bytes.len() * shared.world.size()];
        shared
            .world
            .all_gather(bytes, &mut all, shared.deadline, &|| {
                "an exchange".to_owned()
            });
        if bytes.is_empty() {
            return Ok(vec![Vec::new(); shared.world.size()]);
        }
        Ok(all.chunks(bytes.len()).map(<[u8]>::to_vec).collect())
    }

    /// Worker 0's values of `tensors` on every worker (each worker passes its own, of the same
    /// dtypes and shapes): how variables start identical although initialisers differ.
    fn tensors_from_chief(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let shared = &self.shared;
        shared.agree(Record::of(Call::ChiefValues, None, &refs), "")?;
        if shared.world.size() == 1 {
            return Ok(tensors.to_vec());
        }
        tensors
            .iter()
            .map(|t| {
                let t = t.to_host()?;
                with_dtype!(t.dtype(), T => {
                    let mut values: Vec<T> = t.to_vec::<T>()?;
                    shared.world.broadcast(0, as_bytes_mut(&mut values), shared.deadline, &|| {
                        "the chief's values".to_owned()
                    });
                    Ok(Tensor::from_vec(t.device(), t.shape(), values)?)
                })
            })
            .collect()
    }

    /// Worker 0's `bytes` on every worker (each passes its own, of the same length): how a
    /// variable of any [`VariableValue`](distribute_values::VariableValue) type starts with the
    /// chief's initial value.
    fn bytes_from_chief(&self, bytes: &[u8]) -> Result<Vec<u8>, CollectiveError> {
        let shared = &self.shared;
        let record = Record::bare(Call::ChiefValues, Status::Ok).with_extra(bytes.len() as i64);
        shared.agree(record, "")?;
        let mut buffer = bytes.to_vec();
        if shared.world.size() > 1 {
            shared
                .world
                .broadcast(0, &mut buffer, shared.deadline, &|| {
                    "the chief's values".to_owned()
                });
        }
        Ok(buffer)
    }
}
