//! Every way a step can go wrong ends in an error on the caller, promptly, and leaves the strategy
//! usable (SM-15, SM-16 and the architecture's "every rendezvous is checked").
//!
//! The deadline is long (60 s) wherever the failure must be detected by other means, so a test
//! that got a deadline error instead would fail on the error kind rather than pass slowly.

use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use distribute_collectives::{
    CollectiveError, CrossDeviceOps, Destinations, GroupConfig, ReplicaCollectives,
    SharedMemoryAllReduce, StepLifecycle,
};
use distribute_device_spec::LocalDevices;
use distribute_mirrored::{CrossDeviceOpsChoice, MirroredConfig, MirroredStrategy};
use distribute_strategy::{Strategy, StrategyError, VariableOptions};
use distribute_tensor::{AnyTensor, Tensor};
use distribute_values::{Leaf, ReduceOp, UpdateOp};

fn strategy(n: usize, deadline: Duration) -> MirroredStrategy {
    MirroredStrategy::with_config(
        LocalDevices::cpus(n),
        MirroredConfig {
            deadline,
            ..MirroredConfig::default()
        },
    )
    .unwrap()
}

fn one(ctx: &distribute_strategy::ReplicaContext<'_>) -> Tensor {
    Tensor::scalar(ctx.device(), 1.0f32)
}

/// The strategy still runs a normal step and all-reduces correctly.
fn still_works(strategy: &MirroredStrategy) {
    let n = strategy.num_replicas_in_sync() as f32;
    let out: Leaf<Tensor> = strategy
        .run(|ctx, ()| ctx.all_reduce(ReduceOp::Sum, &one(ctx)), &())
        .unwrap();
    for t in out.local_results() {
        assert_eq!(t.to_vec::<f32>().unwrap(), [n]);
    }
}

#[test]
fn sm15_different_numbers_of_merge_calls_fail_fast() {
    let strategy = strategy(3, Duration::from_secs(60));
    let err = strategy
        .run(
            |ctx, ()| {
                if ctx.replica_id() != 2 {
                    ctx.merge_call(1, |_, _| Ok(()))?;
                }
                Ok(())
            },
            &(),
        )
        .unwrap_err();
    match &err {
        StrategyError::Runtime(message) => {
            assert!(
                message.contains("different number of merge_call calls"),
                "{message}"
            );
            assert!(
                message.contains("replica 2 finished after 0 merge_call(s)"),
                "{message}"
            );
        }
        other => panic!("expected Runtime, got {other:?}"),
    }
    still_works(&strategy);
}

#[test]
fn sm16_a_step_error_reaches_the_caller_with_its_original_type() {
    let strategy = strategy(2, Duration::from_secs(60));
    let err = strategy
        .run(
            |ctx, ()| {
                if ctx.replica_id() == 1 {
                    return Err(StrategyError::step(std::io::Error::other("disk on fire")));
                }
                // Replica 0 waits in a collective that replica 1 never joins.
                ctx.all_reduce(ReduceOp::Sum, &one(ctx))
            },
            &(),
        )
        .unwrap_err();
    let StrategyError::Step(source) = &err else {
        panic!("expected the step's error, got {err:?}")
    };
    let io = source
        .downcast_ref::<std::io::Error>()
        .expect("an io::Error");
    assert_eq!(io.to_string(), "disk on fire");
    still_works(&strategy);
}

#[test]
fn sm16_a_merge_function_error_reaches_the_caller() {
    let strategy = strategy(2, Duration::from_secs(60));
    let err = strategy
        .run(
            |ctx, ()| {
                // The merge function never succeeds, so nothing names its result type.
                ctx.merge_call(ctx.replica_id() as i32, |_, _| -> Result<(), _> {
                    Err(StrategyError::InvalidArgument("merge refused".into()))
                })
            },
            &(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StrategyError::InvalidArgument(m) if m == "merge refused"),
        "{err:?}"
    );
    still_works(&strategy);
}

#[test]
fn sm16_a_panicking_replica_releases_the_others() {
    let strategy = strategy(3, Duration::from_secs(60));
    let err = strategy
        .run(
            |ctx, ()| {
                if ctx.replica_id() == 1 {
                    panic!("replica 1 divides by zero");
                }
                let t = ctx.all_reduce(ReduceOp::Sum, &one(ctx))?;
                ctx.merge_call((), |_, _| Ok(()))?;
                Ok(t)
            },
            &(),
        )
        .unwrap_err();
    match err {
        StrategyError::ReplicaPanicked { replica, message } => {
            assert_eq!(
                (replica, message.as_str()),
                (1, "replica 1 divides by zero")
            );
        }
        other => panic!("expected ReplicaPanicked, got {other:?}"),
    }
    still_works(&strategy);
}

#[test]
fn a_panic_inside_a_merge_function_releases_the_others() {
    let strategy = strategy(2, Duration::from_secs(60));
    let err = strategy
        .run(
            |ctx, ()| ctx.merge_call((), |_, _| -> Result<(), _> { panic!("merge function bug") }),
            &(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StrategyError::ReplicaPanicked { replica: 0, message } if message == "merge function bug"),
        "{err:?}"
    );
    still_works(&strategy);
}

#[test]
fn a_replica_that_skips_a_collective_fails_the_others_at_once() {
    let strategy = strategy(2, Duration::from_secs(60));
    let err = strategy
        .run(
            |ctx, ()| {
                if ctx.replica_id() == 0 {
                    ctx.all_reduce(ReduceOp::Sum, &one(ctx))?;
                }
                Ok(())
            },
            &(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, StrategyError::Collective(CollectiveError::ReplicaFinished { finished, .. }) if finished == &[1]),
        "{err:?}"
    );
    still_works(&strategy);
}

#[test]
fn a_slow_replica_is_named_when_the_deadline_passes() {
    // Replica 1 only reaches the collective after replica 0 has given up on it, whatever the
    // machine's speed: the deadline, not the scheduler, decides the outcome.
    let strategy = strategy(2, Duration::from_millis(200));
    let replica_0_gave_up = AtomicBool::new(false);
    let err = strategy
        .run(
            |ctx, ()| {
                if ctx.replica_id() == 1 {
                    while !replica_0_gave_up.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    return ctx.all_reduce(ReduceOp::Sum, &one(ctx));
                }
                let result = ctx.all_reduce(ReduceOp::Sum, &one(ctx));
                replica_0_gave_up.store(true, Ordering::SeqCst);
                result
            },
            &(),
        )
        .unwrap_err();
    match &err {
        StrategyError::Collective(CollectiveError::DeadlineExceeded { missing, .. }) => {
            assert_eq!(missing, &[1]);
        }
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    still_works(&strategy);
}

#[test]
fn a_swallowed_collective_error_does_not_poison_the_next_step() {
    let strategy = strategy(2, Duration::from_secs(60));
    // Replica 1 skips the collective; replica 0 ignores the error it gets. The step succeeds,
    // and the aborted group must be usable again in the next one.
    strategy
        .run(
            |ctx, ()| {
                if ctx.replica_id() == 0 {
                    let _ignored = ctx.all_reduce(ReduceOp::Sum, &one(ctx));
                }
                Ok(())
            },
            &(),
        )
        .unwrap();
    still_works(&strategy);
}

/// A backend that fails in the ways a user's `CrossDeviceOps` might.
#[derive(Debug)]
struct Faulty {
    inner: SharedMemoryAllReduce,
    panic_making_replica: Option<usize>,
    panic_when_replica_finishes: AtomicBool,
}

impl CrossDeviceOps for Faulty {
    fn name(&self) -> &'static str {
        "Faulty"
    }
    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        self.inner.reduce(op, values, destinations)
    }
    fn replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError> {
        if self.panic_making_replica == Some(replica) {
            panic!("no collectives for replica {replica}");
        }
        self.inner.replica_collectives(replica)
    }
}

impl StepLifecycle for Faulty {
    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
    fn reset(&self) {
        self.inner.reset()
    }
    fn replica_finished(&self, replica: usize) {
        if self
            .panic_when_replica_finishes
            .swap(false, Ordering::SeqCst)
        {
            panic!("hook bug");
        }
        self.inner.replica_finished(replica)
    }
}

fn faulty(panic_making_replica: Option<usize>, panic_when_replica_finishes: bool) -> Arc<Faulty> {
    Arc::new(Faulty {
        inner: SharedMemoryAllReduce::new(2, GroupConfig::default()).unwrap(),
        panic_making_replica,
        panic_when_replica_finishes: AtomicBool::new(panic_when_replica_finishes),
    })
}

fn with_ops(ops: Arc<dyn CrossDeviceOps>) -> Result<MirroredStrategy, StrategyError> {
    MirroredStrategy::with_config(
        &["/cpu:0", "/cpu:1"],
        MirroredConfig {
            cross_device_ops: CrossDeviceOpsChoice::Given(ops),
            ..MirroredConfig::default()
        },
    )
}

#[test]
fn a_backend_that_panics_while_starting_is_an_error_not_a_hang() {
    let err = with_ops(faulty(Some(1), false)).unwrap_err();
    assert!(
        err.to_string()
            .contains("replica 1's collectives handle panicked"),
        "{err}"
    );
}

#[test]
fn a_backend_hook_that_panics_after_the_step_fails_the_step_not_the_thread() {
    let strategy = with_ops(faulty(None, true)).unwrap();
    let err = strategy.run(|_, ()| Ok(()), &()).unwrap_err();
    assert!(
        matches!(err, StrategyError::ReplicaPanicked { .. }),
        "{err:?}"
    );
    still_works(&strategy);
}

#[test]
fn two_strategies_cannot_share_one_backend() {
    // Their replicas would meet each other's collectives and mix their sums.
    let shared: Arc<dyn CrossDeviceOps> =
        Arc::new(SharedMemoryAllReduce::new(2, GroupConfig::default()).unwrap());
    let first = with_ops(Arc::clone(&shared)).unwrap();
    let err = with_ops(Arc::clone(&shared)).unwrap_err();
    assert!(err.to_string().contains("already in use"), "{err}");
    still_works(&first);
    drop(first);
    // Once the first strategy is gone, the backend can serve another.
    still_works(&with_ops(shared).unwrap());
}

#[test]
fn backends_built_for_another_replica_count_are_refused() {
    let three = Arc::new(SharedMemoryAllReduce::new(3, GroupConfig::default()).unwrap());
    let err = with_ops(three).unwrap_err();
    assert!(
        err.to_string()
            .contains("built for 3 replicas but the strategy has 2 devices"),
        "{err}"
    );
}

#[test]
fn run_inside_a_step_is_refused() {
    let strategy = strategy(2, Duration::from_secs(60));
    let err = strategy.run(
        |_, ()| {
            let inner = strategy.run(|_, ()| Ok(()), &());
            match inner {
                Err(StrategyError::Runtime(m)) if m.contains("inside a replica's step") => Ok(()),
                other => Err(StrategyError::Runtime(format!("nested run gave {other:?}"))),
            }
        },
        &(),
    );
    err.unwrap();
}

/// A `merge_call` made from inside a merge function once completed the barrier the other
/// replicas waited at, and they panicked on an internal `expect`.
/// A step that captured the strategy reaches cross-replica operations the types cannot refuse
/// (`strategy.cross_replica()`); every replica, the caller's thread (replica 0) and the pool's,
/// gets a typed error and the variable is left as it was. In a merge function, and outside `run`,
/// the same call works.
#[test]
fn cross_replica_operations_inside_a_step_are_refused_but_work_in_merge_call() {
    let strategy = strategy(2, Duration::from_secs(60));
    let w = strategy
        .create_variable("w", 1.0f32, VariableOptions::default())
        .unwrap();
    let refused = |operation: &str, step: &(dyn Fn() -> Result<(), StrategyError> + Sync)| {
        let err = strategy.run(|_ctx, ()| step(), &()).unwrap_err();
        assert!(
            matches!(&err, StrategyError::CrossReplicaInReplica { operation: o } if *o == operation),
            "{operation}: {err:?}"
        );
        assert!(err.to_string().contains("merge_call"), "{err}");
    };
    let cross = strategy.cross_replica();
    refused("update", &|| {
        cross.update(&w, UpdateOp::AssignAdd, &Leaf::Same(1.0))
    });
    refused("update_with", &|| cross.update_with(&w, |_, v| Ok(v + 1.0)));
    refused("read_var", &|| cross.read_var(&w).map(drop));
    let t = Leaf::Same(Tensor::scalar("/cpu:0", 1.0f32));
    refused("reduce", &|| {
        strategy.reduce(ReduceOp::Sum, &t, None).map(drop)
    });
    refused("gather", &|| strategy.gather(&t, 0).map(drop));
    assert_eq!(
        cross.read_var(&w).unwrap(),
        1.0,
        "no refused update was applied"
    );

    strategy
        .run(
            |ctx, ()| {
                ctx.merge_call((), |_, ()| {
                    strategy
                        .cross_replica()
                        .update(&w, UpdateOp::AssignAdd, &Leaf::Same(1.0))
                })?;
                // Back in the replica after the merge function: refused again.
                match strategy.cross_replica().read_var(&w) {
                    Err(StrategyError::CrossReplicaInReplica { .. }) => Ok(()),
                    other => panic!("read_var after merge_call: {other:?}"),
                }
            },
            &(),
        )
        .unwrap();
    assert_eq!(
        cross.read_var(&w).unwrap(),
        2.0,
        "the merge function's update applied once"
    );
    still_works(&strategy);
}

#[test]
fn merge_call_inside_a_merge_function_is_refused() {
    let strategy = strategy(3, Duration::from_secs(60));
    let out: Leaf<String> = strategy
        .run(
            |ctx, ()| {
                ctx.merge_call((), |_, _| {
                    let nested = ctx.merge_call((), |_, _| Ok(()));
                    Ok(Leaf::Same(match nested {
                        Err(StrategyError::Runtime(m)) => m,
                        other => format!("nested merge_call gave {other:?}"),
                    }))
                })
            },
            &(),
        )
        .unwrap();
    let Leaf::Same(message) = out else {
        panic!("every replica gets the same message: {out:?}")
    };
    assert!(
        message.contains("merge_call was called from inside a merge function"),
        "{message}"
    );
    still_works(&strategy);
}

#[test]
fn deadlines_below_the_minimum_are_refused_at_construction() {
    for deadline in [
        Duration::ZERO,
        Duration::from_nanos(1),
        MirroredConfig::MIN_DEADLINE - Duration::from_nanos(1),
    ] {
        let config = MirroredConfig {
            deadline,
            ..MirroredConfig::default()
        };
        let err = MirroredStrategy::with_config(&["/cpu:0", "/cpu:1"], config).unwrap_err();
        assert!(
            matches!(&err, StrategyError::InvalidArgument(m) if m.contains("below the minimum")),
            "{deadline:?}: {err:?}"
        );
    }
    // The minimum itself is accepted (not run: 100 ms is tight on a loaded machine).
    let at_minimum = strategy(2, MirroredConfig::MIN_DEADLINE);
    assert_eq!(at_minimum.num_replicas_in_sync(), 2);
}

#[test]
fn hundreds_of_steps_with_merges_and_collectives_back_to_back() {
    let strategy = strategy(4, Duration::from_secs(60));
    for step in 0..300 {
        let out: Leaf<f32> = strategy
            .run(
                |ctx, ()| {
                    let sum = ctx.all_reduce(ReduceOp::Sum, &one(ctx))?;
                    let mine = sum.to_vec::<f32>()?[0] + ctx.replica_id() as f32;
                    let total: f32 = ctx.merge_call(mine, |_, v| {
                        Ok(Leaf::Same(v.local_results().into_iter().sum()))
                    })?;
                    Ok(total + step as f32)
                },
                &(),
            )
            .unwrap();
        // 4 from the all-reduce on every replica, plus the replica id: 4 + 5 + 6 + 7.
        assert_eq!(out, Leaf::Same(22.0 + step as f32));
    }
}
