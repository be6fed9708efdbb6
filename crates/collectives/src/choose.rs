//! [`choose_the_best`]: which backend a strategy's devices get, and why.

use std::sync::Arc;

use distribute_device_spec::DeviceSpec;

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
///
/// let (ops, why) = choose_the_best(&["/cpu:0", "/cpu:1"], GroupConfig::default())?;
/// assert_eq!(ops.name(), "SharedMemoryAllReduce");
/// assert!(why.contains("CPUs of this process"));
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
pub fn choose_the_best<S: AsRef<str>>(
    devices: &[S],
    config: GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), CollectiveError> {
    let specs = devices
        .iter()
        .map(|d| d.as_ref().parse::<DeviceSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    if specs.is_empty() {
        return Err(CollectiveError::InvalidArgument(
            "choose_the_best needs at least one device".into(),
        ));
    }
    if let Some(remote) = specs.iter().find(|d| !d.is_local()) {
        return Err(CollectiveError::Unimplemented(format!(
            "device '{remote}' belongs to another worker; cross-process collectives (MPI or NCCL \
             across hosts) are not part of this build"
        )));
    }
    let n = specs.len();
    let kinds: Vec<&str> = specs
        .iter()
        .map(|d| d.device_type().unwrap_or("CPU"))
        .collect();
    let (ops, reason): (Arc<dyn CrossDeviceOps>, String) = if kinds.iter().all(|k| *k == "CPU") {
        (
            Arc::new(SharedMemoryAllReduce::new(n, config)?),
            format!(
                "SharedMemoryAllReduce: all {n} devices are CPUs of this process, so replicas \
                 reduce in shared memory, each a slice in parallel"
            ),
        )
    } else {
        let other = kinds
            .iter()
            .find(|k| **k != "CPU")
            .copied()
            .unwrap_or_default();
        let gpus: Option<Vec<usize>> = specs
            .iter()
            .map(|d| match (d.device_type(), d.device_index()) {
                (Some(k), Some(i)) if k.eq_ignore_ascii_case("GPU") => Some(i as usize),
                _ => None,
            })
            .collect();
        match nccl_backend(gpus.as_deref(), &config) {
            Ok((ops, why)) => (ops, why),
            Err(why_not) => (
                Arc::new(ReductionToOneDevice::new(n, config)?),
                format!(
                    "ReductionToOneDevice: the devices include {other} and {why_not}; values are \
                     reduced on one device"
                ),
            ),
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
