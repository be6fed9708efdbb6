//! [`LocalDevices`]: the devices of one worker that a strategy runs its replicas on, parsed,
//! canonicalized and checked once, so that the layers above read kinds and indices instead of
//! parsing the names again.

use std::fmt;
use std::ops::Deref;

use crate::canonical::canonical_spec;
use crate::{DeviceKind, DeviceSpec, DeviceSpecError, is_device_list_single_worker};

/// One device of a [`LocalDevices`] list: its canonical name, kind, index and host CPU.
///
/// ```
/// use distribute_device_spec::{DeviceKind, LocalDevices};
///
/// let devices = LocalDevices::new(["/gpu:1"])?;
/// let gpu = &devices[0];
/// assert_eq!(gpu.name(), "/job:localhost/replica:0/task:0/device:GPU:1");
/// assert_eq!((gpu.kind(), gpu.index()), (&DeviceKind::Gpu, 1));
/// assert_eq!(gpu.gpu_index(), Some(1));
/// assert_eq!(gpu.host(), "/job:localhost/replica:0/task:0/device:CPU:0");
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalDevice {
    name: String,
    spec: DeviceSpec,
    kind: DeviceKind,
    index: u32,
    host: String,
}

impl LocalDevice {
    /// The canonical name, `/job:J/replica:R/task:T/device:TYPE:N`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The canonical name as a spec, every field set.
    pub fn spec(&self) -> &DeviceSpec {
        &self.spec
    }

    /// The device's kind.
    pub fn kind(&self) -> &DeviceKind {
        &self.kind
    }

    /// The device's index among the devices of its kind on its worker.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The GPU ordinal when the device is a GPU, else `None`.
    pub fn gpu_index(&self) -> Option<usize> {
        (self.kind == DeviceKind::Gpu).then_some(self.index as usize)
    }

    /// The canonical name of the worker's CPU:0, where host-side work for this device runs.
    pub fn host(&self) -> &str {
        &self.host
    }
}

impl fmt::Display for LocalDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.name)
    }
}

/// The devices of one worker, each named once: what a strategy over one machine's devices is
/// built from, validated when it is made, so nothing downstream parses or checks the names again.
///
/// Made from device strings in TF's syntax, in the order given. Fails, naming the offending
/// entry, on an empty list, a device string that does not parse or canonicalize, local and
/// remote devices mixed, devices of several workers, or one device named twice (also through
/// different spellings such as `/gpu:0` and `/device:GPU:0`).
///
/// It dereferences to a slice of [`LocalDevice`].
///
/// ```
/// use distribute_device_spec::{DeviceKind, DeviceSpecError, LocalDevices};
///
/// let devices = LocalDevices::new(["/cpu:0", "/device:GPU:0"])?;
/// assert_eq!(devices.len(), 2);
/// assert_eq!(devices[1].kind(), &DeviceKind::Gpu);
/// assert_eq!(devices.host(), "/job:localhost/replica:0/task:0/device:CPU:0");
///
/// let twice = LocalDevices::new(["/gpu:0", "/device:GPU:0"]).unwrap_err();
/// assert!(matches!(twice, DeviceSpecError::DuplicateDevice { .. }));
/// # Ok::<(), DeviceSpecError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalDevices {
    /// Never empty; distinct names; one worker.
    devices: Vec<LocalDevice>,
}

impl LocalDevices {
    /// Parses, checks and canonicalizes `devices` (see the type's documentation).
    pub fn new<S: AsRef<str>>(
        devices: impl IntoIterator<Item = S>,
    ) -> Result<Self, DeviceSpecError> {
        let given: Vec<S> = devices.into_iter().collect();
        if given.is_empty() {
            return Err(DeviceSpecError::EmptyDeviceList);
        }
        let entry_error = |position: usize, device: &S, error: DeviceSpecError| {
            DeviceSpecError::InvalidListEntry {
                position,
                device: device.as_ref().to_owned(),
                error: Box::new(error),
            }
        };
        let specs = given
            .iter()
            .enumerate()
            .map(|(position, device)| {
                device
                    .as_ref()
                    .parse::<DeviceSpec>()
                    .map_err(|e| entry_error(position, device, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !is_device_list_single_worker(&specs)? {
            return Err(DeviceSpecError::SeveralWorkers {
                devices: given.iter().map(|d| d.as_ref().to_owned()).collect(),
            });
        }
        let no_host = DeviceSpec::new();
        let mut local: Vec<LocalDevice> = Vec::with_capacity(given.len());
        for (position, (device, spec)) in given.iter().zip(&specs).enumerate() {
            let canonical = canonical_spec(spec, None, &no_host)
                .map_err(|e| entry_error(position, device, e))?;
            let name = canonical.to_string();
            if let Some(first) = local.iter().position(|d| d.name == name) {
                return Err(DeviceSpecError::DuplicateDevice {
                    first: given[first].as_ref().to_owned(),
                    second: device.as_ref().to_owned(),
                    canonical: name,
                });
            }
            // Canonicalization fills in every field, the device type and index included.
            let kind = canonical
                .device_kind()
                .expect("a canonical spec names a device type");
            let index = canonical
                .device_index()
                .expect("a canonical spec names a device index");
            let host = canonical.clone().with_device("CPU", 0)?.to_string();
            local.push(LocalDevice {
                name,
                spec: canonical,
                kind,
                index,
                host,
            });
        }
        Ok(LocalDevices { devices: local })
    }

    /// `n` CPU devices, `/cpu:0` … `/cpu:{n-1}`: `n` replicas on the host, one thread each.
    ///
    /// ```
    /// use distribute_device_spec::LocalDevices;
    ///
    /// let devices = LocalDevices::cpus(2);
    /// assert_eq!(devices, LocalDevices::new(["/cpu:0", "/cpu:1"])?);
    /// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// When `n` is 0: a strategy needs at least one device (use [`LocalDevices::new`] to get an
    /// error instead).
    pub fn cpus(n: usize) -> LocalDevices {
        Self::numbered("CPU", n)
    }

    /// `n` GPU devices, `/gpu:0` … `/gpu:{n-1}`; whether they exist is the strategy's concern
    /// (this crate knows nothing about drivers).
    ///
    /// ```
    /// use distribute_device_spec::{DeviceKind, LocalDevices};
    ///
    /// let devices = LocalDevices::gpus(2);
    /// assert_eq!(devices[1].kind(), &DeviceKind::Gpu);
    /// assert_eq!(devices[1].name(), "/job:localhost/replica:0/task:0/device:GPU:1");
    /// ```
    ///
    /// # Panics
    ///
    /// When `n` is 0, as [`LocalDevices::cpus`].
    pub fn gpus(n: usize) -> LocalDevices {
        Self::numbered("GPU", n)
    }

    fn numbered(kind: &str, n: usize) -> LocalDevices {
        assert!(
            n > 0,
            "LocalDevices::{}s(0): a strategy needs at least one device",
            kind.to_lowercase()
        );
        Self::new((0..n).map(|i| format!("/device:{kind}:{i}")))
            .expect("numbered local devices are distinct and well-formed")
    }

    /// The devices in the order given.
    pub fn as_slice(&self) -> &[LocalDevice] {
        &self.devices
    }

    /// The canonical names, in order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.devices.iter().map(LocalDevice::name)
    }

    /// The canonical name of the worker's CPU:0 (every device of the list shares it).
    pub fn host(&self) -> &str {
        self.devices[0].host()
    }

    /// True when the devices are those of a remote worker (a job other than `localhost`), which
    /// this process cannot reach without a cross-process backend.
    pub fn is_remote(&self) -> bool {
        !self.devices[0].spec.is_local()
    }
}

impl Deref for LocalDevices {
    type Target = [LocalDevice];

    fn deref(&self) -> &[LocalDevice] {
        &self.devices
    }
}

impl<'a> IntoIterator for &'a LocalDevices {
    type Item = &'a LocalDevice;
    type IntoIter = std::slice::Iter<'a, LocalDevice>;

    fn into_iter(self) -> Self::IntoIter {
        self.devices.iter()
    }
}

impl fmt::Display for LocalDevices {
    /// The canonical names as a list: `[/job:localhost/…/device:CPU:0, …]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, device) in self.devices.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(&device.name)?;
        }
        f.write_str("]")
    }
}

/// Device lists in TF's syntax convert to [`LocalDevices`] (checked as [`LocalDevices::new`]
/// does), so an API that takes `impl TryInto<LocalDevices>` takes `&["/cpu:0", "/cpu:1"]`, a
/// `Vec<String>` or a `LocalDevices` alike.
///
/// ```
/// use distribute_device_spec::LocalDevices;
///
/// let from_strs = LocalDevices::try_from(&["/cpu:0", "/cpu:1"])?;
/// let from_strings = LocalDevices::try_from(vec!["/cpu:0".to_owned(), "/cpu:1".to_owned()])?;
/// assert_eq!(from_strs, from_strings);
/// assert!(LocalDevices::try_from(&["/cpu:0", "/cpu:0"]).is_err());
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
impl<S: AsRef<str>> TryFrom<&[S]> for LocalDevices {
    type Error = DeviceSpecError;

    fn try_from(devices: &[S]) -> Result<Self, DeviceSpecError> {
        LocalDevices::new(devices)
    }
}

impl<S: AsRef<str>, const N: usize> TryFrom<&[S; N]> for LocalDevices {
    type Error = DeviceSpecError;

    fn try_from(devices: &[S; N]) -> Result<Self, DeviceSpecError> {
        LocalDevices::new(devices)
    }
}

impl<S: AsRef<str>, const N: usize> TryFrom<[S; N]> for LocalDevices {
    type Error = DeviceSpecError;

    fn try_from(devices: [S; N]) -> Result<Self, DeviceSpecError> {
        LocalDevices::new(devices)
    }
}

impl<S: AsRef<str>> TryFrom<Vec<S>> for LocalDevices {
    type Error = DeviceSpecError;

    fn try_from(devices: Vec<S>) -> Result<Self, DeviceSpecError> {
        LocalDevices::new(devices)
    }
}

impl<S: AsRef<str>> TryFrom<&Vec<S>> for LocalDevices {
    type Error = DeviceSpecError;

    fn try_from(devices: &Vec<S>) -> Result<Self, DeviceSpecError> {
        LocalDevices::new(devices)
    }
}

impl From<&LocalDevices> for LocalDevices {
    fn from(devices: &LocalDevices) -> Self {
        devices.clone()
    }
}
