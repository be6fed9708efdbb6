//! 6.2 and 6.3: splitting batches and single-worker iteration.

use distribute_input::{
    Dataset, DistributedDataset, InputError, InputOptions, PartialBatch,
    distribute_datasets_from_function,
};
use distribute_tensor::Tensor;
use distribute_values::{DistributedValues, Leaf};

use crate::common::{distribute, ints, local, r, steps, whole};

#[test]
fn in_06_global_batches_split_into_consecutive_halves() {
    for prefetch in [0, 1, 3] {
        let options = InputOptions {
            prefetch,
            ..InputOptions::default()
        };
        let got = steps(&distribute(100, 20, false, &local(2), options).unwrap());
        let expected: Vec<Vec<Vec<i64>>> = (0..5)
            .map(|s| vec![r(s * 20..s * 20 + 10), r(s * 20 + 10..s * 20 + 20)])
            .collect();
        assert_eq!(got, expected, "prefetch {prefetch}");
    }
}

#[test]
fn in_07_even_split_errors() {
    // DropRemainder promises equal batches on every replica, so 10 over 3 cannot be split.
    let options = InputOptions {
        partial_batch: PartialBatch::DropRemainder,
        ..InputOptions::default()
    };
    let err = distribute(30, 10, false, &local(3), options).err().unwrap();
    assert!(
        matches!(
            err,
            InputError::IndivisibleBatch {
                global_batch: 10,
                replicas: 3
            }
        ),
        "{err}"
    );
    // Without a batching step there is nothing to split.
    let err = DistributedDataset::new(Dataset::range(4), &local(2), InputOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, InputError::NotBatched));
    assert!(err.to_string().contains("call `batch` first"));
}

#[test]
fn in_08_splitting_keeps_the_drop_remainder_flag() {
    let kept = steps(&distribute(9, 4, true, &local(2), InputOptions::default()).unwrap());
    assert_eq!(kept, [[r(0..2), r(2..4)], [r(4..6), r(6..8)]]);
    let not = steps(&distribute(9, 4, false, &local(2), InputOptions::default()).unwrap());
    assert_eq!(not.len(), 3);
    assert_eq!(not[2], [vec![8], vec![]]);
}

#[test]
fn in_09_one_device_gets_every_element_in_order() {
    for options in [
        whole(),
        InputOptions::default(),
        InputOptions {
            prefetch: 0,
            ..whole()
        },
    ] {
        let got = steps(&distribute(10, 1, false, &local(1), options).unwrap());
        assert_eq!(got, (0..10).map(|i| vec![vec![i]]).collect::<Vec<_>>());
    }
}

#[test]
fn in_10_consecutive_elements_go_to_consecutive_replicas() {
    let workers = distribute_input::InputWorkers::local(["/gpu:0", "/cpu:0"]).unwrap();
    let expected: Vec<Vec<Vec<i64>>> = (0..5).map(|i| vec![vec![2 * i], vec![2 * i + 1]]).collect();
    assert_eq!(
        steps(&distribute(10, 1, false, &workers, whole()).unwrap()),
        expected
    );
    // The same data as global batches of 2, split.
    assert_eq!(
        steps(&distribute(10, 2, false, &workers, InputOptions::default()).unwrap()),
        expected
    );
}

#[test]
fn in_11_tuples_are_split_leaf_by_leaf() {
    let i: Vec<i64> = (0..10).collect();
    let squares: Vec<i64> = i.iter().map(|x| x * x).collect();
    let data = (
        Tensor::from_vec("/cpu:0", &[10], i).unwrap(),
        Tensor::from_vec("/cpu:0", &[10], squares).unwrap(),
    );
    let ds = Dataset::from_tensors(data)
        .unwrap()
        .batch(2, false)
        .unwrap();
    let dist = DistributedDataset::new(ds, &local(2), InputOptions::default()).unwrap();
    let got: Vec<Vec<(Vec<i64>, Vec<i64>)>> = dist
        .iter_per_replica()
        .map(|s| {
            s.unwrap()
                .values()
                .iter()
                .map(|(a, b)| (ints(a), ints(b)))
                .collect()
        })
        .collect();
    let expected: Vec<Vec<(Vec<i64>, Vec<i64>)>> = (0..5)
        .map(|k| {
            let i = 2 * k;
            vec![
                (vec![i], vec![i * i]),
                (vec![i + 1], vec![(i + 1) * (i + 1)]),
            ]
        })
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn in_12_drop_remainder_drops_the_odd_trailing_element() {
    let options = InputOptions {
        partial_batch: PartialBatch::DropRemainder,
        ..whole()
    };
    let got = steps(&distribute(11, 1, false, &local(2), options).unwrap());
    assert_eq!(got.len(), 5);
    assert_eq!(got[4], [vec![8], vec![9]]);
}

#[test]
fn in_13_short_last_batch_leaves_trailing_replicas_empty() {
    let got = steps(&distribute(9, 2, false, &local(2), whole()).unwrap());
    assert_eq!(
        got,
        [
            vec![r(0..2), r(2..4)],
            vec![r(4..6), r(6..8)],
            vec![vec![8], vec![]]
        ]
    );
    let dropped = steps(&distribute(9, 2, true, &local(2), whole()).unwrap());
    assert_eq!(dropped, [[r(0..2), r(2..4)], [r(4..6), r(6..8)]]);
    let policy = InputOptions {
        partial_batch: PartialBatch::DropRemainder,
        ..whole()
    };
    assert_eq!(
        steps(&distribute(9, 2, false, &local(2), policy).unwrap()),
        dropped
    );
}

#[test]
fn in_13_empty_batches_keep_dtype_and_trailing_shape() {
    let x = Tensor::from_vec("/cpu:0", &[3, 2], vec![1.0f32; 6]).unwrap();
    let y = Tensor::from_vec("/cpu:0", &[3], vec![1i32; 3]).unwrap();
    let ds = Dataset::from_tensors((x, y))
        .unwrap()
        .batch(3, false)
        .unwrap();
    let dist = DistributedDataset::new(ds, &local(4), InputOptions::default()).unwrap();
    let step = dist.iter_per_replica().next().unwrap().unwrap();
    let (ex, ey) = &step.values()[3];
    assert_eq!(
        (ex.shape(), ex.dtype()),
        (&[0, 2][..], distribute_tensor::DType::F32)
    );
    assert_eq!(
        (ey.shape(), ey.dtype()),
        (&[0][..], distribute_tensor::DType::I32)
    );
}

#[test]
fn in_14_end_of_data_then_replay() {
    let dist = distribute(6, 2, false, &local(2), InputOptions::default()).unwrap();
    let mut it = dist.iter_per_replica();
    assert_eq!(it.by_ref().count(), 3);
    assert!(it.next().is_none(), "end of data stays the end");
    assert!(it.next().is_none());
    let first = steps(&dist);
    let second = steps(&dist);
    assert_eq!(first, second, "two epochs are equal");
    // `for step in &dist` gives each step as `run` takes it: one per-replica leaf.
    let mut by_for_loop = Vec::new();
    for step in &dist {
        let step = step.unwrap();
        assert!(matches!(step, Leaf::PerReplica(_)), "{step:?}");
        by_for_loop.push(
            step.local_results()
                .into_iter()
                .map(ints)
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(by_for_loop, first);
}

#[test]
fn in_15_split_or_whole_batches() {
    let split = steps(&distribute(100, 10, false, &local(2), InputOptions::default()).unwrap());
    let expected: Vec<Vec<Vec<i64>>> = (0..10)
        .map(|s| vec![r(s * 10..s * 10 + 5), r(s * 10 + 5..s * 10 + 10)])
        .collect();
    assert_eq!(split, expected);
    let unsplit = steps(&distribute(100, 10, false, &local(2), whole()).unwrap());
    let expected: Vec<Vec<Vec<i64>>> = (0..5)
        .map(|s| vec![r(s * 20..s * 20 + 10), r(s * 20 + 10..s * 20 + 20)])
        .collect();
    assert_eq!(unsplit, expected);
}

#[test]
fn in_16_single_device_iterates_in_order() {
    let flat: Vec<i64> =
        steps(&distribute(10, 3, false, &local(1), InputOptions::default()).unwrap())
            .into_iter()
            .flat_map(|s| s.into_iter().flatten())
            .collect();
    assert_eq!(flat, r(0..10));
}

#[test]
fn in_19_cross_replica_iteration_splits_the_global_batch() {
    let two = steps(&distribute(10, 2, false, &local(2), InputOptions::default()).unwrap());
    assert_eq!(two[0], [vec![0], vec![1]]);
    assert_eq!(two[4], [vec![8], vec![9]]);
    let one = steps(&distribute(10, 2, false, &local(1), InputOptions::default()).unwrap());
    assert_eq!(one[0], [vec![0, 1]]);
}

#[test]
fn in_20_default_single_device_first_element() {
    let dist = distribute(10, 2, false, &local(1), InputOptions::default()).unwrap();
    assert_eq!(
        ints(&dist.iter_per_replica().next().unwrap().unwrap().values()[0]),
        [0, 1]
    );
    let from_fn = distribute_datasets_from_function(&local(1), InputOptions::default(), |_| {
        Dataset::range(10).batch(2, false)
    })
    .unwrap();
    assert_eq!(
        ints(&from_fn.iter_per_replica().next().unwrap().unwrap().values()[0]),
        [0, 1]
    );
}

#[test]
fn in_39_drop_remainder_gives_every_replica_the_same_shape() {
    for replicas in [1, 2, 4, 8] {
        let features = Tensor::from_vec("/cpu:0", &[40, 10], vec![0.5f32; 400]).unwrap();
        let labels = Tensor::from_vec("/cpu:0", &[40], vec![1i64; 40]).unwrap();
        let ds = Dataset::from_tensors((features, labels))
            .unwrap()
            .batch(8, true)
            .unwrap();
        let options = InputOptions {
            partial_batch: PartialBatch::DropRemainder,
            ..InputOptions::default()
        };
        let dist = DistributedDataset::new(ds, &local(replicas), options).unwrap();
        let mut count = 0;
        for step in dist.iter_per_replica() {
            for (f, l) in step.unwrap().values() {
                assert_eq!(f.shape(), [8 / replicas, 10]);
                assert_eq!(l.shape(), [8 / replicas]);
            }
            count += 1;
        }
        assert_eq!(count, 5);
    }
}
