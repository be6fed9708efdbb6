//! [`Replicas`]: the PJRT client and each replica's device and name, the part of a
//! `TpuStrategy` that compiled steps, device values and variables need. It sits below all of
//! them, so none of them depends on the strategy.

use std::sync::Arc;

use distribute_pjrt::{Client, Device};
use distribute_values::ReplicaDeviceMap;

/// The replicas of a strategy, as compiled programs see them.
pub(crate) struct Replicas {
    /// The PJRT client steps compile and run on.
    pub(crate) client: Client,
    /// The PJRT device of each replica.
    pub(crate) devices: Vec<Device>,
    /// The replicas' device names.
    pub(crate) device_map: Arc<ReplicaDeviceMap>,
}

impl Replicas {
    /// Each replica's device name (TF's worker devices).
    pub(crate) fn names(&self) -> Vec<String> {
        self.device_map
            .primary_devices()
            .map(str::to_owned)
            .collect()
    }

    /// Whether replica `r` runs on PJRT device `r` (the compiler's default assignment), so that
    /// programs need no explicit assignment.
    pub(crate) fn uses_default_assignment(&self) -> bool {
        self.devices
            .iter()
            .enumerate()
            .all(|(r, d)| usize::try_from(d.id()) == Ok(r))
    }
}
