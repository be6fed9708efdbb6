//! Device-resident variables (TPU-23, TPU-24, TPU-25, TPU-28 of the reference behaviours) on
//! the CPU plugin: one PJRT buffer per replica, updated by compiled steps without a host round
//! trip, read and updated from the host with TF's cross-replica rules. On the devices the
//! plugin offers (`devices/mod.rs`).

use std::cell::Cell;
use std::sync::Arc;

use distribute_strategy::VariableOptions;
use distribute_tensor::Tensor;
use distribute_tpu::{StepInput, TpuError, TpuStrategy, TpuVariable};
use distribute_values::{
    DistributedValues, Leaf, Mirrored, PerReplica, ReduceOp, SyncKind, UpdateOp,
    VariableAggregation, VariableSynchronization,
};

mod devices;
use devices::{another_strategy, counts, has, strategy, up_to};

fn vector(device: &str, values: &[f32]) -> Tensor {
    Tensor::from_vec(device, &[values.len()], values.to_vec()).unwrap()
}

fn variable(
    s: &TpuStrategy,
    name: &str,
    synchronization: VariableSynchronization,
    aggregation: VariableAggregation,
    initial: &[f32],
) -> TpuVariable {
    let options = VariableOptions {
        synchronization,
        aggregation,
        ..VariableOptions::default()
    };
    s.create_device_variable(name, options, |d| Ok(vector(d, initial)))
        .unwrap()
}

fn copies(v: &TpuVariable) -> Vec<Vec<f32>> {
    v.values()
        .unwrap()
        .values()
        .iter()
        .map(|t| t.to_vec::<f32>().unwrap())
        .collect()
}

fn per_replica(s: &TpuStrategy, values: Vec<Tensor>) -> PerReplica<Tensor> {
    PerReplica::new(Arc::clone(s.device_map()), values).unwrap()
}

#[test]
fn tpu_24_components_are_named_per_replica_and_share_one_initial_value() {
    for n in counts(&[1, 4]) {
        components_on(n);
    }
}

fn components_on(n: usize) {
    let s = strategy(n);
    let calls = Cell::new(0);
    let w = s
        .create_device_variable("dense/kernel", VariableOptions::default(), |device| {
            calls.set(calls.get() + 1);
            assert_eq!(device, "/job:localhost/replica:0/task:0/device:TPU:0");
            Ok(vector(device, &[1.0, 2.0]))
        })
        .unwrap();
    assert_eq!(calls.get(), 1, "the initial value is computed once");
    let names: Vec<String> = std::iter::once("dense/kernel".to_owned())
        .chain((1..n).map(|r| format!("dense/kernel/replica_{r}")))
        .collect();
    assert_eq!(w.component_names(), names);
    assert_eq!(w.sync_kind(), SyncKind::OnWrite);
    assert!(w.trainable());
    assert_eq!(copies(&w), vec![vec![1.0, 2.0]; n]);
    // Each copy is its replica's device's.
    for r in 0..n {
        assert!(
            w.read_replica(r)
                .unwrap()
                .device()
                .ends_with(&format!("device:TPU:{r}"))
        );
    }
    // The checks of every strategy's variables apply.
    let err = s
        .create_device_variable(
            "bad",
            VariableOptions {
                synchronization: VariableSynchronization::None,
                ..VariableOptions::default()
            },
            |d| Ok(vector(d, &[0.0])),
        )
        .unwrap_err();
    assert!(err.to_string().contains("synchronization None"), "{err}");
}

#[test]
fn steps_update_mirrored_variables_on_the_devices() {
    let n = up_to(2);
    let s = strategy(n);
    let w = variable(
        &s,
        "w",
        VariableSynchronization::OnWrite,
        VariableAggregation::Mean,
        &[0.0, 0.0],
    );
    // w -= mean of the replicas' x; returns the replicas' x too.
    let step = s.function(|b, args| {
        let (w, x) = (&args[0], &args[1]);
        let mean = b.all_reduce(ReduceOp::Mean, x)?;
        Ok(vec![b.subtract(w, &mean)?, x.clone()])
    });
    // Replica r's x is [2r + 1, 2r + 2]: their mean is [n, n + 1].
    let devices = s.worker_devices();
    let x = per_replica(
        &s,
        (0..n)
            .map(|r| vector(&devices[r], &[2.0 * r as f32 + 1.0, 2.0 * r as f32 + 2.0]))
            .collect(),
    );
    let after_three = vec![-3.0 * n as f32, -3.0 * (n + 1) as f32];
    for _ in 0..3 {
        let rest = step
            .run_updating(&[&w], &[StepInput::PerReplica(&x)])
            .unwrap();
        assert_eq!(rest.len(), 1);
    }
    assert_eq!(step.compilations(), 1);
    assert_eq!(copies(&w), vec![after_three.clone(); n]);
    assert_eq!(
        w.read_cross_replica(None).unwrap().to_vec::<f32>().unwrap(),
        after_three
    );
    // The step must give the variable back with its type; a wrong one changes nothing.
    let wrong = s.function(|b, _| Ok(vec![b.splat(1.0f32, &[3])]));
    let err = wrong.run_updating(&[&w], &[]).unwrap_err();
    assert!(
        matches!(err, TpuError::InvalidArgument(ref m) if m.contains("holds tensor<2xf32>")),
        "{err}"
    );
    assert_eq!(copies(&w), vec![after_three; n]);
    let twice = s.function(|_, args| Ok(args.to_vec()));
    let err = twice.run_updating(&[&w, &w], &[]).unwrap_err();
    assert!(err.to_string().contains("passed twice"), "{err}");
}

#[test]
fn run_steps_updating_carries_variables_through_the_device_loop() {
    let n = up_to(4);
    let s = strategy(n);
    let v = variable(
        &s,
        "counter",
        VariableSynchronization::OnWrite,
        VariableAggregation::None,
        &[0.0],
    );
    let step = s.function(|b, args| {
        let one = b.splat(1.0f32, &[1]);
        let total = b.all_reduce(ReduceOp::Sum, &one)?;
        let next_v = b.add(&args[0], &total)?;
        let next_steps = b.add(&args[1], &one)?;
        Ok(vec![next_v, next_steps])
    });
    let zero = vector("/cpu:0", &[0.0]);
    let rest = step
        .run_steps_updating(10, &[&v], &[StepInput::Same(&zero)], &[])
        .unwrap();
    assert_eq!(rest[0].replica(0).unwrap().to_vec::<f32>().unwrap(), [10.0]);
    assert_eq!(copies(&v), vec![vec![10.0 * n as f32]; n]);
    // The next loop starts from the updated buffers.
    step.run_steps_updating(5, &[&v], &[StepInput::Same(&zero)], &[])
        .unwrap();
    assert_eq!(copies(&v), vec![vec![15.0 * n as f32]; n]);
}

#[test]
fn tpu_25_aggregated_mirrored_updates_need_mirrored_arguments() {
    if !has(2) {
        return;
    }
    let s = strategy(2);
    let devices = s.worker_devices();
    let w = variable(
        &s,
        "w",
        VariableSynchronization::OnWrite,
        VariableAggregation::Sum,
        &[1.0],
    );
    let p = per_replica(
        &s,
        vec![vector(&devices[0], &[1.0]), vector(&devices[1], &[2.0])],
    );
    let err = w
        .update(UpdateOp::AssignAdd, &Leaf::PerReplica(p.clone()))
        .unwrap_err();
    assert!(
        matches!(err, TpuError::Type(ref m) if m.contains("mirrored arguments")),
        "{err}"
    );
    assert_eq!(copies(&w), vec![vec![1.0]; 2]);
    // Mirrored and plain values are fine.
    let m = Mirrored::new(
        Arc::clone(s.device_map()),
        vec![vector(&devices[0], &[2.0]), vector(&devices[1], &[2.0])],
    )
    .unwrap();
    w.update(UpdateOp::AssignAdd, &Leaf::Mirrored(m)).unwrap();
    w.update(UpdateOp::AssignSub, &Leaf::Same(vector("/cpu:0", &[0.5])))
        .unwrap();
    assert_eq!(copies(&w), vec![vec![2.5]; 2]);
    // Without aggregation each copy takes its own value.
    let none = variable(
        &s,
        "n",
        VariableSynchronization::OnWrite,
        VariableAggregation::None,
        &[0.0],
    );
    none.update(UpdateOp::Assign, &Leaf::PerReplica(p)).unwrap();
    assert_eq!(copies(&none), [vec![1.0], vec![2.0]]);
    // A mirrored read from a replica's device is that replica's copy.
    assert_eq!(
        none.read_cross_replica(Some(&devices[1]))
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        [2.0]
    );
}

#[test]
fn tpu_28_an_only_first_replica_sync_on_read_variable() {
    let n = up_to(4);
    let s = strategy(n);
    let w = variable(
        &s,
        "w",
        VariableSynchronization::OnRead,
        VariableAggregation::OnlyFirstReplica,
        &[0.0],
    );
    assert_eq!(w.sync_kind(), SyncKind::OnRead);
    assert!(!w.trainable());
    // Replica i: x = i; w = x + w; returns all_reduce(SUM, w) + x.
    let step = s.function(|b, args| {
        let w = &args[0];
        let id = b.replica_id();
        let x = b.convert(&id, distribute_pjrt::ElementType::F32);
        let x = b.reshape(&x, &[1])?;
        let new_w = b.add(&x, w)?;
        let total = b.all_reduce(ReduceOp::Sum, &new_w)?;
        let out = b.add(&total, &x)?;
        Ok(vec![new_w, out])
    });
    let out = step.run_updating(&[&w], &[]).unwrap();
    let data_sum = (0..n).sum::<usize>() as f32;
    for r in 0..n {
        assert_eq!(
            out[0].replica(r).unwrap().to_vec::<f32>().unwrap(),
            [r as f32 + data_sum]
        );
    }
    // Replica copies differ; the cross-replica read is the first replica's.
    let ids: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32]).collect();
    assert_eq!(copies(&w), ids);
    assert_eq!(
        w.read_cross_replica(None).unwrap().to_vec::<f32>().unwrap(),
        [0.0]
    );
}

#[test]
fn sync_on_read_sum_and_mean_aggregate_when_read() {
    if !has(2) {
        return;
    }
    let s = strategy(2);
    let devices = s.worker_devices();
    let values = || {
        Leaf::PerReplica(per_replica(
            &s,
            vec![vector(&devices[0], &[1.0]), vector(&devices[1], &[3.0])],
        ))
    };
    let read = |v: &TpuVariable| {
        v.read_cross_replica(None)
            .map(|t| t.to_vec::<f32>().unwrap())
    };
    let sum = variable(
        &s,
        "sum",
        VariableSynchronization::OnRead,
        VariableAggregation::Sum,
        &[0.0],
    );
    sum.update(UpdateOp::Assign, &values()).unwrap();
    assert_eq!(read(&sum).unwrap(), [4.0]);
    // A plain assign of a Sum variable splits the total; assign_add is ambiguous.
    sum.assign(&vector("/cpu:0", &[10.0])).unwrap();
    assert_eq!(copies(&sum), vec![vec![5.0]; 2]);
    let err = sum
        .update(UpdateOp::AssignAdd, &Leaf::Same(vector("/cpu:0", &[1.0])))
        .unwrap_err();
    assert!(err.to_string().contains("not supported"), "{err}");
    let mean = variable(
        &s,
        "mean",
        VariableSynchronization::OnRead,
        VariableAggregation::Mean,
        &[0.0],
    );
    mean.update(UpdateOp::Assign, &values()).unwrap();
    assert_eq!(read(&mean).unwrap(), [2.0]);
    let none = variable(
        &s,
        "none",
        VariableSynchronization::OnRead,
        VariableAggregation::None,
        &[0.0],
    );
    assert!(read(&none).is_err());
}

#[test]
fn tpu_23_broadcast_to_outside_and_inside_a_step() {
    let n = up_to(4);
    let s = strategy(n);
    let x = vector("/cpu:0", &[1.5, 2.5]);
    // Outside a replicated computation the value comes back unchanged.
    assert_eq!(s.broadcast_to(&x), Leaf::Same(x.clone()));
    // Inside, every replica gets replica 0's value.
    let step = s.function(|b, args| Ok(vec![b.broadcast_from_first(&args[0])?]));
    let devices = s.worker_devices();
    let values = (0..n)
        .map(|r| vector(&devices[r], &[r as f32 + 1.0, 10.0 * (r as f32 + 1.0)]))
        .collect();
    let p = per_replica(&s, values);
    let out = step.run(&[StepInput::PerReplica(&p)]).unwrap();
    for r in 0..n {
        assert_eq!(
            out[0].replica(r).unwrap().to_vec::<f32>().unwrap(),
            [1.0, 10.0]
        );
    }
}

#[test]
fn steps_read_variables_as_device_inputs_and_refuse_another_strategys() {
    let n = up_to(2);
    let s = strategy(n);
    let w = variable(
        &s,
        "w",
        VariableSynchronization::OnWrite,
        VariableAggregation::None,
        &[2.0],
    );
    // Read-only use: the buffers go in as a device input and stay as they were.
    let double = s.function(|b, args| Ok(vec![b.add(&args[0], &args[0])?]));
    let out = double.run(&[StepInput::Device(&w.device_value())]).unwrap();
    assert_eq!(
        out[0].replica(n - 1).unwrap().to_vec::<f32>().unwrap(),
        [4.0]
    );
    assert_eq!(copies(&w), vec![vec![2.0]; n]);
    // A variable of another strategy (another client) is refused before anything runs.
    let other = another_strategy(n);
    let f = other.function(|_, args| Ok(args.to_vec()));
    let err = f.run_updating(&[&w], &[]).unwrap_err();
    assert!(err.to_string().contains("another client"), "{err}");
    assert_eq!(copies(&w), vec![vec![2.0]; n]);
}
