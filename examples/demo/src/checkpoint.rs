//! `--checkpoint-dir DIR`: the candle classifier's run as entries of the strategy crate's
//! `Checkpoints` (atomic files written by the chief, checksummed, the chief's bytes sent to
//! every worker on restore). A checkpoint holds
//!
//! - `model`: the candle model and its training state (`DataParallel` is a
//!   `CheckpointVariable`: its variables, its optimizer's state and the number of updates
//!   applied, as safetensors, checked against the model and optimizer on restore): AdamW's
//!   moments and step count (plain SGD has none), and the position of the `--warmup` schedule,
//!   so that a resumed run goes on with the same moments and learning rate;
//! - `demo/run`: no bytes, the run's settings as its signature (steps, batch, learning rate,
//!   hidden units, seed, optimizer, weight decay, warmup, clipping), so that a directory of
//!   another run is refused rather than continued with other settings or another data order;
//! - `demo/losses`: every step's global-batch loss so far (summed over the workers when the
//!   checkpoint is written), `demo/validation` the validation curve's `(step, loss)` points and
//!   `demo/early` the weights after `CHECK_STEPS` steps (empty before), so that a resumed run
//!   reports the whole run and still checks against one replica.

use anyhow::{Context, Result, anyhow, ensure};
use candle_nn::Optimizer;
use distribute::prelude::{Checkpoints, InputPosition, Strategy, StrategyError};
use distribute::strategy::{CheckpointVariable, StrategyExtended};
use distribute::values::Lock;
use distribute_candle::DataParallel;
use distribute_candle::OptimizerState;

use crate::Config;

/// One named byte string of a checkpoint, and what a restore put in its place.
struct Entry {
    name: String,
    signature: String,
    bytes: Vec<u8>,
    restored: Lock<Option<Vec<u8>>>,
}

impl Entry {
    fn new(name: impl Into<String>, signature: impl Into<String>, bytes: Vec<u8>) -> Self {
        Entry {
            name: name.into(),
            signature: signature.into(),
            bytes,
            restored: Lock::new(None),
        }
    }

    /// The bytes a restore gave this entry.
    fn take(&self) -> Result<Vec<u8>> {
        self.restored
            .lock()
            .take()
            .ok_or_else(|| anyhow!("the checkpoint restored nothing into {}", self.name))
    }
}

impl CheckpointVariable for Entry {
    fn checkpoint_name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> String {
        self.signature.clone()
    }

    fn saved_bytes(&self, _extended: &dyn StrategyExtended) -> Result<Vec<u8>, StrategyError> {
        Ok(self.bytes.clone())
    }

    fn restore_bytes(
        &self,
        _extended: &dyn StrategyExtended,
        bytes: &[u8],
    ) -> Result<(), StrategyError> {
        *self.restored.lock() = Some(bytes.to_vec());
        Ok(())
    }
}

/// What a candle run has done so far, as a checkpoint holds it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Progress {
    /// Each step's global-batch loss, every worker's replicas' shares added up.
    pub losses: Vec<f32>,
    /// The validation curve's `(step, loss)` points.
    pub validation: Vec<(usize, f32)>,
    /// Every variable after `CHECK_STEPS` steps, in name order (empty before).
    pub early_weights: Vec<(String, Vec<f32>)>,
}

/// A run restored from a checkpoint.
pub struct Restored {
    /// The checkpoint's step: the run goes on with the next.
    pub step: usize,
    /// Where the input pipeline was.
    pub input: InputPosition,
    /// The file restored (as the chief named it).
    pub path: std::path::PathBuf,
    /// Newer files the chief refused, with why (empty on the other workers).
    pub refused: Vec<(std::path::PathBuf, String)>,
    /// The run so far. Across workers the losses are the whole job's on the chief and zeros on
    /// the others, so that adding every worker's up at the end counts them once.
    pub progress: Progress,
}

/// The settings a checkpoint must have been written with.
fn run_signature(config: &Config) -> String {
    format!(
        "candle classifier: {} steps, global batch {}, learning rate {:?}, {} hidden units, seed \
         {}, optimizer {}, weight decay {:?}, warmup {}, clip norm {:?}",
        config.steps,
        config.global_batch,
        config.learning_rate,
        config.hidden,
        config.seed,
        config.optimizer.name(),
        config.weight_decay,
        config.warmup,
        config.clip_norm
    )
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn f32s(bytes: &[u8]) -> Result<Vec<f32>> {
    ensure!(
        bytes.len().is_multiple_of(4),
        "{} bytes are not f32s",
        bytes.len()
    );
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The demo's own entries of a checkpoint, with `progress`'s values (on every worker; only the
/// restore's bytes matter when restoring).
fn entries(config: &Config, progress: &Progress) -> Vec<Entry> {
    let validation = progress
        .validation
        .iter()
        .flat_map(|&(step, loss)| {
            (step as u64)
                .to_le_bytes()
                .into_iter()
                .chain(loss.to_le_bytes())
        })
        .collect();
    let early: Vec<f32> = progress
        .early_weights
        .iter()
        .flat_map(|(_, w)| w.iter().copied())
        .collect();
    vec![
        Entry::new("demo/run", run_signature(config), Vec::new()),
        Entry::new("demo/losses", "f32 per step", f32_bytes(&progress.losses)),
        Entry::new("demo/validation", "(u64 step, f32 loss) pairs", validation),
        Entry::new(
            "demo/early",
            "f32, every variable in name order",
            f32_bytes(&early),
        ),
    ]
}

/// The model and `entries`, as `Checkpoints` takes them.
fn variables<'a, S: Strategy, M: Send, O: Optimizer + OptimizerState + Send>(
    model: &'a DataParallel<'_, S, M, O>,
    entries: &'a [Entry],
) -> Vec<&'a dyn CheckpointVariable> {
    std::iter::once(model as &dyn CheckpointVariable)
        .chain(entries.iter().map(|e| e as &dyn CheckpointVariable))
        .collect()
}

/// After `step` steps, when `checkpoints` is due: saves the model, the input position and
/// `progress`, whose `losses` are this worker's replicas' shares (added up over the workers
/// here). Every worker calls it; the chief writes.
pub fn save<S: Strategy, M: Send, O: Optimizer + OptimizerState + Send>(
    checkpoints: &Checkpoints,
    strategy: &S,
    model: &DataParallel<'_, S, M, O>,
    config: &Config,
    step: usize,
    progress: &Progress,
) -> Result<()> {
    if !checkpoints.is_due(step as u64) {
        return Ok(());
    }
    let mine = f32_bytes(&progress.losses);
    let losses = match strategy
        .extended()
        .workers()
        .map(|w| w.exchange(&mine))
        .transpose()?
    {
        None => progress.losses.clone(),
        Some(every) => {
            let mut total = vec![0.0f32; progress.losses.len()];
            for bytes in every {
                for (t, l) in total.iter_mut().zip(f32s(&bytes)?) {
                    *t += l;
                }
            }
            total
        }
    };
    let progress = Progress {
        losses,
        ..progress.clone()
    };
    let entries = entries(config, &progress);
    checkpoints.save(
        strategy,
        step as u64,
        &variables(model, &entries),
        InputPosition::at_step(step as u64),
    )?;
    Ok(())
}

/// Restores the newest good checkpoint of `checkpoints` into every copy of `model` on every
/// worker, and gives where to go on from; `None` (the model untouched) when there is none.
/// Every worker calls it.
pub fn restore<S: Strategy, M: Send, O: Optimizer + OptimizerState + Send>(
    checkpoints: &Checkpoints,
    strategy: &S,
    model: &DataParallel<'_, S, M, O>,
    config: &Config,
) -> Result<Option<Restored>> {
    let entries = entries(config, &Progress::default());
    let restoring = variables(model, &entries);
    let Some(resume) = checkpoints.restore(strategy, &restoring).with_context(|| {
        format!(
            "restoring the checkpoints of {} (a directory of another run? give this run a new \
             --checkpoint-dir)",
            checkpoints.dir().display()
        )
    })?
    else {
        return Ok(None);
    };
    // The model is restored; the demo's own entries follow.
    let [_, losses, validation, early] = &entries[..] else {
        unreachable!("entries() makes four entries");
    };
    let mut losses = f32s(&losses.take()?)?;
    if !strategy.is_chief() {
        losses.iter_mut().for_each(|l| *l = 0.0);
    }
    let validation = validation
        .take()?
        .chunks_exact(12)
        .map(|c| {
            let step = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let loss = f32::from_le_bytes(c[8..].try_into().expect("4 bytes"));
            (step as usize, loss)
        })
        .collect();
    let early = f32s(&early.take()?)?;
    let mut early_weights = Vec::new();
    if !early.is_empty() {
        let mut rest = early.as_slice();
        for v in model.variables() {
            let size = v.elem_count();
            ensure!(rest.len() >= size, "the early weights are cut short");
            let (mine, next) = rest.split_at(size);
            early_weights.push((v.name.clone(), mine.to_vec()));
            rest = next;
        }
    }
    let step = usize::try_from(resume.step)?;
    ensure!(
        losses.len() == step,
        "the checkpoint of step {step} holds {} losses",
        losses.len()
    );
    Ok(Some(Restored {
        step,
        input: resume.input,
        path: resume.path,
        refused: resume.refused,
        progress: Progress {
            losses,
            validation,
            early_weights,
        },
    }))
}
