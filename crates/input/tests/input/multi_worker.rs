//! 6.4 and 6.5: several input workers, in-graph (one process feeds all) and between-graph (one
//! process per worker), with and without auto-sharding.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use distribute_input::{
    AutoShardPolicy, Dataset, DistributedDataset, InputError, InputOptions, PartialBatch,
    distribute_datasets_from_function,
};
use distribute_tensor::Tensor;
use distribute_values::DistributedValues;

use crate::common::{between, distribute, in_graph, ints, r, steps, whole};

fn off(options: InputOptions) -> InputOptions {
    InputOptions {
        auto_shard: AutoShardPolicy::Off,
        ..options
    }
}

/// Each worker's steps in a between-graph cluster of `workers` × `per_worker`.
fn per_worker(
    workers: usize,
    per_worker: usize,
    n: usize,
    b: usize,
    drop: bool,
    options: InputOptions,
) -> Vec<Vec<Vec<Vec<i64>>>> {
    (0..workers)
        .map(|w| steps(&distribute(n, b, drop, &between(workers, w, per_worker), options).unwrap()))
        .collect()
}

#[test]
fn in_21_auto_shard_gives_each_worker_every_other_element() {
    let got = steps(&distribute(8, 2, false, &in_graph(2, 1), InputOptions::default()).unwrap());
    assert_eq!(got, [[[0], [1]], [[2], [3]], [[4], [5]], [[6], [7]]]);
    let elementwise = steps(&distribute(8, 1, false, &in_graph(2, 1), whole()).unwrap());
    assert_eq!(elementwise, got);
}

#[test]
fn in_22_no_sharding_gives_every_worker_all_data() {
    let expected: Vec<Vec<Vec<i64>>> = (0..4).map(|i| vec![vec![i], vec![i]]).collect();
    assert_eq!(
        steps(&distribute(4, 1, false, &in_graph(2, 1), off(whole())).unwrap()),
        expected
    );
    let from_fn =
        distribute_datasets_from_function(&in_graph(2, 1), InputOptions::default(), |_| {
            Dataset::range(4).batch(1, false)
        })
        .unwrap();
    assert_eq!(steps(&from_fn), expected);
}

#[test]
fn in_23_two_workers_two_devices() {
    let got = steps(&distribute(8, 1, false, &in_graph(2, 2), whole()).unwrap());
    assert_eq!(got, [[[0], [2], [1], [3]], [[4], [6], [5], [7]]]);
    let got = steps(&distribute(4, 1, false, &in_graph(2, 2), whole()).unwrap());
    assert_eq!(got, [[[0], [2], [1], [3]]]);
    // Global batches of 4 split over the 4 replicas give the same placement.
    assert_eq!(
        steps(&distribute(8, 4, false, &in_graph(2, 2), InputOptions::default()).unwrap()),
        [[[0], [2], [1], [3]], [[4], [6], [5], [7]]]
    );
    let from_fn =
        distribute_datasets_from_function(&in_graph(2, 2), InputOptions::default(), |_| {
            Dataset::range(4).batch(1, false)
        })
        .unwrap();
    assert_eq!(
        steps(&from_fn),
        [[[0], [1], [0], [1]], [[2], [3], [2], [3]]]
    );
}

fn squares(n: i64) -> Dataset<(Tensor, Tensor)> {
    let i: Vec<i64> = (0..n).collect();
    let sq: Vec<i64> = i.iter().map(|x| x * x).collect();
    Dataset::from_tensors((
        Tensor::from_vec("/cpu:0", &[n as usize], i).unwrap(),
        Tensor::from_vec("/cpu:0", &[n as usize], sq).unwrap(),
    ))
    .unwrap()
}

fn pairs(dist: &DistributedDataset<(Tensor, Tensor)>) -> Vec<Vec<(Vec<i64>, Vec<i64>)>> {
    dist.iter_per_replica()
        .map(|s| {
            s.unwrap()
                .values()
                .iter()
                .map(|(a, b)| (ints(a), ints(b)))
                .collect()
        })
        .collect()
}

#[test]
fn in_24_tuples_across_workers() {
    let dist = DistributedDataset::new(
        squares(4).batch(2, false).unwrap(),
        &in_graph(2, 1),
        InputOptions::default(),
    )
    .unwrap();
    assert_eq!(
        pairs(&dist),
        [
            vec![(vec![0], vec![0]), (vec![1], vec![1])],
            vec![(vec![2], vec![4]), (vec![3], vec![9])]
        ]
    );
    let from_fn =
        distribute_datasets_from_function(&in_graph(2, 1), InputOptions::default(), |_| {
            squares(3).batch(1, false)
        })
        .unwrap();
    let expected: Vec<Vec<(Vec<i64>, Vec<i64>)>> =
        (0..3).map(|i| vec![(vec![i], vec![i * i]); 2]).collect();
    assert_eq!(pairs(&from_fn), expected);
}

#[test]
fn in_25_uneven_batches_each_device_takes_whole_batches() {
    let got = steps(&distribute(9, 2, false, &in_graph(2, 2), whole()).unwrap());
    assert_eq!(
        got,
        [
            vec![r(0..2), r(4..6), r(2..4), r(6..8)],
            vec![vec![8], vec![], vec![], vec![]]
        ]
    );
    let from_fn =
        distribute_datasets_from_function(&in_graph(2, 2), InputOptions::default(), |_| {
            Dataset::range(9).batch(2, false)
        })
        .unwrap();
    assert_eq!(
        steps(&from_fn),
        [
            vec![r(0..2), r(2..4), r(0..2), r(2..4)],
            vec![r(4..6), r(6..8), r(4..6), r(6..8)],
            vec![vec![8], vec![], vec![8], vec![]]
        ]
    );
}

#[test]
fn in_26_a_worker_that_ran_out_contributes_empty_batches() {
    let dist = distribute_datasets_from_function(&in_graph(2, 2), InputOptions::default(), |cx| {
        Dataset::range(8 + cx.input_pipeline_id()).batch(2, false)
    })
    .unwrap();
    assert_eq!(
        steps(&dist),
        [
            vec![r(0..2), r(2..4), r(0..2), r(2..4)],
            vec![r(4..6), r(6..8), r(4..6), r(6..8)],
            vec![vec![], vec![], vec![8], vec![]]
        ]
    );
}

#[test]
fn in_27_between_graph_uneven_batches() {
    let sharded = per_worker(2, 1, 5, 2, false, whole());
    assert_eq!(
        sharded,
        [
            vec![vec![r(0..2)], vec![vec![4]]],
            vec![vec![r(2..4)], vec![vec![]]]
        ]
    );
    let unsharded = per_worker(2, 1, 5, 2, false, off(whole()));
    let all = vec![vec![r(0..2)], vec![r(2..4)], vec![vec![4]]];
    assert_eq!(unsharded, [all.clone(), all]);
}

#[test]
fn in_30_multi_worker_split_of_uneven_batches() {
    let got = per_worker(2, 1, 9, 2, false, InputOptions::default());
    assert_eq!(got[0], [[[0]], [[2]], [[4]], [[6]], [[8]]]);
    assert_eq!(got[1][..4], [[[1]], [[3]], [[5]], [[7]]]);
    assert_eq!(
        got[1][4],
        [Vec::<i64>::new()],
        "worker 1 gets an empty batch on the last step"
    );
    let dropped = per_worker(2, 1, 9, 2, true, InputOptions::default());
    assert_eq!(
        dropped,
        [[[[0]], [[2]], [[4]], [[6]]], [[[1]], [[3]], [[5]], [[7]]]]
    );
}

#[test]
fn in_31_two_workers_four_replicas() {
    let got = per_worker(2, 2, 15, 4, false, InputOptions::default());
    assert_eq!(got[0], [[[0], [2]], [[4], [6]], [[8], [10]], [[12], [14]]]);
    assert_eq!(
        got[1],
        [
            vec![vec![1], vec![3]],
            vec![vec![5], vec![7]],
            vec![vec![9], vec![11]],
            vec![vec![13], vec![]]
        ]
    );
    let dropped = per_worker(2, 2, 15, 4, true, InputOptions::default());
    assert_eq!(dropped[0].len(), 3);
    assert_eq!(dropped[1].len(), 3);
    assert_eq!(dropped[1][2], [[9], [11]]);
}

#[test]
fn in_32_last_partial_batch_across_workers() {
    let got = per_worker(2, 1, 14, 8, false, InputOptions::default());
    assert_eq!(
        (got[0][1].clone(), got[1][1].clone()),
        (vec![r(8..11)], vec![r(11..14)])
    );
    let from_fn: Vec<Vec<Vec<Vec<i64>>>> = (0..2)
        .map(|w| {
            let dist = distribute_datasets_from_function(
                &between(2, w, 1),
                InputOptions::default(),
                |cx| {
                    Dataset::range(14)
                        .batch(cx.per_replica_batch_size(8)?, false)?
                        .shard(cx.num_input_pipelines(), cx.input_pipeline_id())
                },
            )
            .unwrap();
            steps(&dist)
        })
        .collect();
    assert_eq!(
        (from_fn[0][1].clone(), from_fn[1][1].clone()),
        (vec![r(8..12)], vec![r(12..14)])
    );
}

#[test]
fn in_33_dataset_from_function_sums_per_worker() {
    let sums: Vec<i64> = (0..2)
        .map(|w| {
            let dist = distribute_datasets_from_function(
                &between(2, w, 1),
                InputOptions::default(),
                |cx| {
                    let per_replica = cx.per_replica_batch_size(10)?;
                    Dataset::range(100)
                        .repeat(2)?
                        .batch(per_replica, false)?
                        .shard(cx.num_input_pipelines(), cx.input_pipeline_id())
                },
            )
            .unwrap();
            ints(&dist.iter_per_replica().next().unwrap().unwrap().values()[0])
                .iter()
                .sum()
        })
        .collect();
    assert_eq!(sums, [10, 35]);
}

#[test]
fn in_34_unsharded_workers_split_each_global_batch_legacy_style() {
    // Each worker reads range(12).batch(8) whole and takes every piece of its split. This is
    // TF's legacy rule (4 steps); current TF gives 3, a departure the crate docs describe.
    let got = per_worker(2, 1, 12, 8, false, off(InputOptions::default()));
    let expected = vec![
        vec![r(0..4)],
        vec![r(4..8)],
        vec![r(8..10)],
        vec![r(10..12)],
    ];
    assert_eq!(got, [expected.clone(), expected]);
    // TF's 3 steps: rebatch into the per-replica sizes and hand out whole batches.
    for w in 0..2 {
        let sizes = distribute_input::batch_sizes_for_worker(8, 2, 1, w).unwrap();
        let ds = Dataset::range(12).batch(8, false).unwrap();
        let ds = ds.rebatch(sizes, false).unwrap();
        let dist = DistributedDataset::new(ds, &between(2, w, 1), off(whole())).unwrap();
        assert_eq!(steps(&dist), [vec![r(0..4)], vec![r(4..8)], vec![r(8..12)]]);
    }
}

#[test]
fn in_35_data_sharding_with_an_indivisible_batch() {
    let got = per_worker(
        2,
        1,
        8,
        3,
        false,
        InputOptions {
            auto_shard: AutoShardPolicy::Data,
            ..InputOptions::default()
        },
    );
    assert_eq!(got[0], [vec![r(0..2)], vec![r(3..5)], vec![vec![6]]]);
    assert_eq!(got[1], [[[2]], [[5]], [[7]]]);
    for (step, (w0, w1)) in got[0].iter().zip(&got[1]).enumerate() {
        let total = w0[0].len() + w1[0].len();
        assert_eq!(total, if step < 2 { 3 } else { 2 });
    }
}

#[test]
fn in_36_auto_versus_off() {
    let auto = per_worker(2, 1, 4, 2, false, InputOptions::default());
    assert_eq!(auto, [[[[0]], [[2]]], [[[1]], [[3]]]]);
    let off = per_worker(2, 1, 4, 2, false, off(InputOptions::default()));
    let all: Vec<Vec<Vec<i64>>> = (0..4).map(|i| vec![vec![i]]).collect();
    assert_eq!(off, [all.clone(), all]);
}

#[test]
fn in_40_sum_of_squares_over_two_workers() {
    let squares: Vec<i64> = (0..10).map(|i| i * i).collect();
    let ds = Dataset::from_tensors(Tensor::from_vec("/cpu:0", &[10], squares).unwrap())
        .unwrap()
        .batch(4, false)
        .unwrap();
    let dist = DistributedDataset::new(ds, &in_graph(2, 1), InputOptions::default()).unwrap();
    let total: i64 = steps(&dist).into_iter().flatten().flatten().sum();
    assert_eq!(total, 285);
}

#[test]
fn in_51_unsharded_input_functions_see_the_same_data() {
    let two = distribute_datasets_from_function(
        &crate::common::local(2),
        InputOptions::default(),
        |_| Dataset::range(10).batch(1, false),
    )
    .unwrap();
    let expected: Vec<Vec<Vec<i64>>> = (0..5).map(|k| vec![vec![2 * k], vec![2 * k + 1]]).collect();
    assert_eq!(steps(&two), expected);
    for gpus in [1, 2, 3] {
        let dist =
            distribute_datasets_from_function(&in_graph(2, gpus), InputOptions::default(), |_| {
                Dataset::range(100).batch(1, false)
            })
            .unwrap();
        let got = steps(&dist);
        let first: Vec<i64> = (0..gpus as i64).collect();
        let step0: Vec<i64> = got[0].iter().flatten().copied().collect();
        assert_eq!(
            step0,
            [first.clone(), first].concat(),
            "both workers see the same data"
        );
    }
}

#[test]
fn drop_remainder_stops_in_graph_at_the_first_incomplete_step() {
    let options = InputOptions {
        partial_batch: PartialBatch::DropRemainder,
        ..InputOptions::default()
    };
    let dist = distribute_datasets_from_function(&in_graph(2, 1), options, |cx| {
        Dataset::range(4 + 2 * cx.input_pipeline_id()).batch(2, false)
    })
    .unwrap();
    assert_eq!(steps(&dist), [[r(0..2), r(0..2)], [r(2..4), r(2..4)]]);
}

#[test]
fn in_38_reshuffle_each_iteration_or_not() {
    let epoch =
        |ds: &Dataset<Tensor>| -> Vec<i64> { ds.iter().flat_map(|b| ints(&b.unwrap())).collect() };
    let reshuffled = Dataset::range(50)
        .shuffle(7, true)
        .unwrap()
        .batch(8, false)
        .unwrap();
    let (a, b) = (epoch(&reshuffled), epoch(&reshuffled));
    assert_ne!(a, b, "reshuffled epochs differ");
    for e in [&a, &b] {
        let mut sorted = e.clone();
        sorted.sort();
        assert_eq!(sorted, r(0..50), "an epoch is a permutation");
        assert_ne!(*e, r(0..50));
    }
    let fixed = Dataset::range(50)
        .shuffle(7, false)
        .unwrap()
        .batch(8, false)
        .unwrap();
    assert_eq!(
        epoch(&fixed),
        epoch(&fixed),
        "without reshuffling epochs are equal"
    );
    assert_eq!(epoch(&fixed), a, "the same seed gives the same first order");
    assert!(
        Dataset::range(4)
            .batch(2, false)
            .unwrap()
            .shuffle(1, true)
            .is_err()
    );
}

#[test]
fn in_38_shuffled_data_shards_consistently_across_pipelines() {
    let ds = Dataset::range(40)
        .shuffle(3, true)
        .unwrap()
        .batch(4, false)
        .unwrap();
    let dist = DistributedDataset::new(ds, &in_graph(2, 2), InputOptions::default()).unwrap();
    let mut epochs = Vec::new();
    for _ in 0..2 {
        let mut seen: Vec<i64> = steps(&dist).into_iter().flatten().flatten().collect();
        epochs.push(seen.clone());
        seen.sort();
        assert_eq!(seen, r(0..40), "every element once per epoch, none twice");
    }
    assert_ne!(epochs[0], epochs[1]);
}

#[test]
fn in_50_workers_with_different_replica_counts_cannot_share_a_dataset() {
    let uneven = distribute_input::InputWorkers::new([
        (
            "/job:worker/task:0",
            vec!["/job:worker/task:0/gpu:0", "/job:worker/task:0/gpu:1"],
        ),
        ("/job:worker/task:1", vec!["/job:worker/task:1/gpu:0"]),
    ])
    .unwrap();
    let err = distribute(8, 3, false, &uneven, InputOptions::default())
        .err()
        .unwrap();
    assert!(
        matches!(err, distribute_input::InputError::InvalidOption(_)),
        "{err}"
    );
    assert!(err.to_string().contains("same number of replicas"), "{err}");
    // Each worker's own input function is fine with any replica count.
    let dist = distribute_datasets_from_function(&uneven, InputOptions::default(), |_| {
        Dataset::range(3).batch(1, false)
    })
    .unwrap();
    assert_eq!(
        steps(&dist),
        [
            vec![vec![0], vec![1], vec![0]],
            vec![vec![2], vec![], vec![1]],
            vec![vec![], vec![], vec![2]]
        ]
    );
}

#[test]
fn in_52_input_function_over_a_generated_interleave() {
    // interleave(range(2) -> range(10)): 0, 0, 1, 1, …, 9, 9, made on the fly.
    let workers = crate::common::local(2);
    let dist = distribute_datasets_from_function(&workers, InputOptions::default(), |_| {
        let source = distribute_input::GeneratorSource::new(|| {
            (0..10i64)
                .flat_map(|i| [i, i])
                .map(|i| Ok(Tensor::from_vec("/cpu:0", &[1], vec![i])?))
        });
        Dataset::from_source(source).batch(1, false)
    })
    .unwrap();
    let expected: Vec<Vec<Vec<i64>>> = (0..10).map(|i| vec![vec![i], vec![i]]).collect();
    assert_eq!(steps(&dist), expected);
    assert_eq!(
        steps(&dist),
        expected,
        "each pass calls the generator again"
    );
}

/// A sum all-reduce between threads standing in for worker processes.
struct SumAcrossWorkers {
    values: std::sync::Mutex<Vec<u64>>,
    barrier: std::sync::Barrier,
}

impl SumAcrossWorkers {
    fn new(workers: usize) -> Self {
        SumAcrossWorkers {
            values: std::sync::Mutex::new(vec![0; workers]),
            barrier: std::sync::Barrier::new(workers),
        }
    }

    fn sum(&self, worker: usize, value: u64) -> u64 {
        self.values.lock().unwrap()[worker] = value;
        self.barrier.wait();
        let sum = self.values.lock().unwrap().iter().sum();
        // Nobody writes the next round's value before everyone has read this one.
        self.barrier.wait();
        sum
    }
}

/// What one process got: its steps, then the error it stopped with, if any.
type Run = (Vec<Vec<Vec<i64>>>, Option<InputError>);

/// Each worker's run when its process runs `make(worker)` and agrees on every step with the
/// others through `next_across_processes`. A process that waits for the others for more than
/// 30 s fails the test rather than hanging it.
fn run_processes_until_stop(
    workers: usize,
    make: impl Fn(usize) -> DistributedDataset<Tensor> + Send + Sync + 'static,
) -> Vec<Run> {
    let reduce = Arc::new(SumAcrossWorkers::new(workers));
    let make = Arc::new(make);
    let (tx, rx) = mpsc::channel();
    for w in 0..workers {
        let (reduce, make, tx) = (Arc::clone(&reduce), Arc::clone(&make), tx.clone());
        std::thread::spawn(move || {
            let dist = make(w);
            let mut it = dist.iter_per_replica();
            let mut steps = Vec::new();
            let error = loop {
                match it.next_across_processes(|mine| Ok::<_, InputError>(reduce.sum(w, mine))) {
                    Ok(Some(step)) => steps.push(step.values().iter().map(ints).collect()),
                    Ok(None) => break None,
                    Err(e) => break Some(e),
                }
            };
            // The test may have given up on this process already.
            let _ = tx.send((w, (steps, error)));
        });
    }
    let mut runs: Vec<Option<Run>> = (0..workers).map(|_| None).collect();
    for _ in 0..workers {
        let (w, run) = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("every process returns: none waits forever for the others");
        runs[w] = Some(run);
    }
    runs.into_iter().map(Option::unwrap).collect()
}

/// Each worker's steps, for runs that end without an error.
fn run_processes(
    workers: usize,
    make: impl Fn(usize) -> DistributedDataset<Tensor> + Send + Sync + 'static,
) -> Vec<Vec<Vec<Vec<i64>>>> {
    run_processes_until_stop(workers, make)
        .into_iter()
        .map(|(steps, error)| {
            assert!(error.is_none(), "{error:?}");
            steps
        })
        .collect()
}

#[test]
fn in_30_input_function_workers_agree_on_the_last_step() {
    for drop in [false, true] {
        let options = InputOptions {
            partial_batch: if drop {
                PartialBatch::DropRemainder
            } else {
                PartialBatch::KeepUneven
            },
            ..InputOptions::default()
        };
        let got = run_processes(2, move |w| {
            distribute_datasets_from_function(&between(2, w, 1), options, |cx| {
                Dataset::range(9)
                    .shard(cx.num_input_pipelines(), cx.input_pipeline_id())?
                    .batch(1, false)
            })
            .unwrap()
        });
        if drop {
            assert_eq!(got[0], [[[0]], [[2]], [[4]], [[6]]]);
            assert_eq!(got[1], [[[1]], [[3]], [[5]], [[7]]]);
        } else {
            assert_eq!(got[0], [[[0]], [[2]], [[4]], [[6]], [[8]]]);
            assert_eq!(got[1][..4], [[[1]], [[3]], [[5]], [[7]]]);
            assert_eq!(
                got[1][4],
                [Vec::<i64>::new()],
                "worker 1 gets an empty batch on worker 0's last step"
            );
        }
    }
}

#[test]
fn in_27_file_sharded_workers_with_unequal_files_agree_on_the_end() {
    // Worker 0's file has 5 rows, worker 1's has 2: batches of 2 give 3 and 1 steps on their own.
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = [5usize, 2]
        .iter()
        .enumerate()
        .map(|(f, &rows)| {
            let path = dir.path().join(format!("{f}.npy"));
            let data: Vec<i64> = (0..rows as i64).map(|i| 10 * f as i64 + i).collect();
            distribute_input::npy::write(
                &path,
                &Tensor::from_vec("/cpu:0", &[rows], data).unwrap(),
            )
            .unwrap();
            path
        })
        .collect();
    let got = run_processes(2, move |w| {
        let ds = Dataset::from_source(distribute_input::NpySource::new(&files).unwrap())
            .batch(2, false)
            .unwrap();
        DistributedDataset::new(
            ds,
            &between(2, w, 1),
            InputOptions {
                auto_shard: AutoShardPolicy::File,
                ..whole()
            },
        )
        .unwrap()
    });
    assert_eq!(got[0], [vec![r(0..2)], vec![r(2..4)], vec![vec![4]]]);
    assert_eq!(got[1], [vec![r(10..12)], vec![vec![]], vec![vec![]]]);
}

#[test]
fn a_process_that_never_had_data_cannot_invent_the_structure() {
    // Worker 1's pipeline is empty while worker 0 has a step: both stop on that step.
    let runs = run_processes_until_stop(2, |w| {
        distribute_datasets_from_function(&between(2, w, 1), InputOptions::default(), move |_| {
            Dataset::range(if w == 0 { 2 } else { 0 }).batch(2, false)
        })
        .unwrap()
    });
    let (steps0, err0) = &runs[0];
    let (steps1, err1) = &runs[1];
    assert!((steps0.is_empty() && steps1.is_empty()), "{runs:?}");
    assert!(
        matches!(err0, Some(InputError::OtherProcessFailed { failed: 1 })),
        "{err0:?}"
    );
    let err1 = err1.as_ref().unwrap().to_string();
    assert!(
        err1.contains("produced no data while other processes still have some"),
        "{err1}"
    );
    // With no data anywhere there is nothing to imitate: a clean end.
    let runs = run_processes(2, |w| {
        distribute_datasets_from_function(&between(2, w, 1), InputOptions::default(), |_| {
            Dataset::range(0).batch(2, false)
        })
        .unwrap()
    });
    assert_eq!(runs, [Vec::<Vec<Vec<i64>>>::new(), Vec::new()]);
}

#[test]
fn a_process_that_fails_stops_every_process_on_the_same_step() {
    // Worker 1's third row is unreadable; worker 0 has 5 good rows.
    for prefetch in [0, 2] {
        let runs = run_processes_until_stop(2, move |w| {
            let options = InputOptions {
                prefetch,
                ..InputOptions::default()
            };
            distribute_datasets_from_function(&between(2, w, 1), options, move |_| {
                let source = distribute_input::GeneratorSource::new(move || {
                    (0..5i64).map(move |i| {
                        if w == 1 && i == 2 {
                            return Err(InputError::InvalidOption("row 2 is corrupt".into()));
                        }
                        Ok(Tensor::from_vec("/cpu:0", &[1], vec![i])?)
                    })
                });
                Dataset::from_source(source).batch(1, false)
            })
            .unwrap()
        });
        let expected = vec![vec![vec![0]], vec![vec![1]]];
        assert_eq!(
            (&runs[0].0, &runs[1].0),
            (&expected, &expected),
            "prefetch {prefetch}"
        );
        assert!(
            matches!(
                runs[0].1,
                Some(InputError::OtherProcessFailed { failed: 1 })
            ),
            "{:?}",
            runs[0].1
        );
        let own = runs[1].1.as_ref().map(ToString::to_string);
        assert_eq!(
            own.as_deref(),
            Some("invalid input option: row 2 is corrupt"),
            "the failed process returns its own error"
        );
    }
}

#[test]
fn after_the_end_there_is_no_exchange_and_bad_sums_are_refused() {
    let dist = DistributedDataset::new(
        Dataset::range(3).batch(2, false).unwrap(),
        &between(2, 1, 1),
        InputOptions::default(),
    )
    .unwrap();
    let mut it = dist.iter_per_replica();
    // 2 processes: a report of 1 means data, 3 no structure, 9 a failure; 1 + 3 + 3 counts
    // three processes.
    let err = it
        .next_across_processes(|mine| Ok::<_, InputError>(mine + 6))
        .unwrap_err();
    assert!(
        matches!(
            err,
            InputError::BadExchange {
                sum: 7,
                processes: 2
            }
        ),
        "{err}"
    );
    let next = it.next_across_processes(|_| -> Result<u64, InputError> {
        panic!("no exchange after the iteration stopped")
    });
    assert!(matches!(next, Ok(None)));
}
