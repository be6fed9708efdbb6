//! Cross-replica reductions and broadcasts through `CrossDeviceOps`: COL-01..COL-18, COL-29, COL-30,
//! COL-35 (COL-31, choosing the ops, is `distribute-mirrored`'s `choose_the_best`), and agreement between the cross-replica and in-replica paths.

use std::sync::Arc;

use distribute_collectives::{
    CollectiveError, CrossDeviceOps, Destinations, GroupConfig, ReductionToOneDevice,
    SharedMemoryAllReduce, reduce_non_distributed_value,
};
use distribute_tensor::{AnyTensor, IndexedSlices, Tensor};
use distribute_values::{DistributedValues, Leaf, ReduceOp};

const CPU: &str = "/job:localhost/replica:0/task:0/device:CPU:0";
const GPU0: &str = "/job:localhost/replica:0/task:0/device:GPU:0";
const GPU1: &str = "/job:localhost/replica:0/task:0/device:GPU:1";

fn backends(n: usize) -> Vec<Arc<dyn CrossDeviceOps>> {
    vec![
        Arc::new(ReductionToOneDevice::new(n, GroupConfig::default()).unwrap()),
        Arc::new(SharedMemoryAllReduce::new(n, GroupConfig::default()).unwrap()),
    ]
}

fn scalar_on(device: &str, value: f32) -> AnyTensor {
    AnyTensor::Dense(Tensor::scalar(device, value))
}

/// The value(s) of a reduction result with their devices.
fn delivered(result: &Leaf<AnyTensor>) -> Vec<(String, Vec<f32>)> {
    let dense = |t: &AnyTensor| t.to_dense().unwrap().to_vec::<f32>().unwrap();
    match result {
        Leaf::Same(t) => vec![(t.device().to_owned(), dense(t))],
        Leaf::Mirrored(m) => m
            .values()
            .iter()
            .map(|t| (t.device().to_owned(), dense(t)))
            .collect(),
        Leaf::PerReplica(_) => panic!("reductions never give PerReplica"),
    }
}

#[test]
fn col01_col02_destinations_are_validated() {
    assert!(
        Destinations::device("")
            .unwrap_err()
            .to_string()
            .contains("can not be empty")
    );
    assert!(
        Destinations::devices(Vec::<String>::new())
            .unwrap_err()
            .to_string()
            .contains("can not be empty")
    );
    assert!(Destinations::device("/bogus:1").is_err());
    let untagged = AnyTensor::Dense(Tensor::scalar("", 1.0f32));
    assert!(Destinations::of_value(&untagged).is_err());
    let on_gpu = AnyTensor::Dense(Tensor::scalar("/gpu:0", 1.0f32));
    assert_eq!(Destinations::of_value(&on_gpu).unwrap().as_slice(), [GPU0]);
    assert!(
        Destinations::devices(["/cpu:0", "/device:CPU:0"]).is_err(),
        "a device twice"
    );
}

#[test]
fn col03_non_distributed_values() {
    let dest = Destinations::devices(["/cpu:0", "/gpu:0"]).unwrap();
    let five = Tensor::scalar(CPU, 5.0f32);
    let err = reduce_non_distributed_value(ReduceOp::Sum, &five, &dest, 2).unwrap_err();
    assert!(matches!(err, CollectiveError::InvalidArgument(_)));
    assert!(err.to_string().contains("ReduceOp.SUM"), "{err}");
    // MEAN keeps the value, SUM of one replica too, and zeros sum to zeros.
    for (op, replicas, value) in [
        (ReduceOp::Mean, 2, 5.0f32),
        (ReduceOp::Sum, 1, 5.0),
        (ReduceOp::Sum, 4, 0.0),
    ] {
        let result =
            reduce_non_distributed_value(op, &Tensor::scalar(CPU, value), &dest, replicas).unwrap();
        let Leaf::Mirrored(m) = result else {
            panic!("two destinations give Mirrored")
        };
        assert_eq!(
            m.values()
                .iter()
                .map(|t| t.to_vec::<f32>().unwrap()[0])
                .collect::<Vec<_>>(),
            [value, value]
        );
    }
}

#[test]
fn col07_destinations_match_devices_as_a_set() {
    let dest = Destinations::devices(["/gpu:1", "/gpu:0"]).unwrap();
    assert!(dest.matches(&[scalar_on(GPU0, 1.0), scalar_on("/gpu:1", 2.0)]));
    assert!(!dest.matches(&[scalar_on(GPU0, 1.0)]));
    assert!(!dest.matches(&[scalar_on(GPU0, 1.0), scalar_on(CPU, 2.0)]));
}

#[test]
fn col08_col14_broadcast_to_each_destination_kind() {
    for ops in backends(2) {
        let one = Tensor::scalar(CPU, 1.0f32);
        let mirrored = ops
            .broadcast(&one, &Destinations::devices([GPU0, GPU1]).unwrap())
            .unwrap();
        let Leaf::Mirrored(m) = mirrored else {
            panic!("Mirrored for two devices")
        };
        assert_eq!(m.devices().collect::<Vec<_>>(), [GPU0, GPU1]);
        assert!(
            m.values()
                .iter()
                .all(|t| t.to_vec::<f32>().unwrap() == [1.0])
        );
        let single = ops
            .broadcast(&one, &Destinations::device("/gpu:1").unwrap())
            .unwrap();
        assert!(
            matches!(&single, Leaf::Same(t) if t.device() == GPU1),
            "{single:?}"
        );
    }
}

#[test]
fn col09_empty_values_are_refused() {
    for ops in backends(2) {
        let err = ops
            .reduce(ReduceOp::Sum, &[], &Destinations::device(CPU).unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}

/// t0 = [[1, 2]] at [1]; t1 = [[3, 4], [5, 6]] at [1, 3]; dense shape [5, 2].
fn sparse_inputs(devices: [&str; 2]) -> Vec<AnyTensor> {
    let t0 = IndexedSlices::new(
        Tensor::from_vec(devices[0], &[1, 2], vec![1.0f32, 2.0]).unwrap(),
        vec![1],
        vec![5, 2],
    )
    .unwrap();
    let t1 = IndexedSlices::new(
        Tensor::from_vec(devices[1], &[2, 2], vec![3.0f32, 4.0, 5.0, 6.0]).unwrap(),
        vec![1, 3],
        vec![5, 2],
    )
    .unwrap();
    vec![t0.into(), t1.into()]
}

#[test]
fn col10_col11_sparse_values_reduce_by_concatenation() {
    for ops in backends(2) {
        let dest = Destinations::devices([CPU, GPU0]).unwrap();
        let cases = [
            (
                ReduceOp::Sum,
                vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
                vec![0., 0., 4., 6., 0., 0., 5., 6., 0., 0.],
            ),
            (
                ReduceOp::Mean,
                vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0],
                vec![0., 0., 2., 3., 0., 0., 2.5, 3., 0., 0.],
            ),
        ];
        for (op, values, dense) in cases {
            let result = ops.reduce(op, &sparse_inputs([CPU, GPU0]), &dest).unwrap();
            let Leaf::Mirrored(m) = result else {
                panic!("Mirrored on both devices")
            };
            for (device, value) in m.devices().zip(m.values()) {
                let AnyTensor::Sparse(s) = value else {
                    panic!("stays sparse")
                };
                assert_eq!(s.indices(), [1, 1, 3]);
                assert_eq!(s.values().to_vec::<f32>().unwrap(), values);
                assert_eq!(s.device(), device);
                assert_eq!(s.to_dense().unwrap().to_vec::<f32>().unwrap(), dense);
            }
        }
        assert!(
            ops.reduce(ReduceOp::Max, &sparse_inputs([CPU, GPU0]), &dest)
                .is_err()
        );
        let mixed = vec![sparse_inputs([CPU, GPU0]).remove(0), scalar_on(GPU0, 1.0)];
        assert!(
            ops.reduce(ReduceOp::Sum, &mixed, &dest)
                .unwrap_err()
                .to_string()
                .contains("dense and sparse")
        );
    }
}

#[test]
fn col12_col13_dense_reduce_and_batch_reduce_to_every_destination_kind() {
    for devices in [vec![CPU], vec![CPU, GPU0], vec![GPU0, GPU1]] {
        let n = devices.len();
        for ops in backends(n) {
            let first: Vec<AnyTensor> = devices
                .iter()
                .enumerate()
                .map(|(i, d)| scalar_on(d, i as f32))
                .collect();
            let second: Vec<AnyTensor> = devices
                .iter()
                .enumerate()
                .map(|(i, d)| scalar_on(d, i as f32 + 1.0))
                .collect();
            let destinations = [
                Destinations::devices(&devices).unwrap(),
                Destinations::device(CPU).unwrap(),
                Destinations::device("/cpu:0").unwrap(),
            ];
            let nf = n as f32;
            for dest in &destinations {
                let expect = |v: f32| {
                    dest.as_slice()
                        .iter()
                        .map(|d| (d.clone(), vec![v]))
                        .collect::<Vec<_>>()
                };
                let mean = ops.reduce(ReduceOp::Mean, &first, dest).unwrap();
                assert_eq!(
                    delivered(&mean),
                    expect((nf - 1.0) / 2.0),
                    "{} {devices:?}",
                    ops.name()
                );
                assert_eq!(
                    delivered(&ops.reduce(ReduceOp::Sum, &first, dest).unwrap()),
                    expect(nf * (nf - 1.0) / 2.0)
                );
                assert_eq!(
                    delivered(&ops.reduce(ReduceOp::Mean, &second, dest).unwrap()),
                    expect((nf + 1.0) / 2.0)
                );
                assert_eq!(
                    delivered(&ops.reduce(ReduceOp::Sum, &second, dest).unwrap()),
                    expect(nf * (nf + 1.0) / 2.0)
                );
                // One destination comes back unwrapped.
                assert_eq!(matches!(mean, Leaf::Same(_)), dest.len() == 1);
            }
            // COL-13: batch_reduce over every pair of destination kinds equals single reduces.
            for d1 in &destinations {
                for d2 in &destinations {
                    let batch = ops
                        .batch_reduce(ReduceOp::Sum, &[(&first, d1), (&second, d2)])
                        .unwrap();
                    assert_eq!(batch.len(), 2);
                    assert_eq!(
                        delivered(&batch[0]),
                        delivered(&ops.reduce(ReduceOp::Sum, &first, d1).unwrap())
                    );
                    assert_eq!(
                        delivered(&batch[1]),
                        delivered(&ops.reduce(ReduceOp::Sum, &second, d2).unwrap())
                    );
                }
            }
        }
    }
}

#[test]
fn col15_one_value_on_its_destination_is_returned_without_reducing() {
    for ops in backends(1) {
        // MAX of a sparse value is refused by the reduction, so getting it back proves the
        // reduction never ran.
        let sparse = sparse_inputs([GPU0, GPU0]).remove(0);
        let result = ops.reduce(
            ReduceOp::Max,
            std::slice::from_ref(&sparse),
            &Destinations::device("/gpu:0").unwrap(),
        );
        assert_eq!(result.unwrap(), Leaf::Same(sparse.clone()));
        // Elsewhere, the reduction runs.
        assert!(
            ops.reduce(
                ReduceOp::Max,
                &[sparse],
                &Destinations::device(CPU).unwrap()
            )
            .is_err()
        );
    }
}

#[test]
fn col16_reduce_device_order() {
    let values = [scalar_on(GPU1, 1.0), scalar_on(GPU0, 2.0)];
    let dest = Destinations::devices([GPU0, CPU]).unwrap();
    let plain = ReductionToOneDevice::new(2, GroupConfig::default()).unwrap();
    assert_eq!(
        plain.reduce_device_for(&values, &dest),
        GPU0,
        "first destination"
    );
    let pinned = ReductionToOneDevice::new(2, GroupConfig::default())
        .unwrap()
        .with_reduce_device("/cpu:0")
        .unwrap();
    assert_eq!(
        pinned.reduce_device_for(&values, &dest),
        CPU,
        "configured device"
    );
}

#[test]
fn col17_reducing_a_mirrored_value_to_itself_with_mean() {
    for ops in backends(2) {
        let mirrored = [scalar_on(CPU, 1.0), scalar_on(GPU0, 1.0)];
        let dest = Destinations::devices([CPU, GPU0]).unwrap();
        assert_eq!(
            delivered(&ops.reduce(ReduceOp::Mean, &mirrored, &dest).unwrap()),
            [(CPU.to_owned(), vec![1.0]), (GPU0.to_owned(), vec![1.0])]
        );
    }
}

#[test]
fn col20_sparsity_is_visible() {
    let values = sparse_inputs([CPU, CPU]);
    assert!(values.iter().all(AnyTensor::is_sparse));
    assert!(!scalar_on(CPU, 1.0).is_sparse());
}

#[test]
fn col29_values_without_devices_of_their_own_land_on_the_destinations() {
    let v = [scalar_on(CPU, 1.0), scalar_on(CPU, 2.0)];
    for ops in backends(2) {
        let dest = Destinations::devices([CPU, GPU0]).unwrap();
        let batch = ops
            .batch_reduce(ReduceOp::Sum, &[(&v, &dest), (&v, &dest)])
            .unwrap();
        for result in &batch {
            assert_eq!(
                delivered(result),
                [(CPU.to_owned(), vec![3.0]), (GPU0.to_owned(), vec![3.0])]
            );
        }
    }
}

#[test]
fn col30_concurrent_batch_reduces_do_not_interfere() {
    for ops in backends(2) {
        let dest = Destinations::devices([CPU, GPU0]).unwrap();
        type Delivered = Vec<(String, Vec<f32>)>;
        let results: Vec<Vec<Delivered>> = std::thread::scope(|s| {
            let handles: Vec<_> = [1.0f32, 2.0]
                .into_iter()
                .map(|x| {
                    let (ops, dest) = (&ops, &dest);
                    s.spawn(move || {
                        let v = [scalar_on(CPU, x), scalar_on(GPU0, x)];
                        let mut last = Vec::new();
                        for _ in 0..50 {
                            let batch = ops
                                .batch_reduce(ReduceOp::Sum, &[(&v, dest), (&v, dest)])
                                .unwrap();
                            last = batch.iter().map(delivered).collect();
                            assert!(last.iter().flatten().all(|(_, v)| v == &[2.0 * x]));
                        }
                        last
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (result, x) in results.iter().zip([2.0f32, 4.0]) {
            for pair in result {
                assert!(pair.iter().all(|(_, v)| v == &[x]), "{pair:?}");
            }
        }
    }
}

#[test]
fn col35_copies_keep_value_and_kind() {
    let dense = Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0]).unwrap();
    let moved = dense.to_device("/gpu:0");
    assert_eq!(
        (moved.device(), moved.to_vec::<f32>().unwrap()),
        ("/gpu:0", vec![1.0, 2.0])
    );
    let sparse = sparse_inputs([CPU, CPU]).remove(0).to_device("/gpu:0");
    assert!(
        matches!(&sparse, AnyTensor::Sparse(s) if s.device() == "/gpu:0" && s.indices() == [1])
    );
}

#[test]
fn cross_replica_reduce_and_replica_all_reduce_give_the_same_bits() {
    let n = 3;
    let inputs: Vec<Tensor> = (0..n)
        .map(|r| {
            let v: Vec<f32> = (0..50_000)
                .map(|i| ((i * 31 + r * 17) % 97) as f32 * 0.37e-3 - 0.01 * r as f32)
                .collect();
            Tensor::from_vec(&format!("/cpu:{r}"), &[50_000], v).unwrap()
        })
        .collect();
    for ops in backends(n) {
        let values: Vec<AnyTensor> = inputs.iter().cloned().map(AnyTensor::Dense).collect();
        let dest = Destinations::device("/cpu:0").unwrap();
        let Leaf::Same(AnyTensor::Dense(cross)) =
            ops.reduce(ReduceOp::Mean, &values, &dest).unwrap()
        else {
            panic!("one dense result")
        };
        let in_replica: Vec<Tensor> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|r| {
                    let (ops, input) = (&ops, &inputs[r]);
                    s.spawn(move || {
                        ops.replica_collectives(r)
                            .unwrap()
                            .all_reduce(ReduceOp::Mean, input)
                            .unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for t in in_replica {
            assert!(t.bitwise_eq(&cross), "{}", ops.name());
        }
    }
}

#[test]
fn fused_batch_reduce_equals_one_by_one_bitwise() {
    let n = 3;
    let devices = ["/cpu:0", "/cpu:1", "/cpu:2"];
    let pair_values: Vec<Vec<AnyTensor>> = (0..12)
        .map(|k| {
            devices
                .iter()
                .enumerate()
                .map(|(r, d)| {
                    let len = 1 + k * 37;
                    let v: Vec<f32> = (0..len)
                        .map(|i| ((i + 3 * r + k) % 11) as f32 * 0.13 - 0.5)
                        .collect();
                    AnyTensor::Dense(Tensor::from_vec(d, &[len], v).unwrap())
                })
                .collect()
        })
        .collect();
    let all = Destinations::devices(devices).unwrap();
    let one = Destinations::device("/cpu:1").unwrap();
    let pairs: Vec<(&[AnyTensor], &Destinations)> = pair_values
        .iter()
        .enumerate()
        .map(|(k, v)| (v.as_slice(), if k % 3 == 0 { &one } else { &all }))
        .collect();
    for bytes_per_pack in [0, 64, 1 << 20] {
        let cfg = GroupConfig {
            bytes_per_pack,
            ..GroupConfig::default()
        };
        let backends: Vec<Arc<dyn CrossDeviceOps>> = vec![
            Arc::new(ReductionToOneDevice::new(n, cfg).unwrap()),
            Arc::new(SharedMemoryAllReduce::new(n, cfg).unwrap()),
        ];
        for ops in backends {
            let batched = ops.batch_reduce(ReduceOp::Mean, &pairs).unwrap();
            for ((values, dest), result) in pairs.iter().zip(&batched) {
                let single = ops.reduce(ReduceOp::Mean, values, dest).unwrap();
                let (a, b) = (result.local_results(), single.local_results());
                assert_eq!(a.len(), b.len());
                for (x, y) in a.iter().zip(&b) {
                    assert_eq!(x.device(), y.device());
                    assert!(
                        x.to_dense().unwrap().bitwise_eq(&y.to_dense().unwrap()),
                        "{bytes_per_pack}"
                    );
                }
            }
        }
    }
}
