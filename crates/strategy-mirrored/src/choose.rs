//! [`choose_the_best`]: the cross-device ops of one process's replicas, built as
//! [`OpsPlan::for_devices`] (`distribute-collectives`, the one choice) says, and why.

use std::sync::Arc;

use distribute_collectives::{
    CollectiveError, CrossDeviceOps, GroupConfig, OpsPlan, ReductionToOneDevice,
    SharedMemoryAllReduce,
};
use distribute_device_spec::{DeviceKind, LocalDevice, LocalDevices};

/// The backend for a strategy's devices in one process (the first three rows of
/// [`OpsPlan`]'s table: this is how [`OpsPlan::for_devices`] becomes backends), and why it was chosen (also logged at info level).
///
/// All local CPUs → [`SharedMemoryAllReduce`]. Two or more GPUs, with feature `nccl` and NCCL
/// loadable → `NcclAllReduce`. Anything else → [`ReductionToOneDevice`], and the reason says why
/// NCCL was not used (feature off, one GPU, NCCL missing, NCCL refusing the devices). Devices of
/// other workers are refused: `distribute-multi-worker` builds the ops of a multi-worker job.
///
/// ```
/// use distribute_collectives::GroupConfig;
/// use distribute_mirrored::choose_the_best;
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
                    nccl_backend(&gpus, &config)
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

/// The NCCL backend for `gpus` (`distribute-nccl`), or why not.
#[cfg(feature = "nccl")]
fn nccl_backend(
    gpus: &[usize],
    config: &GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), String> {
    distribute_nccl::nccl_backend(gpus, config)
}

/// Why this build cannot reduce with NCCL.
#[cfg(not(feature = "nccl"))]
fn nccl_backend(
    _gpus: &[usize],
    _config: &GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), String> {
    Err("this build has no NCCL backend (build distribute-mirrored with feature `nccl`)".into())
}
