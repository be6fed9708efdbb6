//! [`TpuVariable`]: a distributed variable that lives on the replicas' devices, one PJRT buffer
//! per replica, after TF's `TPUMirroredVariable` / `TPUSyncOnReadVariable`.
//!
//! Compiled steps take variables as state ([`crate::TpuFunction::run_updating`],
//! [`crate::TpuFunction::run_steps_updating`]) and return their new values, which replace the
//! buffers on the devices: training never copies weights to the host between steps. Reading a
//! variable copies its buffers to the host; updates from the host (cross-replica context) are
//! computed on the host and copied to every device.
//!
//! Components are named as TF names them (TPU-24): replica 0's is the variable's name, replica
//! `i`'s `<name>/replica_i`. The initial value is computed once and copied to every device.

use std::sync::Arc;

use distribute_pjrt::stablehlo::TensorType;
use distribute_strategy::{VariableOptions, create_distributed_variable, replica_variable_name};
use distribute_tensor::Tensor;
use distribute_values::{
    DistributedValues, Leaf, Lock, PerReplica, SyncKind, UpdateOp, ValuesError,
    VariableAggregation, VariableValue,
};

use crate::TpuError;
use crate::device_value::{DeviceValue, tensor_type, upload};
use crate::replicas::Replicas;

/// A mirrored (on-write) or sync-on-read variable held on every replica's device.
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_strategy::VariableOptions;
/// use distribute_tpu::{TpuConfig, TpuStrategy};
///
/// let strategy = TpuStrategy::new(TpuConfig::cpu(2))?;
/// let w = strategy.create_device_variable("w", VariableOptions::default(), |device| {
///     Ok(Tensor::from_vec(device, &[2], vec![1.0f32, 2.0])?)
/// })?;
/// // One step adds 1 to every copy, on the devices.
/// let step = strategy.function(|b, args| {
///     let one = b.splat(1.0f32, &[2]);
///     Ok(vec![b.add(&args[0], &one)?])
/// });
/// step.run_updating(&[&w], &[])?;
/// assert_eq!(w.read_cross_replica(None)?.to_vec::<f32>()?, [2.0, 3.0]);
/// assert_eq!(w.component_names(), ["w", "w/replica_1"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TpuVariable {
    name: String,
    kind: SyncKind,
    aggregation: VariableAggregation,
    trainable: bool,
    strategy_devices: Vec<distribute_pjrt::Device>,
    client: distribute_pjrt::Client,
    device_map: Arc<distribute_values::ReplicaDeviceMap>,
    /// The current buffers; replaced whole by every update.
    value: Lock<Arc<DeviceValue>>,
}

impl std::fmt::Debug for TpuVariable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TpuVariable('{}', {:?}, {}, {:?})",
            self.name,
            self.kind,
            self.aggregation,
            self.device_value()
        )
    }
}

impl TpuVariable {
    /// Builds the variable on `replicas`: validates `options` as every strategy's variable
    /// creator does, calls `initial_value` once with replica 0's device, and copies the result
    /// to every replica's device.
    pub(crate) fn new(
        replicas: &Replicas,
        name: &str,
        options: VariableOptions,
        initial_value: impl FnOnce(&str) -> Result<Tensor, TpuError>,
    ) -> Result<TpuVariable, TpuError> {
        let map = &replicas.device_map;
        let primary = map
            .devices_for_replica(0)
            .map_err(TpuError::Values)?
            .first()
            .cloned()
            .unwrap_or_default();
        let initial = initial_value(&primary)?;
        // The same checks (synchronization None, Mean of integers, …) and messages as the
        // host-side variables of every other strategy.
        let host = create_distributed_variable(name, map, initial.clone(), options)?;
        let (kind, trainable) = options.synchronization.resolve(name, options.trainable)?;
        drop(host);
        let ty = tensor_type(&initial)?;
        let devices = &replicas.devices;
        let buffers = devices
            .iter()
            .map(|d| upload(&replicas.client, &initial, d))
            .collect::<Result<Vec<_>, _>>()?;
        let value = DeviceValue::on(replicas, buffers, ty);
        Ok(TpuVariable {
            name: name.to_owned(),
            kind,
            aggregation: options.aggregation,
            trainable,
            strategy_devices: devices.to_vec(),
            client: replicas.client.clone(),
            device_map: Arc::clone(map),
            value: Lock::new(Arc::new(value)),
        })
    }

    /// The variable's name (replica 0's component's name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The components' names: `<name>` for replica 0, `<name>/replica_<i>` for replica `i`
    /// (TPU-24).
    pub fn component_names(&self) -> Vec<String> {
        (0..self.num_replicas())
            .map(|r| replica_variable_name(&self.name, r))
            .collect()
    }

    /// Whether it is mirrored (on write) or sync-on-read.
    pub fn sync_kind(&self) -> SyncKind {
        self.kind
    }

    /// How replicas' updates (on write) or copies (on read) combine.
    pub fn aggregation(&self) -> VariableAggregation {
        self.aggregation
    }

    /// Whether an optimizer trains it.
    pub fn trainable(&self) -> bool {
        self.trainable
    }

    /// Replicas (one buffer each).
    pub fn num_replicas(&self) -> usize {
        self.strategy_devices.len()
    }

    /// The per-replica type of the value.
    pub fn ty(&self) -> TensorType {
        self.device_value().ty().clone()
    }

    /// The current buffers, to pass to a step as [`crate::StepInput::Device`] (reading only;
    /// steps that update the variable go through [`crate::TpuFunction::run_updating`]).
    pub fn device_value(&self) -> Arc<DeviceValue> {
        Arc::clone(&self.value.lock())
    }

    /// Replica `replica`'s copy, on the host (waits for the steps that compute it).
    pub fn read_replica(&self, replica: usize) -> Result<Tensor, TpuError> {
        self.device_value().replica(replica)
    }

    /// Every replica's copy, on the host.
    pub fn values(&self) -> Result<PerReplica<Tensor>, TpuError> {
        let value = self.device_value();
        let copies = (0..self.num_replicas())
            .map(|r| value.replica(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PerReplica::new(Arc::clone(&self.device_map), copies)?)
    }

    /// The value read in cross-replica context (TF's `read_var`), on the host:
    ///
    /// - mirrored: the copy on `current_device` if a replica lives there, else the primary
    ///   (replica 0's) copy;
    /// - sync-on-read: `Sum` adds the copies, `Mean` averages them, `OnlyFirstReplica` takes
    ///   replica 0's (TPU-28); `None` cannot be read across replicas.
    pub fn read_cross_replica(&self, current_device: Option<&str>) -> Result<Tensor, TpuError> {
        match self.kind {
            SyncKind::OnWrite => {
                let replica = current_device
                    .and_then(|d| self.device_map.replica_for_device(d))
                    .unwrap_or(0);
                self.read_replica(replica)
            }
            SyncKind::OnRead => {
                let copies = self.values()?.into_parts().0;
                let sum = |copies: &[Tensor]| -> Result<Tensor, ValuesError> {
                    copies[1..]
                        .iter()
                        .try_fold(copies[0].clone(), |acc, c| acc.try_add(c))
                };
                Ok(match self.aggregation {
                    VariableAggregation::None => {
                        return Err(ValuesError::NotReducible {
                            aggregation: VariableAggregation::None,
                        }
                        .into());
                    }
                    VariableAggregation::OnlyFirstReplica => copies[0].clone(),
                    VariableAggregation::Sum => sum(&copies)?,
                    VariableAggregation::Mean => sum(&copies)?.divide_by_count(copies.len())?,
                })
            }
        }
    }

    /// TF's cross-replica `extended.update` with an update op, applied to every copy.
    ///
    /// - A mirrored variable whose aggregation is not `None` needs a value that is the same on
    ///   every replica ([`Leaf::Same`] or [`Leaf::Mirrored`]): a [`Leaf::PerReplica`] would make
    ///   the copies differ, and is a [`TpuError::Type`] (TPU-25).
    /// - Otherwise a plain value updates every copy, and a per-replica or mirrored value gives
    ///   copy `i` its value `i`.
    /// - A plain value on a sync-on-read variable follows the host variables' rules: `assign`
    ///   with `Sum` gives each copy `value / replicas`, so the sum reads `value`; `assign_add` /
    ///   `assign_sub` with `Sum` are refused.
    ///
    /// The new values are computed on the host and copied to the devices.
    pub fn update(&self, op: UpdateOp, value: &Leaf<Tensor>) -> Result<(), TpuError> {
        if self.kind == SyncKind::OnWrite
            && self.aggregation != VariableAggregation::None
            && matches!(value, Leaf::PerReplica(_))
        {
            return Err(TpuError::Type(format!(
                "variable '{}' is mirrored with aggregation {}: a cross-replica update needs \
                 mirrored arguments, got a PerReplica value (reduce it first, or update in a \
                 step)",
                self.name, self.aggregation
            )));
        }
        let n = self.num_replicas();
        let current = self.values()?.into_parts().0;
        let arguments: Vec<Tensor> = match value {
            Leaf::Same(v) => {
                if self.kind == SyncKind::OnRead && self.aggregation == VariableAggregation::Sum {
                    if op != UpdateOp::Assign {
                        return Err(ValuesError::CrossReplicaUpdateUnsupported {
                            name: self.name.clone(),
                            op,
                            aggregation: self.aggregation,
                        }
                        .into());
                    }
                    vec![v.divide_by_count(n)?; n]
                } else {
                    vec![v.clone(); n]
                }
            }
            Leaf::PerReplica(p) => p.values().to_vec(),
            Leaf::Mirrored(m) => m.values().to_vec(),
        };
        if arguments.len() != n {
            return Err(TpuError::InvalidArgument(format!(
                "{} values for a variable of {n} replicas",
                arguments.len()
            )));
        }
        let new = current
            .iter()
            .zip(&arguments)
            .map(|(c, a)| op.apply(c, a))
            .collect::<Result<Vec<_>, _>>()?;
        let ty = self.ty();
        for t in &new {
            self.check_update_type(&tensor_type(t)?)?;
        }
        let buffers = new
            .iter()
            .zip(&self.strategy_devices)
            .map(|(t, d)| upload(&self.client, t, d))
            .collect::<Result<Vec<_>, _>>()?;
        let current = self.device_value();
        self.replace(DeviceValue {
            buffers,
            ty,
            device_map: Arc::clone(&current.device_map),
        });
        Ok(())
    }

    /// `assign` in cross-replica context: [`update`](Self::update) with [`UpdateOp::Assign`].
    pub fn assign(&self, value: &Tensor) -> Result<(), TpuError> {
        self.update(UpdateOp::Assign, &Leaf::Same(value.clone()))
    }

    /// A value of another type cannot replace the variable's.
    pub(crate) fn check_update_type(&self, ty: &TensorType) -> Result<(), TpuError> {
        let mine = self.ty();
        if *ty != mine {
            return Err(TpuError::InvalidArgument(format!(
                "variable '{}' holds {mine}; its new value has {ty}",
                self.name
            )));
        }
        Ok(())
    }

    /// Makes `value` the variable's buffers.
    pub(crate) fn replace(&self, value: DeviceValue) {
        *self.value.lock() = Arc::new(value);
    }
}
