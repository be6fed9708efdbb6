//! [`FirstFailure`]: which replica's failure came first in a step, recorded by the strategy
//! itself, so the root cause is found whatever error type the step returns.
//!
//! A replica that fails releases the others from their waits (the collectives are aborted, a
//! merge's failure is shared), and they fail too, as consequences. Every failure that releases
//! others is recorded here before the release: a step that returned an error or panicked, before
//! the strategy aborts the rendezvous; replica 0's merge function, before the other replicas
//! read its outcome. So the first replica recorded failed on its own.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The first replica (local index) whose failure released the others, in the current step.
#[derive(Debug)]
pub(crate) struct FirstFailure(AtomicUsize);

const NONE: usize = usize::MAX;

impl FirstFailure {
    pub(crate) fn new() -> Self {
        FirstFailure(AtomicUsize::new(NONE))
    }

    /// Records `replica` unless another failed before it.
    pub(crate) fn record(&self, replica: usize) {
        let _ = self
            .0
            .compare_exchange(NONE, replica, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The replica recorded first, if any.
    pub(crate) fn get(&self) -> Option<usize> {
        Some(self.0.load(Ordering::SeqCst)).filter(|&r| r != NONE)
    }

    /// Before a step: no replica has failed.
    pub(crate) fn reset(&self) {
        self.0.store(NONE, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_record_wins_until_the_next_step() {
        let first = FirstFailure::new();
        assert_eq!(first.get(), None);
        first.record(2);
        first.record(0);
        assert_eq!(first.get(), Some(2));
        first.reset();
        assert_eq!(first.get(), None);
        first.record(0);
        assert_eq!(first.get(), Some(0));
    }
}
