//! The [`Strategy`] trait: what every way of running replicas offers its users.

use std::sync::Arc;

use distribute_collectives::Destinations;
use distribute_input::{
    Batch, Dataset, DistributedDataset, InputContext, InputError, InputOptions, InputWorkers,
    distribute_datasets_from_function,
};
use distribute_tensor::{AnyTensor, DType, Tensor};
use distribute_values::{
    Distributed, DistributedValues, DistributedVariable, Leaf, PerReplica, ReduceOp, Regroup,
    VariableValue, regroup,
};

use crate::context::{
    CrossReplicaContext, ReplicaContext, StrategyExtended, refuse_in_replica_step,
};
use crate::steps::MultiStepContext;
use crate::variables::{VariableOptions, create_distributed_variable};
use crate::{RunError, StrategyError};

/// A way to run one step function on N replicas (TF's `tf.distribute.Strategy`).
///
/// `run` hands every replica its part of the inputs and a [`ReplicaContext`]; the results come
/// back regrouped (`PerReplica` where replicas differ). Everything else — reductions, variable
/// creation, cross-replica updates — goes through [`Strategy::cross_replica`].
pub trait Strategy: Send + Sync {
    /// The object-safe core the contexts use.
    fn extended(&self) -> &dyn StrategyExtended;

    /// Runs `step` once on every replica of this process and gives back each one's own value,
    /// in replica order: any `T: Send`, and the step's own error type `E` (candle's, `anyhow`'s,
    /// the user's). What adapters build on; [`run`](Self::run) is this plus regrouping.
    ///
    /// Replica `r` gets `select_replica(r, inputs)`, as for `run`. If any replica fails or
    /// panics, the others are released from their collectives and `merge_call`s, and the error
    /// is [`RunError::Replica`] with the first replica that failed on its own and its `E`, or
    /// [`RunError::Strategy`] for a panic and the strategy's own failures. Across workers a
    /// failure on any worker ends the step on every worker
    /// ([`CollectiveError::WorkerFailed`](distribute_collectives::CollectiveError::WorkerFailed),
    /// whose message is the failed step's `E` as text).
    ///
    /// ```
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// // A type `run` could not regroup, and an error type of the step's own.
    /// let names: Vec<std::fs::Metadata> =
    ///     strategy.run_each(|_, ()| std::fs::metadata("."), &())?;
    /// assert!(names[0].is_dir());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn run_each<D, T, E, F>(&self, step: F, inputs: &D) -> Result<Vec<T>, RunError<E>>
    where
        D: Distributed + Sync,
        T: Send,
        E: Send + std::fmt::Display,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<T, E> + Sync;

    /// Runs `step` once on every replica and regroups the results.
    ///
    /// Replica `r` gets `select_replica(r, inputs)`: its own value of every per-replica leaf, and
    /// plain values as they are. What a replica gets, `D::Local`, is named by the inputs' type
    /// ([`Distributed`]), so `strategy.run(step, &inputs)` needs no type annotations. If any
    /// replica fails or panics, the others are released from their collectives and
    /// `merge_call`s, and the first root-cause error is returned.
    fn run<D, O, F>(&self, step: F, inputs: &D) -> Result<O::Regrouped, StrategyError>
    where
        D: Distributed + Sync,
        O: Regroup + Send,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<O, StrategyError> + Sync,
    {
        let outputs = self
            .run_each(step, inputs)
            .map_err(RunError::into_strategy_error)?;
        Ok(regroup(self.extended().device_map(), outputs)?)
    }

    /// The number of replicas that run each step.
    fn num_replicas_in_sync(&self) -> usize {
        self.extended().total_replicas()
    }

    /// Whether this process is the chief (worker 0 of a multi-worker job; always in one
    /// process): the one that writes checkpoints, summaries and reports.
    ///
    /// ```
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    ///
    /// assert!(DefaultStrategy::new()?.is_chief());
    /// # Ok::<(), distribute_strategy::StrategyError>(())
    /// ```
    fn is_chief(&self) -> bool {
        self.extended().is_chief()
    }

    /// The cross-replica context: reductions, broadcasts and variable updates outside `run`.
    fn cross_replica(&self) -> CrossReplicaContext<'_> {
        CrossReplicaContext::new(self.extended())
    }

    /// Reduces a result of `run` to one tensor on the host CPU (TF's `strategy.reduce`).
    ///
    /// With no axis, per-replica values are reduced element-wise across replicas; `Mean` of
    /// integer tensors is their exact mean as float64 (TF's true division: `[1]` and `[2]` give
    /// `[1.5]`), as it is along an axis. A plain value or a mirrored one reduced with `Mean` is
    /// returned as it is, as in TF (no communication, dtype kept).
    ///
    /// With an `axis`, each replica's value (a plain or mirrored value counts once per replica,
    /// as in TF) is first reduced along it, then across replicas: `Mean` is the mean over every
    /// element along that axis on every replica (weighted by how many each replica had), not the
    /// mean of the replicas' means, and is float64 for integer tensors (TF's true division).
    /// `Min` and `Max` (which TF refuses with an axis) skip replicas whose axis is empty, as the
    /// last step of an uneven dataset leaves some.
    fn reduce(
        &self,
        op: ReduceOp,
        value: &Leaf<Tensor>,
        axis: Option<usize>,
    ) -> Result<Tensor, StrategyError> {
        refuse_in_replica_step("reduce")?;
        let cross = self.cross_replica();
        let host = Destinations::device(self.extended().host_device())?;
        let reduced = match axis {
            None => cross.reduce_to(op, value, &host)?,
            Some(axis) => return reduce_along(&cross, op, value, axis, &host),
        };
        match reduced {
            Leaf::Same(t) => Ok(t),
            // A mirrored mean is returned without communication: take its first copy to the host.
            Leaf::Mirrored(m) => Ok(m
                .into_iter()
                .next()
                .expect("a mirrored value has copies")
                .to_device(self.extended().host_device())),
            Leaf::PerReplica(_) => Err(StrategyError::Invariant(
                "a reduction to one device gave per-replica values".into(),
            )),
        }
    }

    /// Every replica's value joined along `axis`, in replica order, on the host CPU (TF's
    /// `strategy.gather`, the cross-replica counterpart of `ReplicaContext::all_gather`).
    ///
    /// The values may differ in the length of `axis` (an uneven last batch leaves some replicas
    /// fewer rows, or none), not in dtype, rank or any other dimension. A plain or mirrored value
    /// counts once per replica, as for [`reduce`](Self::reduce) along an axis: `run` regroups
    /// equal results into one plain value, and each replica did return it.
    ///
    /// ```
    /// use distribute_tensor::Tensor;
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let rows = strategy.run(
    ///     |ctx, ()| Ok(Tensor::from_vec(ctx.device(), &[2, 1], vec![1.0f32, 2.0])?),
    ///     &(),
    /// )?;
    /// let gathered = strategy.gather(&rows, 0)?;
    /// assert_eq!(gathered.shape(), [2, 1]);
    /// assert_eq!(gathered.device(), "/job:localhost/replica:0/task:0/device:CPU:0");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn gather(&self, value: &Leaf<Tensor>, axis: usize) -> Result<Tensor, StrategyError> {
        gather_local_replicas(self.extended(), value, axis)
    }

    /// Creates a distributed variable on every replica's device (in the strategy's scope, in TF's
    /// terms): mirrored for on-write synchronization, sync-on-read for on-read.
    fn create_variable<T: VariableValue>(
        &self,
        name: &str,
        initial: T,
        options: VariableOptions,
    ) -> Result<DistributedVariable<T>, StrategyError>
    where
        Self: Sized,
    {
        create_distributed_variable(name, self.extended().device_map(), initial, options)
    }

    /// Runs up to `iterations` steps, one per item of `inputs` (TF 2018's
    /// `run_steps_on_iterator`), and returns the [`MultiStepContext`] they shared.
    ///
    /// `step(ctx, input)` runs in cross-replica context: it usually calls [`run`](Self::run)
    /// with its input and records outputs with
    /// [`MultiStepContext::set_last_step_output`]. When the loop ends, every output that has a
    /// reduce op is replaced by its reduction to the host ([`reduce`](Self::reduce)); the
    /// others are kept as the last step set them. The loop stops early when `inputs` runs out;
    /// [`MultiStepContext::steps_run`] says how many steps ran. Pass `iter.by_ref()` to go on
    /// with the same iterator in the next call.
    ///
    /// Errors: `iterations == 0` (`InvalidArgument`); `inputs` empty before the first step
    /// (`OutOfRange`); the first error of a step, which ends the loop.
    ///
    /// ```
    /// use distribute_tensor::Tensor;
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    /// use distribute_values::ReduceOp;
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let mut batches = [1.0f32, 2.0, 3.0].into_iter();
    /// let ctx = strategy.run_steps_on_iterator(
    ///     |ctx, x: f32| {
    ///         let loss = strategy.run(
    ///             |replica, x| Ok(Tensor::scalar(replica.device(), x * x)),
    ///             &distribute_values::Leaf::Same(x),
    ///         )?;
    ///         ctx.set_last_step_output("loss", loss, Some(ReduceOp::Sum));
    ///         Ok(())
    ///     },
    ///     batches.by_ref(),
    ///     2,
    /// )?;
    /// assert_eq!(ctx.steps_run(), 2);
    /// let loss = ctx.last_step_output("loss").unwrap().value().local_results()[0].to_vec::<f32>()?;
    /// assert_eq!(loss, [4.0]); // the second step's, reduced
    /// assert_eq!(batches.next(), Some(3.0)); // left for the next call
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn run_steps_on_iterator<X, F>(
        &self,
        mut step: F,
        inputs: impl IntoIterator<Item = X>,
        iterations: usize,
    ) -> Result<MultiStepContext, StrategyError>
    where
        Self: Sized,
        F: FnMut(&mut MultiStepContext, X) -> Result<(), StrategyError>,
    {
        if iterations == 0 {
            return Err(StrategyError::InvalidArgument(
                "run_steps_on_iterator needs at least one iteration".into(),
            ));
        }
        let mut ctx = MultiStepContext::new();
        for input in inputs.into_iter().take(iterations) {
            step(&mut ctx, input)?;
            ctx.step_done();
        }
        if ctx.steps_run() == 0 {
            return Err(StrategyError::OutOfRange(
                "run_steps_on_iterator: the input iterator is exhausted".into(),
            ));
        }
        // Reduction errors keep their own kind (e.g. `Invariant` for a mirrored sum).
        for (value, reduce_op) in ctx.outputs_mut() {
            if let Some(op) = reduce_op {
                *value = Leaf::Same(self.reduce(op, value, None)?);
            }
        }
        Ok(ctx)
    }

    /// Applies `f` to every item, round-robin over the replicas' devices (TF 2018's `map`): item
    /// `i` goes to replica `i % num_replicas_in_sync`, and `f` gets that replica's device. The
    /// results come back per replica, in item order on each.
    ///
    /// ```
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    /// use distribute_values::DistributedValues;
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let squares = strategy.map(1..=3, |_device, x: i32| Ok(x * x))?;
    /// assert_eq!(squares.values(), [vec![1, 4, 9]]);
    /// # Ok::<(), distribute_strategy::StrategyError>(())
    /// ```
    fn map<T, U>(
        &self,
        items: impl IntoIterator<Item = T>,
        mut f: impl FnMut(&str, T) -> Result<U, StrategyError>,
    ) -> Result<PerReplica<Vec<U>>, StrategyError>
    where
        Self: Sized,
    {
        let map = self.extended().device_map();
        let devices: Vec<&str> = map.primary_devices().collect();
        let mut outputs: Vec<Vec<U>> = devices.iter().map(|_| Vec::new()).collect();
        for (i, item) in items.into_iter().enumerate() {
            let replica = i % devices.len();
            outputs[replica].push(f(devices[replica], item)?);
        }
        Ok(PerReplica::new(Arc::clone(map), outputs)?)
    }

    /// A global-batch dataset fed to this strategy's replicas (TF's
    /// `experimental_distribute_dataset`): every global batch split into contiguous per-replica
    /// chunks, placed on the replicas' devices. Each step it yields is what [`run`](Self::run)
    /// takes: the batch's structure with per-replica leaves, replica `r` getting its chunk
    /// (`DistributedDataset::iter_per_replica` gives one `PerReplica` of whole batches instead).
    ///
    /// ```
    /// use distribute_input::{Dataset, InputOptions};
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let dataset = Dataset::range(8).batch(4, false)?;
    /// let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
    /// let mut sums = Vec::new();
    /// for batch in &dataset {
    ///     let sum = strategy.run(
    ///         |_, batch| Ok(batch.to_vec::<i64>()?.iter().sum::<i64>()),
    ///         &batch?,
    ///     )?;
    ///     sums.push(sum.local_results().into_iter().copied().sum::<i64>());
    /// }
    /// assert_eq!(sums, [6, 22]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn distribute_dataset<B: Batch>(
        &self,
        dataset: Dataset<B>,
        options: InputOptions,
    ) -> Result<DistributedDataset<B>, StrategyError>
    where
        Self: Sized,
    {
        let workers = InputWorkers::local(self.extended().device_map().primary_devices())?;
        Ok(DistributedDataset::new(dataset, &workers, options)?)
    }

    /// One dataset per input pipeline, each made by `dataset_fn` from its [`InputContext`] (TF's
    /// `distribute_datasets_from_function`); `dataset_fn` batches per replica.
    fn distribute_datasets_from_function<B: Batch>(
        &self,
        options: InputOptions,
        dataset_fn: impl Fn(&InputContext) -> Result<Dataset<B>, InputError>,
    ) -> Result<DistributedDataset<B>, StrategyError>
    where
        Self: Sized,
    {
        let workers = InputWorkers::local(self.extended().device_map().primary_devices())?;
        Ok(distribute_datasets_from_function(
            &workers, options, dataset_fn,
        )?)
    }

    /// One value per replica from `value_fn(replica_id, num_replicas)` (TF's
    /// `distribute_values_from_function`); always a `PerReplica`, even when the values are equal.
    fn distribute_values_from_function<T>(
        &self,
        value_fn: impl Fn(usize, usize) -> T,
    ) -> Result<PerReplica<T>, StrategyError>
    where
        Self: Sized,
    {
        let n = self.num_replicas_in_sync();
        let values = (0..n).map(|r| value_fn(r, n)).collect();
        Ok(PerReplica::new(
            Arc::clone(self.extended().device_map()),
            values,
        )?)
    }
}

/// This process's replicas' values of `value` joined along `axis`, in replica order, on the host
/// ([`Strategy::gather`] in one process; a multi-worker strategy then joins the workers'). A plain
/// or mirrored value counts once per local replica. Like every cross-replica operation it fails
/// with [`StrategyError::CrossReplicaInReplica`] inside a replica's step.
pub fn gather_local_replicas(
    extended: &dyn StrategyExtended,
    value: &Leaf<Tensor>,
    axis: usize,
) -> Result<Tensor, StrategyError> {
    refuse_in_replica_step("gather")?;
    let host = extended.host_device();
    let parts: Vec<Tensor> = match value {
        // Once per replica of this process: the value stands for each one's.
        Leaf::Same(t) => vec![t.clone(); extended.num_replicas()],
        Leaf::PerReplica(p) => p.values().to_vec(),
        Leaf::Mirrored(m) => m.values().to_vec(),
    };
    let first = &parts[0];
    if axis >= first.rank() {
        return Err(StrategyError::InvalidArgument(format!(
            "gather along axis {axis}: the values have rank {}; the axis must be below it",
            first.rank()
        )));
    }
    if let Some((r, t)) = parts.iter().enumerate().find(|(_, t)| {
        t.dtype() != first.dtype()
            || t.rank() != first.rank()
            || t.shape()
                .iter()
                .zip(first.shape())
                .enumerate()
                .any(|(d, (a, b))| d != axis && a != b)
    }) {
        return Err(StrategyError::InvalidArgument(format!(
            "gather along axis {axis}: replica {r} has a {} {:?} tensor and replica 0 a {} \
             {:?}; values must share dtype and rank (above the axis) and may differ only in \
             the length of the axis",
            t.dtype(),
            t.shape(),
            first.dtype(),
            first.shape()
        )));
    }
    let on_host = parts
        .iter()
        .map(|t| t.copy_to(host))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Tensor::concat(host, &on_host, axis)?)
}

/// [`Strategy::reduce`] along `axis`.
fn reduce_along(
    cross: &CrossReplicaContext<'_>,
    op: ReduceOp,
    value: &Leaf<Tensor>,
    axis: usize,
    host: &Destinations,
) -> Result<Tensor, StrategyError> {
    let parts: Vec<Tensor> = match value {
        // Once per local replica: the cross-device reduction adds the other workers' replicas.
        Leaf::Same(t) => vec![t.clone(); cross.num_local_replicas()],
        Leaf::PerReplica(p) => p.values().to_vec(),
        Leaf::Mirrored(m) => m.values().to_vec(),
    };
    // An integer mean is float64 (TF's true division); converting before summing keeps the sum
    // from wrapping (i32 rows of 2e9 on 2 replicas once gave -147483648).
    let parts = if op == ReduceOp::Mean {
        parts
            .iter()
            .map(|t| match t.dtype().is_floating() {
                true => Ok(t.clone()),
                false => to_f64(&t.to_host()?),
            })
            .collect::<Result<Vec<_>, StrategyError>>()?
    } else {
        parts
    };
    let length = |t: &Tensor| t.shape().get(axis).copied().unwrap_or(0);
    let local = |t: &Tensor, op| -> Result<AnyTensor, StrategyError> {
        Ok(AnyTensor::Dense(t.reduce_axis(op, axis)?))
    };
    let requested = op;
    let (op, locals, count) = match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            let sums = parts
                .iter()
                .map(|t| local(t, ReduceOp::Sum))
                .collect::<Result<_, _>>()?;
            let count = parts.iter().map(length).sum::<usize>();
            (ReduceOp::Sum, sums, rows_everywhere(cross, count, host)?)
        }
        ReduceOp::Min | ReduceOp::Max => {
            let non_empty: Vec<AnyTensor> = parts
                .iter()
                .filter(|t| length(t) > 0)
                .map(|t| local(t, op))
                .collect::<Result<_, _>>()?;
            (op, non_empty, 0)
        }
    };
    if locals.is_empty() {
        return Err(StrategyError::InvalidArgument(format!(
            "{op} along axis {axis}: every replica's axis is empty, so there is no value"
        )));
    }
    let total = match cross.cross_device_ops().reduce(op, &locals, host)? {
        Leaf::Same(t) => t.to_dense()?,
        other => {
            return Err(StrategyError::Invariant(format!(
                "a reduction to one device gave {other:?}"
            )));
        }
    };
    if requested == ReduceOp::Mean {
        if count == 0 {
            return Err(StrategyError::InvalidArgument(format!(
                "MEAN along axis {axis}: every replica's axis is empty, so the mean is undefined \
                 (TF gives NaN)"
            )));
        }
        return Ok(total.divided_by(count)?);
    }
    Ok(total)
}

/// `local` (this process's rows along the reduced axis) summed over every worker: as it is in
/// one process; across workers, one more reduction, since workers' replicas may hold different
/// row counts (an uneven last batch).
fn rows_everywhere(
    cross: &CrossReplicaContext<'_>,
    local: usize,
    host: &Destinations,
) -> Result<usize, StrategyError> {
    if cross.num_replicas_in_sync() == cross.num_local_replicas() {
        return Ok(local);
    }
    let too_many = || StrategyError::InvalidArgument(format!("{local} rows do not fit an i64"));
    let rows = i64::try_from(local).map_err(|_| too_many())?;
    // The whole count on the first local replica, zero on the others: the sum is the same.
    let mut counts = vec![AnyTensor::Dense(Tensor::from_vec(
        host.as_slice()[0].as_str(),
        &[],
        vec![rows],
    )?)];
    for _ in 1..cross.num_local_replicas() {
        counts.push(AnyTensor::Dense(Tensor::from_vec(
            host.as_slice()[0].as_str(),
            &[],
            vec![0i64],
        )?));
    }
    let total = match cross
        .cross_device_ops()
        .reduce(ReduceOp::Sum, &counts, host)?
    {
        Leaf::Same(t) => t.to_dense()?.to_vec::<i64>()?,
        other => {
            return Err(StrategyError::Invariant(format!(
                "a reduction to one device gave {other:?}"
            )));
        }
    };
    let total = total.first().copied().ok_or_else(|| {
        StrategyError::Invariant("the reduction of row counts gave no value".into())
    })?;
    usize::try_from(total)
        .map_err(|_| StrategyError::Invariant(format!("the workers' row counts summed to {total}")))
}

/// An integer tensor as float64, for TF's true division of integer means.
fn to_f64(tensor: &Tensor) -> Result<Tensor, StrategyError> {
    let values: Vec<f64> = match tensor.dtype() {
        DType::I32 => tensor.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        // Sums beyond 2^53 lose their last bits, as TF's cast does.
        DType::I64 => tensor
            .to_vec::<i64>()?
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        other => {
            return Err(StrategyError::Invariant(format!(
                "{other} is not an integer type"
            )));
        }
    };
    Ok(Tensor::from_vec(tensor.device(), tensor.shape(), values)?)
}
