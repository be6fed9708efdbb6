//! Layer 1 of `distribute` (the bottom of the crate map): device names in TensorFlow's syntax.
//!
//! - [`DeviceSpec`] parses and prints `/job:J/replica:R/task:T/device:TYPE:N`, with TF's legacy
//!   short forms (`/cpu:0`, `/GPU:*`), merges specs and replaces single fields.
//! - [`canonicalize`], [`resolve`] and [`host_for_device`] fill in full device names as TF's
//!   `device_util` does (eager semantics).
//! - [`ClusterSpec`] and [`TfConfig`] read multi-worker clusters from `TF_CONFIG`, with TF's
//!   `multi_worker_util` helpers.
//! - [`DeviceKind`] is a device's type as a value to match on (`CPU`, `GPU`, `TPU`, …).
//! - [`LocalDevices`] is one worker's device list, parsed, canonicalized and checked once (each
//!   device named once, one worker): what a strategy over one machine is built from.
//! - [`is_device_list_single_worker`], [`group_by_job_task`], [`infer_num_gpus_per_worker`] and
//!   [`cluster_spec_to_device_list`] handle the device lists strategies are built from.
//!
//! This crate knows nothing about values, tensors, drivers, threads or strategies: it deals in
//! names only, so every layer above can use it.
//!
//! ```
//! use distribute_device_spec::{canonicalize, DeviceSpec};
//!
//! let spec: DeviceSpec = "/job:worker/task:1/gpu:0".parse()?;
//! assert_eq!(spec.to_string(), "/job:worker/task:1/device:GPU:0");
//! assert_eq!(
//!     canonicalize("/job:worker/task:1/gpu:0", None)?,
//!     "/job:worker/replica:0/task:1/device:GPU:0"
//! );
//! # Ok::<(), distribute_device_spec::DeviceSpecError>(())
//! ```

mod canonical;
mod cluster;
mod device_list;
mod error;
mod kind;
mod local_devices;
mod spec;

pub use canonical::{
    DEFAULT_HOST, all_local_devices, canonicalize, canonicalize_on_host, host_for_device,
    local_devices_from_num_gpus, resolve,
};
pub use cluster::{ClusterSpec, TaskId, TaskType, TfConfig};
pub use device_list::{
    MAX_GPUS_PER_WORKER, cluster_spec_to_device_list, group_by_job_task, infer_num_gpus_per_worker,
    is_device_list_single_worker, parse_device_list,
};
pub use error::DeviceSpecError;
pub use kind::DeviceKind;
pub use local_devices::{LocalDevice, LocalDevices};
pub use spec::DeviceSpec;
