//! [`DistributedIterator::next_across_processes`]: the step exchange through which processes
//! that feed replicas of the same steps all see the end of data, or a failure, on the same
//! step (TF's `get_next_as_optional`, IN-29).

use distribute_values::PerReplica;

use super::iterator::PerReplicaIterator;
use crate::{Batch, InputError, PartialBatch};

/// What this process has for a step of `next_across_processes`, decided before the exchange.
enum LocalState<B: Batch> {
    /// A step with data.
    Data(PerReplica<B>),
    /// Out of data, with empty batches ready in case other processes have some.
    Empty(PerReplica<B>),
    /// Out of data without ever having seen a batch, so it cannot make empty ones.
    NoStructure,
    /// Reading the step failed.
    Failed(InputError),
}

impl<B: Batch> LocalState<B> {
    /// This process's report, in a code whose sum over `n` processes counts each state: 1 for
    /// data, `n + 1` for no structure, `(n + 1)²` for a failure, 0 for none.
    fn report(&self, n: u64) -> u64 {
        match self {
            LocalState::Data(_) => 1,
            LocalState::Empty(_) => 0,
            LocalState::NoStructure => n + 1,
            LocalState::Failed(_) => (n + 1) * (n + 1),
        }
    }
}

/// How many processes reported each state on a step: the sum of the reports, decoded.
struct Tally {
    with_data: u64,
    no_structure: u64,
    failed: u64,
}

impl Tally {
    /// Decodes `sum` over `n` processes; an error, the same on every process since it depends
    /// on the sum alone, if it counts more than `n` reports.
    fn decode(sum: u64, n: u64) -> Result<Tally, InputError> {
        let base = n + 1;
        let tally = Tally {
            with_data: sum % base,
            no_structure: (sum / base) % base,
            failed: sum / (base * base),
        };
        if tally.with_data + tally.no_structure + tally.failed > n {
            return Err(InputError::BadExchange {
                sum,
                processes: n as usize,
            });
        }
        Ok(tally)
    }
}

impl<B: Batch> PerReplicaIterator<B> {
    /// The next step when other processes feed other replicas of the same steps (one process
    /// per worker), so that all of them see the end of data, or a failure, on the same step
    /// (TF's `get_next_as_optional`, IN-29).
    ///
    /// Every process calls `sum_across_processes` on every step with its report, and it must
    /// return the exact sum of all processes' reports (an integer sum all-reduce; with `n`
    /// processes a report is at most `(n + 1)²`, so a float32 sum is exact up to 250 processes). A report
    /// says whether the process has data, has none, or failed, so on every process:
    /// - if any process failed, the call returns an error: the failed process's own, and
    ///   [`InputError::OtherProcessFailed`] on the others;
    /// - else if none has data, `Ok(None)`, the end; under [`PartialBatch::DropRemainder`] also
    ///   when not every process has data;
    /// - else `Ok(Some(step))`, in which a process that has run out gives its replicas empty
    ///   batches (an error, [`InputError::NoBatchToImitate`], on a process that never had a
    ///   batch to copy the structure of, and `OtherProcessFailed` on the others).
    ///
    /// After it has returned `Ok(None)` or an error it returns `Ok(None)` without calling
    /// `sum_across_processes`: the other processes have stopped too.
    ///
    /// ```
    /// use distribute_input::{Dataset, DistributedDataset, InputError, InputOptions, InputWorkers};
    ///
    /// // Worker 1 of 2, sharded by data: `range(3).batch(2)` gives it [1], then nothing.
    /// let workers = InputWorkers::worker_of_cluster(2, 1, "/job:worker/task:1", ["/job:worker/task:1/cpu:0"])?;
    /// let dist = DistributedDataset::new(Dataset::range(3).batch(2, false)?, &workers, InputOptions::default())?;
    /// let mut it = dist.iter_per_replica();
    /// // Worker 0 has data on both steps (it gets [0], then [2]) and reports 1 each time.
    /// let first = it.next_across_processes(|mine| Ok::<_, InputError>(mine + 1))?.unwrap();
    /// let second = it.next_across_processes(|mine| Ok::<_, InputError>(mine + 1))?.unwrap();
    /// assert_eq!(first.into_iter().next().unwrap().to_vec::<i64>()?, [1]);
    /// assert_eq!(second.into_iter().next().unwrap().shape(), [0]);
    /// // Then neither has data.
    /// assert!(it.next_across_processes(|mine| Ok::<_, InputError>(mine))?.is_none());
    /// # Ok::<(), InputError>(())
    /// ```
    pub fn next_across_processes<E: From<InputError>>(
        &mut self,
        sum_across_processes: impl FnOnce(u64) -> Result<u64, E>,
    ) -> Result<Option<PerReplica<B>>, E> {
        if self.finished {
            return Ok(None);
        }
        self.finished = true;
        // Everything that can fail here happens before the exchange, so that a failure is
        // reported to the other processes rather than leaving them waiting in the next one.
        let local = self.local_state();
        let n = self.num_processes as u64;
        let mine = local.report(n);
        let tally = Tally::decode(sum_across_processes(mine)?, n)?;
        if tally.failed > 0 {
            return Err(match local {
                LocalState::Failed(e) => e,
                _ => InputError::OtherProcessFailed {
                    failed: tally.failed as usize,
                },
            }
            .into());
        }
        if tally.with_data == 0
            || (self.steps.partial == PartialBatch::DropRemainder && tally.with_data < n)
        {
            return Ok(None);
        }
        match local {
            LocalState::Data(step) | LocalState::Empty(step) if tally.no_structure == 0 => {
                self.finished = false;
                Ok(Some(step))
            }
            LocalState::Data(_) | LocalState::Empty(_) => Err(InputError::OtherProcessFailed {
                failed: tally.no_structure as usize,
            }
            .into()),
            LocalState::NoStructure => Err(InputError::NoBatchToImitate.into()),
            // Only reached when the sum leaves out this process's own report.
            LocalState::Failed(e) => Err(e.into()),
        }
    }

    fn local_state(&mut self) -> LocalState<B> {
        // A resumed iteration's skipped steps: every process skips as many, so no exchange.
        while self.skip > 0 {
            self.skip -= 1;
            match self.steps.next_step() {
                Some(Ok(_)) => {}
                Some(Err(e)) => return LocalState::Failed(e),
                None => self.skip = 0,
            }
        }
        let (step, has_data) = match self.steps.next_step() {
            Some(Ok(step)) => (step, true),
            Some(Err(e)) => return LocalState::Failed(e),
            None => match self.steps.empty_step() {
                Ok(step) => (step, false),
                Err(InputError::NoBatchToImitate) => return LocalState::NoStructure,
                Err(e) => return LocalState::Failed(e),
            },
        };
        match self.steps.per_replica(step) {
            Ok(step) if has_data => LocalState::Data(step),
            Ok(step) => LocalState::Empty(step),
            Err(e) => LocalState::Failed(e),
        }
    }
}
