//! The small GPT of the `gpt` example (its own code), in a tiny configuration that a debug build
//! trains in seconds: 2 and 3 replicas learn what 1 learns from the same initial values and data
//! order (within a stated tolerance), every copy stays bit-identical (`check_in_sync`, which
//! every run of the example ends with), the held-out loss falls, the same run twice trains the
//! same bits (dropout included), and a run stopped and resumed from its checkpoint ends on the
//! bits of one that never stopped.

#[path = "../examples/gpt.rs"]
#[allow(dead_code)]
mod example;

use std::num::NonZeroUsize;
use std::sync::{Arc, OnceLock};

use distribute_candle::CpuThreads;
use example::{GptConfig, Options, Trained, read_corpus, train};

/// Steps of each run.
const STEPS: usize = 16;
/// The largest difference allowed between any weight of a 2- or 3-replica run and the
/// 1-replica run's after [`STEPS`] steps from the same initial values and windows: each
/// replica's matrix products add over its own rows, so the f32 sums are rounded in another
/// order, and AdamW's normalised updates carry the differences on. Measured here: 2.6e-6
/// (2 replicas) and 4.1e-6 (3); the per-step training losses 4.8e-7 apart, the held-out
/// losses 2.7e-8.
const TOLERANCE: f32 = 2.5e-5;

/// The training text, read once for every run of the test (the documentation may change while
/// the tests run): the first 48 KiB of the example's, so that an evaluation is quick.
fn text() -> Arc<Vec<u8>> {
    static TEXT: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    Arc::clone(TEXT.get_or_init(|| {
        let root = Options::default().corpus_root;
        let mut text = read_corpus(&root).expect("the workspace's documentation");
        text.truncate(48 * 1024);
        Arc::new(text)
    }))
}

/// The tiny configuration: 1 block of width 16 with 2 heads over 16 bytes, 8 windows a step.
fn tiny(replicas: usize) -> Options {
    Options {
        replicas,
        steps: STEPS,
        model: GptConfig {
            layers: 1,
            embd: 16,
            heads: 2,
            block: 16,
        },
        batch: 8,
        lr: Some(1e-2),
        warmup: 2,
        eval_every: 0,
        threads: CpuThreads::PerReplica(NonZeroUsize::new(1).unwrap()),
        text: Some(text()),
        ..Options::default()
    }
}

fn max_difference(a: &Trained, b: &Trained) -> f32 {
    assert_eq!(
        a.weights.keys().collect::<Vec<_>>(),
        b.weights.keys().collect::<Vec<_>>()
    );
    a.weights
        .iter()
        .flat_map(|(name, w)| w.iter().zip(&b.weights[name]).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max)
}

/// The held-out loss before and after training.
fn held_out(trained: &Trained) -> (f64, f64) {
    assert_eq!(trained.evaluations.len(), 2, "{:?}", trained.evaluations);
    (trained.evaluations[0].loss, trained.evaluations[1].loss)
}

#[test]
fn two_and_three_replicas_learn_what_one_learns_and_the_held_out_loss_falls() {
    let one = train(&tiny(1)).unwrap();
    assert_eq!(one.losses.len(), STEPS);
    let names: Vec<_> = one.weights.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "h.0.attn.c_attn.bias",
            "h.0.attn.c_attn.weight",
            "h.0.attn.c_proj.bias",
            "h.0.attn.c_proj.weight",
            "h.0.ln_1.bias",
            "h.0.ln_1.weight",
            "h.0.ln_2.bias",
            "h.0.ln_2.weight",
            "h.0.mlp.c_fc.bias",
            "h.0.mlp.c_fc.weight",
            "h.0.mlp.c_proj.bias",
            "h.0.mlp.c_proj.weight",
            "ln_f.bias",
            "ln_f.weight",
            "wpe.weight",
            "wte.weight",
        ]
    );
    let (before, after) = held_out(&one);
    eprintln!("held-out loss {before:.4} → {after:.4}");
    // From about ln 256 = 5.55 (uniform bytes) to well below.
    assert!((before - 256f64.ln()).abs() < 0.1, "{before}");
    assert!(
        after < before - 1.0,
        "the held-out loss falls: {before} → {after}"
    );
    // 3 replicas cut the 8 windows into 3 + 3 + 2. Each run ends with `check_in_sync`: every
    // copy bit-identical.
    for replicas in [2, 3] {
        let many = train(&tiny(replicas)).unwrap();
        let diff = max_difference(&one, &many);
        let loss_diff = one
            .losses
            .iter()
            .zip(&many.losses)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        let held_diff = (held_out(&one).1 - held_out(&many).1).abs();
        eprintln!(
            "{replicas} replicas vs 1 after {STEPS} steps: max |weight difference| {diff:e}, \
             max |loss difference| {loss_diff:e}, held-out loss difference {held_diff:e}"
        );
        assert!(diff <= TOLERANCE, "{replicas} replicas: {diff}");
        assert!(loss_diff <= 1e-5, "{:?} vs {:?}", one.losses, many.losses);
        assert!(held_diff <= 1e-5, "held-out loss {held_diff} apart");
    }
}

#[test]
fn the_same_run_twice_trains_the_same_bits_and_resumes_exactly() {
    // Dropout on: its masks are drawn from the seed, the replica and the update.
    let options = Options {
        dropout: 0.1,
        sample: 16,
        ..tiny(2)
    };
    let a = train(&options).unwrap();
    let b = train(&options).unwrap();
    assert_eq!(max_difference(&a, &b), 0.0);
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.evaluations, b.evaluations);
    assert_eq!((a.sample.len(), &a.sample), (16, &b.sample));

    // Stopped after step 8 (a checkpoint every 4 steps), then resumed to the end.
    let dir = tempfile::tempdir().unwrap();
    let with_checkpoints = |stop_after| Options {
        checkpoints: Some((dir.path().to_owned(), 4)),
        stop_after,
        ..options.clone()
    };
    let first = train(&with_checkpoints(Some(8))).unwrap();
    let rest = train(&with_checkpoints(None)).unwrap();
    assert_eq!((first.first_step, rest.first_step), (0, 8));
    assert_eq!(max_difference(&a, &rest), 0.0);
    let losses: Vec<f32> = first.losses.iter().chain(&rest.losses).copied().collect();
    assert_eq!(losses, a.losses);
    assert_eq!(rest.evaluations.last(), a.evaluations.last());
}
