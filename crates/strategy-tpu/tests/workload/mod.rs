//! The linear-regression workload that the TPU tests and the `tpu` bench both train: the
//! reference rows of `distribute-test-support`, the traced SGD step, the device variable,
//! per-replica shards, and the same training on a `MirroredStrategy` as the reference.

use std::sync::Arc;

use distribute_mirrored::MirroredStrategy;
use distribute_pjrt::stablehlo::{DotDims, Value};
use distribute_strategy::{Strategy, VariableOptions};
use distribute_tensor::Tensor;
use distribute_tpu::{StepBuilder, TpuError, TpuStrategy, TpuVariable};
use distribute_values::{DistributedValues, Leaf, PerReplica, ReduceOp};
use ndarray::{Array1, Array2, s};

pub(crate) use distribute_test_support::linear_regression::FEATURES;
use distribute_test_support::linear_regression::{self, GLOBAL_BATCH, LEARNING_RATE};

/// One global batch of the reference linear-regression rows (the first 256); the model here
/// has no bias, so it fits the rows' bias of 0.5 as well as it can, which is all an
/// equivalence between strategies needs.
pub(crate) fn data() -> (Array2<f32>, Array1<f32>) {
    linear_regression::arrays(GLOBAL_BATCH)
}

/// The traced SGD step on (w, x, y): the global-batch mean-squared-error gradient, summed across
/// replicas in the program.
pub(crate) fn sgd_step(b: &mut StepBuilder<'_>, args: &[Value]) -> Result<Vec<Value>, TpuError> {
    let (w, x, y) = (&args[0], &args[1], &args[2]);
    let predicted = b.matmul(x, w)?;
    let error = b.subtract(&predicted, y)?;
    let gradient = b.dot_general(
        x,
        &error,
        &DotDims {
            lhs_contracting: vec![0],
            rhs_contracting: vec![0],
            ..DotDims::default()
        },
    )?;
    let scale = b.splat(1.0 / GLOBAL_BATCH as f32, &[FEATURES as i64]);
    let gradient = b.multiply(&gradient, &scale)?;
    let gradient = b.all_reduce(ReduceOp::Sum, &gradient)?;
    let lr = b.splat(LEARNING_RATE, &[FEATURES as i64]);
    let delta = b.multiply(&gradient, &lr)?;
    Ok(vec![b.subtract(w, &delta)?])
}

/// The model's weights as a mirrored device variable, zeros on every replica.
pub(crate) fn weights(s: &TpuStrategy) -> TpuVariable {
    s.create_device_variable("w", VariableOptions::default(), |device| {
        Ok(Tensor::from_vec(
            device,
            &[FEATURES],
            vec![0.0f32; FEATURES],
        )?)
    })
    .unwrap()
}

/// The same SGD on a `MirroredStrategy`: each replica its contiguous chunk, gradients summed
/// with `all_reduce`.
pub(crate) fn train_mirrored(
    strategy: &MirroredStrategy,
    x: &Array2<f32>,
    y: &Array1<f32>,
    steps: usize,
) -> Vec<f32> {
    let n = strategy.num_replicas_in_sync();
    let per = GLOBAL_BATCH / n;
    let mut w = Array1::<f32>::zeros(FEATURES);
    for _ in 0..steps {
        let current = w.clone();
        let gradient: Leaf<Tensor> = strategy
            .run(
                |ctx, ()| {
                    let r = ctx.replica_id();
                    let xs = x.slice(s![r * per..(r + 1) * per, ..]);
                    let ys = y.slice(s![r * per..(r + 1) * per]);
                    let error = xs.dot(&current) - ys;
                    let gradient = xs.t().dot(&error) / GLOBAL_BATCH as f32;
                    ctx.all_reduce(ReduceOp::Sum, &Tensor::from_array(ctx.device(), gradient))
                },
                &(),
            )
            .unwrap();
        let g = gradient.local_results()[0].to_vec::<f32>().unwrap();
        w = w - Array1::from(g) * LEARNING_RATE;
    }
    w.to_vec()
}

/// Each replica's contiguous chunk of x and y, placed on its device.
pub(crate) fn shards(
    s: &TpuStrategy,
    x: &Array2<f32>,
    y: &Array1<f32>,
) -> (PerReplica<Tensor>, PerReplica<Tensor>) {
    let n = s.num_replicas_in_sync();
    let per = GLOBAL_BATCH / n;
    let devices = s.worker_devices();
    let xs = (0..n)
        .map(|r| {
            Tensor::from_array(
                &devices[r],
                x.slice(s![r * per..(r + 1) * per, ..]).to_owned(),
            )
        })
        .collect();
    let ys = (0..n)
        .map(|r| Tensor::from_array(&devices[r], y.slice(s![r * per..(r + 1) * per]).to_owned()))
        .collect();
    (
        PerReplica::new(Arc::clone(s.device_map()), xs).unwrap(),
        PerReplica::new(Arc::clone(s.device_map()), ys).unwrap(),
    )
}

/// Each replica's batch repeated `steps` times along a new leading dimension.
pub(crate) fn stack(s: &TpuStrategy, p: &PerReplica<Tensor>, steps: usize) -> PerReplica<Tensor> {
    let values = p
        .values()
        .iter()
        .map(|t| {
            let mut shape = vec![steps];
            shape.extend_from_slice(t.shape());
            let one = t.to_vec::<f32>().unwrap();
            let data = one
                .iter()
                .copied()
                .cycle()
                .take(one.len() * steps)
                .collect();
            Tensor::from_vec(t.device(), &shape, data).unwrap()
        })
        .collect();
    PerReplica::new(Arc::clone(s.device_map()), values).unwrap()
}
