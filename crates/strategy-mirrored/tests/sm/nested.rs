//! One user struct of tensors through a whole step: regrouped as the step's input (each replica
//! gets its own), all-reduced in one fused call, and regrouped again as the step's output. The
//! step's types are inferred from the inputs (no turbofish on `run`).

use distribute_strategy::{Strategy, StrategyError};
use distribute_tensor::Tensor;
use distribute_values::{
    DistributedValues, ErrorKind, Leaf, Nest, ReduceOp, RegroupedOption, ValuesError, regroup,
    select_replica,
};

use crate::cpus;

/// Gradients of a small model: a tensor, a list of tensors and an optional one.
#[derive(Debug, Clone, PartialEq, Nest)]
struct Grads {
    weights: Tensor,
    layers: Vec<Tensor>,
    bias: Option<Tensor>,
}

fn grads(device: &str, x: f32, bias: bool) -> Grads {
    Grads {
        weights: Tensor::from_vec(device, &[2], vec![x, 2.0 * x]).unwrap(),
        layers: vec![
            Tensor::scalar(device, 10.0 * x),
            Tensor::scalar(device, 100.0 * x),
        ],
        bias: bias.then(|| Tensor::scalar(device, -x)),
    }
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

#[test]
fn a_derived_struct_is_a_step_input_a_fused_all_reduce_payload_and_a_step_output() {
    let strategy = cpus(2);
    let devices: Vec<String> = strategy
        .extended()
        .device_map()
        .primary_devices()
        .map(str::to_owned)
        .collect();
    let per_replica = strategy
        .distribute_values_from_function(|r, _| grads(&devices[r], r as f32 + 1.0, true))
        .unwrap();
    let (replicas, map) = per_replica.into_parts();
    let inputs: GradsRegrouped = regroup(&map, replicas).unwrap();

    let summed = strategy
        .run(
            |ctx, mine| {
                // Each replica got its own struct, on its own device.
                let expected = ctx.replica_id() as f32 + 1.0;
                assert_eq!(values(&mine.weights), [expected, 2.0 * expected]);
                assert_eq!(mine.layers[1].device(), ctx.device());
                ctx.all_reduce(ReduceOp::Sum, &mine)
            },
            &inputs,
        )
        .unwrap();

    let Leaf::PerReplica(weights) = &summed.weights else {
        panic!("each replica returned its own tensor: {:?}", summed.weights)
    };
    for (replica, w) in weights.values().iter().enumerate() {
        assert_eq!(values(w), [3.0, 6.0]);
        assert_eq!(w.device(), devices[replica]);
    }
    for layer in summed.layers[1].local_results() {
        assert_eq!(values(layer), [300.0]);
    }
    let bias = summed
        .bias
        .as_some()
        .expect("every replica returned a bias");
    assert!(bias.local_results().iter().all(|b| values(b) == [-3.0]));
}

#[test]
fn optional_tensors_that_are_absent_everywhere_are_skipped() {
    let strategy = cpus(2);
    let out = strategy
        .run(
            |ctx, ()| {
                let mine = grads(ctx.device(), 1.0, false);
                ctx.all_reduce(ReduceOp::Mean, &mine)
            },
            &(),
        )
        .unwrap();
    assert!(out.bias.is_none());
    assert_eq!(out.layers.len(), 2);
}

/// TF returns a PerReplica holding `None` beside the values when some replicas return `None`
/// (a replica whose batch was empty); each replica gets its own `Option` back as input.
#[test]
fn a_step_returning_none_on_some_replicas_gives_each_replica_its_own_option() {
    let strategy = cpus(3);
    let out = strategy
        .run(
            |ctx, ()| {
                let r = ctx.replica_id();
                Ok(grads(ctx.device(), r as f32, r != 1))
            },
            &(),
        )
        .unwrap();
    let RegroupedOption::PerReplica(bias) = &out.bias else {
        panic!("replica 1 returned None: {:?}", out.bias)
    };
    let present: Vec<Option<Vec<f32>>> = bias
        .values()
        .iter()
        .map(|b| b.as_ref().map(values))
        .collect();
    assert_eq!(present, [Some(vec![-0.0]), None, Some(vec![-2.0])]);
    assert_eq!(select_replica::<Grads>(1, &out).unwrap().bias, None);

    // The regrouped output feeds the next step: each replica gets its own `Option`.
    let seen = strategy
        .run(|_, mine| Ok(mine.is_some()), &out.bias)
        .unwrap();
    assert_eq!(seen.local_results(), [&true, &false, &true]);
}

#[test]
fn a_payload_leaf_that_is_not_a_tensor_is_named() {
    let strategy = cpus(2);
    let err = strategy
        .run(
            |ctx, ()| -> Result<(), StrategyError> {
                let mine = (Tensor::scalar(ctx.device(), 1.0f32), vec![2.0f32]);
                ctx.all_reduce(ReduceOp::Sum, &mine)?;
                Ok(())
            },
            &(),
        )
        .unwrap_err();
    let StrategyError::Values(inner) = &err else {
        panic!("expected a values error, got {err}")
    };
    assert_eq!(inner.kind(), ErrorKind::TypeError);
    assert!(
        matches!(inner, ValuesError::UnexpectedLeaf { path, found: "f32", .. } if path == ".1[0]"),
        "{inner}"
    );
}
