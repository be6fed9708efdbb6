//! Canonical device names (TF's `device_util`): filling unset fields from defaults, the host CPU
//! of a device, and local device lists.
//!
//! `distribute` has no graph mode, so these follow TF's eager behaviour: a name with no job is
//! on job `localhost` unless the host says otherwise.

use std::sync::LazyLock;

use crate::{DeviceSpec, DeviceSpecError};

/// The device that fills every field `canonicalize` is not told: `/job:localhost/replica:0/task:0/device:CPU:0`.
pub const DEFAULT_HOST: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

/// The full `/job:J/replica:R/task:T/device:TYPE:N` name of `device`.
///
/// Unset fields come from `default` when it sets them, else from
/// `/job:localhost/replica:0/task:0/device:CPU:0`; fields set in `device` always win. A
/// long-form device type that is not upper-case (e.g. `/device:tpu:0`) is an error; `cpu` and
/// `gpu` are upper-cased while parsing.
///
/// ```
/// use distribute_device_spec::canonicalize;
///
/// assert_eq!(canonicalize("/cpu:0", None)?, "/job:localhost/replica:0/task:0/device:CPU:0");
/// assert_eq!(
///     canonicalize("/job:worker/task:1", Some("/gpu:0"))?,
///     "/job:worker/replica:0/task:1/device:GPU:0"
/// );
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn canonicalize(device: &str, default: Option<&str>) -> Result<String, DeviceSpecError> {
    canonicalize_on_host(device, default, &DeviceSpec::new())
}

/// [`canonicalize`] for a process whose host CPU device is `host`.
///
/// TF takes the job, replica and task of the first logical CPU when it names a job, e.g.
/// `/job:worker/replica:0/task:0/device:CPU:0` once collectives are enabled for worker 0; a host
/// without a job means `localhost`. Precedence, lowest first: replica 0, task 0, `CPU:0`; the
/// host; `default`; `device`.
///
/// ```
/// use distribute_device_spec::{canonicalize_on_host, DeviceSpec};
///
/// let host: DeviceSpec = "/job:worker/replica:0/task:0/device:CPU:0".parse()?;
/// assert_eq!(
///     canonicalize_on_host("/cpu:0", None, &host)?,
///     "/job:worker/replica:0/task:0/device:CPU:0"
/// );
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn canonicalize_on_host(
    device: &str,
    default: Option<&str>,
    host: &DeviceSpec,
) -> Result<String, DeviceSpecError> {
    let device = device.parse()?;
    let default = default.map(str::parse).transpose()?;
    Ok(canonical_spec(&device, default.as_ref(), host)?.to_string())
}

/// Canonicalizes `device` with the device of the enclosing scope as its default (TF's
/// `device_util.resolve`). Scopes nest by [`DeviceSpec::merged_with`], the innermost winning.
///
/// ```
/// use distribute_device_spec::{resolve, DeviceSpec};
///
/// let scope: DeviceSpec = "/gpu:0".parse()?;
/// assert_eq!(resolve("/job:worker/task:1", &scope)?, "/job:worker/replica:0/task:1/device:GPU:0");
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn resolve(device: &str, scope: &DeviceSpec) -> Result<String, DeviceSpecError> {
    let device = device.parse()?;
    Ok(canonical_spec(&device, Some(scope), &DeviceSpec::new())?.to_string())
}

/// The CPU:0 of the same job, replica and task as `device`, not canonicalized.
///
/// ```
/// use distribute_device_spec::host_for_device;
///
/// assert_eq!(
///     host_for_device("/job:worker/replica:0/task:1/device:GPU:3")?,
///     "/job:worker/replica:0/task:1/device:CPU:0"
/// );
/// assert_eq!(host_for_device("/device:TPU:5")?, "/device:CPU:0");
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
pub fn host_for_device(device: &str) -> Result<String, DeviceSpecError> {
    let spec: DeviceSpec = device.parse()?;
    Ok(spec.with_device("CPU", 0)?.to_string())
}

/// `/device:CPU:0` when `num_gpus` is 0, else `/device:GPU:0` … `/device:GPU:{num_gpus-1}`.
///
/// ```
/// use distribute_device_spec::local_devices_from_num_gpus;
///
/// assert_eq!(local_devices_from_num_gpus(0), ["/device:CPU:0"]);
/// assert_eq!(local_devices_from_num_gpus(2), ["/device:GPU:0", "/device:GPU:1"]);
/// ```
pub fn local_devices_from_num_gpus(num_gpus: usize) -> Vec<String> {
    if num_gpus == 0 {
        return vec!["/device:CPU:0".to_owned()];
    }
    (0..num_gpus).map(|i| format!("/device:GPU:{i}")).collect()
}

/// The local devices a strategy uses by default: the `available_gpus` GPUs, cut to `limit`
/// when given, or the CPU when that leaves none.
///
/// Detecting GPUs is not this crate's business (it knows no drivers); callers pass the count.
///
/// ```
/// use distribute_device_spec::all_local_devices;
///
/// assert_eq!(all_local_devices(4, Some(2)), ["/device:GPU:0", "/device:GPU:1"]);
/// assert_eq!(all_local_devices(0, None), ["/device:CPU:0"]);
/// ```
pub fn all_local_devices(available_gpus: usize, limit: Option<usize>) -> Vec<String> {
    local_devices_from_num_gpus(limit.map_or(available_gpus, |n| n.min(available_gpus)))
}

/// The canonical spec of `device`: each field from `device` if set, else from `default`, else
/// from the host when it names a job, else the built-in default.
pub(crate) fn canonical_spec(
    device: &DeviceSpec,
    default: Option<&DeviceSpec>,
    host: &DeviceSpec,
) -> Result<DeviceSpec, DeviceSpecError> {
    check_upper_case(device)?;
    if let Some(default) = default {
        check_upper_case(default)?;
    }
    static BUILTIN: LazyLock<DeviceSpec> =
        LazyLock::new(|| DEFAULT_HOST.parse().expect("the built-in default parses"));
    // Highest precedence first; merging field by field without building intermediate specs
    // keeps this to one allocation per string field.
    let layers = [
        Some(device),
        default,
        host.job().is_some().then_some(host),
        Some(&*BUILTIN),
    ];
    let first = |field: fn(&DeviceSpec) -> Option<&str>| {
        layers.iter().flatten().find_map(|spec| field(spec))
    };
    let first_number = |field: fn(&DeviceSpec) -> Option<u32>| {
        layers.iter().flatten().find_map(|spec| field(spec))
    };
    let spec = DeviceSpec::new()
        .with_job(first(DeviceSpec::job))?
        .with_replica(first_number(DeviceSpec::replica))
        .with_task(first_number(DeviceSpec::task))
        .with_device(
            first(DeviceSpec::device_type),
            first_number(DeviceSpec::device_index),
        )?;
    Ok(spec)
}

fn check_upper_case(spec: &DeviceSpec) -> Result<(), DeviceSpecError> {
    match spec.device_type() {
        Some(device_type) if device_type != device_type.to_ascii_uppercase() => {
            Err(DeviceSpecError::DeviceTypeNotUpperCase {
                spec: spec.to_string(),
                device_type: device_type.to_owned(),
            })
        }
        _ => Ok(()),
    }
}
