//! Distributed evaluation: [`DataParallel::evaluate`] runs a metric step over a whole distributed
//! dataset on every replica and worker and sums the step's [`Metrics`] over all of them; and the
//! all-reduce helpers for metrics inside a step ([`all_reduce_scalars`], [`all_reduce_tensors`]
//! and their one-value forms), which spare a step the conversions between candle tensors, f64
//! scalars and the strategy's host tensors.

use std::fmt;

use candle_core::{DType, Device};
use candle_nn::Optimizer;
use distribute_strategy::{ReplicaContext, Strategy, StrategyError};
use distribute_tensor::{Fnv, Tensor};
use distribute_values::{Distributed, Lock, Nest, ReduceOp, ValuesError, select_replica};

use crate::data_parallel::DataParallel;
use crate::error::{Error, StepError, outside_step};
use crate::{ToCandle, from_candle, to_candle};

/// Named f64 sums, in the order their names were first added: what an evaluation step returns
/// for its replica's batch and what [`DataParallel::evaluate`] returns for the whole dataset
/// (correct predictions, real rows, the summed loss, …).
///
/// Every step of every replica must return the same names in the same order, or none at all
/// (`Metrics::new()`, which adds nothing): the sums travel between replicas as one f64 vector,
/// and a replica whose names differ is an error naming it. Counts are exact up to 2⁵³.
///
/// ```
/// use distribute_candle::Metrics;
///
/// let mut metrics = Metrics::new();
/// metrics.add("correct", 3.0).add("total", 4.0);
/// metrics.add("correct", 1.0);
/// assert_eq!(metrics["correct"], 4.0);
/// assert_eq!(metrics.ratio("correct", "total"), Some(1.0));
/// assert_eq!(metrics.to_string(), "correct=4 total=4");
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    names: Vec<String>,
    values: Vec<f64>,
}

impl Metrics {
    /// No metrics.
    pub fn new() -> Self {
        Metrics::default()
    }

    /// Adds `value` to the sum named `name`, which is appended (starting at 0) when new.
    pub fn add(&mut self, name: &str, value: f64) -> &mut Self {
        match self.names.iter().position(|n| n == name) {
            Some(i) => self.values[i] += value,
            None => {
                self.names.push(name.to_owned());
                self.values.push(value);
            }
        }
        self
    }

    /// `self` with `value` added to `name`: [`add`](Self::add) for building in one expression.
    pub fn with(mut self, name: &str, value: f64) -> Self {
        self.add(name, value);
        self
    }

    /// Adds to `name` the sum, in f64, of every element of `per_row`'s real rows: the rows whose
    /// `mask` entry is not 0 (every row without a mask). `per_row` is `[rows, …]` of any
    /// candle dtype (a per-row loss, a 0/1 "correct" per row); `mask` is `[rows]`, as
    /// [`CandleMasked::mask`](crate::CandleMasked) is for a batch that
    /// `PartialBatch::PadWithMask` padded. A padded row is skipped, not multiplied by 0, so a
    /// NaN or infinity computed from its zeros never reaches the sum. The rows are added in
    /// order; a rank-0 `per_row` without a mask adds its one value.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use distribute_candle::Metrics;
    ///
    /// let loss = Tensor::new(&[0.5f32, 1.5, f32::NAN], &Device::Cpu)?;
    /// let mask = Tensor::new(&[1.0f32, 1.0, 0.0], &Device::Cpu)?;
    /// let mut metrics = Metrics::new();
    /// metrics.add_rows("loss", &loss, Some(&mask))?.count_rows("total", &loss, Some(&mask))?;
    /// assert_eq!(metrics, Metrics::new().with("loss", 2.0).with("total", 2.0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_rows(
        &mut self,
        name: &str,
        per_row: &candle_core::Tensor,
        mask: Option<&candle_core::Tensor>,
    ) -> Result<&mut Self, Error> {
        if per_row.rank() == 0 {
            if mask.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "metric '{name}': a masked value needs a row dimension, but it is a scalar"
                )));
            }
            return Ok(self.add(name, per_row.to_dtype(DType::F64)?.to_scalar::<f64>()?));
        }
        let rows = per_row.dim(0)?;
        let real = real_rows(name, rows, mask)?;
        let values = per_row
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        // Row by row in order, from +0 (an iterator's f64 sum starts at -0).
        let width = values.len().checked_div(rows).unwrap_or(0).max(1);
        let mut sum = 0.0;
        for (chunk, real) in values.chunks(width).zip(&real) {
            if *real {
                sum = chunk.iter().fold(sum, |sum, value| sum + value);
            }
        }
        Ok(self.add(name, sum))
    }

    /// Adds to `name` the number of `batch`'s real rows: those whose `mask` entry is not 0, or
    /// every row (`batch.dim(0)`) without a mask. `batch` is any tensor of the batch
    /// (`[rows, …]`); the mask must have as many entries as it has rows.
    pub fn count_rows(
        &mut self,
        name: &str,
        batch: &candle_core::Tensor,
        mask: Option<&candle_core::Tensor>,
    ) -> Result<&mut Self, Error> {
        if batch.rank() == 0 {
            return Err(Error::InvalidArgument(format!(
                "metric '{name}': rows are counted along the first dimension, but the tensor is \
                 a scalar"
            )));
        }
        let real = real_rows(name, batch.dim(0)?, mask)?;
        let count = real.iter().filter(|r| **r).count();
        Ok(self.add(name, count as f64))
    }

    /// The sum named `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        let i = self.names.iter().position(|n| n == name)?;
        Some(self.values[i])
    }

    /// `numerator / denominator` of two sums (accuracy as `correct / total`, the mean loss as
    /// `loss / total`); `None` when either is missing. A zero denominator gives what f64
    /// division gives (NaN or an infinity).
    pub fn ratio(&self, numerator: &str, denominator: &str) -> Option<f64> {
        Some(self.get(numerator)? / self.get(denominator)?)
    }

    /// The names, in order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// The sums, in the names' order.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// `(name, sum)` pairs, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, f64)> {
        self.names
            .iter()
            .map(String::as_str)
            .zip(self.values.iter().copied())
    }

    /// How many sums there are.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Adds `other`'s sums to these, name by name. Empty metrics (either side) add nothing;
    /// otherwise both must have the same names in the same order, as the steps of one
    /// evaluation do, else [`Error::InvalidArgument`] says how they differ.
    pub fn merge(&mut self, other: &Metrics) -> Result<(), Error> {
        if other.is_empty() {
            return Ok(());
        }
        if self.is_empty() {
            *self = other.clone();
            return Ok(());
        }
        if self.names != other.names {
            return Err(Error::InvalidArgument(format!(
                "a step returned the metrics {:?} after {:?}: every step must return the same \
                 names in the same order (or none)",
                other.names, self.names
            )));
        }
        for (sum, value) in self.values.iter_mut().zip(&other.values) {
            *sum += value;
        }
        Ok(())
    }

    /// These sums reduced with `op` over every replica of every worker, inside a step: every
    /// replica must call it in the same step, and every replica gets the same bits.
    ///
    /// The names must be the same, in the same order, on every replica that has any; a replica
    /// whose names differ is an [`Error::InvalidArgument`] naming it and the replica it differs
    /// from, on every replica. A replica with no metrics at all (one that saw no rows) counts as
    /// zeros under the others' names: with `Sum` it adds nothing (with `Mean`, `Min` or `Max`
    /// its zeros count). When no replica has any, the result is empty.
    ///
    /// Two collectives, three when some replica has no metrics: the names' fingerprints (a
    /// 64-bit FNV-1a, the count and the encoded length, per replica), the names themselves for
    /// the replicas without, then the sums as one f64 vector.
    pub fn all_reduce(&self, ctx: &ReplicaContext<'_>, op: ReduceOp) -> Result<Metrics, Error> {
        let replicas = ctx.num_replicas_in_sync();
        let me = ctx.replica_id();
        let encoded = self.encoded_names();
        // Each replica writes its fingerprint into its own slots; the sum gives everyone's.
        // Every slot is below 2^32 (the hash in two halves): exact in f64.
        let mut slots = vec![0.0f64; SLOTS * replicas];
        slots[SLOTS * me..SLOTS * (me + 1)].copy_from_slice(&fingerprint(&encoded, self.len()));
        let all = all_reduce_scalars(ctx, ReduceOp::Sum, &slots)?;
        let of = |r: usize| &all[SLOTS * r..SLOTS * (r + 1)];
        let named: Vec<usize> = (0..replicas).filter(|&r| of(r)[2] > 0.0).collect();
        let Some(&first) = named.first() else {
            return Ok(Metrics::new());
        };
        if let Some(&other) = named.iter().find(|&&r| of(r) != of(first)) {
            return Err(Error::InvalidArgument(format!(
                "replica {other}'s metrics ({} names) differ from replica {first}'s ({} names) \
                 in their names or their order; replica {me} has {:?}: every replica's step \
                 must return the same names in the same order",
                of(other)[2],
                of(first)[2],
                self.names,
            )));
        }
        let names = if named.len() == replicas {
            self.names.clone()
        } else {
            // Replica `first` sends its names (a sum where every other replica adds zeros) to
            // the replicas that have none.
            let mut bytes = vec![0.0f64; of(first)[3] as usize];
            if me == first {
                for (slot, byte) in bytes.iter_mut().zip(&encoded) {
                    *slot = f64::from(*byte);
                }
            }
            let bytes = all_reduce_scalars(ctx, ReduceOp::Sum, &bytes)?;
            let bytes: Vec<u8> = bytes.iter().map(|b| *b as u8).collect();
            decode_names(&bytes)
                .filter(|_| fingerprint(&bytes, 0)[..2] == of(first)[..2])
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "replica {me} received replica {first}'s metric names garbled"
                    ))
                })?
        };
        let mine = if self.is_empty() {
            vec![0.0; names.len()]
        } else {
            self.values.clone()
        };
        let values = all_reduce_scalars(ctx, op, &mine)?;
        Ok(Metrics { names, values })
    }

    /// The names, each as its length (4 bytes, little-endian) and its UTF-8 bytes.
    fn encoded_names(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for name in &self.names {
            bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
            bytes.extend_from_slice(name.as_bytes());
        }
        bytes
    }
}

/// The slots of one replica's fingerprint in [`Metrics::all_reduce`]'s first exchange.
const SLOTS: usize = 4;

/// The encoded names' 64-bit FNV-1a in two 32-bit halves, how many names, and how many bytes,
/// as f64 (each exact).
fn fingerprint(encoded: &[u8], names: usize) -> [f64; SLOTS] {
    let hash = Fnv::new().bytes(encoded).0;
    [
        (hash >> 32) as f64,
        (hash & 0xffff_ffff) as f64,
        names as f64,
        encoded.len() as f64,
    ]
}

/// The names [`Metrics::encoded_names`] encoded; `None` when the bytes are not such.
fn decode_names(mut bytes: &[u8]) -> Option<Vec<String>> {
    let mut names = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        let name = rest.get(..len)?;
        names.push(String::from_utf8(name.to_vec()).ok()?);
        bytes = &rest[len..];
    }
    Some(names)
}

/// Which of `rows` rows are real: the mask's nonzero entries, or all of them without a mask.
fn real_rows(
    name: &str,
    rows: usize,
    mask: Option<&candle_core::Tensor>,
) -> Result<Vec<bool>, Error> {
    let Some(mask) = mask else {
        return Ok(vec![true; rows]);
    };
    let mask = mask.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    if mask.len() != rows {
        return Err(Error::InvalidArgument(format!(
            "metric '{name}': the mask has {} entries but the tensor has {rows} rows",
            mask.len()
        )));
    }
    Ok(mask.iter().map(|m| *m != 0.0).collect())
}

/// `metrics["name"]`: the sum named `name`. Panics when there is none (see [`Metrics::get`]).
impl std::ops::Index<&str> for Metrics {
    type Output = f64;

    fn index(&self, name: &str) -> &f64 {
        match self.names.iter().position(|n| n == name) {
            Some(i) => &self.values[i],
            None => panic!(
                "no metric named '{name}' (the metrics are {:?})",
                self.names
            ),
        }
    }
}

/// `name=value` pairs separated by spaces, in order.
impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{name}={value}")?;
        }
        Ok(())
    }
}

/// Metrics from `(name, value)` pairs, added in order (a repeated name adds to its sum).
impl<N: AsRef<str>> FromIterator<(N, f64)> for Metrics {
    fn from_iter<I: IntoIterator<Item = (N, f64)>>(pairs: I) -> Self {
        let mut metrics = Metrics::new();
        for (name, value) in pairs {
            metrics.add(name.as_ref(), value);
        }
        metrics
    }
}

impl<S, M, O> DataParallel<'_, S, M, O>
where
    S: Strategy,
    M: Send,
    O: Optimizer + Send,
{
    /// Evaluates the model on a whole distributed dataset: runs `step` on every replica for
    /// every step of `steps` (the inputs [`run`](Self::run) takes, each a `Result`, as a
    /// `DistributedDataset`'s `iter()` and `iter_masked()` yield them), and returns the sum of
    /// every step's [`Metrics`] over all replicas of all workers, the same bits on every
    /// replica and worker.
    ///
    /// `step` gets the replica's copy of the model (shared: no optimizer, no update), its
    /// device and its input as candle values ([`ToCandle`]). With `PartialBatch::PadWithMask`
    /// (`iter_masked()`) the input is a [`CandleMasked`](crate::CandleMasked) whose mask marks
    /// the padding rows, which [`Metrics::add_rows`] and [`Metrics::count_rows`] skip: every
    /// row of the dataset counts exactly once however the last global batch divides. With the
    /// default `KeepUneven` (`iter()`, `&dataset`) a replica gets uneven batches, every row of
    /// them real, or empty ones: a replica whose input has no rows (every tensor 0 rows) does
    /// not run `step` for that step (candle's reductions refuse empty tensors) and adds
    /// nothing. Every step must return the same names in the same order, or none
    /// (`Metrics::new()`), which adds nothing; a replica that never returned any counts as
    /// zeros.
    ///
    /// Each replica adds its steps' metrics in step order, in f64; one all-reduce at the end
    /// adds the replicas' sums in the strategy's fixed order. Counts (rows, correct
    /// predictions) are exact up to 2⁵³ on any replica and worker count; sums of other values
    /// (a loss) are exact while they fit f64's 53 bits: n f32 values do while the largest is
    /// at most 2²⁹/n times the smallest nonzero one (a million losses within a factor of 500).
    /// Otherwise they are rounded identically on every replica and worker, but not always as
    /// another replica count rounds them.
    ///
    /// Errors: a step's error (candle's, the user's, through `?`) is [`Error::Replica`] naming
    /// the replica, as in `run`; metric names that differ between steps or replicas are
    /// [`Error::InvalidArgument`] naming the replica, inside an `Error::Replica`; an input
    /// error ends the evaluation with it ([`Error::Strategy`]). Called from inside a step it is
    /// [`Error::InStep`]. Every worker must call it with the same dataset (one `run` per step
    /// of data, then one exchange), as for training.
    ///
    /// ```
    /// use candle_core::{D, DType, Tensor};
    /// use candle_nn::{Module, Optimizer, SGD, VarBuilder};
    /// use distribute_candle::{CandleMasked, Config, DataParallel, Metrics};
    /// use distribute_input::{Dataset, InputOptions, PartialBatch};
    /// use distribute_mirrored::MirroredStrategy;
    /// use distribute_strategy::Strategy;
    /// use distribute_tensor::Tensor as HostTensor;
    ///
    /// let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
    /// let model = DataParallel::new(
    ///     &strategy,
    ///     Config::default(),
    ///     |vb: VarBuilder| candle_nn::linear(3, 2, vb.pp("l1")),
    ///     |vars| SGD::new(vars, 0.1),
    /// )?;
    /// // 7 rows in global batches of 4: the last batch is padded to 4 rows, 1 of them real.
    /// let x = HostTensor::from_vec("/cpu:0", &[7, 3], (0..21).map(|v| v as f32).collect())?;
    /// let y = HostTensor::from_vec("/cpu:0", &[7], vec![0i64, 1, 0, 1, 0, 1, 0])?;
    /// let dataset = Dataset::from_tensors((x, y))?.batch(4, false)?;
    /// let options = InputOptions { partial_batch: PartialBatch::PadWithMask, ..Default::default() };
    /// let dataset = strategy.distribute_dataset(dataset, options)?;
    ///
    /// let metrics = model.evaluate(dataset.iter_masked(), |model, _device, batch| {
    ///     let CandleMasked { batch: (x, y), mask } = batch;
    ///     let logits = model.forward(&x)?;
    ///     let y = y.to_dtype(DType::U32)?;
    ///     let loss = candle_nn::ops::log_softmax(&logits, D::Minus1)?
    ///         .gather(&y.unsqueeze(1)?, 1)?
    ///         .neg()?;
    ///     let correct = logits.argmax(D::Minus1)?.eq(&y)?;
    ///     let mut metrics = Metrics::new();
    ///     metrics
    ///         .add_rows("correct", &correct, Some(&mask))?
    ///         .add_rows("loss", &loss, Some(&mask))?
    ///         .count_rows("total", &x, Some(&mask))?;
    ///     Ok(metrics)
    /// })?;
    /// assert_eq!(metrics["total"], 7.0);
    /// let accuracy = metrics.ratio("correct", "total").unwrap();
    /// assert!((0.0..=1.0).contains(&accuracy));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn evaluate<I, D, E, F>(&self, steps: I, step: F) -> Result<Metrics, Error>
    where
        I: IntoIterator<Item = Result<D, E>>,
        E: Into<StrategyError>,
        D: Distributed + Sync,
        D::Local: ToCandle + Nest,
        F: Fn(&M, &Device, <D::Local as ToCandle>::Candle) -> Result<Metrics, StepError> + Sync,
    {
        outside_step("evaluate")?;
        let replicas = self.strategy().extended().local_devices().len();
        // Each local replica's sums so far, in step order; each replica's thread takes only its
        // own (the lock is never contended).
        let sums: Vec<Lock<Metrics>> = (0..replicas).map(|_| Lock::new(Metrics::new())).collect();
        for input in steps {
            let input = input.map_err(|e| Error::Strategy(e.into()))?;
            let empty: Vec<bool> = (0..replicas)
                .map(|r| {
                    select_replica::<D::Local>(r, &input).is_ok_and(|local| has_no_rows(&local))
                })
                .collect();
            self.run(&input, |replica, batch| {
                let r = replica.local_replica();
                if !empty[r] {
                    let metrics = step(replica.model(), replica.device(), batch)?;
                    sums[r].lock().merge(&metrics)?;
                }
                Ok(())
            })?;
        }
        let reduced = self.run(&(), |replica, ()| {
            let mine = sums[replica.local_replica()].lock().clone();
            Ok(mine.all_reduce(replica.context(), ReduceOp::Sum)?)
        })?;
        Ok(reduced.into_iter().next().unwrap_or_default())
    }
}

/// Whether `input` is a batch without rows: it has tensors, and every one has 0 rows.
fn has_no_rows<T: Nest>(input: &T) -> bool {
    let (mut tensors, mut empty) = (0, 0);
    let walked = input.for_each_leaf(|_, tensor: &Tensor| {
        tensors += 1;
        if tensor.shape().first() == Some(&0) {
            empty += 1;
        }
        Ok::<_, ValuesError>(())
    });
    walked.is_ok() && tensors > 0 && empty == tensors
}

/// `values` reduced with `op` over every replica of every worker, inside a step: one collective
/// of one f64 tensor, the same bits on every replica. Every replica must call it in the same
/// step with as many values.
///
/// ```
/// use distribute_candle::{Config, DataParallel, all_reduce_scalars};
/// use distribute_mirrored::MirroredStrategy;
/// use distribute_values::ReduceOp;
///
/// let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
/// let model = DataParallel::new(
///     &strategy,
///     Config::default(),
///     |vb: candle_nn::VarBuilder| candle_nn::linear(3, 1, vb.pp("l1")),
///     |vars| <candle_nn::SGD as candle_nn::Optimizer>::new(vars, 0.1),
/// )?;
/// let sums = model.run(&(), |replica, ()| {
///     let mine = [1.0, replica.replica_id() as f64];
///     Ok(all_reduce_scalars(replica.context(), ReduceOp::Sum, &mine)?)
/// })?;
/// assert_eq!(sums, [[2.0, 1.0], [2.0, 1.0]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn all_reduce_scalars(
    ctx: &ReplicaContext<'_>,
    op: ReduceOp,
    values: &[f64],
) -> Result<Vec<f64>, Error> {
    let tensor = Tensor::from_vec(ctx.device(), &[values.len()], values.to_vec())?;
    Ok(ctx.all_reduce(op, &tensor)?.to_vec::<f64>()?)
}

/// `value` reduced with `op` over every replica of every worker, inside a step
/// ([`all_reduce_scalars`] of one value).
pub fn all_reduce_scalar(ctx: &ReplicaContext<'_>, op: ReduceOp, value: f64) -> Result<f64, Error> {
    Ok(all_reduce_scalars(ctx, op, &[value])?[0])
}

/// Candle `tensors` reduced with `op` over every replica of every worker, inside a step, in one
/// collective: each result has its tensor's shape and dtype and lies on its device. Every
/// replica must call it in the same step with tensors of the same shapes and dtypes (f16,
/// bf16, f32, f64, i32 or i64; another is [`Error::UnsupportedDType`]). The tensors travel
/// through host memory; `Mean` of an integer tensor is its exact mean as f64, as the strategy's
/// all-reduce gives it.
pub fn all_reduce_tensors(
    ctx: &ReplicaContext<'_>,
    op: ReduceOp,
    tensors: &[candle_core::Tensor],
) -> Result<Vec<candle_core::Tensor>, Error> {
    use candle_core::DType;
    // The results keep their tensors' dtypes: one `from_candle` would widen (u8 to i32) is
    // refused, as a sum could overflow the narrower dtype.
    if let Some(t) = tensors.iter().find(|t| {
        !matches!(
            t.dtype(),
            DType::F16 | DType::BF16 | DType::F32 | DType::F64 | DType::I32 | DType::I64
        )
    }) {
        return Err(Error::UnsupportedDType {
            what: "a tensor to all-reduce".into(),
            dtype: t.dtype(),
            integers: true,
        });
    }
    let host = tensors
        .iter()
        .map(|t| from_candle(t, ctx.device()))
        .collect::<Result<Vec<_>, _>>()?;
    let reduced = ctx.all_reduce(op, &host)?;
    reduced
        .iter()
        .zip(tensors)
        .map(|(r, t)| to_candle(r, t.device()))
        .collect()
}

/// A candle `tensor` reduced with `op` over every replica of every worker, inside a step
/// ([`all_reduce_tensors`] of one tensor).
///
/// ```
/// use candle_core::Tensor;
/// use distribute_candle::{Config, DataParallel, all_reduce_tensor};
/// use distribute_mirrored::MirroredStrategy;
/// use distribute_values::ReduceOp;
///
/// let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
/// let model = DataParallel::new(
///     &strategy,
///     Config::default(),
///     |vb: candle_nn::VarBuilder| candle_nn::linear(3, 1, vb.pp("l1")),
///     |vars| <candle_nn::SGD as candle_nn::Optimizer>::new(vars, 0.1),
/// )?;
/// let means = model.run(&(), |replica, ()| {
///     let mine = Tensor::new(&[replica.replica_id() as f32, 4.0], replica.device())?;
///     Ok(all_reduce_tensor(replica.context(), ReduceOp::Mean, &mine)?.to_vec1::<f32>()?)
/// })?;
/// assert_eq!(means, [[0.5, 4.0], [0.5, 4.0]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn all_reduce_tensor(
    ctx: &ReplicaContext<'_>,
    op: ReduceOp,
    tensor: &candle_core::Tensor,
) -> Result<candle_core::Tensor, Error> {
    let mut reduced = all_reduce_tensors(ctx, op, std::slice::from_ref(tensor))?;
    Ok(reduced.remove(0))
}
