//! How the worker processes of a multi-worker run end a finite dataset on the same step without
//! a round trip per step: [`SumAcrossProcesses`] (which states the rule) and the iterator's
//! windowed agreement. Every process decides from the summed counters alone, so all make the
//! same number of exchanges and stop on the same step.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use distribute_values::PerReplica;

use super::pipeline::LocalStep;
use super::steps::Steps;
use crate::{Batch, InputError, PartialBatch};

/// Steps a process reads ahead between two agreements, unless the strategy sets another.
pub const DEFAULT_AGREEMENT_WINDOW: usize = 32;

/// An integer sum all-reduce across the worker processes of a multi-worker run: every process
/// calls it with a vector of the same length, and on return each holds the element-wise sum of
/// all processes' vectors. A strategy provides it from its cross-process collectives (an
/// `MPI_Allreduce` of `u64`, say); an error it returns ends iteration with that error.
///
/// It is how a finite dataset ends on the same step on every worker without a cross-worker
/// round trip per step (TensorFlow pays one on every `next`):
/// - When every process reads the same stream (`distribute_dataset` sharded by data, or not
///   sharded at all), each cuts the same global batches and so knows alone when the data
///   ends: no exchange at all, the sum is never called.
/// - Otherwise (sharded by file, or one dataset per worker from
///   `distribute_datasets_from_function`) the processes agree once per *window* of steps
///   ([`DistributedDataset::with_sum_across_processes`]): each reads up to `window` steps
///   ahead, and one sum of `2·window + 2` counters (0/1 flags, so exact for any process count)
///   tells every process how many steps some process still has data for, whether one failed
///   and after how many good steps, and whether one never saw a batch. All then run that many
///   steps, a process that ran out handing its replicas empty batches (0 rows), and exchange
///   again only after a full window. Under [`PartialBatch::DropRemainder`] they run only the
///   steps every process has data for. A failure ends every process with an error on the same
///   step: the failed one with its own error, the others with
///   [`InputError::OtherProcessFailed`].
///
/// The price is one small all-reduce per `window` steps and `window` steps of read-ahead.
///
/// [`DistributedDataset::with_sum_across_processes`]: crate::DistributedDataset::with_sum_across_processes
#[derive(Clone)]
pub struct SumAcrossProcesses(Arc<SumFn>);

/// The function a [`SumAcrossProcesses`] holds.
type SumFn = dyn Fn(&mut [u64]) -> Result<(), InputError> + Send + Sync;

impl SumAcrossProcesses {
    /// Wraps `sum`, which must leave in its argument the element-wise sum over all processes.
    pub fn new(sum: impl Fn(&mut [u64]) -> Result<(), InputError> + Send + Sync + 'static) -> Self {
        SumAcrossProcesses(Arc::new(sum))
    }

    fn call(&self, values: &mut [u64]) -> Result<(), InputError> {
        (self.0)(values)
    }
}

impl fmt::Debug for SumAcrossProcesses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SumAcrossProcesses(..)")
    }
}

/// The exchange a dataset's iterators run: the sum and the window.
#[derive(Clone, Debug)]
pub(super) struct AgreementConfig {
    pub(super) sum: SumAcrossProcesses,
    pub(super) window: usize,
}

/// One iterator's side of the agreement.
pub(super) struct Agreement<B: Batch> {
    config: AgreementConfig,
    processes: usize,
    /// Steps read ahead and not yet handed out.
    buffer: VecDeque<LocalStep<B>>,
    /// Steps every process hands out before the next exchange.
    agreed: usize,
    /// The error every process stops with once the agreed steps are handed out.
    pending: Option<InputError>,
    /// Whether the steps agreed are the last (fewer than a window, or a failure).
    last_window: bool,
    finished: bool,
}

/// What the summed counters say.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// Steps every process runs now.
    steps: usize,
    /// Processes that failed, and the good steps before the earliest failure.
    failed: Option<(u64, usize)>,
    /// Processes that never saw a batch, so cannot make empty ones.
    no_structure: u64,
}

/// This process's counters: `window` "has at least j+1 steps" flags, `window + 1` "failed
/// after at most j good steps" flags, and a "never saw a batch" flag. Sums of flags stay exact
/// whatever the process count.
fn report(window: usize, ready: usize, failed: bool, no_structure: bool) -> Vec<u64> {
    let mut counters = vec![0; 2 * window + 2];
    for flag in &mut counters[..ready] {
        *flag = 1;
    }
    if failed {
        for flag in &mut counters[window + ready..=2 * window] {
            *flag = 1;
        }
    }
    counters[2 * window + 1] = u64::from(no_structure);
    counters
}

/// Reads the summed counters of `processes` processes; an error, the same everywhere, when
/// they cannot be a sum of one report per process.
fn decode(
    sums: &[u64],
    window: usize,
    processes: usize,
    partial: PartialBatch,
) -> Result<Outcome, InputError> {
    let n = processes as u64;
    if sums.len() != 2 * window + 2 {
        return Err(InputError::BadExchange {
            sum: sums.len() as u64,
            processes,
        });
    }
    let monotone = |flags: &[u64], rising: bool| {
        flags
            .windows(2)
            .all(|w| if rising { w[0] <= w[1] } else { w[0] >= w[1] })
    };
    let (has, failed) = (&sums[..window], &sums[window..=2 * window]);
    if sums.iter().any(|&s| s > n) || !monotone(has, false) || !monotone(failed, true) {
        let bad = sums.iter().copied().find(|&s| s > n).unwrap_or(0);
        return Err(InputError::BadExchange {
            sum: bad,
            processes,
        });
    }
    let most = has.iter().take_while(|&&s| s > 0).count();
    let least = has.iter().take_while(|&&s| s == n).count();
    let mut steps = if partial == PartialBatch::DropRemainder {
        least
    } else {
        most
    };
    let failed = failed
        .iter()
        .position(|&s| s > 0)
        .map(|first| (failed[window], first));
    if let Some((_, first)) = failed {
        steps = steps.min(first);
    }
    Ok(Outcome {
        steps,
        failed,
        no_structure: sums[2 * window + 1],
    })
}

impl<B: Batch> Agreement<B> {
    pub(super) fn new(config: AgreementConfig, processes: usize) -> Self {
        Agreement {
            config,
            processes,
            buffer: VecDeque::new(),
            agreed: 0,
            pending: None,
            last_window: false,
            finished: false,
        }
    }

    /// The next agreed step, `None` at the end every process reaches together.
    pub(super) fn next(
        &mut self,
        steps: &mut Steps<B>,
    ) -> Option<Result<PerReplica<B>, InputError>> {
        let step = self.next_local(steps)?;
        Some(step.and_then(|step| steps.per_replica(step)))
    }

    /// [`next`](Self::next) before the batches become a `PerReplica`.
    pub(super) fn next_local(
        &mut self,
        steps: &mut Steps<B>,
    ) -> Option<Result<LocalStep<B>, InputError>> {
        loop {
            if self.agreed > 0 {
                self.agreed -= 1;
                return Some(match self.buffer.pop_front() {
                    Some(step) => Ok(step),
                    // This process ran out while another still has data (IN-26).
                    None => steps.empty_step(),
                });
            }
            if let Some(error) = self.pending.take() {
                self.finish(steps);
                return Some(Err(error));
            }
            if self.finished || self.last_window {
                self.finish(steps);
                return None;
            }
            if let Err(error) = self.exchange(steps) {
                self.finish(steps);
                return Some(Err(error));
            }
        }
    }

    fn finish(&mut self, steps: &mut Steps<B>) {
        self.finished = true;
        self.buffer.clear();
        steps.stop();
    }

    /// Reads ahead up to a window, sums the reports and sets what follows.
    fn exchange(&mut self, steps: &mut Steps<B>) -> Result<(), InputError> {
        let window = self.config.window;
        let mut own_failure = None;
        while self.buffer.len() < window {
            match steps.next_step() {
                Some(Ok(step)) => self.buffer.push_back(step),
                Some(Err(e)) => {
                    own_failure = Some(e);
                    break;
                }
                None => break,
            }
        }
        let no_structure = !steps.has_structure();
        let mut counters = report(
            window,
            self.buffer.len(),
            own_failure.is_some(),
            no_structure,
        );
        self.config.sum.call(&mut counters)?;
        let outcome = decode(&counters, window, self.processes, steps.partial)?;
        self.agreed = outcome.steps;
        self.last_window = outcome.steps < window || outcome.failed.is_some();
        if outcome.steps > 0 && outcome.no_structure > 0 {
            self.agreed = 0;
            return Err(if no_structure {
                InputError::NoBatchToImitate
            } else {
                InputError::OtherProcessFailed {
                    failed: outcome.no_structure as usize,
                }
            });
        }
        if let Some((failed, _)) = outcome.failed {
            self.pending = Some(own_failure.unwrap_or(InputError::OtherProcessFailed {
                failed: failed as usize,
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_sum_into_counts_of_processes() {
        let window = 3;
        // Process A has 3 steps, B 1 and then fails, C none and never saw a batch.
        let a = report(window, 3, false, false);
        let b = report(window, 1, true, false);
        let c = report(window, 0, false, true);
        assert_eq!(a, [1, 1, 1, 0, 0, 0, 0, 0]);
        assert_eq!(b, [1, 0, 0, 0, 1, 1, 1, 0]);
        let sums: Vec<u64> = (0..a.len()).map(|i| a[i] + b[i] + c[i]).collect();
        let outcome = decode(&sums, window, 3, PartialBatch::KeepUneven).unwrap();
        // B's failure after 1 good step caps everyone at 1 step.
        assert_eq!(
            outcome,
            Outcome {
                steps: 1,
                failed: Some((1, 1)),
                no_structure: 1
            }
        );
    }

    #[test]
    fn the_longest_process_sets_the_steps_unless_remainders_are_dropped() {
        let window = 4;
        let sums: Vec<u64> = report(window, 4, false, false)
            .iter()
            .zip(report(window, 2, false, false))
            .map(|(a, b)| a + b)
            .collect();
        let keep = decode(&sums, window, 2, PartialBatch::KeepUneven).unwrap();
        let drop = decode(&sums, window, 2, PartialBatch::DropRemainder).unwrap();
        assert_eq!((keep.steps, drop.steps), (4, 2));
        assert_eq!(keep.failed, None);
    }

    #[test]
    fn sums_that_no_processes_could_report_are_refused() {
        let window = 2;
        for bad in [
            vec![3, 0, 0, 0, 0, 0], // more processes than there are
            vec![0, 1, 0, 0, 0, 0], // a second step without a first
            vec![0, 0, 1, 0, 0, 0], // failed, then not failed
            vec![0, 0, 0, 0, 0],    // the wrong length
        ] {
            assert!(
                matches!(
                    decode(&bad, window, 2, PartialBatch::KeepUneven),
                    Err(InputError::BadExchange { processes: 2, .. })
                ),
                "{bad:?}"
            );
        }
    }
}
