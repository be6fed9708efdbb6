//! Feeding compiled steps from `distribute-input`, after TF's `TPUExtended` input handling:
//!
//! - input workers group the replicas' devices by host, the CPU:0 of each replica's
//!   job/replica/task, in first-seen order (TPU-14), with TF's host counts (TPU-15);
//! - [`TpuStrategy`]'s `distribute_dataset` places each replica's batch on its TPU device, or
//!   on the host when `fetch_to_device` is off (TPU-22), and pads a short last batch to the
//!   compiled shape with a mask (TF's dynamic padder) so that steps never recompile;
//! - [`DeviceBatches`] copies the steps' batches into device buffers ahead of the steps that
//!   use them (prefetch to device);
//! - [`replica_order`]: TF's replica reordering for input (TPU-20).
//!
//! Sparse and ragged elements (TPU-21) cannot reach a TPU step: the input crate's [`Batch`]
//! leaves are dense tensors, so a dataset of them cannot be built in the first place. The other
//! half of TPU-21, per-replica replication, is refused here with `Unimplemented`.

use std::collections::VecDeque;
use std::sync::Arc;

use distribute_device_spec::{DeviceSpec, host_for_device};
use distribute_input::{
    Batch, InputError, InputOptions, InputReplicationMode, InputWorkers, Masked,
    MaskedDistributedIterator, MaskedPerReplicaIterator, PartialBatch,
};
use distribute_tensor::Tensor;
use distribute_values::{DistributedValues, Nest, PerReplica};

use crate::device_value::DeviceValue;
use crate::strategy::TpuStrategy;
use crate::{StepInput, TpuError};

/// TF's `_get_replica_order`: the positions of `devices` sorted by (job, replica, device type,
/// task, device index). Input is fed in this order when reordering is enabled (TPU-20); on one
/// host with cores in index order it is the identity.
///
/// ```
/// let devices = ["/job:w/task:0/device:TPU:2", "/job:w/task:0/device:TPU:0"];
/// assert_eq!(distribute_tpu::replica_order(&devices)?, [1, 0]);
/// # Ok::<(), distribute_tpu::TpuError>(())
/// ```
pub fn replica_order<S: AsRef<str>>(devices: &[S]) -> Result<Vec<usize>, TpuError> {
    let mut keyed = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let spec: DeviceSpec = d
                .as_ref()
                .parse()
                .map_err(|e| TpuError::InvalidArgument(format!("device {:?}: {e}", d.as_ref())))?;
            let key = (
                spec.job().map(str::to_owned),
                spec.replica(),
                spec.device_type().map(str::to_owned),
                spec.task(),
                spec.device_index(),
            );
            Ok((key, i))
        })
        .collect::<Result<Vec<_>, TpuError>>()?;
    keyed.sort();
    Ok(keyed.into_iter().map(|(_, i)| i).collect())
}

/// Input workers for replicas on `devices`: the devices grouped by host, the CPU:0 of each
/// device's job, replica and task, hosts in the order their first replica appears (TPU-14).
/// Each host runs one input pipeline and feeds its own replicas.
///
/// ```
/// let workers = distribute_tpu::input_workers_for(&[
///     "/job:tpu/task:1/device:TPU:0",
///     "/job:tpu/task:0/device:TPU:0",
///     "/job:tpu/task:1/device:TPU:1",
/// ])?;
/// assert_eq!(workers.num_workers(), 2);
/// assert_eq!(workers.host(0), "/job:tpu/replica:0/task:1/device:CPU:0");
/// assert_eq!(workers.devices(0).len(), 2);
/// # Ok::<(), distribute_tpu::TpuError>(())
/// ```
pub fn input_workers_for<S: AsRef<str>>(devices: &[S]) -> Result<InputWorkers, TpuError> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for device in devices {
        let device = device.as_ref();
        let host = host_for_device(device)
            .map_err(|e| TpuError::InvalidArgument(format!("device {device:?}: {e}")))?;
        match groups.iter_mut().find(|(h, _)| *h == host) {
            Some((_, devices)) => devices.push(device.to_owned()),
            None => groups.push((host, vec![device.to_owned()])),
        }
    }
    Ok(InputWorkers::new(groups)?)
}

impl TpuStrategy {
    /// The input workers: the replicas' devices grouped by host (TPU-14); see
    /// [`input_workers_for`].
    pub fn input_workers(&self) -> Result<InputWorkers, TpuError> {
        input_workers_for(&self.worker_devices())
    }

    /// Hosts that run replicas (TPU-15): the distinct host devices among the replicas with a
    /// device assignment, the topology's task count without one.
    pub fn num_hosts(&self) -> Result<usize, TpuError> {
        match self.device_assignment() {
            None => Ok(self.topology().num_tasks()),
            Some(_) => Ok(self.input_workers()?.num_workers()),
        }
    }

    /// Replicas per host (TPU-15): min(replicas, cores per host ÷ cores per replica) with a
    /// device assignment, the cores per host without one.
    pub fn num_replicas_per_host(&self) -> usize {
        let cores_per_host = self.topology().num_tpus_per_task();
        match self.device_assignment() {
            None => cores_per_host,
            Some(a) => a
                .num_replicas()
                .min(cores_per_host / a.num_cores_per_replica()),
        }
    }

    /// The options a TPU input pipeline runs with: per-replica replication is not supported
    /// (TPU-21), and a short last batch is padded to the full per-replica size with a mask
    /// ([`PartialBatch::PadWithMask`] in place of `KeepUneven`), as TF's dynamic padder does,
    /// so that every step has the compiled shape. `DropRemainder` is kept.
    pub(crate) fn tpu_input_options(
        &self,
        mut options: InputOptions,
    ) -> Result<InputOptions, TpuError> {
        if options.replication_mode == InputReplicationMode::PerReplica {
            return Err(TpuError::Unimplemented(
                "InputReplicationMode::PerReplica on TPU: TF supports it only for \
                 MirroredStrategy's distribute_datasets_from_function; use PerWorker"
                    .into(),
            ));
        }
        if options.partial_batch == PartialBatch::KeepUneven {
            options.partial_batch = PartialBatch::PadWithMask;
        }
        Ok(options)
    }

    /// The steps of `steps` (a distributed dataset's [`iter_masked`]) copied into device
    /// buffers up to `depth` steps ahead of the step that uses them (TF's prefetch to device).
    /// Each item holds one [`DeviceValue`] per leaf of the batch, in the batch's leaf order, the
    /// mask (`f32 [rows]`, 1 for real rows) last; pass them to steps as
    /// [`StepInput::Device`].
    ///
    /// [`iter_masked`]: distribute_input::DistributedDataset::iter_masked
    pub fn device_batches<B: Batch>(
        &self,
        steps: MaskedDistributedIterator<B>,
        depth: usize,
    ) -> DeviceBatches<'_, B> {
        DeviceBatches {
            strategy: self,
            steps: steps.into_per_replica(),
            ready: VecDeque::new(),
            depth: depth.max(1),
            done: false,
        }
    }
}

/// Batches copied to the replicas' devices ahead of the steps; see
/// [`TpuStrategy::device_batches`].
pub struct DeviceBatches<'s, B: Batch> {
    strategy: &'s TpuStrategy,
    steps: MaskedPerReplicaIterator<B>,
    ready: VecDeque<Result<Vec<DeviceValue>, TpuError>>,
    depth: usize,
    done: bool,
}

impl<B: Batch> DeviceBatches<'_, B> {
    fn upload(&self, step: PerReplica<Masked<B>>) -> Result<Vec<DeviceValue>, TpuError> {
        // leaves[l][r]: leaf l of replica r.
        let mut leaves: Vec<Vec<Tensor>> = Vec::new();
        for masked in step.values() {
            let mut l = 0;
            masked.for_each_leaf(|_, t: &Tensor| {
                if leaves.len() <= l {
                    leaves.push(Vec::new());
                }
                leaves[l].push(t.clone());
                l += 1;
                Ok::<_, InputError>(())
            })?;
        }
        leaves
            .into_iter()
            .map(|per_replica| {
                let p = PerReplica::new(Arc::clone(self.strategy.device_map()), per_replica)?;
                self.strategy.to_device(StepInput::PerReplica(&p))
            })
            .collect()
    }
}

impl<B: Batch> Iterator for DeviceBatches<'_, B> {
    type Item = Result<Vec<DeviceValue>, TpuError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done && self.ready.len() < self.depth {
            match self.steps.next() {
                None => self.done = true,
                Some(step) => {
                    let uploaded = step
                        .map_err(|e: InputError| TpuError::from(e))
                        .and_then(|s| self.upload(s));
                    if uploaded.is_err() {
                        self.done = true;
                    }
                    self.ready.push_back(uploaded);
                }
            }
        }
        self.ready.pop_front()
    }
}
