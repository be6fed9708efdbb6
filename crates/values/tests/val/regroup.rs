//! VAL-01..VAL-18: regroup, select_replica, select_replica_mirrored, update_regroup,
//! value_container.

use std::collections::{BTreeMap, HashMap};

use distribute_values::{
    ErrorKind, Leaf, MirroredVariable, Nest, RegroupOptions, SyncOnReadVariable, UpdateGrouping,
    ValuesError, VariableAggregation, VariableComponent, Wrap, regroup, regroup_with,
    select_device_mirrored, select_replica, select_replica_mirrored, update_regroup,
};

use crate::{cpus, mirrored, per_replica};

/// TF's running example: replica `d` returns
/// `("a"+d, ["b"+d, {"c": "d"+d, "e": "f"+d}, "g"+d], "h"+d)`. Python's mixed list is a tuple
/// in Rust.
type Nested = (String, (String, BTreeMap<String, String>, String), String);

fn n(d: &str) -> Nested {
    let dict = BTreeMap::from([
        ("c".to_owned(), format!("d{d}")),
        ("e".to_owned(), format!("f{d}")),
    ]);
    (
        format!("a{d}"),
        (format!("b{d}"), dict, format!("g{d}")),
        format!("h{d}"),
    )
}

fn strings(xs: &[&str]) -> Vec<String> {
    xs.iter().map(|s| s.to_string()).collect()
}

#[test]
fn val_01_regroup_nested_structure() {
    let (a, (b, dict, g), h) = regroup(&cpus(2), vec![n("1"), n("2")]).unwrap();
    assert_eq!(per_replica(&a), strings(&["a1", "a2"]));
    assert_eq!(per_replica(&h), strings(&["h1", "h2"]));
    assert_eq!(per_replica(&b), strings(&["b1", "b2"]));
    assert_eq!(dict.keys().collect::<Vec<_>>(), ["c", "e"]);
    assert_eq!(per_replica(&dict["c"]), strings(&["d1", "d2"]));
    assert_eq!(per_replica(&dict["e"]), strings(&["f1", "f2"]));
    assert_eq!(per_replica(&g), strings(&["g1", "g2"]));
}

#[test]
fn val_01_snapshot_of_the_regrouped_structure() {
    let grouped = regroup(&cpus(2), vec![n("1"), n("2")]).unwrap();
    insta::assert_snapshot!("val_01_regrouped_nested", format!("{grouped:#?}"));
}

#[test]
fn val_02_select_replica_inverts_regroup() {
    let grouped = regroup(&cpus(2), vec![n("1"), n("2")]).unwrap();
    assert_eq!(select_replica::<Nested>(0, &grouped).unwrap(), n("1"));
    assert_eq!(select_replica::<Nested>(1, &grouped).unwrap(), n("2"));
    let err = select_replica::<Nested>(2, &grouped).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn val_03_select_replica_mirrored_refuses_per_replica() {
    let grouped = regroup(&cpus(2), vec![n("1"), n("2")]).unwrap();
    let err = select_replica_mirrored::<Nested>(0, &grouped).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TypeError);
    assert_eq!(
        err,
        ValuesError::NotMirrored {
            path: ".0".into(),
            found: "a PerReplica value"
        }
    );
    let err =
        select_device_mirrored::<Nested>("/job:localhost/replica:0/task:0/device:CPU:0", &grouped)
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TypeError);
}

#[test]
fn val_04_wrap_mirrored_round_trips_both_ways() {
    let map = cpus(2);
    let options = RegroupOptions {
        wrap: Wrap::Mirrored,
        ..RegroupOptions::default()
    };
    let grouped = regroup_with(&map, vec![n("1"), n("2")], options).unwrap();
    assert_eq!(mirrored(&grouped.0), strings(&["a1", "a2"]));
    for (i, d) in ["1", "2"].into_iter().enumerate() {
        assert_eq!(select_replica::<Nested>(i, &grouped).unwrap(), n(d));
        assert_eq!(
            select_replica_mirrored::<Nested>(i, &grouped).unwrap(),
            n(d)
        );
        let device = map.primary_device(i).unwrap();
        assert_eq!(
            select_device_mirrored::<Nested>(device, &grouped).unwrap(),
            n(d)
        );
    }
    let err = select_device_mirrored::<Nested>("/device:GPU:7", &grouped).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// A user's own mapping type (TF: a dict subclass, or a `collections.abc.Mapping`).
#[derive(Debug, Clone, PartialEq, Nest)]
struct Counts(BTreeMap<String, i64>);

#[derive(Debug, Clone, PartialEq, Nest)]
struct Registry {
    entries: HashMap<String, String>,
}

#[test]
fn val_05_map_newtype_keeps_its_type() {
    let replica = |d: i64| Counts(BTreeMap::from([("a".into(), d), ("b".into(), 10 + d)]));
    let grouped: CountsRegrouped = regroup(&cpus(2), vec![replica(1), replica(2)]).unwrap();
    assert_eq!(per_replica(&grouped.0["a"]), [1, 2]);
    assert_eq!(per_replica(&grouped.0["b"]), [11, 12]);
    assert_eq!(select_replica::<Counts>(1, &grouped).unwrap(), replica(2));
}

#[test]
fn val_06_custom_mapping_struct_keeps_its_type() {
    let replica = |d: &str| Registry {
        entries: HashMap::from([("a".into(), format!("a{d}")), ("b".into(), format!("b{d}"))]),
    };
    let grouped: RegistryRegrouped = regroup(&cpus(2), vec![replica("1"), replica("2")]).unwrap();
    assert_eq!(per_replica(&grouped.entries["a"]), strings(&["a1", "a2"]));
    assert_eq!(per_replica(&grouped.entries["b"]), strings(&["b1", "b2"]));
    assert_eq!(
        select_replica::<Registry>(0, &grouped).unwrap(),
        replica("1")
    );
}

#[test]
fn val_07_outer_sequence_is_the_replica_axis() {
    let (first, second) = regroup(&cpus(2), vec![("1", "2"), ("3", "4")]).unwrap();
    assert_eq!(per_replica(&first), ["1", "3"]);
    assert_eq!(per_replica(&second), ["2", "4"]);
}

#[test]
fn val_08_same_leaf_on_every_replica_is_unwrapped() {
    let foo = "foo".to_owned();
    let grouped = regroup(&cpus(2), vec![("a", foo.clone()), ("b", foo.clone())]).unwrap();
    assert_eq!(per_replica(&grouped.0), ["a", "b"]);
    assert_eq!(grouped.1, Leaf::Same(foo.clone()));
    assert_eq!(
        select_replica::<(&str, String)>(0, &grouped).unwrap(),
        ("a", foo.clone())
    );
    assert_eq!(
        select_replica::<(&str, String)>(1, &grouped).unwrap(),
        ("b", foo)
    );
}

#[test]
fn val_09_always_wrap_wraps_equal_leaves() {
    let options = RegroupOptions {
        always_wrap: true,
        ..RegroupOptions::default()
    };
    let grouped = regroup_with(&cpus(2), vec![("a", "foo"), ("b", "foo")], options).unwrap();
    assert_eq!(per_replica(&grouped.1), ["foo", "foo"]);
    assert_eq!(
        select_replica::<(&str, &str)>(1, &grouped).unwrap(),
        ("b", "foo")
    );
}

#[test]
fn val_10_single_replica_returns_the_structure_unchanged() {
    let grouped = regroup(&cpus(1), vec![n("1")]).unwrap();
    let (a, (_, dict, _), _) = &grouped;
    assert_eq!(*a, Leaf::Same("a1".to_owned()));
    assert_eq!(dict["c"], Leaf::Same("d1".to_owned()));
    assert_eq!(select_replica::<Nested>(0, &grouped).unwrap(), n("1"));
}

/// TF's named tuple `Spec(mode, loss, train_op, scaffold)`.
#[derive(Debug, Clone, PartialEq, Nest)]
struct Spec {
    mode: String,
    loss: f64,
    train_op: u32,
    scaffold: Option<String>,
}

#[test]
fn val_11_named_struct_stays_that_struct() {
    let specs: Vec<Spec> = (0..3)
        .map(|i| Spec {
            mode: "train".into(),
            loss: f64::from(i) * 0.5,
            train_op: 100 + i,
            scaffold: Some(format!("scaffold{i}")),
        })
        .collect();
    let grouped: SpecRegrouped = regroup(&cpus(3), specs.clone()).unwrap();
    assert_eq!(grouped.mode, Leaf::Same("train".to_owned()));
    assert_eq!(per_replica(&grouped.loss), [0.0, 0.5, 1.0]);
    assert_eq!(per_replica(&grouped.train_op), [100, 101, 102]);
    assert_eq!(
        per_replica(grouped.scaffold.as_some().unwrap()),
        strings(&["scaffold0", "scaffold1", "scaffold2"])
    );
    for (i, spec) in specs.iter().enumerate() {
        assert_eq!(&select_replica::<Spec>(i, &grouped).unwrap(), spec);
    }
}

#[test]
fn val_11_snapshot_of_a_regrouped_struct() {
    let specs: Vec<Spec> = (0..2)
        .map(|i| Spec {
            mode: "train".into(),
            loss: 0.25 * f64::from(i + 1),
            train_op: 7,
            scaffold: None,
        })
        .collect();
    let grouped: SpecRegrouped = regroup(&cpus(2), specs).unwrap();
    insta::assert_snapshot!("val_11_regrouped_struct", format!("{grouped:#?}"));
}

#[derive(Debug, Clone, PartialEq, Nest)]
struct Point(i32, i32);

/// Generic structs, unit structs and user leaf types derive too.
#[derive(Debug, Clone, PartialEq, Nest)]
struct Pair<T> {
    left: T,
    right: Vec<T>,
}

#[derive(Debug, Clone, PartialEq, Nest)]
struct Marker;

#[derive(Debug, Clone, PartialEq, Nest)]
#[nest(leaf)]
struct Tensor<T> {
    shape: Vec<usize>,
    data: Vec<T>,
}

#[test]
fn derive_handles_generics_units_and_leaves() {
    let t = |x: f32| Tensor {
        shape: vec![1],
        data: vec![x],
    };
    let xs = vec![
        (
            Pair {
                left: t(1.0),
                right: vec![t(2.0)],
            },
            Marker,
        ),
        (
            Pair {
                left: t(1.0),
                right: vec![t(3.0)],
            },
            Marker,
        ),
    ];
    let grouped = regroup(&cpus(2), xs.clone()).unwrap();
    assert_eq!(grouped.0.left, Leaf::Same(t(1.0)));
    assert_eq!(per_replica(&grouped.0.right[0]), [t(2.0), t(3.0)]);
    assert_eq!(grouped.1, MarkerRegrouped);
    for (i, x) in xs.iter().enumerate() {
        assert_eq!(
            &select_replica::<(Pair<Tensor<f32>>, Marker)>(i, &grouped).unwrap(),
            x
        );
    }
}

#[test]
fn val_12_struct_behind_a_box_regroups() {
    let grouped = regroup(&cpus(2), vec![Box::new(Point(0, 2)), Box::new(Point(1, 3))]).unwrap();
    assert_eq!(per_replica(&grouped.0), [0, 1]);
    assert_eq!(per_replica(&grouped.1), [2, 3]);
    assert_eq!(
        *select_replica::<Box<Point>>(1, &grouped).unwrap(),
        Point(1, 3)
    );
}

/// VAL-13 table: each row is a pair of replica values whose structures differ. (A list on one
/// replica and a tuple on the other cannot be written: Rust's types rule it out.)
#[test]
fn val_13_structure_mismatch_names_the_path() {
    type Row = (Vec<i32>, BTreeMap<&'static str, Vec<i32>>);
    let ok: Row = (vec![0], BTreeMap::from([("c", vec![1, 2])]));
    let cases: [(&str, Row, &str); 3] = [
        (
            "list lengths differ (testRunRegroupError)",
            (vec![], ok.1.clone()),
            ".0",
        ),
        (
            "map keys differ",
            (vec![0], BTreeMap::from([("d", vec![1, 2])])),
            ".1",
        ),
        (
            "nested list lengths differ",
            (vec![0], BTreeMap::from([("c", vec![1])])),
            r#".1["c"]"#,
        ),
    ];
    for (name, other, path) in cases {
        for replicas in [
            vec![ok.clone(), other.clone()],
            vec![other.clone(), ok.clone()],
        ] {
            let err = regroup(&cpus(2), replicas).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Invariant, "{name}");
            match &err {
                ValuesError::StructureMismatch { path: at, .. } => assert_eq!(at, path, "{name}"),
                other => panic!("{name}: unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn val_13_mismatch_message_says_what_differs() {
    let err = regroup(&cpus(2), vec![Vec::<i32>::new(), vec![0]]).unwrap_err();
    insta::assert_snapshot!("val_13_mismatch_message", err.to_string());
}

#[test]
fn val_14_components_regroup_to_their_variable() {
    for replicas in [1, 2, 3] {
        let var =
            MirroredVariable::new("v", cpus(replicas), 1.0, VariableAggregation::None).unwrap();
        let grouped = regroup(&cpus(replicas), var.components()).unwrap();
        assert_eq!(grouped, var.clone().into(), "{replicas} replicas");
        for i in 0..replicas {
            let component = select_replica::<VariableComponent<f64>>(i, &grouped).unwrap();
            assert_eq!(component, var.component(i).unwrap());
        }
    }
}

#[test]
fn val_15_components_of_different_variables_are_an_invariant_error() {
    let map = cpus(2);
    let v = MirroredVariable::new("v", map.clone(), 1, VariableAggregation::None).unwrap();
    let w = MirroredVariable::new("w", map.clone(), 1, VariableAggregation::None).unwrap();
    let cases = [
        (
            "different containers",
            vec![v.component(0).unwrap(), w.component(1).unwrap()],
        ),
        (
            "wrong replica",
            vec![v.component(1).unwrap(), v.component(0).unwrap()],
        ),
    ];
    for (name, components) in cases {
        let err = regroup(&map, components).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invariant, "{name}: {err}");
        assert!(
            matches!(err, ValuesError::DifferentVariables { .. }),
            "{name}"
        );
    }
}

#[test]
fn val_15_same_variable_on_every_replica_is_returned_as_is() {
    let map = cpus(2);
    let v = SyncOnReadVariable::new("v", map.clone(), 0.0, VariableAggregation::Sum).unwrap();
    let always = RegroupOptions {
        always_wrap: true,
        ..RegroupOptions::default()
    };
    let grouped = regroup_with(&map, vec![v.clone(), v.clone()], always).unwrap();
    assert_eq!(grouped, Leaf::Same(v.clone()));

    // Different variables per replica are per-replica values, as in TF.
    let w = SyncOnReadVariable::new("w", map.clone(), 0.0, VariableAggregation::Sum).unwrap();
    let grouped = regroup(&map, vec![v.clone(), w.clone()]).unwrap();
    assert_eq!(per_replica(&grouped), [v, w]);
}

#[test]
fn val_16_select_replica_on_a_variable_returns_the_variable() {
    let map = cpus(2);
    let v = MirroredVariable::new("v", map.clone(), 0.0, VariableAggregation::None).unwrap();
    let grouped = regroup(&map, vec![(v.clone(), 1), (v.clone(), 2)]).unwrap();
    for i in 0..2 {
        let (selected, _) = select_replica::<(MirroredVariable<f64>, i32)>(i, &grouped).unwrap();
        assert_eq!(selected, v);
    }
    // A sync-on-read variable is not mirrored.
    let s = SyncOnReadVariable::new("s", map.clone(), 0.0, VariableAggregation::Sum).unwrap();
    let grouped = regroup(&map, vec![s.clone(), s]).unwrap();
    let err = select_replica_mirrored::<SyncOnReadVariable<f64>>(0, &grouped).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TypeError);
}

#[test]
fn val_17_value_container() {
    let v = MirroredVariable::new("v", cpus(2), 0.0, VariableAggregation::None).unwrap();
    let component = v.component(1).unwrap();
    assert_eq!(component.value_container(), Some(v.clone().into()));
    drop(v);
    assert_eq!(component.value_container(), None);
    // The orphaned component no longer regroups to a container.
    let err = regroup(&cpus(1), vec![component]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invariant);
}

#[test]
fn val_18_update_regroup() {
    let map = cpus(2);
    // Grouped: every result is Mirrored, even when equal.
    let grouped = update_regroup(&map, vec![(1.0, 5), (2.0, 5)], UpdateGrouping::Grouped).unwrap();
    assert_eq!(mirrored(&grouped.0), [1.0, 2.0]);
    assert_eq!(mirrored(&grouped.1), [5, 5]);
    // Not grouped: every replica's result, equal ones included.
    let kept = update_regroup(
        &map,
        vec![(1.0_f64, 5_i32), (2.0, 5)],
        UpdateGrouping::PerReplica,
    )
    .unwrap();
    assert_eq!(kept.0.local_results(), [&1.0, &2.0]);
    assert_eq!(kept.1.local_results(), [&5, &5]);
    // A single device: the result itself.
    let single = update_regroup(&cpus(1), vec![3.0], UpdateGrouping::Grouped).unwrap();
    assert_eq!(single, Leaf::Same(3.0));
    // Variable components: their container.
    let v = MirroredVariable::new("v", cpus(1), 0.0, VariableAggregation::None).unwrap();
    let container = update_regroup(&cpus(1), v.components(), UpdateGrouping::Grouped).unwrap();
    assert_eq!(container, v.into());
}
