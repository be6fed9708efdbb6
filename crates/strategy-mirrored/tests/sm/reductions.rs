//! SM-45..SM-49: reductions at the strategy level, and all-reduce inside replicas.

use std::sync::Arc;

use distribute_collectives::Destinations;
use distribute_strategy::{Strategy, StrategyError};
use distribute_tensor::Tensor;
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

/// One tensor per replica, `make(replica, device)`, always per replica (even when equal).
fn each_replica(strategy: &impl Strategy, make: impl Fn(usize, &str) -> Tensor) -> Leaf<Tensor> {
    let map = Arc::clone(strategy.extended().device_map());
    let values = map
        .primary_devices()
        .enumerate()
        .map(|(r, d)| make(r, d))
        .collect();
    Leaf::PerReplica(PerReplica::new(map, values).unwrap())
}

/// TF's `strategy.reduce(MEAN, ints, axis=None)` is the true mean as float64 (`[1, 2]` over 2
/// replicas → 1.5), and agrees with the path along an axis.
#[test]
fn sm46_integer_mean_without_an_axis_is_float64_and_agrees_with_the_axis_path() {
    let strategy = cpus(2);
    let ints: Leaf<Tensor> = strategy
        .run(
            |ctx, ()| {
                Ok(Tensor::from_vec(
                    ctx.device(),
                    &[1],
                    vec![ctx.replica_id() as i32 + 1],
                )?)
            },
            &(),
        )
        .unwrap();
    let mean = strategy.reduce(ReduceOp::Mean, &ints, None).unwrap();
    assert_eq!(mean.dtype(), distribute_tensor::DType::F64);
    assert_eq!(
        mean.device(),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
    assert_eq!(mean.to_vec::<f64>().unwrap(), [1.5]);
    let along = strategy.reduce(ReduceOp::Mean, &ints, Some(0)).unwrap();
    assert_eq!(along.to_vec::<f64>().unwrap(), [1.5]);

    // Sums that wrap in i32 do not wrap the mean, and i64 works alike.
    let wide = |i32_max: bool| {
        each_replica(&strategy, |_, d| {
            if i32_max {
                Tensor::from_vec(d, &[1], vec![i32::MAX]).unwrap()
            } else {
                Tensor::from_vec(d, &[2], vec![i64::MAX, -3]).unwrap()
            }
        })
    };
    let mean = strategy.reduce(ReduceOp::Mean, &wide(true), None).unwrap();
    assert_eq!(mean.to_vec::<f64>().unwrap(), [f64::from(i32::MAX)]);
    let mean = strategy.reduce(ReduceOp::Mean, &wide(false), None).unwrap();
    assert_eq!(mean.to_vec::<f64>().unwrap(), [i64::MAX as f64, -3.0]);

    // Batched cross-replica reductions mix integer and float values.
    let cross = strategy.cross_replica();
    let floats = per_replica(&strategy, |i| vec![i as f32]);
    let both = cross
        .batch_reduce_to(ReduceOp::Mean, &[(&ints, &host()), (&floats, &host())])
        .unwrap();
    assert_eq!(both[0].local_results()[0].to_vec::<f64>().unwrap(), [1.5]);
    assert_eq!(both[1].local_results()[0].to_vec::<f32>().unwrap(), [0.5]);
}

/// SM-47 with integers: TF's `all_reduce(MEAN)` of (1, [39, 2]) and (3, [3, 41]) gives
/// (2, [21, 21.5]) as float64 on both replicas, bitwise equal to the cross-replica reduction.
#[test]
fn sm47_integer_all_reduce_mean_in_replica_context_is_float64() {
    let strategy = cpus(2);
    let inputs = [(1i64, [39i32, 2]), (3, [3, 41])];
    let out = strategy
        .run(
            |ctx, ()| {
                let (a, b) = inputs[ctx.replica_id()];
                let mine = (
                    Tensor::scalar(ctx.device(), a),
                    Tensor::from_vec(ctx.device(), &[2], b.to_vec())?,
                    Tensor::scalar(ctx.device(), a as f32),
                );
                let fused = ctx.all_reduce(ReduceOp::Mean, &mine)?;
                let single = ctx.collectives().all_reduce(ReduceOp::Mean, &mine.1)?;
                Ok((fused, single, mine.1))
            },
            &(),
        )
        .unwrap();
    let ((a, b, c), single, originals) = out;
    for r in 0..2 {
        let a = a.local_results()[r.min(a.local_results().len() - 1)];
        let b = b.local_results()[r.min(b.local_results().len() - 1)];
        assert_eq!(a.to_vec::<f64>().unwrap(), [2.0]);
        assert_eq!(b.to_vec::<f64>().unwrap(), [21.0, 21.5]);
        assert_eq!(
            c.local_results()[r.min(c.local_results().len() - 1)]
                .to_vec::<f32>()
                .unwrap(),
            [2.0]
        );
    }
    let reduced = strategy.reduce(ReduceOp::Mean, &originals, None).unwrap();
    for s in single.local_results() {
        assert_eq!(s.dtype(), distribute_tensor::DType::F64);
        assert!(s.to_device(reduced.device()).bitwise_eq(&reduced));
    }
}

/// TF's `strategy.gather`: every replica's value joined along the axis, in replica order, on the
/// host; the axis may be uneven (replica 0 has no rows at all here).
#[test]
fn gather_joins_replicas_in_order_on_the_host_uneven_included() {
    let strategy = cpus(3);
    let rows: Leaf<Tensor> = strategy
        .run(
            |ctx, ()| {
                let r = ctx.replica_id();
                let values: Vec<i32> = (0..2 * r).map(|i| (10 * r + i) as i32).collect();
                Ok(Tensor::from_vec(ctx.device(), &[r, 2], values)?)
            },
            &(),
        )
        .unwrap();
    let gathered = strategy.gather(&rows, 0).unwrap();
    assert_eq!(gathered.shape(), [3, 2]);
    assert_eq!(
        gathered.device(),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
    assert_eq!(gathered.to_vec::<i32>().unwrap(), [10, 11, 20, 21, 22, 23]);

    // Each replica's [2, 1] column; along axis 1 they sit side by side.
    let as_columns = each_replica(&strategy, |r, d| {
        Tensor::from_vec(d, &[2, 1], vec![r as f32; 2]).unwrap()
    });
    let side_by_side = strategy.gather(&as_columns, 1).unwrap();
    assert_eq!(side_by_side.shape(), [2, 3]);
    assert_eq!(
        side_by_side.to_vec::<f32>().unwrap(),
        [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    );

    // A plain value was every replica's: it counts once per replica.
    let plain = Leaf::Same(Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0]).unwrap());
    assert_eq!(
        strategy.gather(&plain, 0).unwrap().to_vec::<f32>().unwrap(),
        [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    );
}

#[test]
fn gather_refuses_values_that_differ_off_the_axis_or_lack_it() {
    let strategy = cpus(2);
    let invalid = |value: &Leaf<Tensor>, axis| {
        let err = strategy.gather(value, axis).unwrap_err();
        assert!(matches!(err, StrategyError::InvalidArgument(_)), "{err:?}");
    };
    let matrices = |shapes: [[usize; 2]; 2]| {
        each_replica(&strategy, |r, d| {
            Tensor::zeros(d, distribute_tensor::DType::F32, &shapes[r]).unwrap()
        })
    };
    // Uneven along axis 0 is fine; along axis 1 the first dimension must agree.
    assert_eq!(
        strategy
            .gather(&matrices([[1, 3], [2, 3]]), 0)
            .unwrap()
            .shape(),
        [3, 3]
    );
    invalid(&matrices([[1, 3], [2, 3]]), 1);
    invalid(&matrices([[1, 3], [1, 3]]), 2);
    invalid(
        &each_replica(&strategy, |_, d| Tensor::scalar(d, 1.0f32)),
        0,
    );
    let mixed = each_replica(&strategy, |r, d| {
        if r == 0 {
            Tensor::from_vec(d, &[1], vec![1.0f32]).unwrap()
        } else {
            Tensor::from_vec(d, &[1], vec![1i32]).unwrap()
        }
    });
    invalid(&mixed, 0);
}
