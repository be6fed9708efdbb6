//! [`Prefetch`]: runs an iterator on a background thread, a bounded number of items ahead.
//!
//! One producer thread per prefetched iterator keeps the order deterministic; the bounded
//! channel is the back-pressure. Dropping the consumer disconnects the channel, which wakes a
//! producer blocked on a full buffer, and `Drop` joins the thread, so none outlives it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, bounded};

use crate::InputError;

/// An iterator whose items are computed on a background thread, at most `buffer` ready and one
/// more in the making while the consumer is behind.
///
/// ```
/// use distribute_input::Prefetch;
///
/// let squares = (0..5).map(|i| Ok(i * i));
/// let ahead = Prefetch::new(squares, 2);
/// let got: Vec<i32> = ahead.collect::<Result<_, _>>()?;
/// assert_eq!(got, [0, 1, 4, 9, 16]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub struct Prefetch<T: Send + 'static> {
    rx: Option<Receiver<Result<T, InputError>>>,
    handle: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl<T: Send + 'static> Prefetch<T> {
    /// Starts a thread that runs `iter` and keeps up to `buffer` items (at least 1) ready.
    pub fn new<I>(iter: I, buffer: usize) -> Self
    where
        I: Iterator<Item = Result<T, InputError>> + Send + 'static,
    {
        let (tx, rx) = bounded(buffer.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("distribute-input-prefetch".into())
            .spawn(move || {
                for item in iter {
                    // The consumer is gone: stop before doing more work (reading the next file).
                    if stop_flag.load(Ordering::Relaxed) || tx.send(item).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning a prefetch thread");
        Prefetch {
            rx: Some(rx),
            handle: Some(handle),
            stop,
        }
    }

    fn shut_down(&mut self) -> Result<(), InputError> {
        self.stop.store(true, Ordering::Relaxed);
        self.rx = None;
        match self.handle.take().map(JoinHandle::join) {
            Some(Err(panic)) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".into());
                Err(InputError::PrefetchPanicked(message))
            }
            _ => Ok(()),
        }
    }
}

impl<T: Send + 'static> Iterator for Prefetch<T> {
    type Item = Result<T, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rx = self.rx.as_ref()?;
        match rx.recv() {
            Ok(item) => Some(item),
            // The producer finished (or panicked): report a panic once, then end.
            Err(_) => self.shut_down().err().map(Err),
        }
    }
}

impl<T: Send + 'static> Drop for Prefetch<T> {
    fn drop(&mut self) {
        // A panic was already lost with the data; dropping must not panic in turn.
        let _ = self.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_producer_becomes_an_error() {
        let items = (0..3).map(|i| {
            if i == 2 {
                panic!("bad row {i}");
            }
            Ok(i)
        });
        let got: Vec<_> = Prefetch::new(items, 1).collect();
        assert!(
            matches!(got[..], [Ok(0), Ok(1), Err(InputError::PrefetchPanicked(ref m))] if m == "bad row 2"),
            "{got:?}"
        );
    }
}
