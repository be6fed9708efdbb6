//! The one place that chooses a strategy's cross-device ops from (local devices, workers):
//! [`OpsPlan::for_devices`] says which, [`choose_the_best`] builds the in-process ones.
//!
//! | workers | local devices | ops |
//! |---|---|---|
//! | 1 | every device a CPU | [`SharedMemoryAllReduce`] |
//! | 1 | two or more GPUs, nothing else | `NcclAllReduce` (feature `nccl`, NCCL loadable), else [`ReductionToOneDevice`] |
//! | 1 | anything else (one GPU, GPUs and CPUs) | [`ReductionToOneDevice`] |
//! | 2+ | every device a GPU | NCCL across every worker's GPUs (feature `nccl`), else MPI's all-reduce through the host |
//! | 2+ | anything else | MPI's hierarchical all-reduce (`distribute-mpi`) |
//!
//! TensorFlow infers `ReductionToOneDevice` for one CPU worker; the shared-memory all-reduce gives
//! the same bits in parallel, so it is chosen here.

use std::sync::Arc;

use distribute_device_spec::{DeviceKind, LocalDevice, LocalDevices};

use crate::backends::{ReductionToOneDevice, SharedMemoryAllReduce, nccl};
use crate::{CollectiveError, CrossDeviceOps, GroupConfig};

/// Which cross-device ops a strategy's replicas get, from its local devices and the number of
/// workers (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsPlan {
    /// One worker, every device a CPU: the in-process all-reduce in shared memory.
    SharedMemoryAllReduce,
    /// One worker with two or more GPUs and nothing else: NCCL among them (falls back to
    /// [`OpsPlan::ReductionToOneDevice`] where NCCL cannot be had, saying why).
    NcclAllReduce,
    /// One worker otherwise: reduce on one device and copy to the others.
    ReductionToOneDevice,
    /// Several workers, every device a GPU: NCCL across every worker's GPUs (falls back to
    /// [`OpsPlan::MpiAllReduce`] without the `nccl` feature).
    NcclAcrossWorkers,
    /// Several workers otherwise: MPI's hierarchical all-reduce (local shared memory, then
    /// across the workers).
    MpiAllReduce,
}

impl OpsPlan {
    /// The plan for `devices` (this worker's) in a job of `workers` workers.
    ///
    /// ```
    /// use distribute_collectives::OpsPlan;
    /// use distribute_device_spec::LocalDevices;
    ///
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::cpus(2), 1), OpsPlan::SharedMemoryAllReduce);
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::gpus(2), 1), OpsPlan::NcclAllReduce);
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::cpus(1), 3), OpsPlan::MpiAllReduce);
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::gpus(1), 2), OpsPlan::NcclAcrossWorkers);
    /// ```
    pub fn for_devices(devices: &LocalDevices, workers: usize) -> OpsPlan {
        let all = |kind: DeviceKind| devices.iter().all(|d| *d.kind() == kind);
        match (workers > 1, all(DeviceKind::Cpu), all(DeviceKind::Gpu)) {
            (false, true, _) => OpsPlan::SharedMemoryAllReduce,
            (false, _, true) if devices.len() >= 2 => OpsPlan::NcclAllReduce,
            (false, ..) => OpsPlan::ReductionToOneDevice,
            (true, _, true) => OpsPlan::NcclAcrossWorkers,
            (true, ..) => OpsPlan::MpiAllReduce,
        }
    }
}

/// The backend for a strategy's devices in one process (the first three rows of the module's
/// table, through [`OpsPlan::for_devices`]), and why it was chosen (also logged at info level).
///
/// All local CPUs → [`SharedMemoryAllReduce`]. Two or more GPUs, with feature `nccl` and NCCL
/// loadable → `NcclAllReduce`. Anything else → [`ReductionToOneDevice`], and the reason says why
/// NCCL was not used (feature off, one GPU, NCCL missing, NCCL refusing the devices). Devices of
/// other workers are refused: `distribute-multi-worker` builds the ops of a multi-worker job.
///
/// ```
/// use distribute_collectives::{choose_the_best, GroupConfig};
/// use distribute_device_spec::LocalDevices;
///
/// let devices = LocalDevices::new(["/cpu:0", "/cpu:1"])?;
/// let (ops, why) = choose_the_best(&devices, GroupConfig::default())?;
/// assert_eq!(ops.name(), "SharedMemoryAllReduce");
/// assert!(why.contains("CPUs of this process"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn choose_the_best(
    devices: &LocalDevices,
    config: GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), CollectiveError> {
    if devices.is_remote() {
        return Err(CollectiveError::Unimplemented(format!(
            "device '{}' belongs to another worker; the ops of a multi-worker job are built by \
             its strategy (MultiWorkerMirroredStrategy, crate distribute-multi-worker)",
            devices[0]
        )));
    }
    let n = devices.len();
    let (ops, reason): (Arc<dyn CrossDeviceOps>, String) = match OpsPlan::for_devices(devices, 1) {
        OpsPlan::SharedMemoryAllReduce => (
            Arc::new(SharedMemoryAllReduce::new(n, config)?),
            format!(
                "SharedMemoryAllReduce: all {n} devices are CPUs of this process, so replicas \
                 reduce in shared memory, each a slice in parallel"
            ),
        ),
        plan => {
            let nccl = match plan {
                OpsPlan::NcclAllReduce => {
                    let gpus: Vec<usize> =
                        devices.iter().filter_map(LocalDevice::gpu_index).collect();
                    nccl::nccl_backend(&gpus, &config)
                }
                _ if devices.iter().all(|d| *d.kind() == DeviceKind::Gpu) => {
                    Err("there is only one GPU, so there is nothing for NCCL to do".into())
                }
                _ => Err("not every device is a GPU, which NCCL needs".into()),
            };
            match nccl {
                Ok((ops, why)) => (ops, why),
                Err(why_not) => {
                    let other = devices.iter().find(|d| *d.kind() != DeviceKind::Cpu);
                    let other = other.map_or_else(String::new, |d| d.kind().to_string());
                    (
                        Arc::new(ReductionToOneDevice::new(n, config)?),
                        format!(
                            "ReductionToOneDevice: the devices include {other} and {why_not}; \
                             values are reduced on one device"
                        ),
                    )
                }
            }
        }
    };
    log::info!("choose_the_best: {reason}");
    Ok((ops, reason))
}
