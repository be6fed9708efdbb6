//! [`DeviceKind`]: the type of a device (`CPU`, `GPU`, `TPU`, …) as a value to match on, so no
//! layer compares device types as strings.

use std::fmt;
use std::str::FromStr;

use crate::DeviceSpecError;

/// The type of a device, spelled as TensorFlow spells it: `CPU`, `GPU`, `TPU`, `CUSTOM`, `EPU`,
/// or any other type a [`DeviceSpec`](crate::DeviceSpec) may carry (`XLA_CPU`, …).
///
/// Parsing recognises the five known types whatever their case, as TF's short form (`/gpu:0`)
/// does; printing uses TF's upper-case spelling, so a known kind prints back as it parses from
/// its canonical name. Other types keep their spelling.
///
/// ```
/// use distribute_device_spec::DeviceKind;
///
/// assert_eq!("GPU".parse::<DeviceKind>()?, DeviceKind::Gpu);
/// assert_eq!("gpu".parse::<DeviceKind>()?, DeviceKind::Gpu);
/// assert_eq!(DeviceKind::Tpu.to_string(), "TPU");
/// assert_eq!("XLA_CPU".parse::<DeviceKind>()?, DeviceKind::Other("XLA_CPU".into()));
/// assert!("".parse::<DeviceKind>().is_err());
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// A host CPU.
    Cpu,
    /// A GPU.
    Gpu,
    /// A TPU core.
    Tpu,
    /// A custom (pluggable) device.
    Custom,
    /// An EPU.
    Epu,
    /// Any other device type, spelled as given.
    Other(String),
}

impl DeviceKind {
    /// The kinds TF's legacy short form (`/cpu:0`, `/GPU:*`, `/tpu:1`) names, in any case: every
    /// kind but [`DeviceKind::Other`].
    pub const KNOWN: [DeviceKind; 5] = [
        DeviceKind::Cpu,
        DeviceKind::Gpu,
        DeviceKind::Tpu,
        DeviceKind::Custom,
        DeviceKind::Epu,
    ];

    /// The type as TF spells it in a device name, e.g. `GPU`.
    pub fn as_str(&self) -> &str {
        match self {
            DeviceKind::Cpu => "CPU",
            DeviceKind::Gpu => "GPU",
            DeviceKind::Tpu => "TPU",
            DeviceKind::Custom => "CUSTOM",
            DeviceKind::Epu => "EPU",
            DeviceKind::Other(name) => name,
        }
    }

    /// The kind of a device type that is already known to be a valid name (as every type held
    /// by a `DeviceSpec` is).
    pub(crate) fn from_valid_name(name: &str) -> DeviceKind {
        Self::KNOWN
            .into_iter()
            .find(|kind| kind.as_str().eq_ignore_ascii_case(name))
            .unwrap_or_else(|| DeviceKind::Other(name.to_owned()))
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for DeviceKind {
    type Err = DeviceSpecError;

    /// Fails on a name that could not appear in a device string: empty, or containing `/` or
    /// `:`.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        if name.is_empty() || name.contains(['/', ':']) {
            return Err(DeviceSpecError::InvalidName {
                field: "device type",
                value: name.to_owned(),
            });
        }
        Ok(Self::from_valid_name(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_kinds_print_back_as_they_parse() {
        for kind in DeviceKind::KNOWN {
            assert_eq!(kind.to_string().parse::<DeviceKind>().unwrap(), kind);
            assert_eq!(
                kind.to_string()
                    .to_ascii_lowercase()
                    .parse::<DeviceKind>()
                    .unwrap(),
                kind
            );
        }
    }

    #[test]
    fn other_kinds_keep_their_spelling() {
        let kind: DeviceKind = "XLA_GPU".parse().unwrap();
        assert_eq!(kind, DeviceKind::Other("XLA_GPU".into()));
        assert_eq!(kind.to_string(), "XLA_GPU");
    }

    #[test]
    fn names_that_cannot_appear_in_a_device_string_are_refused() {
        for bad in ["", "GPU:0", "a/b"] {
            assert!(
                matches!(
                    bad.parse::<DeviceKind>(),
                    Err(DeviceSpecError::InvalidName { .. })
                ),
                "{bad:?}"
            );
        }
    }
}
