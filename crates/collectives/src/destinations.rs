//! [`Destinations`]: the devices a reduction or broadcast delivers to.

use std::sync::Arc;

use distribute_device_spec::canonicalize;
use distribute_values::ReplicaDeviceMap;

use crate::CollectiveError;
use distribute_tensor::AnyTensor;

/// The devices a reduction or broadcast delivers to: one or more distinct devices, by their
/// canonical names.
///
/// TF also takes a tensor, a variable or a distributed value as destinations; here those are
/// [`Destinations::of_value`] and [`Destinations::of_map`].
///
/// ```
/// use distribute_collectives::Destinations;
///
/// let d = Destinations::devices(["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1"])?;
/// assert_eq!(
///     d.as_slice(),
///     ["/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"]
/// );
/// assert!(Destinations::device("").is_err());
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destinations {
    devices: Vec<String>,
    /// The same devices as a map, shared by the `Mirrored` results.
    map: Arc<ReplicaDeviceMap>,
}

impl Destinations {
    /// One device.
    pub fn device(device: &str) -> Result<Destinations, CollectiveError> {
        Destinations::devices([device])
    }

    /// Several devices, in order. Empty lists, empty or malformed names and repeated devices are
    /// refused.
    pub fn devices<S: AsRef<str>>(
        devices: impl IntoIterator<Item = S>,
    ) -> Result<Destinations, CollectiveError> {
        let devices = devices
            .into_iter()
            .map(|d| canonical_device(d.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if devices.is_empty() {
            return Err(CollectiveError::InvalidArgument(
                "destinations can not be empty: name at least one device".into(),
            ));
        }
        Ok(Destinations {
            map: Arc::new(ReplicaDeviceMap::new(devices.iter().cloned())?),
            devices,
        })
    }

    /// The device a value is placed on (TF passes a tensor as its own destination).
    pub fn of_value(value: &AnyTensor) -> Result<Destinations, CollectiveError> {
        Destinations::device(value.device())
    }

    /// The primary devices of a distributed value's replicas.
    pub fn of_map(map: &ReplicaDeviceMap) -> Result<Destinations, CollectiveError> {
        Destinations::devices(map.primary_devices())
    }

    /// The canonical device names.
    pub fn as_slice(&self) -> &[String] {
        &self.devices
    }

    /// The same devices as a map.
    pub(crate) fn map(&self) -> &Arc<ReplicaDeviceMap> {
        &self.map
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Never true: destinations are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// True when `values` live on exactly these devices, in any order (TF's device matching).
    pub fn matches(&self, values: &[AnyTensor]) -> bool {
        let mut mine: Vec<&str> = self.as_slice().iter().map(String::as_str).collect();
        let Ok(mut theirs) = values
            .iter()
            .map(|v| canonical_device(v.device()))
            .collect::<Result<Vec<_>, _>>()
        else {
            return false;
        };
        mine.sort_unstable();
        theirs.sort_unstable();
        mine.len() == theirs.len() && mine.iter().zip(&theirs).all(|(a, b)| a == b)
    }
}

/// The canonical name of `device`; the empty name is refused (TF's `check_destinations`).
pub(crate) fn canonical_device(device: &str) -> Result<String, CollectiveError> {
    if device.is_empty() {
        return Err(CollectiveError::InvalidArgument(
            "a destination device can not be empty: place the value on a device".into(),
        ));
    }
    Ok(canonicalize(device, None)?)
}
