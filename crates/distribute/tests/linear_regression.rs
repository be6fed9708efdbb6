//! The reference linear-regression example trains to the same weights on 1, 2, 4 and 8 replicas,
//! and the same replica count gives the same bits twice (the collectives are deterministic).

// The example itself, so the test checks the code users run; its `main` is unused here.
#[path = "../examples/linear_regression.rs"]
#[allow(dead_code)]
mod example;

const SHORT_RUN: usize = 20;

#[test]
fn data_matches_the_specification() {
    // Values computed independently (Python) from the specification's formulas.
    assert_eq!(example::h(0), 0);
    assert_eq!(example::h(1), 0x6889_90c0);
    assert_eq!(example::h(0x9E37_79B9), 0x01fc_e552);
    assert_eq!(example::u(0), -1.0);
    assert_eq!(example::u(12345), 0.134_246_35);
    let (x, y) = example::dataset(1);
    assert_eq!(
        (x.len(), y.len()),
        (
            example::GLOBAL_BATCH * example::FEATURES,
            example::GLOBAL_BATCH
        )
    );
    assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
    // y is within noise (|noise| < 1/128) of the true linear function.
    let w: Vec<f64> = (0..example::FEATURES)
        .map(|j| ((j % 9) as f64 - 4.0) / 4.0)
        .collect();
    for (i, &yi) in y.iter().enumerate() {
        let row = &x[i * example::FEATURES..(i + 1) * example::FEATURES];
        let clean: f64 = row.iter().zip(&w).map(|(&a, &b)| a as f64 * b).sum::<f64>() + 0.5;
        assert!((yi as f64 - clean).abs() <= 1.0 / 128.0 + 1e-6, "row {i}");
    }
}

#[test]
fn one_and_many_replicas_learn_the_same_weights() {
    let one = example::train(1, SHORT_RUN).unwrap();
    assert!(one.loss.is_finite());
    for replicas in [2, 4, 8] {
        let many = example::train(replicas, SHORT_RUN).unwrap();
        let max_diff = one
            .weights
            .iter()
            .zip(&many.weights)
            .map(|(a, b)| (a - b).abs())
            .fold((one.bias - many.bias).abs(), f32::max);
        assert!(max_diff <= 1e-5, "{replicas} replicas differ by {max_diff}");
        let again = example::train(replicas, SHORT_RUN).unwrap();
        assert!(
            many.weights
                .iter()
                .zip(&again.weights)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{replicas} replicas are not deterministic"
        );
    }
}
