//! Canonical device names, host devices and local device lists: DS-23..DS-34.

use distribute_device_spec::{
    DEFAULT_HOST, DeviceSpec, DeviceSpecError, all_local_devices, canonicalize,
    canonicalize_on_host, host_for_device, local_devices_from_num_gpus, resolve,
};

fn spec(s: &str) -> DeviceSpec {
    s.parse().unwrap()
}

/// (device, default, expected canonical name) for `canonicalize`.
fn check_canonicalize(cases: &[(&str, Option<&str>, &str)]) {
    for (device, default, expected) in cases {
        assert_eq!(
            canonicalize(device, *default).unwrap(),
            *expected,
            "canonicalize({device:?}, {default:?})"
        );
    }
}

#[test]
fn ds23_ds24_scope_device_is_merged_then_canonical() {
    // The merged scope is `current()` before canonicalization (DS-23)...
    for (scopes, merged) in [
        (&["/cpu:0"][..], "/device:CPU:0"),
        (&["/job:worker", "/cpu:0"][..], "/job:worker/device:CPU:0"),
        (&["/cpu:0", "/gpu:0"][..], "/device:GPU:0"),
    ] {
        let current = scopes.iter().fold(DeviceSpec::new(), |outer, inner| {
            outer.merged_with(&spec(inner))
        });
        assert_eq!(current.to_string(), merged);
    }
    // ...and with eager semantics it canonicalizes on job localhost (DS-24).
    assert_eq!(
        resolve("", &spec("/cpu:0")).unwrap(),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
}

#[test]
fn ds25_canonicalize_without_default() {
    check_canonicalize(&[
        (
            "/cpu:0",
            None,
            "/job:localhost/replica:0/task:0/device:CPU:0",
        ),
        (
            "/job:worker/cpu:0",
            None,
            "/job:worker/replica:0/task:0/device:CPU:0",
        ),
        (
            "/job:worker/task:1/cpu:0",
            None,
            "/job:worker/replica:0/task:1/device:CPU:0",
        ),
    ]);
}

#[test]
fn ds26_canonicalize_with_default() {
    check_canonicalize(&[
        (
            "/job:worker/task:1/cpu:0",
            Some("/gpu:0"),
            "/job:worker/replica:0/task:1/device:CPU:0",
        ),
        (
            "/job:worker/task:1",
            Some("/gpu:0"),
            "/job:worker/replica:0/task:1/device:GPU:0",
        ),
        (
            "/cpu:0",
            Some("/job:worker"),
            "/job:worker/replica:0/task:0/device:CPU:0",
        ),
        (
            "/job:worker/replica:0/task:1/device:CPU:0",
            Some("/job:chief/replica:0/task:1/device:CPU:0"),
            "/job:worker/replica:0/task:1/device:CPU:0",
        ),
    ]);
}

#[test]
fn ds27_precedence_builtin_then_host_then_default_then_device() {
    let host = spec("/job:worker/replica:0/task:0/device:CPU:0");
    let cases = [
        ("/cpu:0", None, "/job:worker/replica:0/task:0/device:CPU:0"),
        ("", None, "/job:worker/replica:0/task:0/device:CPU:0"),
        // The default beats the host...
        (
            "/gpu:1",
            Some("/job:chief/task:2"),
            "/job:chief/replica:0/task:2/device:GPU:1",
        ),
        // ...and the argument beats the default.
        (
            "/job:ps/task:3",
            Some("/job:chief/task:2"),
            "/job:ps/replica:0/task:3/device:CPU:0",
        ),
    ];
    for (device, default, expected) in cases {
        assert_eq!(
            canonicalize_on_host(device, default, &host).unwrap(),
            expected
        );
    }
    // A host without a job leaves the eager default job, localhost.
    assert_eq!(
        canonicalize_on_host("/gpu:0", None, &spec("/task:5")).unwrap(),
        "/job:localhost/replica:0/task:0/device:GPU:0"
    );
}

#[test]
fn ds28_resolve_uses_the_scope_as_default() {
    let gpu_scope = spec("/gpu:0");
    assert_eq!(
        resolve("/job:worker/task:1/cpu:0", &gpu_scope).unwrap(),
        "/job:worker/replica:0/task:1/device:CPU:0"
    );
    assert_eq!(
        resolve("/job:worker/task:1", &gpu_scope).unwrap(),
        "/job:worker/replica:0/task:1/device:GPU:0"
    );
    assert_eq!(
        resolve("/cpu:0", &spec("/job:worker")).unwrap(),
        "/job:worker/replica:0/task:0/device:CPU:0"
    );
}

#[test]
fn ds29_spellings_of_the_local_cpu_canonicalize_alike() {
    for device in ["", "/device:CPU:0", "/cpu:0", "/CPU:0"] {
        assert_eq!(
            canonicalize(device, None).unwrap(),
            DEFAULT_HOST,
            "{device:?}"
        );
    }
}

#[test]
fn ds30_long_form_type_must_be_upper_case() {
    // cpu and gpu are upper-cased while parsing, so they are accepted...
    assert_eq!(
        canonicalize("/device:cpu:0", None).unwrap(),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
    // ...any other lower-case long-form type is refused, in the device or the default.
    for (device, default) in [("/device:tpu:0", None), ("/task:1", Some("/device:Tpu:0"))] {
        let err = canonicalize(device, default).unwrap_err();
        assert!(
            matches!(&err, DeviceSpecError::DeviceTypeNotUpperCase { device_type, .. }
                if device_type.eq_ignore_ascii_case("tpu")),
            "{err:?}"
        );
        assert!(err.to_string().contains("must be all upper-case"), "{err}");
    }
    // Short forms are upper-cased, so `/tpu:0` is fine.
    assert!(canonicalize("/tpu:0", None).is_ok());
}

#[test]
fn ds30_invalid_device_strings_propagate_parse_errors() {
    assert!(matches!(
        canonicalize("/device:GPU:x", None),
        Err(DeviceSpecError::InvalidNumber { .. })
    ));
    assert!(matches!(
        canonicalize("/cpu:0", Some("/bogus:1")),
        Err(DeviceSpecError::UnknownComponent { .. })
    ));
}

#[test]
fn ds31_logical_device_names_canonicalize() {
    // A logical device is handed over by its name.
    let logical_device_name = String::from("/job:localhost/replica:0/task:0/device:CPU:1");
    assert_eq!(
        canonicalize(&logical_device_name, None).unwrap(),
        logical_device_name
    );
}

#[test]
fn ds32_ds34_host_for_device_keeps_job_replica_task() {
    for (device, host) in [
        (
            "/job:worker/replica:0/task:1/device:GPU:3",
            "/job:worker/replica:0/task:1/device:CPU:0",
        ),
        ("/device:TPU:5", "/device:CPU:0"),
        ("/job:w/task:1/device:GPU:3", "/job:w/task:1/device:CPU:0"),
    ] {
        assert_eq!(host_for_device(device).unwrap(), host, "{device}");
    }
    assert!(host_for_device("/job:w/task:x").is_err());
}

#[test]
fn ds33_local_devices_from_num_gpus() {
    assert_eq!(local_devices_from_num_gpus(0), ["/device:CPU:0"]);
    assert_eq!(
        local_devices_from_num_gpus(2),
        ["/device:GPU:0", "/device:GPU:1"]
    );
}

#[test]
fn sm09_all_local_devices_cut_to_the_limit_or_cpu() {
    assert_eq!(
        all_local_devices(3, None),
        ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]
    );
    assert_eq!(all_local_devices(3, Some(1)), ["/device:GPU:0"]);
    assert_eq!(all_local_devices(1, Some(4)), ["/device:GPU:0"]);
    assert_eq!(all_local_devices(0, None), ["/device:CPU:0"]);
    assert_eq!(all_local_devices(0, Some(2)), ["/device:CPU:0"]);
}
