//! MirroredStrategy on a GPU (feature `cuda`): each replica thread owns its GPU and stream, steps
//! move their input there and all-reduce GPU tensors, and results match a CPU run bitwise.
//!
//! Without a GPU the tests say why and pass, unless `DISTRIBUTE_REQUIRE_GPU=1` (set by
//! `cargo xtask test-gpu`).

use distribute_collectives::GroupConfig;
use distribute_device_spec::LocalDevices;
use distribute_mirrored::{MirroredStrategy, choose_the_best};
use distribute_strategy::{Strategy, StrategyError};
use distribute_tensor::cuda::{Gpu, current_gpu, gpu_count, require_nvrtc, to_current_gpu};
use distribute_tensor::{Placement, Tensor};
use distribute_values::{Leaf, ReduceOp};

fn gpus_or_skip() -> Option<usize> {
    let why = match (gpu_count(), require_nvrtc()) {
        (Ok(n), Ok(())) if n > 0 => return Some(n),
        (Ok(_), Ok(())) => "the driver reports no GPU".to_owned(),
        (Err(e), _) => e.to_string(),
        (_, Err(e)) => e.to_string(),
    };
    assert!(
        std::env::var("DISTRIBUTE_REQUIRE_GPU").map_or(true, |v| v != "1"),
        "a GPU is required here: {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// Replica r's input: 1000 values that make rounding order matter.
fn input(replica: usize) -> Vec<f32> {
    (0..1000)
        .map(|i| ((i * 7919 + replica * 104_729) % 1013) as f32 * 1.0e-3 + 1.0e4 * replica as f32)
        .collect()
}

/// One step: upload the input to the replica's device, all-reduce sum and mean, bring back.
fn step_results(strategy: &MirroredStrategy) -> Result<Vec<(Tensor, Tensor)>, StrategyError> {
    let out: (Leaf<Tensor>, Leaf<Tensor>) = strategy.run(
        |ctx, ()| {
            let device = ctx.device();
            let x = Tensor::from_vec(device, &[1000], input(ctx.replica_id()))?;
            let x = to_current_gpu(&x)?;
            let sum = ctx.all_reduce(ReduceOp::Sum, &x)?;
            let mean = ctx.all_reduce(ReduceOp::Mean, &x)?;
            Ok((sum.to_host()?, mean.to_host()?))
        },
        &(),
    )?;
    let (sums, means) = (out.0.local_results(), out.1.local_results());
    Ok(sums
        .into_iter()
        .cloned()
        .zip(means.into_iter().cloned())
        .collect())
}

#[test]
fn replica_threads_own_their_gpu_and_stream() {
    if gpus_or_skip().is_none() {
        return;
    }
    let strategy = MirroredStrategy::new(&["/gpu:0"]).unwrap();
    let seen: Leaf<Tensor> = strategy
        .run(
            |ctx, ()| {
                let gpu = current_gpu().expect("a GPU replica thread has a current GPU");
                assert_eq!(gpu.ordinal(), 0);
                // Its own stream, not the process-wide handle's.
                assert_ne!(gpu, Gpu::open(0).unwrap());
                let x = Tensor::from_vec(ctx.device(), &[3], vec![1.0f32, 2.0, 3.0])?;
                let on_gpu = to_current_gpu(&x)?;
                assert_eq!(on_gpu.placement(), Placement::Cuda { ordinal: 0 });
                Ok(on_gpu)
            },
            &(),
        )
        .unwrap();
    let t = seen.local_results()[0].to_host().unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
    // The main thread is no replica: it has no current GPU.
    assert!(current_gpu().is_none());
}

#[test]
fn a_gpu_and_a_cpu_replica_match_two_cpu_replicas_bitwise() {
    if gpus_or_skip().is_none() {
        return;
    }
    let mixed = MirroredStrategy::new(&["/gpu:0", "/cpu:0"]).unwrap();
    let cpus = MirroredStrategy::new(&["/cpu:0", "/cpu:1"]).unwrap();
    let on_gpu = step_results(&mixed).unwrap();
    let on_cpu = step_results(&cpus).unwrap();
    for ((gs, gm), (cs, cm)) in on_gpu.iter().zip(&on_cpu) {
        assert!(gs.bitwise_eq(cs), "sum: GPU path {gs} vs CPU {cs}");
        assert!(gm.bitwise_eq(cm), "mean");
    }
}

#[test]
fn every_gpu_gets_a_replica_when_there_are_several() {
    let Some(n) = gpus_or_skip() else { return };
    if n < 2 {
        eprintln!("skipped: one GPU here; several-GPU replicas need two");
        return;
    }
    let strategy = MirroredStrategy::new(LocalDevices::gpus(n)).unwrap();
    eprintln!("{}", strategy.cross_device_ops_reason());
    let reference = step_results(&MirroredStrategy::new(LocalDevices::cpus(n)).unwrap()).unwrap();
    let results = step_results(&strategy).unwrap();
    for ((gs, _), (cs, _)) in results.iter().zip(&reference) {
        // NCCL sums in its own order: equal within rounding, bitwise for two GPUs.
        let (g, c) = (gs.to_vec::<f32>().unwrap(), cs.to_vec::<f32>().unwrap());
        for (a, b) in g.iter().zip(&c) {
            assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
}

#[test]
fn a_missing_gpu_is_a_clear_error() {
    let Some(n) = gpus_or_skip() else { return };
    let err = MirroredStrategy::new(&[format!("/gpu:{n}")]).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

/// Whether this build has the NCCL backend (feature `nccl`, which the GPU bundle builds) and
/// NCCL loads.
#[cfg(feature = "nccl")]
fn nccl_loads() -> bool {
    distribute_nccl::nccl_available()
}

#[cfg(not(feature = "nccl"))]
fn nccl_loads() -> bool {
    false
}

#[test]
fn choose_the_best_says_why_one_gpu_gets_no_nccl() {
    let Some(gpus) = gpus_or_skip() else { return };
    let one_gpu = LocalDevices::new(["/gpu:0"]).unwrap();
    let (ops, why) = choose_the_best(&one_gpu, GroupConfig::default()).unwrap();
    assert_eq!(ops.name(), "ReductionToOneDevice");
    assert!(why.contains("only one GPU"), "{why}");
    // With two GPUs, NCCL where this build has it (feature `nccl`, which the GPU bundle builds)
    // and NCCL loads; else the reason names NCCL.
    if gpus >= 2 {
        let two_gpus = LocalDevices::new(["/gpu:0", "/gpu:1"]).unwrap();
        let (ops, why) = choose_the_best(&two_gpus, GroupConfig::default()).unwrap();
        let nccl = nccl_loads();
        let expected = if nccl {
            "NcclAllReduce"
        } else {
            "ReductionToOneDevice"
        };
        assert_eq!(ops.name(), expected, "{why}");
    }
}
