//! [`Workers`]: the one seam between the strategy layer and the worker processes of a job. A
//! cross-process backend (MPI's, in `distribute-mpi`) implements it; strategies, checkpoints and
//! input pipelines use it, knowing nothing of the transport behind it.

use std::fmt;

use crate::CollectiveError;
use distribute_tensor::Tensor;

/// The worker processes of one job, as seen from one of them: who it is, and the few
/// cross-worker calls every layer above the collectives needs besides the tensors' own
/// reductions. Every worker makes the same calls in the same order; each call is agreed on
/// before its bytes move, so a worker that makes another call, or passes another length, fails
/// every worker alike, and a worker that never comes ends the wait at the job's deadline with an
/// error naming it (never a hang).
pub trait Workers: Send + Sync + fmt::Debug {
    /// This process's worker index (0 is the chief).
    fn rank(&self) -> usize;

    /// The number of workers.
    fn size(&self) -> usize;

    /// How many workers (this one included) run on this worker's machine: what a worker shares
    /// the machine's cores with. Known when the workers start, so asking costs nothing.
    fn on_this_host(&self) -> usize;

    /// Every worker's `bytes` (the same length on every worker), in worker order, on every
    /// worker.
    fn exchange(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError>;

    /// The chief's `bytes` on every worker (each passes its own, of the same length): how
    /// values that must start identical everywhere reach every worker.
    fn bytes_from_chief(&self, bytes: &[u8]) -> Result<Vec<u8>, CollectiveError>;

    /// The chief's values of `tensors` on every worker, on the host (each worker passes its
    /// own, of the same dtypes and shapes, agreed before anything moves).
    fn tensors_from_chief(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError>;

    /// The end-of-step agreement: every worker calls it once after each step, with its step's
    /// error message if it failed. `Ok` when every worker's step succeeded, else
    /// [`CollectiveError::WorkerFailed`] naming the first worker that failed on its own: the
    /// same error on every worker.
    fn finish_step(&self, failure: Option<&str>) -> Result<(), CollectiveError>;

    /// Every worker's `bytes`, of any length, in worker order, on every worker: the lengths are
    /// exchanged first, then the bytes padded to the longest (two [`exchange`](Self::exchange)s).
    fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let lengths = self.exchange(&(bytes.len() as u64).to_le_bytes())?;
        let lengths: Vec<usize> = lengths
            .iter()
            .map(|word| {
                let word: [u8; 8] = word.as_slice().try_into().map_err(|_| {
                    CollectiveError::Invariant(
                        "a worker sent a length of other than 8 bytes".into(),
                    )
                })?;
                Ok(u64::from_le_bytes(word) as usize)
            })
            .collect::<Result<_, CollectiveError>>()?;
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let mut padded = bytes.to_vec();
        padded.resize(longest, 0);
        let mut every = self.exchange(&padded)?;
        for (worker, length) in every.iter_mut().zip(lengths) {
            worker.truncate(length);
        }
        Ok(every)
    }

    /// The element-wise sum of every worker's `values` (the same length everywhere), left in
    /// `values` on every worker: how input pipelines agree on the end of their data.
    fn sum(&self, values: &mut [u64]) -> Result<(), CollectiveError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let every = self.exchange(&bytes)?;
        values.fill(0);
        for worker in &every {
            for (sum, word) in values.iter_mut().zip(worker.chunks_exact(8)) {
                let word: [u8; 8] = word.try_into().expect("chunks of 8 bytes");
                *sum += u64::from_le_bytes(word);
            }
        }
        Ok(())
    }

    /// Whether this worker is the chief, which writes checkpoints and summaries.
    fn is_chief(&self) -> bool {
        self.rank() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier, Mutex};

    use super::*;

    /// Workers that are threads of this process, meeting in shared slots: enough for the
    /// provided methods, which are built on `exchange` alone.
    #[derive(Debug)]
    struct Threads {
        rank: usize,
        slots: Arc<(Mutex<Vec<Vec<u8>>>, Barrier)>,
    }

    impl Workers for Threads {
        fn rank(&self) -> usize {
            self.rank
        }

        fn size(&self) -> usize {
            self.slots.0.lock().unwrap().len()
        }

        fn on_this_host(&self) -> usize {
            self.size()
        }

        fn exchange(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
            let (slots, barrier) = &*self.slots;
            slots.lock().unwrap()[self.rank] = bytes.to_vec();
            barrier.wait();
            let every = slots.lock().unwrap().clone();
            barrier.wait();
            Ok(every)
        }

        fn bytes_from_chief(&self, bytes: &[u8]) -> Result<Vec<u8>, CollectiveError> {
            Ok(self.exchange(bytes)?.swap_remove(0))
        }

        fn tensors_from_chief(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
            Ok(tensors.to_vec())
        }

        fn finish_step(&self, _: Option<&str>) -> Result<(), CollectiveError> {
            Ok(())
        }
    }

    #[test]
    fn the_sum_is_element_wise_over_every_worker_on_every_worker() {
        let n = 3;
        let slots = Arc::new((Mutex::new(vec![Vec::new(); n]), Barrier::new(n)));
        let sums: Vec<Vec<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let workers = Threads {
                        rank,
                        slots: Arc::clone(&slots),
                    };
                    s.spawn(move || {
                        let mut values = vec![rank as u64, 1, u64::from(rank == 2) << 40];
                        workers.sum(&mut values).unwrap();
                        assert_eq!(workers.is_chief(), rank == 0);
                        values
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for values in sums {
            assert_eq!(values, [3, 3, 1 << 40]);
        }
    }

    #[test]
    fn bytes_of_every_length_reach_every_worker_in_worker_order() {
        let n = 3;
        let slots = Arc::new((Mutex::new(vec![Vec::new(); n]), Barrier::new(n)));
        let gathered: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let workers = Threads {
                        rank,
                        slots: Arc::clone(&slots),
                    };
                    // Worker r sends r bytes of value r + 1: the chief sends none.
                    s.spawn(move || {
                        workers
                            .all_gather_bytes(&vec![rank as u8 + 1; rank])
                            .unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for every in gathered {
            assert_eq!(every, [vec![], vec![2], vec![3, 3]]);
        }
    }
}
