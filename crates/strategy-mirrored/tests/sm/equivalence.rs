//! Data parallelism changes nothing but speed: a linear-regression SGD step over 1, 2, 4 and 8
//! replicas — each replica takes its contiguous chunk of the global batch, sums its gradient,
//! all-reduces the sums and applies `lr / global_batch` of the total — gives one replica's
//! weights on the whole batch, and the same replica count gives the same bits every time. The
//! rows are the reference linear-regression workload's (`distribute-test-support`).

use std::sync::Arc;

use distribute_mirrored::MirroredStrategy;
use distribute_strategy::{ReplicaContext, Strategy, StrategyError, VariableOptions};
use distribute_tensor::Tensor;
use distribute_values::{
    DistributedVariable, Leaf, PerReplica, ReduceOp, UpdateOp, VariableAggregation,
};

use distribute_test_support::linear_regression::{
    self, FEATURES, GLOBAL_BATCH as BATCH, LEARNING_RATE,
};

use super::cpus;

const STEPS: usize = 20;
/// The reference learning rate 0.1 over the global batch of 256: each step subtracts
/// `gradient_sum / 2560`.
const LR_DIVISOR: usize = 2560;

/// One global batch of the reference rows (the model has no bias; it fits the rows' bias of
/// 0.5 as well as it can).
fn dataset() -> (Vec<f32>, Vec<f32>) {
    linear_regression::rows(BATCH)
}

/// Each replica's contiguous chunk of the global batch, on its device: (features, targets).
fn shard(strategy: &MirroredStrategy) -> (Leaf<Tensor>, Leaf<Tensor>) {
    let (x, y) = dataset();
    let x = Tensor::from_vec("/cpu:0", &[BATCH, FEATURES], x).unwrap();
    let y = Tensor::from_vec("/cpu:0", &[BATCH], y).unwrap();
    let n = strategy.num_replicas_in_sync();
    let per = BATCH / n;
    let map = Arc::clone(strategy.extended().device_map());
    let chunk = |t: &Tensor| -> Leaf<Tensor> {
        let mut chunks: Vec<Tensor> = map
            .primary_devices()
            .enumerate()
            .map(|(r, device)| {
                t.slice_rows(r * per..(r + 1) * per)
                    .unwrap()
                    .to_device(device)
            })
            .collect();
        if n == 1 {
            return Leaf::Same(chunks.remove(0));
        }
        Leaf::PerReplica(PerReplica::new(Arc::clone(&map), chunks).unwrap())
    };
    (chunk(&x), chunk(&y))
}

/// The gradient of ½‖Xw − y‖² summed over this replica's rows: Xᵀ(Xw − y).
fn gradient_sum(w: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor, StrategyError> {
    let (w, xs, ys) = (w.to_vec::<f32>()?, x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    let mut grad = vec![0.0f32; FEATURES];
    for (row, target) in xs.chunks(FEATURES).zip(&ys) {
        let residual: f32 = row.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() - target;
        for (g, a) in grad.iter_mut().zip(row) {
            *g += a * residual;
        }
    }
    Ok(Tensor::from_vec(x.device(), &[FEATURES], grad)?)
}

/// How the all-reduced gradient reaches the variable.
#[derive(Debug, Clone, Copy)]
enum Update {
    /// Through `merge_call`, with the cross-replica `update` giving copy `i` replica `i`'s step.
    Merge,
    /// Every replica applies the same step to its own copy (aggregation `None`).
    Local,
}

fn step(
    ctx: &ReplicaContext<'_>,
    w: &DistributedVariable<Tensor>,
    (x, y): (Tensor, Tensor),
    update: Update,
) -> Result<Tensor, StrategyError> {
    let local = gradient_sum(&ctx.read_variable(w)?, &x, &y)?;
    let total = ctx.all_reduce(ReduceOp::Sum, &local)?;
    let delta = total.divided_by(LR_DIVISOR)?;
    match update {
        Update::Merge => {
            ctx.merge_call(delta, |cross, delta: Leaf<Tensor>| {
                cross.update(w, UpdateOp::AssignSub, &delta)?;
                Ok(())
            })?;
            ctx.read_variable(w)
        }
        Update::Local => ctx.update_variable(w, UpdateOp::AssignSub, delta),
    }
}

/// The weights after `STEPS` steps on `replicas` replicas, and the loss before and after.
fn train(replicas: usize, update: Update) -> (Vec<Tensor>, f32, f32) {
    let strategy = cpus(replicas);
    let w = strategy
        .create_variable(
            "w",
            Tensor::zeros("/cpu:0", distribute_tensor::DType::F32, &[FEATURES]).unwrap(),
            VariableOptions {
                aggregation: VariableAggregation::None,
                ..VariableOptions::default()
            },
        )
        .unwrap();
    let inputs = shard(&strategy);
    let loss = |w: &Tensor| {
        let (x, y) = dataset();
        let w = w.to_vec::<f32>().unwrap();
        x.chunks(FEATURES)
            .zip(&y)
            .map(|(row, t)| (row.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() - t).powi(2))
            .sum::<f32>()
    };
    let before = loss(&w.component(0).unwrap().read());
    for _ in 0..STEPS {
        strategy
            .run(|ctx, batch| step(ctx, &w, batch, update), &inputs)
            .unwrap();
    }
    let copies: Vec<Tensor> = (0..replicas)
        .map(|r| w.component(r).unwrap().read())
        .collect();
    let after = loss(&copies[0]);
    (copies, before, after)
}

#[test]
fn the_divisor_is_the_reference_learning_rate_over_the_batch() {
    assert_eq!(LEARNING_RATE * LR_DIVISOR as f32 / BATCH as f32, 1.0);
}

#[test]
fn sgd_on_n_replicas_matches_one_replica_on_the_global_batch() {
    for update in [Update::Merge, Update::Local] {
        let (reference, before, after) = train(1, update);
        assert!(
            after < 0.75 * before,
            "{update:?}: training must make progress ({before} → {after})"
        );
        let reference = reference[0].to_vec::<f32>().unwrap();
        for replicas in [2, 4, 8] {
            let (copies, ..) = train(replicas, update);
            for (r, copy) in copies.iter().enumerate() {
                assert!(
                    copy.bitwise_eq(&copies[0]),
                    "{update:?}, {replicas} replicas: copy {r} differs from copy 0"
                );
                let weights = copy.to_vec::<f32>().unwrap();
                for (j, (a, b)) in weights.iter().zip(&reference).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-6,
                        "{update:?}, {replicas} replicas, weight {j}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_same_replica_count_gives_the_same_bits() {
    for replicas in [2, 4, 8] {
        let (a, ..) = train(replicas, Update::Merge);
        let (b, ..) = train(replicas, Update::Merge);
        assert!(a[0].bitwise_eq(&b[0]), "{replicas} replicas");
        let (c, ..) = train(replicas, Update::Local);
        // Both update paths subtract the same all-reduced step.
        assert!(
            a[0].bitwise_eq(&c[0]),
            "{replicas} replicas: merge vs local"
        );
    }
}
