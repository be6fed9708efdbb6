//! The NCCL backend on a real GPU: single-rank plumbing and results against the host kernel
//! (what `choose_the_best` picks is `distribute-mirrored`'s `gpu` suite). Ranks in separate processes, whose NCCL unique
//! id crosses processes, are tested with the exchange (`distribute-nccl-exchange`'s
//! `nccl_cluster` suite).
//!
//! Without a GPU or NCCL the tests say why and pass, unless `DISTRIBUTE_REQUIRE_GPU=1` /
//! `DISTRIBUTE_REQUIRE_NCCL=1` (set by `cargo xtask test-gpu`), which make them fail.

use std::time::Duration;

use distribute_collectives::{
    CollectiveError, CrossDeviceOps, Destinations, GroupConfig, ReductionToOneDevice,
};
use distribute_nccl::NcclAllReduce;
use distribute_nccl::require_nccl;
use distribute_tensor::cuda::{Gpu, gpu_count, require_nvrtc};
use distribute_tensor::{AnyTensor, Placement, Tensor, TensorError};
use distribute_values::{Leaf, ReduceOp};
use half::bf16;

const DEADLINE: Duration = Duration::from_secs(60);

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// The first GPU, when there is one and NCCL loads; else why not (a failure when required).
fn gpu_with_nccl() -> Option<Gpu> {
    let why = match (gpu_count(), require_nccl(), require_nvrtc()) {
        (Err(e), ..) | (_, Err(e), _) | (_, _, Err(e)) => e.to_string(),
        (Ok(0), ..) => "the driver reports no GPU".to_owned(),
        (Ok(_), Ok(()), Ok(())) => return Some(Gpu::open(0).expect("GPU 0 opens")),
    };
    assert!(
        !required("DISTRIBUTE_REQUIRE_GPU") && !required("DISTRIBUTE_REQUIRE_NCCL"),
        "a GPU and NCCL are required here: {why}"
    );
    eprintln!("skipped: {why}");
    None
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37 - 11.0) * scale).collect()
}

#[test]
fn one_rank_reduces_gathers_scatters_and_broadcasts() {
    let Some(gpu) = gpu_with_nccl() else { return };
    let version = NcclAllReduce::nccl_version().unwrap();
    eprintln!("NCCL {version} on {}", gpu.name().unwrap());
    let ops = NcclAllReduce::new(&[0], DEADLINE).unwrap();
    let member = ops.replica_collectives(0).unwrap();
    let x = Tensor::from_vec("/gpu:0", &[4, 3], ramp(12, 1.0))
        .unwrap()
        .to_gpu(&gpu)
        .unwrap();

    let sum = member.all_reduce(ReduceOp::Sum, &x).unwrap();
    assert_eq!(sum.placement(), Placement::Cuda { ordinal: 0 });
    assert!(sum.bitwise_eq(&x), "a world of one sums to its input");
    let mean = member.all_reduce(ReduceOp::Mean, &x).unwrap();
    assert!(mean.bitwise_eq(&x));

    let b = Tensor::from_vec(
        "/gpu:0",
        &[2],
        vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)],
    )
    .unwrap()
    .to_gpu(&gpu)
    .unwrap();
    let batch = member
        .batch_all_reduce(ReduceOp::Max, &[x.clone(), b.clone()])
        .unwrap();
    assert!(batch[0].bitwise_eq(&x) && batch[1].bitwise_eq(&b));

    let gathered = member.all_gather(&x).unwrap();
    assert!(gathered.bitwise_eq(&x));
    let scattered = member.reduce_scatter(ReduceOp::Sum, &x).unwrap();
    assert!(scattered.bitwise_eq(&x));
    let root = member.broadcast(0, Some(&x)).unwrap();
    assert!(root.bitwise_eq(&x));

    // A host input gives a host result.
    let host = Tensor::from_vec("/gpu:0", &[3], vec![1i64, -2, 3]).unwrap();
    let out = member.all_reduce(ReduceOp::Sum, &host).unwrap();
    assert_eq!(out.placement(), Placement::Host);
    assert_eq!(out.to_vec::<i64>().unwrap(), [1, -2, 3]);

    assert!(matches!(
        member.all_reduce(ReduceOp::Mean, &host),
        Err(CollectiveError::Tensor(TensorError::IntegerMean(_)))
    ));
    // Each replica's communicator is taken once.
    assert!(ops.replica_collectives(0).is_err());
}

#[test]
fn cross_replica_reduce_matches_the_host_backend_bitwise() {
    let Some(gpu) = gpu_with_nccl() else { return };
    let ops = NcclAllReduce::new(&[0], DEADLINE).unwrap();
    let host_ops = ReductionToOneDevice::new(3, GroupConfig::default()).unwrap();
    let values: Vec<Tensor> = (0..3)
        .map(|r| Tensor::from_vec("/gpu:0", &[1000], ramp(1000, r as f32 + 0.1)).unwrap())
        .collect();
    let on_gpu: Vec<AnyTensor> = values
        .iter()
        .map(|t| AnyTensor::Dense(t.to_gpu(&gpu).unwrap()))
        .collect();
    let on_host: Vec<AnyTensor> = values.into_iter().map(AnyTensor::Dense).collect();
    let dest = Destinations::device("/gpu:0").unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max] {
        let Leaf::Same(AnyTensor::Dense(a)) = ops.reduce(op, &on_gpu, &dest).unwrap() else {
            panic!("one destination")
        };
        let Leaf::Same(AnyTensor::Dense(b)) = host_ops.reduce(op, &on_host, &dest).unwrap() else {
            panic!("one destination")
        };
        assert_eq!(a.placement(), Placement::Cuda { ordinal: 0 });
        assert!(a.bitwise_eq(&b), "{op}");
    }
}
