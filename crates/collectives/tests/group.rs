//! Collective calls from replica threads through a `CollectiveGroup`: results, determinism and
//! every failure mode (mismatch, missing replica, panicking replica) failing fast.

use std::time::Duration;

use distribute_collectives::backend::{CollectiveGroup, Member, ReducePlan};
use distribute_collectives::{CollectiveError, GroupConfig};
use distribute_tensor::{DType, Tensor};
use distribute_values::ReduceOp;

const PLANS: [ReducePlan; 3] = [
    ReducePlan::OneReducer,
    ReducePlan::Sliced { min_bytes: 0 },
    ReducePlan::Sliced { min_bytes: 1 << 20 },
];

fn config(plan: ReducePlan) -> GroupConfig {
    GroupConfig {
        deadline: Duration::from_secs(30),
        plan,
        ..GroupConfig::default()
    }
}

/// Runs `step` on `n` replica threads of a fresh group and returns each replica's result.
fn run<T: Send>(n: usize, config: GroupConfig, step: impl Fn(&Member) -> T + Sync) -> Vec<T> {
    let group = CollectiveGroup::new(n, config).unwrap();
    run_on(&group, step)
}

fn run_on<T: Send>(group: &CollectiveGroup, step: impl Fn(&Member) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..group.num_replicas())
            .map(|r| {
                let member = group.member(r).unwrap();
                let step = &step;
                s.spawn(move || step(&member))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn device(r: usize) -> String {
    format!("/job:localhost/replica:0/task:0/device:CPU:{r}")
}

/// Replica r's input: element i is `i + 0.01·r` (TF's all-reduce test data).
fn input(r: usize, len: usize) -> Tensor {
    let data: Vec<f32> = (0..len).map(|i| i as f32 + 0.01 * r as f32).collect();
    Tensor::from_vec(&device(r), &[len], data).unwrap()
}

/// The expected reduction, computed independently in f64 and rounded, for inputs where that
/// equals f32 left-to-right folding (small replica counts and magnitudes).
fn expected(op: ReduceOp, n: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let values: Vec<f32> = (0..n).map(|r| i as f32 + 0.01 * r as f32).collect();
            let fold = |f: fn(f32, f32) -> f32| values[1..].iter().fold(values[0], |a, &b| f(a, b));
            match op {
                ReduceOp::Sum => fold(|a, b| a + b),
                ReduceOp::Mean => fold(|a, b| a + b) / n as f32,
                ReduceOp::Min => fold(f32::min),
                ReduceOp::Max => fold(f32::max),
            }
        })
        .collect()
}

#[test]
fn all_reduce_every_op_replica_count_and_plan() {
    for plan in PLANS {
        for n in [1, 2, 3, 4, 8] {
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max] {
                let len = 1000 + n;
                let out = run(n, config(plan), |m| {
                    m.all_reduce(op, &input(m.replica(), len))
                });
                for (r, result) in out.iter().enumerate() {
                    let result = result.as_ref().unwrap();
                    assert_eq!(
                        result.device(),
                        device(r),
                        "each replica gets its own device"
                    );
                    assert_eq!(
                        result.to_vec::<f32>().unwrap(),
                        expected(op, n, len),
                        "{plan:?} n={n} {op}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_replica_shares_one_result_buffer() {
    for plan in PLANS {
        let out = run(4, config(plan), |m| {
            m.all_reduce(ReduceOp::Sum, &input(m.replica(), 4096))
                .unwrap()
        });
        assert!(
            out.iter().all(|t| t.shares_buffer_with(&out[0])),
            "{plan:?}"
        );
    }
}

#[test]
fn results_are_bitwise_identical_across_plans_runs_and_replicas() {
    // Values whose sums depend on the order of addition, so any reordering would show.
    let data = |r: usize, len: usize| -> Tensor {
        let v: Vec<f32> = (0..len)
            .map(|i| {
                let x = ((i * 7919 + r * 104_729) % 1000) as f32;
                (x - 500.0) * 1.0e-3 * (1.0 + r as f32 * 1.0e4)
            })
            .collect();
        Tensor::from_vec(&device(r), &[len], v).unwrap()
    };
    let reference = run(5, config(ReducePlan::OneReducer), |m| {
        m.all_reduce(ReduceOp::Mean, &data(m.replica(), 70_001))
            .unwrap()
    })
    .remove(0);
    for plan in PLANS {
        for _ in 0..5 {
            let out = run(5, config(plan), |m| {
                m.all_reduce(ReduceOp::Mean, &data(m.replica(), 70_001))
                    .unwrap()
            });
            for t in &out {
                assert!(t.bitwise_eq(&reference), "{plan:?}");
            }
        }
    }
}

#[test]
fn all_dtypes_reduce() {
    let n = 3;
    let out = run(n, config(ReducePlan::Sliced { min_bytes: 0 }), |m| {
        let r = m.replica();
        let tensors = [
            Tensor::from_vec(
                &device(r),
                &[2],
                vec![half::f16::from_f32(r as f32), half::f16::ONE],
            )
            .unwrap(),
            Tensor::from_vec(
                &device(r),
                &[2],
                vec![half::bf16::from_f32(r as f32), half::bf16::ONE],
            )
            .unwrap(),
            Tensor::from_vec(&device(r), &[2], vec![r as f64, 1.0]).unwrap(),
            Tensor::from_vec(&device(r), &[2], vec![r as i32, i32::MAX]).unwrap(),
            Tensor::from_vec(&device(r), &[2], vec![r as i64, -1]).unwrap(),
        ];
        tensors
            .iter()
            .map(|t| m.all_reduce(ReduceOp::Sum, t).unwrap())
            .collect::<Vec<_>>()
    });
    let first = &out[0];
    assert_eq!(
        first[0].to_vec::<half::f16>().unwrap(),
        [half::f16::from_f32(3.0), half::f16::from_f32(3.0)]
    );
    assert_eq!(
        first[1].to_vec::<half::bf16>().unwrap(),
        [half::bf16::from_f32(3.0), half::bf16::from_f32(3.0)]
    );
    assert_eq!(first[2].to_vec::<f64>().unwrap(), [3.0, 3.0]);
    assert_eq!(
        first[3].to_vec::<i32>().unwrap(),
        [3, i32::MAX.wrapping_mul(3)]
    );
    assert_eq!(first[4].to_vec::<i64>().unwrap(), [3, -3]);
}

/// TF's true division: an integer MEAN is the exact mean as float64 on every plan, one by one,
/// batched (packed with float tensors) and scattered; sums that wrap in `i32` do not wrap here.
#[test]
fn integer_mean_is_the_float64_mean_on_every_plan() {
    // 2^17 int64 elements (1 MiB) make the sliced plan split the work among the replicas.
    let len = 1 << 17;
    let ints = |r: usize| -> Vec<i64> { (0..len as i64).map(|i| i * (r as i64 + 1)).collect() };
    let expected: Vec<f64> = (0..len).map(|i| i as f64 * 1.5).collect();
    for plan in [ReducePlan::OneReducer, ReducePlan::Sliced { min_bytes: 0 }] {
        let out = run(2, config(plan), |m| {
            let r = m.replica();
            let big = Tensor::from_vec(&device(r), &[len], ints(r)).unwrap();
            let wraps = Tensor::from_vec(&device(r), &[2], vec![i32::MAX, r as i32 + 1]).unwrap();
            let float = Tensor::from_vec(&device(r), &[1], vec![r as f32]).unwrap();
            let one = m.all_reduce(ReduceOp::Mean, &big).unwrap();
            let batch = m
                .batch_all_reduce(ReduceOp::Mean, &[wraps.clone(), float, big.clone()])
                .unwrap();
            let scattered = m.reduce_scatter(ReduceOp::Mean, &wraps).unwrap();
            (one, batch, scattered)
        });
        for (r, (one, batch, scattered)) in out.into_iter().enumerate() {
            assert_eq!(one.dtype(), DType::F64, "{plan:?}");
            assert_eq!(one.device(), device(r));
            assert_eq!(one.to_vec::<f64>().unwrap(), expected, "{plan:?}");
            assert_eq!(
                batch[0].to_vec::<f64>().unwrap(),
                [f64::from(i32::MAX), 1.5],
                "{plan:?}"
            );
            assert_eq!(batch[1].to_vec::<f32>().unwrap(), [0.5]);
            assert!(batch[2].bitwise_eq(&one), "{plan:?}");
            assert_eq!(scattered.dtype(), DType::F64);
            let row = if r == 0 { f64::from(i32::MAX) } else { 1.5 };
            assert_eq!(scattered.to_vec::<f64>().unwrap(), [row]);
        }
    }
}

#[test]
fn strided_inputs_reduce_correctly() {
    let out = run(2, config(ReducePlan::Sliced { min_bytes: 0 }), |m| {
        let a =
            ndarray::Array::from_shape_fn((300, 200), |(i, j)| (i * 1000 + j + m.replica()) as f64);
        let transposed = Tensor::from_shared(
            &device(m.replica()),
            a.reversed_axes().into_dyn().into_shared(),
        );
        m.all_reduce(ReduceOp::Sum, &transposed).unwrap()
    });
    let result = out[0].array::<f64>().unwrap();
    assert_eq!(result.shape(), [200, 300]);
    assert_eq!(result[[7, 11]], (2 * (11 * 1000 + 7) + 1) as f64);
}

#[test]
fn all_gather_reduce_scatter_broadcast_and_batch() {
    let n = 3;
    let out = run(n, config(ReducePlan::OneReducer), |m| {
        let r = m.replica();
        // Replica r contributes r+1 rows of 2 columns, all equal to r.
        let rows = Tensor::from_vec(&device(r), &[r + 1, 2], vec![r as f32; 2 * (r + 1)]).unwrap();
        let gathered = m.all_gather(&rows).unwrap();
        let scatter_in =
            Tensor::from_vec(&device(r), &[6], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let scattered = m.reduce_scatter(ReduceOp::Sum, &scatter_in).unwrap();
        let root_value = Tensor::scalar(&device(r), 42i64);
        let broadcast = m.broadcast(1, (r == 1).then_some(&root_value)).unwrap();
        let batch = m
            .batch_all_reduce(
                ReduceOp::Max,
                &[input(r, 3), Tensor::scalar(&device(r), r as i32)],
            )
            .unwrap();
        (gathered, scattered, broadcast, batch)
    });
    for (r, (gathered, scattered, broadcast, batch)) in out.into_iter().enumerate() {
        assert_eq!(gathered.shape(), [6, 2]);
        assert_eq!(
            gathered.to_vec::<f32>().unwrap(),
            [0., 0., 1., 1., 1., 1., 2., 2., 2., 2., 2., 2.]
        );
        assert_eq!(
            scattered.to_vec::<f32>().unwrap(),
            [3.0 * (2 * r + 1) as f32, 3.0 * (2 * r + 2) as f32]
        );
        assert_eq!(broadcast.to_vec::<i64>().unwrap(), [42]);
        assert_eq!(
            batch[0].to_vec::<f32>().unwrap(),
            expected(ReduceOp::Max, n, 3)
        );
        assert_eq!(batch[1].to_vec::<i32>().unwrap(), [2]);
        assert_eq!(batch[1].device(), device(r));
    }
}

#[test]
fn reduce_scatter_needs_divisible_rows() {
    let out = run(2, config(ReducePlan::OneReducer), |m| {
        m.reduce_scatter(ReduceOp::Sum, &input(m.replica(), 3))
    });
    for result in out {
        let err = result.unwrap_err();
        assert!(
            err.to_string().contains("divisible by the 2 replicas"),
            "{err}"
        );
    }
}

#[test]
fn mismatched_shapes_fail_every_replica_naming_both_then_the_group_goes_on() {
    let group = CollectiveGroup::new(3, config(ReducePlan::OneReducer)).unwrap();
    let out = run_on(&group, |m| {
        let len = if m.replica() == 2 { 5 } else { 4 };
        m.all_reduce(ReduceOp::Sum, &input(m.replica(), len))
    });
    for result in out {
        match result.unwrap_err() {
            CollectiveError::ReplicaMismatch {
                op,
                first_replica: 0,
                first,
                other_replica: 2,
                other,
                ..
            } => {
                assert_eq!(op, "all_reduce(SUM)");
                assert_eq!(
                    (first.as_str(), other.as_str()),
                    ("float32 [4]", "float32 [5]")
                );
            }
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }
    // Every replica saw the same error, so the group is still consistent.
    let again = run_on(&group, |m| {
        m.all_reduce(ReduceOp::Sum, &input(m.replica(), 4)).unwrap()
    });
    assert_eq!(
        again[0].to_vec::<f32>().unwrap(),
        expected(ReduceOp::Sum, 3, 4)
    );
}

#[test]
fn mismatched_operations_and_dtypes_are_reported() {
    let out = run(2, config(ReducePlan::OneReducer), |m| {
        let t = input(m.replica(), 4);
        if m.replica() == 0 {
            m.all_reduce(ReduceOp::Sum, &t)
        } else {
            m.all_gather(&t)
        }
    });
    let err = out[0].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("replica 0 passed all_reduce(SUM)")
            && err.contains("replica 1 passed all_gather"),
        "{err}"
    );

    let out = run(2, config(ReducePlan::OneReducer), |m| {
        let t = if m.replica() == 0 {
            input(0, 2)
        } else {
            Tensor::from_vec(&device(1), &[2], vec![1i32, 2]).unwrap()
        };
        m.all_reduce(ReduceOp::Max, &t)
    });
    let err = out[1].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("float32 [2]") && err.contains("int32 [2]"),
        "{err}"
    );
}

#[test]
fn col28_a_replica_that_never_arrives_is_named_after_the_deadline() {
    let group = CollectiveGroup::new(
        3,
        GroupConfig {
            deadline: Duration::from_millis(300),
            plan: ReducePlan::OneReducer,
            ..GroupConfig::default()
        },
    )
    .unwrap();
    let out = run_on(&group, |m| {
        if m.replica() == 2 {
            return None; // replica 2 skips the collective
        }
        Some(m.all_reduce(ReduceOp::Sum, &input(m.replica(), 4)))
    });
    let errors: Vec<CollectiveError> = out.into_iter().flatten().map(|r| r.unwrap_err()).collect();
    assert_eq!(errors.len(), 2);
    // At least one waiter hit the deadline itself; any other was released by the abort.
    let deadline = errors
        .iter()
        .find_map(|e| match e {
            CollectiveError::DeadlineExceeded { missing, op, .. } => {
                Some((missing.clone(), op.clone()))
            }
            _ => None,
        })
        .expect("a DeadlineExceeded error");
    assert_eq!(deadline.0, vec![2]);
    assert!(
        deadline.1.starts_with("all_reduce(SUM) #"),
        "{}",
        deadline.1
    );
    for e in &errors {
        assert!(e.to_string().contains("[2]"), "{e}");
    }
    // The group stays aborted until reset, then works again.
    assert!(group.abort_reason().unwrap().contains("did not arrive"));
    let late = run_on(&group, |m| {
        m.all_reduce(ReduceOp::Sum, &input(m.replica(), 4))
    });
    assert!(
        late.iter()
            .all(|r| matches!(r, Err(CollectiveError::Aborted { .. })))
    );
    group.reset();
    let ok = run_on(&group, |m| {
        m.all_reduce(ReduceOp::Sum, &input(m.replica(), 4)).unwrap()
    });
    assert_eq!(
        ok[2].to_vec::<f32>().unwrap(),
        expected(ReduceOp::Sum, 3, 4)
    );
}

#[test]
fn a_panicking_replica_aborts_the_others_instead_of_hanging() {
    // A long deadline: the others must be released by the panic, not by the clock.
    let group = CollectiveGroup::new(3, config(ReducePlan::OneReducer)).unwrap();
    let results: Vec<std::thread::Result<Result<Tensor, CollectiveError>>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|r| {
                    let member = group.member(r).unwrap();
                    s.spawn(move || {
                        if r == 1 {
                            panic!("replica 1 fails in its step");
                        }
                        member.all_reduce(ReduceOp::Sum, &input(r, 4))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        });
    assert!(results[1].is_err(), "replica 1 panicked");
    for r in [0, 2] {
        match results[r].as_ref().unwrap() {
            Err(CollectiveError::Aborted { reason }) => assert_eq!(reason, "replica 1 panicked"),
            other => panic!("replica {r}: expected Aborted, got {other:?}"),
        }
    }
}

#[test]
fn large_outputs_reuse_the_buffer_once_released() {
    let group = CollectiveGroup::new(2, config(ReducePlan::Sliced { min_bytes: 0 })).unwrap();
    let first = run_on(&group, |m| {
        m.all_reduce(ReduceOp::Sum, &input(m.replica(), 100_000))
            .unwrap()
    });
    let address = first[0].array::<f32>().unwrap().as_ptr();
    // Still held: the next call must not overwrite it.
    let second = run_on(&group, |m| {
        m.all_reduce(ReduceOp::Max, &input(m.replica(), 100_000))
            .unwrap()
    });
    assert_ne!(second[0].array::<f32>().unwrap().as_ptr(), address);
    assert_eq!(
        first[0].to_vec::<f32>().unwrap(),
        expected(ReduceOp::Sum, 2, 100_000)
    );
    let second_address = second[0].array::<f32>().unwrap().as_ptr();
    drop(second);
    let third = run_on(&group, |m| {
        m.all_reduce(ReduceOp::Min, &input(m.replica(), 100_000))
            .unwrap()
    });
    assert_eq!(
        third[0].array::<f32>().unwrap().as_ptr(),
        second_address,
        "released buffer reused"
    );
    assert_eq!(
        third[1].to_vec::<f32>().unwrap(),
        expected(ReduceOp::Min, 2, 100_000)
    );
}

#[test]
fn member_ids_are_checked() {
    let group = CollectiveGroup::new(2, GroupConfig::default()).unwrap();
    assert!(group.member(2).is_err());
    assert!(CollectiveGroup::new(0, GroupConfig::default()).is_err());
}

#[test]
fn many_calls_back_to_back_with_more_replicas_than_cores() {
    let out = run(8, config(ReducePlan::Sliced { min_bytes: 4096 }), |m| {
        let mut last = None;
        for step in 0..200 {
            let len = if step % 2 == 0 { 16 } else { 4096 };
            last = Some(
                m.all_reduce(ReduceOp::Sum, &input(m.replica(), len))
                    .unwrap(),
            );
        }
        last.unwrap()
    });
    assert_eq!(
        out[7].to_vec::<f32>().unwrap(),
        expected(ReduceOp::Sum, 8, 4096)
    );
}

#[test]
fn a_replica_that_finished_its_step_fails_the_waiters_at_once() {
    // A long deadline: the waiter must be released by the finish mark, not by the clock.
    let group = CollectiveGroup::new(2, config(ReducePlan::OneReducer)).unwrap();
    group.rendezvous().begin_step();
    let out = run_on(&group, |m| {
        if m.replica() == 1 {
            m.group().rendezvous().finish(1).unwrap(); // returns from its step without the collective
            return None;
        }
        Some(m.all_reduce(ReduceOp::Sum, &input(0, 4)))
    });
    match out[0].as_ref().unwrap() {
        Err(CollectiveError::ReplicaFinished { finished, op }) => {
            assert_eq!(finished, &[1]);
            assert!(op.starts_with("all_reduce(SUM)"), "{op}");
        }
        other => panic!("expected ReplicaFinished, got {other:?}"),
    }
    group.reset();
    let ok = run_on(&group, |m| {
        m.all_reduce(ReduceOp::Sum, &input(m.replica(), 4)).unwrap()
    });
    assert_eq!(
        ok[0].to_vec::<f32>().unwrap(),
        expected(ReduceOp::Sum, 2, 4)
    );
}

#[test]
fn batched_all_reduce_packs_buckets_and_matches_one_by_one_bitwise() {
    // Mixed dtypes and sizes; tiny buckets force many packs, min_bytes 0 forces sliced buckets.
    let tensors = |r: usize| -> Vec<Tensor> {
        let f = |len: usize, k: usize| {
            let v: Vec<f32> = (0..len)
                .map(|i| ((i * 13 + r * 7 + k) % 17) as f32 * 0.1 - 0.7)
                .collect();
            Tensor::from_vec(&device(r), &[len], v).unwrap()
        };
        vec![
            f(3, 0),
            Tensor::from_vec(&device(r), &[2, 2], vec![r as i64, 1, 2, 3]).unwrap(),
            f(1000, 1),
            f(5, 2),
            Tensor::scalar(&device(r), r as f64 * 0.3),
            f(70_000, 3),
        ]
    };
    for plan in PLANS {
        for bytes_per_pack in [0, 16, 4096, 1 << 20] {
            let cfg = GroupConfig {
                bytes_per_pack,
                ..config(plan)
            };
            let out = run(3, cfg, |m| {
                let ts = tensors(m.replica());
                let batched = m.batch_all_reduce(ReduceOp::Sum, &ts).unwrap();
                let single: Vec<Tensor> = ts
                    .iter()
                    .map(|t| m.all_reduce(ReduceOp::Sum, t).unwrap())
                    .collect();
                (batched, single, ts)
            });
            for (batched, single, inputs) in &out {
                assert_eq!(batched.len(), single.len());
                for ((b, s), input) in batched.iter().zip(single).zip(inputs) {
                    assert!(b.bitwise_eq(s), "{plan:?} {bytes_per_pack}: {b} vs {s}");
                    assert_eq!((b.shape(), b.device()), (input.shape(), input.device()));
                }
            }
        }
    }
}

#[test]
fn batched_all_reduce_names_the_original_shapes_on_mismatch() {
    let out = run(2, config(ReducePlan::OneReducer), |m| {
        let second = if m.replica() == 0 { 4 } else { 5 };
        m.batch_all_reduce(
            ReduceOp::Sum,
            &[input(m.replica(), 3), input(m.replica(), second)],
        )
    });
    let err = out[0].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("float32 [3], float32 [4]") && err.contains("float32 [3], float32 [5]"),
        "{err}"
    );
}

#[test]
fn a_replica_has_one_live_member_at_a_time() {
    let group = CollectiveGroup::new(2, GroupConfig::default()).unwrap();
    let first = group.member(1).unwrap();
    let err = group.member(1).unwrap_err();
    assert!(
        err.to_string()
            .contains("replica 1 of this collective group is already in use"),
        "{err}"
    );
    drop(first);
    group.member(1).unwrap();
}
