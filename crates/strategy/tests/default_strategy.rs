//! The default strategy's behaviours (SM-18, SM-53 and the strategy properties): one replica on
//! the host, TF's identity semantics.

use distribute_strategy::{
    DefaultStrategy, Strategy, StrategyError, VariableOptions, canonicalize_variable_name,
};
use distribute_tensor::Tensor;
use distribute_values::{DistributedValues, Leaf, ReduceOp, UpdateOp};

#[test]
fn sm18_merge_call_in_the_default_replica_context() {
    let strategy = DefaultStrategy::new().unwrap();
    let merges = std::sync::atomic::AtomicUsize::new(0);
    let out: Leaf<String> = strategy
        .run(
            |ctx, ()| -> Result<String, StrategyError> {
                assert_eq!((ctx.replica_id(), ctx.num_replicas_in_sync()), (0, 1));
                ctx.merge_call("bar".to_owned(), |cross, s: Leaf<String>| {
                    merges.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    // The cross-replica context is the default strategy's: one replica.
                    assert_eq!(cross.num_replicas_in_sync(), 1);
                    let Leaf::Same(s) = s else {
                        panic!("one replica's argument is a plain value")
                    };
                    Ok(Leaf::Same(format!("foo_{s}")))
                })
            },
            &(),
        )
        .unwrap();
    assert_eq!(out, Leaf::Same("foo_bar".to_owned()));
    assert_eq!(merges.into_inner(), 1);
    // Afterwards the strategy is as before: another step runs.
    let again: Leaf<usize> = strategy.run(|ctx, ()| Ok(ctx.replica_id()), &()).unwrap();
    assert_eq!(again, Leaf::Same(0));
}

#[test]
fn sm53_canonical_shared_variable_names() {
    let cases = [
        (None, "Variable"),
        (Some("foo_1/bar_1/baz"), "foo/bar/baz"),
        (Some("foo_1"), "foo"),
        (Some("foo_1:0"), "foo_1:0"),
        (Some("foo1"), "foo1"),
        (Some("foo_a"), "foo_a"),
        (Some("foo_12"), "foo_12"),
    ];
    for (name, expected) in cases {
        assert_eq!(canonicalize_variable_name(name), expected, "{name:?}");
    }
}

#[test]
fn default_strategy_identity_semantics() {
    let strategy = DefaultStrategy::new().unwrap();
    let out: Leaf<Tensor> = strategy
        .run(
            |ctx, ()| {
                let t = Tensor::from_vec(ctx.device(), &[2], vec![1.0f32, 2.0])?;
                // One replica: an all-reduce is the value itself.
                ctx.all_reduce(ReduceOp::Sum, &t)
            },
            &(),
        )
        .unwrap();
    let Leaf::Same(t) = &out else {
        panic!("one replica")
    };
    assert_eq!(t.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    let sum = strategy.reduce(ReduceOp::Sum, &out, None).unwrap();
    assert_eq!(sum.to_vec::<f32>().unwrap(), [1.0, 2.0]);
    let axis = strategy.reduce(ReduceOp::Mean, &out, Some(0)).unwrap();
    assert_eq!(axis.to_vec::<f32>().unwrap(), [1.5]);
}

/// An integer mean along an axis is summed in float64: these rows once wrapped in i32 and gave
/// -147483648.
#[test]
fn integer_means_along_an_axis_do_not_wrap() {
    let strategy = DefaultStrategy::new().unwrap();
    let rows = Tensor::from_vec("/cpu:0", &[2], vec![2_000_000_000i32, 2_000_000_000]).unwrap();
    let mean = strategy
        .reduce(ReduceOp::Mean, &Leaf::Same(rows), Some(0))
        .unwrap();
    assert_eq!(mean.to_vec::<f64>().unwrap(), [2e9]);
}

#[test]
fn default_strategy_properties_are_tfs() {
    let strategy = DefaultStrategy::new().unwrap();
    let extended = strategy.extended();
    assert!(extended.should_init());
    assert!(extended.should_checkpoint());
    assert!(extended.should_save_summary());
    assert!(!extended.between_graph());
}

#[test]
fn default_strategy_map_update_and_steps() {
    let strategy = DefaultStrategy::new().unwrap();
    let squares = strategy.map(0..4, |_, x: i32| Ok(x * x)).unwrap();
    assert_eq!(squares.values(), [vec![0, 1, 4, 9]]);

    let w = strategy
        .create_variable("w", 2.0f32, VariableOptions::default())
        .unwrap();
    let cross = strategy.cross_replica();
    cross
        .update_with(&w, |update, w| {
            assert_eq!(update.replica(), 0);
            Ok(w * 3.0)
        })
        .unwrap();
    cross
        .update(&w, UpdateOp::AssignSub, &Leaf::Same(1.0))
        .unwrap();
    assert_eq!(cross.read_var(&w).unwrap(), 5.0);

    let ctx = strategy
        .run_steps_on_iterator(
            |ctx, x: f32| {
                let t = Leaf::Same(Tensor::scalar(
                    "/job:localhost/replica:0/task:0/device:CPU:0",
                    x,
                ));
                ctx.set_last_step_output("x", t, Some(ReduceOp::Mean));
                Ok(())
            },
            [1.0, 2.0, 3.0],
            10,
        )
        .unwrap();
    assert_eq!(ctx.steps_run(), 3);
    let Leaf::Same(x) = ctx.last_step_output("x").unwrap().value() else {
        panic!("reduced")
    };
    assert_eq!(x.to_vec::<f32>().unwrap(), [3.0]);
}

/// TF's `strategy.gather` on the default strategy: the one replica's value, on the host.
#[test]
fn gather_of_the_one_replica_is_its_value_on_the_host() {
    let strategy = DefaultStrategy::new().unwrap();
    let rows = strategy
        .run(
            |ctx, ()| Ok(Tensor::from_vec(ctx.device(), &[3, 1], vec![1i64, 2, 3])?),
            &(),
        )
        .unwrap();
    let gathered = strategy.gather(&rows, 0).unwrap();
    assert_eq!(gathered.shape(), [3, 1]);
    assert_eq!(gathered.to_vec::<i64>().unwrap(), [1, 2, 3]);
    assert_eq!(
        gathered.device(),
        "/job:localhost/replica:0/task:0/device:CPU:0"
    );
    assert_eq!(strategy.gather(&rows, 1).unwrap().shape(), [3, 1]);
    assert!(matches!(
        strategy.gather(&rows, 2),
        Err(StrategyError::InvalidArgument(_))
    ));
}

/// An integer MEAN inside the one replica is TF's float64 mean of one value.
#[test]
fn integer_all_reduce_mean_of_one_replica_is_float64() {
    let strategy = DefaultStrategy::new().unwrap();
    let mean = strategy
        .run(
            |ctx, ()| {
                let t = Tensor::from_vec(ctx.device(), &[2], vec![3i32, 4])?;
                ctx.all_reduce(ReduceOp::Mean, &t)
            },
            &(),
        )
        .unwrap();
    let Leaf::Same(mean) = mean else {
        panic!("one replica")
    };
    assert_eq!(mean.to_vec::<f64>().unwrap(), [3.0, 4.0]);
}
