//! One worker's device list, validated once: canonical names, kinds, indices and hosts, and an
//! error naming the offending entry for every way a list can be wrong.

use std::fmt::Write;

use distribute_device_spec::{DeviceKind, DeviceSpec, DeviceSpecError, LocalDevices};

/// One line per device: how the list reads it.
fn describe(devices: &LocalDevices) -> String {
    let mut out = String::new();
    for device in devices {
        writeln!(
            out,
            "{:<46} kind={:<6} index={} gpu={:?} host={}",
            device.name(),
            device.kind(),
            device.index(),
            device.gpu_index(),
            device.host()
        )
        .unwrap();
    }
    out
}

#[test]
fn lists_are_canonical_and_typed_in_the_order_given() {
    let mut out = String::new();
    for list in [
        &["/cpu:0", "/cpu:1"][..],
        &["/gpu:1", "/device:GPU:0", "/cpu:0"][..],
        &["/job:localhost/device:GPU:0", "/device:GPU:1"][..],
        &["/tpu:3", "/device:XLA_CPU:0", "/gpu:*"][..],
        &["/job:worker/task:1/gpu:0", "/job:worker/task:1/gpu:1"][..],
    ] {
        let devices = LocalDevices::new(list).unwrap();
        writeln!(out, "{list:?} (remote: {})", devices.is_remote()).unwrap();
        out.push_str(&describe(&devices));
        out.push('\n');
    }
    insta::assert_snapshot!(out);
}

#[test]
fn names_are_what_canonicalize_gives() {
    for list in [
        &["/cpu:0", "/gpu:3"][..],
        &["/job:worker/task:2/device:GPU:0"][..],
    ] {
        let devices = LocalDevices::new(list).unwrap();
        let expected: Vec<String> = list
            .iter()
            .map(|d| distribute_device_spec::canonicalize(d, None).unwrap())
            .collect();
        assert_eq!(devices.names().collect::<Vec<_>>(), expected);
        for device in &devices {
            assert_eq!(
                device.host(),
                distribute_device_spec::host_for_device(device.name()).unwrap()
            );
            assert_eq!(device.spec(), &device.name().parse::<DeviceSpec>().unwrap());
        }
    }
}

#[test]
fn kinds_are_matched_as_values() {
    let devices = LocalDevices::new(["/cpu:0", "/gpu:0", "/tpu:0", "/device:CUSTOM:0"]).unwrap();
    let kinds: Vec<&DeviceKind> = devices.iter().map(|d| d.kind()).collect();
    assert_eq!(
        kinds,
        [
            &DeviceKind::Cpu,
            &DeviceKind::Gpu,
            &DeviceKind::Tpu,
            &DeviceKind::Custom
        ]
    );
    let gpus: Vec<Option<usize>> = devices.iter().map(|d| d.gpu_index()).collect();
    assert_eq!(gpus, [None, Some(0), None, None]);
}

#[test]
fn every_invalid_list_is_refused_with_its_offending_entry() {
    let mut out = String::new();
    for list in [
        &[][..],
        &["/cpu:0", "/gpu:x"][..],
        &["/cpu:0", "/device:tpu:0"][..],
        &["/cpu:0", "/job:/gpu:0"][..],
        &["/gpu:0", "/cpu:0", "/device:GPU:0"][..],
        &["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:0"][..],
        &["/device:GPU:0", "/job:worker/task:0/device:GPU:0"][..],
        &["/job:worker/task:0/gpu:0", "/job:worker/task:1/gpu:0"][..],
        &["/job:worker/gpu:0"][..],
    ] {
        let err = LocalDevices::new(list).unwrap_err();
        writeln!(out, "{list:?}\n  {err}").unwrap();
    }
    insta::assert_snapshot!(out);
}

#[test]
fn duplicates_name_both_spellings() {
    assert_eq!(
        LocalDevices::new(["/gpu:0", "/cpu:0", "/device:GPU:0"]).unwrap_err(),
        DeviceSpecError::DuplicateDevice {
            first: "/gpu:0".into(),
            second: "/device:GPU:0".into(),
            canonical: "/job:localhost/replica:0/task:0/device:GPU:0".into(),
        }
    );
}

#[test]
fn invalid_entries_keep_the_parse_error() {
    let err = LocalDevices::new(["/cpu:0", "/gpu:x"]).unwrap_err();
    let DeviceSpecError::InvalidListEntry {
        position,
        device,
        error,
    } = err
    else {
        panic!("expected InvalidListEntry, got {err:?}");
    };
    assert_eq!((position, device.as_str()), (1, "/gpu:x"));
    assert!(
        matches!(
            *error,
            DeviceSpecError::InvalidNumber { field: "index", .. }
        ),
        "{error:?}"
    );
}

#[test]
fn the_list_prints_its_canonical_names() {
    let devices = LocalDevices::new(["/cpu:0", "/gpu:1"]).unwrap();
    assert_eq!(
        devices.to_string(),
        "[/job:localhost/replica:0/task:0/device:CPU:0, /job:localhost/replica:0/task:0/device:GPU:1]"
    );
    assert_eq!(
        devices.host(),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
    assert!(!devices.is_remote());
}

#[test]
fn numbered_constructors_equal_the_spelled_out_lists() {
    assert_eq!(
        LocalDevices::cpus(3),
        LocalDevices::new(["/cpu:0", "/cpu:1", "/cpu:2"]).unwrap()
    );
    assert_eq!(
        LocalDevices::gpus(2),
        LocalDevices::new(["/gpu:0", "/device:GPU:1"]).unwrap()
    );
}

#[test]
#[should_panic(expected = "LocalDevices::cpus(0): a strategy needs at least one device")]
fn no_cpus_is_refused() {
    LocalDevices::cpus(0);
}

#[test]
fn every_list_form_converts_alike_and_is_checked() {
    let expected = LocalDevices::cpus(2);
    let strings = vec!["/cpu:0".to_owned(), "/cpu:1".to_owned()];
    let slice: &[&str] = &["/cpu:0", "/cpu:1"];
    assert_eq!(
        LocalDevices::try_from(&["/cpu:0", "/cpu:1"]).unwrap(),
        expected
    );
    assert_eq!(
        LocalDevices::try_from(["/cpu:0", "/cpu:1"]).unwrap(),
        expected
    );
    assert_eq!(LocalDevices::try_from(slice).unwrap(), expected);
    assert_eq!(LocalDevices::try_from(&strings).unwrap(), expected);
    assert_eq!(LocalDevices::try_from(strings).unwrap(), expected);
    assert_eq!(LocalDevices::from(&expected), expected);
    let empty: Vec<String> = Vec::new();
    assert_eq!(
        LocalDevices::try_from(empty).unwrap_err(),
        DeviceSpecError::EmptyDeviceList
    );
}
