//! The "also from the seeds" list on a mirrored strategy: update contexts,
//! colocated variables, several steps per call, `map`, and the strategy properties.

use std::sync::Arc;

use distribute_strategy::{Strategy, StrategyError, VariableOptions};
use distribute_tensor::Tensor;
use distribute_values::{DistributedValues, Leaf, PerReplica, ReduceOp};

use super::{cpus, gpu_and_cpu};

#[test]
fn update_non_slot_runs_once_per_device_with_its_update_context() {
    let strategy = gpu_and_cpu();
    let cross = strategy.cross_replica();
    let seen = cross
        .update_non_slot::<f32, _>(None, |update| {
            Ok((update.replica(), update.device().to_owned()))
        })
        .unwrap();
    let devices: Vec<(usize, String)> = cross
        .non_slot_devices::<f32>(None)
        .into_iter()
        .enumerate()
        .collect();
    assert_eq!(seen, devices);
    // An error stops the update.
    let err = cross
        .update_non_slot::<f32, ()>(None, |_| Err(StrategyError::InvalidArgument("no".into())))
        .unwrap_err();
    assert!(matches!(err, StrategyError::InvalidArgument(_)));
}

#[test]
fn update_with_a_failing_function_changes_nothing() {
    let strategy = cpus(2);
    let v = strategy
        .create_variable("v", 1.0f32, VariableOptions::default())
        .unwrap();
    let err = strategy
        .cross_replica()
        .update_with(&v, |update, x| {
            if update.replica() == 1 {
                Err(StrategyError::InvalidArgument("replica 1 refuses".into()))
            } else {
                Ok(x + 1.0)
            }
        })
        .unwrap_err();
    assert!(matches!(err, StrategyError::InvalidArgument(_)));
    assert_eq!(v.component(0).unwrap().read(), 1.0);
}

#[test]
fn colocated_variables_use_the_other_variables_devices() {
    let strategy = gpu_and_cpu();
    // A variable on other devices than the strategy's, e.g. restored from elsewhere.
    let elsewhere = cpus(2);
    let w = elsewhere
        .create_variable("w", 1.0f32, VariableOptions::default())
        .unwrap();
    let slot = strategy
        .cross_replica()
        .colocate_vars_with(&w)
        .create_variable("w/momentum", 0.0f32, VariableOptions::default())
        .unwrap();
    for r in 0..2 {
        assert_eq!(
            slot.component(r).unwrap().device(),
            w.component(r).unwrap().device()
        );
    }
    assert_ne!(
        slot.component(0).unwrap().device(),
        strategy.extended().device_map().primary_device(0).unwrap()
    );
    assert_eq!(
        strategy.cross_replica().non_slot_devices(Some(&w)),
        elsewhere.cross_replica().non_slot_devices::<f32>(None)
    );
}

#[test]
fn run_steps_on_iterator_keeps_the_last_steps_outputs() {
    let strategy = cpus(2);
    let map = Arc::clone(strategy.extended().device_map());
    // Step s gives replica r the input 10·s + r.
    let inputs = (0..5).map(|s| {
        Leaf::PerReplica(
            PerReplica::new(
                Arc::clone(&map),
                (0..2).map(|r| (10 * s + r) as f32).collect(),
            )
            .unwrap(),
        )
    });
    let mut inputs = inputs.peekable();
    let ctx = strategy
        .run_steps_on_iterator(
            |ctx, x: Leaf<f32>| {
                let out: Leaf<Tensor> =
                    strategy.run(|replica, x| Ok(Tensor::scalar(replica.device(), x)), &x)?;
                ctx.set_last_step_output("sum", out.clone(), Some(ReduceOp::Sum));
                ctx.set_last_step_output("per_replica", out, None);
                Ok(())
            },
            inputs.by_ref(),
            3,
        )
        .unwrap();
    assert_eq!(ctx.steps_run(), 3);
    // The last step (s = 2) had inputs 20 and 21.
    let sum = ctx.last_step_output("sum").unwrap();
    assert_eq!(sum.reduce_op(), Some(ReduceOp::Sum));
    let Leaf::Same(total) = sum.value() else {
        panic!("reduced to one value")
    };
    assert_eq!(total.to_vec::<f32>().unwrap(), [41.0]);
    let kept = ctx.last_step_output("per_replica").unwrap();
    assert_eq!(kept.reduce_op(), None);
    let values: Vec<f32> = kept
        .value()
        .local_results()
        .into_iter()
        .map(|t| t.to_vec::<f32>().unwrap()[0])
        .collect();
    assert_eq!(values, [20.0, 21.0]);

    // Two inputs are left: the next call runs them and stops early.
    let ctx = strategy
        .run_steps_on_iterator(|_, _: Leaf<f32>| Ok(()), inputs.by_ref(), 3)
        .unwrap();
    assert_eq!(ctx.steps_run(), 2);
    // Then the input is exhausted.
    let err = strategy
        .run_steps_on_iterator(|_, _: Leaf<f32>| Ok(()), inputs.by_ref(), 3)
        .unwrap_err();
    assert!(matches!(err, StrategyError::OutOfRange(_)), "{err:?}");
    let err = strategy
        .run_steps_on_iterator(
            |_, _: Leaf<f32>| Ok(()),
            std::iter::once(Leaf::Same(1.0)),
            0,
        )
        .unwrap_err();
    assert!(matches!(err, StrategyError::InvalidArgument(_)), "{err:?}");
}

#[test]
fn run_steps_on_iterator_stops_at_a_failing_step() {
    let strategy = cpus(2);
    let mut steps = 0;
    let err = strategy
        .run_steps_on_iterator(
            |_, s: i32| {
                steps += 1;
                if s == 1 {
                    return Err(StrategyError::InvalidArgument("bad batch".into()));
                }
                Ok(())
            },
            0..10,
            5,
        )
        .unwrap_err();
    assert!(matches!(err, StrategyError::InvalidArgument(m) if m == "bad batch"));
    assert_eq!(steps, 2);
}

#[test]
fn map_goes_round_robin_over_the_devices() {
    let strategy = cpus(3);
    let out = strategy
        .map(0..8, |device, i: usize| {
            Ok(format!("{i}@{}", &device[device.len() - 5..]))
        })
        .unwrap();
    assert_eq!(
        out.values(),
        [
            vec!["0@CPU:0", "3@CPU:0", "6@CPU:0"],
            vec!["1@CPU:1", "4@CPU:1", "7@CPU:1"],
            vec!["2@CPU:2", "5@CPU:2"],
        ]
    );
    let err = strategy
        .map(0..3, |_, i: usize| {
            if i == 1 {
                Err(StrategyError::InvalidArgument("odd".into()))
            } else {
                Ok(i)
            }
        })
        .unwrap_err();
    assert!(matches!(err, StrategyError::InvalidArgument(_)));
}

#[test]
fn single_worker_mirrored_properties_are_tfs() {
    let strategy = cpus(2);
    let extended = strategy.extended();
    // TF's MirroredExtended on one worker: one process drives every replica and does it all.
    assert!(extended.should_init());
    assert!(extended.should_checkpoint());
    assert!(extended.should_save_summary());
    assert!(!extended.between_graph());
}

#[test]
fn run_steps_on_iterator_reports_a_bad_reduction_with_its_own_kind() {
    let strategy = cpus(2);
    let map = Arc::clone(strategy.extended().device_map());
    let err = strategy
        .run_steps_on_iterator(
            |ctx, _: i32| {
                let copies = map
                    .primary_devices()
                    .map(|d| Tensor::scalar(d, 1.0f32))
                    .collect();
                let mirrored =
                    Leaf::Mirrored(distribute_values::Mirrored::new(Arc::clone(&map), copies)?);
                // A mirrored value holds one value, not one per replica: it has no sum.
                ctx.set_last_step_output("m", mirrored, Some(ReduceOp::Sum));
                Ok(())
            },
            0..1,
            1,
        )
        .unwrap_err();
    assert!(matches!(err, StrategyError::Invariant(_)), "{err:?}");
}
