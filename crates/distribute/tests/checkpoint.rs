//! The checkpoint example: what N replicas save, M replicas restore, for N and M in both
//! directions, with each of the M copies of a sync-on-read sum holding its share.

// The example itself, so the test checks the code users run; its `main` is unused here.
#[path = "../examples/checkpoint.rs"]
#[allow(dead_code)]
mod example;

#[test]
fn a_checkpoint_of_n_replicas_restores_on_m() {
    for (saved_on, restored_on) in [(4, 3), (2, 1), (1, 2)] {
        let path = std::env::temp_dir().join(format!(
            "distribute-checkpoint-test-{}-{saved_on}-{restored_on}.json",
            std::process::id()
        ));
        let saved = example::train_and_save(saved_on, &path).unwrap();
        // 3 steps of 0.5; replica r counts r + 1 examples a step.
        let seen = 3.0 * (saved_on * (saved_on + 1) / 2) as f64;
        assert_eq!(saved, [1.5, seen], "saved on {saved_on}");
        let (restored, copies) = example::restore(restored_on, &path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(restored, saved, "{saved_on} → {restored_on}");
        assert_eq!(copies, vec![seen / restored_on as f64; restored_on]);
    }
}
