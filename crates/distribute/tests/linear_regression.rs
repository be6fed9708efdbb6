//! The reference linear-regression example trains to the same weights on 1, 2, 4 and 8
//! replicas, the same replica count gives the same bits twice (the collectives are
//! deterministic), and the full run learns the weights and bias the data was generated with.
//! The data's specification is checked in `distribute-test-support`.

// The example itself, so the test checks the code users run; its `main` is unused here.
#[path = "../examples/linear_regression.rs"]
#[allow(dead_code)]
mod example;

use distribute_test_support::linear_regression::{STEPS, TRUE_BIAS, true_weights};

const SHORT_RUN: usize = 20;

#[test]
fn one_and_many_replicas_learn_the_same_weights() {
    let one = example::train(1, SHORT_RUN, example::DEFAULT_DEADLINE).unwrap();
    assert!(one.loss.is_finite());
    for replicas in [2, 4, 8] {
        let many = example::train(replicas, SHORT_RUN, example::DEFAULT_DEADLINE).unwrap();
        let max_diff = one
            .weights
            .iter()
            .zip(&many.weights)
            .map(|(a, b)| (a - b).abs())
            .fold((one.bias - many.bias).abs(), f32::max);
        assert!(max_diff <= 1e-5, "{replicas} replicas differ by {max_diff}");
        let again = example::train(replicas, SHORT_RUN, example::DEFAULT_DEADLINE).unwrap();
        assert!(
            many.weights
                .iter()
                .zip(&again.weights)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{replicas} replicas are not deterministic"
        );
    }
}

#[test]
fn the_full_run_learns_the_generating_weights() {
    let trained = example::train(2, STEPS, example::DEFAULT_DEADLINE).unwrap();
    let worst = trained
        .weights
        .iter()
        .zip(true_weights())
        .map(|(a, b)| (a - b).abs())
        .fold((trained.bias - TRUE_BIAS).abs(), f32::max);
    // The noise is below 1/128 and averages out over 51,200 rows: the fit lands about 2e-4 from
    // the truth.
    assert!(
        worst < 2e-3,
        "weights {worst} away from the generating ones"
    );
    assert!(trained.loss < 1e-3, "final loss {}", trained.loss);
}
