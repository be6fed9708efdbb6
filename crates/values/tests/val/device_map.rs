//! VAL-30..VAL-33: replica device maps (TF's 2019 device-map API), with logical devices.

use distribute_values::{ErrorKind, ReplicaDeviceMap, ValuesError};

#[test]
fn val_30_duplicate_devices_are_rejected() {
    let devices = [
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:0",
    ];
    let err = ReplicaDeviceMap::new(devices).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        err,
        ValuesError::DuplicateDevice {
            device: devices[0].into()
        }
    );
    // Across logical devices of different replicas too.
    let err = ReplicaDeviceMap::with_logical_devices([["a", "b"], ["c", "a"]]).unwrap_err();
    assert_eq!(err, ValuesError::DuplicateDevice { device: "a".into() });
    // And an empty list.
    let none: Vec<String> = Vec::new();
    assert_eq!(
        ReplicaDeviceMap::new(none).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn val_31_accessors() {
    let map = ReplicaDeviceMap::new(["/device:CPU:0", "/device:GPU:0"]).unwrap();
    assert_eq!(
        map.all_devices().collect::<Vec<_>>(),
        ["/device:CPU:0", "/device:GPU:0"]
    );
    assert_eq!(map.num_replicas(), 2);
    assert_eq!(map.num_logical_devices(), 1);
    assert_eq!(map.devices_for_replica(1).unwrap(), ["/device:GPU:0"]);
    assert_eq!(map.replica_for_device("/device:GPU:1"), None);
    let err = map.require_replica_for_device("/device:GPU:1").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(map.is_device_in_replica("/device:GPU:0", 1));
    assert!(!map.is_device_in_replica("/device:GPU:0", 0));
    assert!(!map.is_device_in_replica("/device:GPU:0", 5));
    assert_eq!(
        map.devices_for_replica(2).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn val_31_logical_devices() {
    let map = ReplicaDeviceMap::with_logical_devices([
        ["/device:TPU:0", "/device:TPU:1"],
        ["/device:TPU:2", "/device:TPU:3"],
    ])
    .unwrap();
    assert_eq!(map.num_replicas(), 2);
    assert_eq!(map.num_logical_devices(), 2);
    assert_eq!(map.replica_for_device("/device:TPU:1"), Some(0));
    assert_eq!(map.replica_for_device("/device:TPU:2"), Some(1));
    assert_eq!(
        map.primary_devices().collect::<Vec<_>>(),
        ["/device:TPU:0", "/device:TPU:2"]
    );
    assert_eq!(
        map.logical_device(1).unwrap(),
        ["/device:TPU:1", "/device:TPU:3"]
    );
    assert!(map.is_device_in_replica("/device:TPU:3", 1));
}

#[test]
fn val_32_single_device_map() {
    let map = ReplicaDeviceMap::new(["/job:localhost/replica:0/task:0/device:CPU:0"]).unwrap();
    assert_eq!(map.num_replicas(), 1);
    let err = map.require_replica_for_device("/job:localhost/replica:0/task:0/device:GPU:0");
    assert_eq!(err.unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn val_33_display_forms() {
    let map = ReplicaDeviceMap::new(["d0", "d1"]).unwrap();
    assert_eq!(map.to_string(), "[d0, d1]");
    assert_eq!(format!("{map:?}"), "ReplicaDeviceMap(['d0', 'd1'])");
    let logical = ReplicaDeviceMap::with_logical_devices([
        [
            "/job:worker/task:0/device:TPU:0",
            "/job:worker/task:0/device:TPU:1",
        ],
        [
            "/job:worker/task:1/device:TPU:0",
            "/job:worker/task:1/device:TPU:1",
        ],
    ])
    .unwrap();
    let eight = ReplicaDeviceMap::new(
        (0..8).map(|i| format!("/job:localhost/replica:0/task:0/device:GPU:{i}")),
    )
    .unwrap();
    insta::assert_snapshot!(
        "val_33_device_maps",
        format!("{map}\n{map:?}\n{logical}\n{logical:?}\n{eight}\n{eight:?}")
    );
}
