//! [`Lock`]: the workspace's one mutex policy. A lock whose holder panicked is not poisoned: the
//! next `lock` gets the data as the panicking holder left it.
//!
//! That is sound here because poisoning would tell no one anything new. A panic inside a
//! critical section already fails the step with a typed error: a replica's panic is caught and
//! reported as the strategy's `ReplicaPanicked`, a panic while completing a barrier aborts the
//! rendezvous (`CollectiveError::Aborted`) and every waiter gets that error. Poisoning would add
//! a second, untyped panic at every later lock, in threads that did nothing wrong, and make the
//! object unusable after the step that failed. And what the workspace's locks guard is either
//! reset before the next step (a rendezvous' slots, outcome and abort reason) or valid after any
//! partial update (a value replaced whole, a cache whose entries go in whole, a scratch buffer
//! that every use overwrites, a `()` that only makes callers take turns); a lock for which that
//! is not obvious says why in a comment where it is declared.
//!
//! The exceptions, which keep `std::sync::Mutex` and say so: `distribute-candle`'s per-replica
//! model, which a panic can leave half updated, so a later step is refused with its typed
//! `Error::Poisoned` rather than train a broken copy; and `distribute-pjrt`, which depends on no
//! workspace crate and applies this same policy to its own mutexes. Tidy
//! (`xtask/src/tidy/poison.rs`) keeps every other library file from handling poison itself.

use std::fmt;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, TryLockError, WaitTimeoutResult};
use std::time::Duration;

/// A mutex that a panicking holder does not poison: [`Lock::lock`] always returns the guard.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::Lock;
///
/// let total = Arc::new(Lock::new(0));
/// let adder = Arc::clone(&total);
/// let crashed = std::thread::spawn(move || {
///     *adder.lock() += 1;
///     let _held = adder.lock();
///     panic!("a replica failed while holding the lock");
/// })
/// .join();
/// assert!(crashed.is_err());
/// // No `PoisonError` to unwrap: the value is as the panicking holder left it.
/// *total.lock() += 1;
/// assert_eq!(*total.lock(), 2);
/// ```
#[derive(Default)]
pub struct Lock<T>(Mutex<T>);

impl<T> Lock<T> {
    /// A lock holding `value`; `const`, so a `static` can be one.
    pub const fn new(value: T) -> Self {
        Lock(Mutex::new(value))
    }

    /// The value, whatever a panicking holder left.
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no one else holds the lock and takes it.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, through the exclusive borrow (no locking needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases `guard` (this lock's) while blocked on `condvar`, and takes the lock again when
    /// woken; as [`Condvar::wait`], wake-ups may be spurious.
    pub fn wait<'a>(&self, guard: MutexGuard<'a, T>, condvar: &Condvar) -> MutexGuard<'a, T> {
        condvar.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Lock::wait`] for at most `timeout`; the result says whether it timed out.
    pub fn wait_timeout<'a>(
        &self,
        guard: MutexGuard<'a, T>,
        condvar: &Condvar,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        condvar
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> From<T> for Lock<T> {
    fn from(value: T) -> Self {
        Lock::new(value)
    }
}

impl<T: fmt::Debug> fmt::Debug for Lock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_tuple("Lock");
        match self.0.try_lock() {
            Ok(guard) => out.field(&&*guard),
            Err(TryLockError::Poisoned(poisoned)) => out.field(&&*poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => out.field(&format_args!("<locked>")),
        };
        out.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A lock that a thread panicked while holding, after setting it to 7.
    fn left_by_a_panic() -> Lock<i32> {
        let lock = Arc::new(Lock::new(0));
        let holder = Arc::clone(&lock);
        let joined = std::thread::spawn(move || {
            let mut guard = holder.lock();
            *guard = 7;
            panic!("the holder failed");
        })
        .join();
        assert!(joined.is_err());
        Arc::into_inner(lock).unwrap()
    }

    #[test]
    fn every_access_sees_what_a_panicking_holder_left() {
        let lock = left_by_a_panic();
        assert_eq!(*lock.lock(), 7);
        assert_eq!(format!("{lock:?}"), "Lock(7)");
        let mut lock = lock;
        *lock.get_mut() += 1;
        assert_eq!(lock.into_inner(), 8);
    }

    #[test]
    fn a_held_lock_debugs_without_blocking() {
        let lock = Lock::new(vec![1]);
        let _held = lock.lock();
        assert_eq!(format!("{lock:?}"), "Lock(<locked>)");
    }

    #[test]
    fn waits_on_a_condvar_hand_the_guard_back() {
        let shared = Arc::new((Lock::new(false), Condvar::new()));
        let setter = Arc::clone(&shared);
        let thread = std::thread::spawn(move || {
            *setter.0.lock() = true;
            setter.1.notify_all();
        });
        let (lock, ready) = &*shared;
        let mut guard = lock.lock();
        while !*guard {
            guard = lock.wait(guard, ready);
        }
        thread.join().unwrap();
        let (guard, timeout) = lock.wait_timeout(guard, ready, Duration::from_millis(1));
        assert!(*guard && timeout.timed_out());
    }
}
