//! [`PerReplica`] and [`Mirrored`]: one value per replica, behind the common
//! [`DistributedValues`] interface.

use std::fmt;
use std::sync::Arc;

use crate::{ReplicaDeviceMap, ValuesError};

/// What every distributed value offers: one value per replica, placed on the replicas' devices.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{DistributedValues, PerReplica, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/device:CPU:0", "/device:GPU:0"])?);
/// let v = PerReplica::new(map, vec![1, 2])?;
/// assert_eq!(v.get(1)?, &2);
/// assert_eq!(v.get_on_device("/device:GPU:0")?, &2);
/// assert_eq!(v.primary(), &1);
/// assert_eq!(v.devices().collect::<Vec<_>>(), ["/device:CPU:0", "/device:GPU:0"]);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub trait DistributedValues {
    /// The type of one replica's value.
    type Value;

    /// The values, in replica order (TF's `values` / `experimental_local_results`).
    fn values(&self) -> &[Self::Value];

    /// The devices the values live on.
    fn device_map(&self) -> &ReplicaDeviceMap;

    /// How many replicas there are.
    fn num_replicas(&self) -> usize {
        self.values().len()
    }

    /// Replica `replica`'s value: what a read inside that replica returns (VAL-20).
    fn get(&self, replica: usize) -> Result<&Self::Value, ValuesError> {
        self.values()
            .get(replica)
            .ok_or(ValuesError::ReplicaOutOfRange {
                replica,
                num_replicas: self.num_replicas(),
            })
    }

    /// The value on `device`; a device outside the map is `InvalidArgument` (VAL-19).
    fn get_on_device(&self, device: &str) -> Result<&Self::Value, ValuesError> {
        let replica = self.device_map().require_replica_for_device(device)?;
        self.get(replica)
    }

    /// Replica 0's value.
    ///
    /// # Panics
    ///
    /// When [`values`](Self::values) is empty. [`PerReplica`] and [`Mirrored`] always hold one
    /// value per replica of a non-empty device map, so this only concerns other implementations:
    /// they must never return an empty slice, or must override this method.
    fn primary(&self) -> &Self::Value {
        &self.values()[0]
    }

    /// Each replica's primary device, in replica order.
    fn devices(&self) -> impl Iterator<Item = &str> {
        self.device_map().primary_devices()
    }

    /// A read outside any replica (cross-replica context) when the code runs on `current_device`.
    /// Only values that are the same on every replica support it; [`PerReplica`] answers
    /// `Unimplemented` (VAL-23).
    fn read_cross_replica(&self, current_device: Option<&str>)
    -> Result<&Self::Value, ValuesError>;
}

/// A value that may differ on every replica: the result of a step function, a per-replica batch.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{DistributedValues, PerReplica, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/device:CPU:0", "/device:CPU:1"])?);
/// let loss = PerReplica::new(map, vec![0.5, 0.25])?;
/// assert_eq!(loss.values(), [0.5, 0.25]);
/// assert_eq!(loss.to_string(), "PerReplica:{\n  0 /device:CPU:0: 0.5,\n  1 /device:CPU:1: 0.25\n}");
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct PerReplica<T> {
    values: Vec<T>,
    devices: Arc<ReplicaDeviceMap>,
}

/// Copies of one value, one per replica: a broadcast result or the value of a mirrored variable.
/// The copies are not compared (a copy on a GPU may differ in its last bits from the CPU's);
/// building a `Mirrored` asserts that they stand for the same logical value.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{DistributedValues, Mirrored, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/device:CPU:0", "/device:GPU:0"])?);
/// let w = Mirrored::new(map, vec![3.0, 3.0])?;
/// // Outside the replicas, a read takes the copy on the current device, else the primary (VAL-22).
/// assert_eq!(w.read_cross_replica(Some("/device:GPU:0"))?, &3.0);
/// assert_eq!(w.read_cross_replica(None)?, &3.0);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct Mirrored<T> {
    values: Vec<T>,
    devices: Arc<ReplicaDeviceMap>,
}

macro_rules! common_impls {
    ($ty:ident, $what:literal) => {
        impl<T> $ty<T> {
            /// Wraps one value per replica of `devices`; the counts must match.
            pub fn new(
                devices: impl Into<Arc<ReplicaDeviceMap>>,
                values: Vec<T>,
            ) -> Result<Self, ValuesError> {
                let devices = devices.into();
                devices.check_count($what, values.len())?;
                Ok($ty { values, devices })
            }

            /// Wraps values known to match the map's replica count.
            pub(crate) fn from_parts(devices: Arc<ReplicaDeviceMap>, values: Vec<T>) -> Self {
                debug_assert_eq!(devices.num_replicas(), values.len());
                $ty { values, devices }
            }

            /// The values and the device map, taken apart (VAL-28: components and back).
            pub fn into_parts(self) -> (Vec<T>, Arc<ReplicaDeviceMap>) {
                (self.values, self.devices)
            }

            /// The shared device map.
            pub fn shared_device_map(&self) -> &Arc<ReplicaDeviceMap> {
                &self.devices
            }

            /// Applies `f` to every replica's value, keeping the devices (VAL-28's map over
            /// components).
            pub fn map<U>(self, f: impl FnMut(T) -> U) -> $ty<U> {
                $ty {
                    values: self.values.into_iter().map(f).collect(),
                    devices: self.devices,
                }
            }

            /// Iterates over `(replica, primary device, value)`.
            pub fn iter(&self) -> impl Iterator<Item = (usize, &str, &T)> {
                self.devices
                    .primary_devices()
                    .zip(&self.values)
                    .enumerate()
                    .map(|(i, (d, v))| (i, d, v))
            }
        }

        impl<T> IntoIterator for $ty<T> {
            type Item = T;
            type IntoIter = std::vec::IntoIter<T>;
            fn into_iter(self) -> Self::IntoIter {
                self.values.into_iter()
            }
        }

        impl<'a, T> IntoIterator for &'a $ty<T> {
            type Item = &'a T;
            type IntoIter = std::slice::Iter<'a, T>;
            fn into_iter(self) -> Self::IntoIter {
                self.values.iter()
            }
        }

        impl<T: fmt::Display> fmt::Display for $ty<T> {
            /// `Name:{\n  0 device: value,\n  1 device: value\n}` (VAL-26, with devices).
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}:{{", stringify!($ty))?;
                for (i, device, value) in self.iter() {
                    let sep = if i == 0 { "" } else { "," };
                    write!(f, "{sep}\n  {i} {device}: {value}")?;
                }
                f.write_str("\n}")
            }
        }

        impl<T: fmt::Debug> fmt::Debug for $ty<T> {
            /// A map from `replica device` to value, which nests and pretty-prints like std's.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(stringify!($ty))?;
                f.write_str(" ")?;
                f.debug_map()
                    .entries(self.iter().map(|(i, d, v)| (ReplicaLabel(i, d), v)))
                    .finish()
            }
        }
    };
}

common_impls!(PerReplica, "PerReplica");
common_impls!(Mirrored, "Mirrored");

/// Prints `0 /device:CPU:0` without quotes, as a `Debug` map key.
struct ReplicaLabel<'a>(usize, &'a str);

impl fmt::Debug for ReplicaLabel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0, self.1)
    }
}

impl<T> DistributedValues for PerReplica<T> {
    type Value = T;

    fn values(&self) -> &[T] {
        &self.values
    }

    fn device_map(&self) -> &ReplicaDeviceMap {
        &self.devices
    }

    fn read_cross_replica(&self, _current_device: Option<&str>) -> Result<&T, ValuesError> {
        Err(ValuesError::Unimplemented {
            what: "reading a PerReplica value outside a replica",
            hint: "read one replica's value with get(replica), or reduce the values first",
        })
    }
}

impl<T> DistributedValues for Mirrored<T> {
    type Value = T;

    fn values(&self) -> &[T] {
        &self.values
    }

    fn device_map(&self) -> &ReplicaDeviceMap {
        &self.devices
    }

    /// The copy on `current_device`, or the primary when there is none there (VAL-22).
    fn read_cross_replica(&self, current_device: Option<&str>) -> Result<&T, ValuesError> {
        let replica = current_device
            .and_then(|d| self.devices.replica_for_device(d))
            .unwrap_or(0);
        Ok(&self.values[replica])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map2() -> Arc<ReplicaDeviceMap> {
        Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/gpu:0"]).unwrap())
    }

    #[test]
    fn construction_checks_the_replica_count() {
        let err = PerReplica::new(map2(), vec![1]).unwrap_err();
        assert_eq!(
            err,
            ValuesError::ReplicaCountMismatch {
                what: "PerReplica",
                expected: 2,
                found: 1
            }
        );
        assert!(Mirrored::new(map2(), vec![1, 1, 1]).is_err());
    }

    #[test]
    fn out_of_range_reads_are_errors() {
        let v = PerReplica::new(map2(), vec!["a", "b"]).unwrap();
        assert!(matches!(
            v.get(2),
            Err(ValuesError::ReplicaOutOfRange {
                replica: 2,
                num_replicas: 2
            })
        ));
    }

    #[test]
    fn debug_nests_like_a_map() {
        let v = Mirrored::new(map2(), vec!["a", "a"]).unwrap();
        assert_eq!(
            format!("{v:?}"),
            r#"Mirrored {0 /cpu:0: "a", 1 /gpu:0: "a"}"#
        );
    }
}
