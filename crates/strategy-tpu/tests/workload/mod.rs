//! The linear-regression workload that the TPU tests and the `tpu` bench both train: data, the
//! traced SGD step, the device variable, per-replica shards, and the same training on a
//! `MirroredStrategy` as the reference.

use std::sync::Arc;

use distribute_collectives::Tensor;
use distribute_mirrored::MirroredStrategy;
use distribute_pjrt::stablehlo::{DotDims, Value};
use distribute_strategy::{Strategy, VariableOptions};
use distribute_tpu::{StepBuilder, TpuError, TpuStrategy, TpuVariable};
use distribute_values::{DistributedValues, Leaf, PerReplica, ReduceOp};
use ndarray::{Array1, Array2, s};

pub(crate) const FEATURES: usize = 64;
pub(crate) const GLOBAL_BATCH: usize = 256;
pub(crate) const LEARNING_RATE: f32 = 0.1;

/// Deterministic data: x in [-1, 1), y = x·w* + small noise.
pub(crate) fn data() -> (Array2<f32>, Array1<f32>) {
    let mut state = 0x2545_f491_u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let x = Array2::from_shape_fn((GLOBAL_BATCH, FEATURES), |_| next());
    let w_true = Array1::from_shape_fn(FEATURES, |i| (i as f32 / FEATURES as f32) - 0.5);
    let noise = Array1::from_shape_fn(GLOBAL_BATCH, |_| 0.01 * next());
    let y = x.dot(&w_true) + noise;
    (x, y)
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
                    ctx.all_reduce(
                        ReduceOp::Sum,
                        &Tensor::from_array(&ctx.devices()[0], gradient),
                    )
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
