//! The `gpt` example under `mpirun` (feature `mpi`): 2 worker processes with one replica each
//! train exactly the bits of one process with 2 replicas — every step's training loss, the
//! held-out losses and every weight — since each step's two gradients are added in the same
//! order either way. The workers are this test binary started by `mpirun`, running the
//! example's own code on a tiny model (tests/gpt.rs's) for a few steps, with dropout on (its
//! masks are drawn from the seed, the replica's global id and the update, so a worker draws
//! what the replica of the same id draws); the job is bounded in time.
#![cfg(feature = "mpi")]

#[path = "../examples/gpt.rs"]
#[allow(dead_code)]
mod example;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use distribute_candle::CpuThreads;
use distribute_test_support::mpirun::{run_self, write_result};
use example::{GptConfig, Options, read_corpus, train, train_multi_worker};

/// The file of training text every run reads (written once by the launching test: the
/// documentation may change while the tests run).
const TEXT: &str = "DISTRIBUTE_TEST_GPT_TEXT";
/// How long the `mpirun` job may take before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(300);

/// The tiny model for 8 steps of 8 windows, with dropout and held-out evaluations after steps
/// 4 and 8, on the text in `text`.
fn options(replicas: usize, text: &str) -> Options {
    Options {
        replicas,
        steps: 8,
        model: GptConfig {
            layers: 1,
            embd: 16,
            heads: 2,
            block: 16,
        },
        batch: 8,
        lr: Some(1e-2),
        warmup: 2,
        dropout: 0.1,
        eval_every: 4,
        threads: CpuThreads::PerReplica(NonZeroUsize::new(1).unwrap()),
        text: Some(Arc::new(
            std::fs::read(text).expect("the launching test's text"),
        )),
        ..Options::default()
    }
}

/// What the runs are compared on, as bits (JSON's decimal floats need not come back exact):
/// each step's training loss, the held-out losses, every weight.
fn result(trained: &example::Trained) -> serde_json::Value {
    let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let held_out: Vec<u64> = trained
        .evaluations
        .iter()
        .map(|e| e.loss.to_bits())
        .collect();
    let weights: serde_json::Map<String, serde_json::Value> = trained
        .weights
        .iter()
        .map(|(name, w)| (name.clone(), bits(w).into()))
        .collect();
    serde_json::json!({
        "losses": bits(&trained.losses), "held_out": held_out, "weights": weights,
    })
}

#[test]
#[ignore = "a worker process: started by mpirun from two_workers_train_the_bits_of_two_replicas"]
fn worker() {
    let text = std::env::var(TEXT).expect("started by the launching test");
    let (trained, workers, chief) = train_multi_worker(&options(1, &text)).unwrap();
    assert_eq!(workers, 2);
    if chief {
        write_result(&result(&trained).to_string());
    }
}

#[test]
fn two_workers_train_the_bits_of_two_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text");
    let mut corpus = read_corpus(&Options::default().corpus_root).unwrap();
    corpus.truncate(32 * 1024);
    std::fs::write(&text, corpus).unwrap();
    let text = text.to_str().unwrap().to_owned();
    let job = run_self("worker", 2, &[(TEXT, text.clone())], LIMIT);
    let workers: serde_json::Value = serde_json::from_str(job.chief_result()).unwrap();
    let replicas = result(&train(&options(2, &text)).unwrap());
    assert_eq!(workers["losses"], replicas["losses"], "the training losses");
    assert_eq!(
        workers["held_out"], replicas["held_out"],
        "the held-out losses"
    );
    let evaluations = replicas["held_out"].as_array().unwrap().len();
    assert_eq!(evaluations, 3, "before training, after steps 4 and 8");
    let names = replicas["weights"].as_object().unwrap();
    assert_eq!(names.len(), 16, "every variable of the model");
    for (name, want) in names {
        assert!(
            workers["weights"][name] == *want,
            "variable '{name}' differs between 2 workers and 2 replicas"
        );
    }
}
