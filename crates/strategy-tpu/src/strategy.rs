//! [`TpuStrategy`]: its devices (every PJRT device its own replica, or a [`DeviceAssignment`]),
//! the [`Strategy`] implementation, and the client that compiled steps run on.

use std::fmt;
use std::sync::Arc;

use distribute_collectives::CrossDeviceOps;
use distribute_device_spec::LocalDevices;
use distribute_input::{
    Batch, Dataset, DistributedDataset, InputContext, InputError, InputOptions,
};
use distribute_mirrored::MirroredStrategy;
use distribute_pjrt::{Client, ClientOptions, Device, Plugin};
use distribute_strategy::VariableOptions;
use distribute_strategy::{
    MergeArgs, MergeResult, ReplicaContext, RunError, Strategy, StrategyError, StrategyExtended,
};
use distribute_tensor::Tensor;
use distribute_values::{
    Distributed, DistributedValues, Leaf, PerReplica, Regroup, ReplicaDeviceMap,
};

use crate::TpuError;
use crate::device_value::{DeviceValue, StepInput};
use crate::function::TpuFunction;
use crate::replicas::Replicas;
use crate::step_builder::StepBuilder;
use crate::topology::{DeviceAssignment, Topology};
use crate::variable::TpuVariable;

/// The job name of local devices.
const JOB: &str = "localhost";

/// How to build a [`TpuStrategy`], for any PJRT plugin.
#[derive(Clone, Debug, Default)]
pub struct TpuConfig {
    /// How many of the plugin's devices to use: all (`None`) or the first N. The CPU plugin is
    /// created with exactly N devices; no other plugin gets CPU-only options.
    pub devices: Option<usize>,
    /// Options of the PJRT client. Leave `cpu_device_count` unset: [`TpuConfig::devices`]
    /// sets it for the CPU plugin, and other plugins reject it.
    pub client: ClientOptions,
    /// Which cores each replica uses, over the devices chosen; `None`: every device is its own
    /// replica (TPU-12).
    pub device_assignment: Option<DeviceAssignment>,
}

impl TpuConfig {
    /// Every device of the plugin, each its own replica.
    pub fn all() -> TpuConfig {
        TpuConfig::default()
    }

    /// The plugin's first `devices` devices, each its own replica; fewer is an error that
    /// names both counts. On the CPU plugin, a client with exactly `devices` CPU devices.
    pub fn first(devices: usize) -> TpuConfig {
        TpuConfig {
            devices: Some(devices),
            ..TpuConfig::default()
        }
    }

    /// [`TpuConfig::first`]`(devices)`, the spelling of tests and examples that run on the CPU
    /// plugin (where it means `devices` CPU devices); on another plugin, its first `devices`.
    pub fn cpu(devices: usize) -> TpuConfig {
        TpuConfig::first(devices)
    }
}

/// Data parallelism as one compiled program replicated over PJRT devices (TF's `TPUStrategy`).
///
/// ```
/// use distribute_tpu::{StepInput, TpuConfig, TpuStrategy};
/// use distribute_tensor::Tensor;
/// use distribute_values::ReduceOp;
///
/// let strategy = TpuStrategy::new(TpuConfig::cpu(2))?;
/// let sum = strategy.function(|b, inputs| Ok(vec![b.all_reduce(ReduceOp::Sum, &inputs[0])?]));
/// let x = Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0])?;
/// let out = sum.run(&[StepInput::Same(&x)])?;
/// assert_eq!(out[0].replica(1)?.to_vec::<f32>()?, [2.0, 4.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TpuStrategy {
    /// The client, each replica's PJRT device, and the device map.
    replicas: Replicas,
    topology: Topology,
    assignment: Option<DeviceAssignment>,
    /// Runs eager (`Strategy::run`) steps on the host, one thread per replica, over the same
    /// device names; also the cross-device ops and merge rendezvous of the contexts.
    eager: MirroredStrategy,
}

impl fmt::Debug for TpuStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TpuStrategy")
            .field("devices", self.eager.extended().device_map())
            .field("pjrt_devices", &self.replicas.devices)
            .finish()
    }
}

impl TpuStrategy {
    /// A strategy over the devices of the plugin [`Plugin::discover`] finds.
    pub fn new(config: TpuConfig) -> Result<TpuStrategy, TpuError> {
        TpuStrategy::with_plugin(Plugin::discover()?, config)
    }

    /// A strategy over the devices of `plugin`.
    pub fn with_plugin(
        plugin: &'static Plugin,
        config: TpuConfig,
    ) -> Result<TpuStrategy, TpuError> {
        let (client, devices) = Client::with_devices(plugin, &config.client, config.devices)?;
        if devices.is_empty() {
            return Err(TpuError::InvalidArgument(format!(
                "the PJRT plugin {} has no devices",
                plugin.path().display()
            )));
        }
        let topology = Topology::single_host(devices.len())?;
        let (replica_devices, names) = match &config.device_assignment {
            None => {
                // TPU-12: every device is its own replica.
                let names = (0..devices.len())
                    .map(|i| format!("/job:{JOB}/replica:0/task:0/device:TPU:{i}"))
                    .collect::<Vec<_>>();
                (devices.clone(), names)
            }
            Some(assignment) => {
                if assignment.topology() != &topology {
                    return Err(TpuError::InvalidArgument(format!(
                        "the device assignment's topology (mesh {:?}, {} tasks × {} cores) is not \
                         this client's (mesh {:?}); build it from TpuStrategy::topology_for or \
                         Topology::single_host({})",
                        assignment.topology().mesh_shape(),
                        assignment.topology().num_tasks(),
                        assignment.topology().num_tpus_per_task(),
                        topology.mesh_shape(),
                        devices.len()
                    )));
                }
                if assignment.num_cores_per_replica() != 1 {
                    return Err(TpuError::Unimplemented(format!(
                        "{} cores per replica: model parallelism (one replica over several \
                         logical devices) needs SPMD partitioning, which this TpuStrategy does \
                         not compile; use one core per replica",
                        assignment.num_cores_per_replica()
                    )));
                }
                let mut replica_devices = Vec::new();
                let mut names = Vec::new();
                for r in 0..assignment.num_replicas() {
                    replica_devices.push(devices[assignment.tpu_ordinal(r, 0)?].clone());
                    // TPU-13: the canonical name of the replica's core.
                    let name = assignment.tpu_device(r, 0, Some(JOB))?;
                    names.push(name.replacen("/task:", "/replica:0/task:", 1));
                }
                (replica_devices, names)
            }
        };
        let eager = MirroredStrategy::new(&names)?;
        let replicas = Replicas {
            client,
            devices: replica_devices,
            device_map: Arc::clone(eager.extended().device_map()),
        };
        Ok(TpuStrategy {
            replicas,
            topology,
            assignment: config.device_assignment,
            eager,
        })
    }

    /// The topology of a client with `devices` devices: one task, one core per device.
    pub fn topology_for(devices: usize) -> Result<Topology, TpuError> {
        Topology::single_host(devices)
    }

    /// The topology of this strategy's client.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The device assignment, if one was given.
    pub fn device_assignment(&self) -> Option<&DeviceAssignment> {
        self.assignment.as_ref()
    }

    /// The PJRT client steps run on.
    pub fn client(&self) -> &Client {
        &self.replicas.client
    }

    /// Each replica's PJRT device.
    pub fn replica_devices(&self) -> &[Device] {
        &self.replicas.devices
    }

    /// The replicas' device names (TF's worker devices).
    pub fn worker_devices(&self) -> Vec<String> {
        self.replicas.names()
    }

    /// The replicas' device map.
    pub fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        self.eager.extended().device_map()
    }

    /// The device of `replica`'s logical device `logical_device` (TF's
    /// `experimental_logical_device`): ids at or above the cores per replica are refused.
    pub fn logical_device(
        &self,
        replica: usize,
        logical_device: usize,
    ) -> Result<String, TpuError> {
        let cores = self
            .assignment
            .as_ref()
            .map_or(1, DeviceAssignment::num_cores_per_replica);
        if logical_device >= cores {
            return Err(TpuError::InvalidArgument(format!(
                "logical device id {logical_device} is out of range: each replica has {cores} \
                 logical device(s)"
            )));
        }
        let devices = self
            .device_map()
            .devices_for_replica(replica)
            .map_err(TpuError::Values)?;
        Ok(devices[logical_device].clone())
    }

    /// Copies an input to every replica's device ahead of the steps that use it (TF's
    /// prefetch to device). A [`StepInput::Device`] value is already there and is refused.
    pub fn to_device(&self, input: StepInput<'_>) -> Result<DeviceValue, TpuError> {
        crate::device_value::to_device(&self.replicas, input)
    }

    /// Pads every replica's batch (leading dimension) with zero rows to `rows`, so that a short
    /// last batch runs the program compiled for full ones (TF's dynamic padder) instead of
    /// compiling another. Returns the padded batch and a per-replica `f32` mask of shape
    /// `[rows]`: 1 for real rows, 0 for padding; the step multiplies per-example terms by it.
    pub fn pad_batch(
        &self,
        batch: &PerReplica<Tensor>,
        rows: usize,
    ) -> Result<(PerReplica<Tensor>, PerReplica<Tensor>), TpuError> {
        let mut padded = Vec::new();
        let mut masks = Vec::new();
        for (r, t) in batch.values().iter().enumerate() {
            let have = *t.shape().first().ok_or_else(|| {
                TpuError::InvalidArgument(format!(
                    "replica {r}'s batch is a scalar; padding needs a leading batch dimension"
                ))
            })?;
            if have > rows {
                return Err(TpuError::InvalidArgument(format!(
                    "replica {r}'s batch has {have} rows, more than the {rows} to pad to"
                )));
            }
            let mut shape = t.shape().to_vec();
            shape[0] = rows - have;
            let zeros = Tensor::zeros(t.device(), t.dtype(), &shape)?;
            padded.push(Tensor::concat_rows(t.device(), &[t.clone(), zeros])?);
            let mask: Vec<f32> = (0..rows)
                .map(|i| if i < have { 1.0 } else { 0.0 })
                .collect();
            masks.push(Tensor::from_vec(t.device(), &[rows], mask)?);
        }
        let map = Arc::clone(batch.shared_device_map());
        Ok((
            PerReplica::new(Arc::clone(&map), padded)?,
            PerReplica::new(map, masks)?,
        ))
    }

    /// A variable held on every replica's device, one buffer each (see [`TpuVariable`]):
    /// `initial_value` is called once, with replica 0's device, and its result copied to every
    /// device (TPU-24). `options` are checked as for every strategy's variables: on-write
    /// (the default) makes a mirrored variable, on-read a sync-on-read one.
    pub fn create_device_variable(
        &self,
        name: &str,
        options: VariableOptions,
        initial_value: impl FnOnce(&str) -> Result<Tensor, TpuError>,
    ) -> Result<TpuVariable, TpuError> {
        TpuVariable::new(&self.replicas, name, options, initial_value)
    }

    /// TF's cross-replica `broadcast_to` outside a replicated computation: the value is
    /// returned unchanged, as a [`Leaf::Same`] every replica reads (TPU-23); it is copied to
    /// the devices only when a step takes it. Inside a step, use
    /// [`StepBuilder::broadcast_from_first`].
    pub fn broadcast_to(&self, value: &Tensor) -> Leaf<Tensor> {
        Leaf::Same(value.clone())
    }

    /// A compiled step function: `step` is traced once per input signature into a replicated
    /// program (see [`TpuFunction`]).
    pub fn function<F>(&self, step: F) -> TpuFunction<'_, F>
    where
        F: Fn(
            &mut StepBuilder<'_>,
            &[distribute_pjrt::stablehlo::Value],
        ) -> Result<Vec<distribute_pjrt::stablehlo::Value>, TpuError>,
    {
        TpuFunction::new(&self.replicas, step)
    }
}

impl StrategyExtended for TpuStrategy {
    fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        self.eager.extended().device_map()
    }

    fn local_devices(&self) -> &LocalDevices {
        self.eager.local_devices()
    }

    fn cross_device_ops(&self) -> &dyn CrossDeviceOps {
        self.eager.extended().cross_device_ops()
    }

    fn host_device(&self) -> &str {
        self.eager.extended().host_device()
    }

    fn merge(
        &self,
        replica: usize,
        args: MergeArgs,
        merge: &mut dyn FnMut(Vec<MergeArgs>) -> Result<MergeResult, StrategyError>,
    ) -> Result<MergeResult, StrategyError> {
        self.eager.extended().merge(replica, args, merge)
    }
}

impl Strategy for TpuStrategy {
    fn extended(&self) -> &dyn StrategyExtended {
        self
    }

    /// Runs an eager step on the host, one thread per replica (a Rust closure over concrete
    /// tensors cannot be compiled); use [`TpuStrategy::function`] for steps that run as one
    /// replicated XLA program.
    fn run_each<D, T, E, F>(&self, step: F, inputs: &D) -> Result<Vec<T>, RunError<E>>
    where
        D: Distributed + Sync,
        T: Send,
        E: Send + std::fmt::Display,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<T, E> + Sync,
    {
        self.eager.run_each(step, inputs)
    }

    fn run<D, O, F>(&self, step: F, inputs: &D) -> Result<O::Regrouped, StrategyError>
    where
        D: Distributed + Sync,
        O: Regroup + Send,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<O, StrategyError> + Sync,
    {
        self.eager.run(step, inputs)
    }

    /// A global-batch dataset fed to the replicas: input workers grouped by host (TPU-14),
    /// batches on the replicas' TPU devices, or on their host when `fetch_to_device` is off
    /// (TPU-22). A short last batch is padded to the full per-replica size (read the mask with
    /// `iter_masked`, or feed steps with [`TpuStrategy::device_batches`]): `KeepUneven`
    /// becomes `PadWithMask`, so steps keep their compiled shape. Per-replica replication is
    /// `Unimplemented` (TPU-21).
    fn distribute_dataset<B: Batch>(
        &self,
        dataset: Dataset<B>,
        options: InputOptions,
    ) -> Result<DistributedDataset<B>, StrategyError> {
        let options = self.tpu_input_options(options)?;
        let workers = self.input_workers()?;
        Ok(DistributedDataset::new(dataset, &workers, options)?)
    }

    /// One dataset per host's input pipeline, with the same placement, padding and refusals
    /// as [`distribute_dataset`](Strategy::distribute_dataset).
    fn distribute_datasets_from_function<B: Batch>(
        &self,
        options: InputOptions,
        dataset_fn: impl Fn(&InputContext) -> Result<Dataset<B>, InputError>,
    ) -> Result<DistributedDataset<B>, StrategyError> {
        let options = self.tpu_input_options(options)?;
        let workers = self.input_workers()?;
        Ok(distribute_input::distribute_datasets_from_function(
            &workers, options, dataset_fn,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_or_the_first_n_devices_and_too_many_names_both_counts() {
        let all = TpuStrategy::new(TpuConfig::all()).unwrap();
        assert!(all.num_replicas_in_sync() >= 1);
        let three = TpuStrategy::new(TpuConfig::first(3)).unwrap();
        assert_eq!(three.num_replicas_in_sync(), 3);
        assert_eq!(three.topology().num_tpus_per_task(), 3);
        let too_many = TpuConfig {
            client: ClientOptions::cpu(2),
            ..TpuConfig::first(5)
        };
        let err = TpuStrategy::new(too_many).unwrap_err().to_string();
        assert!(
            err.contains("asked for 5 devices") && err.contains("has 2"),
            "{err}"
        );
    }
}
