//! [`CrossReplicaContext`]: what a merge function and code outside `run` see, and the
//! [`UpdateContext`] of one variable update.

use std::sync::Arc;

use distribute_collectives::{CrossDeviceOps, Destinations, reduce_non_distributed_value};
use distribute_tensor::{AnyTensor, Tensor};
use distribute_values::{
    DistributedValues, DistributedVariable, Leaf, PerReplica, ReduceOp, ReplicaDeviceMap, UpdateOp,
    VariableValue,
};

use crate::StrategyError;
use crate::variables::VariableCreator;

use super::StrategyExtended;
use super::in_step::refuse_in_replica_step;

/// The context of code that sees every replica at once: a merge function, or code outside `run`.
/// It reduces, broadcasts and updates distributed values.
///
/// A step function gets a [`ReplicaContext`](crate::ReplicaContext), which has none of these
/// operations. A step that captured the strategy could still reach them
/// (`strategy.cross_replica().update(…)`), so they check at run time: called on a thread running
/// a replica's step, outside a merge function, they fail with
/// [`StrategyError::CrossReplicaInReplica`].
///
/// ```
/// use distribute_strategy::{DefaultStrategy, Strategy, StrategyError, VariableOptions};
/// use distribute_values::{Leaf, UpdateOp};
///
/// let strategy = DefaultStrategy::new()?;
/// let w = strategy.create_variable("w", 1.0f32, VariableOptions::default())?;
/// let err = strategy
///     .run(|_ctx, ()| strategy.cross_replica().update(&w, UpdateOp::AssignAdd, &Leaf::Same(1.0)), &())
///     .unwrap_err();
/// assert!(matches!(err, StrategyError::CrossReplicaInReplica { operation: "update" }));
/// assert_eq!(strategy.cross_replica().read_var(&w)?, 1.0); // unchanged
/// # Ok::<(), StrategyError>(())
/// ```
#[derive(Clone, Copy)]
pub struct CrossReplicaContext<'a> {
    extended: &'a dyn StrategyExtended,
}

impl<'a> CrossReplicaContext<'a> {
    /// The cross-replica context of a strategy.
    pub fn new(extended: &'a dyn StrategyExtended) -> Self {
        CrossReplicaContext { extended }
    }

    /// The number of replicas that run each step together: every replica of every worker in a
    /// multi-worker run (what a plain value counts as in a reduction).
    pub fn num_replicas_in_sync(&self) -> usize {
        self.extended.total_replicas()
    }

    /// The number of replicas this process runs: how many copies its distributed values and
    /// variables hold (the device map's count).
    pub fn num_local_replicas(&self) -> usize {
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
        refuse_in_replica_step("reduce_to")?;
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
        refuse_in_replica_step("batch_reduce_to")?;
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

    /// A copy of `tensor` on every destination device. In a multi-worker run the chief's
    /// (worker 0's) `tensor` is what every worker gets (TF broadcasts from the chief task):
    /// every worker must call it, with a tensor of the same dtype and shape.
    pub fn broadcast_to(
        &self,
        tensor: &Tensor,
        destinations: &Destinations,
    ) -> Result<Leaf<Tensor>, StrategyError> {
        refuse_in_replica_step("broadcast_to")?;
        let chiefs = match self
            .extended
            .workers()
            .map(|w| w.tensors_from_chief(std::slice::from_ref(tensor)))
            .transpose()?
        {
            Some(mut chiefs) if chiefs.len() == 1 => chiefs.swap_remove(0),
            Some(chiefs) => {
                return Err(StrategyError::Invariant(format!(
                    "one tensor was sent from the chief but {} came back",
                    chiefs.len()
                )));
            }
            None => return Ok(self.cross_device_ops().broadcast(tensor, destinations)?),
        };
        Ok(self.cross_device_ops().broadcast(&chiefs, destinations)?)
    }

    /// TF's `extended.update` with an update op: a plain value is applied to every copy; a
    /// per-replica or mirrored value gives copy `i` its value `i`.
    pub fn update<T: VariableValue>(
        &self,
        variable: &DistributedVariable<T>,
        op: UpdateOp,
        value: &Leaf<T>,
    ) -> Result<(), StrategyError> {
        refuse_in_replica_step("update")?;
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
        refuse_in_replica_step("update_with")?;
        // Straight to the components: the new values are one per copy by construction, so
        // none of `update`'s checks of a caller's per-replica value apply.
        variable.update_each_with(|replica, device, current| {
            f(&UpdateContext { replica, device }, current)
        })
    }

    /// The value of `variable` seen across replicas (TF's `read_var`): a mirrored variable's
    /// primary copy, a sync-on-read variable's aggregate.
    pub fn read_var<T: VariableValue>(
        &self,
        variable: &DistributedVariable<T>,
    ) -> Result<T, StrategyError> {
        refuse_in_replica_step("read_var")?;
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
        refuse_in_replica_step("update_non_slot")?;
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
