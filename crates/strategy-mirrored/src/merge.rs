//! The `merge_call` rendezvous of a [`crate::MirroredStrategy`].
//!
//! Every replica deposits its arguments and waits; once all have arrived, replica 0 runs its merge
//! function on everyone's arguments while the others wait again; then every replica reads the
//! shared result. A replica that finishes its step without the merge the others wait in, a replica
//! that fails, or one that never comes (deadline) ends the wait with an error.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use distribute_collectives::CollectiveError;
use distribute_collectives::backend::Rendezvous;
use distribute_strategy::{MergeArgs, MergeResult, StrategyError};
use distribute_values::Lock;

use crate::first_failure::FirstFailure;

/// Replica 0's merge outcome: its result, or the fact that it failed (replica 0 keeps the error).
type Outcome = Result<MergeResult, ()>;

pub(crate) struct MergeRendezvous {
    rendezvous: Rendezvous,
    /// Each replica's arguments, and replica 0's outcome: cleared by `reset` before the step
    /// after a failed one.
    slots: Box<[Lock<Option<MergeArgs>>]>,
    outcome: Lock<Option<Outcome>>,
    /// Replicas that have read the current outcome; the last one clears it.
    consumed: AtomicUsize,
    /// Merge calls each replica has made in the current step.
    calls: Box<[AtomicU64]>,
    /// Set while replica 0 runs a merge function, so a `merge_call` made from inside it is
    /// refused instead of completing the barrier the other replicas wait at.
    merging: AtomicBool,
    /// Where a failed merge function records replica 0, before the others read the outcome.
    first_failure: Arc<FirstFailure>,
}

/// Clears [`MergeRendezvous::merging`] when the merge function returns or panics.
struct Merging<'a>(&'a AtomicBool);

impl Drop for Merging<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl MergeRendezvous {
    pub(crate) fn new(
        num_replicas: usize,
        deadline: Duration,
        first_failure: Arc<FirstFailure>,
    ) -> Result<Self, StrategyError> {
        Ok(MergeRendezvous {
            rendezvous: Rendezvous::new(num_replicas, deadline)?,
            slots: (0..num_replicas).map(|_| Lock::new(None)).collect(),
            outcome: Lock::new(None),
            consumed: AtomicUsize::new(0),
            calls: (0..num_replicas).map(|_| AtomicU64::new(0)).collect(),
            merging: AtomicBool::new(false),
            first_failure,
        })
    }

    /// Before the replicas start a step.
    pub(crate) fn begin_step(&self) {
        self.rendezvous.begin_step();
        for calls in self.calls.iter() {
            calls.store(0, Ordering::SeqCst);
        }
    }

    /// `replica` has finished its step.
    pub(crate) fn finish(&self, replica: usize) {
        // Replicas come from the pool, which has exactly as many threads as the rendezvous has
        // replicas, so the index is always in range.
        let _ = self.rendezvous.finish(replica);
    }

    /// Releases every waiting replica with an error.
    pub(crate) fn abort(&self, reason: &str) {
        self.rendezvous.abort(reason);
    }

    /// Ready for the next step after a failed one; only when no replica is inside a merge.
    pub(crate) fn reset(&self) {
        for slot in self.slots.iter() {
            slot.lock().take();
        }
        self.outcome.lock().take();
        self.consumed.store(0, Ordering::SeqCst);
        self.merging.store(false, Ordering::SeqCst);
        self.rendezvous.reset();
    }

    pub(crate) fn merge(
        &self,
        replica: usize,
        args: MergeArgs,
        merge: &mut dyn FnMut(Vec<MergeArgs>) -> Result<MergeResult, StrategyError>,
    ) -> Result<MergeResult, StrategyError> {
        // Only replica 0 runs merge functions, so only it can be inside one.
        if replica == 0 && self.merging.load(Ordering::SeqCst) {
            return Err(StrategyError::Runtime(
                "merge_call was called from inside a merge function, which already runs in \
                 cross-replica context; use its CrossReplicaContext instead"
                    .into(),
            ));
        }
        let call = self.calls[replica].fetch_add(1, Ordering::SeqCst);
        *self.slots[replica].lock() = Some(args);
        let what = || format!("merge_call #{call}");
        self.rendezvous
            .arrive(replica, &what, || {})
            .map_err(|e| self.explain(e, replica))?;
        let mut own_error = None;
        if replica == 0 {
            let all: Vec<MergeArgs> = self
                .slots
                .iter()
                .map(|slot| {
                    slot.lock()
                        .take()
                        .expect("every replica deposited arguments")
                })
                .collect();
            self.merging.store(true, Ordering::SeqCst);
            let merged = {
                let _merging = Merging(&self.merging);
                merge(all)
            };
            let outcome = match merged {
                Ok(result) => Ok(result),
                Err(error) => {
                    self.first_failure.record(0);
                    own_error = Some(error);
                    Err(())
                }
            };
            *self.outcome.lock() = Some(outcome);
        }
        let waiting = || format!("merge_call #{call} (waiting for replica 0's merge function)");
        self.rendezvous
            .arrive(replica, &waiting, || {})
            .map_err(|e| self.explain(e, replica))?;
        let outcome = {
            let mut slot = self.outcome.lock();
            let outcome = slot.clone().expect("replica 0 stored the merge outcome");
            if self.consumed.fetch_add(1, Ordering::SeqCst) + 1 == self.slots.len() {
                self.consumed.store(0, Ordering::SeqCst);
                slot.take();
            }
            outcome
        };
        match (own_error, outcome) {
            (Some(error), _) => Err(error),
            (None, Ok(result)) => Ok(result),
            (None, Err(())) => Err(StrategyError::PeerFailed { replica: 0 }),
        }
    }

    /// A rendezvous failure in the words of `merge_call`.
    fn explain(&self, error: CollectiveError, replica: usize) -> StrategyError {
        match error {
            CollectiveError::ReplicaFinished { op, finished } => {
                let counts: Vec<String> = finished
                    .iter()
                    .map(|&r| {
                        format!(
                            "replica {r} finished after {} merge_call(s)",
                            self.calls[r].load(Ordering::SeqCst)
                        )
                    })
                    .collect();
                StrategyError::Runtime(format!(
                    "replicas made a different number of merge_call calls: {} while replica \
                     {replica} waits in {op}; every replica must make the same merge_calls",
                    counts.join(", ")
                ))
            }
            other => StrategyError::Collective(other),
        }
    }
}
