//! [`choose_the_best`]: which backend a strategy's devices get, and why.

use std::sync::Arc;

use distribute_device_spec::{DeviceKind, LocalDevice, LocalDevices};

use crate::backends::{GroupConfig, ReductionToOneDevice, SharedMemoryAllReduce, nccl};
use crate::{CollectiveError, CrossDeviceOps};

/// The backend for a strategy's devices, and why it was chosen (also logged at info level).
///
/// All local CPUs → [`SharedMemoryAllReduce`]. Two or more GPUs, with feature `nccl` and NCCL
/// loadable → `NcclAllReduce`. Anything else → [`ReductionToOneDevice`], and the reason says why
/// NCCL was not used (feature off, one GPU, NCCL missing, NCCL refusing the devices). Devices of
/// other workers need a multi-process backend: build `NcclAllReduce::for_cluster` yourself.
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
            "device '{}' belongs to another worker; cross-process collectives (MPI or NCCL \
             across hosts) are not part of this build",
            devices[0]
        )));
    }
    let n = devices.len();
    let not_cpu = devices.iter().find(|d| *d.kind() != DeviceKind::Cpu);
    let (ops, reason): (Arc<dyn CrossDeviceOps>, String) = match not_cpu {
        None => (
            Arc::new(SharedMemoryAllReduce::new(n, config)?),
            format!(
                "SharedMemoryAllReduce: all {n} devices are CPUs of this process, so replicas \
                 reduce in shared memory, each a slice in parallel"
            ),
        ),
        Some(other) => {
            let other = other.kind();
            let gpus: Option<Vec<usize>> = devices.iter().map(LocalDevice::gpu_index).collect();
            match nccl_backend(gpus.as_deref(), &config) {
                Ok((ops, why)) => (ops, why),
                Err(why_not) => (
                    Arc::new(ReductionToOneDevice::new(n, config)?),
                    format!(
                        "ReductionToOneDevice: the devices include {other} and {why_not}; values \
                         are reduced on one device"
                    ),
                ),
            }
        }
    };
    log::info!("choose_the_best: {reason}");
    Ok((ops, reason))
}

/// The NCCL backend for `gpus` (every device a GPU), or why not.
fn nccl_backend(
    gpus: Option<&[usize]>,
    config: &GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), String> {
    let Some(gpus) = gpus else {
        return Err("not every device is a GPU, which NCCL needs".into());
    };
    if gpus.len() < 2 {
        return Err("there is only one GPU, so there is nothing for NCCL to do".into());
    }
    nccl::nccl_backend(gpus, config)
}
