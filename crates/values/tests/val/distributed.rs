//! DistributedValues, PerReplica, Mirrored: VAL-19, VAL-20, VAL-22, VAL-23, VAL-26, VAL-27 (the
//! read inside replica i) and VAL-28 (components and back, mapping over leaves).
//!
//! Left out on purpose, as the crate docs' "Deliberate departures from TF" explain: VAL-21,
//! VAL-24, VAL-25, VAL-29, the implicit-conversion cases of VAL-27 and the tracing cases of
//! VAL-28.

use std::sync::Arc;

use distribute_values::{
    DistributedValues, ErrorKind, Leaf, Mirrored, PerReplica, ReplicaDeviceMap, regroup,
    select_replica,
};

use crate::per_replica;

const CPU: &str = "/device:CPU:0";
const GPU0: &str = "/device:GPU:0";
const GPU2: &str = "/device:GPU:2";

fn cpu_gpu() -> Arc<ReplicaDeviceMap> {
    Arc::new(ReplicaDeviceMap::new([CPU, GPU0]).unwrap())
}

#[test]
fn val_19_get_by_device() {
    let v = PerReplica::new(cpu_gpu(), vec!["one", "two"]).unwrap();
    assert_eq!(v.get_on_device(GPU0).unwrap(), &"two");
    assert_eq!(v.get_on_device(CPU).unwrap(), &"one");
    let err = v.get_on_device(GPU2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains(GPU2), "{err}");
}

#[test]
fn val_20_local_read_in_replica_one() {
    let v = PerReplica::new(cpu_gpu(), vec!["one", "two"]).unwrap();
    assert_eq!(v.get(1).unwrap(), &"two");
    // Outside the replicas the read goes to the cross-replica path (VAL-23 for PerReplica).
    assert_eq!(
        v.read_cross_replica(None).unwrap_err().kind(),
        ErrorKind::Unimplemented
    );
}

#[test]
fn val_22_mirrored_cross_replica_read_prefers_the_current_device() {
    let v = Mirrored::new(cpu_gpu(), vec![1.0, 1.5]).unwrap();
    let cases = [
        (Some(GPU0), 1.5),
        (Some(CPU), 1.0),
        (Some(GPU2), 1.0),
        (None, 1.0),
    ];
    for (device, expected) in cases {
        assert_eq!(
            v.read_cross_replica(device).unwrap(),
            &expected,
            "{device:?}"
        );
    }
}

#[test]
fn val_23_per_replica_has_no_cross_replica_read() {
    let v = PerReplica::new(cpu_gpu(), vec![1, 2]).unwrap();
    let err = v.read_cross_replica(Some(CPU)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unimplemented);
}

#[test]
fn val_26_display_shows_replicas_and_devices() {
    let v = PerReplica::new(cpu_gpu(), vec!["a", "b"]).unwrap();
    assert_eq!(
        v.to_string(),
        "PerReplica:{\n  0 /device:CPU:0: a,\n  1 /device:GPU:0: b\n}"
    );
    let m = Mirrored::new(cpu_gpu(), vec![7, 7]).unwrap();
    insta::assert_snapshot!("val_26_mirrored_display", m.to_string());
    insta::assert_snapshot!("val_26_per_replica_debug", format!("{v:#?}"));
}

#[test]
fn val_27_inside_replica_i_the_value_is_component_i() {
    let v = PerReplica::new(cpu_gpu(), vec![10, 20]).unwrap();
    for (replica, expected) in [(0, 10), (1, 20)] {
        assert_eq!(v.get(replica).unwrap(), &expected, "replica {replica}");
    }
    assert_eq!(v.get(2).unwrap_err().kind(), ErrorKind::InvalidArgument);
    let m = Mirrored::new(cpu_gpu(), vec![1.0, 1.0]).unwrap();
    assert_eq!(m.get(1).unwrap(), &m.values()[1]);
    let by_iteration: Vec<(usize, &str, &i32)> = v.iter().collect();
    assert_eq!(by_iteration, [(0, CPU, &10), (1, GPU0, &20)]);
    assert_eq!((&v).into_iter().collect::<Vec<_>>(), [&10, &20]);
}

#[test]
fn val_28_components_and_back_and_map_over_leaves() {
    let v = PerReplica::new(cpu_gpu(), vec![1.0, 2.0]).unwrap();
    let (values, devices) = v.clone().into_parts();
    assert_eq!(PerReplica::new(devices, values).unwrap(), v);

    // Mapping +10 over the leaves of (1.0, [5, 6]).
    let structure = (1.0, vec![5, 6]);
    let grouped = regroup(&cpu_gpu(), vec![structure.clone(), structure]).unwrap();
    let plus_ten = |leaf: &Leaf<f64>| match leaf {
        Leaf::Same(x) => Leaf::Same(x + 10.0),
        Leaf::PerReplica(p) => Leaf::PerReplica(p.clone().map(|x| x + 10.0)),
        Leaf::Mirrored(m) => Leaf::Mirrored(m.clone().map(|x| x + 10.0)),
    };
    let ints_plus_ten = |leaf: &Leaf<i32>| match leaf {
        Leaf::Same(x) => Leaf::Same(x + 10),
        other => other.clone(),
    };
    let mapped = (
        plus_ten(&grouped.0),
        grouped.1.iter().map(ints_plus_ten).collect::<Vec<_>>(),
    );
    assert_eq!(
        select_replica::<(f64, Vec<i32>)>(0, &mapped).unwrap(),
        (11.0, vec![15, 16])
    );

    let shifted = v.map(|x| x + 10.0);
    assert_eq!(per_replica(&Leaf::PerReplica(shifted)), [11.0, 12.0]);
}
