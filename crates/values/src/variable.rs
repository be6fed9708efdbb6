//! Distributed variables: [`MirroredVariable`] (sync on write) and [`SyncOnReadVariable`]
//! (per-replica copies aggregated when read across replicas), their per-replica
//! [`VariableComponent`]s, and [`DistributedVariable`] for either.
//!
//! Whether code runs inside one replica or across replicas is the strategy layer's typed
//! context; here the two are separate methods (`update_local(replica, …)` for replica context,
//! `assign_cross_replica(…)` for cross-replica context) that the strategy calls. Components are
//! shared handles guarded by a lock each, so replicas may update their own component
//! concurrently; this module itself starts no threads.

use std::fmt;
use std::sync::{Arc, Weak};

use crate::regroup::{RegroupContext, Selection};
use crate::{
    Distributed, DistributedValues, Leaf, LeafMapper, LeafVisitor, LeafZipper, Lock, Mirrored,
    Nest, Path, PerReplica, Regroup, ReplicaDeviceMap, SyncKind, UpdateOp, ValuesError,
    VariableAggregation, VariableValue,
};

struct VarCore<T> {
    name: String,
    aggregation: VariableAggregation,
    kind: SyncKind,
    devices: Arc<ReplicaDeviceMap>,
    components: Vec<Arc<ComponentCell<T>>>,
}

struct ComponentCell<T> {
    replica: usize,
    device: String,
    /// Updates compute the new value first and then replace it whole, so a panic cannot leave a
    /// half-written value behind the lock.
    value: Lock<T>,
    /// Weak, as in TF: a component outlives a dropped container and then stands alone (VAL-17).
    container: Weak<VarCore<T>>,
}

impl<T> VarCore<T> {
    fn cell(&self, replica: usize) -> Result<&ComponentCell<T>, ValuesError> {
        self.components
            .get(replica)
            .map(Arc::as_ref)
            .ok_or(ValuesError::ReplicaOutOfRange {
                replica,
                num_replicas: self.components.len(),
            })
    }

    fn fmt_components(&self, f: &mut fmt::Formatter<'_>, type_name: &str) -> fmt::Result
    where
        T: fmt::Debug,
    {
        write!(f, "{type_name} '{}' ({}) ", self.name, self.aggregation)?;
        f.debug_map()
            .entries(
                self.components
                    .iter()
                    .map(|c| (ComponentLabel(c.replica, &c.device), c.value.lock())),
            )
            .finish()
    }
}

impl<T: VariableValue> VarCore<T> {
    fn build(
        name: &str,
        devices: Arc<ReplicaDeviceMap>,
        initial: T,
        aggregation: VariableAggregation,
        kind: SyncKind,
    ) -> Result<Arc<Self>, ValuesError> {
        if aggregation == VariableAggregation::Mean && !initial.is_floating() {
            return Err(ValuesError::MeanOnNonFloat {
                name: name.to_owned(),
            });
        }
        Ok(Arc::new_cyclic(|container| VarCore {
            name: name.to_owned(),
            aggregation,
            kind,
            components: devices
                .primary_devices()
                .enumerate()
                .map(|(replica, device)| {
                    Arc::new(ComponentCell {
                        replica,
                        device: device.to_owned(),
                        value: Lock::new(initial.clone()),
                        container: container.clone(),
                    })
                })
                .collect(),
            devices,
        }))
    }

    fn read(&self, replica: usize) -> Result<T, ValuesError> {
        Ok(self.cell(replica)?.value.lock().clone())
    }

    fn values(&self) -> Vec<T> {
        self.components
            .iter()
            .map(|c| c.value.lock().clone())
            .collect()
    }

    fn update_one(&self, replica: usize, op: UpdateOp, value: &T) -> Result<T, ValuesError> {
        let mut guard = self.cell(replica)?.value.lock();
        let new = op.apply(&*guard, value)?;
        *guard = new.clone();
        Ok(new)
    }

    /// Applies `op` with `values[i]` to component `i` and returns the new values, as stored
    /// while every lock was held; all new values are computed before any is stored, so a
    /// failing update changes nothing.
    fn update_each(&self, op: UpdateOp, values: &[&T]) -> Result<Vec<T>, ValuesError> {
        let mut guards: Vec<_> = self.components.iter().map(|c| c.value.lock()).collect();
        let new: Vec<T> = guards
            .iter()
            .zip(values)
            .map(|(current, value)| op.apply(&**current, *value))
            .collect::<Result<_, _>>()?;
        for (guard, value) in guards.iter_mut().zip(&new) {
            **guard = value.clone();
        }
        Ok(new)
    }

    fn update_all(&self, op: UpdateOp, value: &T) -> Result<Vec<T>, ValuesError> {
        self.update_each(op, &vec![value; self.components.len()])
    }

    fn update_per_component(
        &self,
        op: UpdateOp,
        values: &PerReplica<T>,
    ) -> Result<(), ValuesError> {
        self.devices
            .check_count("update with PerReplica", values.num_replicas())?;
        let pairs = values.devices().zip(self.devices.primary_devices());
        for (replica, (theirs, ours)) in pairs.enumerate() {
            if theirs != ours {
                // The value for component `replica` would come from another device's replica:
                // name the device, and its replica when the map knows it elsewhere.
                let device = match self.devices.replica_for_device(theirs) {
                    Some(_) => format!("{theirs}' as replica {replica} of variable '{}", self.name),
                    None => theirs.to_owned(),
                };
                return Err(ValuesError::UnknownDevice {
                    device,
                    devices: self.devices.to_string(),
                });
            }
        }
        self.update_each(op, &values.values().iter().collect::<Vec<_>>())
            .map(drop)
    }
}

struct ComponentLabel<'a>(usize, &'a str);

impl fmt::Debug for ComponentLabel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

/// A variable kept equal on every replica: every update is applied to every component
/// (synchronization `OnWrite`).
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{MirroredVariable, ReplicaDeviceMap, UpdateOp, VariableAggregation};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let w = MirroredVariable::new("w", map, 1.0, VariableAggregation::Mean)?;
/// w.assign_cross_replica(UpdateOp::AssignAdd, &2.0)?;
/// assert_eq!(w.values(), [3.0, 3.0]);
/// assert_eq!(w.name(), "w");
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub struct MirroredVariable<T>(Arc<VarCore<T>>);

/// A variable whose components diverge, one per replica, and are aggregated when read across
/// replicas (synchronization `OnRead`): metrics, batch-norm statistics.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{ReplicaDeviceMap, SyncOnReadVariable, UpdateOp, VariableAggregation};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let count = SyncOnReadVariable::new("count", map, 0.0, VariableAggregation::Sum)?;
/// count.update_local(0, UpdateOp::AssignAdd, &3.0)?;
/// count.update_local(1, UpdateOp::AssignAdd, &4.0)?;
/// assert_eq!(count.read_cross_replica()?, 7.0);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub struct SyncOnReadVariable<T>(Arc<VarCore<T>>);

/// Either kind of distributed variable, for code that handles both.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{DistributedVariable, ReplicaDeviceMap, VariableAggregation};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0"])?);
/// let v = DistributedVariable::new_on_read("m", map, 0.0, VariableAggregation::Mean)?;
/// assert!(v.is_sync_on_read() && !v.is_mirrored());
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub enum DistributedVariable<T> {
    /// A sync-on-write variable.
    Mirrored(MirroredVariable<T>),
    /// A sync-on-read variable.
    SyncOnRead(SyncOnReadVariable<T>),
}

/// One replica's copy of a distributed variable: what the code inside replica `i` reads and
/// writes. It refers back to its variable without keeping it alive.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{MirroredVariable, ReplicaDeviceMap, VariableAggregation};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/gpu:0"])?);
/// let w = MirroredVariable::new("w", map, 0, VariableAggregation::None)?;
/// let c = w.component(1)?;
/// assert_eq!((c.replica(), c.device()), (1, "/gpu:0"));
/// c.assign(4);
/// assert_eq!(w.values(), [0, 4]);
/// assert!(c.value_container().is_some());
/// drop(w);
/// assert!(c.value_container().is_none()); // the component lives on alone (VAL-17)
/// assert_eq!(c.read(), 4);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub struct VariableComponent<T>(Arc<ComponentCell<T>>);

impl<T> Clone for MirroredVariable<T> {
    /// Another handle to the same variable.
    fn clone(&self) -> Self {
        MirroredVariable(Arc::clone(&self.0))
    }
}

impl<T> Clone for SyncOnReadVariable<T> {
    /// Another handle to the same variable.
    fn clone(&self) -> Self {
        SyncOnReadVariable(Arc::clone(&self.0))
    }
}

impl<T> Clone for DistributedVariable<T> {
    /// Another handle to the same variable.
    fn clone(&self) -> Self {
        match self {
            DistributedVariable::Mirrored(v) => DistributedVariable::Mirrored(v.clone()),
            DistributedVariable::SyncOnRead(v) => DistributedVariable::SyncOnRead(v.clone()),
        }
    }
}

impl<T> Clone for VariableComponent<T> {
    /// Another handle to the same component.
    fn clone(&self) -> Self {
        VariableComponent(Arc::clone(&self.0))
    }
}

impl<T> PartialEq for MirroredVariable<T> {
    /// Identity: two handles are equal when they refer to the same variable.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> PartialEq for SyncOnReadVariable<T> {
    /// Identity: two handles are equal when they refer to the same variable.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> PartialEq for DistributedVariable<T> {
    /// Identity: two handles are equal when they refer to the same variable.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(self.core(), other.core())
    }
}

impl<T> PartialEq for VariableComponent<T> {
    /// Identity: two handles are equal when they refer to the same component.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// What both variable kinds share; `$ty` wraps an `Arc<VarCore<T>>`.
macro_rules! shared_variable_api {
    ($ty:ident, $kind:expr) => {
        impl<T: VariableValue> $ty<T> {
            /// A variable named `name` with one component per replica of `devices`, each
            /// starting at `initial`. `Mean` aggregation on a non-float value is an error
            /// (VAL-36).
            pub fn new(
                name: &str,
                devices: impl Into<Arc<ReplicaDeviceMap>>,
                initial: T,
                aggregation: VariableAggregation,
            ) -> Result<Self, ValuesError> {
                VarCore::build(name, devices.into(), initial, aggregation, $kind).map($ty)
            }

            /// The variable's name.
            pub fn name(&self) -> &str {
                &self.0.name
            }

            /// How replicas' values are combined.
            pub fn aggregation(&self) -> VariableAggregation {
                self.0.aggregation
            }

            /// The replicas' devices.
            pub fn device_map(&self) -> &ReplicaDeviceMap {
                &self.0.devices
            }

            /// How many components (replicas) the variable has.
            pub fn num_replicas(&self) -> usize {
                self.0.components.len()
            }

            /// Replica `replica`'s component.
            pub fn component(&self, replica: usize) -> Result<VariableComponent<T>, ValuesError> {
                self.0.cell(replica)?;
                Ok(VariableComponent(Arc::clone(&self.0.components[replica])))
            }

            /// Every component, in replica order.
            pub fn components(&self) -> Vec<VariableComponent<T>> {
                self.0
                    .components
                    .iter()
                    .map(|c| VariableComponent(Arc::clone(c)))
                    .collect()
            }

            /// A snapshot of every component's value, in replica order.
            pub fn values(&self) -> Vec<T> {
                self.0.values()
            }

            /// The value of replica `replica`'s component: a read inside that replica.
            pub fn read_local(&self, replica: usize) -> Result<T, ValuesError> {
                self.0.read(replica)
            }

            /// Replica 0's value.
            pub fn primary(&self) -> T {
                self.0.components[0].value.lock().clone()
            }

            /// Applies `op` to component `i` with `values[i]`: the strategy's
            /// `extended.update(var, fn, PerReplica)` in cross-replica context (VAL-45).
            ///
            /// `values` must be laid out like the variable: one value per replica, replica
            /// `i`'s on the variable's replica-`i` device (`InvalidArgument` otherwise, naming
            /// the device), so no component takes another device's value.
            pub fn update_per_component(
                &self,
                op: UpdateOp,
                values: &PerReplica<T>,
            ) -> Result<(), ValuesError> {
                self.0.update_per_component(op, values)
            }
        }

        impl<T: fmt::Debug> fmt::Debug for $ty<T> {
            /// `Name 'w' (AGGREGATION) {0 device: value, …}`.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt_components(f, stringify!($ty))
            }
        }
    };
}

shared_variable_api!(MirroredVariable, SyncKind::OnWrite);
shared_variable_api!(SyncOnReadVariable, SyncKind::OnRead);

impl<T: VariableValue> MirroredVariable<T> {
    /// Updates only replica `replica`'s component and returns its new value: TF's
    /// replica-context update with aggregation `None`. With any other aggregation the update
    /// needs every replica's value (`NeedsAllReplicas`): use
    /// [`update_aggregated`](Self::update_aggregated) after gathering them.
    pub fn update_local(&self, replica: usize, op: UpdateOp, value: &T) -> Result<T, ValuesError> {
        if self.0.aggregation != VariableAggregation::None {
            return Err(ValuesError::NeedsAllReplicas {
                name: self.0.name.clone(),
                aggregation: self.0.aggregation,
            });
        }
        self.0.update_one(replica, op, value)
    }

    /// Cross-replica context `assign`, `assign_add`, `assign_sub`: every component gets the
    /// update, so the copies stay equal.
    pub fn assign_cross_replica(&self, op: UpdateOp, value: &T) -> Result<(), ValuesError> {
        self.0.update_all(op, value).map(drop)
    }

    /// The replica-context update of a variable with an aggregation, once the strategy has
    /// gathered every replica's value (TF's `merge_call` in `_on_write_update_replica`).
    /// `value` is the regrouped value: [`Leaf::Same`] when every replica passed the same value,
    /// else one per replica. The aggregate goes to every component; returns the new value of
    /// the primary component as this update stored it, whatever other threads do afterwards.
    ///
    /// - `Sum`: the per-replica values are added. A non-distributed value may only be summed
    ///   with one replica or when it is zero (COL-03).
    /// - `Mean`: their mean; a non-distributed value is used as it is. Per-replica values that
    ///   are not floating point (possible for value types whose dtype is per value, such as
    ///   tensors) are `MeanOnNonFloat` (VAL-43).
    /// - `OnlyFirstReplica`: replica 0's value.
    /// - `None` needs no gathering: use [`update_local`](Self::update_local).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use distribute_values::*;
    ///
    /// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
    /// let w = MirroredVariable::new("w", Arc::clone(&map), 10.0, VariableAggregation::Sum)?;
    /// let grads = Leaf::PerReplica(PerReplica::new(map, vec![1.0, 2.0])?);
    /// assert_eq!(w.update_aggregated(UpdateOp::AssignSub, &grads)?, 7.0);
    /// assert_eq!(w.values(), [7.0, 7.0]);
    /// # Ok::<(), distribute_values::ValuesError>(())
    /// ```
    pub fn update_aggregated(&self, op: UpdateOp, value: &Leaf<T>) -> Result<T, ValuesError> {
        let aggregated = self.aggregate(value)?;
        let mut new = self.0.update_all(op, &aggregated)?;
        // One component per replica and never none, by construction.
        Ok(new.swap_remove(0))
    }

    /// [`update_aggregated`](Self::update_aggregated) from the contributions of every replica
    /// of every worker, in global replica order (`contributions.len()` may exceed this process's
    /// component count): how a multi-worker strategy applies one aggregate on every worker, so
    /// that no worker's copies drift from another's.
    pub fn update_aggregated_across(
        &self,
        op: UpdateOp,
        contributions: &[T],
    ) -> Result<T, ValuesError> {
        if contributions.is_empty() {
            return Err(ValuesError::ReplicaCountMismatch {
                what: "aggregated update across workers",
                expected: self.0.components.len(),
                found: 0,
            });
        }
        let aggregated = self.aggregate_contributions(contributions)?;
        let mut new = self.0.update_all(op, &aggregated)?;
        Ok(new.swap_remove(0))
    }

    fn aggregate(&self, value: &Leaf<T>) -> Result<T, ValuesError> {
        let core = &self.0;
        let n = core.components.len();
        let values = match value {
            Leaf::Same(v) => {
                return match core.aggregation {
                    VariableAggregation::None => Err(ValuesError::NotReducible {
                        aggregation: VariableAggregation::None,
                    }),
                    VariableAggregation::Sum if n > 1 && !v.is_zero() => {
                        Err(ValuesError::SumOfNonDistributed {
                            value: format!("{v:?}"),
                            num_replicas: n,
                        })
                    }
                    _ => Ok(v.clone()),
                };
            }
            Leaf::PerReplica(v) => v.values(),
            Leaf::Mirrored(v) => v.values(),
        };
        core.devices
            .check_count("aggregated update", values.len())?;
        self.aggregate_contributions(values)
    }

    /// The aggregate of one contribution per replica.
    fn aggregate_contributions(&self, values: &[T]) -> Result<T, ValuesError> {
        let core = &self.0;
        // The variable was built floating (VAL-36), but a value type whose dtype is per value (a
        // tensor) can still bring integers here, and their mean would divide as integers.
        if core.aggregation == VariableAggregation::Mean && values.iter().any(|v| !v.is_floating())
        {
            return Err(ValuesError::MeanOnNonFloat {
                name: core.name.clone(),
            });
        }
        match core.aggregation {
            VariableAggregation::None => Err(ValuesError::NotReducible {
                aggregation: VariableAggregation::None,
            }),
            VariableAggregation::OnlyFirstReplica => Ok(values[0].clone()),
            VariableAggregation::Sum => sum(values),
            VariableAggregation::Mean => T::mean_all(values),
        }
    }

    /// A cross-replica read from `current_device`: the component there, else the primary
    /// (VAL-22).
    pub fn read_cross_replica(&self, current_device: Option<&str>) -> T {
        let replica = current_device
            .and_then(|d| self.0.devices.replica_for_device(d))
            .unwrap_or(0);
        self.0.components[replica].value.lock().clone()
    }

    /// The components' current values as a [`Mirrored`] value.
    pub fn to_mirrored(&self) -> Mirrored<T> {
        // One component per replica of the map, by construction.
        Mirrored::from_parts(Arc::clone(&self.0.devices), self.values())
    }
}

fn sum<T: VariableValue>(values: &[T]) -> Result<T, ValuesError> {
    if values.is_empty() {
        return Err(ValuesError::EmptyDeviceMap);
    }
    T::sum_all(values)
}

impl<T: VariableValue> SyncOnReadVariable<T> {
    /// Updates only replica `replica`'s component and returns its new value: any
    /// replica-context update, whatever the aggregation, which applies when the variable is read
    /// across replicas.
    pub fn update_local(&self, replica: usize, op: UpdateOp, value: &T) -> Result<T, ValuesError> {
        self.0.update_one(replica, op, value)
    }

    /// The aggregated value, as read outside the replicas: the sum, the mean, or replica 0's
    /// value (VAL-41). Aggregation `None` cannot be read across replicas (VAL-44).
    pub fn read_cross_replica(&self) -> Result<T, ValuesError> {
        match self.0.aggregation {
            VariableAggregation::None => Err(ValuesError::NotReducible {
                aggregation: VariableAggregation::None,
            }),
            VariableAggregation::OnlyFirstReplica => self.0.read(0),
            VariableAggregation::Sum => sum(&self.0.values()),
            VariableAggregation::Mean => T::mean_all(&self.0.values()),
        }
    }

    /// Cross-replica context `assign`, `assign_add`, `assign_sub` (VAL-42):
    ///
    /// - `assign` with `Sum`: each component gets `value / replicas`, so the sum reads `value`;
    ///   with `Mean` or `OnlyFirstReplica` each gets `value`.
    /// - `assign_add` / `assign_sub` with `Sum` are errors (the share of the change per replica
    ///   is ambiguous); otherwise every component is updated.
    pub fn assign_cross_replica(&self, op: UpdateOp, value: &T) -> Result<(), ValuesError> {
        let core = &self.0;
        if core.aggregation != VariableAggregation::Sum {
            return core.update_all(op, value).map(drop);
        }
        if op != UpdateOp::Assign {
            return Err(ValuesError::CrossReplicaUpdateUnsupported {
                name: core.name.clone(),
                op,
                aggregation: core.aggregation,
            });
        }
        core.update_all(op, &value.divide_by_count(self.num_replicas())?)
            .map(drop)
    }

    /// The components' current values as a [`PerReplica`] value.
    pub fn to_per_replica(&self) -> PerReplica<T> {
        // One component per replica of the map, by construction.
        PerReplica::from_parts(Arc::clone(&self.0.devices), self.values())
    }
}

impl<T: VariableValue> DistributedVariable<T> {
    /// A new [`MirroredVariable`].
    pub fn new_on_write(
        name: &str,
        devices: impl Into<Arc<ReplicaDeviceMap>>,
        initial: T,
        aggregation: VariableAggregation,
    ) -> Result<Self, ValuesError> {
        MirroredVariable::new(name, devices, initial, aggregation).map(Self::Mirrored)
    }

    /// A new [`SyncOnReadVariable`].
    pub fn new_on_read(
        name: &str,
        devices: impl Into<Arc<ReplicaDeviceMap>>,
        initial: T,
        aggregation: VariableAggregation,
    ) -> Result<Self, ValuesError> {
        SyncOnReadVariable::new(name, devices, initial, aggregation).map(Self::SyncOnRead)
    }

    /// The variable's name.
    pub fn name(&self) -> &str {
        &self.core().name
    }

    /// Gives every component a new value computed from its current one:
    /// `f(replica, device, &current)` for each replica in order, called without any of the
    /// variable's locks held (so `f` may read the variable). All new values are computed before
    /// any is stored, and then stored together: an error from `f` changes nothing.
    pub fn update_each_with<E>(
        &self,
        mut f: impl FnMut(usize, &str, &T) -> Result<T, E>,
    ) -> Result<(), E> {
        let core = self.core();
        let mut updated = Vec::with_capacity(core.components.len());
        for cell in core.components.iter() {
            let current = cell.value.lock().clone();
            updated.push(f(cell.replica, &cell.device, &current)?);
        }
        // Stored with every lock held, so no reader sees some copies new and others old.
        let mut guards: Vec<_> = core.components.iter().map(|c| c.value.lock()).collect();
        for (guard, value) in guards.iter_mut().zip(updated) {
            **guard = value;
        }
        Ok(())
    }

    /// Replica `replica`'s component.
    pub fn component(&self, replica: usize) -> Result<VariableComponent<T>, ValuesError> {
        match self {
            DistributedVariable::Mirrored(v) => v.component(replica),
            DistributedVariable::SyncOnRead(v) => v.component(replica),
        }
    }
}

impl<T> DistributedVariable<T> {
    fn core(&self) -> &Arc<VarCore<T>> {
        match self {
            DistributedVariable::Mirrored(v) => &v.0,
            DistributedVariable::SyncOnRead(v) => &v.0,
        }
    }

    fn from_core(core: Arc<VarCore<T>>) -> Self {
        match core.kind {
            SyncKind::OnWrite => DistributedVariable::Mirrored(MirroredVariable(core)),
            SyncKind::OnRead => DistributedVariable::SyncOnRead(SyncOnReadVariable(core)),
        }
    }

    /// Sync-on-write variables count as mirrored (VAL-37).
    pub fn is_mirrored(&self) -> bool {
        self.core().kind == SyncKind::OnWrite
    }

    /// Sync-on-read variables count as sync-on-read (VAL-37).
    pub fn is_sync_on_read(&self) -> bool {
        self.core().kind == SyncKind::OnRead
    }

    /// The variable's synchronization.
    pub fn sync_kind(&self) -> SyncKind {
        self.core().kind
    }
}

impl<T: fmt::Debug> fmt::Debug for DistributedVariable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DistributedVariable::Mirrored(v) => v.fmt(f),
            DistributedVariable::SyncOnRead(v) => v.fmt(f),
        }
    }
}

impl<T> From<MirroredVariable<T>> for DistributedVariable<T> {
    fn from(v: MirroredVariable<T>) -> Self {
        DistributedVariable::Mirrored(v)
    }
}

impl<T> From<SyncOnReadVariable<T>> for DistributedVariable<T> {
    fn from(v: SyncOnReadVariable<T>) -> Self {
        DistributedVariable::SyncOnRead(v)
    }
}

impl<T> VariableComponent<T> {
    /// The replica this component belongs to.
    pub fn replica(&self) -> usize {
        self.0.replica
    }

    /// The device this component lives on.
    pub fn device(&self) -> &str {
        &self.0.device
    }

    /// The distributed variable this component belongs to, or `None` once that variable is
    /// dropped, in which case the component stands for itself (TF's `value_container`, VAL-17).
    pub fn value_container(&self) -> Option<DistributedVariable<T>> {
        self.0
            .container
            .upgrade()
            .map(DistributedVariable::from_core)
    }
}

impl<T: Clone> VariableComponent<T> {
    /// The component's value.
    pub fn read(&self) -> T {
        self.0.value.lock().clone()
    }

    /// Overwrites the component's value alone, bypassing aggregation (what TF's tests do with
    /// `v.values[i].assign(x)`; mirrored variables' copies may then differ until the next
    /// cross-replica update).
    pub fn assign(&self, value: T) {
        *self.0.value.lock() = value;
    }
}

impl<T: fmt::Debug> fmt::Debug for VariableComponent<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VariableComponent {} {}: {:?}",
            self.0.replica,
            self.0.device,
            &*self.0.value.lock()
        )
    }
}

impl<T> Regroup for VariableComponent<T> {
    type Regrouped = DistributedVariable<T>;

    /// Replica `i`'s component of one variable on every replica regroups to that variable, even
    /// with a single replica (VAL-14). Components of different variables, or in the wrong
    /// replica, are an `Invariant` error (VAL-15).
    fn regroup_replicas(
        replicas: Vec<Self>,
        _cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<DistributedVariable<T>, ValuesError> {
        let different = |detail: String| ValuesError::DifferentVariables {
            path: path.to_string(),
            detail,
        };
        let first = replicas
            .first()
            .ok_or_else(|| path.mismatch("no replica returned a value"))?;
        let container = first.0.container.upgrade().ok_or_else(|| {
            different("replica 0 returned a component of a variable that was dropped".into())
        })?;
        if container.components.len() != replicas.len() {
            return Err(different(format!(
                "variable '{}' has {} components but there are {} replicas",
                container.name,
                container.components.len(),
                replicas.len()
            )));
        }
        for (replica, (component, expected)) in
            replicas.iter().zip(&container.components).enumerate()
        {
            if !Arc::ptr_eq(&component.0, expected) {
                let owner = component.0.container.upgrade().map_or_else(
                    || "a dropped variable".to_owned(),
                    |c| format!("variable '{}'", c.name),
                );
                return Err(different(format!(
                    "replica {replica} returned component {} of {owner}, expected component \
                     {replica} of variable '{}'",
                    component.0.replica, container.name
                )));
            }
        }
        Ok(DistributedVariable::from_core(container))
    }

    /// The selected replica's component; mirrored-only selections refuse sync-on-read variables.
    fn select(
        regrouped: &DistributedVariable<T>,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        let core = regrouped.core();
        if selection.mirrored_only() && core.kind != SyncKind::OnWrite {
            return Err(ValuesError::NotMirrored {
                path: path.to_string(),
                found: "a SyncOnReadVariable",
            });
        }
        let replica = match selection {
            Selection::Replica(i) | Selection::MirroredReplica(i) => i,
            Selection::MirroredDevice(d) => core.devices.require_replica_for_device(d)?,
        };
        core.cell(replica)?;
        Ok(VariableComponent(Arc::clone(&core.components[replica])))
    }
}

/// Whole variables regroup as leaves compared by identity: the same variable on every replica
/// is returned as it is, whatever the options (VAL-15), and selecting a replica returns the
/// variable itself (VAL-16). Different variables on different replicas are wrapped like any
/// other differing leaf.
macro_rules! variable_leaf_impls {
    ($($ty:ident),*) => {$(
        impl<T> Regroup for $ty<T> {
            type Regrouped = Leaf<$ty<T>>;

            fn regroup_replicas(
                mut replicas: Vec<Self>,
                cx: &RegroupContext<'_>,
                path: &Path<'_>,
            ) -> Result<Self::Regrouped, ValuesError> {
                let same = replicas.first().is_some_and(|first| replicas.iter().all(|v| v == first));
                if same {
                    return Ok(Leaf::Same(replicas.swap_remove(0)));
                }
                Leaf::regroup_leaf(replicas, cx, path)
            }

            fn select(
                regrouped: &Self::Regrouped,
                selection: Selection<'_>,
                path: &Path<'_>,
            ) -> Result<Self, ValuesError> {
                let variable = regrouped.select_leaf(selection, path)?;
                if selection.mirrored_only() && variable.core().kind != SyncKind::OnWrite {
                    return Err(ValuesError::NotMirrored {
                        path: path.to_string(),
                        found: "a SyncOnReadVariable",
                    });
                }
                Ok(variable)
            }
        }
    )*};
}

variable_leaf_impls!(DistributedVariable, MirroredVariable, SyncOnReadVariable);

/// A replica handed a distributed variable gets its own component.
impl<T> Distributed for DistributedVariable<T> {
    type Local = VariableComponent<T>;
}

/// Variables and their components are leaves of a nested structure: walks see the handle, not
/// its value.
macro_rules! variable_nest_impls {
    ($($ty:ident),*) => {$(
        impl<T: 'static> Nest for $ty<T> {
            fn visit_leaves<V: LeafVisitor>(
                &self,
                path: &Path<'_>,
                visitor: &mut V,
            ) -> Result<(), V::Error> {
                visitor.leaf(path, self)
            }

            fn map_leaves<M: LeafMapper>(
                &self,
                path: &Path<'_>,
                mapper: &mut M,
            ) -> Result<Self, M::Error> {
                mapper.leaf(path, self)
            }

            fn zip_leaves<Z: LeafZipper>(
                parts: &[&Self],
                path: &Path<'_>,
                zipper: &mut Z,
            ) -> Result<Self, Z::Error> {
                zipper.leaf(path, parts)
            }
        }
    )*};
}

variable_nest_impls!(
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
    VariableComponent
);

impl<T> MirroredVariable<T> {
    fn core(&self) -> &Arc<VarCore<T>> {
        &self.0
    }
}

impl<T> SyncOnReadVariable<T> {
    fn core(&self) -> &Arc<VarCore<T>> {
        &self.0
    }
}
