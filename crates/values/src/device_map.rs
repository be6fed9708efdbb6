//! [`ReplicaDeviceMap`]: which devices each replica runs on.
//!
//! Device names are opaque strings compared as given; the strategy layer canonicalises them
//! (with distribute-device-spec) before building a map, so that equal devices compare equal.

use std::fmt;

use crate::ValuesError;

/// The devices of every replica, in replica order. A replica spans one or more *logical devices*
/// (model parallelism inside a replica, as on TPUs); every replica spans the same number, and
/// logical device 0 is the replica's primary device, where its values live.
///
/// ```
/// use distribute_values::ReplicaDeviceMap;
///
/// let map = ReplicaDeviceMap::new(["/device:GPU:0", "/device:GPU:1"])?;
/// assert_eq!(map.num_replicas(), 2);
/// assert_eq!(map.replica_for_device("/device:GPU:1"), Some(1));
/// assert_eq!(map.to_string(), "[/device:GPU:0, /device:GPU:1]");
/// assert_eq!(format!("{map:?}"), "ReplicaDeviceMap(['/device:GPU:0', '/device:GPU:1'])");
///
/// let tpu = ReplicaDeviceMap::with_logical_devices([["/tpu:0", "/tpu:1"], ["/tpu:2", "/tpu:3"]])?;
/// assert_eq!(tpu.num_logical_devices(), 2);
/// assert_eq!(tpu.replica_for_device("/tpu:3"), Some(1));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ReplicaDeviceMap {
    /// `devices[replica][logical]`; never empty, rectangular, no name twice.
    devices: Vec<Vec<String>>,
}

impl ReplicaDeviceMap {
    /// A map with one device per replica. An empty list, an empty name or a repeated device is
    /// an error (VAL-30).
    pub fn new<I, S>(devices: I) -> Result<Self, ValuesError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_logical_devices(devices.into_iter().map(|d| [d]))
    }

    /// A map where replica `i` spans the devices of the `i`-th inner list. Every replica must
    /// span the same non-zero number of devices, and no device may appear twice.
    pub fn with_logical_devices<I, R, S>(replicas: I) -> Result<Self, ValuesError>
    where
        I: IntoIterator<Item = R>,
        R: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let devices: Vec<Vec<String>> = replicas
            .into_iter()
            .map(|r| r.into_iter().map(Into::into).collect())
            .collect();
        let Some(first) = devices.first() else {
            return Err(ValuesError::EmptyDeviceMap);
        };
        if first.is_empty() {
            return Err(ValuesError::EmptyDeviceMap);
        }
        let mut seen = std::collections::HashSet::new();
        for (replica, logical) in devices.iter().enumerate() {
            if logical.len() != first.len() {
                return Err(ValuesError::RaggedLogicalDevices {
                    replica,
                    expected: first.len(),
                    found: logical.len(),
                });
            }
            for device in logical {
                if device.is_empty() {
                    return Err(ValuesError::EmptyDeviceName { replica });
                }
                if !seen.insert(device.as_str()) {
                    return Err(ValuesError::DuplicateDevice {
                        device: device.clone(),
                    });
                }
            }
        }
        Ok(ReplicaDeviceMap { devices })
    }

    /// How many replicas the map has (TF's `num_replicas_in_graph`).
    pub fn num_replicas(&self) -> usize {
        self.devices.len()
    }

    /// How many devices each replica spans; 1 unless built with logical devices.
    pub fn num_logical_devices(&self) -> usize {
        self.devices[0].len()
    }

    /// Every device, replica by replica, logical devices in order.
    pub fn all_devices(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().flatten().map(String::as_str)
    }

    /// The primary device of each replica, in replica order.
    pub fn primary_devices(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().map(|logical| logical[0].as_str())
    }

    /// The devices that `replica` spans, logical device 0 first.
    pub fn devices_for_replica(&self, replica: usize) -> Result<&[String], ValuesError> {
        self.devices
            .get(replica)
            .map(Vec::as_slice)
            .ok_or(ValuesError::ReplicaOutOfRange {
                replica,
                num_replicas: self.num_replicas(),
            })
    }

    /// The device where `replica`'s values live (its logical device 0).
    pub fn primary_device(&self, replica: usize) -> Result<&str, ValuesError> {
        Ok(&self.devices_for_replica(replica)?[0])
    }

    /// Logical device `index` of every replica, in replica order (for example "the second core
    /// of every replica").
    pub fn logical_device(&self, index: usize) -> Result<Vec<&str>, ValuesError> {
        if index >= self.num_logical_devices() {
            return Err(ValuesError::LogicalDeviceOutOfRange {
                index,
                num_logical_devices: self.num_logical_devices(),
            });
        }
        Ok(self.devices.iter().map(|l| l[index].as_str()).collect())
    }

    /// The replica that `device` belongs to, or `None` for a device outside the map (VAL-31).
    pub fn replica_for_device(&self, device: &str) -> Option<usize> {
        self.devices
            .iter()
            .position(|logical| logical.iter().any(|d| d == device))
    }

    /// Like [`replica_for_device`](Self::replica_for_device), but a device outside the map is an
    /// `InvalidArgument` error naming the map (TF's `select_for_device`, VAL-19).
    pub fn require_replica_for_device(&self, device: &str) -> Result<usize, ValuesError> {
        self.replica_for_device(device)
            .ok_or_else(|| ValuesError::UnknownDevice {
                device: device.to_owned(),
                devices: self.to_string(),
            })
    }

    /// Whether `device` is one of `replica`'s devices; an unknown replica is simply `false`.
    pub fn is_device_in_replica(&self, device: &str, replica: usize) -> bool {
        self.devices
            .get(replica)
            .is_some_and(|logical| logical.iter().any(|d| d == device))
    }

    /// Checks that `values` has one entry per replica.
    pub(crate) fn check_count(&self, what: &'static str, found: usize) -> Result<(), ValuesError> {
        if found == self.num_replicas() {
            Ok(())
        } else {
            Err(ValuesError::ReplicaCountMismatch {
                what,
                expected: self.num_replicas(),
                found,
            })
        }
    }
}

impl fmt::Display for ReplicaDeviceMap {
    /// `[d0, d1]`, or `[(d0a, d0b), (d1a, d1b)]` when replicas span several devices (VAL-33).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replicas: Vec<String> = if self.num_logical_devices() == 1 {
            self.primary_devices().map(str::to_owned).collect()
        } else {
            self.devices
                .iter()
                .map(|logical| format!("({})", logical.join(", ")))
                .collect()
        };
        write!(f, "[{}]", replicas.join(", "))
    }
}

impl fmt::Debug for ReplicaDeviceMap {
    /// `ReplicaDeviceMap(['d0', 'd1'])`, TensorFlow's repr (VAL-33); logical devices nest a list
    /// per replica.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quote = |logical: &[String]| -> Vec<String> {
            logical.iter().map(|d| format!("'{d}'")).collect()
        };
        let replicas: Vec<String> = if self.num_logical_devices() == 1 {
            self.devices.iter().map(|l| quote(l).remove(0)).collect()
        } else {
            self.devices
                .iter()
                .map(|l| format!("[{}]", quote(l).join(", ")))
                .collect()
        };
        write!(f, "ReplicaDeviceMap([{}])", replicas.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ragged_logical_devices_are_rejected() {
        let err = ReplicaDeviceMap::with_logical_devices(vec![vec!["a", "b"], vec!["c"]]);
        assert!(matches!(
            err,
            Err(ValuesError::RaggedLogicalDevices {
                replica: 1,
                expected: 2,
                found: 1
            })
        ));
    }

    #[test]
    fn empty_inputs_are_rejected() {
        let none: [&str; 0] = [];
        assert_eq!(
            ReplicaDeviceMap::new(none),
            Err(ValuesError::EmptyDeviceMap)
        );
        let no_logical: [[&str; 0]; 1] = [[]];
        assert_eq!(
            ReplicaDeviceMap::with_logical_devices(no_logical),
            Err(ValuesError::EmptyDeviceMap)
        );
        assert_eq!(
            ReplicaDeviceMap::new(["a", ""]),
            Err(ValuesError::EmptyDeviceName { replica: 1 })
        );
    }

    #[test]
    fn logical_device_lookup_checks_the_index() {
        let map = ReplicaDeviceMap::with_logical_devices([["a", "b"], ["c", "d"]]).unwrap();
        assert_eq!(map.logical_device(1).unwrap(), ["b", "d"]);
        assert!(map.logical_device(2).is_err());
        assert_eq!(map.primary_device(1).unwrap(), "c");
        assert!(map.primary_device(2).is_err());
    }
}
