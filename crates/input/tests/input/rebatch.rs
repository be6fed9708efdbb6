//! 6.7: the rebatch building blocks.

use distribute_collectives::Tensor;
use distribute_input::{
    Batch, Dataset, InputError, InputOptions, batch_sizes_for_worker, split_sizes,
};

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
