//! The typed contexts: [`ReplicaContext`], which a step function gets inside one replica, and
//! [`CrossReplicaContext`], which merge functions and code outside `run` get. Cross-replica
//! operations exist only on the second type, so calling one from a replica does not compile.
//!
//! ```compile_fail
//! use distribute_strategy::{DefaultStrategy, Strategy};
//! use distribute_values::ReduceOp;
//!
//! let strategy = DefaultStrategy::new().unwrap();
//! strategy.run(|ctx, ()| {
//!     // A replica context has no `reduce_to`: reduce with `all_reduce`, or in a `merge_call`.
//!     ctx.reduce_to(ReduceOp::Sum, todo!(), todo!())?;
//!     Ok(())
//! }, &());
//! ```
//!
//! Nor can cross-replica code call `merge_call` (it is already in cross-replica context):
//!
//! ```compile_fail,E0599
//! use distribute_strategy::{DefaultStrategy, Strategy};
//!
//! let strategy = DefaultStrategy::new().unwrap();
//! strategy.cross_replica().merge_call((), |_, _| Ok(()));
//! ```
//!
//! Reduce ops and variable aggregations are different types, so passing an aggregation where a
//! reduce op is expected (TF's SM-49 `Invariant` error) does not compile:
//!
//! ```compile_fail,E0308
//! use distribute_collectives::Tensor;
//! use distribute_strategy::{DefaultStrategy, Strategy};
//! use distribute_values::{Leaf, VariableAggregation};
//!
//! let strategy = DefaultStrategy::new().unwrap();
//! let value = Leaf::Same(Tensor::scalar("/cpu:0", 1.0f32));
//! strategy.reduce(VariableAggregation::Sum, &value, None);
//! ```

use std::any::Any;
use std::sync::Arc;

use distribute_collectives::{
    AnyTensor, CrossDeviceOps, Destinations, ReplicaCollectives, Tensor,
    reduce_non_distributed_value,
};
use distribute_values::{
    DistributedValues, DistributedVariable, Leaf, Nest, PerReplica, ReduceOp, Regroup,
    ReplicaDeviceMap, UpdateOp, VariableAggregation, VariableValue, regroup, select_replica,
};

use crate::StrategyError;
use crate::variables::{
    VariableCreator, VariableOptions, canonicalize_variable_name, create_distributed_variable,
};

/// Arguments one replica passes to `merge_call`, type-erased for the rendezvous.
pub type MergeArgs = Box<dyn Any + Send>;

/// What replica 0's merge function returned, shared with every replica.
pub type MergeResult = Arc<dyn Any + Send + Sync>;

/// The object-safe core of a strategy, which its contexts call into (TF's `StrategyExtended`).
pub trait StrategyExtended: Send + Sync {
    /// The replicas' devices.
    fn device_map(&self) -> &Arc<ReplicaDeviceMap>;

    /// The number of replicas.
    fn num_replicas(&self) -> usize {
        self.device_map().num_replicas()
    }

    /// How values move between the devices.
    fn cross_device_ops(&self) -> &dyn CrossDeviceOps;

    /// The host CPU device, where `Strategy::reduce` delivers.
    fn host_device(&self) -> &str;

    /// Whether this process initializes variables (TF's `experimental_should_init`). Every
    /// in-process strategy does; a multi-worker strategy answers for its task.
    fn should_init(&self) -> bool {
        true
    }

    /// Whether this process writes checkpoints (TF's `should_checkpoint`): true for the default
    /// and single-worker mirrored strategies; only the chief in a multi-worker cluster.
    fn should_checkpoint(&self) -> bool {
        true
    }

    /// Whether this process writes summaries (TF's `should_save_summary`): as
    /// [`should_checkpoint`](Self::should_checkpoint).
    fn should_save_summary(&self) -> bool {
        true
    }

    /// Whether each worker runs its own copy of the program (TF's
    /// `experimental_between_graph`): false for the default and single-worker mirrored strategies,
    /// whose one process drives every replica.
    fn between_graph(&self) -> bool {
        false
    }

    /// The `merge_call` rendezvous: `replica` deposits `args` and waits for every replica; replica
    /// 0 then calls its `merge` with every replica's arguments in replica order, and every replica
    /// gets the result. Fails (never hangs) when replicas make different numbers of calls or one
    /// of them fails.
    fn merge(
        &self,
        replica: usize,
        args: MergeArgs,
        merge: &mut dyn FnMut(Vec<MergeArgs>) -> Result<MergeResult, StrategyError>,
    ) -> Result<MergeResult, StrategyError>;
}

/// The context of a step function inside one replica: which replica this is, collectives with the
/// other replicas, and `merge_call` into cross-replica context.
pub struct ReplicaContext<'a> {
    replica_id: usize,
    extended: &'a dyn StrategyExtended,
    collectives: &'a dyn ReplicaCollectives,
}

impl<'a> ReplicaContext<'a> {
    /// The context of replica `replica_id`; strategies build it for each replica's step.
    pub fn new(
        replica_id: usize,
        extended: &'a dyn StrategyExtended,
        collectives: &'a dyn ReplicaCollectives,
    ) -> Self {
        ReplicaContext {
            replica_id,
            extended,
            collectives,
        }
    }

    /// This replica's id, in `0..num_replicas_in_sync`.
    pub fn replica_id(&self) -> usize {
        self.replica_id
    }

    /// The number of replicas running the step together.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.extended.num_replicas()
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
    /// maps, `Option`s, `#[derive(Regroup)]` structs) across replicas; every replica gets the
    /// result, on its own devices. All tensors travel in one fused rendezvous. Every leaf must be
    /// a tensor; another leaf is a `TypeError` naming its path.
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
    pub fn merge_call<A, S, F>(&self, args: A, merge_fn: F) -> Result<S, StrategyError>
    where
        A: Regroup + Send + 'static,
        S: Regroup,
        S::Regrouped: Send + Sync + 'static,
        F: FnOnce(&CrossReplicaContext<'_>, A::Regrouped) -> Result<S::Regrouped, StrategyError>,
    {
        let extended = self.extended;
        let mut merge_fn = Some(merge_fn);
        let mut run = |all: Vec<MergeArgs>| -> Result<MergeResult, StrategyError> {
            let args = downcast_all::<A>(all, "merge_call arguments")?;
            let grouped = regroup(extended.device_map(), args)?;
            let merge_fn = merge_fn
                .take()
                .ok_or_else(|| StrategyError::Invariant("a merge function ran twice".into()))?;
            let result = merge_fn(&CrossReplicaContext::new(extended), grouped)?;
            Ok(Arc::new(result))
        };
        let shared = extended.merge(self.replica_id, Box::new(args), &mut run)?;
        let result = shared.downcast_ref::<S::Regrouped>().ok_or_else(|| {
            StrategyError::Runtime(
                "replica 0's merge function returned another type than this replica's expects; \
                 every replica must make the same merge_call"
                    .into(),
            )
        })?;
        Ok(select_replica::<S>(self.replica_id, result)?)
    }

    /// Creates a distributed variable from inside the step: replica 0 creates it with its name and
    /// initial value, and every replica gets that same variable (TF's shared variable creator).
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
        let mut apply = |all: Vec<MergeArgs>| -> Result<MergeResult, StrategyError> {
            let values = downcast_all::<T>(all, "variable update values")?;
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

/// The context of code that sees every replica at once: a merge function, or code outside `run`.
/// It reduces, broadcasts and updates distributed values.
#[derive(Clone, Copy)]
pub struct CrossReplicaContext<'a> {
    extended: &'a dyn StrategyExtended,
}

impl<'a> CrossReplicaContext<'a> {
    /// The cross-replica context of a strategy.
    pub fn new(extended: &'a dyn StrategyExtended) -> Self {
        CrossReplicaContext { extended }
    }

    /// The number of replicas.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.extended.num_replicas()
    }

    /// The replicas' devices.
    pub fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        self.extended.device_map()
    }

    /// The strategy's cross-device operations.
    pub fn cross_device_ops(&self) -> &dyn CrossDeviceOps {
        self.extended.cross_device_ops()
    }

    /// The devices of every replica, as destinations.
    pub fn all_devices(&self) -> Result<Destinations, StrategyError> {
        Ok(Destinations::of_map(self.device_map())?)
    }

    /// Reduces `value` and delivers it to `destinations` (TF's `reduce_to`):
    /// - per-replica values go through the cross-device ops;
    /// - a mirrored value reduced with `Mean` is returned as it is, with no communication; with
    ///   `Sum`, `Min` or `Max` it is refused (it is one value, not one per replica);
    /// - a plain value follows `reduce_non_distributed_value` (`Mean` keeps it; `Sum` is only
    ///   defined for one replica or zeros).
    pub fn reduce_to(
        &self,
        op: ReduceOp,
        value: &Leaf<Tensor>,
        destinations: &Destinations,
    ) -> Result<Leaf<Tensor>, StrategyError> {
        match value {
            Leaf::Mirrored(_) if op == ReduceOp::Mean => Ok(value.clone()),
            Leaf::Mirrored(_) => Err(StrategyError::Invariant(format!(
                "cannot reduce a Mirrored value with {op}: it holds one value, not one per \
                 replica; reduce the per-replica values instead"
            ))),
            Leaf::Same(t) => Ok(reduce_non_distributed_value(
                op,
                t,
                destinations,
                self.num_replicas_in_sync(),
            )?),
            Leaf::PerReplica(p) => {
                let values: Vec<AnyTensor> = p.values().iter().cloned().map(Into::into).collect();
                let reduced = self.cross_device_ops().reduce(op, &values, destinations)?;
                dense_leaf(reduced)
            }
        }
    }

    /// Several [`reduce_to`](Self::reduce_to)s in one call; per-replica values are fused into
    /// buckets by the cross-device ops.
    pub fn batch_reduce_to(
        &self,
        op: ReduceOp,
        pairs: &[(&Leaf<Tensor>, &Destinations)],
    ) -> Result<Vec<Leaf<Tensor>>, StrategyError> {
        let per_replica: Vec<(usize, Vec<AnyTensor>)> = pairs
            .iter()
            .enumerate()
            .filter_map(|(i, (value, _))| match value {
                Leaf::PerReplica(p) => {
                    Some((i, p.values().iter().cloned().map(Into::into).collect()))
                }
                _ => None,
            })
            .collect();
        let batch: Vec<(&[AnyTensor], &Destinations)> = per_replica
            .iter()
            .map(|(i, values)| (values.as_slice(), pairs[*i].1))
            .collect();
        let mut reduced = self
            .cross_device_ops()
            .batch_reduce(op, &batch)?
            .into_iter();
        pairs
            .iter()
            .map(|(value, destinations)| match value {
                Leaf::PerReplica(_) => dense_leaf(reduced.next().expect("one result per pair")),
                other => self.reduce_to(op, other, destinations),
            })
            .collect()
    }

    /// A copy of `tensor` on every destination device.
    pub fn broadcast_to(
        &self,
        tensor: &Tensor,
        destinations: &Destinations,
    ) -> Result<Leaf<Tensor>, StrategyError> {
        Ok(self.cross_device_ops().broadcast(tensor, destinations)?)
    }

    /// TF's `extended.update` with an update op: a plain value is applied to every copy; a
    /// per-replica or mirrored value gives copy `i` its value `i`.
    pub fn update<T: VariableValue>(
        &self,
        variable: &DistributedVariable<T>,
        op: UpdateOp,
        value: &Leaf<T>,
    ) -> Result<(), StrategyError> {
        let per_replica = |values: &[T]| -> Result<PerReplica<T>, StrategyError> {
            Ok(PerReplica::new(
                Arc::clone(self.device_map()),
                values.to_vec(),
            )?)
        };
        match (variable, value) {
            (DistributedVariable::Mirrored(v), Leaf::Same(x)) => Ok(v.assign_cross_replica(op, x)?),
            (DistributedVariable::SyncOnRead(v), Leaf::Same(x)) => {
                Ok(v.assign_cross_replica(op, x)?)
            }
            (DistributedVariable::Mirrored(v), Leaf::PerReplica(p)) => {
                Ok(v.update_per_component(op, p)?)
            }
            (DistributedVariable::SyncOnRead(v), Leaf::PerReplica(p)) => {
                Ok(v.update_per_component(op, p)?)
            }
            (DistributedVariable::Mirrored(v), Leaf::Mirrored(m)) => {
                Ok(v.update_per_component(op, &per_replica(m.values())?)?)
            }
            (DistributedVariable::SyncOnRead(v), Leaf::Mirrored(m)) => {
                Ok(v.update_per_component(op, &per_replica(m.values())?)?)
            }
        }
    }

    /// TF's `extended.update(var, fn)`: `f(update, current)` computes each copy's new value
    /// (an optimizer step applied on every device); [`UpdateContext`] says which copy and device.
    /// All new values are computed before any is written, so a failure leaves the variable
    /// unchanged.
    ///
    /// ```
    /// use distribute_strategy::{DefaultStrategy, Strategy, VariableOptions};
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let w = strategy.create_variable("w", 1.0f32, VariableOptions::default())?;
    /// strategy.cross_replica().update_with(&w, |update, w| {
    ///     assert_eq!(update.device(), "/job:localhost/replica:0/task:0/device:CPU:0");
    ///     Ok(w - 0.5)
    /// })?;
    /// assert_eq!(strategy.cross_replica().read_var(&w)?, 0.5);
    /// # Ok::<(), distribute_strategy::StrategyError>(())
    /// ```
    pub fn update_with<T: VariableValue>(
        &self,
        variable: &DistributedVariable<T>,
        mut f: impl FnMut(&UpdateContext<'_>, &T) -> Result<T, StrategyError>,
    ) -> Result<(), StrategyError> {
        let components = (0..self.num_replicas_in_sync())
            .map(|r| variable.component(r))
            .collect::<Result<Vec<_>, _>>()?;
        let updated = components
            .iter()
            .map(|component| {
                let update = UpdateContext {
                    replica: component.replica(),
                    device: component.device(),
                };
                f(&update, &component.read())
            })
            .collect::<Result<Vec<T>, StrategyError>>()?;
        let values = Leaf::PerReplica(PerReplica::new(Arc::clone(self.device_map()), updated)?);
        self.update(variable, UpdateOp::Assign, &values)
    }

    /// The value of `variable` seen across replicas (TF's `read_var`): a mirrored variable's
    /// primary copy, a sync-on-read variable's aggregate.
    pub fn read_var<T: VariableValue>(
        &self,
        variable: &DistributedVariable<T>,
    ) -> Result<T, StrategyError> {
        match variable {
            DistributedVariable::Mirrored(v) => Ok(v.primary()),
            DistributedVariable::SyncOnRead(v) => Ok(v.read_cross_replica()?),
        }
    }

    /// The devices that state not tied to one variable (a step counter, an optimizer's iteration
    /// count) is kept on: the primary devices of `colocate_with`'s replicas, or every replica's
    /// when it is `None`.
    pub fn non_slot_devices<T: VariableValue>(
        &self,
        colocate_with: Option<&DistributedVariable<T>>,
    ) -> Vec<String> {
        let map = match colocate_with {
            Some(variable) => variable_device_map(variable),
            None => self.device_map(),
        };
        map.primary_devices().map(str::to_owned).collect()
    }

    /// Runs `f` once on each [`non_slot_devices`](Self::non_slot_devices) device, with an
    /// [`UpdateContext`] naming it, and returns the results in device order (TF's
    /// `update_non_slot`: e.g. an optimizer's step counter kept beside a variable).
    ///
    /// ```
    /// use distribute_strategy::{DefaultStrategy, Strategy};
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let cross = strategy.cross_replica();
    /// let devices = cross.update_non_slot::<f32, _>(None, |update| Ok(update.device().to_owned()))?;
    /// assert_eq!(devices, cross.non_slot_devices::<f32>(None));
    /// # Ok::<(), distribute_strategy::StrategyError>(())
    /// ```
    pub fn update_non_slot<T: VariableValue, R>(
        &self,
        colocate_with: Option<&DistributedVariable<T>>,
        mut f: impl FnMut(&UpdateContext<'_>) -> Result<R, StrategyError>,
    ) -> Result<Vec<R>, StrategyError> {
        let map = match colocate_with {
            Some(variable) => variable_device_map(variable),
            None => self.device_map(),
        };
        map.primary_devices()
            .enumerate()
            .map(|(replica, device)| f(&UpdateContext { replica, device }))
            .collect()
    }

    /// A creator of variables placed like `variable`, on its devices rather than the strategy's
    /// (TF's `colocate_vars_with`): an optimizer's slots live beside the variable they belong to.
    ///
    /// ```
    /// use distribute_strategy::{DefaultStrategy, Strategy, VariableOptions};
    ///
    /// let strategy = DefaultStrategy::new()?;
    /// let w = strategy.create_variable("w", 1.0f32, VariableOptions::default())?;
    /// let slot = strategy
    ///     .cross_replica()
    ///     .colocate_vars_with(&w)
    ///     .create_variable("w/momentum", 0.0f32, VariableOptions::default())?;
    /// assert_eq!(slot.component(0)?.device(), w.component(0)?.device());
    /// # Ok::<(), distribute_strategy::StrategyError>(())
    /// ```
    pub fn colocate_vars_with<T: VariableValue>(
        &self,
        variable: &DistributedVariable<T>,
    ) -> VariableCreator {
        VariableCreator::new(Arc::new(variable_device_map(variable).clone()))
    }
}

/// Where one update runs (TF's `UpdateContext`, read there with `get_update_device`): the
/// replica whose copy of a variable is being updated, and its device. The functions that
/// [`CrossReplicaContext::update_with`] and [`CrossReplicaContext::update_non_slot`] run get one,
/// so an optimizer can place its work on the copy's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateContext<'a> {
    replica: usize,
    device: &'a str,
}

impl<'a> UpdateContext<'a> {
    /// The replica whose copy is updated.
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// The device the update runs on.
    pub fn device(&self) -> &'a str {
        self.device
    }
}

fn variable_device_map<T: VariableValue>(variable: &DistributedVariable<T>) -> &ReplicaDeviceMap {
    match variable {
        DistributedVariable::Mirrored(v) => v.device_map(),
        DistributedVariable::SyncOnRead(v) => v.device_map(),
    }
}

/// A dense reduction result as a `Leaf<Tensor>`.
fn dense_leaf(leaf: Leaf<AnyTensor>) -> Result<Leaf<Tensor>, StrategyError> {
    let dense = |t: AnyTensor| -> Result<Tensor, StrategyError> { Ok(t.to_dense()?) };
    Ok(match leaf {
        Leaf::Same(t) => Leaf::Same(dense(t)?),
        Leaf::PerReplica(p) => {
            let (values, map) = p.into_parts();
            let values = values.into_iter().map(dense).collect::<Result<_, _>>()?;
            Leaf::PerReplica(PerReplica::new(map, values)?)
        }
        Leaf::Mirrored(m) => {
            let (values, map) = m.into_parts();
            let values = values.into_iter().map(dense).collect::<Result<_, _>>()?;
            Leaf::Mirrored(distribute_values::Mirrored::new(map, values)?)
        }
    })
}
