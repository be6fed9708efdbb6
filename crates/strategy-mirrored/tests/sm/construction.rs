//! SM-10, SM-11: building the strategy, and COL-31: the cross-device ops it chooses (multi-worker device lists, SM-11..SM-13, are
//! `distribute-multi-worker`'s `tests/cluster.rs`).

use distribute_collectives::{CollectiveError, GroupConfig};
use distribute_device_spec::{DeviceSpecError, LocalDevices};
use distribute_mirrored::{MirroredStrategy, choose_the_best};
use distribute_strategy::{Strategy, StrategyError};

#[test]
fn sm10_construction() {
    let err = MirroredStrategy::new(Vec::<String>::new()).unwrap_err();
    assert!(matches!(err, StrategyError::Invariant(_)), "{err:?}");

    let err = MirroredStrategy::new(&["/gpu:0", "/device:GPU:0"]).unwrap_err();
    match err {
        StrategyError::Invariant(m) => assert!(m.contains("no duplicates"), "{m}"),
        other => panic!("expected Invariant, got {other:?}"),
    }

    let strategy = MirroredStrategy::new(&["/gpu:0", "/cpu:0"]).unwrap();
    assert_eq!(strategy.num_replicas_in_sync(), 2);
    // Stored resolved, in the order given.
    let devices: Vec<&str> = strategy.extended().device_map().primary_devices().collect();
    assert_eq!(
        devices,
        [
            "/job:localhost/replica:0/task:0/device:GPU:0",
            "/job:localhost/replica:0/task:0/device:CPU:0"
        ]
    );
    insta::assert_debug_snapshot!("sm10_gpu_and_cpu", strategy);
    insta::assert_debug_snapshot!("sm10_two_cpus", super::cpus(2));
}

#[test]
fn sm10_an_invalid_device_is_named_by_its_position() {
    let err = MirroredStrategy::new(&["/cpu:0", "/gpu:x"]).unwrap_err();
    let message = err.to_string();
    match err {
        StrategyError::Device(DeviceSpecError::InvalidListEntry {
            position, device, ..
        }) => assert_eq!((position, device.as_str()), (1, "/gpu:x")),
        other => panic!("expected an invalid list entry, got {other:?}"),
    }
    assert!(message.contains("entry 1 ('/gpu:x')"), "{message}");
}

#[test]
fn sm11_devices_of_several_workers_are_refused() {
    let err = MirroredStrategy::new(&["/job:worker/task:0/gpu:0", "/job:worker/task:1/gpu:0"])
        .unwrap_err();
    match err {
        StrategyError::Runtime(m) => assert!(m.contains("several workers"), "{m}"),
        other => panic!("expected Runtime, got {other:?}"),
    }
}

#[test]
fn col31_choose_the_best() {
    let choose = |devices: &[&str]| {
        choose_the_best(&LocalDevices::new(devices).unwrap(), GroupConfig::default())
    };
    let (ops, why) = choose(&["/cpu:0"]).unwrap();
    assert_eq!(ops.name(), "SharedMemoryAllReduce");
    assert!(why.contains("all 1 devices are CPUs"), "{why}");
    let (ops, why) = choose(&["/gpu:0", "/gpu:1"]).unwrap();
    assert_eq!(ops.name(), "ReductionToOneDevice");
    // Without feature `nccl`: "no NCCL backend"; with it, on a machine without NCCL or GPUs,
    // why NCCL could not be used.
    assert!(why.contains("GPU") && why.contains("NCCL"), "{why}");
    let (ops, _) = choose(&["/cpu:0", "/gpu:0"]).unwrap();
    assert_eq!(ops.name(), "ReductionToOneDevice");
    let remote = choose(&["/job:worker/task:1/cpu:0"]).unwrap_err();
    assert!(
        matches!(remote, CollectiveError::Unimplemented(_)),
        "{remote:?}"
    );
    // Invalid and empty lists never reach `choose_the_best`: its device list is validated.
    assert!(LocalDevices::new(["/gpu:x"]).is_err());
    assert!(LocalDevices::new::<&str>([]).is_err());
}
