//! ZeRO across workers under `mpirun` (feature `mpi`): on 2 workers × 1 replica and 2 workers ×
//! 2 replicas, ZeRO-1 and ZeRO-2 training with AdamW, a schedule and clipping ends on the bits
//! of the same job unsharded (and 2 × 1 on those of 1 process × 2 replicas); the cross-worker
//! reduce-scatter's shard is the all-reduce's slice, bit for bit, for every float dtype. The
//! workers are this test binary started by `mpirun`, running the `candle_mlp` example's code.
#![cfg(feature = "mpi")]

#[path = "../examples/candle_mlp.rs"]
#[allow(dead_code)]
mod example;

use std::num::NonZeroUsize;
use std::time::Duration;

use candle_core::DType;
use distribute_candle::{CpuThreads, Sharding};
use distribute_device_spec::LocalDevices;
use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::Strategy;
use distribute_test_support::mpirun::{run_self, write_result};
use distribute_values::ReduceOp;
use example::{OptimizerKind, Options, train, train_on};
use half::{bf16, f16};

const INIT: &str = "DISTRIBUTE_TEST_ZERO_INIT";
const REPLICAS: &str = "DISTRIBUTE_TEST_ZERO_REPLICAS";
const LIMIT: Duration = Duration::from_secs(300);
const SHARDINGS: [Sharding; 3] = [
    Sharding::None,
    Sharding::Optimizer,
    Sharding::OptimizerAndGradients,
];

/// AdamW with warmup and clipping on the reference workload, hidden 64 (8,970 parameters).
fn options(init: &str, replicas: usize, sharding: Sharding) -> Options {
    Options {
        replicas,
        steps: 8,
        init: Some(init.into()),
        threads: CpuThreads::PerReplica(NonZeroUsize::new(1).unwrap()),
        hidden: 64,
        optimizer: OptimizerKind::AdamW,
        lr: Some(3e-3),
        warmup: 2,
        clip_norm: Some(0.5),
        sharding,
        ..Options::default()
    }
}

/// Whether every replica's reduce-scatter shard equals its slice of the all-reduce, for every
/// float dtype and for Sum and Mean.
fn reduce_scatter_is_the_all_reduce_slice(strategy: &MultiWorkerMirroredStrategy) -> bool {
    let n = strategy.num_replicas_in_sync();
    let mut all = true;
    // Small buffers fold whole on every worker, large ones (64 KiB on) are reduce-scattered.
    for (len, dtype) in [3, 24]
        .into_iter()
        .flat_map(|k| [DType::F32, DType::F64, DType::BF16, DType::F16].map(|d| (1024 * n * k, d)))
    {
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let same = strategy
                .run_each(
                    |ctx, ()| {
                        let r = ctx.replica_id();
                        let v: Vec<f64> = (0..len)
                            .map(|i| {
                                ((i * 5 + r * 11) as f64 * 0.73).cos() * 1e3 / (1 + i % 9) as f64
                            })
                            .collect();
                        let d = ctx.device();
                        let mine = match dtype {
                            DType::F32 => distribute_tensor::Tensor::from_vec(
                                d,
                                &[len],
                                v.iter().map(|&x| x as f32).collect::<Vec<_>>(),
                            ),
                            DType::F64 => distribute_tensor::Tensor::from_vec(d, &[len], v),
                            DType::BF16 => distribute_tensor::Tensor::from_vec(
                                d,
                                &[len],
                                v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(),
                            ),
                            _ => distribute_tensor::Tensor::from_vec(
                                d,
                                &[len],
                                v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(),
                            ),
                        }?;
                        let whole = ctx.all_reduce(op, &mine)?;
                        let shard = ctx.collectives().reduce_scatter(op, &mine)?;
                        let part = len / n;
                        let slice = whole.slice_rows(r * part..(r + 1) * part)?;
                        let bytes = |t: &distribute_tensor::Tensor| {
                            distribute_candle::from_candle(
                                &distribute_candle::to_candle(t, &candle_core::Device::Cpu)
                                    .unwrap()
                                    .to_dtype(DType::F64)
                                    .unwrap(),
                                "/cpu:0",
                            )
                            .unwrap()
                            .to_vec::<f64>()
                            .unwrap()
                            .iter()
                            .map(|x| x.to_bits())
                            .collect::<Vec<_>>()
                        };
                        Ok::<_, distribute_strategy::StrategyError>(bytes(&shard) == bytes(&slice))
                    },
                    &(),
                )
                .unwrap();
            all &= same.iter().all(|s| *s);
        }
    }
    all
}

#[test]
#[ignore = "a worker process: started by mpirun from sharded_jobs_across_workers_end_on_the_unsharded_bits"]
fn zero_worker() {
    let init = std::env::var(INIT).expect("started by the launching test");
    let replicas: usize = std::env::var(REPLICAS).unwrap().parse().unwrap();
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices: LocalDevices::cpus(replicas),
        deadline: Duration::from_secs(120),
        ..MultiWorkerConfig::default()
    })
    .unwrap();
    let scatter_ok = reduce_scatter_is_the_all_reduce_slice(&strategy);
    let mut runs = serde_json::Map::new();
    for sharding in SHARDINGS {
        let trained = train_on(&strategy, &options(&init, replicas, sharding)).unwrap();
        runs.insert(
            sharding.to_string(),
            serde_json::json!({"weights": trained.weights, "losses": trained.losses,
                               "optimizer_state": trained.memory.optimizer_state}),
        );
    }
    if strategy.is_chief() {
        write_result(&serde_json::json!({"scatter_ok": scatter_ok, "runs": runs}).to_string());
    }
}

fn bits(run: &serde_json::Value) -> String {
    // Each f32 as its bits: JSON numbers print the shortest decimal that reads back the same.
    let weights: std::collections::BTreeMap<String, Vec<f32>> =
        serde_json::from_value(run["weights"].clone()).unwrap();
    let losses: Vec<f32> = serde_json::from_value(run["losses"].clone()).unwrap();
    format!(
        "{:?} {:?}",
        losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        weights
            .iter()
            .map(|(k, v)| (k, v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()))
            .collect::<Vec<_>>()
    )
}

#[test]
fn sharded_jobs_across_workers_end_on_the_unsharded_bits() {
    let dir = tempfile::tempdir().unwrap();
    let init = dir.path().join("init.safetensors");
    write_initial_values_hidden_64(&init);
    let init = init.to_str().unwrap().to_owned();
    let single = train(&options(&init, 2, Sharding::None)).unwrap();
    for replicas in [1usize, 2] {
        let job = run_self(
            "zero_worker",
            2,
            &[(INIT, init.clone()), (REPLICAS, replicas.to_string())],
            LIMIT,
        );
        let json: serde_json::Value = serde_json::from_str(job.chief_result()).unwrap();
        assert_eq!(json["scatter_ok"], true, "2 workers × {replicas}");
        let unsharded = bits(&json["runs"]["none"]);
        for sharding in ["zero1", "zero2"] {
            let run = &json["runs"][sharding];
            assert!(
                bits(run) == unsharded,
                "2 workers × {replicas}, {sharding}: not the unsharded bits"
            );
            let whole = json["runs"]["none"]["optimizer_state"].as_u64().unwrap();
            let shard = run["optimizer_state"].as_u64().unwrap();
            assert!(
                shard < whole / (2 * replicas as u64) + 2 * 1024 * 4 + 64,
                "{sharding}: {shard} bytes of state against {whole}"
            );
        }
        if replicas == 1 {
            let json_losses: Vec<f32> =
                serde_json::from_value(json["runs"]["zero2"]["losses"].clone()).unwrap();
            assert_eq!(json_losses, single.losses, "2 workers × 1 against 1 × 2");
        }
    }
}

/// Initial values of the hidden-64 model.
fn write_initial_values_hidden_64(path: &std::path::Path) {
    train(&Options {
        replicas: 1,
        steps: 0,
        hidden: 64,
        save_init: Some(path.to_owned()),
        ..Options::default()
    })
    .unwrap();
}
