//! 6.7: the rebatch building blocks.

use distribute_input::{
    Batch, Dataset, InputError, InputOptions, batch_sizes_for_worker, split_sizes,
};
use distribute_tensor::Tensor;

use crate::common::{distribute, local, r, steps};

#[test]
fn in_45_batch_sizes_for_worker() {
    // ((global batch, workers, replicas per worker, worker), sizes)
    type Case = ((usize, usize, usize, usize), &'static [usize]);
    let cases: &[Case] = &[
        ((8, 2, 2, 0), &[2, 2, 2, 2]),
        ((8, 2, 2, 1), &[2, 2, 2, 2]),
        ((4, 3, 1, 0), &[2, 1, 1]),
        ((4, 3, 1, 1), &[1, 1, 2]),
        ((4, 3, 1, 2), &[1, 2, 1]),
        ((7, 2, 2, 0), &[2, 2, 2, 1]),
        ((7, 2, 2, 1), &[2, 1, 2, 2]),
        ((4, 1, 5, 0), &[1, 1, 1, 1, 0]),
        ((4, 2, 5, 0), &[1, 1, 1, 1, 0, 0, 0, 0, 0, 0]),
        ((4, 2, 5, 1), &[0, 0, 0, 0, 0, 1, 1, 1, 1, 0]),
    ];
    for &((g, w, rr, i), expected) in cases {
        assert_eq!(
            batch_sizes_for_worker(g, w, rr, i).unwrap(),
            expected,
            "({g}, {w}, {rr}, {i})"
        );
    }
    for w in 0..5 {
        let mut expected = vec![1, 1, 1, 1, 0];
        expected.rotate_left(w);
        assert_eq!(batch_sizes_for_worker(4, 5, 1, w).unwrap(), expected);
    }
    assert!(batch_sizes_for_worker(4, 2, 1, 2).is_err());
    assert!(batch_sizes_for_worker(4, 0, 1, 0).is_err());
}

#[test]
fn in_45_invariants_hold_for_many_shapes() {
    for g in 0..20 {
        for w in 1..4 {
            for rr in 1..4 {
                let lists: Vec<Vec<usize>> = (0..w)
                    .map(|i| batch_sizes_for_worker(g, w, rr, i).unwrap())
                    .collect();
                for list in &lists {
                    assert_eq!(list.len(), w * rr);
                    assert_eq!(list.iter().sum::<usize>(), g);
                    assert!(list.iter().max().unwrap() - list.iter().min().unwrap() <= 1);
                }
                for step in 0..w {
                    let total: usize = (0..w)
                        .map(|i| lists[i][step * rr..(step + 1) * rr].iter().sum::<usize>())
                        .sum();
                    assert_eq!(total, g, "global step {step} of ({g}, {w}, {rr})");
                }
            }
        }
    }
}

#[test]
fn in_48_legacy_rebatch_by_replica_count() {
    assert_eq!(split_sizes(4, 2), [2, 2]);
    assert_eq!(split_sizes(4, 3), [2, 2, 0]);
    let two = steps(&distribute(8, 4, false, &local(2), InputOptions::default()).unwrap());
    assert_eq!(two, [[r(0..2), r(2..4)], [r(4..6), r(6..8)]]);
    let three = steps(&distribute(8, 4, false, &local(3), InputOptions::default()).unwrap());
    assert_eq!(
        three,
        [
            vec![r(0..2), r(2..4), vec![]],
            vec![r(4..6), r(6..8), vec![]]
        ]
    );
    // Unbatched scalar input has nothing to split.
    let err = Dataset::from_tensors(Tensor::scalar("/cpu:0", 1i64)).unwrap_err();
    assert!(matches!(err, InputError::NoBatchDimension { .. }), "{err}");
}

#[test]
fn in_49_batch_size_of_a_structure() {
    let a = Tensor::from_vec("/cpu:0", &[3, 2], vec![0f32; 6]).unwrap();
    let b = Tensor::from_vec("/cpu:0", &[3], vec![0i64; 3]).unwrap();
    assert_eq!((a.clone(), b).rows("x").unwrap(), 3);
    let c = Tensor::from_vec("/cpu:0", &[2], vec![0i64; 2]).unwrap();
    assert!(matches!(
        (a, c).rows("x"),
        Err(InputError::RaggedBatch { .. })
    ));
}

/// `range(n)` (in batches of `b`, or unbatched) rebatched with `sizes`.
fn rebatched(n: usize, b: Option<usize>, sizes: &[usize], drop: bool) -> Vec<Vec<i64>> {
    let mut ds = Dataset::range(n);
    if let Some(b) = b {
        ds = ds.batch(b, false).unwrap();
    }
    ds.rebatch(sizes, drop)
        .unwrap()
        .iter()
        .map(|x| crate::common::ints(&x.unwrap()))
        .collect()
}

#[test]
fn in_46_rebatch_with_explicit_sizes() {
    let e: Vec<i64> = Vec::new();
    // (n, batch, sizes, drop_remainder, expected)
    type Case = (usize, Option<usize>, &'static [usize], bool, Vec<Vec<i64>>);
    let cases: Vec<Case> = vec![
        (
            8,
            Some(4),
            &[2, 2],
            false,
            vec![r(0..2), r(2..4), r(4..6), r(6..8)],
        ),
        (5, Some(4), &[2, 2], false, vec![r(0..2), r(2..4), vec![4]]),
        (5, Some(4), &[2, 2], true, vec![r(0..2), r(2..4)]),
        (12, Some(4), &[6], false, vec![r(0..6), r(6..12)]),
        (
            8,
            Some(4),
            &[1, 1, 1, 1, 0],
            false,
            vec![
                vec![0],
                vec![1],
                vec![2],
                vec![3],
                e.clone(),
                vec![4],
                vec![5],
                vec![6],
                vec![7],
                e.clone(),
            ],
        ),
        (
            8,
            None,
            &[2],
            false,
            vec![r(0..2), r(2..4), r(4..6), r(6..8)],
        ),
    ];
    for (n, b, sizes, drop, expected) in cases {
        assert_eq!(
            rebatched(n, b, sizes, drop),
            expected,
            "range({n}) batch {b:?} rebatch {sizes:?} drop {drop}"
        );
    }
    // [0, 1] and [1, 0]: an empty output for every 0, and one more empty at the end for [0, 1].
    let zero_first = rebatched(8, Some(4), &[0, 1], false);
    assert_eq!(zero_first.len(), 17);
    assert!(zero_first.iter().step_by(2).all(Vec::is_empty));
    assert_eq!(
        zero_first
            .iter()
            .skip(1)
            .step_by(2)
            .flatten()
            .copied()
            .collect::<Vec<_>>(),
        r(0..8)
    );
    let zero_last = rebatched(8, Some(4), &[1, 0], false);
    assert_eq!(zero_last.len(), 16);
    assert_eq!(
        zero_last
            .iter()
            .step_by(2)
            .flatten()
            .copied()
            .collect::<Vec<_>>(),
        r(0..8)
    );
    assert!(zero_last.iter().skip(1).step_by(2).all(Vec::is_empty));
}

#[test]
fn in_46_rebatch_errors() {
    assert!(
        Dataset::range(4).rebatch([0, 0], false).is_err(),
        "sizes that take no rows"
    );
    assert!(
        Dataset::range(4)
            .batch(2, true)
            .unwrap()
            .rebatch([1], false)
            .is_err()
    );
    // A rebatched dataset has no single global batch to split.
    let ds = Dataset::range(4).rebatch([1, 2], false).unwrap();
    let err = distribute_input::DistributedDataset::new(ds, &local(2), InputOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, InputError::InvalidOption(_)), "{err}");
}

#[test]
fn in_45_batch_sizes_for_worker_drive_a_rebatch_per_worker() {
    // G = 7 over 2 workers × 2 replicas: each global step consumes 7 rows across the workers.
    let per_worker: Vec<Vec<Vec<usize>>> = (0..2)
        .map(|w| {
            let workers = crate::common::between(2, w, 2);
            let dist = distribute_input::distribute_datasets_from_function(
                &workers,
                InputOptions::default(),
                |cx| {
                    let sizes = batch_sizes_for_worker(
                        7,
                        cx.num_input_pipelines(),
                        2,
                        cx.input_pipeline_id(),
                    )?;
                    Dataset::range(14).rebatch(sizes, false)
                },
            )
            .unwrap();
            dist.iter_per_replica()
                .map(|s| s.unwrap().into_iter().map(|t| t.shape()[0]).collect())
                .collect()
        })
        .collect();
    // Each worker reads all 14 rows (no sharding here): two cycles of its 4 sizes.
    assert_eq!(per_worker[0], [[2, 2], [2, 1], [2, 2], [2, 1]]);
    assert_eq!(per_worker[1], [[2, 1], [2, 2], [2, 1], [2, 2]]);
    for (w0, w1) in per_worker[0].iter().zip(&per_worker[1]) {
        assert_eq!(w0.iter().sum::<usize>() + w1.iter().sum::<usize>(), 7);
    }
}
