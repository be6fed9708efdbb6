//! Datasets fed to a MirroredStrategy's replicas through the input crate: every replica gets its
//! contiguous chunk of each global batch, on its own device, and all replicas end together.

use distribute_collectives::Tensor;
use distribute_input::{Dataset, InputOptions, PartialBatch};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::{Strategy, per_replica_inputs};
use distribute_values::{Leaf, ReduceOp};

#[test]
fn replicas_get_their_chunks_and_all_reduce_the_global_batch() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1", "/cpu:2"]).unwrap();
    // 0..20 in global batches of 6: the last batch has 2 rows, so replica 2 gets an empty chunk.
    let dataset = strategy
        .distribute_dataset(
            Dataset::range(20).batch(6, false).unwrap(),
            InputOptions::default(),
        )
        .unwrap();
    let mut global_sums = Vec::new();
    for step in &dataset {
        let inputs = per_replica_inputs(step.unwrap()).unwrap();
        let (totals, rows, devices): (Leaf<i64>, Leaf<usize>, Leaf<String>) = strategy
            .run(
                |ctx, batch| {
                    let local: i64 = batch.to_vec::<i64>()?.iter().sum();
                    let mine = Tensor::scalar(batch.device(), local);
                    let total = ctx.all_reduce(ReduceOp::Sum, &mine)?.to_vec::<i64>()?[0];
                    Ok((total, batch.shape()[0], batch.device().to_owned()))
                },
                &inputs,
            )
            .unwrap();
        // Every replica got the same all-reduced total, so it collapses to one value.
        let Leaf::PerReplica(devices) = devices else {
            panic!("devices differ per replica")
        };
        for (r, device) in devices.into_iter().enumerate() {
            assert_eq!(
                device,
                format!("/job:localhost/replica:0/task:0/device:CPU:{r}")
            );
        }
        let Leaf::Same(total) = totals else {
            panic!("the all-reduced total is the same everywhere: {totals:?}")
        };
        let rows: Vec<usize> = match rows {
            Leaf::Same(n) => vec![n; 3],
            other => other.local_results().into_iter().copied().collect(),
        };
        global_sums.push((total, rows));
    }
    assert_eq!(
        global_sums,
        [
            (15, vec![2, 2, 2]),
            (51, vec![2, 2, 2]),
            (87, vec![2, 2, 2]),
            (37, vec![1, 1, 0]),
        ]
    );
}

#[test]
fn dropping_the_remainder_ends_every_replica_on_the_same_step() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let options = InputOptions {
        partial_batch: PartialBatch::DropRemainder,
        ..InputOptions::default()
    };
    let dataset = strategy
        .distribute_dataset(Dataset::range(10).batch(4, true).unwrap(), options)
        .unwrap();
    assert_eq!(dataset.iter().count(), 2);
}
