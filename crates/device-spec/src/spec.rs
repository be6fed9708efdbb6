//! [`DeviceSpec`]: one (possibly partial) device name, parsed from and printed in TF's syntax.

use std::fmt;
use std::str::FromStr;

use crate::{DeviceKind, DeviceSpecError};

/// A device name such as `/job:worker/replica:0/task:1/device:GPU:3`, any field of which may be
/// unset.
///
/// Parsing accepts TF's syntax: components in any order, the leading `/` optional, empty
/// components ignored, the last of a repeated key winning, the legacy short form `/cpu:0` (the
/// types of [`DeviceKind::KNOWN`] in any case, stored upper-case), and `*` for "any". Printing
/// always uses the canonical order `/job:J/replica:R/task:T/device:TYPE:INDEX`, leaving unset
/// fields out and printing an unset index of a set type as `*`.
///
/// A spec is an immutable value: the `with_*` builders return a new spec. Two specs are equal
/// exactly when they print the same.
///
/// ```
/// use distribute_device_spec::DeviceSpec;
///
/// let spec: DeviceSpec = "/task:1/gpu:2/job:worker".parse()?;
/// assert_eq!(spec.to_string(), "/job:worker/task:1/device:GPU:2");
/// assert_eq!(spec.device_index(), Some(2));
/// assert_eq!(spec.replica(), None);
/// assert_eq!(spec, "/job:worker/task:1/device:GPU:2".parse()?);
/// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceSpec {
    job: Option<String>,
    replica: Option<u32>,
    task: Option<u32>,
    device_type: Option<String>,
    // Invariant: `device_index` is `Some` only when `device_type` is, so that equal fields and
    // equal printed strings are the same thing.
    device_index: Option<u32>,
}

impl DeviceSpec {
    /// The empty spec: every field unset. It prints as `""`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The job name, e.g. `worker`.
    pub fn job(&self) -> Option<&str> {
        self.job.as_deref()
    }

    /// The replica number.
    pub fn replica(&self) -> Option<u32> {
        self.replica
    }

    /// The task number.
    pub fn task(&self) -> Option<u32> {
        self.task
    }

    /// The device type, e.g. `GPU`.
    pub fn device_type(&self) -> Option<&str> {
        self.device_type.as_deref()
    }

    /// The device type as a [`DeviceKind`], to match on instead of comparing strings.
    ///
    /// ```
    /// use distribute_device_spec::{DeviceKind, DeviceSpec};
    ///
    /// let spec: DeviceSpec = "/job:worker/gpu:1".parse()?;
    /// assert_eq!(spec.device_kind(), Some(DeviceKind::Gpu));
    /// assert_eq!(DeviceSpec::new().device_kind(), None);
    /// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
    /// ```
    pub fn device_kind(&self) -> Option<DeviceKind> {
        self.device_type().map(DeviceKind::from_valid_name)
    }

    /// The device index; `None` when unset or `*`.
    pub fn device_index(&self) -> Option<u32> {
        self.device_index
    }

    /// True when no field is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The same spec with the job replaced; `None` clears it.
    ///
    /// Fails when the name is empty or contains `/` or `:`, which would not print back.
    pub fn with_job<'a>(self, job: impl Into<Option<&'a str>>) -> Result<Self, DeviceSpecError> {
        let job = job.into().map(|job| checked_name("job", job)).transpose()?;
        Ok(Self { job, ..self })
    }

    /// The same spec with the replica replaced; `None` clears it.
    pub fn with_replica(self, replica: impl Into<Option<u32>>) -> Self {
        Self {
            replica: replica.into(),
            ..self
        }
    }

    /// The same spec with the task replaced; `None` clears it.
    pub fn with_task(self, task: impl Into<Option<u32>>) -> Self {
        Self {
            task: task.into(),
            ..self
        }
    }

    /// The same spec with the device type and index replaced.
    ///
    /// A `None` type clears both; a `None` index means `*`. The lowercase types `cpu` and `gpu`
    /// are upper-cased as TF's constructor does; other types keep their case.
    ///
    /// ```
    /// use distribute_device_spec::DeviceSpec;
    ///
    /// let spec = DeviceSpec::new().with_job("foo")?.with_device("gpu", 2)?;
    /// assert_eq!(spec.to_string(), "/job:foo/device:GPU:2");
    /// assert_eq!(spec.with_device(None, None)?.to_string(), "/job:foo");
    /// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
    /// ```
    pub fn with_device<'a>(
        self,
        device_type: impl Into<Option<&'a str>>,
        index: impl Into<Option<u32>>,
    ) -> Result<Self, DeviceSpecError> {
        let (device_type, device_index) = match device_type.into() {
            None => (None, None),
            Some(device_type) => {
                let device_type = match device_type {
                    "cpu" | "gpu" => device_type.to_ascii_uppercase(),
                    _ => checked_name("device type", device_type)?,
                };
                (Some(device_type), index.into())
            }
        };
        Ok(Self {
            device_type,
            device_index,
            ..self
        })
    }

    /// TF's `make_merged_spec`: each field set in `other` overrides this spec's, unset fields
    /// keep this spec's value. Merging with an empty spec changes nothing.
    ///
    /// Type and index merge independently, as in TF: merging `/device:GPU:*` into a spec with
    /// index 0 gives `GPU:0`.
    ///
    /// ```
    /// use distribute_device_spec::DeviceSpec;
    ///
    /// let base: DeviceSpec = "/job:foo/replica:0".parse()?;
    /// let merged = base.merged_with(&"/task:1/device:GPU:2".parse()?);
    /// assert_eq!(merged.to_string(), "/job:foo/replica:0/task:1/device:GPU:2");
    /// # Ok::<(), distribute_device_spec::DeviceSpecError>(())
    /// ```
    pub fn merged_with(&self, other: &DeviceSpec) -> DeviceSpec {
        fn pick<T: Clone>(over: &Option<T>, base: &Option<T>) -> Option<T> {
            over.as_ref().or(base.as_ref()).cloned()
        }
        let device_type = pick(&other.device_type, &self.device_type);
        // An index without a type cannot arise (neither input has one), but keep the invariant
        // local rather than relying on that.
        let device_index = device_type
            .as_ref()
            .and(pick(&other.device_index, &self.device_index));
        DeviceSpec {
            job: pick(&other.job, &self.job),
            replica: pick(&other.replica, &self.replica),
            task: pick(&other.task, &self.task),
            device_type,
            device_index,
        }
    }

    /// True when the job is unset or `localhost`: the device is on this process's worker.
    pub fn is_local(&self) -> bool {
        matches!(self.job(), None | Some("localhost"))
    }
}

/// Validates a job name or device type: non-empty, without the separators `/` and `:`.
fn checked_name(field: &'static str, value: &str) -> Result<String, DeviceSpecError> {
    if value.is_empty() || value.contains(['/', ':']) {
        return Err(DeviceSpecError::InvalidName {
            field,
            value: value.to_owned(),
        });
    }
    Ok(value.to_owned())
}

/// Parses a replica, task or index strictly: ASCII digits only (no sign, space or `_`), or `*`
/// for "unset".
fn parse_number(
    spec: &str,
    field: &'static str,
    value: &str,
) -> Result<Option<u32>, DeviceSpecError> {
    if value == "*" {
        return Ok(None);
    }
    let invalid = || DeviceSpecError::InvalidNumber {
        spec: spec.to_owned(),
        field,
        value: value.to_owned(),
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    value.parse().map(Some).map_err(|_| invalid())
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    /// Parses TF's device syntax. Every call parses afresh: nothing is cached, so an invalid
    /// string fails every time (TF's parse cache must never turn an error into a success).
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut parsed = DeviceSpec::default();
        let mut seen_device = false;
        for component in spec.split('/').filter(|c| !c.is_empty()) {
            // At most four parts matter: three for `device:TYPE:N`, a fourth means too many.
            let mut parts = component.split(':');
            let parts = [parts.next(), parts.next(), parts.next(), parts.next()];
            let (device_type, index) = match parts {
                [Some("job"), Some("*"), None, _] => {
                    parsed.job = None;
                    continue;
                }
                [Some("job"), Some(job), None, _] => {
                    parsed.job = Some(checked_name("job", job)?);
                    continue;
                }
                [Some("replica"), Some(n), None, _] => {
                    parsed.replica = parse_number(spec, "replica", n)?;
                    continue;
                }
                [Some("task"), Some(n), None, _] => {
                    parsed.task = parse_number(spec, "task", n)?;
                    continue;
                }
                [Some(short), index, None, _] if is_short_form(short) => {
                    (short.to_ascii_uppercase(), index.unwrap_or("*"))
                }
                [
                    Some("device"),
                    Some(device_type @ ("cpu" | "gpu")),
                    Some(index),
                    None,
                ] => (device_type.to_ascii_uppercase(), index),
                [Some("device"), Some(device_type), Some(index), None] => {
                    (device_type.to_owned(), index)
                }
                [name, ..] => {
                    return Err(DeviceSpecError::UnknownComponent {
                        spec: spec.to_owned(),
                        component: name.unwrap_or_default().to_owned(),
                    });
                }
            };
            if std::mem::replace(&mut seen_device, true) {
                return Err(DeviceSpecError::MultipleDeviceTypes {
                    spec: spec.to_owned(),
                });
            }
            parsed.device_type = Some(checked_name("device type", &device_type)?);
            parsed.device_index = parse_number(spec, "index", index)?;
        }
        Ok(parsed)
    }
}

fn is_short_form(name: &str) -> bool {
    DeviceKind::KNOWN
        .iter()
        .any(|kind| kind.as_str().eq_ignore_ascii_case(name))
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Writing pieces with `write_str` instead of `write!` keeps printing (and so
        // canonicalization, which prints) well under the cost of parsing.
        if let Some(job) = &self.job {
            f.write_str("/job:")?;
            f.write_str(job)?;
        }
        if let Some(replica) = self.replica {
            f.write_str("/replica:")?;
            f.write_str(Decimal::new(replica).as_str())?;
        }
        if let Some(task) = self.task {
            f.write_str("/task:")?;
            f.write_str(Decimal::new(task).as_str())?;
        }
        if let Some(device_type) = &self.device_type {
            f.write_str("/device:")?;
            f.write_str(device_type)?;
            f.write_str(":")?;
            match self.device_index {
                Some(index) => f.write_str(Decimal::new(index).as_str())?,
                None => f.write_str("*")?,
            }
        }
        Ok(())
    }
}

/// A `u32` in decimal, on the stack.
struct Decimal {
    digits: [u8; 10],
    start: usize,
}

impl Decimal {
    fn new(mut n: u32) -> Self {
        let mut digits = [0; 10];
        let mut start = digits.len();
        loop {
            start -= 1;
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return Self { digits, start };
            }
        }
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.digits[self.start..]).expect("ASCII digits")
    }
}

impl TryFrom<&str> for DeviceSpec {
    type Error = DeviceSpecError;

    fn try_from(spec: &str) -> Result<Self, Self::Error> {
        spec.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> DeviceSpec {
        s.parse()
            .unwrap_or_else(|e| panic!("'{s}' should parse: {e}"))
    }

    #[test]
    fn index_is_kept_only_with_a_type() {
        let spec = parse("/gpu:3").with_device(None, 7).unwrap();
        assert_eq!(spec.device_index(), None);
        assert_eq!(spec, DeviceSpec::new());
    }

    #[test]
    fn decimals_print_like_display() {
        for n in [0, 7, 10, 99, 4_294_967_295] {
            assert_eq!(Decimal::new(n).as_str(), n.to_string());
        }
    }

    #[test]
    fn short_forms_are_the_known_kinds_in_any_case() {
        for kind in DeviceKind::KNOWN {
            for name in [kind.to_string(), kind.to_string().to_ascii_lowercase()] {
                let spec = parse(&format!("/{name}:1"));
                assert_eq!(spec.device_kind(), Some(kind.clone()), "{name}");
                assert_eq!(spec.device_type(), Some(kind.as_str()), "{name}");
            }
        }
        assert!("/xla_cpu:0".parse::<DeviceSpec>().is_err());
    }

    #[test]
    fn job_wildcard_means_unset() {
        assert_eq!(parse("/job:*/task:1"), parse("/task:1"));
    }

    #[test]
    fn numbers_are_strict() {
        for bad in [
            "/task: 1",
            "/task:+1",
            "/task:-1",
            "/task:1_0",
            "/task:",
            "/task:99999999999",
        ] {
            let err = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(
                matches!(err, DeviceSpecError::InvalidNumber { field: "task", .. }),
                "{bad}: {err:?}"
            );
        }
    }
}
