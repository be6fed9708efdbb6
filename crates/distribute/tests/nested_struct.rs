//! The `#[derive(Nest)]` example: a user's struct as a dataset's batch, a step's input and one
//! fused `all_reduce` gives every global batch's sums, whatever the replica count.

// The example itself, so the test checks the code users run; its `main` is unused here.
#[path = "../examples/nested_struct.rs"]
#[allow(dead_code)]
mod example;

#[test]
fn every_replica_count_sums_each_global_batch() {
    // Rows 0..4 then 4..8 of features [i, 1] and target i: Σ i², Σ i and 4 rows each step.
    let expected = vec![(vec![14.0, 6.0], 4.0), (vec![126.0, 22.0], 4.0)];
    for replicas in [1, 2, 4] {
        let sums: Vec<(Vec<f32>, f32)> = example::sums_per_step(replicas)
            .unwrap()
            .iter()
            .map(|s| (s.xy.to_vec().unwrap(), s.rows.to_vec::<f32>().unwrap()[0]))
            .collect();
        assert_eq!(sums, expected, "{replicas} replicas");
    }
}
