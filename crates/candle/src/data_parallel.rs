//! [`DataParallel`]: one copy of a candle model (and its optimizer) per replica, held by the
//! library, and [`ReplicaStep`], what a step function sees of its replica.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use candle_core::{DType, Tensor, Var};
use candle_nn::{Optimizer, VarBuilder};
use distribute_strategy::{
    CheckpointVariable, RunError, Strategy, StrategyError, StrategyExtended,
};
use distribute_values::Distributed;

use crate::error::outside_step;
use crate::gpu::StepDone;
use crate::optim::{OptimizerState, ShardOptimizer, StateTensor};
use crate::policy::{self, VarPolicy};
use crate::precision::Precision;
use crate::replica::{Replica, build_replicas, is_cpu};
use crate::schedule::Schedule;
use crate::shard::{self, ReplicaMemory, ShardOps, Sharding, Shards};
use crate::step::ReplicaStep;
use crate::threads::{self, CpuThreads};
use crate::training_state::{self, Saved};
use crate::variables::{self, VarInfo};
use crate::{Error, StepError, ToCandle, buffers};

/// Settings of a [`DataParallel`] model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// The dtype of the model's variables (the `VarBuilder`'s). Default `F32`.
    pub dtype: DType,
    /// How many threads each CPU replica's candle kernels use. Default [`CpuThreads::Auto`].
    pub threads: CpuThreads,
    /// The name the model's values are stored under in a `Checkpoints` file (the model is a
    /// `CheckpointVariable`). Default `"model"`; give two models of one job different names.
    pub name: &'static str,
    /// The learning rate of each update, set on every replica's optimizer before the update
    /// ([`ReplicaStep::backward_step`], [`ReplicaStep::step_accumulated`]); its position, the
    /// number of updates applied, is saved in checkpoints. Default `None`: the optimizer's own
    /// rate.
    pub schedule: Option<Schedule>,
    /// Clip the reduced gradients to this global norm before each update: every gradient is
    /// multiplied by `min(1, max_norm / (norm + 1e-6))`, with `norm` taken once over all the
    /// reduced gradients (in f64, in the variables' name order), so every replica and worker
    /// applies the same factor; PyTorch's `clip_grad_norm_`. Applies to
    /// [`ReplicaStep::backward_step`], [`ReplicaStep::step_accumulated`] and
    /// [`ReplicaStep::all_reduce_gradients`]. Default `None`.
    pub clip_norm: Option<f64>,
    /// Rules for variables that change outside the optimizer (buffers): `(name, policy)`, where
    /// `name` is a variable's whole name or its last dotted parts (`"running_mean"` names every
    /// `….running_mean`); the first rule that names a variable wins, and a rule that names none
    /// is refused. [`BATCH_NORM_MEAN`](crate::BATCH_NORM_MEAN) averages candle-nn's batch-norm
    /// statistics. Default: none (every variable [`VarPolicy::Trained`]).
    pub var_policies: &'static [(&'static str, VarPolicy)],
    /// The seed of [`ReplicaStep::dropout`]'s masks (with the replica, the update and the call,
    /// it keys each mask). Default 0.
    pub seed: u64,
    /// Full precision, or a model computing in bf16 or f16 over f32 master weights
    /// ([`Precision`]). Default [`Precision::Full`].
    pub precision: Precision,
    /// ZeRO: each replica keeps only its shard of the optimizer's state (and of the reduced
    /// gradients) ([`Sharding`]); needs [`DataParallel::new_sharded`]. Default
    /// [`Sharding::None`].
    pub sharding: Sharding,
    /// GPU replicas' gradients (and buffers) travel through host memory: each replica's bucket
    /// is copied to the host and handed to the strategy's collectives there (which reduce it
    /// on the host, or, with an NCCL backend, upload it, reduce it on the GPUs and download
    /// the result), and the reduced bucket copied back. Default `false`: when every local
    /// replica is on a GPU, a replica's buckets stay in its GPU's memory and the strategy's
    /// collectives reduce them there (NCCL with `distribute-mirrored`'s or
    /// `distribute-multi-worker`'s `nccl`). With CPU replicas beside GPU ones they always take
    /// the host. The path before GPU buckets, kept for comparisons (`benches/gpu.rs`) and for
    /// collectives that cannot read GPU memory.
    pub through_host: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            dtype: DType::F32,
            threads: CpuThreads::Auto,
            name: "model",
            schedule: None,
            clip_norm: None,
            var_policies: &[],
            seed: 0,
            precision: Precision::Full,
            sharding: Sharding::None,
            through_host: false,
        }
    }
}

/// How one replica's step failed: the user's step returned its error, or this crate's own part
/// of the step (the replica's lock, its input's conversion) failed.
enum Failure {
    Step(StepError),
    Ours(Error),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Step(error) => error.fmt(f),
            Failure::Ours(error) => error.fmt(f),
        }
    }
}

/// A candle model trained data-parallel on a strategy's replicas: one copy of the model and its
/// optimizer per local replica, built once, all starting from replica 0's values (the chief's
/// across workers), updated in step by [`run`](Self::run).
///
/// ```
/// use candle_core::{DType, Device, Tensor};
/// use candle_nn::{Linear, Module, Optimizer, SGD, VarBuilder};
/// use distribute_candle::{Config, DataParallel};
/// use distribute_mirrored::MirroredStrategy;
/// use distribute_values::ReduceOp;
///
/// let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
/// let model = DataParallel::new(
///     &strategy,
///     Config::default(),
///     |vb: VarBuilder| candle_nn::linear(3, 1, vb.pp("l1")),
///     |vars| SGD::new(vars, 0.1),
/// )?;
/// for _ in 0..3 {
///     model.run(&(), |replica, ()| {
///         let x = Tensor::ones((4, 3), DType::F32, replica.device())?;
///         let loss = replica.model().forward(&x)?.sqr()?.mean_all()?;
///         replica.backward_step(&loss, ReduceOp::Mean)?;
///         Ok(loss.to_scalar::<f32>()?)
///     })?;
/// }
/// model.check_in_sync()?; // every copy bit-identical
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DataParallel<'s, S, M, O> {
    strategy: &'s S,
    name: &'static str,
    replicas: Vec<Mutex<Replica<M, O>>>,
    manifest: Vec<VarInfo>,
    threads_per_replica: Option<usize>,
    schedule: Option<Schedule>,
    clip_norm: Option<f64>,
    /// Each variable's policy, manifest order.
    policies: Vec<VarPolicy>,
    /// The variables that are buffers (policy not `Trained`).
    buffers_at: Vec<usize>,
    /// The dtype the model computes in.
    compute_dtype: DType,
    seed: u64,
    /// With [`Config::sharding`], the optimizer's piece operations.
    shard_ops: Option<ShardOps<O>>,
}

impl<'s, S, M, O> DataParallel<'s, S, M, O>
where
    S: Strategy,
    M: Send,
    O: Optimizer + Send,
{
    /// Builds one copy of the model per local replica of `strategy`, each from
    /// `build_model(vb)` with a `VarBuilder` over a fresh `VarMap` on the replica's device, and
    /// its optimizer from `build_optimizer(vars)` (the model's variables, sorted by name).
    ///
    /// Every copy then takes replica 0's values, and across workers the chief's, whatever the
    /// initialiser did. The variables' names, dtypes and shapes must agree on every replica and
    /// worker; a mismatch is [`Error::ModelMismatch`] naming the variable and the replica or
    /// worker. A builder's error is [`Error::Replica`] naming the replica. Every worker of a
    /// multi-worker strategy must call it, as it exchanges with the others.
    ///
    /// With [`CpuThreads::Auto`] or [`CpuThreads::PerReplica`] this sets `RAYON_NUM_THREADS` and
    /// `CANDLE_NUM_THREADS` for the process when their values change (candle reads its
    /// parallelism only from there; see [`CpuThreads`]). Writing the environment races with
    /// threads that read it through C's `getenv` (Rust's `std::env` readers are safe): build the
    /// model before starting such threads, or choose [`CpuThreads::Unmanaged`] and set the
    /// variables before the program starts (under `mpirun`, `-x RAYON_NUM_THREADS=…`).
    ///
    /// [`Config::sharding`] must be [`Sharding::None`]: a sharded model is built with
    /// [`new_sharded`](Self::new_sharded), whose optimizer must be a [`ShardOptimizer`].
    pub fn new<FM, FO, EM, EO>(
        strategy: &'s S,
        config: Config,
        build_model: FM,
        build_optimizer: FO,
    ) -> Result<Self, Error>
    where
        FM: Fn(VarBuilder<'_>) -> Result<M, EM>,
        EM: Into<StepError>,
        FO: Fn(Vec<Var>) -> Result<O, EO>,
        EO: Into<StepError>,
    {
        if config.sharding != Sharding::None {
            return Err(Error::InvalidArgument(format!(
                "Config::sharding is {}: build a sharded model with DataParallel::new_sharded, \
                 whose optimizer updates pieces of variables (a ShardOptimizer: AdamW, Sgd, \
                 AnyOptimizer, candle-nn's SGD)",
                config.sharding
            )));
        }
        Self::build(strategy, config, build_model, build_optimizer, None)
    }

    /// [`new`](Self::new) and [`new_sharded`](Self::new_sharded): `ops` with sharding.
    fn build<FM, FO, EM, EO>(
        strategy: &'s S,
        config: Config,
        build_model: FM,
        build_optimizer: FO,
        ops: Option<ShardOps<O>>,
    ) -> Result<Self, Error>
    where
        FM: Fn(VarBuilder<'_>) -> Result<M, EM>,
        EM: Into<StepError>,
        FO: Fn(Vec<Var>) -> Result<O, EO>,
        EO: Into<StepError>,
    {
        let extended = strategy.extended();
        let first = extended.first_replica_id();
        if let Some(max) = config.clip_norm
            && !(max.is_finite() && max > 0.0)
        {
            return Err(Error::InvalidArgument(format!(
                "Config::clip_norm must be finite and positive, not {max}"
            )));
        }
        // Everything this worker does alone, agreed on before the first exchange of values.
        let local = (|| {
            let devices = extended.local_devices();
            let cpu_replicas = devices.iter().filter(|d| is_cpu(d)).count();
            let co_workers = extended.workers().map_or(1, |w| w.on_this_host());
            let plan = threads::apply(config.threads, cpu_replicas, co_workers)?;
            let (mut replicas, manifests) = build_replicas(
                devices,
                first,
                config.dtype,
                config.precision,
                &build_model,
                &build_optimizer,
                ops.is_some(),
            )?;
            // Buckets stay in GPU memory when every local replica is on a GPU; with CPU
            // replicas beside GPU ones they all travel through the host, where the CPU
            // replicas' are.
            let on_gpu = !config.through_host && replicas.iter().all(|r| r.device.is_cuda());
            for replica in &mut replicas {
                replica.buckets.on_gpu = on_gpu;
                replica.buffer_buckets.on_gpu = on_gpu;
            }
            for (r, manifest) in manifests.iter().enumerate().skip(1) {
                if let Some(diff) = variables::difference(
                    &manifests[0],
                    &format!("replica {first}"),
                    manifest,
                    &format!("replica {}", first + r),
                ) {
                    return Err(Error::ModelMismatch(diff));
                }
            }
            let manifest = manifests.into_iter().next().unwrap_or_default();
            Ok((plan, replicas, manifest))
        })();
        let local = local.and_then(|(plan, replicas, manifest)| {
            training_state::check_names(&manifest)?;
            let policies = policy::resolve(&manifest, config.var_policies)?;
            Ok((plan, replicas, manifest, policies))
        });
        let (plan, mut replicas, manifest, policies) =
            variables::agreed(extended, local, "building its model")?;
        variables::agree_across_workers(extended, &manifest)?;
        if let Some(ops) = &ops {
            let total = extended.total_replicas();
            let built = replicas
                .iter_mut()
                .enumerate()
                .try_for_each(|(r, replica)| {
                    let shards = Shards::new(
                        config.sharding,
                        &manifest,
                        total,
                        first + r,
                        ops,
                        &replica.optimizer,
                        &replica.device,
                    )?;
                    replica.shards = Some(shards);
                    Ok(())
                });
            variables::agreed(extended, built, "building its shards")?;
        }
        let model = DataParallel {
            strategy,
            name: config.name,
            replicas: replicas.into_iter().map(Mutex::new).collect(),
            manifest,
            threads_per_replica: plan.per_replica,
            schedule: config.schedule,
            clip_norm: config.clip_norm,
            buffers_at: (0..policies.len())
                .filter(|&i| policies[i] != VarPolicy::Trained)
                .collect(),
            policies,
            seed: config.seed,
            compute_dtype: config.precision.build_dtype(config.dtype)?,
            shard_ops: ops,
        };
        model.copy_from_first_replica()?;
        Ok(model)
    }

    /// Runs `step` once on every replica (as [`Strategy::run`]), with the replica's model and
    /// its input converted to candle tensors on the replica's device ([`ToCandle`]); returns
    /// each local replica's result, in replica order.
    ///
    /// A step's error (candle's, this crate's, or the user's own, all through `?`) comes back as
    /// [`Error::Replica`] naming the replica; a panicking replica as the strategy's
    /// `ReplicaPanicked`. Either way every other replica is released: none hangs. Across
    /// workers the strategy ends the step on every worker with its `WorkerFailed` error, which
    /// names the failing worker and carries the failing step's message (not its typed source).
    ///
    /// The step holds its replica's copy for the whole step: this model's other methods
    /// (`with_model`, `variable`, `check_in_sync`, `save`, …) called from inside a step fail
    /// with [`Error::InStep`] (inside a step, the [`ReplicaStep`] is the replica's model).
    ///
    /// On a GPU replica `run` returns once the step's GPU work is queued, not done, as a plain
    /// candle loop goes on while its GPU works: a tensor the step returns is read after that
    /// work (the calling thread's stream waits for it), and so are the model's values.
    pub fn run<D, T, F>(&self, inputs: &D, step: F) -> Result<Vec<T>, Error>
    where
        D: Distributed + Sync,
        D::Local: ToCandle,
        T: Send,
        F: Fn(
                &mut ReplicaStep<'_, '_, M, O>,
                <D::Local as ToCandle>::Candle,
            ) -> Result<T, StepError>
            + Sync,
    {
        // Every strategy refuses a step inside a step; refused here, it is refused before this
        // thread could wait for its own replica's copy (the default strategy runs the step on
        // the caller's thread).
        outside_step("run")?;
        let first = self.strategy.extended().first_replica_id();
        let manifest = &self.manifest;
        let policies = &self.policies;
        let caller = std::thread::current().id();
        let outputs = self
            .strategy
            .run_each(
                |ctx, local: D::Local| {
                    let r = ctx.replica_id() - first;
                    let mut replica = self.lock(r).map_err(Failure::Ours)?;
                    let input = local.to_candle(&replica.device).map_err(Failure::Ours)?;
                    let mut view = ReplicaStep {
                        ctx,
                        local: r,
                        replica: &mut replica,
                        manifest,
                        schedule: self.schedule,
                        clip_norm: self.clip_norm,
                        seed: self.seed,
                        dropouts: std::cell::Cell::new(0),
                        compute_dtype: self.compute_dtype,
                        shard_ops: self.shard_ops,
                    };
                    // On the replica's own rayon pool, unless this is the caller's thread.
                    let cpu = view.replica.device.is_cpu();
                    let output =
                        threads::on_replica_pool(self.threads_per_replica, caller, cpu, || {
                            step(&mut view, input)
                        })
                        .map_err(Failure::Step)?;
                    // Buffers change in the model's own copies: with mixed precision their
                    // masters follow before they are synchronized, and the copies after.
                    let buffers_at = &self.buffers_at;
                    (|| {
                        view.replica.pull_from_compute(buffers_at)?;
                        buffers::synchronize(
                            ctx,
                            manifest,
                            policies,
                            &view.replica.vars,
                            &view.replica.device,
                            &mut view.replica.buffer_buckets,
                        )?;
                        view.replica.refresh_compute_at(buffers_at.iter().copied())
                    })()
                    .map_err(Failure::Ours)?;
                    // A GPU replica's work stays queued on its thread's stream when the step
                    // returns, as in a plain candle loop: the next step on this thread follows it
                    // in stream order, the caller's stream waits for the mark (below), and the
                    // caller's reads of the model settle first (`lock_settled`).
                    let done = StepDone::mark(&replica.device).map_err(Failure::Ours)?;
                    Ok((output, done, replica.device.clone()))
                },
                inputs,
            )
            .map_err(|error| match error {
                RunError::Replica {
                    replica,
                    error: Failure::Step(source),
                } => Error::Replica { replica, source },
                RunError::Replica {
                    error: Failure::Ours(error),
                    ..
                } => error,
                RunError::Strategy(error) => Error::Strategy(error),
            })?;
        outputs
            .into_iter()
            .map(|(output, done, device)| {
                done.order_after(&device)?;
                Ok(output)
            })
            .collect()
    }

    /// Checks that every copy of every variable is bit-identical on every local replica and
    /// every worker: a 64-bit fingerprint of each variable's bytes per replica, compared locally
    /// and exchanged across workers (8 bytes a variable). The error names the variable and the
    /// replica or worker whose copy differs. Every worker must call it, as it exchanges.
    pub fn check_in_sync(&self) -> Result<(), Error> {
        outside_step("check_in_sync")?;
        let local = (|| {
            let first = self.strategy.extended().first_replica_id();
            let mut local = Vec::with_capacity(self.replicas.len());
            for r in 0..self.replicas.len() {
                let mut prints = variables::fingerprints(&self.lock_settled(r)?.vars)?;
                // Per-replica buffers are left out: their copies may differ.
                for (print, policy) in prints.iter_mut().zip(&self.policies) {
                    if *policy == VarPolicy::PerReplica {
                        *print = 0;
                    }
                }
                local.push(prints);
            }
            for (r, prints) in local.iter().enumerate().skip(1) {
                if let Some(i) = (0..self.manifest.len()).find(|&i| prints[i] != local[0][i]) {
                    return Err(Error::OutOfSync(format!(
                        "variable '{}' of replica {} differs from replica {first}'s (a \
                         variable that changes outside the optimizer, such as batch-norm \
                         statistics, needs a rule in Config::var_policies)",
                        self.manifest[i].name,
                        first + r
                    )));
                }
            }
            Ok(local.into_iter().next().unwrap_or_default())
        })();
        let extended = self.strategy.extended();
        let ours = variables::agreed(extended, local, "checking its copies")?;
        variables::fingerprints_agree_across_workers(extended, &self.manifest, &ours)
    }

    /// Writes the model's variables alone (replica 0's copy) to `path` as safetensors under
    /// candle's names, as `VarMap::save` does: weights for inference, export, or the initial
    /// values of other runs, whatever the optimizer. [`save`](Self::save) writes the whole
    /// training state.
    pub fn save_variables(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        outside_step("save_variables")?;
        let path = path.as_ref();
        let bytes = variables::to_safetensors(&self.manifest, &self.lock_settled(0)?.vars)?;
        std::fs::write(path, bytes).map_err(|e| Error::Checkpoint {
            path: path.display().to_string(),
            reason: format!("cannot be written: {e}"),
        })
    }

    /// Sets every copy of every variable from `values` (named as candle names the variables,
    /// exactly the model's variables with their dtypes and shapes; an error names the first that
    /// differs): initial values made elsewhere, or weights converted from another framework.
    /// Across workers every copy takes the chief's `values`, and a worker whose `values` do not
    /// fit fails every worker. Every worker must call it.
    pub fn assign(&self, values: HashMap<String, Tensor>) -> Result<(), Error> {
        outside_step("assign")?;
        let checked = self
            .check_values(values)
            .map_err(|reason| Error::InvalidArgument(format!("the values to assign: {reason}")));
        self.assign_checked(checked, "checking the values to assign")
    }

    /// Agrees across workers on whether `checked` succeeded, then sets replica 0's copy from it
    /// and every other copy from replica 0's (the chief's across workers).
    fn assign_checked(&self, checked: Result<Vec<Tensor>, Error>, what: &str) -> Result<(), Error> {
        let set = checked.and_then(|values| {
            let replica = self.lock(0)?;
            for (var, value) in replica.vars.iter().zip(&values) {
                var.set(&value.to_device(&replica.device)?)?;
            }
            replica.refresh_compute()
        });
        variables::agreed(self.strategy.extended(), set, what)?;
        self.copy_from_first_replica()
    }

    /// The variables of the model, sorted by name: the order of gradients and checks.
    pub fn variables(&self) -> &[VarInfo] {
        &self.manifest
    }

    /// The threads each CPU replica's kernels use (`None` when [`CpuThreads::Unmanaged`]).
    pub fn threads_per_replica(&self) -> Option<usize> {
        self.threads_per_replica
    }

    /// For each local replica, in replica order: the bytes of gradient (and buffer) buckets
    /// this library has copied between the replica's GPU and host memory since the model was
    /// built, both ways. Zero on CPU replicas, and on GPU replicas whose buckets stay on the
    /// GPU (every local replica on a GPU, without [`Config::through_host`]) unless the
    /// strategy's collectives hand the reduced buckets back in host memory (MPI's, without
    /// NCCL). Copies the collectives make themselves (an NCCL backend uploading a host bucket,
    /// MPI downloading a GPU one) are theirs and not counted.
    pub fn gradient_bytes_through_host(&self) -> Result<Vec<u64>, Error> {
        outside_step("gradient_bytes_through_host")?;
        (0..self.replicas.len())
            .map(|r| {
                let replica = self.lock(r)?;
                Ok(replica.buckets.host_bytes + replica.buffer_buckets.host_bytes)
            })
            .collect()
    }

    /// Whether this model's GPU replicas keep their gradient buckets in GPU memory (see
    /// [`Config::through_host`]): every local replica is on a GPU and the config does not send
    /// them through the host.
    pub fn buckets_on_gpu(&self) -> Result<bool, Error> {
        outside_step("buckets_on_gpu")?;
        Ok(self.lock(0)?.buckets.on_gpu)
    }

    /// The bytes this library holds for each local replica, in replica order: the variables,
    /// the reduced gradients a step hands the optimizer, the buckets gradients travel in
    /// (kept between steps), and the optimizer's state. With [`Config::sharding`], the
    /// optimizer's state is the replica's shard's (and with ZeRO-2 the reduced gradients too).
    pub fn memory(&self) -> Result<Vec<ReplicaMemory>, Error>
    where
        O: OptimizerState,
    {
        outside_step("memory")?;
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        (0..self.replicas.len())
            .map(|r| {
                let replica = self.lock(r)?;
                let mut parameters: usize = replica.vars.iter().map(|v| bytes(v)).sum();
                if let Some(compute) = &replica.compute {
                    parameters += compute
                        .iter()
                        .zip(&replica.vars)
                        .filter(|(c, v)| c.dtype() != v.dtype())
                        .map(|(c, _)| bytes(c))
                        .sum::<usize>();
                }
                let own: usize = replica
                    .optimizer
                    .state()
                    .iter()
                    .map(|s| bytes(&s.value))
                    .sum();
                let (gradients, optimizer_state) = match &replica.shards {
                    Some(shards) => (shards.reduced_gradient_bytes(), own + shards.state_bytes()),
                    None => (
                        self.manifest
                            .iter()
                            .map(|v| v.elem_count() * v.dtype.size_in_bytes())
                            .sum(),
                        own,
                    ),
                };
                let buckets = replica.buckets.kept_bytes();
                Ok(ReplicaMemory {
                    parameters,
                    gradients,
                    gradient_buckets: buckets,
                    optimizer_state,
                })
            })
            .collect()
    }

    /// How the model is sharded ([`Config::sharding`]).
    pub fn sharding(&self) -> Sharding {
        self.replicas
            .first()
            .and_then(|r| r.lock().ok()?.shards.as_ref().map(|s| s.sharding))
            .unwrap_or_default()
    }

    /// The strategy the model runs on.
    pub fn strategy(&self) -> &'s S {
        self.strategy
    }

    /// Updates applied so far ([`ReplicaStep::backward_step`] and
    /// [`ReplicaStep::step_accumulated`] count; a checkpoint saves and restores it): the
    /// position of [`Config::schedule`].
    pub fn updates(&self) -> Result<u64, Error> {
        outside_step("updates")?;
        Ok(self.lock(0)?.updates)
    }

    /// The learning rate of the optimizers (replica 0's; every replica's is the same unless a
    /// step set them apart).
    pub fn learning_rate(&self) -> Result<f64, Error> {
        outside_step("learning_rate")?;
        Ok(self.lock(0)?.optimizer.learning_rate())
    }

    /// Sets every local replica's optimizer's learning rate, between steps. With a
    /// [`Config::schedule`] the next update sets the schedule's rate again.
    pub fn set_learning_rate(&self, rate: f64) -> Result<(), Error> {
        outside_step("set_learning_rate")?;
        for r in 0..self.replicas.len() {
            self.lock(r)?.optimizer.set_learning_rate(rate);
        }
        Ok(())
    }

    /// `f` of local replica `replica`'s copy of the model, outside a step: evaluation, inference
    /// or inspection (every copy holds the same values after a step). `f`'s error (candle's, the
    /// user's) comes back as [`Error::Replica`] naming the replica, so one `?` takes both.
    ///
    /// ```
    /// # use candle_core::{DType, Tensor};
    /// # use candle_nn::{Module, Optimizer, SGD, VarBuilder};
    /// # use distribute_candle::{Config, DataParallel};
    /// # use distribute_mirrored::MirroredStrategy;
    /// # let strategy = MirroredStrategy::new(&["/cpu:0"])?;
    /// # let model = DataParallel::new(&strategy, Config::default(),
    /// #     |vb: VarBuilder| candle_nn::linear(3, 1, vb.pp("l1")), |vars| SGD::new(vars, 0.1))?;
    /// let x = Tensor::ones((2, 3), DType::F32, &candle_core::Device::Cpu)?;
    /// let y: Tensor = model.with_model(0, |m| m.forward(&x))?;
    /// assert_eq!(y.dims(), [2, 1]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_model<R, E>(
        &self,
        replica: usize,
        f: impl FnOnce(&M) -> Result<R, E>,
    ) -> Result<R, Error>
    where
        E: Into<StepError>,
    {
        outside_step("with_model")?;
        let local = self.local(replica)?;
        let replica = self.lock_settled(local)?;
        let result = f(&replica.model);
        // What `f` queued on this thread's stream is done before the replica's thread goes on.
        crate::gpu::settle(&replica.device)?;
        result.map_err(|e| Error::Replica {
            replica: self.strategy.extended().first_replica_id() + local,
            source: e.into(),
        })
    }

    /// A copy of variable `name`'s value on local replica `replica` (for inspection and tests).
    pub fn variable(&self, replica: usize, name: &str) -> Result<Tensor, Error> {
        outside_step("variable")?;
        let i = self
            .manifest
            .iter()
            .position(|v| v.name == name)
            .ok_or_else(|| Error::InvalidArgument(format!("the model has no variable '{name}'")))?;
        Ok(self.lock_settled(self.local(replica)?)?.vars[i]
            .as_tensor()
            .copy()?)
    }

    /// `replica` when it is one of this process's replicas.
    fn local(&self, replica: usize) -> Result<usize, Error> {
        if replica < self.replicas.len() {
            Ok(replica)
        } else {
            Err(Error::InvalidArgument(format!(
                "replica {replica} is not local: this process has {} replicas",
                self.replicas.len()
            )))
        }
    }

    /// [`lock`](Self::lock) for the caller's thread: first waits for the GPU work of every
    /// thread on the replica's device (candle queues each thread's work on that thread's own
    /// stream, which no other thread can wait for alone), so what the caller reads is the last
    /// step's.
    fn lock_settled(&self, r: usize) -> Result<MutexGuard<'_, Replica<M, O>>, Error> {
        let replica = self.lock(r)?;
        crate::gpu::settle(&replica.device)?;
        Ok(replica)
    }

    /// Replica `r`'s state; a replica whose lock a panic poisoned is an error, not a panic.
    fn lock(&self, r: usize) -> Result<MutexGuard<'_, Replica<M, O>>, Error> {
        self.replicas[r].lock().map_err(|_| Error::Poisoned {
            replica: self.strategy.extended().first_replica_id() + r,
        })
    }

    /// Copies replica 0's values into every other local replica; across workers, every replica
    /// takes the chief's (a safetensors buffer the chief sends).
    fn copy_from_first_replica(&self) -> Result<(), Error> {
        let extended = self.strategy.extended();
        let Some(workers) = extended.workers() else {
            let source = self.lock_settled(0)?.vars.clone();
            return self.set_replicas(1, |_, replica| {
                for (var, value) in replica.vars.iter().zip(&source) {
                    var.set(&value.as_tensor().to_device(&replica.device)?)?;
                }
                Ok(())
            });
        };
        let packed = variables::to_safetensors(&self.manifest, &self.lock_settled(0)?.vars);
        let bytes = variables::agreed(extended, packed, "reading its model's values")?;
        let chiefs = workers.bytes_from_chief(&bytes)?;
        let values = self
            .check_values(variables::from_safetensors(&chiefs)?)
            .map_err(|reason| Error::ModelMismatch(format!("the chief's values {reason}")))?;
        self.set_replicas(0, |_, replica| {
            for (var, value) in replica.vars.iter().zip(&values) {
                var.set(&value.to_device(&replica.device)?)?;
            }
            Ok(())
        })
    }

    /// `set` of every local replica from `first` on, each settled before the next.
    fn set_replicas(
        &self,
        first: usize,
        set: impl Fn(usize, &mut Replica<M, O>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        for r in first..self.replicas.len() {
            let mut replica = self.lock(r)?;
            set(r, &mut replica)?;
            replica.refresh_compute()?;
            // Queued on this thread's stream: done before the replica's thread reads them.
            crate::gpu::settle(&replica.device)?;
        }
        Ok(())
    }

    /// `tensors` in manifest order, checked against the manifest; the error says what differs.
    fn check_values(&self, mut tensors: HashMap<String, Tensor>) -> Result<Vec<Tensor>, String> {
        let mut values = Vec::with_capacity(self.manifest.len());
        for info in &self.manifest {
            let value = tensors
                .remove(&info.name)
                .ok_or_else(|| format!("has no variable '{}'", info.name))?;
            if value.dtype() != info.dtype || value.dims() != info.shape.as_slice() {
                return Err(format!(
                    "variable '{}' is {} {:?}, the model's is {} {:?}",
                    info.name,
                    value.dtype().as_str(),
                    value.dims(),
                    info.dtype.as_str(),
                    info.shape
                ));
            }
            values.push(value);
        }
        if let Some(extra) = tensors.keys().min() {
            return Err(format!("has variable '{extra}', which the model does not"));
        }
        Ok(values)
    }
}

/// ZeRO: models whose optimizer can update pieces of variables.
impl<'s, S, M, O> DataParallel<'s, S, M, O>
where
    S: Strategy,
    M: Send,
    O: ShardOptimizer + Send,
{
    /// [`new`](Self::new) with [`Config::sharding`] (any, [`Sharding::None`] included): each
    /// replica owns a shard of the flattened variables ([`Sharding`] says how they are cut)
    /// and keeps the optimizer's state of its shard only. `build_optimizer` is called with no
    /// variables (the shards hold the state of the pieces the optimizer updates).
    ///
    /// Updates go through [`ReplicaStep::backward_step`] and
    /// [`ReplicaStep::step_accumulated`]; [`ReplicaStep::all_reduce_gradients`] is refused, as
    /// the optimizer cannot step whole variables. [`save`](Self::save) and the `Checkpoints`
    /// route gather every replica's shard (every worker must call them) and write the state
    /// as an unsharded model writes it, so a checkpoint restores with any replica count and
    /// any sharding.
    ///
    /// ```
    /// use candle_core::{DType, Tensor};
    /// use candle_nn::{Module, Optimizer, ParamsAdamW, VarBuilder};
    /// use distribute_candle::{AdamW, Config, DataParallel, Sharding};
    /// use distribute_mirrored::MirroredStrategy;
    /// use distribute_values::ReduceOp;
    ///
    /// let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
    /// let config = Config { sharding: Sharding::Optimizer, ..Config::default() };
    /// let model = DataParallel::new_sharded(
    ///     &strategy,
    ///     config,
    ///     |vb: VarBuilder| candle_nn::linear(300, 10, vb.pp("l1")),
    ///     |vars| AdamW::new(vars, ParamsAdamW::default()),
    /// )?;
    /// model.run(&(), |replica, ()| {
    ///     let x = Tensor::ones((4, 300), DType::F32, replica.device())?;
    ///     let loss = replica.model().forward(&x)?.sqr()?.mean_all()?;
    ///     replica.backward_step(&loss, ReduceOp::Mean)?;
    ///     Ok(())
    /// })?;
    /// model.check_in_sync()?;
    /// // Each replica holds the moments of half of the 3,010 parameters (a shard is a whole
    /// // number of 1,024-element blocks: 2,048 and 962), and the step count.
    /// let memory = model.memory()?;
    /// assert_eq!(memory[0].optimizer_state, 2 * 2048 * 4 + 8);
    /// assert_eq!(memory[1].optimizer_state, 2 * 962 * 4 + 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new_sharded<FM, FO, EM, EO>(
        strategy: &'s S,
        config: Config,
        build_model: FM,
        build_optimizer: FO,
    ) -> Result<Self, Error>
    where
        FM: Fn(VarBuilder<'_>) -> Result<M, EM>,
        EM: Into<StepError>,
        FO: Fn(Vec<Var>) -> Result<O, EO>,
        EO: Into<StepError>,
    {
        let ops = (config.sharding != Sharding::None).then(ShardOps::<O>::of);
        Self::build(strategy, config, build_model, build_optimizer, ops)
    }
}

/// Saving and restoring the whole training state: an optimizer that says what its state is.
impl<S, M, O> DataParallel<'_, S, M, O>
where
    S: Strategy,
    M: Send,
    O: Optimizer + OptimizerState + Send,
{
    /// Writes the model's training state (replica 0's copy, every copy being equal) to `path` as
    /// safetensors: the variables under candle's names (so `VarMap::load` reads the file too),
    /// the optimizer's state under `optimizer/<variable>/<slot>` and `optimizer/<slot>`, and
    /// the number of updates applied under `training/step`; [`load`](Self::load) restores it
    /// with any replica or worker count. Every worker writes: in a multi-worker job give each
    /// worker its own path, or call it on the chief only ([`Strategy::is_chief`]);
    /// `Checkpoints` stores the model itself (it is a `CheckpointVariable`), written by the
    /// chief.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        outside_step("save")?;
        let path = path.as_ref();
        let bytes = self.to_safetensors()?;
        std::fs::write(path, bytes).map_err(|e| Error::Checkpoint {
            path: path.display().to_string(),
            reason: format!("cannot be written: {e}"),
        })
    }

    /// Replica 0's training state (every copy being equal) as a safetensors buffer; a sharded
    /// model's optimizer state gathered from every replica of every worker first.
    fn to_safetensors(&self) -> Result<Vec<u8>, Error> {
        let state = match self.shard_ops {
            Some(ops) => self.gathered_state(&ops)?,
            None => self.lock_settled(0)?.optimizer.state(),
        };
        let replica = self.lock_settled(0)?;
        training_state::to_bytes(
            &self.manifest,
            &replica.vars,
            state,
            replica.updates,
            replica.loss_scale,
        )
    }

    /// A sharded model's whole optimizer state, as an unsharded optimizer's would list it: the
    /// optimizer's own values, then every variable's slots gathered from every replica's
    /// pieces (exchanged across workers: every worker must call it).
    fn gathered_state(&self, ops: &ShardOps<O>) -> Result<Vec<StateTensor>, Error> {
        let extended = self.strategy.extended();
        let local = (|| {
            let replicas = (0..self.replicas.len())
                .map(|r| self.lock_settled(r))
                .collect::<Result<Vec<_>, Error>>()?;
            let shards = replicas.iter().filter_map(|r| r.shards.as_ref());
            shard::local_state_bytes(shards)
        })();
        let bytes = variables::agreed(extended, local, "reading its optimizer's shards")?;
        let every = shard::all_gather_bytes(extended, bytes)?;
        let replica = self.lock_settled(0)?;
        let shards = replica
            .shards
            .as_ref()
            .expect("a sharded model's replica has shards");
        let template = (ops.piece_state)(&replica.optimizer, 1, DType::F32, &replica.device)?;
        let mut state = replica.optimizer.state();
        state.extend(shard::gather_state(
            &self.manifest,
            &shards.plan,
            &template,
            &every,
        )?);
        Ok(state)
    }

    /// Sets every copy of the model from a safetensors file: the variables (exactly the
    /// model's, with their dtypes and shapes), and when the file has them ([`save`](Self::save)
    /// writes them) the optimizer's state and the number of updates. A file of variables alone
    /// (`VarMap::save`'s, pretrained weights) sets the variables and leaves the optimizers as
    /// they are. An error names the first entry that does not fit: a missing variable or
    /// optimizer slot, another dtype or shape, an entry the model or optimizer does not have.
    ///
    /// Every worker reads the file, then all take the chief's contents, so the copies stay
    /// identical; a worker that cannot read it fails every worker. Every worker must call it.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        outside_step("load")?;
        let path = path.as_ref();
        let misfit = |reason: String| Error::Checkpoint {
            path: path.display().to_string(),
            reason,
        };
        let read = std::fs::read(path).map_err(|e| misfit(format!("cannot be read: {e}")));
        let extended = self.strategy.extended();
        let bytes = variables::agreed(extended, read, "reading a checkpoint")?;
        let bytes = match extended.workers() {
            Some(workers) => workers.bytes_from_chief(&bytes)?,
            None => bytes,
        };
        let restored = self.restore_state(&bytes, false, misfit);
        variables::agreed(extended, restored, "loading a checkpoint")
    }

    /// Sets every local copy from `bytes` (a training state); `misfit` makes the error of a
    /// state that does not fit the model. With `whole`, a state of variables alone is refused.
    fn restore_state(
        &self,
        bytes: &[u8],
        whole: bool,
        misfit: impl Fn(String) -> Error,
    ) -> Result<(), Error> {
        let tensors = variables::from_safetensors(bytes).map_err(|e| misfit(e.to_string()))?;
        let saved = Saved::split(tensors).map_err(&misfit)?;
        if whole && !saved.has_training_state() {
            return Err(misfit(format!(
                "holds the variables of model '{}' but no optimizer state or step (a file of \
                 variables alone: restore it with DataParallel::load)",
                self.name
            )));
        }
        let training = saved.has_training_state();
        let step = saved.step;
        let loss_scale = match self.lock(0)?.loss_scale.is_some() {
            true => saved.loss_scale_for().map_err(&misfit)?,
            false => None,
        };
        // A sharded model expects every variable's slots whole, as an unsharded one saves
        // them; each replica then takes its pieces' parts.
        let (expected, own, template_len) = {
            let replica = self.lock(0)?;
            let own = replica.optimizer.state();
            let own_len = own.len();
            let mut expected = own;
            let mut template_len = 0;
            if let Some(ops) = &self.shard_ops {
                let template =
                    (ops.piece_state)(&replica.optimizer, 1, DType::F32, &replica.device)?;
                template_len = template.len();
                expected.extend(shard::expected_state(&self.manifest, &template)?);
            }
            (expected, own_len, template_len)
        };
        let optimizer = match training {
            true => Some(
                training_state::optimizer_values(&self.manifest, &expected, &saved.optimizer)
                    .map_err(&misfit)?,
            ),
            false => None,
        };
        let values = self.check_values(saved.variables).map_err(&misfit)?;
        self.set_replicas(0, |_, replica| {
            for (var, value) in replica.vars.iter().zip(&values) {
                var.set(&value.to_device(&replica.device)?)?;
            }
            if let Some(state) = &optimizer {
                let (whole, pieces) = state.split_at(own);
                let whole = whole
                    .iter()
                    .map(|t| t.to_device(&replica.device))
                    .collect::<candle_core::Result<Vec<_>>>()?;
                replica.optimizer.set_state(&whole)?;
                let device = replica.device.clone();
                if let Some(shards) = &mut replica.shards {
                    shard::set_state(shards, template_len, pieces, &device)?;
                }
            }
            if let Some(step) = step {
                replica.updates = step;
            }
            if loss_scale.is_some() {
                replica.loss_scale = loss_scale;
            }
            Ok(())
        })
    }
}

/// The model's training state in a job's checkpoints: one entry, under [`Config::name`],
/// holding the variables, the optimizer's state and the number of updates as safetensors (the
/// format of [`DataParallel::save`]), so `Checkpoints` saves and restores a candle model and its
/// optimizer beside the job's other variables and its input position, on any replica and worker
/// count. Restoring refuses a state that does not fit, naming the entry (a missing moment,
/// another shape, another optimizer's slots).
///
/// ```
/// use candle_nn::{Optimizer, SGD, VarBuilder};
/// use distribute_candle::{Config, DataParallel};
/// use distribute_input::InputPosition;
/// use distribute_mirrored::MirroredStrategy;
/// use distribute_strategy::{CheckpointOptions, Checkpoints};
///
/// let dir = tempfile::tempdir()?;
/// let checkpoints = Checkpoints::new(dir.path(), CheckpointOptions { every: 1, keep: 1 })?;
/// let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
/// let build = |vb: VarBuilder| candle_nn::linear(3, 1, vb.pp("l1"));
/// let model = DataParallel::new(&strategy, Config::default(), build, |v| SGD::new(v, 0.1))?;
/// checkpoints.save(&strategy, 1, &[&model], InputPosition::at_step(1))?;
///
/// let other = MirroredStrategy::new(&["/cpu:0"])?;
/// let again = DataParallel::new(&other, Config::default(), build, |v| SGD::new(v, 0.1))?;
/// let resume = checkpoints.restore(&other, &[&again])?.expect("a checkpoint");
/// assert_eq!(resume.step, 1);
/// assert_eq!(
///     again.variable(0, "l1.weight")?.to_vec2::<f32>()?,
///     model.variable(0, "l1.weight")?.to_vec2::<f32>()?
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl<S, M, O> CheckpointVariable for DataParallel<'_, S, M, O>
where
    S: Strategy,
    M: Send,
    O: Optimizer + OptimizerState + Send,
{
    fn checkpoint_name(&self) -> &str {
        self.name
    }

    /// Every candle model is stored alike; what its variables must be is checked on restore,
    /// naming the first that differs.
    fn signature(&self) -> String {
        "a candle model and its optimizer (safetensors)".into()
    }

    fn saved_bytes(&self, _extended: &dyn StrategyExtended) -> Result<Vec<u8>, StrategyError> {
        outside_step("saved_bytes").map_err(StrategyError::step)?;
        self.to_safetensors().map_err(StrategyError::step)
    }

    fn restore_bytes(
        &self,
        _extended: &dyn StrategyExtended,
        bytes: &[u8],
    ) -> Result<(), StrategyError> {
        outside_step("restore_bytes").map_err(StrategyError::step)?;
        // Every worker got the chief's bytes: each checks and sets its own copies.
        self.restore_state(bytes, true, |reason| {
            Error::ModelMismatch(format!("the checkpoint {reason}"))
        })
        .map_err(StrategyError::step)
    }
}
