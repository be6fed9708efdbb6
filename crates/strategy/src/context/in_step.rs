//! Which threads are running a replica's step: one thread-local count, raised while a
//! [`ReplicaContext`](super::ReplicaContext) lives and suspended while a merge function runs.
//! It changes no behaviour; it makes cross-replica operations reached through a captured
//! strategy fail with [`StrategyError::CrossReplicaInReplica`], which the types cannot prevent.

use std::cell::Cell;

use crate::StrategyError;

thread_local! {
    /// How many replica contexts are alive on this thread, outside a merge function: above zero
    /// while a replica's step runs here. Cross-replica operations read it to refuse being called
    /// from a step through a captured strategy, which the types cannot prevent.
    static REPLICA_STEPS: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread is running a replica's step (and not a merge function): what an adapter
/// asks before an operation that would wait for the step to end (a model's lock, say), to fail
/// with a typed error instead of deadlocking.
///
/// ```
/// use distribute_strategy::{DefaultStrategy, Strategy, in_replica_step};
///
/// let strategy = DefaultStrategy::new()?;
/// assert!(!in_replica_step());
/// let inside = strategy.run(|_, ()| Ok(in_replica_step()), &())?;
/// assert!(*inside.local_results()[0]);
/// # Ok::<(), distribute_strategy::StrategyError>(())
/// ```
pub fn in_replica_step() -> bool {
    REPLICA_STEPS.with(Cell::get) > 0
}

/// Marks this thread as outside any replica's step while it lives (a merge function runs in
/// cross-replica context), restoring the count when dropped.
pub(super) struct CrossReplicaSection {
    saved: usize,
}

impl CrossReplicaSection {
    pub(super) fn enter() -> Self {
        CrossReplicaSection {
            saved: REPLICA_STEPS.with(|steps| steps.replace(0)),
        }
    }
}

impl Drop for CrossReplicaSection {
    fn drop(&mut self) {
        REPLICA_STEPS.with(|steps| steps.set(self.saved));
    }
}

/// Counts one more replica context on this thread.
pub(super) fn enter() {
    REPLICA_STEPS.with(|steps| steps.set(steps.get() + 1));
}

/// Counts one replica context less on this thread.
pub(super) fn leave() {
    REPLICA_STEPS.with(|steps| steps.set(steps.get().saturating_sub(1)));
}

/// Fails with [`StrategyError::CrossReplicaInReplica`] on a thread running a replica's step.
pub(crate) fn refuse_in_replica_step(operation: &'static str) -> Result<(), StrategyError> {
    match in_replica_step() {
        true => Err(StrategyError::CrossReplicaInReplica { operation }),
        false => Ok(()),
    }
}
