//! [`ReplicaContext`]: what a step function sees inside one replica.

use std::sync::Arc;

use distribute_collectives::ReplicaCollectives;
use distribute_tensor::Tensor;
use distribute_values::{
    Distributed, DistributedVariable, Leaf, Nest, PerReplica, ReduceOp, Regroup, UpdateOp,
    VariableAggregation, VariableValue, regroup, select_replica,
};

use crate::StrategyError;
use crate::variables::{VariableOptions, canonicalize_variable_name, create_distributed_variable};

use super::cross_replica::CrossReplicaContext;
use super::in_step::{self, CrossReplicaSection};
use super::{MergeArgs, MergeResult, StrategyExtended, initial_value_from_chief};

/// The context of a step function inside one replica: which replica this is, collectives with the
/// other replicas, and `merge_call` into cross-replica context.
///
/// While it lives, its thread counts as running a replica's step: cross-replica operations
/// reached through a strategy the step captured (`strategy.cross_replica().update(…)`) fail
/// with [`StrategyError::CrossReplicaInReplica`] instead of racing the other replicas.
pub struct ReplicaContext<'a> {
    replica_id: usize,
    extended: &'a dyn StrategyExtended,
    collectives: &'a dyn ReplicaCollectives,
}

impl Drop for ReplicaContext<'_> {
    fn drop(&mut self) {
        in_step::leave();
    }
}

impl<'a> ReplicaContext<'a> {
    /// The context of replica `replica_id`; strategies build it for each replica's step, on the
    /// thread that runs the step, and drop it when the step returns.
    pub fn new(
        replica_id: usize,
        extended: &'a dyn StrategyExtended,
        collectives: &'a dyn ReplicaCollectives,
    ) -> Self {
        in_step::enter();
        ReplicaContext {
            replica_id,
            extended,
            collectives,
        }
    }

    /// This replica's id, in `0..num_replicas_in_sync`: global, so worker `w`'s local replica
    /// `r` is `w·R + r` in a multi-worker run.
    pub fn replica_id(&self) -> usize {
        self.extended.first_replica_id() + self.replica_id
    }

    /// The number of replicas running the step together (every worker's).
    pub fn num_replicas_in_sync(&self) -> usize {
        self.extended.total_replicas()
    }

    /// This replica's device, where its values live (its first device when it spans several
    /// logical devices): `ctx.device()` is where a replica creates its tensors.
    pub fn device(&self) -> &str {
        &self.devices()[0]
    }

    /// This replica's devices (more than one for a replica over several logical devices).
    pub fn devices(&self) -> &[String] {
        self.extended
            .device_map()
            .devices_for_replica(self.replica_id)
            .expect("the replica id is in range")
    }

    /// Collective calls with the other replicas (all-gather, reduce-scatter, broadcast, …).
    pub fn collectives(&self) -> &dyn ReplicaCollectives {
        self.collectives
    }

    /// The reduction of `value` (a tensor or a nested structure of tensors: tuples, `Vec`s,
    /// maps, `Option`s, `#[derive(Nest)]` structs) across replicas; every replica gets the
    /// result, on its own devices. All tensors travel in one fused rendezvous. Every leaf must be
    /// a tensor; another leaf is a `TypeError` naming its path. `Mean` of an integer tensor is
    /// its exact mean as float64 (TF's true division), bitwise equal to `Strategy::reduce`'s.
    pub fn all_reduce<V: Nest>(&self, op: ReduceOp, value: &V) -> Result<V, StrategyError> {
        let flat = value.leaves::<Tensor>()?;
        let reduced = self.collectives.batch_all_reduce(op, &flat)?;
        if reduced.len() != flat.len() {
            return Err(StrategyError::Invariant(format!(
                "{} tensors were all-reduced but {} came back",
                flat.len(),
                reduced.len()
            )));
        }
        Ok(value.with_leaves(reduced)?)
    }

    /// Pauses every replica, runs replica 0's `merge_fn` once in cross-replica context on all
    /// replicas' `args` (regrouped: `PerReplica` where they differ), and gives each replica its
    /// part of the result (`select_replica`). Every replica must make the same merge calls in the
    /// same order.
    ///
    /// The types are inferred as `run`'s are: the arguments name their regrouped form, and the
    /// merge function's result (a [`Distributed`] structure: `()`, a [`Leaf`], a tuple of them,
    /// a `#[derive(Nest)]` struct's companion) names what each replica gets back.
    ///
    /// ```
    /// use distribute_tensor::Tensor;
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    /// use distribute_values::Leaf;
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let doubled = strategy.run(
    ///     |ctx, ()| {
    ///         let mine = Tensor::scalar(ctx.device(), 2.0f32);
    ///         ctx.merge_call(mine, |_cross, all| {
    ///             let first = all.local_results()[0].to_vec::<f32>()?[0];
    ///             Ok(Leaf::Same(first * 2.0))
    ///         })
    ///     },
    ///     &(),
    /// )?;
    /// assert_eq!(doubled, Leaf::Same(4.0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn merge_call<A, R, F>(&self, args: A, merge_fn: F) -> Result<R::Local, StrategyError>
    where
        A: Regroup + Send + 'static,
        R: Distributed + Send + Sync + 'static,
        F: FnOnce(&CrossReplicaContext<'_>, A::Regrouped) -> Result<R, StrategyError>,
    {
        let extended = self.extended;
        let mut merge_fn = Some(merge_fn);
        let mut run = |all: Vec<MergeArgs>| -> Result<MergeResult, StrategyError> {
            let args = downcast_all::<A>(all, "merge_call arguments")?;
            let grouped = regroup(extended.device_map(), args)?;
            let merge_fn = merge_fn
                .take()
                .ok_or_else(|| StrategyError::Invariant("a merge function ran twice".into()))?;
            let _cross_replica = CrossReplicaSection::enter();
            let result = merge_fn(&CrossReplicaContext::new(extended), grouped)?;
            Ok(Arc::new(result))
        };
        let shared = extended.merge(self.replica_id, Box::new(args), &mut run)?;
        let result = shared.downcast_ref::<R>().ok_or_else(|| {
            StrategyError::Runtime(
                "replica 0's merge function returned another type than this replica's expects; \
                 every replica must make the same merge_call"
                    .into(),
            )
        })?;
        Ok(select_replica::<R::Local>(self.replica_id, result)?)
    }

    /// Creates a distributed variable from inside the step: replica 0 creates it with its name and
    /// initial value, and every replica gets that same variable (TF's shared variable creator).
    /// Across workers, the chief's replica 0's initial value wins on every worker.
    /// Replicas must create variables in the same order, with names that canonicalize alike
    /// (`foo_1` and `foo` do; `foo` and `bar` do not).
    pub fn create_variable<T>(
        &self,
        name: Option<&str>,
        initial: T,
        options: VariableOptions,
    ) -> Result<DistributedVariable<T>, StrategyError>
    where
        T: VariableValue + Send + Sync + 'static,
    {
        let extended = self.extended;
        let request = (name.map(str::to_owned), initial, options);
        let mut create = |all: Vec<MergeArgs>| -> Result<MergeResult, StrategyError> {
            let requests =
                downcast_all::<(Option<String>, T, VariableOptions)>(all, "variable creation")?;
            let canonical: Vec<String> = requests
                .iter()
                .map(|(name, _, _)| canonicalize_variable_name(name.as_deref()))
                .collect();
            if let Some(r) = canonical.iter().position(|c| *c != canonical[0]) {
                return Err(StrategyError::Runtime(format!(
                    "replicas created variables whose names do not match: replica 0 '{}', replica \
                     {r} '{}'; every replica must create the same variables in the same order",
                    canonical[0], canonical[r]
                )));
            }
            let (name, initial, options) = requests.into_iter().next().expect("replica 0");
            let name = name.unwrap_or_else(|| "Variable".to_owned());
            let initial = initial_value_from_chief(extended, &name, initial)?;
            let variable =
                create_distributed_variable(&name, extended.device_map(), initial, options)?;
            Ok(Arc::new(variable))
        };
        let shared = extended.merge(self.replica_id, Box::new(request), &mut create)?;
        shared
            .downcast_ref::<DistributedVariable<T>>()
            .cloned()
            .ok_or_else(|| {
                StrategyError::Runtime(
                    "replicas created variables of different types at the same point".into(),
                )
            })
    }

    /// This replica's value of `variable`.
    pub fn read_variable<T: VariableValue>(
        &self,
        variable: &DistributedVariable<T>,
    ) -> Result<T, StrategyError> {
        Ok(variable.component(self.replica_id)?.read())
    }

    /// TF's `assign`, `assign_add` and `assign_sub` inside a replica, where `value` is this
    /// replica's own contribution (a per-replica value); returns the new value this replica sees.
    ///
    /// - A sync-on-read variable, or a mirrored one with aggregation `None`, updates only this
    ///   replica's copy.
    /// - A mirrored variable with an aggregation gathers every replica's `value` (a `merge_call`),
    ///   aggregates it (`Sum`, `Mean` or replica 0's for `OnlyFirstReplica`) and applies the
    ///   result to every copy. Contributions are never merged because they happen to be equal:
    ///   two replicas adding `1.0` to a `Sum` variable add `2.0`.
    ///
    /// For a value that is the same on every replica by construction (TF's Python constant), use
    /// [`update_variable_with_constant`](Self::update_variable_with_constant).
    pub fn update_variable<T>(
        &self,
        variable: &DistributedVariable<T>,
        op: UpdateOp,
        value: T,
    ) -> Result<T, StrategyError>
    where
        T: VariableValue + PartialEq + Send + Sync + 'static,
    {
        self.update_gathered(variable, op, value, Contribution::PerReplica)
    }

    /// Like [`update_variable`](Self::update_variable) for a value that is the same on every
    /// replica, not one per replica (TF's non-distributed value): `Mean` and `OnlyFirstReplica`
    /// use it as it is, and `Sum` over several replicas is refused, since it would multiply the
    /// value by the replica count. Replicas passing different values is an error.
    pub fn update_variable_with_constant<T>(
        &self,
        variable: &DistributedVariable<T>,
        op: UpdateOp,
        value: T,
    ) -> Result<T, StrategyError>
    where
        T: VariableValue + PartialEq + Send + Sync + 'static,
    {
        self.update_gathered(variable, op, value, Contribution::Constant)
    }

    fn update_gathered<T>(
        &self,
        variable: &DistributedVariable<T>,
        op: UpdateOp,
        value: T,
        contribution: Contribution,
    ) -> Result<T, StrategyError>
    where
        T: VariableValue + PartialEq + Send + Sync + 'static,
    {
        let mirrored = match variable {
            DistributedVariable::SyncOnRead(v) => {
                return Ok(v.update_local(self.replica_id, op, &value)?);
            }
            DistributedVariable::Mirrored(v) if v.aggregation() == VariableAggregation::None => {
                return Ok(v.update_local(self.replica_id, op, &value)?);
            }
            DistributedVariable::Mirrored(v) => v.clone(),
        };
        let devices = Arc::clone(self.extended.device_map());
        let extended = self.extended;
        let mut apply = |all: Vec<MergeArgs>| -> Result<MergeResult, StrategyError> {
            let values = downcast_all::<T>(all, "variable update values")?;
            // In a multi-worker run every worker aggregates every worker's contributions, in
            // global replica order, so that the copies on all workers stay bit-identical.
            if let Some(every) = contributions_of_every_worker(extended, mirrored.name(), &values)?
            {
                return Ok(Arc::new(match contribution {
                    Contribution::PerReplica => mirrored.update_aggregated_across(op, &every)?,
                    Contribution::Constant => {
                        constant_across_workers(&mirrored, &every, extended.total_replicas())?;
                        mirrored.update_aggregated(op, &Leaf::Same(every[0].clone()))?
                    }
                }));
            }
            let gathered = match contribution {
                Contribution::PerReplica => {
                    Leaf::PerReplica(PerReplica::new(Arc::clone(&devices), values)?)
                }
                Contribution::Constant => {
                    if let Some(r) = values.iter().position(|v| *v != values[0]) {
                        return Err(StrategyError::InvalidArgument(format!(
                            "update of '{}' with a constant: replica 0 passed {:?} but replica {r} passed \
                             {:?}; pass per-replica values with update_variable",
                            mirrored.name(),
                            values[0],
                            values[r]
                        )));
                    }
                    Leaf::Same(values.into_iter().next().expect("one value per replica"))
                }
            };
            Ok(Arc::new(mirrored.update_aggregated(op, &gathered)?))
        };
        let result = self
            .extended
            .merge(self.replica_id, Box::new(value), &mut apply)?;
        result.downcast_ref::<T>().cloned().ok_or_else(|| {
            StrategyError::Runtime(
                "replicas updated variables of different types at the same point".into(),
            )
        })
    }
}

/// How the values replicas pass to a variable update combine.
#[derive(Debug, Clone, Copy)]
enum Contribution {
    /// Each replica's value is its own share.
    PerReplica,
    /// Every replica passes the same value.
    Constant,
}

/// Every replica's contribution on every worker, in global replica order, when the strategy
/// spans several workers (`None` in one process). Each value travels as its wire bytes, each
/// preceded by its length; values of a type that cannot travel are an error.
fn contributions_of_every_worker<T: VariableValue>(
    extended: &dyn StrategyExtended,
    name: &str,
    values: &[T],
) -> Result<Option<Vec<T>>, StrategyError> {
    if extended.total_replicas() == extended.num_replicas() {
        return Ok(None);
    }
    let cannot_travel = || {
        StrategyError::InvalidArgument(format!(
            "update of '{name}': its values cannot be sent to other workers, so a multi-worker \
             update cannot aggregate them"
        ))
    };
    let mut mine = Vec::new();
    for value in values {
        let wire = value.to_wire().ok_or_else(cannot_travel)?;
        mine.extend_from_slice(&(wire.len() as u64).to_le_bytes());
        mine.extend_from_slice(&wire);
    }
    let Some(workers) = extended.workers().map(|w| w.exchange(&mine)).transpose()? else {
        return Ok(None);
    };
    let like = &values[0];
    let mut every = Vec::with_capacity(extended.total_replicas());
    for (worker, bytes) in workers.iter().enumerate() {
        let mut rest = bytes.as_slice();
        while !rest.is_empty() {
            let value = (rest.len() >= 8)
                .then(|| u64::from_le_bytes(rest[..8].try_into().expect("8 bytes")) as usize)
                .filter(|&len| rest.len() - 8 >= len)
                .and_then(|len| {
                    let value = like.like_from_wire(&rest[8..8 + len]);
                    rest = &rest[8 + len..];
                    value
                })
                .ok_or_else(|| {
                    StrategyError::Runtime(format!(
                        "update of '{name}': worker {worker} sent a value unlike this worker's \
                         (another dtype or shape); every replica must pass values alike"
                    ))
                })?;
            every.push(value);
        }
    }
    if every.len() != extended.total_replicas() {
        return Err(StrategyError::Runtime(format!(
            "update of '{name}': {} contributions came from the workers for {} replicas",
            every.len(),
            extended.total_replicas()
        )));
    }
    Ok(Some(every))
}

/// Checks that a constant update passed the same value on every replica of every worker, and
/// refuses a `Sum` of it over several replicas (it would multiply the value by their count).
fn constant_across_workers<T: VariableValue + PartialEq>(
    mirrored: &distribute_values::MirroredVariable<T>,
    every: &[T],
    total_replicas: usize,
) -> Result<(), StrategyError> {
    if let Some(r) = every.iter().position(|v| *v != every[0]) {
        return Err(StrategyError::InvalidArgument(format!(
            "update of '{}' with a constant: replica 0 passed {:?} but replica {r} passed {:?}; \
             pass per-replica values with update_variable",
            mirrored.name(),
            every[0],
            every[r]
        )));
    }
    if mirrored.aggregation() == VariableAggregation::Sum
        && total_replicas > 1
        && !every[0].is_zero()
    {
        return Err(distribute_values::ValuesError::SumOfNonDistributed {
            value: format!("{:?}", every[0]),
            num_replicas: total_replicas,
        }
        .into());
    }
    Ok(())
}

/// Moves every replica's boxed arguments back to `A`, or explains which replica passed what.
fn downcast_all<A: 'static>(all: Vec<MergeArgs>, what: &str) -> Result<Vec<A>, StrategyError> {
    all.into_iter()
        .enumerate()
        .map(|(r, boxed)| {
            boxed.downcast::<A>().map(|a| *a).map_err(|_| {
                StrategyError::Runtime(format!(
                    "replica {r} passed {what} of another type than replica 0; every replica must \
                     make the same calls in the same order"
                ))
            })
        })
        .collect()
}
