//! Feeding TPU steps from `distribute-input` (TPU-14, TPU-15, TPU-20, TPU-21, TPU-22 of the
//! reference behaviours): input workers by host, where batches land, per-replica replication
//! refused, and a short last batch padded to the compiled shape so the step compiles once. On
//! the devices the plugin offers (`devices/mod.rs`).

use distribute_input::{Dataset, InputOptions, InputReplicationMode, PartialBatch};
use distribute_pjrt::stablehlo::DotDims;
use distribute_strategy::{Strategy, StrategyError, VariableOptions};
use distribute_tensor::Tensor;
use distribute_tpu::{
    DeviceAssignment, StepInput, TpuConfig, TpuStrategy, input_workers_for, replica_order,
};
use distribute_values::{DistributedValues, ReduceOp, VariableAggregation};

mod devices;
use devices::{has, strategy, up_to};

#[test]
fn tpu_14_input_workers_group_replicas_by_host() {
    let s = strategy(up_to(4));
    let workers = s.input_workers().unwrap();
    assert_eq!(workers.num_workers(), 1);
    assert_eq!(
        workers.host(0),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
    assert_eq!(workers.devices(0), s.worker_devices());
    // Several hosts, in the order their first replica appears.
    let workers = input_workers_for(&[
        "/job:tpu/task:1/device:TPU:0",
        "/job:tpu/task:0/device:TPU:0",
        "/job:tpu/task:1/device:TPU:1",
        "/job:tpu/task:0/device:TPU:1",
    ])
    .unwrap();
    assert_eq!(workers.num_workers(), 2);
    assert_eq!(workers.host(0), "/job:tpu/replica:0/task:1/device:CPU:0");
    assert_eq!(workers.host(1), "/job:tpu/replica:0/task:0/device:CPU:0");
    assert_eq!(
        workers.devices(1),
        [
            "/job:tpu/replica:0/task:0/device:TPU:0",
            "/job:tpu/replica:0/task:0/device:TPU:1"
        ]
    );
}

#[test]
fn tpu_15_host_counts() {
    // No assignment: from the topology.
    let n = up_to(4);
    let s = strategy(n);
    assert_eq!(s.num_hosts().unwrap(), 1);
    assert_eq!(s.num_replicas_per_host(), n);
    if !has(4) {
        return;
    }
    // With one: distinct hosts among the replicas; min(replicas, cores per host / cores per
    // replica).
    let topology = TpuStrategy::topology_for(4).unwrap();
    let one = DeviceAssignment::new(topology, &[vec![vec![0, 0, 0, 1]]]).unwrap();
    let s = TpuStrategy::new(TpuConfig {
        device_assignment: Some(one),
        ..TpuConfig::cpu(4)
    })
    .unwrap();
    assert_eq!(s.num_hosts().unwrap(), 1);
    assert_eq!(s.num_replicas_per_host(), 1);
}

#[test]
fn tpu_20_replica_order_sorts_by_job_replica_type_task_index() {
    let devices = [
        "/job:worker/replica:0/task:0/device:TPU:0",
        "/job:worker/replica:0/task:0/device:TPU:2",
        "/job:worker/replica:0/task:1/device:TPU:0",
        "/job:worker/replica:0/task:1/device:TPU:2",
        "/job:worker/replica:0/task:1/device:TPU:6",
        "/job:worker/replica:0/task:1/device:TPU:4",
        "/job:worker/replica:0/task:0/device:TPU:6",
        "/job:worker/replica:0/task:0/device:TPU:4",
    ];
    assert_eq!(replica_order(&devices).unwrap(), [0, 1, 7, 6, 2, 3, 5, 4]);
    let n = up_to(4);
    assert_eq!(
        replica_order(&strategy(n).worker_devices()).unwrap(),
        (0..n).collect::<Vec<_>>()
    );
}

#[test]
fn tpu_21_per_replica_replication_is_not_implemented() {
    let s = strategy(up_to(2));
    let options = InputOptions {
        replication_mode: InputReplicationMode::PerReplica,
        fetch_to_device: false,
        ..InputOptions::default()
    };
    let dataset = || Dataset::range(8).batch(4, false).unwrap();
    let err = s.distribute_dataset(dataset(), options).err().unwrap();
    assert!(matches!(err, StrategyError::Unimplemented(_)), "{err}");
    let err = s
        .distribute_datasets_from_function(options, |_| Ok(dataset()))
        .err()
        .unwrap();
    assert!(matches!(err, StrategyError::Unimplemented(_)), "{err}");
}

#[test]
fn tpu_22_batches_land_on_the_tpu_unless_fetch_to_device_is_off() {
    let s = strategy(up_to(2));
    let dataset = || Dataset::range(8).batch(4, false).unwrap();
    for options in [
        InputOptions::default(),
        InputOptions {
            fetch_to_device: true,
            ..InputOptions::default()
        },
    ] {
        let dist = s.distribute_dataset(dataset(), options).unwrap();
        let step = dist.iter_per_replica().next().unwrap().unwrap();
        for (r, t) in step.values().iter().enumerate() {
            assert_eq!(
                t.device(),
                format!("/job:localhost/replica:0/task:0/device:TPU:{r}")
            );
        }
    }
    let off = InputOptions {
        fetch_to_device: false,
        ..InputOptions::default()
    };
    let dist = s.distribute_dataset(dataset(), off).unwrap();
    let step = dist.iter_per_replica().next().unwrap().unwrap();
    for t in step.values() {
        assert_eq!(t.device(), "/job:localhost/replica:0/task:0/device:CPU:0");
    }
}

#[test]
fn a_short_last_batch_is_padded_and_the_step_compiles_once() {
    if !has(2) {
        return;
    }
    let s = strategy(2);
    // 0..10 in global batches of 4: [0..4], [4..8], [8, 9]; the last gives each replica one
    // row, padded to two.
    let dist = s
        .distribute_dataset(
            Dataset::range(10).batch(4, false).unwrap(),
            InputOptions::default(),
        )
        .unwrap();
    let total = s
        .create_device_variable(
            "total",
            VariableOptions {
                aggregation: VariableAggregation::None,
                ..VariableOptions::default()
            },
            |d| Ok(Tensor::scalar(d, 0.0f32)),
        )
        .unwrap();
    // total += Σ_replicas Σ_rows x · mask.
    let step = s.function(|b, args| {
        let (total, x, mask) = (&args[0], &args[1], &args[2]);
        let x = b.convert(x, distribute_pjrt::ElementType::F32);
        let masked = b.dot_general(
            &x,
            mask,
            &DotDims {
                lhs_contracting: vec![0],
                rhs_contracting: vec![0],
                ..DotDims::default()
            },
        )?;
        let summed = b.all_reduce(ReduceOp::Sum, &masked)?;
        Ok(vec![b.add(total, &summed)?])
    });
    let mut steps = 0;
    for batch in s.device_batches(dist.iter_masked(), 2) {
        let batch = batch.unwrap();
        assert_eq!(batch.len(), 2, "the batch and its mask");
        assert_eq!(batch[0].ty().dims, [2], "every step has the full shape");
        step.run_updating(
            &[&total],
            &[StepInput::Device(&batch[0]), StepInput::Device(&batch[1])],
        )
        .unwrap();
        steps += 1;
    }
    assert_eq!(steps, 3);
    assert_eq!(step.compilations(), 1);
    assert_eq!(
        total
            .read_cross_replica(None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        [45.0]
    );
    // DropRemainder is kept: the short batch is dropped.
    let dropped = s
        .distribute_dataset(
            Dataset::range(10).batch(4, false).unwrap(),
            InputOptions {
                partial_batch: PartialBatch::DropRemainder,
                ..InputOptions::default()
            },
        )
        .unwrap();
    assert_eq!(dropped.iter().count(), 2);
}
