//! VAL-34..VAL-46: mirrored and sync-on-read variables, aggregation, assignment in replica and
//! cross-replica context.

use distribute_values::{
    DistributedValues, DistributedVariable, ErrorKind, Leaf, Mirrored, MirroredVariable,
    PerReplica, ReduceOp, ReplicaDeviceMap, SyncKind, SyncOnReadVariable, UpdateOp, ValuesError,
    VariableAggregation, VariableSynchronization, VariableValue,
};

use crate::cpus;

use VariableAggregation::{Mean, None as NoAggregation, OnlyFirstReplica, Sum};

#[test]
fn val_34_mirrored_variable_reports_its_primary() {
    let v = MirroredVariable::new("foo", cpus(2), 1.5_f32, NoAggregation).unwrap();
    v.component(1).unwrap().assign(9.0);
    assert_eq!(v.name(), "foo");
    assert_eq!(v.primary(), 1.5);
    assert_eq!(v.aggregation(), NoAggregation);
    // A single component with no strategy, on /job:foo/device:CPU:0, with MEAN.
    let single = distribute_values::ReplicaDeviceMap::new(["/job:foo/device:CPU:0"]).unwrap();
    let v = MirroredVariable::new("bar", single, 2.0, Mean).unwrap();
    assert_eq!((v.name(), v.primary(), v.num_replicas()), ("bar", 2.0, 1));
    assert_eq!(v.component(0).unwrap().device(), "/job:foo/device:CPU:0");
}

#[test]
fn val_35_sync_on_read_variable_reports_its_aggregation() {
    let v = SyncOnReadVariable::new("metric", cpus(2), 0.0, Sum).unwrap();
    assert_eq!(
        (v.name(), v.aggregation(), v.primary()),
        ("metric", Sum, 0.0)
    );
    insta::assert_snapshot!("val_35_sync_on_read_debug", format!("{v:#?}"));
}

#[test]
fn val_36_mean_needs_a_float() {
    let err = MirroredVariable::new("i", cpus(2), 1_i32, Mean).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(err, ValuesError::MeanOnNonFloat { name: "i".into() });
    assert!(SyncOnReadVariable::new("i", cpus(2), 1_u64, Mean).is_err());
    for aggregation in [NoAggregation, Sum, OnlyFirstReplica] {
        assert!(MirroredVariable::new("i", cpus(2), 1_i32, aggregation).is_ok());
    }
    assert!(SyncOnReadVariable::new("f", cpus(2), 1.0_f32, Mean).is_ok());
}

#[test]
fn val_37_classification() {
    let on_write = DistributedVariable::new_on_write("w", cpus(2), 0.0, NoAggregation).unwrap();
    let on_read = DistributedVariable::new_on_read("r", cpus(2), 0.0, Sum).unwrap();
    assert!(on_write.is_mirrored() && !on_write.is_sync_on_read());
    assert!(on_read.is_sync_on_read() && !on_read.is_mirrored());
    assert_eq!(on_write.sync_kind(), SyncKind::OnWrite);

    let mirrored = Leaf::Mirrored(Mirrored::new(cpus(2), vec![1, 1]).unwrap());
    let per_replica = Leaf::PerReplica(PerReplica::new(cpus(2), vec![1, 2]).unwrap());
    let plain = Leaf::Same(1);
    assert!(mirrored.is_mirrored() && !mirrored.is_sync_on_read());
    assert!(!per_replica.is_mirrored() && per_replica.is_sync_on_read());
    assert!(!plain.is_mirrored() && plain.is_sync_on_read());
}

#[test]
fn val_37_synchronization_resolution() {
    use VariableSynchronization as S;
    type Case = (S, Option<bool>, Result<(SyncKind, bool), ErrorKind>);
    let cases: [Case; 7] = [
        (S::Auto, None, Ok((SyncKind::OnWrite, true))),
        (S::OnWrite, Some(false), Ok((SyncKind::OnWrite, false))),
        (S::OnRead, None, Ok((SyncKind::OnRead, false))),
        (S::OnRead, Some(false), Ok((SyncKind::OnRead, false))),
        (S::OnRead, Some(true), Ok((SyncKind::OnRead, true))),
        (S::None, None, Err(ErrorKind::InvalidArgument)),
        (S::None, Some(false), Err(ErrorKind::InvalidArgument)),
    ];
    for (sync, trainable, expected) in cases {
        let got = sync.resolve("v", trainable).map_err(|e| e.kind());
        assert_eq!(got, expected, "{sync} trainable={trainable:?}");
    }
}

#[test]
fn val_41_only_first_replica_reads_the_first_component() {
    let v = SyncOnReadVariable::new("v", cpus(3), 0.0, OnlyFirstReplica).unwrap();
    for (i, x) in [5.0, 6.0, 7.0].into_iter().enumerate() {
        v.component(i).unwrap().assign(x);
    }
    assert_eq!(v.read_cross_replica().unwrap(), 5.0);
}

#[test]
fn val_41_cross_replica_reads_by_aggregation() {
    let cases = [
        (Sum, Ok(6.0)),
        (Mean, Ok(3.0)),
        (OnlyFirstReplica, Ok(2.0)),
        (NoAggregation, Err(ErrorKind::InvalidArgument)),
    ];
    for (aggregation, expected) in cases {
        let v = SyncOnReadVariable::new("v", cpus(2), 0.0, aggregation).unwrap();
        v.component(0).unwrap().assign(2.0);
        v.component(1).unwrap().assign(4.0);
        assert_eq!(
            v.read_cross_replica().map_err(|e| e.kind()),
            expected,
            "{aggregation}"
        );
    }
}

/// VAL-42 table: (aggregation, update, value, components before, expected components or error).
#[test]
fn val_42_sync_on_read_cross_replica_assignment() {
    type Case = (
        VariableAggregation,
        UpdateOp,
        f64,
        [f64; 2],
        Result<[f64; 2], ErrorKind>,
    );
    let cases: [Case; 9] = [
        (Sum, UpdateOp::Assign, 6.0, [1.0, 1.0], Ok([3.0, 3.0])),
        (
            Sum,
            UpdateOp::AssignAdd,
            6.0,
            [1.0, 1.0],
            Err(ErrorKind::InvalidArgument),
        ),
        (
            Sum,
            UpdateOp::AssignSub,
            6.0,
            [1.0, 1.0],
            Err(ErrorKind::InvalidArgument),
        ),
        (Mean, UpdateOp::Assign, 6.0, [1.0, 2.0], Ok([6.0, 6.0])),
        (Mean, UpdateOp::AssignAdd, 6.0, [1.0, 2.0], Ok([7.0, 8.0])),
        (
            OnlyFirstReplica,
            UpdateOp::Assign,
            6.0,
            [1.0, 2.0],
            Ok([6.0, 6.0]),
        ),
        (
            OnlyFirstReplica,
            UpdateOp::AssignAdd,
            6.0,
            [1.0, 2.0],
            Ok([7.0, 8.0]),
        ),
        (
            OnlyFirstReplica,
            UpdateOp::AssignSub,
            1.0,
            [1.0, 2.0],
            Ok([0.0, 1.0]),
        ),
        (
            NoAggregation,
            UpdateOp::Assign,
            6.0,
            [1.0, 2.0],
            Ok([6.0, 6.0]),
        ),
    ];
    for (aggregation, op, value, before, expected) in cases {
        let v = SyncOnReadVariable::new("v", cpus(2), 0.0, aggregation).unwrap();
        v.update_per_component(
            UpdateOp::Assign,
            &PerReplica::new(cpus(2), before.to_vec()).unwrap(),
        )
        .unwrap();
        let got = v.assign_cross_replica(op, &value).map(|()| v.values());
        let case = format!("{aggregation} {op} {value}");
        assert_eq!(
            got.map_err(|e| e.kind()),
            expected.map(|e| e.to_vec()),
            "{case}"
        );
        if expected.is_err() {
            assert_eq!(
                v.values(),
                before,
                "{case}: a refused update changes nothing"
            );
        }
    }
    // Reading back a Sum assignment gives the assigned total.
    let v = SyncOnReadVariable::new("v", cpus(2), 0.0, Sum).unwrap();
    v.assign_cross_replica(UpdateOp::Assign, &6.0).unwrap();
    assert_eq!(v.read_cross_replica().unwrap(), 6.0);
}

#[test]
fn val_42_sum_assignment_of_an_integer_truncates_like_tf() {
    let v = SyncOnReadVariable::new("n", cpus(2), 0_i64, Sum).unwrap();
    v.assign_cross_replica(UpdateOp::Assign, &7).unwrap();
    assert_eq!(v.values(), [3, 3]);
}

#[test]
fn val_43_on_write_update_in_replica_context() {
    // Aggregation None: only the local component changes; the new value is returned (VAL-46).
    let v = MirroredVariable::new("v", cpus(2), 1.0, NoAggregation).unwrap();
    assert_eq!(v.update_local(1, UpdateOp::AssignAdd, &2.0).unwrap(), 3.0);
    assert_eq!(v.values(), [1.0, 3.0]);
    assert_eq!(
        v.update_local(2, UpdateOp::Assign, &0.0)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );

    // With an aggregation, a lone replica cannot update: the strategy must gather (merge_call).
    let v = MirroredVariable::new("v", cpus(2), 1.0, Sum).unwrap();
    let err = v.update_local(0, UpdateOp::Assign, &2.0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Runtime);
}

/// The aggregated update after a merge_call: (aggregation, gathered value, expected new value).
#[test]
fn val_43_aggregated_update_table() {
    let two = cpus(2);
    let per_replica =
        |a: f64, b: f64| Leaf::PerReplica(PerReplica::new(two.clone(), vec![a, b]).unwrap());
    type Case = (
        VariableAggregation,
        usize,
        Leaf<f64>,
        Result<f64, ErrorKind>,
    );
    let cases: [Case; 10] = [
        (Sum, 2, per_replica(1.0, 2.0), Ok(3.0)),
        (Mean, 2, per_replica(1.0, 2.0), Ok(1.5)),
        (OnlyFirstReplica, 2, per_replica(1.0, 2.0), Ok(1.0)),
        (
            Sum,
            2,
            Leaf::Mirrored(Mirrored::new(two.clone(), vec![2.0, 2.0]).unwrap()),
            Ok(4.0),
        ),
        // A plain value skips aggregation; summing it follows COL-03.
        (Sum, 2, Leaf::Same(5.0), Err(ErrorKind::InvalidArgument)),
        (Sum, 2, Leaf::Same(0.0), Ok(0.0)),
        (Sum, 1, Leaf::Same(5.0), Ok(5.0)),
        (Mean, 2, Leaf::Same(5.0), Ok(5.0)),
        (OnlyFirstReplica, 2, Leaf::Same(5.0), Ok(5.0)),
        (
            NoAggregation,
            2,
            per_replica(1.0, 2.0),
            Err(ErrorKind::InvalidArgument),
        ),
    ];
    for (aggregation, replicas, value, expected) in cases {
        let v = MirroredVariable::new("v", cpus(replicas), 10.0, aggregation).unwrap();
        let got = v
            .update_aggregated(UpdateOp::Assign, &value)
            .map_err(|e| e.kind());
        assert_eq!(got, expected, "{aggregation} {value:?}");
        if let Ok(x) = expected {
            assert_eq!(
                v.values(),
                vec![x; replicas],
                "{aggregation}: every copy is updated"
            );
        }
    }
}

#[test]
fn val_43_sum_of_a_plain_value_message() {
    let v = MirroredVariable::new("v", cpus(2), 1.0, Sum).unwrap();
    let err = v
        .update_aggregated(UpdateOp::AssignAdd, &Leaf::Same(5.0))
        .unwrap_err();
    assert!(
        err.to_string().contains("5.0") && err.to_string().contains("2 replicas"),
        "{err}"
    );
}

#[test]
fn val_43_only_first_replica_arithmetic() {
    let map = cpus(3);
    let v = MirroredVariable::new("step", map.clone(), 10, OnlyFirstReplica).unwrap();
    let increments = Leaf::PerReplica(PerReplica::new(map, vec![1, 2, 3]).unwrap());
    assert_eq!(
        v.update_aggregated(UpdateOp::AssignAdd, &increments)
            .unwrap(),
        11
    );
    assert_eq!(
        v.update_aggregated(UpdateOp::AssignSub, &increments)
            .unwrap(),
        10
    );
    assert_eq!(v.values(), [10, 10, 10]);
}

#[test]
fn val_44_aggregation_to_reduce_op() {
    let cases = [
        (Sum, Ok(ReduceOp::Sum)),
        (Mean, Ok(ReduceOp::Mean)),
        (NoAggregation, Err(ErrorKind::InvalidArgument)),
        (OnlyFirstReplica, Err(ErrorKind::InvalidArgument)),
    ];
    for (aggregation, expected) in cases {
        assert_eq!(
            ReduceOp::from_aggregation(aggregation).map_err(|e| e.kind()),
            expected
        );
    }
}

#[test]
fn val_45_update_per_component() {
    let map = cpus(2);
    let values = PerReplica::new(map.clone(), vec![1.0, 2.0]).unwrap();
    let variables: Vec<DistributedVariable<f64>> = [NoAggregation, Sum, Mean, OnlyFirstReplica]
        .into_iter()
        .map(|a| DistributedVariable::new_on_read("r", map.clone(), 0.0, a).unwrap())
        .chain([DistributedVariable::new_on_write("w", map.clone(), 0.0, NoAggregation).unwrap()])
        .collect();
    for var in variables {
        let update = |op, values: &PerReplica<f64>| match &var {
            DistributedVariable::Mirrored(v) => v.update_per_component(op, values),
            DistributedVariable::SyncOnRead(v) => v.update_per_component(op, values),
        };
        let read = || match &var {
            DistributedVariable::Mirrored(v) => v.values(),
            DistributedVariable::SyncOnRead(v) => v.values(),
        };
        update(UpdateOp::Assign, &values).unwrap();
        assert_eq!(read(), [1.0, 2.0], "{var:?}");
        update(UpdateOp::AssignAdd, &values).unwrap();
        assert_eq!(read(), [2.0, 4.0], "{var:?}");
        update(UpdateOp::AssignSub, &values).unwrap();
        assert_eq!(read(), [1.0, 2.0], "{var:?}");
        // assign_add(value() + read_value()): each component adds twice its own value.
        let doubled = PerReplica::new(map.clone(), read().iter().map(|x| x + x).collect()).unwrap();
        update(UpdateOp::AssignAdd, &doubled).unwrap();
        assert_eq!(read(), [3.0, 6.0], "{var:?}");
        // One value per replica, no more, no fewer.
        let short = PerReplica::new(cpus(1), vec![1.0]).unwrap();
        assert_eq!(
            update(UpdateOp::Assign, &short).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        // Laid out like the variable: replica i's value on the variable's replica-i device.
        let mut swapped: Vec<&str> = map.primary_devices().collect();
        swapped.reverse();
        let elsewhere = ["/device:GPU:0", "/device:GPU:1"];
        for (devices, named) in [(swapped, "as replica 0"), (elsewhere.to_vec(), "GPU:0")] {
            let misplaced =
                PerReplica::new(ReplicaDeviceMap::new(devices).unwrap(), vec![7.0, 8.0]).unwrap();
            let err = update(UpdateOp::Assign, &misplaced).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
            assert!(err.to_string().contains(named), "{err}");
            assert_eq!(read(), [3.0, 6.0], "nothing changes: {var:?}");
        }
    }
}

#[test]
fn val_46_replica_context_updates_return_the_new_value() {
    let v = SyncOnReadVariable::new("v", cpus(2), 1.0, Sum).unwrap();
    assert_eq!(v.update_local(0, UpdateOp::Assign, &4.0).unwrap(), 4.0);
    assert_eq!(v.update_local(0, UpdateOp::AssignAdd, &1.0).unwrap(), 5.0);
    assert_eq!(v.update_local(1, UpdateOp::AssignSub, &1.0).unwrap(), 0.0);
    assert_eq!(v.values(), [5.0, 0.0]);
    assert_eq!(v.read_local(0).unwrap(), 5.0);
}

#[test]
fn failed_arithmetic_leaves_every_component_unchanged() {
    let v = MirroredVariable::new("n", cpus(2), 0_u8, NoAggregation).unwrap();
    v.component(1).unwrap().assign(250);
    let err = v
        .assign_cross_replica(UpdateOp::AssignAdd, &10)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert_eq!(v.values(), [0, 250]);
    assert_eq!(v.to_mirrored().values(), [0, 250]);
}

#[test]
fn val_46_aggregated_update_returns_what_it_stored_despite_concurrent_assigns() {
    use std::sync::atomic::{AtomicBool, Ordering};

    let v = MirroredVariable::new("w", cpus(2), 0.0, Mean).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                v.assign_cross_replica(UpdateOp::Assign, &2.0).unwrap();
            }
        });
        let mine = Leaf::Same(1.0);
        // The race window is short: many rounds, and no panic before the writer is stopped.
        let returned: Result<Vec<f64>, _> = (0..100_000)
            .map(|_| v.update_aggregated(UpdateOp::Assign, &mine))
            .collect();
        done.store(true, Ordering::Relaxed);
        let returned = returned.unwrap();
        assert!(
            returned.iter().all(|&x| x == 1.0),
            "update_aggregated returned another thread's value {} times",
            returned.iter().filter(|&&x| x != 1.0).count()
        );
    });
}

/// A value whose dtype is per value, as the collectives layer's tensors are.
#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    F(f64),
    I(i64),
}

impl VariableValue for Scalar {
    fn is_floating(&self) -> bool {
        matches!(self, Scalar::F(_))
    }

    fn try_add(&self, other: &Self) -> Result<Self, ValuesError> {
        match (self, other) {
            (Scalar::F(a), Scalar::F(b)) => Ok(Scalar::F(a + b)),
            (Scalar::I(a), Scalar::I(b)) => Ok(Scalar::I(a + b)),
            _ => Err(ValuesError::Arithmetic("mixed dtypes".into())),
        }
    }

    fn try_sub(&self, other: &Self) -> Result<Self, ValuesError> {
        self.try_add(&match other {
            Scalar::F(b) => Scalar::F(-b),
            Scalar::I(b) => Scalar::I(-b),
        })
    }

    fn divide_by_count(&self, count: usize) -> Result<Self, ValuesError> {
        Ok(match self {
            Scalar::F(a) => Scalar::F(a / count as f64),
            Scalar::I(a) => Scalar::I(a / count as i64),
        })
    }
}

#[test]
fn val_43_mean_of_non_float_per_replica_values_is_refused() {
    let map = cpus(2);
    let v = MirroredVariable::new("m", map.clone(), Scalar::F(0.0), Mean).unwrap();
    let ints = vec![Scalar::I(1), Scalar::I(2)];
    let mixed = vec![Scalar::F(1.0), Scalar::I(2)];
    let cases = [
        (
            "per-replica ints",
            Leaf::PerReplica(PerReplica::new(map.clone(), ints.clone()).unwrap()),
        ),
        (
            "mirrored ints",
            Leaf::Mirrored(Mirrored::new(map.clone(), ints).unwrap()),
        ),
        (
            "an int after a float",
            Leaf::PerReplica(PerReplica::new(map.clone(), mixed).unwrap()),
        ),
    ];
    for (case, value) in cases {
        let err = v.update_aggregated(UpdateOp::Assign, &value).unwrap_err();
        assert!(
            matches!(err, ValuesError::MeanOnNonFloat { .. }),
            "{case}: {err}"
        );
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert_eq!(v.values(), [Scalar::F(0.0), Scalar::F(0.0)], "{case}");
    }
    let floats =
        Leaf::PerReplica(PerReplica::new(map, vec![Scalar::F(1.0), Scalar::F(2.0)]).unwrap());
    assert_eq!(
        v.update_aggregated(UpdateOp::Assign, &floats).unwrap(),
        Scalar::F(1.5)
    );
}

#[test]
fn update_each_with_gives_each_copy_its_own_new_value_from_its_current_one() {
    let v = DistributedVariable::new_on_write("w", cpus(3), 1.0_f32, NoAggregation).unwrap();
    v.component(2).unwrap().assign(5.0);
    let mut seen = Vec::new();
    v.update_each_with(|replica, device, current: &f32| {
        seen.push((replica, device.to_owned()));
        // The variable is readable from inside: no lock is held while `f` runs.
        let primary = v.component(0)?.read();
        Ok::<_, ValuesError>(current * 10.0 + replica as f32 + primary)
    })
    .unwrap();
    let components: Vec<f32> = (0..3).map(|r| v.component(r).unwrap().read()).collect();
    assert_eq!(components, [11.0, 12.0, 53.0]);
    let devices: Vec<(usize, String)> = (0..3)
        .map(|r| (r, format!("/job:localhost/replica:0/task:0/device:CPU:{r}")))
        .collect();
    assert_eq!(
        seen, devices,
        "once per copy, in replica order, with its device"
    );
}

#[test]
fn update_each_with_a_failing_copy_changes_no_copy() {
    let v = DistributedVariable::new_on_read("m", cpus(2), 1.0_f64, Sum).unwrap();
    let err = v
        .update_each_with(|replica, _, current: &f64| {
            if replica == 1 {
                Err(ValuesError::Arithmetic("copy 1 refuses".into()))
            } else {
                Ok(current + 1.0)
            }
        })
        .unwrap_err();
    assert!(err.to_string().contains("copy 1 refuses"), "{err}");
    let components: Vec<f64> = (0..2).map(|r| v.component(r).unwrap().read()).collect();
    assert_eq!(components, [1.0, 1.0], "copy 0's new value was not stored");
}
