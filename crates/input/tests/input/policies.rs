//! Auto-shard policies across input pipelines (checked at construction) and the partial-batch
//! policies.

use std::path::PathBuf;

use distribute_input::{
    AutoShardPolicy, Dataset, DistributedDataset, InputError, InputOptions, NpySource,
    PartialBatch, npy,
};
use distribute_tensor::Tensor;
use distribute_values::DistributedValues;

use crate::common::{between, distribute, in_graph, ints, local, r, steps};

/// `files` .npy files of `rows` consecutive int64 numbers each, file `f` starting at `100·f`.
fn npy_files(dir: &tempfile::TempDir, files: usize, rows: usize) -> Vec<PathBuf> {
    (0..files)
        .map(|f| {
            let path = dir.path().join(format!("part-{f}.npy"));
            let data: Vec<i64> = (0..rows as i64).map(|i| 100 * f as i64 + i).collect();
            npy::write(&path, &Tensor::from_vec("/cpu:0", &[rows], data).unwrap()).unwrap();
            path
        })
        .collect()
}

fn npy_dataset(files: &[PathBuf], batch: usize) -> Dataset<Tensor> {
    Dataset::from_source(NpySource::new(files).unwrap())
        .batch(batch, false)
        .unwrap()
}

fn policy(auto_shard: AutoShardPolicy) -> InputOptions {
    InputOptions {
        auto_shard,
        ..InputOptions::default()
    }
}

#[test]
fn file_policy_gives_each_pipeline_its_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let files = npy_files(&dir, 4, 3);
    // Worker 1 of 2 reads files 1 and 3; each global batch of 2 becomes 2 pieces of 1, both its own.
    let dist = DistributedDataset::new(
        npy_dataset(&files, 2),
        &between(2, 1, 1),
        policy(AutoShardPolicy::File),
    )
    .unwrap();
    assert_eq!(dist.applied_auto_shard(), [AutoShardPolicy::File]);
    let flat: Vec<i64> = steps(&dist).into_iter().flatten().flatten().collect();
    assert_eq!(flat, [100, 101, 102, 300, 301, 302]);
    // In-graph, the two pipelines together read every file once.
    let dist = DistributedDataset::new(
        npy_dataset(&files, 2),
        &in_graph(2, 1),
        policy(AutoShardPolicy::Auto),
    )
    .unwrap();
    assert_eq!(
        dist.applied_auto_shard(),
        [AutoShardPolicy::File, AutoShardPolicy::File]
    );
    let mut all: Vec<i64> = steps(&dist).into_iter().flatten().flatten().collect();
    all.sort();
    let mut expected: Vec<i64> = (0..4)
        .flat_map(|f| (0..3).map(move |i| 100 * f + i))
        .collect();
    expected.sort();
    assert_eq!(all, expected);
}

#[test]
fn file_policy_errors_are_checked_at_construction() {
    let dir = tempfile::tempdir().unwrap();
    let files = npy_files(&dir, 2, 3);
    let err = DistributedDataset::new(
        npy_dataset(&files, 2),
        &in_graph(3, 1),
        policy(AutoShardPolicy::File),
    )
    .err()
    .unwrap();
    assert!(
        matches!(err, InputError::Shard { policy: "File", .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("2 file(s) cannot give each of 3 input pipelines"),
        "{err}"
    );
    let err = distribute(8, 2, false, &local(1), policy(AutoShardPolicy::File))
        .err()
        .unwrap();
    assert!(err.to_string().contains("not read from files"), "{err}");
}

#[test]
fn auto_policy_falls_back_to_data_with_too_few_files() {
    let dir = tempfile::tempdir().unwrap();
    let files = npy_files(&dir, 1, 4);
    let dist = DistributedDataset::new(
        npy_dataset(&files, 2),
        &in_graph(2, 1),
        InputOptions::default(),
    )
    .unwrap();
    assert_eq!(
        dist.applied_auto_shard(),
        [AutoShardPolicy::Data, AutoShardPolicy::Data]
    );
    assert_eq!(steps(&dist), [[[0], [1]], [[2], [3]]]);
    let memory = distribute(4, 2, false, &in_graph(2, 1), InputOptions::default()).unwrap();
    assert_eq!(
        memory.applied_auto_shard(),
        [AutoShardPolicy::Data, AutoShardPolicy::Data]
    );
}

#[test]
fn pad_with_mask_gives_every_replica_the_full_size() {
    let options = InputOptions {
        partial_batch: PartialBatch::PadWithMask,
        ..InputOptions::default()
    };
    let dist = distribute(9, 4, false, &local(2), options).unwrap();
    let got: Vec<Vec<(Vec<i64>, Vec<f32>)>> = dist
        .iter_masked()
        .into_per_replica()
        .map(|s| {
            s.unwrap()
                .values()
                .iter()
                .map(|m| (ints(&m.batch), m.mask.to_vec::<f32>().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(
        got,
        [
            vec![(r(0..2), vec![1.0, 1.0]), (r(2..4), vec![1.0, 1.0])],
            vec![(r(4..6), vec![1.0, 1.0]), (r(6..8), vec![1.0, 1.0])],
            vec![(vec![8, 0], vec![1.0, 0.0]), (vec![0, 0], vec![0.0, 0.0])],
        ]
    );
    // The masks sit with their batches.
    let step = dist
        .iter_masked()
        .into_per_replica()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(
        step.values()[1].mask.device(),
        step.values()[1].batch.device()
    );
}

#[test]
fn masks_are_all_ones_when_nothing_is_padded() {
    let dist = distribute(5, 4, false, &local(2), InputOptions::default()).unwrap();
    let last = dist
        .iter_masked()
        .into_per_replica()
        .last()
        .unwrap()
        .unwrap();
    let rows: Vec<usize> = last
        .values()
        .iter()
        .map(|m| m.real_rows().unwrap())
        .collect();
    assert_eq!(rows, [1, 0]);
}

#[test]
fn in_29_every_replica_gets_a_value_and_all_see_the_end_together() {
    for policy in [
        PartialBatch::KeepUneven,
        PartialBatch::DropRemainder,
        PartialBatch::PadWithMask,
    ] {
        for (n, b) in [(0, 4), (1, 4), (7, 4), (19, 8)] {
            let options = InputOptions {
                partial_batch: policy,
                ..InputOptions::default()
            };
            let dist = distribute(n, b, false, &in_graph(2, 2), options).unwrap();
            let mut it = dist.iter_per_replica();
            for step in it.by_ref() {
                assert_eq!(
                    step.unwrap().num_replicas(),
                    4,
                    "{policy:?} range({n}).batch({b})"
                );
            }
            assert!(it.next().is_none());
        }
    }
}

#[test]
fn auto_policy_is_off_for_a_single_pipeline() {
    let dist = distribute(4, 2, false, &local(2), InputOptions::default()).unwrap();
    assert_eq!(dist.applied_auto_shard(), [AutoShardPolicy::Off]);
}
