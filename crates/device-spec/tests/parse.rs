//! Parsing, printing, building and merging device specs: DS-01..DS-22, DS-36, DS-37.

use distribute_device_spec::{DeviceSpec, DeviceSpecError};

fn parse(s: &str) -> DeviceSpec {
    s.parse()
        .unwrap_or_else(|e| panic!("'{s}' should parse: {e}"))
}

/// Each input parses and prints as the expected canonical-order string.
fn check_prints(cases: &[(&str, &str)]) {
    for (input, expected) in cases {
        assert_eq!(parse(input).to_string(), *expected, "input '{input}'");
    }
}

/// Each input fails to parse, and the message contains every expected fragment.
fn check_rejects(cases: &[(&str, &[&str])]) {
    for (input, fragments) in cases {
        let err = input
            .parse::<DeviceSpec>()
            .expect_err(&format!("'{input}' should be rejected"));
        let message = err.to_string();
        for fragment in *fragments {
            assert!(message.contains(fragment), "'{input}': {message}");
        }
    }
}

#[test]
fn ds01_empty_spec_prints_empty_and_parses_from_empty() {
    assert_eq!(DeviceSpec::new().to_string(), "");
    let spec = parse("");
    assert_eq!(spec, DeviceSpec::new());
    assert!(spec.is_empty());
    assert_eq!(
        (
            spec.job(),
            spec.replica(),
            spec.task(),
            spec.device_type(),
            spec.device_index()
        ),
        (None, None, None, None, None)
    );
}

#[test]
fn ds02_fields_read_back_and_print_canonically() {
    let spec = DeviceSpec::new()
        .with_job("j")
        .unwrap()
        .with_replica(0)
        .with_task(1)
        .with_device("CPU", 2)
        .unwrap();
    assert_eq!(spec.job(), Some("j"));
    assert_eq!(spec.replica(), Some(0));
    assert_eq!(spec.task(), Some(1));
    assert_eq!(spec.device_type(), Some("CPU"));
    assert_eq!(spec.device_index(), Some(2));
    assert_eq!(spec.to_string(), "/job:j/replica:0/task:1/device:CPU:2");
    let gpu = DeviceSpec::new().with_device("GPU", 0).unwrap();
    assert_eq!(gpu.to_string(), "/device:GPU:0");
}

#[test]
fn ds03_printing_uses_job_replica_task_device_order() {
    check_prints(&[
        ("/replica:0/job:foo", "/job:foo/replica:0"),
        ("/job:foo/task:0/replica:0", "/job:foo/replica:0/task:0"),
        (
            "/device:GPU:0/task:0/replica:0/job:foo",
            "/job:foo/replica:0/task:0/device:GPU:0",
        ),
    ]);
}

#[test]
fn ds04_type_without_index_prints_wildcard() {
    let spec = DeviceSpec::new()
        .with_job("foo")
        .unwrap()
        .with_replica(12)
        .with_task(3)
        .with_device("GPU", None)
        .unwrap();
    assert_eq!(spec.to_string(), "/job:foo/replica:12/task:3/device:GPU:*");
    assert_eq!(spec.device_index(), None);
}

#[test]
fn ds05_builder_upper_cases_cpu_and_gpu_only() {
    let cpu = DeviceSpec::new()
        .with_job("foo")
        .unwrap()
        .with_task(3)
        .with_device("cpu", 0)
        .unwrap();
    assert_eq!(cpu.to_string(), "/job:foo/task:3/device:CPU:0");
    let gpu = DeviceSpec::new()
        .with_job("foo")
        .unwrap()
        .with_replica(12)
        .with_device("gpu", 2)
        .unwrap();
    assert_eq!(gpu.to_string(), "/job:foo/replica:12/device:GPU:2");
    let tpu = DeviceSpec::new().with_device("tpu", 0).unwrap();
    assert_eq!(
        tpu.device_type(),
        Some("tpu"),
        "only cpu and gpu are upper-cased"
    );
}

#[test]
fn ds06_legacy_short_form_equals_long_form() {
    let short = parse("/replica:1/task:0/cpu:0");
    let long = parse("/replica:1/task:0/device:CPU:0");
    assert_eq!(short, long);
    assert_eq!(
        (
            short.replica(),
            short.task(),
            short.device_type(),
            short.device_index()
        ),
        (Some(1), Some(0), Some("CPU"), Some(0))
    );
    assert_eq!(short.to_string(), "/replica:1/task:0/device:CPU:0");
}

#[test]
fn ds07_ds08_long_form_round_trips_any_type_keeping_case() {
    let spec = parse("/job:muu/device:GPU:2");
    assert_eq!(
        (spec.job(), spec.device_type(), spec.device_index()),
        (Some("muu"), Some("GPU"), Some(2))
    );
    check_prints(&[
        ("/job:muu/device:GPU:2", "/job:muu/device:GPU:2"),
        (
            "/job:muu/device:MyFunnyDevice:2",
            "/job:muu/device:MyFunnyDevice:2",
        ),
    ]);
}

#[test]
fn ds09_to_ds12_malformed_specs_are_rejected_with_the_reason() {
    check_rejects(&[
        // DS-09: two device types.
        ("/job:muu/device:GPU:2/cpu:0", &["multiple device types"]),
        ("/cpu:0/device:GPU:2", &["multiple device types"]),
        // DS-10: replica or task not an integer.
        ("/job:j/replica:foo", &["replica must be a number", "'foo'"]),
        ("/job:j/task:bar", &["task must be a number", "'bar'"]),
        // DS-11: unknown component, named.
        ("/barcpugpu:muu/baz:2", &["unknown component 'barcpugpu'"]),
        // DS-12: bad component shapes.
        ("/device:GPU", &["unknown component 'device'"]),
        ("/job:a:b", &["unknown component 'job'"]),
        (
            "/device:GPU:x",
            &["index must be a number or '*'", "/device:GPU:x"],
        ),
        // Empty values would not print back.
        ("/job:", &["job '' is not allowed"]),
        ("/device::0", &["device type '' is not allowed"]),
        ("/:0", &["unknown component ''"]),
    ]);
}

#[test]
fn ds09_ds10_ds11_error_variants_are_distinct() {
    assert!(matches!(
        "/cpu:0/gpu:0".parse::<DeviceSpec>(),
        Err(DeviceSpecError::MultipleDeviceTypes { .. })
    ));
    assert!(matches!(
        "/task:x".parse::<DeviceSpec>(),
        Err(DeviceSpecError::InvalidNumber { field: "task", .. })
    ));
    assert!(matches!(
        "/foo:1".parse::<DeviceSpec>(),
        Err(DeviceSpecError::UnknownComponent { .. })
    ));
}

#[test]
fn ds13_empty_components_are_ignored_and_leading_slash_optional() {
    assert_eq!(parse("job:foo"), parse("/job:foo"));
    check_prints(&[("/job:foo//task:1/", "/job:foo/task:1"), ("//", "")]);
}

#[test]
fn ds14_short_form_without_index_or_with_star_leaves_index_unset() {
    for input in ["/gpu", "/GPU:*", "/device:GPU:*", "gpu"] {
        let spec = parse(input);
        assert_eq!(spec.device_index(), None, "{input}");
        assert_eq!(spec.to_string(), "/device:GPU:*", "{input}");
    }
}

#[test]
fn ds15_last_repeated_key_wins() {
    assert_eq!(parse("/job:a/job:b").job(), Some("b"));
    assert_eq!(parse("/task:1/task:2").task(), Some(2));
}

#[test]
fn ds16_short_form_types_are_current_tf_set_case_insensitive() {
    check_prints(&[
        ("/tpu:1", "/device:TPU:1"),
        ("/Cpu:0", "/device:CPU:0"),
        ("/custom:3", "/device:CUSTOM:3"),
        ("/epu:0", "/device:EPU:0"),
    ]);
    check_rejects(&[("/xpu:0", &["unknown component 'xpu'"])]);
}

#[test]
fn ds17_replace_chain() {
    let steps = [
        (DeviceSpec::new().with_job("foo").unwrap(), "/job:foo"),
        (parse("/job:foo").with_task(3), "/job:foo/task:3"),
        (
            parse("/job:foo/task:3").with_device("CPU", 0).unwrap(),
            "/job:foo/task:3/device:CPU:0",
        ),
        (
            parse("/job:foo/task:3/device:CPU:0")
                .with_task(None)
                .with_replica(12),
            "/job:foo/replica:12/device:CPU:0",
        ),
        (
            parse("/job:foo/replica:12/device:CPU:0")
                .with_device("GPU", 2)
                .unwrap(),
            "/job:foo/replica:12/device:GPU:2",
        ),
        (
            parse("/job:foo/replica:12/device:GPU:2")
                .with_device("CPU", 1)
                .unwrap(),
            "/job:foo/replica:12/device:CPU:1",
        ),
        (
            parse("/job:foo/replica:12/device:CPU:1")
                .with_device(None, None)
                .unwrap(),
            "/job:foo/replica:12",
        ),
    ];
    for (spec, expected) in steps {
        assert_eq!(spec.to_string(), expected);
    }
}

#[test]
fn ds17_builders_reject_names_that_would_not_print_back() {
    for job in ["", "a/b", "a:b"] {
        assert!(matches!(
            DeviceSpec::new().with_job(job),
            Err(DeviceSpecError::InvalidName { field: "job", .. })
        ));
    }
    assert!(DeviceSpec::new().with_device("GP:U", 0).is_err());
    assert!(DeviceSpec::new().with_device("", 0).is_err());
}

#[test]
fn ds18_merge_incoming_fields_override() {
    let merged = parse("/job:foo/replica:0").merged_with(&parse("/task:1/device:GPU:2"));
    assert_eq!(merged.to_string(), "/job:foo/replica:0/task:1/device:GPU:2");

    let mut running = DeviceSpec::new();
    for (incoming, expected) in [
        ("/task:1/cpu:0", "/task:1/device:CPU:0"),
        ("/job:boo/device:GPU:0", "/job:boo/task:1/device:GPU:0"),
        ("/job:muu/cpu:2", "/job:muu/task:1/device:CPU:2"),
        (
            "/job:muu/device:MyFunnyDevice:2",
            "/job:muu/task:1/device:MyFunnyDevice:2",
        ),
    ] {
        running = running.merged_with(&parse(incoming));
        assert_eq!(running.to_string(), expected, "after merging {incoming}");
    }
}

#[test]
fn ds18_type_and_index_merge_independently() {
    let merged = parse("/device:CPU:3").merged_with(&parse("/device:GPU:*"));
    assert_eq!(merged.to_string(), "/device:GPU:3");
}

#[test]
fn ds19_specs_are_immutable_values() {
    let original = parse("/job:foo/task:3");
    let changed = original.clone().with_task(4);
    let _merged = original.merged_with(&parse("/job:bar"));
    assert_eq!(original.to_string(), "/job:foo/task:3");
    assert_eq!(changed.to_string(), "/job:foo/task:4");
}

#[test]
fn ds20_equality_and_hash_follow_the_printed_form() {
    use std::collections::HashSet;
    let forms = [
        "/cpu:0",
        "/device:CPU:0",
        "/CPU:0",
        "device:cpu:0",
        "//cpu:0/",
    ];
    let set: HashSet<DeviceSpec> = forms.iter().map(|s| parse(s)).collect();
    assert_eq!(set.len(), 1);
    assert_ne!(parse("/gpu:0"), parse("/gpu:1"));
    assert_ne!(parse("/gpu:0"), parse("/gpu:*"));
}

#[test]
fn ds21_nested_scopes_merge_inside_out() {
    let mut scope = DeviceSpec::new();
    for (inner, expected) in [
        ("/device:GPU:0", "/device:GPU:0"),
        ("/job:worker", "/job:worker/device:GPU:0"),
        ("/device:CPU:0", "/job:worker/device:CPU:0"),
        ("/job:ps", "/job:ps/device:CPU:0"),
    ] {
        scope = scope.merged_with(&parse(inner));
        assert_eq!(scope.to_string(), expected);
    }
}

#[test]
fn ds22_canonical_name_and_validity() {
    assert_eq!(DeviceSpec::new().to_string(), "");
    assert!("/job:foo/replica:0".parse::<DeviceSpec>().is_ok());
    assert_eq!(
        DeviceSpec::try_from("/gpu:1").unwrap(),
        parse("/device:GPU:1")
    );
}

#[test]
fn ds35_merging_an_empty_spec_keeps_the_device() {
    let spec = parse("/job:w/replica:1/task:2/device:GPU:3");
    assert_eq!(spec.merged_with(&DeviceSpec::new()), spec);
    assert_eq!(DeviceSpec::new().merged_with(&spec), spec);
}

#[test]
fn ds36_invalid_strings_fail_every_time() {
    for _ in 0..3 {
        assert!("/job:j/replica:foo".parse::<DeviceSpec>().is_err());
    }
    // A valid parse in between must not make the invalid one succeed.
    assert!("/job:j/replica:1".parse::<DeviceSpec>().is_ok());
    assert!("/job:j/replica:foo".parse::<DeviceSpec>().is_err());
}

#[test]
fn ds37_canonical_strings_round_trip() {
    for canonical in [
        "/job:j/replica:0/task:1/device:CPU:2",
        "/device:GPU:0",
        "/job:foo/replica:0",
        "/job:foo/replica:0/task:0",
        "/job:foo/replica:0/task:0/device:GPU:0",
        "/job:foo/replica:12/task:3/device:GPU:*",
        "/job:foo/task:3/device:CPU:0",
        "/job:foo/replica:12/device:GPU:2",
        "/replica:1/task:0/device:CPU:0",
        "/job:muu/device:GPU:2",
        "/job:muu/device:MyFunnyDevice:2",
    ] {
        assert_eq!(parse(canonical).to_string(), canonical);
    }
}
