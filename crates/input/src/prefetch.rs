//! [`Prefetch`]: runs an iterator on a background thread, a bounded number of items ahead, and
//! lets the consumer make the next item itself when none is ready.
//!
//! Items are made one at a time under the source's lock and queued in order, so the order is
//! the iterator's whatever thread makes them. The queue is bounded (back-pressure): the producer
//! sleeps when it is full and is woken when the consumer has drained it to half, so a fast
//! producer costs one wake-up per half buffer, not one per item. A consumer that finds the queue
//! empty does not wait for the producer to be scheduled (on a busy machine that takes longer than
//! making the item): it makes the item itself. Dropping the consumer stops the producer after
//! the item it is making and joins the thread.
//!
//! This uses a mutex and condition variable rather than a channel: a channel cannot let the
//! consumer take over the source without breaking the order, and it wakes a blocked producer on
//! every receive, which measured as a third of the throughput on in-memory data.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar};
use std::thread::JoinHandle;

use distribute_values::Lock;

use crate::InputError;

type Item<T> = Result<T, InputError>;
type BoxedSource<T> = Box<dyn Iterator<Item = Item<T>> + Send>;

/// The most queue slots reserved before items arrive; a larger buffer grows as it fills.
const MAX_PREALLOCATED: usize = 64;

/// The iterator and whether it has ended (or panicked); only touched under its lock.
struct SourceState<T> {
    iter: BoxedSource<T>,
    done: bool,
}

struct QueueState<T> {
    items: VecDeque<Item<T>>,
    producer_waiting: bool,
    stop: bool,
}

struct Shared<T> {
    /// The source's panics are caught inside its lock (`make`), which ends it.
    source: Lock<SourceState<T>>,
    /// Nothing panics while holding the queue's lock.
    queue: Lock<QueueState<T>>,
    not_full: Condvar,
    buffer: usize,
}

/// Makes the next item; a panic in the iterator becomes an error and ends the source.
fn make<T>(source: &mut SourceState<T>) -> Option<Item<T>> {
    if source.done {
        return None;
    }
    match catch_unwind(AssertUnwindSafe(|| source.iter.next())) {
        Ok(Some(item)) => Some(item),
        Ok(None) => {
            source.done = true;
            None
        }
        Err(panic) => {
            source.done = true;
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string panic payload".into());
            Some(Err(InputError::Panicked(message)))
        }
    }
}

/// An iterator whose items are made on a background thread, up to `buffer` of them (plus the
/// one being made) ahead of the consumer, in the order of the wrapped iterator.
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
    shared: Arc<Shared<T>>,
    handle: Option<JoinHandle<()>>,
}

/// Starts a thread running the given work, as `std::thread::Builder::spawn` does.
type Spawn = fn(Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>>;

impl<T: Send + 'static> Prefetch<T> {
    /// Starts a thread that runs `iter`, keeping up to `buffer` items (at least 1) ready. If
    /// the system cannot start a thread, the consumer makes every item itself: the same items
    /// in the same order, without the prefetching.
    pub fn new<I>(iter: I, buffer: usize) -> Self
    where
        I: Iterator<Item = Item<T>> + Send + 'static,
    {
        Self::with_spawn(iter, buffer, |work| {
            std::thread::Builder::new()
                .name("distribute-input-prefetch".into())
                .spawn(work)
        })
    }

    fn with_spawn<I>(iter: I, buffer: usize, spawn: Spawn) -> Self
    where
        I: Iterator<Item = Item<T>> + Send + 'static,
    {
        let shared = Arc::new(Shared {
            source: Lock::new(SourceState {
                iter: Box::new(iter),
                done: false,
            }),
            queue: Lock::new(QueueState {
                // The buffer is a bound, not a size: a queue sized for `prefetch: 1 << 40`
                // up front would abort in the allocator before the first item.
                items: VecDeque::with_capacity(buffer.clamp(1, MAX_PREALLOCATED)),
                producer_waiting: false,
                stop: false,
            }),
            not_full: Condvar::new(),
            buffer: buffer.max(1),
        });
        let producer = Arc::clone(&shared);
        // Without a producer the queue stays empty and `next` makes each item.
        let handle = spawn(Box::new(move || produce(&producer))).ok();
        Prefetch { shared, handle }
    }
}

fn produce<T>(shared: &Shared<T>) {
    loop {
        {
            let mut queue = shared.queue.lock();
            while queue.items.len() >= shared.buffer && !queue.stop {
                queue.producer_waiting = true;
                queue = shared.queue.wait(queue, &shared.not_full);
            }
            queue.producer_waiting = false;
            if queue.stop {
                return;
            }
        }
        let mut source = shared.source.lock();
        let Some(item) = make(&mut source) else {
            return;
        };
        // Queued before the source is released, so queue order is production order.
        shared.queue.lock().items.push_back(item);
        if source.done {
            return;
        }
    }
}

impl<T: Send + 'static> Iterator for Prefetch<T> {
    type Item = Item<T>;

    fn next(&mut self) -> Option<Item<T>> {
        if let Some(item) = self.pop() {
            return Some(item);
        }
        // Nothing ready: take the source (waiting at most for the item being made) and check
        // again, since the producer may have queued it meanwhile; else make it here.
        let mut source = self.shared.source.lock();
        if let Some(item) = self.pop() {
            return Some(item);
        }
        make(&mut source)
    }
}

impl<T: Send + 'static> Prefetch<T> {
    fn pop(&self) -> Option<Item<T>> {
        let mut queue = self.shared.queue.lock();
        let item = queue.items.pop_front()?;
        if queue.producer_waiting && queue.items.len() <= self.shared.buffer / 2 {
            queue.producer_waiting = false;
            self.shared.not_full.notify_one();
        }
        Some(item)
    }
}

impl<T: Send + 'static> Drop for Prefetch<T> {
    fn drop(&mut self) {
        self.shared.queue.lock().stop = true;
        self.shared.not_full.notify_one();
        if let Some(handle) = self.handle.take() {
            // The producer catches the source's panics, so joining cannot fail on them.
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_source_becomes_an_error_then_the_end() {
        let items = (0..3).map(|i| {
            if i == 2 {
                panic!("bad row {i}");
            }
            Ok(i)
        });
        let got: Vec<_> = Prefetch::new(items, 1).collect();
        assert!(
            matches!(got[..], [Ok(0), Ok(1), Err(InputError::Panicked(ref m))] if m == "bad row 2"),
            "{got:?}"
        );
    }

    #[test]
    fn without_a_thread_the_consumer_makes_every_item() {
        let refuse: Spawn = |_| Err(std::io::Error::other("no threads left"));
        let got: Vec<i64> = Prefetch::with_spawn((0..100).map(Ok), 4, refuse)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
    }

    /// A buffer of 2^40 items once reserved its whole queue up front, and the allocator aborted
    /// the process.
    #[test]
    fn a_huge_buffer_reserves_only_what_arrives() {
        // Without a producer thread nothing is queued, so what is reserved is the pre-allocation.
        let refuse: Spawn = |_| Err(std::io::Error::other("no thread, to look at the queue"));
        let idle = Prefetch::with_spawn((0..10i64).map(Ok), 1 << 40, refuse);
        assert!(idle.shared.queue.lock().items.capacity() <= MAX_PREALLOCATED * 2);
        // With one, the producer runs as far ahead as the data goes; the queue grows as needed.
        let ahead = Prefetch::new((0..1000i64).map(Ok), 1 << 40);
        let got: Vec<i64> = ahead.collect::<Result<_, _>>().unwrap();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn the_consumer_makes_items_itself_in_order() {
        // Whichever thread makes each item, the order is the source's.
        for buffer in [1, 2, 7] {
            let got: Vec<i64> = Prefetch::new((0..2000).map(Ok), buffer)
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(got, (0..2000).collect::<Vec<_>>());
        }
    }
}
