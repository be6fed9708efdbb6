//! The linear-regression example stopped and started again with the same checkpoint directory
//! (in one process; `resume_multi_worker.rs` kills a worker of an MPI job): on the same replica
//! count it ends with the bits of a run that never stopped; on another count with the weights of
//! a run that changed count at the checkpoint's step; a truncated or flipped newest checkpoint
//! is refused, naming the file, and the previous one is used.

// The example itself, so the test checks the code users run; its `main` is unused here.
#[path = "../examples/linear_regression.rs"]
#[allow(dead_code)]
mod example;

use std::path::{Path, PathBuf};

use distribute::prelude::*;
use distribute::tensor::{DType, Tensor};
use distribute_test_support::linear_regression::{FEATURES, STEPS};
use example::{DEFAULT_DEADLINE, Resumable, Trained};

/// Where the first run stops: after the checkpoint of step 80, before the next one.
const STOP_AFTER: usize = 93;
const EVERY: u64 = 20;

fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("distribute-resume-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn checkpoints(dir: &Path) -> Checkpoints {
    Checkpoints::new(
        dir,
        CheckpointOptions {
            every: EVERY,
            keep: 3,
        },
    )
    .unwrap()
}

/// Trains `replicas` replicas with checkpoints in `dir` (resuming from them), stopping after
/// `stop_after` steps if given.
fn run(replicas: usize, dir: &Path, stop_after: Option<usize>) -> Trained {
    let checkpoints = checkpoints(dir);
    let resumable = Resumable {
        checkpoints: Some(&checkpoints),
        stop_after,
        ..Resumable::default()
    };
    example::train_with(replicas, STEPS, DEFAULT_DEADLINE, &resumable).unwrap()
}

fn bits(trained: &Trained) -> Vec<u32> {
    let mut bits: Vec<u32> = trained.weights.iter().map(|w| w.to_bits()).collect();
    bits.push(trained.bias.to_bits());
    bits
}

fn max_diff(a: &Trained, b: &Trained) -> f32 {
    a.weights
        .iter()
        .zip(&b.weights)
        .map(|(x, y)| (x - y).abs())
        .fold((a.bias - b.bias).abs(), f32::max)
}

#[test]
fn a_stopped_run_resumed_on_the_same_replicas_ends_with_the_same_bits() {
    let uninterrupted = example::train(2, STEPS, DEFAULT_DEADLINE).unwrap();
    let dir = fresh_dir("same");
    let stopped = run(2, &dir, Some(STOP_AFTER));
    assert_eq!(stopped.resumed_from, None);
    let resumed = run(2, &dir, None);
    assert_eq!(resumed.resumed_from, Some(80));
    assert_eq!(bits(&resumed), bits(&uninterrupted));
    // Started again after it finished, it resumes from the last step and changes nothing.
    let again = run(2, &dir, None);
    assert_eq!(again.resumed_from, Some(STEPS as u64));
    assert_eq!(bits(&again), bits(&uninterrupted));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_run_resumed_on_other_replica_counts_matches_one_that_switched_there() {
    // The reference never writes a file: 80 steps on 2 replicas, then 120 more on the new count
    // from the weights in memory.
    let first = example::train_with(
        2,
        STEPS,
        DEFAULT_DEADLINE,
        &Resumable {
            stop_after: Some(80),
            ..Resumable::default()
        },
    )
    .unwrap();
    assert_eq!(first.weights.len(), FEATURES);
    for replicas in [1, 4] {
        let switched = example::train_with(
            replicas,
            STEPS,
            DEFAULT_DEADLINE,
            &Resumable {
                start: Some((80, first.weights.clone(), first.bias)),
                ..Resumable::default()
            },
        )
        .unwrap();
        let dir = fresh_dir(&format!("switch-{replicas}"));
        run(2, &dir, Some(STOP_AFTER));
        let resumed = run(replicas, &dir, None);
        assert_eq!(resumed.resumed_from, Some(80));
        let diff = max_diff(&resumed, &switched);
        assert!(
            diff <= 1e-6,
            "{replicas} replicas: {diff} from the switched run"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_damaged_newest_checkpoint_is_refused_by_name_and_the_previous_one_is_used() {
    let uninterrupted = example::train(2, STEPS, DEFAULT_DEADLINE).unwrap();
    type Damage = fn(&mut Vec<u8>);
    let damages: [(&str, Damage); 2] = [
        ("truncated", |b| b.truncate(b.len() / 2)),
        ("one byte flipped", |b| {
            let middle = b.len() / 2;
            b[middle] ^= 0x01;
        }),
    ];
    for (what, damage) in damages {
        let dir = fresh_dir("damaged");
        run(2, &dir, Some(STOP_AFTER));
        let newest = checkpoints(&dir).path_of(80);
        let mut bytes = std::fs::read(&newest).unwrap();
        damage(&mut bytes);
        std::fs::write(&newest, bytes).unwrap();

        // What the chief finds: the newest refused, named, with why.
        let strategy = MirroredStrategy::new(LocalDevices::cpus(2)).unwrap();
        let zeros = |n| Tensor::zeros("/cpu:0", DType::F32, &[n]).unwrap();
        let weights = strategy
            .create_variable("weights", zeros(FEATURES), VariableOptions::default())
            .unwrap();
        let bias = strategy
            .create_variable("bias", zeros(1), VariableOptions::default())
            .unwrap();
        let resume = checkpoints(&dir)
            .restore(&strategy, &[&weights, &bias])
            .unwrap()
            .expect("the previous checkpoint");
        assert_eq!(resume.step, 60, "{what}");
        let [(refused, why)] = &resume.refused[..] else {
            panic!("{what}: refused {:?}", resume.refused);
        };
        assert_eq!(refused, &newest, "{what}");
        assert!(
            why.contains("truncated") || why.contains("checksum"),
            "{what}: {why}"
        );

        let resumed = run(2, &dir, None);
        assert_eq!(resumed.resumed_from, Some(60), "{what}");
        assert_eq!(bits(&resumed), bits(&uninterrupted), "{what}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
