//! Datasets fed to a MirroredStrategy's replicas through the input crate: every replica gets its
//! contiguous chunk of each global batch, on its own device, and all replicas end together; a
//! user's derived struct is a dataset element like a tensor, and padded steps carry their masks.

use distribute_input::{Batch, Dataset, InputOptions, MaskedRegrouped, PartialBatch};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor;
use distribute_values::{Leaf, Nest, ReduceOp};

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
        let inputs = step.unwrap();
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

/// A dataset element of a user's own: features, token columns and an optional weight per row.
#[derive(Debug, Clone, Nest)]
struct Example {
    features: Tensor,
    tokens: Vec<Tensor>,
    weight: Option<Tensor>,
}

#[test]
fn a_derived_struct_is_a_dataset_element_split_over_the_replicas() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let ids: Vec<i64> = (0..6).collect();
    let data = Example {
        features: Tensor::from_vec(
            "/cpu:0",
            &[6, 2],
            ids.iter().flat_map(|&i| [i, -i]).collect(),
        )
        .unwrap(),
        tokens: vec![
            Tensor::from_vec("/cpu:0", &[6], ids.iter().map(|i| 10 * i).collect()).unwrap(),
        ],
        weight: Some(Tensor::from_vec("/cpu:0", &[6], vec![1.0f32; 6]).unwrap()),
    };
    // 6 rows in global batches of 4: steps of [2, 2] rows, then [1, 1].
    let dataset = strategy
        .distribute_dataset(
            Dataset::from_tensors(data)
                .unwrap()
                .batch(4, false)
                .unwrap(),
            InputOptions::default(),
        )
        .unwrap();
    let mut steps = Vec::new();
    for step in &dataset {
        let inputs: ExampleRegrouped = step.unwrap();
        let (rows, tokens, weights): (Leaf<usize>, Leaf<Tensor>, Leaf<f32>) = strategy
            .run(
                |ctx, batch| {
                    assert_eq!(batch.features.device(), ctx.devices()[0]);
                    assert_eq!(batch.tokens[0].device(), ctx.devices()[0]);
                    let weight = batch.weight.as_ref().expect("every row has a weight");
                    let local = Tensor::scalar(
                        weight.device(),
                        weight.to_vec::<f32>()?.iter().sum::<f32>(),
                    );
                    let total = ctx.all_reduce(ReduceOp::Sum, &local)?.to_vec::<f32>()?[0];
                    Ok((
                        batch.rows("a replica's batch")?,
                        batch.tokens[0].clone(),
                        total,
                    ))
                },
                &inputs,
            )
            .unwrap();
        let Leaf::Same(total) = weights else {
            panic!("the all-reduced weight is the same everywhere: {weights:?}")
        };
        let tokens: Vec<Vec<i64>> = tokens
            .local_results()
            .into_iter()
            .map(|t| t.to_vec::<i64>().unwrap())
            .collect();
        let rows: Vec<usize> = match rows {
            Leaf::Same(n) => vec![n; 2],
            other => other.local_results().into_iter().copied().collect(),
        };
        steps.push((rows, tokens, total));
    }
    assert_eq!(
        steps,
        [
            (vec![2, 2], vec![vec![0, 10], vec![20, 30]], 4.0),
            (vec![1, 1], vec![vec![40], vec![50]], 2.0),
        ]
    );
}

#[test]
fn padded_steps_reach_the_replicas_with_their_masks() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let options = InputOptions {
        partial_batch: PartialBatch::PadWithMask,
        ..InputOptions::default()
    };
    // 0..5 in global batches of 4: [0, 1] and [2, 3], then [4] and a padded empty chunk.
    let dataset = strategy
        .distribute_dataset(Dataset::range(5).batch(4, false).unwrap(), options)
        .unwrap();
    let mut means = Vec::new();
    for step in dataset.iter_masked() {
        let inputs: MaskedRegrouped<Tensor> = step.unwrap();
        let mean: Leaf<f32> = strategy
            .run(
                |ctx, masked| {
                    assert_eq!(masked.batch.shape(), [2]);
                    let values = masked.batch.to_vec::<i64>()?;
                    let mask = masked.mask.to_vec::<f32>()?;
                    let sum: f32 = values.iter().zip(&mask).map(|(v, m)| *v as f32 * m).sum();
                    let real: f32 = mask.iter().sum();
                    let pair = Tensor::from_vec(masked.mask.device(), &[2], vec![sum, real])?;
                    let total = ctx.all_reduce(ReduceOp::Sum, &pair)?.to_vec::<f32>()?;
                    Ok(total[0] / total[1])
                },
                &inputs,
            )
            .unwrap();
        let Leaf::Same(mean) = mean else {
            panic!("the mean over real rows is the same everywhere: {mean:?}")
        };
        means.push(mean);
    }
    // Padding rows count for nothing: the means are over real rows only.
    assert_eq!(means, [1.5, 4.0]);
}
