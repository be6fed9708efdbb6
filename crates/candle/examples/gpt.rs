//! A small GPT trained data-parallel with `distribute-candle`: byte-level tokens (vocabulary
//! 256), token and position embeddings (`wte`, `wpe`), `--layers` pre-norm blocks of causal
//! self-attention and an MLP (`h.{i}.ln_1`, `h.{i}.attn.c_attn`, `h.{i}.attn.c_proj`,
//! `h.{i}.ln_2`, `h.{i}.mlp.c_fc`, `h.{i}.mlp.c_proj`), a final `ln_f` and an output head tied
//! to `wte`: candle-nn's `embedding`, `layer_norm` and `linear` layers under the names GPT-2 uses
//! (candle-transformers' GPT-BigCode names its layers so, below `transformer.`). The linear
//! weights are `[out, in]`, as candle's `Linear` holds them (GPT-2's own checkpoints hold the
//! transpose, from its `Conv1D`); `c_attn` gives the queries, keys and values in that order,
//! each `--embd` wide.
//!
//! ```text
//! cargo run --release -p distribute-candle --example gpt -- --replicas 2 --sample 200
//! cargo run --release -p distribute-candle --example gpt -- --steps 2000 --layers 4 --embd 128 \
//!     --checkpoint-dir ckpt --checkpoint-every 100
//! ```
//!
//! **The training text** is this project's own documentation: `docs/*.md` and `README.md`, read
//! at run time from the workspace (`--corpus-root DIR` reads another checkout's) and
//! concatenated in sorted path order. It is written by this project and is under its licence
//! (Apache-2.0), so the example ships and downloads no third-party data. The first 90 % of its
//! bytes are for training, the last 10 % are held out.
//!
//! **Batches.** Step `s` (from 0) of a run trains on `--batch` windows of `--block` + 1 bytes of
//! the training part (inputs and next-byte targets), window `r` starting at an offset that a
//! counter-based hash of `(--seed, s, r)` picks: no generator carries state from step to step,
//! so the data order does not depend on the replica or worker count, and a run resumed at step
//! `s` reads what an uninterrupted one read. The windows come as `distribute_tensor::Tensor`
//! i64 batches from a `GeneratorSource` through `strategy.distribute_dataset`, each replica
//! getting its rows.
//!
//! **Initial values** come from `--seed` too (GPT-2's scheme: weights N(0, 0.02), the residual
//! projections `c_proj` N(0, 0.02/√(2·layers)), biases 0, layer-norm gains 1), assigned to every
//! copy with `model.assign`: the same seed trains the same bits, on any machine that rounds as
//! this one does (candle's own initialisers draw from an unseedable thread-local generator).
//!
//! **Evaluation.** The held-out part, cut into consecutive windows (every held-out byte after
//! the first is a target exactly once), is evaluated with `model.evaluate` before training,
//! every `--eval-every` steps and at the end: the summed per-byte loss and the byte count in
//! `Metrics`, whence the held-out loss (nats per byte) and perplexity.
//!
//! Options (defaults in brackets): `--replicas R` [2] or `--devices LIST` (the replicas' devices,
//! e.g. `/gpu:0` when built with the feature `cuda`), `--steps N` [200], `--layers L` [2],
//! `--embd E` [64], `--heads H` [4], `--block T` [64], `--batch B` (windows per step over all
//! replicas and workers) [32], `--optimizer adamw|sgd` [adamw: betas 0.9 and 0.999, eps 1e-8],
//! `--lr` [3e-3 for AdamW, 0.3 for SGD], `--weight-decay` [0.01 for AdamW, 0 for SGD], `--warmup
//! W` [50: a linear warmup over W updates, then cosine decay to zero at `--steps`; 0 keeps the
//! rate constant], `--clip-norm X` [1.0; 0: none], `--dropout P` [0: `ReplicaStep::dropout` at
//! every GPT-2 dropout site, with reproducible masks], `--precision f32|bf16|f16` [f32; the
//! others compute in half precision over f32 master weights], `--seed` [0], `--threads T` (per
//! replica) [the cores shared out], `--checkpoint-dir DIR` with `--checkpoint-every N` [100] (a
//! restarted run resumes on the bits of one that never stopped), `--stop-after N`,
//! `--eval-every N` [50; 0: before and after training only], `--json`, and `--sample N` [0]:
//! after training, replica 0 continues `--prompt` ["The "] by N bytes, sampling at
//! `--temperature` [0.8; 0 is greedy] with a generator seeded by `--seed`, and prints them.
//! Trained by default (about 120 thousand parameters, 200 steps of 32 × 64 bytes, a minute on
//! 2 cores), the held-out loss falls from ln 256 ≈ 5.55 to about 2.8 nats per byte, what
//! byte-pair statistics give: English-like letters and spacing, not yet words.
//!
//! Built with the feature `mpi` and started by `mpirun`, it trains with
//! `MultiWorkerMirroredStrategy`: every process is a worker with `--replicas` local replicas
//! and only the chief prints (`cargo xtask launch -n 2 gpt -- --replicas 1`).
//!
//! candle-nn 0.11's `LayerNorm::forward` takes a fused kernel without a backward pass on
//! contiguous inputs (no gradient would reach the layer norms or anything below them), so the
//! model applies its layer norms' weights with `candle_nn::ops::layer_norm_slow`, which
//! candle differentiates; softmax is likewise `ops::softmax` rather than the fused
//! `softmax_last_dim`.

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{D, DType, Device, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, Module, Optimizer, ParamsAdamW, VarBuilder};
use distribute_candle::{
    AnyOptimizer, Config, CpuThreads, DataParallel, Decay, Metrics, OptimizerConfig, ParamsSgd,
    Precision, Schedule, StepError,
};
use distribute_device_spec::LocalDevices;
use distribute_input::{Dataset, GeneratorSource, InputOptions, InputPosition};
use distribute_mirrored::MirroredStrategy;
use distribute_strategy::{CheckpointOptions, Checkpoints, Strategy};
use distribute_tensor::{Fnv, Tensor as HostTensor};
use distribute_values::ReduceOp;

/// Byte-level tokens.
pub(crate) const VOCAB: usize = 256;
/// The layer norms' epsilon (GPT-2's).
const LN_EPS: f64 = 1e-5;
/// The standard deviation of GPT-2's initial weights.
const INIT_STD: f64 = 0.02;

/// The model's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GptConfig {
    /// Transformer blocks.
    pub(crate) layers: usize,
    /// Embedding width.
    pub(crate) embd: usize,
    /// Attention heads (dividing `embd`).
    pub(crate) heads: usize,
    /// Context length: positions of `wpe`.
    pub(crate) block: usize,
}

/// A layer's dropout: `ReplicaStep::dropout` in a training step, nothing in evaluation and
/// sampling.
pub(crate) type Dropout<'a> = Option<&'a dyn Fn(&Tensor) -> Result<Tensor, StepError>>;

/// `xs` through `dropout`, or unchanged.
fn drop_out(xs: Tensor, dropout: Dropout<'_>) -> Result<Tensor, StepError> {
    match dropout {
        Some(dropout) => dropout(&xs),
        None => Ok(xs),
    }
}

/// A layer norm built by candle-nn, applied with candle's differentiable `layer_norm_slow`.
fn layer_norm(ln: &LayerNorm, xs: &Tensor) -> candle_core::Result<Tensor> {
    let bias = ln
        .bias()
        .ok_or_else(|| candle_core::Error::Msg("the layer norm has no bias".into()))?;
    candle_nn::ops::layer_norm_slow(xs, ln.weight(), bias, LN_EPS as f32)
}

/// Causal self-attention: queries, keys and values from one projection (`c_attn`), the heads'
/// outputs projected back (`c_proj`).
struct Attention {
    c_attn: Linear,
    c_proj: Linear,
    heads: usize,
}

impl Attention {
    fn new(config: GptConfig, vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Attention {
            c_attn: candle_nn::linear(config.embd, 3 * config.embd, vb.pp("c_attn"))?,
            c_proj: candle_nn::linear(config.embd, config.embd, vb.pp("c_proj"))?,
            heads: config.heads,
        })
    }

    /// `xs` is `[b, t, e]`; `mask` `[t, t]`, 0 on and below the diagonal, −∞ above.
    fn forward(
        &self,
        xs: &Tensor,
        mask: &Tensor,
        dropout: Dropout<'_>,
    ) -> Result<Tensor, StepError> {
        let (b, t, e) = xs.dims3()?;
        let head = e / self.heads;
        let qkv = self.c_attn.forward(xs)?;
        let split = |i: usize| {
            qkv.narrow(2, i * e, e)?
                .reshape((b, t, self.heads, head))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        // Scaled before the product: a quarter of the scores' elements at the default sizes.
        let q = (q * (1.0 / (head as f64).sqrt()))?;
        let scores = q.matmul(&k.t()?)?.broadcast_add(mask)?;
        let weights = drop_out(candle_nn::ops::softmax(&scores, D::Minus1)?, dropout)?;
        let ys = weights.matmul(&v)?.transpose(1, 2)?.reshape((b, t, e))?;
        drop_out(self.c_proj.forward(&ys)?, dropout)
    }
}

/// The MLP of a block: `c_fc` to 4·e, GELU (GPT-2's tanh form), `c_proj` back.
struct Mlp {
    c_fc: Linear,
    c_proj: Linear,
}

impl Mlp {
    fn new(config: GptConfig, vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Mlp {
            c_fc: candle_nn::linear(config.embd, 4 * config.embd, vb.pp("c_fc"))?,
            c_proj: candle_nn::linear(4 * config.embd, config.embd, vb.pp("c_proj"))?,
        })
    }

    fn forward(&self, xs: &Tensor, dropout: Dropout<'_>) -> Result<Tensor, StepError> {
        drop_out(
            self.c_proj.forward(&self.c_fc.forward(xs)?.gelu()?)?,
            dropout,
        )
    }
}

/// A pre-norm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
struct Block {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    mlp: Mlp,
}

impl Block {
    fn new(config: GptConfig, vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Block {
            ln_1: candle_nn::layer_norm(config.embd, LN_EPS, vb.pp("ln_1"))?,
            attn: Attention::new(config, vb.pp("attn"))?,
            ln_2: candle_nn::layer_norm(config.embd, LN_EPS, vb.pp("ln_2"))?,
            mlp: Mlp::new(config, vb.pp("mlp"))?,
        })
    }

    fn forward(
        &self,
        xs: &Tensor,
        mask: &Tensor,
        dropout: Dropout<'_>,
    ) -> Result<Tensor, StepError> {
        let xs = (xs
            + self
                .attn
                .forward(&layer_norm(&self.ln_1, xs)?, mask, dropout)?)?;
        Ok((&xs + self.mlp.forward(&layer_norm(&self.ln_2, &xs)?, dropout)?)?)
    }
}

/// The model.
pub(crate) struct Gpt {
    wte: Embedding,
    wpe: Embedding,
    h: Vec<Block>,
    ln_f: LayerNorm,
    /// `[block, block]` causal mask in the model's compute dtype.
    mask: Tensor,
    device: Device,
    config: GptConfig,
}

impl Gpt {
    /// The model's layers from `vb` (their initial values are replaced by [`initial_values`]'s).
    pub(crate) fn new(config: GptConfig, vb: VarBuilder) -> candle_core::Result<Gpt> {
        let h = (0..config.layers)
            .map(|i| Block::new(config, vb.pp("h").pp(i)))
            .collect::<candle_core::Result<_>>()?;
        let t = config.block;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Gpt {
            wte: candle_nn::embedding(VOCAB, config.embd, vb.pp("wte"))?,
            wpe: candle_nn::embedding(config.block, config.embd, vb.pp("wpe"))?,
            h,
            ln_f: candle_nn::layer_norm(config.embd, LN_EPS, vb.pp("ln_f"))?,
            mask: Tensor::from_vec(mask, (t, t), vb.device())?.to_dtype(vb.dtype())?,
            device: vb.device().clone(),
            config,
        })
    }

    /// The next-byte logits, `[b·t, 256]` in f32, of the tokens `idx` (`[b, t]`, i64, `t` at
    /// most the block size), with `dropout` after the embeddings, on the attention weights and
    /// on each residual branch.
    pub(crate) fn forward(&self, idx: &Tensor, dropout: Dropout<'_>) -> Result<Tensor, StepError> {
        let (b, t) = idx.dims2()?;
        let positions = Tensor::arange(0i64, t as i64, &self.device)?;
        let xs = self
            .wte
            .forward(&idx.contiguous()?)?
            .broadcast_add(&self.wpe.forward(&positions)?)?;
        let mut xs = drop_out(xs, dropout)?;
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?;
        for block in &self.h {
            xs = block.forward(&xs, &mask, dropout)?;
        }
        let xs = layer_norm(&self.ln_f, &xs)?.reshape((b * t, self.config.embd))?;
        // The head tied to the token embeddings.
        Ok(xs
            .matmul(&self.wte.embeddings().t()?)?
            .to_dtype(DType::F32)?)
    }

    /// Each window's summed next-byte cross-entropy (`[b]`, f32) of `windows` (`[b, t + 1]`
    /// bytes as i64): the first `t` bytes in, the last `t` as targets.
    pub(crate) fn window_losses(
        &self,
        windows: &Tensor,
        dropout: Dropout<'_>,
    ) -> Result<Tensor, StepError> {
        let (b, width) = windows.dims2()?;
        let t = width - 1;
        let inputs = windows.narrow(1, 0, t)?;
        let targets = windows.narrow(1, 1, t)?.contiguous()?.reshape((b * t, 1))?;
        let log_p = candle_nn::ops::log_softmax(&self.forward(&inputs, dropout)?, D::Minus1)?;
        Ok(log_p.gather(&targets, 1)?.reshape((b, t))?.sum(1)?.neg()?)
    }

    /// `prompt` continued by `n` bytes: each the argmax of the next-byte distribution
    /// (`temperature` 0) or drawn from it at `temperature` with a generator seeded by `seed`.
    pub(crate) fn generate(
        &self,
        prompt: &[u8],
        n: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<Vec<u8>, StepError> {
        let mut tokens: Vec<u8> = if prompt.is_empty() {
            b"\n".to_vec()
        } else {
            prompt.to_vec()
        };
        let start = tokens.len();
        for i in 0..n {
            let context = &tokens[tokens.len().saturating_sub(self.config.block)..];
            let idx: Vec<i64> = context.iter().map(|&b| i64::from(b)).collect();
            let idx = Tensor::from_vec(idx, (1, context.len()), &self.device)?;
            let logits = self.forward(&idx, None)?.get(context.len() - 1)?;
            let next = if temperature <= 0.0 {
                logits.argmax(0)?.to_scalar::<u32>()? as u8
            } else {
                let p = candle_nn::ops::softmax(&(logits / temperature)?, 0)?.to_vec1::<f32>()?;
                let u = unit(mix(mix(seed ^ SAMPLE_STREAM) ^ i as u64));
                let mut left = u * f64::from(p.iter().sum::<f32>());
                let mut pick = p.len() - 1;
                for (j, &pj) in p.iter().enumerate() {
                    left -= f64::from(pj);
                    if left < 0.0 {
                        pick = j;
                        break;
                    }
                }
                pick as u8
            };
            tokens.push(next);
        }
        Ok(tokens.split_off(start))
    }
}

/// The key streams of the counter-based generator: one for the windows, one for the initial
/// values, one for sampling.
const WINDOW_STREAM: u64 = 0x7769_6e64_6f77_7321;
const INIT_STREAM: u64 = 0x696e_6974_6961_6c21;
const SAMPLE_STREAM: u64 = 0x7361_6d70_6c65_7321;

/// SplitMix64's finaliser: the counter-based generator of this example.
fn mix(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in (0, 1) from 64 random bits.
fn unit(bits: u64) -> f64 {
    ((bits >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// Where window `row` of step `step` starts in a text of `len` bytes (windows of `width`
/// bytes): a hash of the seed, the step and the row, so any step's windows can be made alone.
pub(crate) fn window_offset(seed: u64, step: u64, row: u64, len: usize, width: usize) -> usize {
    let key = mix(mix(mix(seed ^ WINDOW_STREAM) ^ step) ^ row);
    (key % (len - width + 1) as u64) as usize
}

/// Step `step`'s `batch` windows of `block + 1` bytes from `text`, as `[batch, block + 1]` i64.
pub(crate) fn training_windows(
    text: &[u8],
    seed: u64,
    step: u64,
    batch: usize,
    block: usize,
) -> Vec<i64> {
    let width = block + 1;
    let mut out = Vec::with_capacity(batch * width);
    for row in 0..batch as u64 {
        let at = window_offset(seed, step, row, text.len(), width);
        out.extend(text[at..at + width].iter().map(|&b| i64::from(b)));
    }
    out
}

/// The held-out text as consecutive windows of `block + 1` bytes overlapping by one (each byte
/// after the first is a target once), `[n, block + 1]` i64; a tail shorter than a window is
/// left out.
pub(crate) fn held_out_windows(text: &[u8], block: usize) -> (usize, Vec<i64>) {
    let n = text.len().saturating_sub(1) / block;
    let mut out = Vec::with_capacity(n * (block + 1));
    for w in 0..n {
        out.extend(
            text[w * block..w * block + block + 1]
                .iter()
                .map(|&b| i64::from(b)),
        );
    }
    (n, out)
}

/// GPT-2's initial values for every variable of `model`, from `seed`: weights N(0, 0.02), the
/// `c_proj` weights N(0, 0.02/√(2·layers)), biases 0, layer-norm gains 1. Each value is a hash of
/// the seed, the variable's name and its index (Box–Muller), so it depends on nothing else.
pub(crate) fn initial_values<S: Strategy>(
    model: &Gpt2Model<'_, S>,
    layers: usize,
    seed: u64,
) -> Result<HashMap<String, Tensor>, Box<dyn Error>> {
    let mut values = HashMap::new();
    for var in model.variables() {
        let name = var.name.as_str();
        let count = var.elem_count();
        let is_norm = name.starts_with("ln_f.") || name.contains(".ln_");
        let data: Vec<f32> = if name.ends_with(".bias") {
            vec![0.0; count]
        } else if is_norm {
            vec![1.0; count]
        } else {
            let std = if name.ends_with("c_proj.weight") {
                INIT_STD / (2.0 * layers as f64).sqrt()
            } else {
                INIT_STD
            };
            // The variable's own stream, keyed by its name's FNV-1a.
            let name_key = Fnv::new().bytes(name.as_bytes()).0;
            let stream = mix(mix(seed ^ INIT_STREAM) ^ name_key);
            (0..count as u64)
                .map(|i| {
                    let a = mix(stream ^ i);
                    let (u1, u2) = (unit(a), unit(mix(a)));
                    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                    (z * std) as f32
                })
                .collect()
        };
        let value =
            Tensor::from_vec(data, var.shape.as_slice(), &Device::Cpu)?.to_dtype(var.dtype)?;
        values.insert(var.name.clone(), value);
    }
    Ok(values)
}

/// Which optimizer trains the model (`--optimizer`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum OptimizerKind {
    /// SGD (with `--weight-decay`, PyTorch's coupled decay).
    Sgd,
    /// AdamW with PyTorch's betas and eps.
    AdamW,
}

/// The data-parallel model of a run.
pub(crate) type Gpt2Model<'s, S> = DataParallel<'s, S, Gpt, AnyOptimizer>;

/// How to train.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Replicas of this process: on `/cpu:0` … unless `devices` names them.
    pub(crate) replicas: usize,
    /// `--devices`: the replicas' devices (`/gpu:0` needs the feature `cuda`); `None`:
    /// `replicas` CPU replicas.
    pub(crate) devices: Option<Vec<String>>,
    /// Training steps (the schedule's length).
    pub(crate) steps: usize,
    /// The model's shape (`--layers`, `--embd`, `--heads`, `--block`).
    pub(crate) model: GptConfig,
    /// Windows per step, over all replicas and workers.
    pub(crate) batch: usize,
    /// `--optimizer`.
    pub(crate) optimizer: OptimizerKind,
    /// `--lr` (default: AdamW 3e-3, SGD 0.3).
    pub(crate) lr: Option<f64>,
    /// `--weight-decay` (default: AdamW 0.01, SGD 0).
    pub(crate) weight_decay: Option<f64>,
    /// `--warmup`: 0 keeps the rate constant, else warmup then cosine decay to `steps`.
    pub(crate) warmup: u64,
    /// `--clip-norm`.
    pub(crate) clip_norm: Option<f64>,
    /// `--dropout`: the probability of every dropout site (0: none).
    pub(crate) dropout: f32,
    /// `--precision f32|bf16|f16`.
    pub(crate) precision: Precision,
    /// `--seed`: the initial values, the windows, the dropout masks and the sampler.
    pub(crate) seed: u64,
    /// Threads per replica.
    pub(crate) threads: CpuThreads,
    /// How long a replica or worker waits for the others.
    pub(crate) deadline: Duration,
    /// `--checkpoint-dir` and `--checkpoint-every`.
    pub(crate) checkpoints: Option<(PathBuf, u64)>,
    /// `--stop-after N`: stop once step N is done (the schedule still runs to `steps`).
    pub(crate) stop_after: Option<usize>,
    /// Keep a copy of every variable after step N ([`Trained::snapshot`]): a run of another
    /// replica count compares its first N steps with it (the demo's check).
    pub(crate) snapshot_after: Option<usize>,
    /// `--eval-every N`: also evaluate after every N steps (0: before and after training only).
    pub(crate) eval_every: usize,
    /// `--sample N`: bytes generated after training.
    pub(crate) sample: usize,
    /// `--prompt`.
    pub(crate) prompt: String,
    /// `--temperature` (0: greedy).
    pub(crate) temperature: f64,
    /// The text to learn; `None` reads the documentation under `corpus_root`.
    pub(crate) text: Option<Arc<Vec<u8>>>,
    /// `--corpus-root`: the workspace whose `docs/*.md` and `README.md` are read.
    pub(crate) corpus_root: PathBuf,
    /// Print each evaluation as it happens (the chief only).
    pub(crate) progress: bool,
}

impl Options {
    /// The optimizer's configuration.
    fn optimizer_config(&self) -> OptimizerConfig {
        match self.optimizer {
            OptimizerKind::Sgd => OptimizerConfig::Sgd(ParamsSgd {
                lr: self.lr.unwrap_or(0.3),
                weight_decay: self.weight_decay.unwrap_or(0.0),
                ..ParamsSgd::default()
            }),
            OptimizerKind::AdamW => {
                let defaults = ParamsAdamW::default();
                OptimizerConfig::AdamW(ParamsAdamW {
                    lr: self.lr.unwrap_or(3e-3),
                    weight_decay: self.weight_decay.unwrap_or(defaults.weight_decay),
                    ..defaults
                })
            }
        }
    }

    /// The learning-rate schedule: none without a warmup (or with fewer than 2 steps).
    fn schedule(&self) -> Result<Option<Schedule>, Box<dyn Error>> {
        // A cosine decay needs an update after the warmup: a run shorter than its warmup warms
        // up over all but its last update.
        let warmup = self.warmup.min((self.steps as u64).saturating_sub(1));
        if warmup == 0 {
            return Ok(None);
        }
        let lr = self.optimizer_config().lr();
        Ok(Some(Schedule::new(
            lr,
            warmup,
            self.steps as u64,
            Decay::Cosine,
        )?))
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            replicas: 2,
            devices: None,
            steps: 200,
            model: GptConfig {
                layers: 2,
                embd: 64,
                heads: 4,
                block: 64,
            },
            batch: 32,
            optimizer: OptimizerKind::AdamW,
            lr: None,
            weight_decay: None,
            warmup: 50,
            clip_norm: Some(1.0),
            dropout: 0.0,
            precision: Precision::Full,
            seed: 0,
            threads: CpuThreads::Auto,
            deadline: Duration::from_secs(300),
            checkpoints: None,
            stop_after: None,
            snapshot_after: None,
            eval_every: 50,
            sample: 0,
            prompt: "The ".to_owned(),
            temperature: 0.8,
            text: None,
            corpus_root: Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
            progress: false,
        }
    }
}

/// The training text: `docs/*.md` and `README.md` under `root`, concatenated in sorted path
/// order.
pub(crate) fn read_corpus(root: &Path) -> Result<Vec<u8>, Box<dyn Error>> {
    let docs = root.join("docs");
    let read_dir = std::fs::read_dir(&docs)
        .map_err(|e| format!("the training text: cannot list {}: {e}", docs.display()))?;
    let mut paths = vec![root.join("README.md")];
    for entry in read_dir {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md") {
            paths.push(path);
        }
    }
    paths.sort();
    let mut text = Vec::new();
    for path in paths {
        text.extend(
            std::fs::read(&path)
                .map_err(|e| format!("the training text: cannot read {}: {e}", path.display()))?,
        );
    }
    Ok(text)
}

/// One evaluation on the held-out text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Evaluation {
    /// Steps trained before it.
    pub(crate) step: usize,
    /// The mean next-byte loss, in nats.
    pub(crate) loss: f64,
    /// Bytes predicted.
    pub(crate) bytes: f64,
}

impl Evaluation {
    /// `exp(loss)`: the per-byte perplexity.
    pub(crate) fn perplexity(&self) -> f64 {
        self.loss.exp()
    }
}

/// What a training run ends with.
#[derive(Debug, Clone)]
pub(crate) struct Trained {
    /// Every variable's final value, flat, by name (`tests/gpt.rs` compares them; the program
    /// itself does not read them).
    #[allow(dead_code)]
    pub(crate) weights: BTreeMap<String, Vec<f32>>,
    /// Every variable's value after step [`Options::snapshot_after`], if this run trained it.
    #[allow(dead_code)]
    pub(crate) snapshot: Option<(usize, BTreeMap<String, Vec<f32>>)>,
    /// Each step's training loss (mean over the global batch's bytes), from `first_step` on.
    pub(crate) losses: Vec<f32>,
    /// The held-out evaluations, in order.
    pub(crate) evaluations: Vec<Evaluation>,
    /// The step this run started from: 0, or its checkpoint's.
    pub(crate) first_step: usize,
    /// Training tokens (bytes) per second over all replicas and workers (evaluation excluded).
    pub(crate) tokens_per_s: f64,
    /// The model's parameters.
    pub(crate) parameters: usize,
    /// The bytes of training and held-out text.
    pub(crate) text_bytes: (usize, usize),
    /// `--sample`'s bytes.
    pub(crate) sample: Vec<u8>,
    /// Threads each replica's kernels used.
    pub(crate) threads_per_replica: Option<usize>,
}

/// Trains on the replicas of this process: `options.devices`, or `options.replicas` CPUs.
pub(crate) fn train(options: &Options) -> Result<Trained, Box<dyn Error>> {
    let config = distribute_mirrored::MirroredConfig {
        deadline: options.deadline,
        ..Default::default()
    };
    let devices = match &options.devices {
        Some(devices) => LocalDevices::new(devices)?,
        None => LocalDevices::cpus(options.replicas),
    };
    let strategy = MirroredStrategy::with_config(devices, config)?;
    train_on(&strategy, options)
}

/// Trains as one worker of the MPI job this process belongs to; also the worker count and
/// whether this is the chief.
#[cfg(feature = "mpi")]
pub(crate) fn train_multi_worker(
    options: &Options,
) -> Result<(Trained, usize, bool), Box<dyn Error>> {
    use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
    let local_devices = match &options.devices {
        Some(devices) => LocalDevices::new(devices)?,
        None => LocalDevices::cpus(options.replicas),
    };
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices,
        deadline: options.deadline,
        ..MultiWorkerConfig::default()
    })?;
    let trained = train_on(&strategy, options)?;
    Ok((trained, strategy.num_workers(), strategy.is_chief()))
}

/// Under `mpirun` without the feature every process would train alone and print.
#[cfg(not(feature = "mpi"))]
pub(crate) fn train_multi_worker(
    _options: &Options,
) -> Result<(Trained, usize, bool), Box<dyn Error>> {
    Err(
        "started by mpirun, but built without the `mpi` feature: rebuild with \
         `--features mpi` (or use `cargo xtask launch -n W gpt`)"
            .into(),
    )
}

/// The held-out loss of `model` on `dataset` (the held-out windows, distributed).
fn evaluate<S: Strategy>(
    model: &Gpt2Model<'_, S>,
    dataset: &distribute_input::DistributedDataset<HostTensor>,
    step: usize,
) -> Result<Evaluation, Box<dyn Error>> {
    let metrics = model.evaluate(dataset.iter(), |gpt, _device, windows: Tensor| {
        let per_window = gpt.window_losses(&windows, None)?;
        let (rows, width) = windows.dims2()?;
        let mut metrics = Metrics::new();
        metrics
            .add_rows("loss", &per_window, None)?
            .add("bytes", (rows * (width - 1)) as f64);
        Ok(metrics)
    })?;
    Ok(Evaluation {
        step,
        loss: metrics.ratio("loss", "bytes").unwrap_or(f64::NAN),
        bytes: metrics.get("bytes").unwrap_or(0.0),
    })
}

/// Trains on `strategy`'s replicas.
pub(crate) fn train_on<S: Strategy>(
    strategy: &S,
    options: &Options,
) -> Result<Trained, Box<dyn Error>> {
    let shape = options.model;
    if shape.layers == 0 || shape.embd == 0 || shape.heads == 0 || shape.block == 0 {
        return Err("--layers, --embd, --heads and --block must be positive".into());
    }
    if !shape.embd.is_multiple_of(shape.heads) {
        return Err(format!(
            "--embd {} is not a multiple of --heads {}",
            shape.embd, shape.heads
        )
        .into());
    }
    let replicas = strategy.num_replicas_in_sync();
    if options.batch < replicas {
        return Err(format!(
            "--batch {} gives some of the {replicas} replicas no window",
            options.batch
        )
        .into());
    }
    let text = match &options.text {
        Some(text) => Arc::clone(text),
        None => Arc::new(read_corpus(&options.corpus_root)?),
    };
    let split = text.len() * 9 / 10;
    let (train_text, held_text) = (Arc::new(text[..split].to_vec()), &text[split..]);
    let width = shape.block + 1;
    if train_text.len() < width || held_text.len() < width {
        return Err(format!(
            "the text ({} bytes) is too short for windows of {width} bytes",
            text.len()
        )
        .into());
    }

    let config = Config {
        threads: options.threads,
        schedule: options.schedule()?,
        clip_norm: options.clip_norm,
        precision: options.precision,
        seed: options.seed,
        ..Config::default()
    };
    let model = DataParallel::new(
        strategy,
        config,
        |vb| Gpt::new(shape, vb),
        |vars| AnyOptimizer::new(vars, options.optimizer_config()),
    )?;
    model.assign(initial_values(&model, shape.layers, options.seed)?)?;
    let checkpoints = match &options.checkpoints {
        Some((dir, every)) => Some(Checkpoints::new(
            dir,
            CheckpointOptions {
                every: *every,
                keep: 2,
            },
        )?),
        None => None,
    };
    let resume = match &checkpoints {
        Some(checkpoints) => checkpoints.restore(strategy, &[&model])?,
        None => None,
    };
    let first_step = resume.as_ref().map_or(0, |r| r.step as usize);

    // Step s's windows are made when the input pipeline reaches it (a resumed run skips the
    // steps before its checkpoint's).
    let (seed, batch, block, steps) = (options.seed, options.batch, shape.block, options.steps);
    let source = GeneratorSource::new(move || {
        let text = Arc::clone(&train_text);
        (0..steps as u64).map(move |s| {
            let windows = training_windows(&text, seed, s, batch, block);
            Ok(HostTensor::from_vec("/cpu:0", &[batch, width], windows)?)
        })
    });
    let dataset = Dataset::from_source(source).batch(batch, false)?;
    let dataset = strategy
        .distribute_dataset(dataset, InputOptions::default())?
        .resume_from(resume.map_or(InputPosition::at_step(0), |r| r.input));
    let (windows, held) = held_out_windows(held_text, block);
    let held_out = Dataset::from_tensors(HostTensor::from_vec("/cpu:0", &[windows, width], held)?)?
        .batch(batch, false)?;
    let held_out = strategy.distribute_dataset(held_out, InputOptions::default())?;

    let chief = strategy.extended().should_checkpoint();
    let report = |e: &Evaluation| {
        if options.progress && chief {
            println!(
                "step {:>5}: held-out loss {:.4} (perplexity {:.2}) over {} bytes",
                e.step,
                e.loss,
                e.perplexity(),
                e.bytes
            );
        }
    };
    let mut evaluations = vec![evaluate(&model, &held_out, first_step)?];
    report(&evaluations[0]);

    let p = options.dropout;
    let tokens_per_step = (batch * block) as f64;
    let mut local_losses = Vec::with_capacity(steps);
    let mut snapshot = None;
    let mut training = Duration::ZERO;
    let last = options.stop_after.map_or(steps, |s| s.min(steps));
    let todo = last.saturating_sub(first_step);
    for (step, windows) in (first_step + 1..).zip(dataset.iter().take(todo)) {
        let start = Instant::now();
        let losses = model.run(&windows?, |replica, windows| {
            let loss = {
                let dropout =
                    |xs: &Tensor| -> Result<Tensor, StepError> { Ok(replica.dropout(xs, p)?) };
                let dropout: Dropout<'_> = if p > 0.0 { Some(&dropout) } else { None };
                // This replica's share of the mean over the global batch's bytes, reduced with
                // Sum.
                let summed = replica
                    .model()
                    .window_losses(&windows, dropout)?
                    .sum_all()?;
                (summed / tokens_per_step)?
            };
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok(loss.to_scalar::<f32>()?)
        })?;
        training += start.elapsed();
        local_losses.push(losses.iter().sum::<f32>());
        if options.snapshot_after == Some(step) {
            snapshot = Some((step, weights(&model)?));
        }
        if let Some(checkpoints) = &checkpoints
            && checkpoints.is_due(step as u64)
        {
            let at = InputPosition::at_step(step as u64);
            checkpoints.save(strategy, step as u64, &[&model], at)?;
        }
        if step == last || (options.eval_every > 0 && step.is_multiple_of(options.eval_every)) {
            let evaluation = evaluate(&model, &held_out, step)?;
            report(&evaluation);
            evaluations.push(evaluation);
        }
    }
    let tokens_per_s = if training.is_zero() {
        0.0
    } else {
        local_losses.len() as f64 * tokens_per_step / training.as_secs_f64()
    };
    model.check_in_sync()?;

    // Every worker's share of each step's loss, added up once at the end.
    let losses = model.run(&(), |replica, ()| {
        let mine = if replica.local_replica() == 0 {
            local_losses.clone()
        } else {
            vec![0.0; local_losses.len()]
        };
        let device = replica.context().device().to_owned();
        let total = replica.context().all_reduce(
            ReduceOp::Sum,
            &HostTensor::from_vec(&device, &[mine.len()], mine)?,
        )?;
        Ok(total.to_vec::<f32>()?)
    })?;
    let sample = if options.sample > 0 {
        model.with_model(0, |gpt| {
            gpt.generate(
                options.prompt.as_bytes(),
                options.sample,
                options.temperature,
                options.seed,
            )
        })?
    } else {
        Vec::new()
    };
    Ok(Trained {
        parameters: model.variables().iter().map(|v| v.elem_count()).sum(),
        weights: weights(&model)?,
        snapshot,
        losses: losses.into_iter().next().unwrap_or_default(),
        evaluations,
        first_step,
        tokens_per_s,
        text_bytes: (split, text.len() - split),
        sample,
        threads_per_replica: model.threads_per_replica(),
    })
}

/// Every variable of replica 0's copy of `model`, flat in f32, by name.
fn weights<S: Strategy>(
    model: &Gpt2Model<'_, S>,
) -> Result<BTreeMap<String, Vec<f32>>, Box<dyn Error>> {
    let mut weights = BTreeMap::new();
    for var in model.variables() {
        let value = model.variable(0, &var.name)?;
        weights.insert(
            var.name.clone(),
            value
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
    }
    Ok(weights)
}

/// Whether `mpirun` (Open MPI's, or an MPICH-style launcher's) started this process.
fn started_by_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .any(|name| std::env::var_os(name).is_some())
}

/// The command line.
fn parse_args() -> Result<(Options, bool), Box<dyn Error>> {
    const USAGE: &str = "usage: gpt [--replicas R | --devices LIST] [--steps N] [--layers L] [--embd E] \
                         [--heads H] [--block T] [--batch B] [--optimizer adamw|sgd] [--lr X] \
                         [--weight-decay X] [--warmup W] [--clip-norm X] [--dropout P] \
                         [--precision f32|bf16|f16] [--seed S] [--threads T] [--deadline SECS] \
                         [--checkpoint-dir DIR] [--checkpoint-every N] [--stop-after N] \
                         [--eval-every N] [--sample N] [--prompt TEXT] [--temperature X] \
                         [--corpus-root DIR] [--json]";
    let mut checkpoint_dir = None;
    let mut checkpoint_every = None;
    let mut options = Options::default();
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| {
            args.next()
                .ok_or_else(|| format!("{arg} needs {what}; {USAGE}"))
        };
        match arg.as_str() {
            "--replicas" | "--layers" | "--embd" | "--heads" | "--block" | "--batch" => {
                let n = value("a positive number")?
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("{arg} needs a positive number"))?;
                match arg.as_str() {
                    "--replicas" => options.replicas = n,
                    "--layers" => options.model.layers = n,
                    "--embd" => options.model.embd = n,
                    "--heads" => options.model.heads = n,
                    "--block" => options.model.block = n,
                    _ => options.batch = n,
                }
            }
            "--steps" | "--eval-every" | "--sample" | "--stop-after" => {
                let n = value("a number")?
                    .parse::<usize>()
                    .map_err(|_| format!("{arg} needs a number"))?;
                match arg.as_str() {
                    "--steps" => options.steps = n,
                    "--eval-every" => options.eval_every = n,
                    "--sample" => options.sample = n,
                    _ => options.stop_after = Some(n),
                }
            }
            "--devices" => {
                let list: Vec<String> = value("a list such as /gpu:0 or /cpu:0,/cpu:1")?
                    .split(',')
                    .map(|d| d.trim().to_owned())
                    .filter(|d| !d.is_empty())
                    .collect();
                if list.is_empty() {
                    return Err("--devices needs at least one device, e.g. /gpu:0".into());
                }
                options.replicas = list.len();
                options.devices = Some(list);
            }
            "--threads" => {
                let n: NonZeroUsize = value("a positive number")?
                    .parse()
                    .map_err(|_| "--threads needs a positive number")?;
                options.threads = CpuThreads::PerReplica(n);
            }
            "--deadline" => {
                options.deadline = value("a number of seconds")?
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 1e9)
                    .map(Duration::from_secs_f64)
                    .ok_or("--deadline needs a number of seconds from 0.1 on")?;
            }
            "--optimizer" => {
                options.optimizer = match value("adamw or sgd")?.as_str() {
                    "sgd" => OptimizerKind::Sgd,
                    "adamw" => OptimizerKind::AdamW,
                    other => return Err(format!("--optimizer {other}: adamw or sgd").into()),
                };
            }
            "--lr" | "--weight-decay" | "--clip-norm" | "--temperature" => {
                let x = value("a number")?
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| format!("{arg} needs a finite number ≥ 0"))?;
                match arg.as_str() {
                    "--lr" => options.lr = Some(x),
                    "--weight-decay" => options.weight_decay = Some(x),
                    "--clip-norm" => options.clip_norm = (x > 0.0).then_some(x),
                    _ => options.temperature = x,
                }
            }
            "--dropout" => {
                options.dropout = value("a probability")?
                    .parse::<f32>()
                    .ok()
                    .filter(|p| (0.0..1.0).contains(p))
                    .ok_or("--dropout needs a probability in [0, 1)")?;
            }
            "--warmup" => {
                options.warmup = value("a number of updates")?
                    .parse()
                    .map_err(|_| "--warmup needs a number of updates")?;
            }
            "--seed" => {
                options.seed = value("a number")?
                    .parse()
                    .map_err(|_| "--seed needs a number")?;
            }
            "--precision" => {
                options.precision = match value("f32, bf16 or f16")?.as_str() {
                    "f32" => Precision::Full,
                    "bf16" => Precision::MixedBf16,
                    "f16" => Precision::MixedF16,
                    other => {
                        return Err(format!("--precision {other}: f32, bf16 or f16").into());
                    }
                };
            }
            "--prompt" => options.prompt = value("a text")?,
            "--corpus-root" => options.corpus_root = PathBuf::from(value("a directory")?),
            "--checkpoint-dir" => checkpoint_dir = Some(PathBuf::from(value("a directory")?)),
            "--checkpoint-every" => {
                checkpoint_every = Some(
                    value("a positive number")?
                        .parse::<u64>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or("--checkpoint-every needs a positive number")?,
                );
            }
            "--json" => json = true,
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}'; {USAGE}").into()),
        }
    }
    options.checkpoints = match (checkpoint_dir, checkpoint_every) {
        (Some(dir), every) => Some((dir, every.unwrap_or(100))),
        (None, Some(_)) => return Err("--checkpoint-every needs --checkpoint-dir".into()),
        (None, None) => None,
    };
    options.progress = !json;
    Ok((options, json))
}

fn main() -> Result<(), Box<dyn Error>> {
    let (options, json) = parse_args()?;
    let started = Instant::now();
    let (trained, workers, chief) = if started_by_mpirun() {
        train_multi_worker(&options)?
    } else {
        (train(&options)?, 1, true)
    };
    if !chief {
        // Every worker holds the same weights; the chief speaks for all.
        return Ok(());
    }
    let sample = String::from_utf8_lossy(&trained.sample).into_owned();
    let threads = trained
        .threads_per_replica
        .map_or_else(|| "unmanaged".to_owned(), |t| t.to_string());
    if json {
        let evaluations: Vec<_> = trained
            .evaluations
            .iter()
            .map(|e| {
                serde_json::json!({
                    "step": e.step, "loss": e.loss, "perplexity": e.perplexity(), "bytes": e.bytes,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "workers": workers, "replicas": options.replicas, "steps": options.steps,
                "layers": options.model.layers, "embd": options.model.embd,
                "heads": options.model.heads, "block": options.model.block,
                "batch": options.batch, "parameters": trained.parameters,
                "text_bytes": [trained.text_bytes.0, trained.text_bytes.1],
                "threads_per_replica": trained.threads_per_replica,
                "losses": trained.losses, "evaluations": evaluations,
                "tokens_per_s": trained.tokens_per_s, "first_step": trained.first_step,
                "sample": sample, "seconds": started.elapsed().as_secs_f64(),
            })
        );
        return Ok(());
    }
    let first = trained.losses.first().copied().unwrap_or(f32::NAN);
    let last = trained.losses.last().copied().unwrap_or(f32::NAN);
    let (before, after) = (
        trained.evaluations.first(),
        trained
            .evaluations
            .last()
            .filter(|_| trained.evaluations.len() > 1),
    );
    println!(
        "{workers} worker(s) × {} replicas ({threads} threads each), {} parameters, text {} + {} \
         bytes held out; steps {}..{}: training loss {first:.4} → {last:.4}, {:.0} tokens/s",
        options.replicas,
        trained.parameters,
        trained.text_bytes.0,
        trained.text_bytes.1,
        trained.first_step,
        trained.first_step + trained.losses.len(),
        trained.tokens_per_s
    );
    if let (Some(before), Some(after)) = (before, after) {
        println!(
            "held-out loss {:.4} → {:.4} nats/byte (perplexity {:.2} → {:.2}); every copy \
             bit-identical (check_in_sync); {:.1} s in all",
            before.loss,
            after.loss,
            before.perplexity(),
            after.perplexity(),
            started.elapsed().as_secs_f64()
        );
    }
    if options.sample > 0 {
        println!(
            "sample ({} bytes after {:?}):",
            options.sample, options.prompt
        );
        println!("{}{sample}", options.prompt);
    }
    Ok(())
}
