//! `--model gpt`: the small GPT of `distribute-candle`'s `gpt` example (its own code, below as
//! `example`) learns the bytes of this project's documentation data-parallel: byte-level tokens,
//! 2 pre-norm blocks of causal self-attention and an MLP, width 64, 4 heads, a context of 64
//! bytes, the output head tied to the token embeddings (about 120 thousand parameters), AdamW
//! with a linear warmup and cosine decay, gradients clipped to global norm 1. The text is
//! `README.md` and `docs/*.md` of the workspace, read once when the demo starts: written by this
//! project, under its licence, nothing downloaded; the first 90 % of its bytes train, the last
//! 10 % are held out.
//!
//! The demo trains on `--replicas` replicas (2 by default; under `mpirun`, every worker's), prints
//! the held-out loss and perplexity before, during and after training, and a sample that the
//! trained model writes. Then it checks:
//!
//! - every copy of the weights is bit-identical (the example ends every run with
//!   `check_in_sync`, which fails otherwise);
//! - one replica, from the same initial values and the same windows, trains what the replicas
//!   trained: after the first [`COMPARED_STEPS`] steps the weights agree within
//!   [`GPT_TOLERANCE`], the training losses within [`GPT_LOSS_TOLERANCE`] (why not later:
//!   [`COMPARED_STEPS`]);
//! - the held-out loss falls below [`HELD_OUT_GOAL`] nats per byte, for a run of the default
//!   model trained for at least the default steps (a shorter or other run must still lower it).

#[path = "../../../crates/candle/examples/gpt.rs"]
#[allow(dead_code)]
mod example;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, ensure};
use example::{GptConfig, Options, Trained};

use crate::config::OptimizerKind;

/// The steps after which the replicas' weights are compared with one replica's.
///
/// Not more: each replica's matrix products add over its own windows, so the f32 sums round in
/// another order than one replica's, and this training amplifies such last-bit differences
/// chaotically. AdamW divides each gradient by its own running size, so an entry whose true
/// gradient is zero (the attention's key biases: softmax ignores a constant added to a row of
/// scores) moves by rounding noise as fast as any other, and at the default rate 3e-3 the
/// trajectories part: 2 replicas and 1 of the default run were 3.0e-7 apart after 20 steps,
/// 5.7e-6 after 30 and 2.8e-3 after 50 (training losses 5e-6 apart at step 29, 1e-2 at step
/// 46), each run still learning as well as the other (held-out losses 3.2149 and 3.2090 at
/// step 50).
pub const COMPARED_STEPS: usize = 20;

/// The largest weight difference allowed between the N-replica and the 1-replica run after
/// [`COMPARED_STEPS`] steps of the default model: measured 3.0e-7 on 2 replicas (2 workers under
/// `mpirun` train the bits of 2 replicas). A real mistake is far larger: a learning rate 1 % off
/// moves the weights by about 1e-4 in those steps of warmup.
pub const GPT_TOLERANCE: f32 = 1e-5;

/// The largest difference allowed between the N-replica and the 1-replica run's training loss
/// in any of the first [`COMPARED_STEPS`] steps (nats per byte; measured: at most 9.5e-7, two
/// ulps of f32 at 5.5).
pub const GPT_LOSS_TOLERANCE: f32 = 1e-5;

/// The held-out loss (nats per byte) that the default model must fall below in the default
/// steps: from ln 256 ≈ 5.55 (uniform bytes) to about 2.77 here, the level of byte-pair
/// statistics (letters and spacing of English, not yet words).
pub const HELD_OUT_GOAL: f64 = 3.0;

/// The GPT run the command line asks for; what it leaves is the example's default.
#[derive(Debug, Clone, PartialEq)]
pub struct GptArgs {
    /// Replicas of this process (of each worker under `mpirun`).
    pub replicas: usize,
    /// Training steps (`--steps`).
    pub steps: Option<usize>,
    /// Windows per step over all replicas (`--batch`).
    pub batch: Option<usize>,
    /// Transformer blocks (`--layers`).
    pub layers: Option<usize>,
    /// Embedding width (`--embd`).
    pub embd: Option<usize>,
    /// Attention heads (`--heads`).
    pub heads: Option<usize>,
    /// Context length in bytes (`--block`).
    pub block: Option<usize>,
    /// `--optimizer` [AdamW].
    pub optimizer: Option<OptimizerKind>,
    /// `--lr`.
    pub lr: Option<f64>,
    /// `--weight-decay`.
    pub weight_decay: Option<f64>,
    /// `--warmup`.
    pub warmup: Option<u64>,
    /// `--clip-norm`.
    pub clip_norm: Option<f64>,
    /// `--seed`: the initial values, the windows and the sampler.
    pub seed: u64,
    /// How long a replica or worker waits for the others.
    pub deadline: Duration,
    /// `--checkpoint-dir` and `--checkpoint-every`.
    pub checkpoints: Option<(PathBuf, u64)>,
    /// Bytes the trained model writes (`--sample`).
    pub sample: usize,
}

/// Bytes sampled after training when `--sample` is not given.
pub const DEFAULT_SAMPLE: usize = 240;

impl GptArgs {
    /// The example's options for this run, on `text`.
    fn options(&self, text: Arc<Vec<u8>>) -> Options {
        let defaults = Options::default();
        let shape = defaults.model;
        let steps = self.steps.unwrap_or(defaults.steps);
        Options {
            replicas: self.replicas,
            steps,
            model: GptConfig {
                layers: self.layers.unwrap_or(shape.layers),
                embd: self.embd.unwrap_or(shape.embd),
                heads: self.heads.unwrap_or(shape.heads),
                block: self.block.unwrap_or(shape.block),
            },
            batch: self.batch.unwrap_or(defaults.batch),
            optimizer: match self.optimizer.unwrap_or(OptimizerKind::AdamW) {
                OptimizerKind::Sgd => example::OptimizerKind::Sgd,
                OptimizerKind::AdamW => example::OptimizerKind::AdamW,
            },
            lr: self.lr,
            weight_decay: self.weight_decay,
            warmup: self.warmup.unwrap_or(defaults.warmup),
            clip_norm: self.clip_norm.or(defaults.clip_norm),
            seed: self.seed,
            deadline: self.deadline,
            checkpoints: self.checkpoints.clone(),
            snapshot_after: Some(COMPARED_STEPS.min(steps)),
            sample: self.sample,
            text: Some(text),
            progress: true,
            ..defaults
        }
    }

    /// Whether this is the default model trained for at least the default steps: the run that
    /// must reach [`HELD_OUT_GOAL`].
    fn is_default_model(&self, options: &Options) -> bool {
        let defaults = Options::default();
        options.model == defaults.model
            && options.steps >= defaults.steps
            && options.batch == defaults.batch
            && self.optimizer.is_none_or(|o| o == OptimizerKind::AdamW)
            && self.lr.is_none()
            && self.warmup.is_none()
    }
}

/// An error of the example's (`Box<dyn Error>`, neither `Send` nor `Sync`) as anyhow's.
fn example_error(err: Box<dyn std::error::Error>) -> anyhow::Error {
    anyhow!("{err}")
}

/// The training text, read once: every run of the demo trains on the same bytes, even if the
/// documentation changes meanwhile.
fn read_text() -> Result<Arc<Vec<u8>>> {
    let root = Options::default().corpus_root;
    Ok(Arc::new(
        example::read_corpus(&root).map_err(example_error)?,
    ))
}

/// What the report says of the text.
fn print_text(text: &[u8]) {
    let held = text.len() - text.len() * 9 / 10;
    println!(
        "data: this project's documentation (README.md and docs/*.md, Apache-2.0), {} bytes: {} \
         for training, the last {held} held out; byte-level tokens",
        text.len(),
        text.len() - held
    );
}

/// The model and optimizer line.
fn print_model(options: &Options) {
    let shape = options.model;
    let optimizer = match options.optimizer {
        example::OptimizerKind::Sgd => "SGD",
        example::OptimizerKind::AdamW => "AdamW",
    };
    let mut how = optimizer.to_owned();
    if let Some(lr) = options.lr {
        how += &format!(" lr {lr}");
    }
    // The example warms up over all but the last update of a run shorter than its warmup.
    let warmup = options.warmup.min((options.steps as u64).saturating_sub(1));
    if warmup > 0 {
        how += &format!(", {warmup} steps of linear warmup then cosine decay to 0");
    }
    if let Some(max) = options.clip_norm {
        how += &format!(", gradients clipped to global norm {max}");
    }
    println!(
        "model: GPT, {} blocks of width {} with {} heads over {} bytes of context, head tied to \
         the byte embeddings; {how}; {} steps of {} windows",
        shape.layers, shape.embd, shape.heads, shape.block, options.steps, options.batch
    );
}

/// `--model gpt` in one process: trains on `args.replicas` replicas, reports, samples, and
/// checks against one replica.
pub fn run(args: &GptArgs) -> Result<()> {
    let text = read_text()?;
    print_text(&text);
    let options = args.options(text);
    print_model(&options);
    let started = Instant::now();
    let trained = example::train(&options).map_err(example_error)?;
    report(args, &options, &trained, 1, started.elapsed())?;
    check_against_one_replica(&options, &trained)
}

/// `--model gpt` as one worker of `cargo xtask demo --workers W --model gpt` (feature `mpi`):
/// every worker trains with `MultiWorkerMirroredStrategy`; the chief reports and checks the
/// weights against one process with one replica. Every copy on every worker is bit-identical,
/// or the run fails (`check_in_sync` at its end).
#[cfg(feature = "mpi")]
pub fn run_multi_worker(args: &GptArgs) -> Result<()> {
    let text = read_text()?;
    let options = args.options(Arc::clone(&text));
    let started = Instant::now();
    let (trained, workers, chief) = example::train_multi_worker(&options).map_err(example_error)?;
    if !chief {
        return Ok(());
    }
    print_text(&text);
    print_model(&options);
    report(args, &options, &trained, workers, started.elapsed())?;
    check_against_one_replica(&options, &trained)
}

/// Prints the run: speed, the held-out loss before and after, the sample; fails when the
/// held-out loss did not fall (below [`HELD_OUT_GOAL`] for the default run).
fn report(
    args: &GptArgs,
    options: &Options,
    trained: &Trained,
    workers: usize,
    took: Duration,
) -> Result<()> {
    let threads = trained
        .threads_per_replica
        .map_or_else(|| "unmanaged".to_owned(), |t| t.to_string());
    let strategy = if workers > 1 {
        "MultiWorkerMirroredStrategy"
    } else {
        "MirroredStrategy"
    };
    let (first, last) = (
        trained.losses.first().copied().unwrap_or(f32::NAN),
        trained.losses.last().copied().unwrap_or(f32::NAN),
    );
    println!(
        "{strategy}: {workers} worker(s) × {} replicas ({threads} threads each), {} parameters; \
         steps {}..{}: training loss {first:.4} → {last:.4}, {:.0} tokens/s, {:.1} s",
        options.replicas,
        trained.parameters,
        trained.first_step,
        trained.first_step + trained.losses.len(),
        trained.tokens_per_s,
        took.as_secs_f64()
    );
    let (Some(before), Some(after)) = (trained.evaluations.first(), trained.evaluations.last())
    else {
        return Err(anyhow!("the run made no evaluation"));
    };
    println!(
        "held-out loss {:.4} → {:.4} nats/byte (perplexity {:.2} → {:.2}) over {} bytes; every \
         copy of the weights bit-identical (check_in_sync)",
        before.loss,
        after.loss,
        before.perplexity(),
        after.perplexity(),
        after.bytes
    );
    if options.sample > 0 {
        println!(
            "sample ({} bytes after {:?}, temperature {}):",
            options.sample, options.prompt, options.temperature
        );
        let sample = String::from_utf8_lossy(&trained.sample);
        for line in format!("{}{sample}", options.prompt).lines() {
            println!("  | {line}");
        }
    }
    if trained.first_step >= options.steps {
        return Ok(());
    }
    if args.is_default_model(options) {
        ensure!(
            after.loss < HELD_OUT_GOAL,
            "the held-out loss ended at {:.4} nats/byte, not below {HELD_OUT_GOAL}: the default \
             run did not learn what it learns",
            after.loss
        );
        println!("held-out loss below {HELD_OUT_GOAL} nats/byte, the default run's goal");
    } else {
        ensure!(
            after.loss < before.loss,
            "the held-out loss did not fall ({:.4} → {:.4})",
            before.loss,
            after.loss
        );
    }
    Ok(())
}

/// Trains one replica in this process for the first [`COMPARED_STEPS`] steps of `options`'
/// schedule and compares its weights, training and held-out losses with `trained`'s after as
/// many steps; fails past [`GPT_TOLERANCE`] or [`GPT_LOSS_TOLERANCE`].
fn check_against_one_replica(options: &Options, trained: &Trained) -> Result<()> {
    let Some((compared, snapshot)) = &trained.snapshot else {
        println!(
            "1 replica: not compared: this run resumed at step {}, after the first {} steps \
             that the check compares (start it in an empty --checkpoint-dir to check)",
            trained.first_step,
            COMPARED_STEPS.min(options.steps)
        );
        return Ok(());
    };
    let compared = *compared;
    let started = Instant::now();
    let one = example::train(&Options {
        replicas: 1,
        stop_after: Some(compared),
        snapshot_after: Some(compared),
        checkpoints: None,
        eval_every: compared,
        sample: 0,
        progress: false,
        ..options.clone()
    })
    .map_err(example_error)?;
    let (_, reference) = one
        .snapshot
        .as_ref()
        .ok_or_else(|| anyhow!("the 1-replica run kept no weights after step {compared}"))?;
    let weights = snapshot
        .iter()
        .map(|(name, w)| {
            let r = reference
                .get(name)
                .ok_or_else(|| anyhow!("the 1-replica run has no variable '{name}'"))?;
            Ok(w.iter()
                .zip(r)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max))
        })
        .collect::<Result<Vec<f32>>>()?
        .into_iter()
        .fold(0.0, f32::max);
    let losses = trained
        .losses
        .iter()
        .zip(&one.losses)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let held = |t: &Trained| {
        t.evaluations
            .iter()
            .find(|e| e.step == compared)
            .map(|e| e.loss)
    };
    let held = match (held(trained), held(&one)) {
        (Some(a), Some(b)) => format!(
            ", held-out loss {a:.6} vs {b:.6} ({:.1e} apart)",
            (a - b).abs()
        ),
        _ => String::new(),
    };
    println!(
        "1 replica, same initial values and windows, first {compared} steps ({:.1} s): max \
         |weight difference| {weights:.1e} (limit {GPT_TOLERANCE:.0e}), max |training loss \
         difference| {losses:.1e} (limit {GPT_LOSS_TOLERANCE:.0e}){held}",
        started.elapsed().as_secs_f64()
    );
    ensure!(
        weights <= GPT_TOLERANCE,
        "after {compared} steps the replicas' weights differ from one replica's by {weights:e}, \
         more than {GPT_TOLERANCE:e}: the replicas did not train the same model"
    );
    ensure!(
        losses <= GPT_LOSS_TOLERANCE,
        "in the first {compared} steps the replicas' training losses differ from one replica's \
         by {losses:e}, more than {GPT_LOSS_TOLERANCE:e}"
    );
    Ok(())
}
