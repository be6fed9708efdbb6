//! Multi-worker rows (issue 14): W worker processes × R local replicas, simulated here as one
//! pipeline per worker id, each replica checked against TensorFlow's `MultiWorkerMirroredStrategy`
//! rules; and the windowed agreement on the end of data, with the workers on threads and a
//! real sum across them standing in for the strategy's all-reduce.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::Duration;

use distribute_input::{
    AutoShardPolicy, Dataset, DistributedDataset, InputError, InputOptions, NpySource,
    PartialBatch, SumAcrossProcesses, distribute_datasets_from_function,
};
use distribute_tensor::Tensor;

use crate::common::{between, ints, r, steps};

const SHAPES: [(usize, usize); 4] = [(2, 1), (2, 2), (3, 1), (3, 2)];
/// Rows of each per-replica chunk.
const CHUNK: usize = 4;
const STEPS: usize = 3;

/// The rows of chunk `c` of global step `s` when a global batch has `global` rows.
fn chunk(s: usize, c: usize, global: usize) -> Vec<i64> {
    let start = (s * global + c * CHUNK) as i64;
    r(start..start + CHUNK as i64)
}

#[test]
fn distribute_dataset_deals_the_chunks_to_the_workers_round_robin() {
    for (workers, replicas) in SHAPES {
        let global = workers * replicas * CHUNK;
        for w in 0..workers {
            let dist = DistributedDataset::new(
                Dataset::range(STEPS * global).batch(global, false).unwrap(),
                &between(workers, w, replicas),
                InputOptions::default(),
            )
            .unwrap();
            assert_eq!(dist.applied_auto_shard(), [AutoShardPolicy::Data]);
            assert!(
                !dist.needs_agreement(),
                "every worker reads the same stream"
            );
            let expected: Vec<Vec<Vec<i64>>> = (0..STEPS)
                .map(|s| {
                    (0..replicas)
                        .map(|rep| chunk(s, rep * workers + w, global))
                        .collect()
                })
                .collect();
            assert_eq!(steps(&dist), expected, "{workers}×{replicas}, worker {w}");
        }
    }
}

/// Worker `cx`'s contiguous part of every global batch of `range(STEPS · global)`, batched per
/// replica: what a multi-worker input function produces.
fn contiguous_part(
    cx: &distribute_input::InputContext,
    global: usize,
) -> Result<Dataset<Tensor>, InputError> {
    let mine = cx.rows_of_global_batch(global)?;
    let rows: Vec<i64> = (0..STEPS)
        .flat_map(|s| mine.clone().map(move |i| (s * global + i) as i64))
        .collect();
    Dataset::from_tensors(Tensor::from_vec("/cpu:0", &[rows.len()], rows)?)?
        .batch(cx.per_replica_batch_size(global)?, false)
}

#[test]
fn datasets_from_function_give_each_worker_its_contiguous_part() {
    for (workers, replicas) in SHAPES {
        let global = workers * replicas * CHUNK;
        for w in 0..workers {
            let dist = distribute_datasets_from_function(
                &between(workers, w, replicas),
                InputOptions::default(),
                |cx| contiguous_part(cx, global),
            )
            .unwrap();
            let expected: Vec<Vec<Vec<i64>>> = (0..STEPS)
                .map(|s| {
                    (0..replicas)
                        .map(|rep| chunk(s, w * replicas + rep, global))
                        .collect()
                })
                .collect();
            assert_eq!(steps(&dist), expected, "{workers}×{replicas}, worker {w}");
        }
    }
}

#[test]
fn with_one_replica_per_worker_both_apis_give_the_single_process_rows() {
    // Worker 0 gets rows 0..128 and worker 1 rows 128..256 of every 256-row step: what one
    // process with 2 replicas gives its replicas.
    let single = DistributedDataset::new(
        Dataset::range(512).batch(256, false).unwrap(),
        &crate::common::local(2),
        InputOptions::default(),
    )
    .unwrap();
    let single = steps(&single);
    assert_eq!(single[0], [r(0..128), r(128..256)]);
    for w in 0..2 {
        let by_data = DistributedDataset::new(
            Dataset::range(512).batch(256, false).unwrap(),
            &between(2, w, 1),
            InputOptions::default(),
        )
        .unwrap();
        let from_fn =
            distribute_datasets_from_function(&between(2, w, 1), InputOptions::default(), |cx| {
                let mine = cx.rows_of_global_batch(256)?;
                let rows: Vec<i64> = (0..2)
                    .flat_map(|s| mine.clone().map(move |i| (s * 256 + i) as i64))
                    .collect();
                Dataset::from_tensors(Tensor::from_vec("/cpu:0", &[rows.len()], rows)?)?
                    .batch(cx.per_replica_batch_size(256)?, false)
            })
            .unwrap();
        let expected: Vec<Vec<Vec<i64>>> = single.iter().map(|s| vec![s[w].clone()]).collect();
        assert_eq!(steps(&by_data), expected, "distribute_dataset, worker {w}");
        assert_eq!(steps(&from_fn), expected, "from_function, worker {w}");
    }
}

/// `files` `.npy` files in `dir`, file `f` holding `rows[f]` values `1000·f + i`.
fn npy_files(dir: &std::path::Path, rows: &[usize]) -> Vec<std::path::PathBuf> {
    rows.iter()
        .enumerate()
        .map(|(f, &n)| {
            let path = dir.join(format!("{f}.npy"));
            let data: Vec<i64> = (0..n as i64).map(|i| 1000 * f as i64 + i).collect();
            distribute_input::npy::write(&path, &Tensor::from_vec("/cpu:0", &[n], data).unwrap())
                .unwrap();
            path
        })
        .collect()
}

#[test]
fn file_sharding_gives_each_worker_its_files_cut_into_chunks() {
    for (workers, replicas) in SHAPES {
        let global = workers * replicas * CHUNK;
        let dir = tempfile::tempdir().unwrap();
        // Two files per worker, a global batch each.
        let files = npy_files(dir.path(), &vec![global; 2 * workers]);
        for w in 0..workers {
            let ds = Dataset::from_source(NpySource::new(&files).unwrap())
                .batch(global, false)
                .unwrap();
            let dist = DistributedDataset::new(
                ds,
                &between(workers, w, replicas),
                InputOptions::default(),
            )
            .unwrap();
            assert_eq!(dist.applied_auto_shard(), [AutoShardPolicy::File]);
            assert!(dist.needs_agreement(), "workers read different files");
            // Worker w's stream: files w and w + W; its replicas take consecutive chunks.
            let stream: Vec<i64> = [w, w + workers]
                .iter()
                .flat_map(|&f| (0..global as i64).map(move |i| 1000 * f as i64 + i))
                .collect();
            let mut chunks = stream.chunks(CHUNK).map(<[i64]>::to_vec);
            let expected: Vec<Vec<Vec<i64>>> = (0..2 * workers)
                .map(|_| (0..replicas).map(|_| chunks.next().unwrap()).collect())
                .collect();
            assert_eq!(steps(&dist), expected, "{workers}×{replicas}, worker {w}");
        }
    }
}

/// A vector sum all-reduce between threads standing in for worker processes, counting its
/// calls.
struct VectorSum {
    parts: Mutex<Vec<Vec<u64>>>,
    barrier: Barrier,
    calls: AtomicUsize,
}

impl VectorSum {
    fn sum(&self, worker: usize, values: &mut [u64]) {
        self.parts.lock().unwrap()[worker] = values.to_vec();
        self.barrier.wait();
        let parts = self.parts.lock().unwrap();
        for (i, v) in values.iter_mut().enumerate() {
            *v = parts.iter().map(|p| p[i]).sum();
        }
        drop(parts);
        if worker == 0 {
            self.calls.fetch_add(1, Ordering::SeqCst);
        }
        // Nobody writes the next round's values before everyone has read these.
        self.barrier.wait();
    }
}

/// What one worker got: its steps and the error it stopped with, if any.
type Run = (Vec<Vec<Vec<i64>>>, Option<InputError>);

/// Each worker's run of `make(worker)` with the windowed agreement, and how many exchanges
/// there were. A worker that waits for the others for more than 30 s fails the test rather
/// than hanging it.
fn run_agreed(
    workers: usize,
    window: usize,
    make: impl Fn(usize) -> DistributedDataset<Tensor> + Send + Sync + 'static,
) -> (Vec<Run>, usize) {
    let sum = Arc::new(VectorSum {
        parts: Mutex::new(vec![Vec::new(); workers]),
        barrier: Barrier::new(workers),
        calls: AtomicUsize::new(0),
    });
    let make = Arc::new(make);
    let (tx, rx) = mpsc::channel();
    for w in 0..workers {
        let (sum, make, tx) = (Arc::clone(&sum), Arc::clone(&make), tx.clone());
        std::thread::spawn(move || {
            let exchange = SumAcrossProcesses::new(move |values| {
                sum.sum(w, values);
                Ok(())
            });
            let dist = make(w).with_sum_across_processes(exchange, window).unwrap();
            let mut steps = Vec::new();
            let mut error = None;
            for step in dist.iter_per_replica() {
                match step {
                    Ok(step) => steps.push(step.into_iter().map(|t| ints(&t)).collect()),
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            let _ = tx.send((w, (steps, error)));
        });
    }
    let mut runs: Vec<Option<Run>> = (0..workers).map(|_| None).collect();
    for _ in 0..workers {
        let (w, run) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("every worker returns: none waits forever for the others");
        runs[w] = Some(run);
    }
    let runs = runs.into_iter().map(Option::unwrap).collect();
    (runs, sum.calls.load(Ordering::SeqCst))
}

/// Worker `w` of `workers` with `lengths[w]` one-row steps of its own, from its input function.
fn own_lengths(
    workers: usize,
    lengths: Vec<usize>,
    options: InputOptions,
) -> impl Fn(usize) -> DistributedDataset<Tensor> + Send + Sync + 'static {
    move |w| {
        let n = lengths[w];
        distribute_datasets_from_function(&between(workers, w, 1), options, move |_| {
            Dataset::range(n).batch(1, false)
        })
        .unwrap()
    }
}

#[test]
fn workers_with_different_lengths_end_on_the_same_step_with_one_exchange_per_window() {
    for (workers, lengths) in [(2, vec![10, 7]), (3, vec![3, 9, 5])] {
        let longest = *lengths.iter().max().unwrap();
        for window in [1, 4, 16] {
            let (runs, exchanges) = run_agreed(
                workers,
                window,
                own_lengths(workers, lengths.clone(), InputOptions::default()),
            );
            for (w, (steps, error)) in runs.iter().enumerate() {
                assert!(error.is_none(), "{error:?}");
                assert_eq!(steps.len(), longest, "worker {w}, window {window}");
                for (s, step) in steps.iter().enumerate() {
                    let expected = if s < lengths[w] {
                        vec![s as i64]
                    } else {
                        vec![]
                    };
                    assert_eq!(step, &[expected], "worker {w} step {s}");
                }
            }
            // A full window leads to another exchange; the first short one is the last.
            assert_eq!(exchanges, longest / window + 1, "window {window}");
        }
    }
}

#[test]
fn drop_remainder_stops_where_the_shortest_worker_ends() {
    let options = InputOptions {
        partial_batch: PartialBatch::DropRemainder,
        ..InputOptions::default()
    };
    let (runs, _) = run_agreed(3, 4, own_lengths(3, vec![6, 9, 5], options));
    for (steps, error) in &runs {
        assert!(error.is_none(), "{error:?}");
        assert_eq!(steps.len(), 5);
    }
}

#[test]
fn file_sharded_workers_with_unequal_files_agree_on_the_end() {
    let dir = tempfile::tempdir().unwrap();
    // Worker 0 reads files 0 and 2 (5 + 5 rows), worker 1 files 1 and 3 (2 + 2): batches of 4
    // cut into 2-row chunks give them 6 and 2 steps alone.
    let files = npy_files(dir.path(), &[5, 2, 5, 2]);
    let (runs, exchanges) = run_agreed(2, 2, move |w| {
        let ds = Dataset::from_source(NpySource::new(&files).unwrap())
            .batch(4, false)
            .unwrap();
        DistributedDataset::new(ds, &between(2, w, 1), InputOptions::default()).unwrap()
    });
    let lengths: Vec<usize> = runs.iter().map(|(s, _)| s.len()).collect();
    assert_eq!(lengths, [6, 6]);
    assert_eq!(runs[0].0[2], [vec![4, 2000]]);
    assert_eq!(runs[0].0[5], [vec![2004]]);
    assert_eq!(runs[1].0[1], [vec![3000, 3001]]);
    assert_eq!(
        runs[1].0[2],
        [Vec::<i64>::new()],
        "worker 1 ran out: empty batches"
    );
    assert_eq!(exchanges, 4);
}

#[test]
fn data_sharded_workers_end_together_without_any_exchange() {
    let (runs, exchanges) = run_agreed(3, 4, |w| {
        DistributedDataset::new(
            Dataset::range(20).batch(6, false).unwrap(),
            &between(3, w, 1),
            InputOptions::default(),
        )
        .unwrap()
    });
    assert_eq!(exchanges, 0);
    let lengths: Vec<usize> = runs.iter().map(|(s, _)| s.len()).collect();
    assert_eq!(lengths, [4, 4, 4]);
    // The last batch has 2 rows for 3 workers: the third gets an empty one.
    assert_eq!(runs[2].0[3], [Vec::<i64>::new()]);
}

#[test]
fn a_failing_worker_stops_every_worker_on_the_same_step() {
    for window in [1, 3, 8] {
        let (runs, _) = run_agreed(3, window, move |w| {
            distribute_datasets_from_function(
                &between(3, w, 1),
                InputOptions::default(),
                move |_| {
                    let source = distribute_input::GeneratorSource::new(move || {
                        (0..6i64).map(move |i| {
                            if w == 2 && i == 4 {
                                return Err(InputError::InvalidOption("row 4 is corrupt".into()));
                            }
                            Ok(Tensor::from_vec("/cpu:0", &[1], vec![i])?)
                        })
                    });
                    Dataset::from_source(source).batch(1, false)
                },
            )
            .unwrap()
        });
        for (w, (steps, error)) in runs.iter().enumerate() {
            assert_eq!(
                steps.len(),
                4,
                "worker {w}, window {window}: the good steps first"
            );
            let error = error.as_ref().expect("every worker stops with an error");
            if w == 2 {
                assert_eq!(error.to_string(), "invalid input option: row 4 is corrupt");
            } else {
                assert!(
                    matches!(error, InputError::OtherProcessFailed { failed: 1 }),
                    "{error}"
                );
            }
        }
    }
}

#[test]
fn a_worker_without_any_batch_cannot_invent_the_structure() {
    let (runs, _) = run_agreed(2, 4, own_lengths(2, vec![3, 0], InputOptions::default()));
    assert!(runs.iter().all(|(steps, _)| steps.is_empty()), "{runs:?}");
    assert!(matches!(
        runs[0].1,
        Some(InputError::OtherProcessFailed { failed: 1 })
    ));
    assert!(matches!(runs[1].1, Some(InputError::NoBatchToImitate)));
    // No data anywhere: a clean end.
    let (runs, exchanges) = run_agreed(2, 4, own_lengths(2, vec![0, 0], InputOptions::default()));
    assert!(
        runs.iter()
            .all(|(steps, error)| steps.is_empty() && error.is_none())
    );
    assert_eq!(exchanges, 1);
}

#[test]
fn an_exchange_error_ends_iteration_with_it() {
    let dist =
        distribute_datasets_from_function(&between(2, 0, 1), InputOptions::default(), |_| {
            Dataset::range(3).batch(1, false)
        })
        .unwrap()
        .with_sum_across_processes(
            SumAcrossProcesses::new(|_| Err(InputError::InvalidOption("the link is down".into()))),
            4,
        )
        .unwrap();
    let mut it = dist.iter_per_replica();
    let err = it.next().unwrap().unwrap_err();
    assert_eq!(err.to_string(), "invalid input option: the link is down");
    assert!(it.next().is_none());
    let no_window =
        distribute_datasets_from_function(&between(2, 0, 1), InputOptions::default(), |_| {
            Dataset::range(3).batch(1, false)
        })
        .unwrap()
        .with_sum_across_processes(SumAcrossProcesses::new(|_| Ok(())), 0);
    assert!(matches!(no_window, Err(InputError::InvalidOption(_))));
}

#[test]
fn masked_iteration_agrees_too_with_zero_masks_for_a_worker_that_ran_out() {
    let options = InputOptions {
        partial_batch: PartialBatch::PadWithMask,
        ..InputOptions::default()
    };
    let sum = Arc::new(VectorSum {
        parts: Mutex::new(vec![Vec::new(); 2]),
        barrier: Barrier::new(2),
        calls: AtomicUsize::new(0),
    });
    let (tx, rx) = mpsc::channel();
    for w in 0..2 {
        let (sum, tx) = (Arc::clone(&sum), tx.clone());
        std::thread::spawn(move || {
            let exchange = SumAcrossProcesses::new(move |values| {
                sum.sum(w, values);
                Ok(())
            });
            let dist = distribute_datasets_from_function(&between(2, w, 1), options, move |_| {
                Dataset::range([3, 1][w]).batch(2, false)
            })
            .unwrap()
            .with_sum_across_processes(exchange, 4)
            .unwrap();
            let masks: Vec<Vec<f32>> = dist
                .iter_masked()
                .into_per_replica()
                .map(|step| {
                    let masked = step.unwrap().into_iter().next().unwrap();
                    masked.mask.to_vec::<f32>().unwrap()
                })
                .collect();
            let _ = tx.send((w, masks));
        });
    }
    let mut got = [Vec::new(), Vec::new()];
    for _ in 0..2 {
        let (w, masks) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("no worker hangs");
        got[w] = masks;
    }
    // Worker 0: [0, 1] then [2] padded; worker 1: [0] padded, then all padding.
    assert_eq!(got[0], [vec![1.0, 1.0], vec![1.0, 0.0]]);
    assert_eq!(got[1], [vec![1.0, 0.0], vec![0.0, 0.0]]);
}
