//! ZeRO (`Config::sharding`) on `MirroredStrategy`: sharded training ends on the bits of
//! unsharded training for every optimizer, on 2 and 3 replicas (uneven shards), with clipping,
//! a schedule and mixed precision; the reduce-scatter's shard is the all-reduce's slice, bit for
//! bit, for every float dtype; each replica holds 1/N of the optimizer's state; a sharded
//! checkpoint holds what an unsharded one holds and restores on another replica count and
//! sharding; misuse is refused with a clear error.

#[path = "../examples/candle_mlp.rs"]
#[allow(dead_code)]
mod example;

use std::num::NonZeroUsize;
use std::path::Path;

use candle_core::{DType, Tensor};
use candle_nn::{Module, Optimizer, ParamsAdamW, VarBuilder};
use distribute_candle::{AdamW, Config, CpuThreads, DataParallel, Precision, Sharding};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::Strategy;
use distribute_values::ReduceOp;
use example::{OptimizerKind, Options, Trained, train};
use half::{bf16, f16};

const SHARDED: [Sharding; 2] = [Sharding::Optimizer, Sharding::OptimizerAndGradients];

/// A small run of the reference workload: hidden 64 (8,970 parameters: on 3 replicas shards
/// of 3,072, 3,072 and 2,826 elements).
fn options(init: &Path, replicas: usize, sharding: Sharding) -> Options {
    Options {
        replicas,
        steps: 10,
        init: Some(init.to_owned()),
        threads: CpuThreads::PerReplica(NonZeroUsize::new(1).unwrap()),
        hidden: 64,
        sharding,
        ..Options::default()
    }
}

fn init(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("init.safetensors");
    train(&Options {
        replicas: 1,
        steps: 0,
        hidden: 64,
        save_init: Some(path.clone()),
        ..Options::default()
    })
    .unwrap();
    path
}

fn bits(trained: &Trained) -> Vec<(String, Vec<u32>)> {
    trained
        .weights
        .iter()
        .map(|(name, w)| (name.clone(), w.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

fn assert_same_bits(a: &Trained, b: &Trained, what: &str) {
    assert_eq!(
        a.losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "{what}: losses"
    );
    assert!(bits(a) == bits(b), "{what}: weights differ");
}

#[test]
fn sharded_training_ends_on_the_bits_of_unsharded_training_for_every_optimizer() {
    let dir = tempfile::tempdir().unwrap();
    let init = init(dir.path());
    type Setting = fn(&mut Options);
    let runs: [(&str, Setting); 5] = [
        ("adamw, warmup-cosine, clipping", |o| {
            o.optimizer = OptimizerKind::AdamW;
            o.lr = Some(3e-3);
            o.warmup = 3;
            o.clip_norm = Some(0.3);
        }),
        ("sgd with momentum and weight decay", |o| {
            o.momentum = 0.9;
            o.weight_decay = Some(1e-3);
        }),
        ("plain sgd", |_| {}),
        ("adamw, bf16 mixed precision", |o| {
            o.optimizer = OptimizerKind::AdamW;
            o.precision = Precision::MixedBf16;
            o.clip_norm = Some(0.5);
        }),
        ("sgd, f16 mixed precision with loss scaling", |o| {
            o.precision = Precision::MixedF16;
        }),
    ];
    for (what, set) in runs {
        for replicas in [2, 3] {
            let mut unsharded = options(&init, replicas, Sharding::None);
            set(&mut unsharded);
            let expected = train(&unsharded).unwrap();
            assert!(expected.losses.last() < expected.losses.first(), "{what}");
            for sharding in SHARDED {
                let mut sharded = unsharded.clone();
                sharded.sharding = sharding;
                let got = train(&sharded).unwrap();
                assert_same_bits(
                    &got,
                    &expected,
                    &format!("{what}, {replicas} replicas, {sharding}"),
                );
                // Each replica holds its shard's moments or buffers, not the whole state.
                if expected.memory.optimizer_state > 16 {
                    assert!(
                        got.memory.optimizer_state
                            < expected.memory.optimizer_state / replicas + 2 * 1024 * 4 + 64,
                        "{what}: {:?} against {:?}",
                        got.memory,
                        expected.memory
                    );
                }
            }
        }
    }
}

#[test]
fn every_copy_stays_in_sync_after_every_step_and_the_state_splits_exactly() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1", "/cpu:2"]).unwrap();
    let build = |vb: VarBuilder| candle_nn::linear(700, 9, vb.pp("l"));
    let unsharded = DataParallel::new(&strategy, Config::default(), build, |v| {
        AdamW::new(v, ParamsAdamW::default())
    })
    .unwrap();
    let config = Config {
        sharding: Sharding::OptimizerAndGradients,
        ..Config::default()
    };
    let sharded = DataParallel::new_sharded(&strategy, config, build, |v| {
        AdamW::new(v, ParamsAdamW::default())
    })
    .unwrap();
    assert_eq!(sharded.sharding(), Sharding::OptimizerAndGradients);
    for step in 0..4 {
        sharded
            .run(&(), |replica, ()| {
                let id = replica.replica_id() as f64;
                let x = (Tensor::ones((3, 700), DType::F32, replica.device())? * (id + 1.0))?;
                let loss = replica.model().forward(&x)?.sqr()?.mean_all()?;
                replica.backward_step(&loss, ReduceOp::Mean)?;
                Ok(())
            })
            .unwrap();
        sharded
            .check_in_sync()
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
    }
    let whole = unsharded.memory().unwrap();
    let shards = sharded.memory().unwrap();
    // 6,309 parameters: AdamW's two f32 moments, split in shards of whole 1,024-element blocks,
    // 3,072 / 3,072 / 165; each replica also holds the step count (8 bytes).
    let moments = |m: &distribute_candle::ReplicaMemory| m.optimizer_state - 8;
    assert_eq!(moments(&whole[0]), 2 * 6309 * 4);
    assert_eq!(
        shards.iter().map(moments).collect::<Vec<_>>(),
        [2 * 3072 * 4, 2 * 3072 * 4, 2 * 165 * 4]
    );
    assert_eq!(
        shards.iter().map(moments).sum::<usize>(),
        moments(&whole[0])
    );
    assert_eq!(shards[0].gradients, 3072 * 4);
    assert_eq!(whole[0].gradients, 6309 * 4);
    assert_eq!(shards[0].parameters, whole[0].parameters);
}

#[test]
fn the_reduce_scatter_shard_is_the_all_reduce_slice_bit_for_bit_for_every_float_dtype() {
    fn values(replica: usize, n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| ((i * 7 + replica * 13) as f64 * 0.61).sin() * 10f64.powi((i % 7) as i32 - 3))
            .collect()
    }
    fn host(device: &str, dtype: DType, v: &[f64]) -> distribute_tensor::Tensor {
        let n = [v.len()];
        match dtype {
            DType::F32 => distribute_tensor::Tensor::from_vec(
                device,
                &n,
                v.iter().map(|&x| x as f32).collect::<Vec<_>>(),
            ),
            DType::F64 => distribute_tensor::Tensor::from_vec(device, &n, v.to_vec()),
            DType::BF16 => distribute_tensor::Tensor::from_vec(
                device,
                &n,
                v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(),
            ),
            DType::F16 => distribute_tensor::Tensor::from_vec(
                device,
                &n,
                v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(),
            ),
            other => panic!("{other:?}"),
        }
        .unwrap()
    }
    for replicas in [2usize, 3] {
        let devices: Vec<String> = (0..replicas).map(|r| format!("/cpu:{r}")).collect();
        let strategy = MirroredStrategy::new(&devices).unwrap();
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::F16] {
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let n = 1024 * replicas * 5;
                let outcome = strategy
                    .run_each(
                        |ctx, ()| {
                            let r = ctx.replica_id();
                            let mine = host(ctx.device(), dtype, &values(r, n));
                            let whole = ctx.all_reduce(op, &mine)?;
                            let shard = ctx.collectives().reduce_scatter(op, &mine)?;
                            let part = n / replicas;
                            let slice = whole.slice_rows(r * part..(r + 1) * part)?;
                            Ok::<_, distribute_strategy::StrategyError>(
                                distribute_candle::to_candle(&shard, &candle_core::Device::Cpu)
                                    .unwrap()
                                    .to_dtype(DType::F64)
                                    .unwrap()
                                    .to_vec1::<f64>()
                                    .unwrap()
                                    .iter()
                                    .map(|x| x.to_bits())
                                    .collect::<Vec<_>>()
                                    == distribute_candle::to_candle(
                                        &slice,
                                        &candle_core::Device::Cpu,
                                    )
                                    .unwrap()
                                    .to_dtype(DType::F64)
                                    .unwrap()
                                    .to_vec1::<f64>()
                                    .unwrap()
                                    .iter()
                                    .map(|x| x.to_bits())
                                    .collect::<Vec<_>>(),
                            )
                        },
                        &(),
                    )
                    .unwrap_or_else(|e| panic!("{dtype:?} {op}: {e}"));
                assert!(
                    outcome.iter().all(|same| *same),
                    "{replicas} replicas, {dtype:?}, {op}: {outcome:?}"
                );
            }
        }
    }
}

#[test]
fn a_sharded_checkpoint_holds_the_unsharded_state_and_restores_on_another_count_and_sharding() {
    let dir = tempfile::tempdir().unwrap();
    let init = init(dir.path());
    let run = |name: &str, replicas, sharding, stop_after| {
        let mut o = options(&init, replicas, sharding);
        o.optimizer = OptimizerKind::AdamW;
        o.clip_norm = Some(0.5);
        o.warmup = 2;
        o.checkpoints = Some((dir.path().join(name), 3));
        o.stop_after = stop_after;
        train(&o).unwrap()
    };
    // Both stop after 6 steps on 2 replicas, one sharded: their checkpoints hold the same
    // entries, to the bit.
    run("unsharded", 2, Sharding::None, Some(6));
    run("sharded", 2, Sharding::OptimizerAndGradients, Some(6));
    let read =
        |name: &str| std::fs::read(dir.path().join(name).join("ckpt-0000000006.dst")).unwrap();
    assert_eq!(
        read("unsharded"),
        read("sharded"),
        "the checkpoints of a sharded and an unsharded run differ"
    );
    // Resumed on 3 replicas with ZeRO-1, and unsharded: the same bits at the end.
    let resumed_sharded = run("sharded", 3, Sharding::Optimizer, None);
    let resumed = run("unsharded", 3, Sharding::None, None);
    assert_eq!(resumed.first_step, 6);
    assert_same_bits(&resumed_sharded, &resumed, "resumed on 3 replicas");
}

#[test]
fn misuse_is_refused_with_a_clear_error() {
    let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let build = |vb: VarBuilder| candle_nn::linear(4, 2, vb.pp("l"));
    let config = Config {
        sharding: Sharding::Optimizer,
        ..Config::default()
    };
    let err = DataParallel::new(&strategy, config, build, |v| {
        AdamW::new(v, ParamsAdamW::default())
    })
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("new_sharded"), "{err}");
    let model = DataParallel::new_sharded(&strategy, config, build, |v| {
        AdamW::new(v, ParamsAdamW::default())
    })
    .unwrap();
    let err = model
        .run(&(), |replica, ()| {
            let x = Tensor::ones((1, 4), DType::F32, replica.device())?;
            let loss = replica.model().forward(&x)?.sum_all()?;
            let grads = loss.backward()?;
            replica.all_reduce_gradients(&grads, ReduceOp::Sum)?;
            Ok(())
        })
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sharded") && err.contains("backward_step"),
        "{err}"
    );
}
