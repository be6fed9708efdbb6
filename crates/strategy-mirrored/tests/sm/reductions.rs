//! SM-45..SM-49: reductions at the strategy level, and all-reduce inside replicas.

use std::sync::Arc;

use distribute_collectives::{Destinations, Tensor};
use distribute_strategy::{Strategy, StrategyError};
use distribute_values::{DistributedValues, ErrorKind, Leaf, Mirrored, PerReplica, ReduceOp};

use super::cpus;

fn host() -> Destinations {
    Destinations::device("/job:localhost/replica:0/task:0/device:CPU:0").unwrap()
}

#[test]
fn sm45_reduce_dispatch() {
    let strategy = cpus(2);
    let cross = strategy.cross_replica();
    let map = Arc::clone(strategy.extended().device_map());
    let copies: Vec<Tensor> = map
        .primary_devices()
        .map(|d| Tensor::scalar(d, 3.0f32))
        .collect();
    let mirrored = Leaf::Mirrored(Mirrored::new(Arc::clone(&map), copies).unwrap());

    // MEAN of a mirrored value: the very same value, no communication.
    let Leaf::Mirrored(out) = cross.reduce_to(ReduceOp::Mean, &mirrored, &host()).unwrap() else {
        panic!("a mirrored mean stays mirrored")
    };
    let Leaf::Mirrored(input) = &mirrored else {
        unreachable!()
    };
    for (a, b) in out.values().iter().zip(input.values()) {
        assert!(a.shares_buffer_with(b));
    }
    // SUM of a mirrored value is refused.
    let err = cross
        .reduce_to(ReduceOp::Sum, &mirrored, &host())
        .unwrap_err();
    assert!(matches!(err, StrategyError::Invariant(_)), "{err:?}");

    // A plain value follows COL-03: MEAN keeps it, SUM over 2 replicas is refused.
    let plain = Leaf::Same(Tensor::scalar("/cpu:0", 3.0f32));
    let mean = cross.reduce_to(ReduceOp::Mean, &plain, &host()).unwrap();
    assert_eq!(mean.local_results()[0].to_vec::<f32>().unwrap(), [3.0]);
    assert!(cross.reduce_to(ReduceOp::Sum, &plain, &host()).is_err());

    // Per-replica values go through the cross-device ops.
    let per_replica = Leaf::PerReplica(
        PerReplica::new(
            Arc::clone(&map),
            map.primary_devices()
                .enumerate()
                .map(|(i, d)| Tensor::scalar(d, i as f32 + 1.0))
                .collect(),
        )
        .unwrap(),
    );
    let sum = cross
        .reduce_to(ReduceOp::Sum, &per_replica, &host())
        .unwrap();
    let Leaf::Same(sum) = sum else {
        panic!("one destination")
    };
    assert_eq!(sum.to_vec::<f32>().unwrap(), [3.0]);
    assert_eq!(sum.device(), "/job:localhost/replica:0/task:0/device:CPU:0");
}

/// Runs a step that returns `value(replica)` as a tensor on the replica's device.
fn per_replica<F>(strategy: &impl Strategy, value: F) -> Leaf<Tensor>
where
    F: Fn(usize) -> Vec<f32> + Sync,
{
    strategy
        .run(
            |ctx, ()| {
                let v = value(ctx.replica_id());
                Ok(Tensor::from_vec(ctx.device(), &[v.len()], v)?)
            },
            &(),
        )
        .unwrap()
}

fn scalar(t: &Tensor) -> f32 {
    let v = t.to_vec::<f32>().unwrap();
    assert_eq!(v.len(), 1, "{t}");
    v[0]
}

#[test]
fn sm46_reductions_with_and_without_an_axis() {
    for n in [1, 2, 3, 4] {
        let strategy = cpus(n);
        let ids: Leaf<Tensor> = strategy
            .run(
                |ctx, ()| Ok(Tensor::scalar(ctx.device(), ctx.replica_id() as f32)),
                &(),
            )
            .unwrap();
        let sum = strategy.reduce(ReduceOp::Sum, &ids, None).unwrap();
        assert_eq!(scalar(&sum), (0..n).sum::<usize>() as f32, "{n} replicas");

        // Replica i returns [i] * (i + 1).
        let ragged = per_replica(&strategy, |i| vec![i as f32; i + 1]);
        let total: usize = (0..n).map(|i| i * (i + 1)).sum();
        let count: usize = (0..n).map(|i| i + 1).sum();
        let sum = strategy.reduce(ReduceOp::Sum, &ragged, Some(0)).unwrap();
        assert_eq!(scalar(&sum), total as f32, "{n} replicas");
        let mean = strategy.reduce(ReduceOp::Mean, &ragged, Some(0)).unwrap();
        assert!((scalar(&mean) - total as f32 / count as f32).abs() < 1e-6);

        let same = per_replica(&strategy, |_| vec![1.0, 2.0]);
        let mean = strategy.reduce(ReduceOp::Mean, &same, Some(0)).unwrap();
        assert_eq!(scalar(&mean), 1.5);
        let sum = strategy.reduce(ReduceOp::Sum, &same, Some(0)).unwrap();
        assert_eq!(scalar(&sum), 3.0 * n as f32);
    }
    // Two replicas, as TF's test states them: 2 and 2/3.
    let strategy = cpus(2);
    let ragged = per_replica(&strategy, |i| vec![i as f32; i + 1]);
    let sum = strategy.reduce(ReduceOp::Sum, &ragged, Some(0)).unwrap();
    assert_eq!(scalar(&sum), 2.0);
    let mean = strategy.reduce(ReduceOp::Mean, &ragged, Some(0)).unwrap();
    assert!((scalar(&mean) - 2.0 / 3.0).abs() < 1e-6);

    // Integers too.
    let ints: Leaf<Tensor> = strategy
        .run(
            |ctx, ()| {
                let i = ctx.replica_id() as i64;
                Ok(Tensor::from_vec(
                    ctx.device(),
                    &[ctx.replica_id() + 1],
                    vec![i; ctx.replica_id() + 1],
                )?)
            },
            &(),
        )
        .unwrap();
    let sum = strategy.reduce(ReduceOp::Sum, &ints, Some(0)).unwrap();
    assert_eq!(sum.to_vec::<i64>().unwrap(), [2]);
}

#[test]
fn sm47_all_reduce_in_replica_context() {
    let strategy = cpus(2);
    let inputs = [(1.0f32, [39.0f32, 2.0]), (3.0, [3.0, 41.0])];
    let expected = [
        (ReduceOp::Sum, 4.0, [42.0, 43.0]),
        (ReduceOp::Mean, 2.0, [21.0, 21.5]),
    ];
    for (op, scalar_out, vector_out) in expected {
        let (scalars, vectors): (Leaf<Tensor>, Leaf<Tensor>) = strategy
            .run(
                |ctx, ()| {
                    let (s, v) = inputs[ctx.replica_id()];
                    let device = ctx.device();
                    let value = (
                        Tensor::scalar(device, s),
                        Tensor::from_vec(device, &[2], v.to_vec())?,
                    );
                    ctx.all_reduce(op, &value)
                },
                &(),
            )
            .unwrap();
        let (scalars, vectors) = (scalars.local_results(), vectors.local_results());
        assert_eq!(
            (scalars.len(), vectors.len()),
            (2, 2),
            "one result per replica"
        );
        for (r, (s, v)) in scalars.into_iter().zip(vectors).enumerate() {
            assert_eq!(s.to_vec::<f32>().unwrap(), [scalar_out], "{op}");
            assert_eq!(v.to_vec::<f32>().unwrap(), vector_out, "{op}");
            assert_eq!(
                s.device(),
                strategy.extended().device_map().primary_device(r).unwrap()
            );
        }
    }

    let one = cpus(1);
    let (s, v): (Leaf<Tensor>, Leaf<Tensor>) = one
        .run(
            |ctx, ()| {
                let device = ctx.device();
                let four = ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(device, 4.0f32))?;
                assert_eq!(four.to_vec::<f32>()?, [4.0]);
                let value = (
                    Tensor::scalar(device, 2.0f32),
                    Tensor::from_vec(device, &[2], vec![21.0f32, 22.0])?,
                );
                ctx.all_reduce(ReduceOp::Mean, &value)
            },
            &(),
        )
        .unwrap();
    let (s, v) = (s.local_results()[0], v.local_results()[0]);
    assert_eq!(s.to_vec::<f32>().unwrap(), [2.0]);
    assert_eq!(v.to_vec::<f32>().unwrap(), [21.0, 22.0]);
}

#[test]
fn sm49_reduce_ops_from_strings() {
    let strategy = cpus(2);
    let ids: Leaf<Tensor> = strategy
        .run(
            |ctx, ()| Ok(Tensor::scalar(ctx.device(), ctx.replica_id() as f32 + 1.0)),
            &(),
        )
        .unwrap();
    for (name, expected) in [("mean", 1.5), ("MEAN", 1.5), ("sum", 3.0), ("SUM", 3.0)] {
        let op: ReduceOp = name.parse().unwrap();
        let out = strategy.reduce(op, &ids, None).unwrap();
        assert_eq!(scalar(&out), expected, "{name}");
        let cross = strategy
            .cross_replica()
            .batch_reduce_to(op, &[(&ids, &host())])
            .unwrap();
        assert_eq!(scalar(cross[0].local_results()[0]), expected, "{name}");
    }
    // Min and Max are reduce ops here (the collectives implement them); other names are not.
    for bad in ["prod", "average", ""] {
        let err = bad.parse::<ReduceOp>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{bad:?}");
    }
}

#[test]
fn sm46_integer_means_are_float64_and_plain_values_count_per_replica() {
    let strategy = cpus(2);
    // Replica i returns [i] * (i + 1) as int64: the mean along axis 0 is 2/3, as TF's true
    // division gives it, not the integer 0.
    let ints: Leaf<Tensor> = strategy
        .run(
            |ctx, ()| {
                let i = ctx.replica_id();
                Ok(Tensor::from_vec(
                    ctx.device(),
                    &[i + 1],
                    vec![i as i64; i + 1],
                )?)
            },
            &(),
        )
        .unwrap();
    let mean = strategy.reduce(ReduceOp::Mean, &ints, Some(0)).unwrap();
    assert_eq!(mean.to_vec::<f64>().unwrap(), [2.0 / 3.0]);

    // Integer means are summed in float64: i32 rows of 2e9 once wrapped to -147483648.
    let big = strategy
        .run(
            |ctx, ()| {
                Ok(Tensor::from_vec(
                    ctx.device(),
                    &[2, 1],
                    vec![2_000_000_000i32; 2],
                )?)
            },
            &(),
        )
        .unwrap();
    let mean = strategy.reduce(ReduceOp::Mean, &big, Some(0)).unwrap();
    assert_eq!(mean.to_vec::<f64>().unwrap(), [2e9]);
    assert_eq!(
        strategy
            .reduce(ReduceOp::Sum, &ints, Some(0))
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        [2]
    );

    // A plain value counts once per replica, as TF's `run` over it would give.
    let plain = Leaf::Same(Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0]).unwrap());
    assert_eq!(
        scalar(&strategy.reduce(ReduceOp::Sum, &plain, Some(0)).unwrap()),
        6.0
    );
    assert_eq!(
        scalar(&strategy.reduce(ReduceOp::Mean, &plain, Some(0)).unwrap()),
        1.5
    );
}

#[test]
fn min_and_max_along_an_axis_skip_replicas_with_empty_chunks() {
    // The last step of an uneven dataset leaves trailing replicas with no rows.
    let strategy = cpus(3);
    let uneven = per_replica(&strategy, |i| {
        if i == 2 {
            vec![]
        } else {
            vec![i as f32 + 1.0, -(i as f32)]
        }
    });
    assert_eq!(
        scalar(&strategy.reduce(ReduceOp::Max, &uneven, Some(0)).unwrap()),
        2.0
    );
    assert_eq!(
        scalar(&strategy.reduce(ReduceOp::Min, &uneven, Some(0)).unwrap()),
        -1.0
    );
    let empty = per_replica(&strategy, |_| vec![]);
    let err = strategy.reduce(ReduceOp::Max, &empty, Some(0)).unwrap_err();
    assert!(
        err.to_string().contains("every replica's axis is empty"),
        "{err}"
    );
    let err = strategy
        .reduce(ReduceOp::Mean, &empty, Some(0))
        .unwrap_err();
    assert!(err.to_string().contains("mean is undefined"), "{err}");
}
