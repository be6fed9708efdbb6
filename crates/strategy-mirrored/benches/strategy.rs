//! `cargo xtask bench strategy`: the step overhead of a `MirroredStrategy` on CPU replicas, one
//! JSON line per case (medians over batches; the machine is shared and noisy):
//!
//! - `run_trivial`: one `run` of a step that only returns its replica id, 1/2/4/8 replicas;
//! - `merge_call`: one `merge_call` round trip inside a run, 2 replicas;
//! - `all_reduce_in_run`: one `run` whose step all-reduces (SUM) an f32 tensor of 4 KiB or 1 MiB
//!   made beforehand, 2 replicas;
//! - `linear_regression_step`: the reference linear-regression SGD step of
//!   `distribute-test-support` (64 features, global batch 256, lr 0.1), 2 replicas.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a quick smoke run that still
//! checks the results.

use std::hint::black_box;
use std::time::{Duration, Instant};

use distribute_device_spec::LocalDevices;
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_tensor::Tensor;
use distribute_test_support::linear_regression::{
    self, FEATURES as LR_FEATURES, GLOBAL_BATCH as LR_BATCH,
};
use distribute_values::{Leaf, ReduceOp};
use serde_json::json;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// How long each batch runs and how many batches the median is taken over.
struct Budget {
    batch: Duration,
    batches: usize,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let budget = if full {
        Budget {
            batch: Duration::from_millis(50),
            batches: 15,
        }
    } else {
        Budget {
            batch: Duration::from_micros(500),
            batches: 3,
        }
    };
    let replica_counts: &[usize] = if full { &[1, 2, 4, 8] } else { &[1, 2, 3] };
    for &replicas in replica_counts {
        let strategy = cpus(replicas);
        check_trivial(&strategy);
        let t = median_s(&budget, || {
            black_box(run_trivial(&strategy));
        });
        println!(
            "{}",
            json!({"bench": "run_trivial", "replicas": replicas, "median_s": t})
        );
    }

    // One merge round trip: a run with K merges minus a run with none, over K. Both runs pay the
    // same dispatch and join, so the difference is what the K merges add; K is large enough that
    // the noise of the two medians, divided by K, is small against one merge.
    const MERGES: usize = 32;
    let strategy = cpus(2);
    check_merges(&strategy, MERGES);
    let with = median_s(&budget, || {
        black_box(run_with_merges(&strategy, MERGES));
    });
    let without = median_s(&budget, || {
        black_box(run_with_merges(&strategy, 0));
    });
    let merge = ((with - without) / MERGES as f64).max(0.0);
    println!(
        "{}",
        json!({"bench": "merge_call", "replicas": 2, "median_s": merge,
               "method": format!("(median run with {MERGES} merges - median run with 0) / {MERGES}"),
               "run_with_merges_s": with, "run_without_s": without})
    );

    // The reference linear-regression step (distribute-test-support) on 2 replicas (TF:
    // 530-740 steps/s).
    let w = strategy
        .create_variable(
            "w",
            Tensor::zeros("/cpu:0", distribute_tensor::DType::F32, &[LR_FEATURES]).unwrap(),
            distribute_strategy::VariableOptions::default(),
        )
        .unwrap();
    let inputs = regression_inputs(&strategy);
    let true_weights = linear_regression::true_weights();
    let distance = |w: &Tensor| -> f32 {
        let w = w.to_vec::<f32>().unwrap();
        w.iter()
            .zip(&true_weights)
            .map(|(x, t)| (x - t) * (x - t))
            .sum()
    };
    let before = distance(&w.component(0).unwrap().read());
    for _ in 0..20 {
        regression_step(&strategy, &w, &inputs);
    }
    // The weights move toward the ones the rows were generated with.
    assert!(distance(&w.component(0).unwrap().read()) < 0.5 * before);
    let t = median_s(&budget, || regression_step(&strategy, &w, &inputs));
    println!(
        "{}",
        json!({"bench": "linear_regression_step", "replicas": 2, "features": LR_FEATURES,
               "global_batch": LR_BATCH, "median_s": t, "steps_per_s": 1.0 / t})
    );

    for bytes in [4 * KIB, MIB] {
        let inputs = all_reduce_inputs(&strategy, bytes);
        check_all_reduce(&strategy, &inputs, bytes);
        let t = median_s(&budget, || {
            black_box(run_all_reduce(&strategy, &inputs));
        });
        println!(
            "{}",
            json!({"bench": "all_reduce_in_run", "replicas": 2, "bytes": bytes, "median_s": t,
                   "algbw_gbps": bytes as f64 / t / 1e9})
        );
    }
}

/// Each replica's contiguous chunk of the first global batch of the reference rows:
/// (features, targets).
fn regression_inputs(strategy: &MirroredStrategy) -> (Leaf<Tensor>, Leaf<Tensor>) {
    let (x, y) = linear_regression::rows(LR_BATCH);
    let x = Tensor::from_vec("/cpu:0", &[LR_BATCH, LR_FEATURES], x).unwrap();
    let y = Tensor::from_vec("/cpu:0", &[LR_BATCH], y).unwrap();
    let map = std::sync::Arc::clone(strategy.extended().device_map());
    let per = LR_BATCH / map.num_replicas();
    let chunk = |t: &Tensor| {
        let parts = map
            .primary_devices()
            .enumerate()
            .map(|(r, d)| t.slice_rows(r * per..(r + 1) * per).unwrap().to_device(d))
            .collect();
        Leaf::PerReplica(
            distribute_values::PerReplica::new(std::sync::Arc::clone(&map), parts).unwrap(),
        )
    };
    (chunk(&x), chunk(&y))
}

/// One SGD step: each replica's gradient sum, all-reduced, applied to its copy of `w`.
fn regression_step(
    strategy: &MirroredStrategy,
    w: &distribute_values::DistributedVariable<Tensor>,
    inputs: &(Leaf<Tensor>, Leaf<Tensor>),
) {
    strategy
        .run(
            |ctx, (x, y)| {
                let weights = ctx.read_variable(w)?.to_vec::<f32>()?;
                let (xs, ys) = (x.array::<f32>()?, y.array::<f32>()?);
                let mut grad = vec![0.0f32; LR_FEATURES];
                for (row, target) in xs.as_slice().unwrap().chunks(LR_FEATURES).zip(ys.iter()) {
                    let residual =
                        row.iter().zip(&weights).map(|(a, b)| a * b).sum::<f32>() - target;
                    for (g, a) in grad.iter_mut().zip(row) {
                        *g += a * residual;
                    }
                }
                let grad = Tensor::from_vec(x.device(), &[LR_FEATURES], grad)?;
                let total = ctx.all_reduce(ReduceOp::Sum, &grad)?;
                // lr / global batch = 0.1 / 256 = 1 / 2560.
                let delta = total.divided_by(2560)?;
                ctx.update_variable(w, distribute_values::UpdateOp::AssignSub, delta)
            },
            inputs,
        )
        .unwrap();
}

fn cpus(n: usize) -> MirroredStrategy {
    MirroredStrategy::new(LocalDevices::cpus(n)).unwrap()
}

fn run_trivial(strategy: &MirroredStrategy) -> Leaf<usize> {
    strategy.run(|ctx, ()| Ok(ctx.replica_id()), &()).unwrap()
}

fn check_trivial(strategy: &MirroredStrategy) {
    let ids: Vec<usize> = run_trivial(strategy)
        .local_results()
        .into_iter()
        .copied()
        .collect();
    assert_eq!(
        ids,
        (0..strategy.num_replicas_in_sync()).collect::<Vec<_>>()
    );
}

/// A run whose step makes `merges` merge calls, each summing the replicas' ids plus the round.
fn run_with_merges(strategy: &MirroredStrategy, merges: usize) -> Leaf<usize> {
    strategy
        .run(
            |ctx, ()| {
                let mut total = 0;
                for round in 0..merges {
                    total += ctx.merge_call(ctx.replica_id() + round, |_, v| {
                        Ok(Leaf::Same(v.local_results().into_iter().sum::<usize>()))
                    })?;
                }
                Ok(total)
            },
            &(),
        )
        .unwrap()
}

fn check_merges(strategy: &MirroredStrategy, merges: usize) {
    // Two replicas: round r sums (0 + r) + (1 + r) = 2r + 1, so the total is merges².
    assert_eq!(
        run_with_merges(strategy, merges),
        Leaf::Same(merges * merges)
    );
}

/// Each replica's tensor of `bytes` bytes of f32, on its device, made once.
fn all_reduce_inputs(strategy: &MirroredStrategy, bytes: usize) -> Leaf<Tensor> {
    strategy
        .run(
            |ctx, ()| {
                let value = ctx.replica_id() as f32 + 1.0;
                Ok(Tensor::from_vec(
                    ctx.device(),
                    &[bytes / 4],
                    vec![value; bytes / 4],
                )?)
            },
            &(),
        )
        .unwrap()
}

fn run_all_reduce(strategy: &MirroredStrategy, inputs: &Leaf<Tensor>) -> Leaf<Tensor> {
    strategy
        .run(|ctx, t| ctx.all_reduce(ReduceOp::Sum, &t), inputs)
        .unwrap()
}

fn check_all_reduce(strategy: &MirroredStrategy, inputs: &Leaf<Tensor>, bytes: usize) {
    let out = run_all_reduce(strategy, inputs);
    // 1 + 2 on two replicas.
    for t in out.local_results() {
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![3.0f32; bytes / 4]);
    }
}

/// The median over `budget.batches` batches of the mean time of one call of `f` in a batch;
/// each batch repeats `f` for about `budget.batch`.
fn median_s(budget: &Budget, mut f: impl FnMut()) -> f64 {
    // Warm up and size the batch.
    let start = Instant::now();
    let mut calibration = 0u32;
    while start.elapsed() < budget.batch / 4 || calibration < 3 {
        f();
        calibration += 1;
    }
    let per_call = start.elapsed().as_secs_f64() / f64::from(calibration);
    let iterations = ((budget.batch.as_secs_f64() / per_call) as usize).max(1);
    let mut samples: Vec<f64> = (0..budget.batches)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed().as_secs_f64() / iterations as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
