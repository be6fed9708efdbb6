//! Property tests: printing then parsing any spec gives the same spec (DS-37 for all specs),
//! and merging behaves field by field.

use distribute_device_spec::{DeviceSpec, canonicalize};
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z_][A-Za-z0-9_.-]{0,12}"
}

fn device_type() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("CPU".to_owned()),
        Just("GPU".to_owned()),
        Just("TPU".to_owned()),
        Just("cpu".to_owned()),
        Just("gpu".to_owned()),
        name(),
    ]
}

prop_compose! {
    fn any_spec()(
        job in proptest::option::of(name()),
        replica in proptest::option::of(any::<u32>()),
        task in proptest::option::of(any::<u32>()),
        device in proptest::option::of((device_type(), proptest::option::of(any::<u32>()))),
    ) -> DeviceSpec {
        let spec = DeviceSpec::new()
            .with_job(job.as_deref())
            .unwrap()
            .with_replica(replica)
            .with_task(task);
        match device {
            Some((device_type, index)) => spec.with_device(device_type.as_str(), index).unwrap(),
            None => spec,
        }
    }
}

proptest! {
    #[test]
    fn print_then_parse_is_identity(spec in any_spec()) {
        let printed = spec.to_string();
        let parsed: DeviceSpec = printed.parse().unwrap();
        prop_assert_eq!(&parsed, &spec);
        prop_assert_eq!(parsed.to_string(), printed);
    }

    #[test]
    fn merge_takes_each_field_from_the_incoming_spec_when_set(a in any_spec(), b in any_spec()) {
        let merged = a.merged_with(&b);
        prop_assert_eq!(merged.job(), b.job().or(a.job()));
        prop_assert_eq!(merged.replica(), b.replica().or(a.replica()));
        prop_assert_eq!(merged.task(), b.task().or(a.task()));
        prop_assert_eq!(merged.device_type(), b.device_type().or(a.device_type()));
    }

    #[test]
    fn canonical_names_are_fixed_points(spec in any_spec()) {
        // Lower-case long-form types are refused; every other spec canonicalizes to a full name
        // that canonicalizes to itself.
        if let Ok(canonical) = canonicalize(&spec.to_string(), None) {
            let again = canonicalize(&canonical, None).unwrap();
            prop_assert_eq!(&again, &canonical);
            let parsed: DeviceSpec = canonical.parse().unwrap();
            prop_assert!(parsed.job().is_some() && parsed.replica().is_some() && parsed.task().is_some());
            prop_assert!(parsed.device_type().is_some() && parsed.device_index().is_some());
        }
    }

    #[test]
    fn arbitrary_strings_never_panic(s in "[/a-zA-Z0-9:*_ +-]{0,40}") {
        let _ = s.parse::<DeviceSpec>();
        let _ = canonicalize(&s, None);
    }
}
