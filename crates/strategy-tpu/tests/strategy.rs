//! TpuStrategy on the CPU plugin (`PJRT_PLUGIN`, else the pinned one `cargo xtask test`
//! installs; without one these tests fail with the error that says how to get it), on the
//! devices the plugin offers (see `devices/mod.rs`: one GPU runs the tests generic over the
//! replica count on one replica, and skips those that need more, saying so).

use std::sync::Arc;

mod devices;
mod workload;
use devices::{counts, has, sharing_the_devices, strategy, up_to};
use workload::{FEATURES, data, sgd_step, shards, stack, train_mirrored, weights};

use distribute_device_spec::LocalDevices;
use distribute_mirrored::MirroredStrategy;
use distribute_pjrt::stablehlo::{DotDims, Value};
use distribute_strategy::{Strategy, StrategyError, VariableOptions};
use distribute_tensor::Tensor;
use distribute_tpu::{DeviceAssignment, StepBuilder, StepInput, TpuConfig, TpuError, TpuStrategy};
use distribute_values::{Leaf, PerReplica, ReduceOp};
use ndarray::{Array1, Array2};

fn per_replica(s: &TpuStrategy, values: Vec<Tensor>) -> PerReplica<Tensor> {
    PerReplica::new(Arc::clone(s.device_map()), values).unwrap()
}

fn scalars(s: &TpuStrategy, values: &[f32]) -> PerReplica<Tensor> {
    let devices = s.worker_devices();
    per_replica(
        s,
        values
            .iter()
            .zip(&devices)
            .map(|(v, d)| Tensor::from_vec(d, &[1], vec![*v]).unwrap())
            .collect(),
    )
}

#[test]
fn tpu_12_every_device_is_a_replica() {
    for n in counts(&[1, 4]) {
        let s = strategy(n);
        assert_eq!(s.num_replicas_in_sync(), n);
        let devices = s.worker_devices();
        assert_eq!(devices.len(), n);
        for (i, d) in devices.iter().enumerate() {
            assert_eq!(
                d,
                &format!("/job:localhost/replica:0/task:0/device:TPU:{i}")
            );
        }
    }
}

#[test]
fn tpu_13_an_assignment_picks_the_cores() {
    if !has(2) {
        return;
    }
    let topology = TpuStrategy::topology_for(2).unwrap();
    let second = DeviceAssignment::new(topology.clone(), &[vec![vec![0, 0, 0, 1]]]).unwrap();
    let config = TpuConfig {
        device_assignment: Some(second),
        ..TpuConfig::cpu(2)
    };
    let s = TpuStrategy::new(config).unwrap();
    assert_eq!(s.num_replicas_in_sync(), 1);
    assert_eq!(
        s.worker_devices(),
        ["/job:localhost/replica:0/task:0/device:TPU:1"]
    );
    assert_eq!(s.replica_devices()[0].id(), 1);
    // The step really runs on device 1: its program carries that assignment.
    let f = s.function(|b, x| Ok(vec![b.add(&x[0], &x[0])?]));
    let x = scalars(&s, &[3.0]);
    let out = f.run(&[StepInput::PerReplica(&x)]).unwrap();
    assert_eq!(out[0].replica(0).unwrap().to_vec::<f32>().unwrap(), [6.0]);

    let first = DeviceAssignment::build(topology, None, None, 1).unwrap();
    let s = TpuStrategy::new(sharing_the_devices(TpuConfig {
        device_assignment: Some(first),
        ..TpuConfig::cpu(2)
    }))
    .unwrap();
    assert!(s.worker_devices()[0].ends_with("device:TPU:0"));
}

#[test]
fn bad_assignments_are_refused() {
    if !has(2) {
        return;
    }
    let other = DeviceAssignment::new(
        TpuStrategy::topology_for(4).unwrap(),
        &[vec![vec![0, 0, 0, 3]]],
    )
    .unwrap();
    let err = TpuStrategy::new(TpuConfig {
        device_assignment: Some(other),
        ..TpuConfig::cpu(2)
    })
    .unwrap_err();
    assert!(
        matches!(err, TpuError::InvalidArgument(ref m) if m.contains("topology")),
        "{err}"
    );
    let two_cores = DeviceAssignment::build(
        TpuStrategy::topology_for(2).unwrap(),
        Some(&[1, 1, 1, 2]),
        None,
        1,
    )
    .unwrap();
    let err = TpuStrategy::new(TpuConfig {
        device_assignment: Some(two_cores),
        ..TpuConfig::cpu(2)
    })
    .unwrap_err();
    assert!(matches!(err, TpuError::Unimplemented(_)), "{err}");
}

#[test]
fn tpu_16_logical_devices_out_of_range_are_refused() {
    let n = up_to(2);
    let s = strategy(n);
    let last = n - 1;
    assert!(
        s.logical_device(last, 0)
            .unwrap()
            .ends_with(&format!("device:TPU:{last}"))
    );
    assert!(s.logical_device(n, 0).is_err(), "replica {n} of {n}");
    let err = s.logical_device(0, 1).unwrap_err();
    assert!(
        matches!(err, TpuError::InvalidArgument(ref m) if m.contains("out of range")),
        "{err}"
    );
}

#[test]
fn tpu_19_reduce_inside_and_outside_the_step() {
    if !has(2) {
        return;
    }
    let s = strategy(2);
    let x = scalars(&s, &[2.0, 3.0]);
    // Outside: squares on each replica, then a host-side MEAN → (4 + 9) / 2.
    let square = s.function(|b, x| Ok(vec![b.multiply(&x[0], &x[0])?]));
    let squares = square.run(&[StepInput::PerReplica(&x)]).unwrap();
    let squares = Leaf::PerReplica(squares[0].to_per_replica().unwrap());
    let mean = s.reduce(ReduceOp::Mean, &squares, None).unwrap();
    assert_eq!(mean.to_vec::<f32>().unwrap(), [6.5]);
    // Inside: MEAN scales by 1/n, then sums across replicas.
    let mean_in = s.function(|b, x| Ok(vec![b.all_reduce(ReduceOp::Mean, &x[0])?]));
    let out = mean_in.run(&[StepInput::PerReplica(&x)]).unwrap();
    let mirrored = out[0].to_mirrored().unwrap();
    for t in mirrored.values() {
        assert_eq!(t.to_vec::<f32>().unwrap(), [2.5]);
    }
    // Other ops are not supported inside the replicated computation.
    let min_in = s.function(|b, x| Ok(vec![b.all_reduce(ReduceOp::Min, &x[0])?]));
    let err = min_in.run(&[StepInput::PerReplica(&x)]).unwrap_err();
    assert!(matches!(err, TpuError::Unimplemented(_)), "{err}");
}

/// On one replica the replica-context collectives are the value itself (the program carries
/// no all-reduce over a group of one), and what several replicas refuse is still refused.
#[test]
fn one_replica_collectives_are_the_value_and_refuse_the_same_ops() {
    let s = strategy(1);
    let x = Tensor::from_vec(&s.worker_devices()[0], &[2], vec![1.5f32, -2.0]).unwrap();
    let step = s.function(|b, x| {
        Ok(vec![
            b.all_reduce(ReduceOp::Sum, &x[0])?,
            b.all_reduce(ReduceOp::Mean, &x[0])?,
            b.broadcast_from_first(&x[0])?,
        ])
    });
    let out = step.run(&[StepInput::Same(&x)]).unwrap();
    for value in &out {
        assert_eq!(
            value.replica(0).unwrap().to_vec::<f32>().unwrap(),
            [1.5, -2.0]
        );
    }
    let min_in = s.function(|b, x| Ok(vec![b.all_reduce(ReduceOp::Min, &x[0])?]));
    let err = min_in.run(&[StepInput::Same(&x)]).unwrap_err();
    assert!(matches!(err, TpuError::Unimplemented(_)), "{err}");
    let n = Tensor::from_vec(&s.worker_devices()[0], &[1], vec![3i32]).unwrap();
    let int_mean = s.function(|b, x| Ok(vec![b.all_reduce(ReduceOp::Mean, &x[0])?]));
    let err = int_mean.run(&[StepInput::Same(&n)]).unwrap_err();
    assert!(matches!(err, TpuError::Type(_)), "{err}");
    let int_sum = s.function(|b, x| Ok(vec![b.all_reduce(ReduceOp::Sum, &x[0])?]));
    let out = int_sum.run(&[StepInput::Same(&n)]).unwrap();
    assert_eq!(out[0].replica(0).unwrap().to_vec::<i32>().unwrap(), [3]);
}

use distribute_values::DistributedValues;

#[test]
fn all_reduce_and_replica_id_on_1_2_4_and_8_replicas() {
    for n in counts(&[1, 2, 4, 8]) {
        let s = strategy(n);
        let f = s.function(|b: &mut StepBuilder<'_>, x: &[Value]| {
            let id = b.replica_id();
            let id = b.convert(&id, distribute_pjrt::ElementType::F32);
            let id = b.reshape(&id, &[1])?;
            let mine = b.add(&x[0], &id)?;
            let total = b.all_reduce(ReduceOp::Sum, &mine)?;
            Ok(vec![id, total])
        });
        let zeros = vec![0.0f32; n];
        let x = scalars(&s, &zeros);
        let out = f.run(&[StepInput::PerReplica(&x)]).unwrap();
        let total = (0..n).sum::<usize>() as f32;
        for r in 0..n {
            assert_eq!(
                out[0].replica(r).unwrap().to_vec::<f32>().unwrap(),
                [r as f32]
            );
            assert_eq!(out[1].replica(r).unwrap().to_vec::<f32>().unwrap(), [total]);
        }
    }
}

#[test]
fn tpu_27_a_device_loop_then_a_sum_reduce() {
    for n in counts(&[1, 2, 4]) {
        let s = strategy(n);
        let plus_one = s.function(|b, state| {
            let one = b.splat(1.0f32, &[1]);
            Ok(vec![b.add(&state[0], &one)?])
        });
        let zero = Tensor::from_vec("/cpu:0", &[1], vec![0.0f32]).unwrap();
        let out = plus_one
            .run_steps(10, &[StepInput::Same(&zero)], &[])
            .unwrap();
        let per_replica = Leaf::PerReplica(out[0].to_per_replica().unwrap());
        let total = s.reduce(ReduceOp::Sum, &per_replica, None).unwrap();
        assert_eq!(total.to_vec::<f32>().unwrap(), [n as f32 * 10.0]);
    }
}

#[test]
fn one_compilation_per_input_signature() {
    let n = up_to(2);
    let s = strategy(n);
    let double = s.function(|b, x| Ok(vec![b.add(&x[0], &x[0])?]));
    let a: Vec<f32> = (1..=n).map(|v| v as f32).collect();
    let b: Vec<f32> = (5..5 + n).map(|v| v as f32).collect();
    double
        .run(&[StepInput::PerReplica(&scalars(&s, &a))])
        .unwrap();
    let out = double
        .run(&[StepInput::PerReplica(&scalars(&s, &b))])
        .unwrap();
    assert_eq!(double.compilations(), 1);
    let last = out[0].replica(n - 1).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(last, [2.0 * b[n - 1]]);
    let wide = Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0]).unwrap();
    double.run(&[StepInput::Same(&wide)]).unwrap();
    assert_eq!(double.compilations(), 2);
}

#[test]
fn shapes_must_agree_between_replicas() {
    if !has(2) {
        return;
    }
    let s = strategy(2);
    let f = s.function(|_, x| Ok(vec![x[0].clone()]));
    let devices = s.worker_devices();
    let ragged = per_replica(
        &s,
        vec![
            Tensor::from_vec(&devices[0], &[2], vec![1.0f32, 2.0]).unwrap(),
            Tensor::from_vec(&devices[1], &[3], vec![1.0f32, 2.0, 3.0]).unwrap(),
        ],
    );
    let err = f.run(&[StepInput::PerReplica(&ragged)]).unwrap_err();
    assert!(
        matches!(err, TpuError::InvalidArgument(ref m) if m.contains("replica 1 has tensor<3xf32>")),
        "{err}"
    );
}

#[test]
fn builder_mistakes_in_a_step_are_reported() {
    let n = up_to(2);
    let s = strategy(n);
    let f = s.function(|b, x| {
        let wrong = b.splat(1.0f32, &[5]);
        Ok(vec![b.add(&x[0], &wrong)?])
    });
    let x = scalars(&s, &vec![1.0; n]);
    let err = f.run(&[StepInput::PerReplica(&x)]).unwrap_err().to_string();
    assert!(err.contains("operand types differ"), "{err}");
}

#[test]
fn two_hundred_runs_back_to_back() {
    let n = up_to(4);
    let s = strategy(n);
    let step = s.function(|b, w| {
        let one = b.splat(1.0f32, &[1]);
        let summed = b.all_reduce(ReduceOp::Sum, &one)?;
        Ok(vec![b.add(&w[0], &summed)?])
    });
    let zero = Tensor::from_vec("/cpu:0", &[1], vec![0.0f32]).unwrap();
    let mut w = s.to_device(StepInput::Same(&zero)).unwrap();
    for _ in 0..200 {
        w = step.run(&[StepInput::Device(&w)]).unwrap().remove(0);
    }
    for r in 0..n {
        assert_eq!(
            w.replica(r).unwrap().to_vec::<f32>().unwrap(),
            [200.0 * n as f32]
        );
    }
}

#[test]
fn eager_steps_run_through_the_strategy_trait() {
    let n = up_to(2);
    let s = strategy(n);
    let sums: Leaf<Tensor> = s
        .run(
            |ctx, ()| {
                let mine = Tensor::scalar(ctx.device(), ctx.replica_id() as f32 + 1.0);
                ctx.all_reduce(ReduceOp::Sum, &mine)
            },
            &(),
        )
        .unwrap();
    assert_eq!(sums.local_results().len(), n);
    for t in sums.local_results() {
        assert_eq!(t.to_vec::<f32>().unwrap(), [(n * (n + 1) / 2) as f32]);
    }
    let err = s
        .run(
            |_, ()| Err::<(), _>(StrategyError::InvalidArgument("bad".into())),
            &(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("bad"), "{err}");
}

// ---- linear regression: TpuStrategy against MirroredStrategy --------------------------------

const STEPS: usize = 20;

fn mirrored_weights(n: usize, x: &Array2<f32>, y: &Array1<f32>) -> Vec<f32> {
    train_mirrored(
        &MirroredStrategy::new(LocalDevices::cpus(n)).unwrap(),
        x,
        y,
        STEPS,
    )
}

fn assert_close(tpu: &[f32], mirrored: &[f32], what: &str) {
    let worst = tpu
        .iter()
        .zip(mirrored)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-5, "{what}: weights differ by {worst}");
}

#[test]
fn linear_regression_matches_mirrored_strategy() {
    let (x, y) = data();
    for n in counts(&[1, 2, 4, 8]) {
        let expected = mirrored_weights(n, &x, &y);
        let s = strategy(n);
        let (xs, ys) = shards(&s, &x, &y);
        let xs = s.to_device(StepInput::PerReplica(&xs)).unwrap();
        let ys = s.to_device(StepInput::PerReplica(&ys)).unwrap();
        // The weights live on the devices, one buffer per replica, across all the steps.
        let w = weights(&s);
        let step = s.function(sgd_step);
        for _ in 0..STEPS {
            let rest = step
                .run_updating(&[&w], &[StepInput::Device(&xs), StepInput::Device(&ys)])
                .unwrap();
            assert!(rest.is_empty());
        }
        assert_eq!(step.compilations(), 1);
        let copies = w.values().unwrap();
        for copy in copies.values() {
            assert!(
                copy.bitwise_eq(&copies.values()[0]),
                "the copies stay mirrored"
            );
        }
        let tpu = w.read_cross_replica(None).unwrap().to_vec::<f32>().unwrap();
        assert_close(&tpu, &expected, &format!("{n} replicas, one run per step"));
        assert!(
            expected.iter().any(|v| v.abs() > 0.01),
            "the model learned something"
        );
    }
}

#[test]
fn run_steps_trains_the_same_weights_in_one_device_loop() {
    let (x, y) = data();
    let n = up_to(2);
    let expected = mirrored_weights(n, &x, &y);
    let s = strategy(n);
    let (xs, ys) = shards(&s, &x, &y);
    // The same batch for every step, stacked along a leading dimension of STEPS.
    let (xs, ys) = (stack(&s, &xs, STEPS), stack(&s, &ys, STEPS));
    let zeros = Tensor::from_vec("/cpu:0", &[FEATURES], vec![0.0f32; FEATURES]).unwrap();
    let step = s.function(sgd_step);
    let out = step
        .run_steps(
            STEPS,
            &[StepInput::Same(&zeros)],
            &[StepInput::PerReplica(&xs), StepInput::PerReplica(&ys)],
        )
        .unwrap();
    let tpu = out[0].replica(n - 1).unwrap().to_vec::<f32>().unwrap();
    assert_close(&tpu, &expected, "run_steps");
    // The same loop with the weights as a device variable the loop carries.
    let w = weights(&s);
    let rest = step
        .run_steps_updating(
            STEPS,
            &[&w],
            &[],
            &[StepInput::PerReplica(&xs), StepInput::PerReplica(&ys)],
        )
        .unwrap();
    assert!(rest.is_empty());
    let tpu = w.read_replica(n - 1).unwrap().to_vec::<f32>().unwrap();
    assert_close(&tpu, &expected, "run_steps");
    let err = step
        .run_steps(3, &[StepInput::Same(&zeros)], &[StepInput::PerReplica(&xs)])
        .unwrap_err();
    assert!(
        matches!(err, TpuError::InvalidArgument(ref m) if m.contains("leading dimension of 3")),
        "{err}"
    );
}

#[test]
fn a_short_last_batch_is_padded_with_a_mask_instead_of_recompiled() {
    if !has(2) {
        return;
    }
    let (x, y) = data();
    let s = strategy(2);
    // Σ_replicas xᵀ((x w − y) · mask) with w = 0.5: the masked gradient sum.
    let step = s.function(|b, args| {
        let (x, y, mask) = (&args[0], &args[1], &args[2]);
        let w = b.splat(0.5f32, &[FEATURES as i64]);
        let predicted = b.matmul(x, &w)?;
        let error = b.subtract(&predicted, y)?;
        let error = b.multiply(&error, mask)?;
        let gradient = b.dot_general(
            x,
            &error,
            &DotDims {
                lhs_contracting: vec![0],
                rhs_contracting: vec![0],
                ..DotDims::default()
            },
        )?;
        Ok(vec![b.all_reduce(ReduceOp::Sum, &gradient)?])
    });
    let devices = s.worker_devices();
    let host_gradient = |rows: std::ops::Range<usize>| {
        let xs = x.slice(ndarray::s![rows.clone(), ..]);
        let error = xs.dot(&Array1::from_elem(FEATURES, 0.5f32)) - y.slice(ndarray::s![rows]);
        xs.t().dot(&error)
    };
    // A full batch of 128 rows per replica, then a short one of 100 + 60 rows.
    for (sizes, compilations) in [([128usize, 128], 1), ([100, 60], 1)] {
        let mut start = 0;
        let mut xs = Vec::new();
        let mut ys = Vec::new();
        let mut expected = Array1::<f32>::zeros(FEATURES);
        for (r, &n) in sizes.iter().enumerate() {
            let rows = start..start + n;
            xs.push(Tensor::from_array(
                &devices[r],
                x.slice(ndarray::s![rows.clone(), ..]).to_owned(),
            ));
            ys.push(Tensor::from_array(
                &devices[r],
                y.slice(ndarray::s![rows.clone()]).to_owned(),
            ));
            expected = expected + host_gradient(rows);
            start += n;
        }
        let (px, mask) = s.pad_batch(&per_replica(&s, xs), 128).unwrap();
        let (py, _) = s.pad_batch(&per_replica(&s, ys), 128).unwrap();
        let out = step
            .run(&[
                StepInput::PerReplica(&px),
                StepInput::PerReplica(&py),
                StepInput::PerReplica(&mask),
            ])
            .unwrap();
        assert_eq!(
            step.compilations(),
            compilations,
            "padding keeps the compiled shape"
        );
        let got = out[0].replica(0).unwrap().to_vec::<f32>().unwrap();
        assert_close_relative(&got, expected.as_slice().unwrap());
    }
    let (too_long, _) = shards(&s, &x, &y);
    let err = s.pad_batch(&too_long, 100).unwrap_err();
    assert!(
        matches!(err, TpuError::InvalidArgument(ref m) if m.contains("more than the 100")),
        "{err}"
    );
}

fn assert_close_relative(got: &[f32], expected: &[f32]) {
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() <= 1e-4 * e.abs().max(1.0), "{g} vs {e}");
    }
}

#[test]
fn tpu_26_steps_on_single_core_sub_strategies() {
    if !has(2) {
        return;
    }
    let topology = TpuStrategy::topology_for(2).unwrap();
    let on_core = |core: i32| {
        let assignment =
            DeviceAssignment::new(topology.clone(), &[vec![vec![0, 0, 0, core]]]).unwrap();
        TpuStrategy::new(sharing_the_devices(TpuConfig {
            device_assignment: Some(assignment),
            ..TpuConfig::cpu(2)
        }))
        .unwrap()
    };
    // A MEAN variable 0.0 on the all-core strategy; the sub-strategies (each its own client)
    // read its value.
    let all_cores = strategy(2);
    let variable = all_cores
        .create_device_variable(
            "v",
            VariableOptions {
                aggregation: distribute_values::VariableAggregation::Mean,
                ..VariableOptions::default()
            },
            |d| Ok(Tensor::from_vec(d, &[1], vec![0.0f32])?),
        )
        .unwrap();
    let v = variable.read_cross_replica(None).unwrap();
    let mut total = 0.0;
    for core in [0, 1] {
        let s = on_core(core);
        let plus_one = s.function(|b, v| {
            let one = b.splat(1.0f32, &[1]);
            Ok(vec![b.add(&v[0], &one)?])
        });
        let out = plus_one.run(&[StepInput::Same(&v)]).unwrap();
        assert!(
            out[0]
                .replica(0)
                .unwrap()
                .device()
                .ends_with(&format!("device:TPU:{core}"))
        );
        total += out[0].replica(0).unwrap().to_vec::<f32>().unwrap()[0];
    }
    assert_eq!(total, 2.0);
}

/// TF's `strategy.gather` on TPUStrategy: a compiled step's per-replica outputs and an eager
/// step's uneven batches, joined in replica order on the host.
#[test]
fn gather_joins_compiled_and_eager_outputs_on_the_host() {
    let n = up_to(4);
    let s = strategy(n);
    let values: Vec<f32> = (1..=n).map(|v| v as f32).collect();
    let x = scalars(&s, &values);
    let double = s.function(|b, x| Ok(vec![b.add(&x[0], &x[0])?]));
    let out = double.run(&[StepInput::PerReplica(&x)]).unwrap();
    let doubled = Leaf::PerReplica(out[0].to_per_replica().unwrap());
    let gathered = s.gather(&doubled, 0).unwrap();
    let doubled: Vec<f32> = values.iter().map(|v| 2.0 * v).collect();
    assert_eq!(gathered.to_vec::<f32>().unwrap(), doubled);
    assert_eq!(gathered.device(), s.extended().host_device());

    // Replica r returns r rows: the last batch of an uneven dataset.
    let rows: Leaf<Tensor> = s
        .run(
            |ctx, ()| {
                let r = ctx.replica_id();
                Ok(Tensor::from_vec(ctx.device(), &[r], vec![r as i32; r])?)
            },
            &(),
        )
        .unwrap();
    let gathered = s.gather(&rows, 0).unwrap();
    let rows: Vec<i32> = (0..n as i32)
        .flat_map(|r| std::iter::repeat_n(r, r as usize))
        .collect();
    assert_eq!(gathered.to_vec::<i32>().unwrap(), rows);

    // The eager replica context's integer MEAN is TF's float64 mean.
    let mean: Leaf<Tensor> = s
        .run(
            |ctx, ()| {
                let mine = Tensor::scalar(ctx.device(), ctx.replica_id() as i64);
                ctx.all_reduce(ReduceOp::Mean, &mine)
            },
            &(),
        )
        .unwrap();
    for t in mean.local_results() {
        assert_eq!(t.to_vec::<f64>().unwrap(), [(n - 1) as f64 / 2.0]);
    }
}
