//! SM-26..SM-43: creating, naming, updating and reading distributed variables.

use std::sync::Mutex;

use distribute_mirrored::MirroredStrategy;
use distribute_strategy::{
    ReplicaContext, Strategy, StrategyError, VariableOptions, replica_variable_name,
};
use distribute_values::{
    DistributedVariable, ErrorKind, Leaf, UpdateOp, VariableAggregation, VariableSynchronization,
};

use super::{cpus, gpu_and_cpu};

fn options(
    synchronization: VariableSynchronization,
    aggregation: VariableAggregation,
) -> VariableOptions {
    VariableOptions {
        synchronization,
        aggregation,
        trainable: None,
    }
}

fn on_write(aggregation: VariableAggregation) -> VariableOptions {
    options(VariableSynchronization::OnWrite, aggregation)
}

fn on_read(aggregation: VariableAggregation) -> VariableOptions {
    options(VariableSynchronization::OnRead, aggregation)
}

/// The kind of a values error carried by a strategy error.
fn values_kind(err: &StrategyError) -> ErrorKind {
    match err {
        StrategyError::Values(e) => e.kind(),
        other => panic!("expected a values error, got {other:?}"),
    }
}

/// Creates a variable inside a step (every replica gets replica 0's) and returns it.
fn create_in_run<T>(
    strategy: &MirroredStrategy,
    create: impl Fn(&ReplicaContext<'_>) -> Result<DistributedVariable<T>, StrategyError> + Sync,
) -> Result<DistributedVariable<T>, StrategyError>
where
    T: distribute_values::VariableValue + Send + Sync + 'static,
{
    let made = Mutex::new(None);
    strategy.run(
        |ctx, ()| {
            let v = create(ctx)?;
            if ctx.replica_id() == 0 {
                *made.lock().unwrap() = Some(v);
            }
            Ok(())
        },
        &(),
    )?;
    Ok(made.into_inner().unwrap().expect("replica 0 made it"))
}

#[test]
fn sm26_one_variable_per_replica_is_one_mirrored_variable() {
    let strategy = gpu_and_cpu();
    let seen = Mutex::new(Vec::new());
    strategy
        .run(
            |ctx, ()| {
                let v = ctx.create_variable(Some("foo"), 1.0f32, VariableOptions::default())?;
                ctx.merge_call((), |_, _| Ok(()))?;
                seen.lock().unwrap().push(v);
                Ok(())
            },
            &(),
        )
        .unwrap();
    let seen = seen.into_inner().unwrap();
    assert!(seen.iter().all(|v| *v == seen[0]));
    let v = &seen[0];
    assert!(v.is_mirrored());
    assert_eq!(v.name(), "foo");
    // Component i on worker device i (SM-33: the variable lives on the strategy's devices).
    let strategy_devices: Vec<&str> = strategy.extended().device_map().primary_devices().collect();
    for (i, device) in strategy_devices.iter().enumerate() {
        assert_eq!(v.component(i).unwrap().device(), *device);
    }
    // TF's naming of the copies.
    let names: Vec<String> = (0..2).map(|i| replica_variable_name(v.name(), i)).collect();
    assert_eq!(names, ["foo", "foo/replica_1"]);
}

#[test]
fn sm27_variable_names() {
    let strategy = cpus(2);
    let unnamed = create_in_run(&strategy, |ctx| {
        ctx.create_variable(None, 1.0f32, VariableOptions::default())
    })
    .unwrap();
    assert_eq!(unnamed.name(), "Variable");

    let names = ["foo/bar", "foo_1/bar", "foo_1/bar_1", "foo/bar_1"];
    let made = Mutex::new(Vec::new());
    strategy
        .run(
            |ctx, ()| {
                let mut mine = Vec::new();
                for i in 0..5 {
                    let name = format!("foo{i}");
                    mine.push(ctx.create_variable(
                        Some(&name),
                        1.0f32,
                        VariableOptions::default(),
                    )?);
                }
                for name in names {
                    mine.push(ctx.create_variable(
                        Some(name),
                        1.0f32,
                        VariableOptions::default(),
                    )?);
                }
                if ctx.replica_id() == 0 {
                    *made.lock().unwrap() = mine;
                }
                Ok(())
            },
            &(),
        )
        .unwrap();
    let made = made.into_inner().unwrap();
    let got: Vec<&str> = made.iter().map(|v| v.name()).collect();
    assert_eq!(
        got,
        [
            "foo0",
            "foo1",
            "foo2",
            "foo3",
            "foo4",
            "foo/bar",
            "foo_1/bar",
            "foo_1/bar_1",
            "foo/bar_1"
        ]
    );
    // Four distinct variables, even though their canonical names are equal.
    for (i, a) in made[5..].iter().enumerate() {
        for b in &made[5 + i + 1..] {
            assert!(a != b);
        }
    }
}

#[test]
fn sm28_replica_dependent_names_canonicalize_to_replica_0s() {
    let strategy = cpus(2);
    let v = create_in_run(&strategy, |ctx| {
        let name = format!("foo_{}", ctx.replica_id());
        ctx.create_variable(Some(&name), 1.0f32, VariableOptions::default())
    })
    .unwrap();
    assert_eq!(v.name(), "foo_0");
}

#[test]
fn sm29_names_that_do_not_match_are_refused() {
    let strategy = cpus(2);
    let err = create_in_run(&strategy, |ctx| {
        let name = ["foo", "bar"][ctx.replica_id()];
        ctx.create_variable(Some(name), 1.0f32, VariableOptions::default())
    })
    .unwrap_err();
    match err {
        StrategyError::Runtime(m) => assert!(m.contains("do not match"), "{m}"),
        other => panic!("expected Runtime, got {other:?}"),
    }
}

#[test]
fn sm31_synchronization_and_aggregation() {
    use VariableAggregation as A;
    use VariableSynchronization as S;
    let strategy = cpus(2);
    let default = strategy
        .create_variable("v", 1.0f32, VariableOptions::default())
        .unwrap();
    assert!(default.is_mirrored());
    let auto = strategy
        .create_variable("v", 1.0f32, options(S::Auto, A::None))
        .unwrap();
    assert!(auto.is_mirrored());
    let DistributedVariable::SyncOnRead(sum) = strategy
        .create_variable("v", 1.0f32, on_read(A::Sum))
        .unwrap()
    else {
        panic!("ON_READ makes a sync-on-read variable")
    };
    assert_eq!(sum.aggregation(), A::Sum);
    let DistributedVariable::Mirrored(mean) = strategy
        .create_variable("v", 1.0f32, on_write(A::Mean))
        .unwrap()
    else {
        panic!("ON_WRITE makes a mirrored variable")
    };
    assert_eq!(mean.aggregation(), A::Mean);

    let err = strategy
        .create_variable("v", 1.0f32, options(S::None, A::None))
        .unwrap_err();
    assert_eq!(values_kind(&err), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("'v'"), "names the variable: {err}");
    // Inside a step, too.
    let err = create_in_run(&strategy, |ctx| {
        ctx.create_variable(Some("w"), 1.0f32, options(S::None, A::None))
    })
    .unwrap_err();
    assert_eq!(values_kind(&err), ErrorKind::InvalidArgument);

    for bad in ["Invalid", "invalid"] {
        let e = bad.parse::<S>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let e = bad.parse::<A>().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}

#[test]
fn sm32_trainable_defaults() {
    use VariableAggregation as A;
    use VariableSynchronization as S;
    let cases = [
        (S::Auto, None, true),
        (S::OnRead, None, false),
        (S::OnRead, Some(true), true),
        (S::OnRead, Some(false), false),
    ];
    for (sync, trainable, expected) in cases {
        let (_, got) = sync.resolve("v", trainable).unwrap();
        assert_eq!(got, expected, "{sync} trainable={trainable:?}");
        // And the strategy creates every one of them.
        let strategy = cpus(2);
        let opts = VariableOptions {
            synchronization: sync,
            aggregation: A::Sum,
            trainable,
        };
        strategy.create_variable("v", 1.0f32, opts).unwrap();
    }
}

#[test]
fn sm34_replicas_copy_replica_0s_initial_value() {
    let strategy = cpus(2);
    let v = create_in_run(&strategy, |ctx| {
        // Replica 1's initial value is ignored.
        let initial = if ctx.replica_id() == 0 { 0.0f32 } else { 9.0 };
        ctx.create_variable(Some("zeros"), initial, VariableOptions::default())
    })
    .unwrap();
    assert_eq!(
        (0..2)
            .map(|r| v.component(r).unwrap().read())
            .collect::<Vec<_>>(),
        [0.0, 0.0]
    );
}

/// Runs `update(ctx, variable)` on every replica and returns what each saw.
fn in_replicas(
    strategy: &MirroredStrategy,
    v: &DistributedVariable<f32>,
    update: impl Fn(&ReplicaContext<'_>, &DistributedVariable<f32>) -> Result<f32, StrategyError> + Sync,
) -> Result<Vec<f32>, StrategyError> {
    let out: Leaf<f32> = strategy.run(|ctx, ()| update(ctx, v), &())?;
    let n = strategy.num_replicas_in_sync();
    Ok(match out {
        Leaf::Same(x) => vec![x; n],
        other => other.local_results().into_iter().copied().collect(),
    })
}

fn components(v: &DistributedVariable<f32>) -> Vec<f32> {
    (0..2).map(|r| v.component(r).unwrap().read()).collect()
}

#[test]
fn sm35_aggregation_none_assign_in_replica_context() {
    let strategy = gpu_and_cpu();
    let v = strategy
        .create_variable("v", 1.0f32, on_write(VariableAggregation::None))
        .unwrap();
    let seen = in_replicas(&strategy, &v, |ctx, v| {
        ctx.update_variable(v, UpdateOp::Assign, 5.0)
    })
    .unwrap();
    assert_eq!(seen, [5.0, 5.0]);
    assert_eq!(components(&v), [5.0, 5.0]);
}

#[test]
fn sm36_aggregation_sum_of_a_plain_value_is_refused() {
    let strategy = gpu_and_cpu();
    let v = strategy
        .create_variable("v", 1.0f32, on_write(VariableAggregation::Sum))
        .unwrap();
    // TF's Python constant: the same value on every replica, stated as such.
    let err = in_replicas(&strategy, &v, |ctx, v| {
        ctx.update_variable_with_constant(v, UpdateOp::Assign, 5.0)
    })
    .unwrap_err();
    assert_eq!(values_kind(&err), ErrorKind::InvalidArgument);
    assert!(
        err.to_string().contains("non-distributed value 5.0"),
        "{err}"
    );
    assert_eq!(
        components(&v),
        [1.0, 1.0],
        "a refused update changes nothing"
    );
}

#[test]
fn equal_per_replica_contributions_are_not_mistaken_for_a_constant() {
    // Each replica adds its own 1.0 to a Sum variable: both count, whatever their values.
    let strategy = gpu_and_cpu();
    let v = strategy
        .create_variable("v", 1.0f32, on_write(VariableAggregation::Sum))
        .unwrap();
    in_replicas(&strategy, &v, |ctx, v| {
        ctx.update_variable(v, UpdateOp::AssignAdd, 1.0)
    })
    .unwrap();
    assert_eq!(components(&v), [3.0, 3.0]);
}

#[test]
fn a_constant_must_be_the_same_on_every_replica() {
    let strategy = gpu_and_cpu();
    let v = strategy
        .create_variable("v", 1.0f32, on_write(VariableAggregation::Mean))
        .unwrap();
    let err = in_replicas(&strategy, &v, |ctx, v| {
        ctx.update_variable_with_constant(v, UpdateOp::Assign, ctx.replica_id() as f32)
    })
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("replica 0 passed 0.0 but replica 1 passed 1.0"),
        "{err}"
    );
    assert_eq!(
        components(&v),
        [1.0, 1.0],
        "a refused update changes nothing"
    );
    in_replicas(&strategy, &v, |ctx, v| {
        ctx.update_variable_with_constant(v, UpdateOp::Assign, 6.0)
    })
    .unwrap();
    assert_eq!(components(&v), [6.0, 6.0]);
}

#[test]
fn sm37_aggregation_mean_in_replica_context() {
    let strategy = gpu_and_cpu();
    let mean = on_write(VariableAggregation::Mean);
    type Case = (f32, UpdateOp, fn(usize) -> f32, f32);
    let cases: [Case; 6] = [
        (1.0, UpdateOp::Assign, |r| r as f32, 0.5),
        (1.0, UpdateOp::Assign, |_| 5.0, 5.0),
        (1.0, UpdateOp::AssignAdd, |r| r as f32, 1.5),
        (1.0, UpdateOp::AssignAdd, |_| 5.0, 6.0),
        (5.0, UpdateOp::AssignSub, |r| r as f32, 4.5),
        (5.0, UpdateOp::AssignSub, |_| 1.0, 4.0),
    ];
    for (initial, op, value, expected) in cases {
        let v = strategy.create_variable("v", initial, mean).unwrap();
        let seen = in_replicas(&strategy, &v, |ctx, v| {
            ctx.update_variable(v, op, value(ctx.replica_id()))
        })
        .unwrap();
        assert_eq!(seen, [expected; 2], "{op} from {initial}");
        assert_eq!(components(&v), [expected; 2]);
    }
}

#[test]
fn sm38_updates_in_cross_replica_context() {
    let strategy = gpu_and_cpu();
    let cross = strategy.cross_replica();
    let mean = on_write(VariableAggregation::Mean);

    let v = strategy.create_variable("v", 1.0f32, mean).unwrap();
    cross
        .update(&v, UpdateOp::Assign, &Leaf::Same(6.0))
        .unwrap();
    assert_eq!(components(&v), [6.0, 6.0]);

    let v = strategy.create_variable("v", 1.0f32, mean).unwrap();
    cross
        .update(&v, UpdateOp::AssignAdd, &Leaf::Same(6.0))
        .unwrap();
    assert_eq!(cross.read_var(&v).unwrap(), 7.0);
    assert_eq!(components(&v), [7.0, 7.0]);
    cross
        .update(&v, UpdateOp::AssignAdd, &Leaf::Same(2.0))
        .unwrap();
    assert_eq!(components(&v), [9.0, 9.0]);

    let v = strategy.create_variable("v", 5.0f32, mean).unwrap();
    cross
        .update(&v, UpdateOp::AssignSub, &Leaf::Same(2.0))
        .unwrap();
    assert_eq!(cross.read_var(&v).unwrap(), 3.0);
    assert_eq!(components(&v), [3.0, 3.0]);

    let devices: Vec<String> = (0..2)
        .map(|r| v.component(r).unwrap().device().to_owned())
        .collect();
    let worker_devices: Vec<&str> = strategy.extended().device_map().primary_devices().collect();
    assert_eq!(devices, worker_devices);
}

#[test]
fn sm39_only_first_replica() {
    let strategy = gpu_and_cpu();
    let cross = strategy.cross_replica();
    let first = VariableAggregation::OnlyFirstReplica;
    let v0 = strategy
        .create_variable("v0", 2.0f32, on_read(first))
        .unwrap();
    let v1 = strategy
        .create_variable("v1", 3.0f32, on_write(first))
        .unwrap();
    let step = |a: f32, b: f32| {
        strategy
            .run(
                |ctx, ()| {
                    let k = ctx.replica_id() as f32 + 1.0;
                    ctx.update_variable(&v0, UpdateOp::AssignAdd, a * k)?;
                    ctx.update_variable(&v1, UpdateOp::AssignAdd, b * k)?;
                    Ok(())
                },
                &(),
            )
            .unwrap();
    };
    step(5.0, 7.0);
    assert_eq!(components(&v0), [7.0, 12.0]);
    assert_eq!(cross.read_var(&v0).unwrap(), 7.0);
    assert_eq!(components(&v1), [10.0, 10.0]);
    step(11.0, 13.0);
    assert_eq!(components(&v0), [18.0, 34.0]);
    assert_eq!(cross.read_var(&v0).unwrap(), 18.0);
    assert_eq!(components(&v1), [23.0, 23.0]);
}

#[test]
fn sm40_global_step() {
    let strategy = gpu_and_cpu();
    let step = strategy
        .create_variable(
            "global_step",
            0i64,
            VariableOptions {
                synchronization: VariableSynchronization::Auto,
                aggregation: VariableAggregation::OnlyFirstReplica,
                trainable: Some(false),
            },
        )
        .unwrap();
    let read: Leaf<i64> = strategy
        .run(
            |ctx, ()| {
                ctx.update_variable(&step, UpdateOp::AssignAdd, 1)?;
                ctx.read_variable(&step)
            },
            &(),
        )
        .unwrap();
    assert_eq!(read, Leaf::Same(1));
}

#[test]
fn sm41_sync_on_read_cross_replica_reads() {
    let strategy = gpu_and_cpu();
    let cross = strategy.cross_replica();
    for (aggregation, initial_read) in [
        (VariableAggregation::Sum, 2.0),
        (VariableAggregation::Mean, 1.0),
    ] {
        let v = strategy
            .create_variable("v", 1.0f32, on_read(aggregation))
            .unwrap();
        assert_eq!(cross.read_var(&v).unwrap(), initial_read, "{aggregation}");
        cross
            .update(&v, UpdateOp::Assign, &Leaf::Same(6.0))
            .unwrap();
        assert_eq!(cross.read_var(&v).unwrap(), 6.0, "{aggregation}");
    }
}

#[test]
fn sm42_sync_on_read_in_replica_context() {
    let strategy = gpu_and_cpu();
    let cross = strategy.cross_replica();
    let made = Mutex::new(Vec::new());
    strategy
        .run(
            |ctx, ()| {
                let r = ctx.replica_id() as f32;
                let v_sum =
                    ctx.create_variable(Some("v_sum"), 1.0f32, on_read(VariableAggregation::Sum))?;
                let v_mean = ctx.create_variable(
                    Some("v_mean"),
                    4.0f32,
                    on_read(VariableAggregation::Mean),
                )?;
                ctx.update_variable(&v_sum, UpdateOp::AssignAdd, 2.0 + r)?;
                ctx.update_variable(&v_mean, UpdateOp::Assign, 6.0 * r)?;
                made.lock().unwrap().push((v_sum, v_mean));
                Ok(())
            },
            &(),
        )
        .unwrap();
    let made = made.into_inner().unwrap();
    // Every replica holds the same variable.
    assert!(made.iter().all(|m| m.0 == made[0].0 && m.1 == made[0].1));
    let (v_sum, v_mean) = &made[0];
    assert_eq!(components(v_sum), [3.0, 4.0]);
    assert_eq!(cross.read_var(v_sum).unwrap(), 7.0);
    assert_eq!(components(v_mean), [0.0, 6.0]);
    assert_eq!(cross.read_var(v_mean).unwrap(), 3.0);
    let DistributedVariable::SyncOnRead(sum) = v_sum else {
        panic!("on read")
    };
    assert_eq!(sum.read_cross_replica().unwrap(), 7.0);
}

#[test]
fn sm43_update_each_component_of_a_sync_on_read_variable() {
    let strategy = gpu_and_cpu();
    let cross = strategy.cross_replica();
    let v = strategy
        .create_variable("v", 1.0f32, on_read(VariableAggregation::Sum))
        .unwrap();
    assert_eq!(cross.read_var(&v).unwrap(), 2.0);
    let mut devices = Vec::new();
    cross
        .update_with(&v, |update, _| {
            devices.push((update.replica(), update.device().to_owned()));
            Ok(5.0)
        })
        .unwrap();
    assert_eq!(components(&v), [5.0, 5.0]);
    assert_eq!(cross.read_var(&v).unwrap(), 10.0);
    assert_eq!(
        devices,
        [
            (0, "/job:localhost/replica:0/task:0/device:GPU:0".to_owned()),
            (1, "/job:localhost/replica:0/task:0/device:CPU:0".to_owned())
        ]
    );
}

#[test]
fn sm33_both_kinds_live_on_the_creating_strategys_devices() {
    // A variable does not point back at its strategy here; what TF's `distribute_strategy`
    // is used for (placing and aggregating the copies) is carried by its device map.
    let strategy = gpu_and_cpu();
    let expected = strategy.extended().device_map().as_ref();
    for opts in [
        on_write(VariableAggregation::Mean),
        on_read(VariableAggregation::Sum),
    ] {
        match strategy.create_variable("v", 1.0f32, opts).unwrap() {
            DistributedVariable::Mirrored(v) => assert_eq!(v.device_map(), expected),
            DistributedVariable::SyncOnRead(v) => assert_eq!(v.device_map(), expected),
        }
    }
}
