//! SM-14..SM-25, SM-52, SM-54: running replicas, merge_call, values from functions, shared
//! variables.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use distribute_mirrored::{MirroredConfig, MirroredStrategy};
use distribute_strategy::{Strategy, StrategyError, VariableOptions};
use distribute_values::{DistributedValues, Leaf, Nest, PerReplica};

use super::cpus;

#[test]
fn sm14_every_replica_id_once() {
    for n in [1, 2, 4, 8] {
        let strategy = cpus(n);
        let seen = Mutex::new(Vec::new());
        let ids: Leaf<usize> = strategy
            .run(
                |ctx, ()| {
                    seen.lock().unwrap().push(ctx.replica_id());
                    assert_eq!(ctx.num_replicas_in_sync(), n);
                    Ok(ctx.replica_id())
                },
                &(),
            )
            .unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, (0..n).collect::<Vec<_>>());
        // Replica r's result is at position r.
        let ids: Vec<usize> = ids.local_results().into_iter().copied().collect();
        assert_eq!(ids, (0..n).collect::<Vec<_>>());
    }
}

/// The error of a `run` started from inside a step or a merge function.
fn assert_run_inside_a_step_refused(err: StrategyError) {
    match err {
        StrategyError::Runtime(m) => assert!(m.contains("inside a replica's step"), "{m}"),
        other => panic!("expected Runtime, got {other:?}"),
    }
}

#[test]
fn sm16_a_merge_function_cannot_start_another_run() {
    // TF's cases 3 and 4 (merge_fn calls call_for_each_replica) have no Rust counterpart: a
    // merge function may not start a step, and saying so is the error the caller gets.
    let strategy = cpus(2);
    let err = strategy
        .run(
            |ctx, ()| {
                ctx.merge_call((), |_, _| {
                    strategy.run(|_, ()| Ok(()), &())?;
                    Ok(())
                })
            },
            &(),
        )
        .unwrap_err();
    assert_run_inside_a_step_refused(err);
    // Still usable.
    let out: Leaf<usize> = strategy.run(|ctx, ()| Ok(ctx.replica_id()), &()).unwrap();
    assert_eq!(out.local_results(), [&0, &1]);
}

#[test]
fn sm17_merge_call_protocol() {
    let strategy = cpus(3);
    let merges = AtomicUsize::new(0);
    let received: (Leaf<i32>, Leaf<String>) = strategy
        .run(
            |ctx, ()| {
                let args = (ctx.replica_id() as i32, "same".to_owned());
                ctx.merge_call(args, |cross, (ids, same)| {
                    merges.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(cross.num_replicas_in_sync(), 3);
                    // Regrouped: per replica where the replicas differ, unwrapped where equal.
                    let Leaf::PerReplica(ids) = ids else {
                        panic!("ids differ, so they arrive per replica: {ids:?}")
                    };
                    assert_eq!(ids.values(), [0, 1, 2]);
                    assert_eq!(same, Leaf::Same("same".to_owned()));
                    let tens = ids.clone().map(|i| 10 + i);
                    Ok((Leaf::PerReplica(tens), Leaf::Same("merged".to_owned())))
                })
            },
            &(),
        )
        .unwrap();
    assert_eq!(merges.load(Ordering::SeqCst), 1, "merge_fn runs once");
    // Each replica got select_replica(id, result).
    insta::assert_debug_snapshot!("sm17_each_replica_gets_its_part", received);
}

#[derive(Debug, Clone, PartialEq, Nest)]
struct Squares {
    a: f32,
    b: f32,
}

#[test]
fn sm24_run_semantics() {
    let strategy = cpus(2);
    let x: Leaf<f32> = strategy
        .run(|ctx, ()| Ok(ctx.replica_id() as f32 + 1.0), &())
        .unwrap();
    assert_eq!(x.local_results(), [&1.0, &2.0]);
    let squares: SquaresRegrouped = strategy
        .run(
            |_, x| {
                Ok(Squares {
                    a: 2.0 * x,
                    b: x * x,
                })
            },
            &x,
        )
        .unwrap();
    insta::assert_debug_snapshot!("sm24_two_replicas_struct", squares);
    let out: Leaf<f32> = strategy
        .run(|_, Squares { a, b }| Ok(a + 2.0 * b + 2.0), &squares)
        .unwrap();
    assert_eq!(out.local_results(), [&6.0, &14.0]);

    // The same through a map of named outputs, TF's dict.
    let dict: BTreeMap<String, Leaf<f32>> = strategy
        .run(
            |_, x| Ok(BTreeMap::from([("a".into(), 2.0 * x), ("b".into(), x * x)])),
            &x,
        )
        .unwrap();
    assert_eq!(dict["a"].local_results(), [&2.0, &4.0]);
    assert_eq!(dict["b"].local_results(), [&1.0, &4.0]);

    let one = cpus(1);
    let squares: SquaresRegrouped = one
        .run(
            |_, x| {
                Ok(Squares {
                    a: 2.0 * x,
                    b: x * x,
                })
            },
            &Leaf::Same(4.0),
        )
        .unwrap();
    assert_eq!(
        (&squares.a, &squares.b),
        (&Leaf::Same(8.0), &Leaf::Same(16.0))
    );
    let out: Leaf<f32> = one
        .run(|_, Squares { a, b }| Ok(a + 2.0 * b + 2.0), &squares)
        .unwrap();
    assert_eq!(out, Leaf::Same(42.0));
}

#[test]
fn sm25_per_replica_inputs_times_a_variable() {
    let strategy = cpus(2);
    let v = strategy
        .create_variable("v", 1.25f32, VariableOptions::default())
        .unwrap();
    let map = Arc::clone(strategy.extended().device_map());
    let factors = Leaf::PerReplica(PerReplica::new(map, vec![5.0f32, 3.0]).unwrap());
    let out: Leaf<f32> = strategy
        .run(|ctx, x| Ok(x * ctx.read_variable(&v)?), &factors)
        .unwrap();
    assert_eq!(out.local_results(), [&6.25, &3.75]);
}

#[test]
fn sm52_distribute_values_from_function() {
    let strategy = cpus(2);
    let n = strategy.num_replicas_in_sync();
    let ones = strategy.distribute_values_from_function(|_, _| 1).unwrap();
    // Always per replica, even when every replica has the same value.
    assert_eq!(ones.values(), vec![1; n]);
    let tuples = strategy
        .distribute_values_from_function(|_, _| (1, 2, 3))
        .unwrap();
    assert_eq!(tuples.values(), [(1, 2, 3), (1, 2, 3)]);
    let scaled = strategy
        .distribute_values_from_function(|id, _| (id, 2 * id, 3 * id))
        .unwrap();
    assert_eq!(scaled.values(), [(0, 0, 0), (1, 2, 3)]);
    let arr = [0, 1, 2, 3];
    let picked = strategy
        .distribute_values_from_function(|id, count| {
            assert_eq!(count, n);
            arr[id]
        })
        .unwrap();
    assert_eq!(picked.values(), [0, 1]);
    // On the strategy's devices.
    assert_eq!(
        picked.devices().collect::<Vec<_>>(),
        [
            "/job:localhost/replica:0/task:0/device:CPU:0",
            "/job:localhost/replica:0/task:0/device:CPU:1"
        ]
    );
}

#[test]
fn sm54_replicas_share_variables_in_creation_order() {
    let strategy = cpus(3);
    let created = Mutex::new(Vec::new());
    strategy
        .run(
            |ctx, ()| {
                // Each replica names its variables its own way; the canonical names match.
                let suffix = if ctx.replica_id() == 0 {
                    String::new()
                } else {
                    format!("_{}", ctx.replica_id())
                };
                let first = ctx.create_variable(
                    Some(&format!("foo{suffix}")),
                    ctx.replica_id() as f32,
                    VariableOptions::default(),
                )?;
                let second = ctx.create_variable(
                    Some(&format!("foo{suffix}")),
                    10.0 + ctx.replica_id() as f32,
                    VariableOptions::default(),
                )?;
                created
                    .lock()
                    .unwrap()
                    .push((ctx.replica_id(), first, second));
                Ok(())
            },
            &(),
        )
        .unwrap();
    let mut created = created.into_inner().unwrap();
    created.sort_by_key(|(r, ..)| *r);
    let (_, first, second) = &created[0];
    for (r, f, s) in &created[1..] {
        assert!(f == first, "replica {r} got another first variable");
        assert!(s == second, "replica {r} got another second variable");
    }
    assert!(first != second);
    // Replica 0 made them: its names and initial values.
    assert_eq!((first.name(), second.name()), ("foo", "foo"));
    assert_eq!(first.component(2).unwrap().read(), 0.0);
    assert_eq!(second.component(2).unwrap().read(), 10.0);

    // A replica asking for more variables than replica 0 made is refused.
    let err = strategy
        .run(
            |ctx, ()| {
                ctx.create_variable(Some("a"), 0.0f32, VariableOptions::default())?;
                if ctx.replica_id() == 1 {
                    ctx.create_variable(Some("b"), 0.0f32, VariableOptions::default())?;
                }
                Ok(())
            },
            &(),
        )
        .unwrap_err();
    match err {
        StrategyError::Runtime(m) => assert!(m.contains("different number"), "{m}"),
        other => panic!("expected Runtime, got {other:?}"),
    }
}

fn thread_id() -> String {
    format!("{:?}", std::thread::current().id())
}

/// The thread each replica ran on, over three runs of `strategy`, seen from the calling thread.
fn replica_threads(strategy: &MirroredStrategy) -> Vec<Vec<String>> {
    (0..3)
        .map(|_| {
            let threads: Leaf<String> = strategy.run(|_, ()| Ok(thread_id()), &()).unwrap();
            threads.local_results().into_iter().cloned().collect()
        })
        .collect()
}

#[test]
fn the_calling_thread_runs_replica_0_and_every_other_replica_keeps_its_thread() {
    let caller = thread_id();
    for n in [1, 2, 3] {
        let runs = replica_threads(&cpus(n));
        for threads in &runs {
            assert_eq!(
                threads[0], caller,
                "{n} replicas: replica 0 runs on the caller"
            );
            assert!(
                threads[1..].iter().all(|t| *t != caller),
                "{n} replicas: only replica 0 runs on the caller: {threads:?}"
            );
            assert_eq!(threads, &runs[0], "{n} replicas: persistent threads");
        }
        let distinct: std::collections::HashSet<_> = runs[0].iter().collect();
        assert_eq!(distinct.len(), n, "one thread per replica: {:?}", runs[0]);
    }
}

#[test]
fn replica_0_keeps_a_thread_of_its_own_when_asked_or_on_a_gpu() {
    let caller = thread_id();
    let own_thread = MirroredStrategy::with_config(
        &["/cpu:0", "/cpu:1"],
        MirroredConfig {
            caller_runs_replica_0: false,
            ..MirroredConfig::default()
        },
    )
    .unwrap();
    // A GPU replica's thread owns the GPU's context, so it never moves to the caller.
    for strategy in [own_thread, super::gpu_and_cpu()] {
        let runs = replica_threads(&strategy);
        for threads in &runs {
            assert!(threads.iter().all(|t| *t != caller), "{threads:?}");
            assert_eq!(threads, &runs[0], "persistent threads");
        }
    }
}

#[test]
fn a_step_on_the_calling_thread_cannot_start_another_run_and_the_caller_can_run_again() {
    for n in [1, 2] {
        let strategy = cpus(n);
        let err = strategy
            .run(
                |ctx, ()| {
                    if ctx.replica_id() == 0 {
                        strategy.run(|_, ()| Ok(()), &())?;
                    }
                    Ok(())
                },
                &(),
            )
            .unwrap_err();
        assert_run_inside_a_step_refused(err);
        // The calling thread is a caller again once the step is over.
        let ids: Leaf<usize> = strategy.run(|ctx, ()| Ok(ctx.replica_id()), &()).unwrap();
        assert_eq!(ids.local_results().len(), n);
    }
}

#[test]
fn a_panic_of_replica_0_on_the_calling_thread_is_an_error_and_the_caller_can_run_again() {
    for n in [1, 2] {
        let strategy = cpus(n);
        let err = strategy
            .run(
                |ctx, ()| -> Result<(), StrategyError> {
                    if ctx.replica_id() == 0 {
                        panic!("replica 0 breaks");
                    }
                    Ok(())
                },
                &(),
            )
            .unwrap_err();
        match err {
            StrategyError::ReplicaPanicked { replica, message } => {
                assert_eq!(replica, 0);
                assert!(message.contains("replica 0 breaks"), "{message}");
            }
            other => panic!("expected ReplicaPanicked, got {other:?}"),
        }
        let ids: Leaf<usize> = strategy.run(|ctx, ()| Ok(ctx.replica_id()), &()).unwrap();
        assert_eq!(ids.local_results().len(), n);
    }
}
