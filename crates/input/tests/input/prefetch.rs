//! Prefetching: bounded look-ahead (back-pressure), deterministic order, and threads that end
//! when the iterator is dropped early.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use distribute_input::{BoxIter, Dataset, DistributedDataset, InputOptions, Prefetch, Source};
use distribute_tensor::Tensor;

use crate::common::{local, steps};

/// Counts items produced, flags a producer that runs too far ahead of the consumer, and sets
/// `dropped` when the producing iterator is dropped (its thread has let go of it).
struct Probe {
    produced: Arc<AtomicUsize>,
    consumed: Arc<AtomicUsize>,
    too_far_ahead: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
    limit: usize,
}

impl Iterator for Probe {
    type Item = Result<usize, distribute_input::InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let n = self.produced.fetch_add(1, Ordering::SeqCst);
        if n > self.consumed.load(Ordering::SeqCst) + self.limit {
            self.too_far_ahead.store(true, Ordering::SeqCst);
        }
        Some(Ok(n))
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

struct Flags {
    produced: Arc<AtomicUsize>,
    consumed: Arc<AtomicUsize>,
    too_far_ahead: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

fn probe(buffer: usize) -> (Probe, Flags) {
    let flags = Flags {
        produced: Arc::default(),
        consumed: Arc::default(),
        too_far_ahead: Arc::default(),
        dropped: Arc::default(),
    };
    // At most `buffer` queued when the producer starts an item, one of which the consumer may
    // have taken but not counted yet.
    let probe = Probe {
        produced: flags.produced.clone(),
        consumed: flags.consumed.clone(),
        too_far_ahead: flags.too_far_ahead.clone(),
        dropped: flags.dropped.clone(),
        limit: buffer + 1,
    };
    (probe, flags)
}

#[test]
fn prefetch_keeps_order_and_applies_back_pressure() {
    for buffer in [1, 2, 5] {
        let (probe, flags) = probe(buffer);
        let mut ahead = Prefetch::new(probe, buffer);
        for expected in 0..500 {
            assert_eq!(ahead.next().unwrap().unwrap(), expected);
            flags.consumed.fetch_add(1, Ordering::SeqCst);
        }
        drop(ahead);
        assert!(
            !flags.too_far_ahead.load(Ordering::SeqCst),
            "buffer {buffer}: ran ahead of the bound"
        );
        assert!(flags.produced.load(Ordering::SeqCst) <= 500 + buffer + 1);
    }
}

#[test]
fn dropping_an_endless_prefetch_early_ends_its_thread() {
    let (probe, flags) = probe(3);
    let mut ahead = Prefetch::new(probe, 3);
    assert_eq!(ahead.next().unwrap().unwrap(), 0);
    drop(ahead);
    // Drop joined the thread, which dropped the endless iterator on its way out.
    assert!(flags.dropped.load(Ordering::SeqCst));
}

/// An endless source of one-row blocks that records when its block iterator is dropped.
struct Endless {
    dropped: Arc<AtomicUsize>,
}

struct EndlessBlocks {
    next: i64,
    dropped: Arc<AtomicUsize>,
}

impl Iterator for EndlessBlocks {
    type Item = Result<Tensor, distribute_input::InputError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next += 1;
        Some(Ok(
            Tensor::from_vec("/cpu:0", &[1], vec![self.next - 1]).unwrap()
        ))
    }
}

impl Drop for EndlessBlocks {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Source for Endless {
    type Item = Tensor;
    fn blocks(&self) -> BoxIter<Tensor> {
        Box::new(EndlessBlocks {
            next: 0,
            dropped: self.dropped.clone(),
        })
    }
    fn describe(&self) -> String {
        "an endless counter".into()
    }
}

#[test]
fn dropping_a_distributed_iterator_early_stops_every_pipeline_thread() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let ds = Dataset::from_source(Endless {
        dropped: dropped.clone(),
    })
    .batch(4, false)
    .unwrap();
    let workers = crate::common::in_graph(3, 2);
    let dist = DistributedDataset::new(
        ds,
        &workers,
        InputOptions {
            prefetch: 2,
            ..InputOptions::default()
        },
    )
    .unwrap();
    let mut it = dist.iter_per_replica();
    for _ in 0..3 {
        assert_eq!(it.next().unwrap().unwrap().values_len(), 6);
    }
    drop(it);
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        3,
        "each pipeline's reader was dropped with its thread"
    );
}

trait ValuesLen {
    fn values_len(&self) -> usize;
}

impl<T> ValuesLen for distribute_values::PerReplica<T> {
    fn values_len(&self) -> usize {
        distribute_values::DistributedValues::num_replicas(self)
    }
}

#[test]
fn prefetch_does_not_change_the_steps() {
    let run = |prefetch| {
        let ds = Dataset::range(103).batch(10, false).unwrap();
        steps(
            &DistributedDataset::new(
                ds,
                &local(3),
                InputOptions {
                    prefetch,
                    ..InputOptions::default()
                },
            )
            .unwrap(),
        )
    };
    let reference = run(0);
    // A prefetch of 2^40 steps once reserved its whole queue up front and the allocator aborted
    // the process; it is a bound, and only what arrives takes memory.
    for prefetch in [1, 2, 8, 1 << 40, usize::MAX] {
        assert_eq!(run(prefetch), reference, "prefetch {prefetch}");
    }
}
