//! [`Deadline`]: when the exchange gives up, from its timeout, and the socket timeouts that keep
//! every wait within it.

use std::time::{Duration, Instant};

/// When the exchange gives up: `None` for a timeout too long to add to the clock (no limit).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Self {
        Self(Instant::now().checked_add(timeout))
    }

    pub(crate) fn passed(&self) -> bool {
        self.0.is_some_and(|deadline| Instant::now() >= deadline)
    }

    /// The time left, `None` without a limit.
    pub(crate) fn left(&self) -> Option<Duration> {
        self.0
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }

    /// A socket timeout for what is left, at least 1 ms (a zero socket timeout is an error);
    /// `None` (block) without a limit.
    pub(crate) fn io_timeout(&self) -> Option<Duration> {
        self.left().map(|left| left.max(Duration::from_millis(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_past_the_clocks_end_is_no_deadline() {
        for timeout in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            let deadline = Deadline::after(timeout);
            assert!(!deadline.passed());
            assert_eq!((deadline.left(), deadline.io_timeout()), (None, None));
        }
        let soon = Deadline::after(Duration::ZERO);
        assert!(soon.passed());
        assert_eq!(soon.io_timeout(), Some(Duration::from_millis(1)));
    }
}
