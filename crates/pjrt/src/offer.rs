//! What a plugin offers this process: its platform and how many devices a client may have,
//! learned once per plugin and process ([`Plugin::offer`]), so that a caller asking for more is
//! refused before a client is created (the CUDA plugin's client takes most of the GPU's memory
//! as it starts), and a test that needs more devices can say so and skip.
//!
//! [`DEVICES_ENV`] caps the count, as `CUDA_VISIBLE_DEVICES` does for CUDA. On the CPU plugin,
//! whose device count is a client option, it makes the plugin one of exactly that many devices:
//! that is how a one-GPU machine's count is tried on a machine without a GPU.

use std::ffi::OsStr;

use crate::error::{ErrorCode, PjrtError, Result};
use crate::plugin::Plugin;
use crate::runtime::{CPU_PLATFORM, Client, ClientOptions, PluginOption};

/// The environment variable that caps how many of a plugin's devices this process may use (a
/// count of at least 1). Unset or empty: every device the plugin has (on the CPU plugin, as
/// many as asked for).
pub const DEVICES_ENV: &str = "DISTRIBUTE_PJRT_DEVICES";

/// A plugin's platform and how many devices a client of it may have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    platform: String,
    /// The most devices; `None`: as many as asked for (the CPU plugin, uncapped).
    most: Option<usize>,
    /// Whether [`DEVICES_ENV`] set `most` (it was below what the plugin has).
    capped: bool,
}

impl Offer {
    /// The offer of a plugin on `platform` with `devices` devices (`None`: as many as asked
    /// for, as the CPU plugin), under an optional cap.
    pub fn new(platform: impl Into<String>, devices: Option<usize>, cap: Option<usize>) -> Offer {
        let (most, capped) = match (devices, cap) {
            (Some(has), Some(cap)) if cap < has => (Some(cap), true),
            (Some(has), _) => (Some(has), false),
            (None, cap) => (cap, cap.is_some()),
        };
        Offer {
            platform: platform.into(),
            most,
            capped,
        }
    }

    /// The platform's name, e.g. `cpu`, `cuda`.
    pub fn platform(&self) -> &str {
        &self.platform
    }

    /// Whether this is the CPU plugin, whose device count is a client option.
    pub fn is_cpu(&self) -> bool {
        self.platform == CPU_PLATFORM
    }

    /// The most devices a client may have; `None`: as many as asked for.
    pub fn most_devices(&self) -> Option<usize> {
        self.most
    }

    /// Whether a client of `wanted` devices can be had; if not, by how much it falls short.
    pub fn check(&self, wanted: usize) -> std::result::Result<(), Shortfall> {
        match self.most {
            Some(has) if has < wanted => Err(Shortfall {
                needed: wanted,
                platform: self.platform.clone(),
                has,
                capped: self.capped,
            }),
            _ => Ok(()),
        }
    }

    /// Splits `counts` into those this plugin can give and the shortfalls of the others, in
    /// order: how a test generic over the replica count picks the counts it runs.
    pub fn counts_within(&self, counts: &[usize]) -> (Vec<usize>, Vec<Shortfall>) {
        let mut within = Vec::new();
        let mut short = Vec::new();
        for &n in counts {
            match self.check(n) {
                Ok(()) => within.push(n),
                Err(shortfall) => short.push(shortfall),
            }
        }
        (within, short)
    }
}

/// A plugin with fewer devices than a caller needs. Its text is the reason a test gives when it
/// skips: `needs 4 devices, the cuda plugin has 1`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("needs {needed} devices, the {platform} plugin has {has}{}", cap_note(*.capped, *.has))]
pub struct Shortfall {
    /// The devices asked for.
    pub needed: usize,
    /// The plugin's platform.
    pub platform: String,
    /// The devices it has (or may use, under [`DEVICES_ENV`]).
    pub has: usize,
    /// Whether [`DEVICES_ENV`] is why it has no more.
    pub capped: bool,
}

/// ` (DISTRIBUTE_PJRT_DEVICES=M)` when the cap is why a plugin has no more devices.
pub(crate) fn cap_note(capped: bool, has: usize) -> String {
    if capped {
        format!(" ({DEVICES_ENV}={has})")
    } else {
        String::new()
    }
}

/// Reads a [`DEVICES_ENV`] value: unset or empty is no cap; anything but a count of at least 1
/// is an error that names the variable.
pub fn parse_cap(value: Option<&OsStr>) -> Result<Option<usize>> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match value.to_str().and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(count) if count >= 1 => Ok(Some(count)),
        _ => Err(PjrtError::InvalidArgument(format!(
            "{DEVICES_ENV}={} is not a device count of at least 1; unset it to use every device",
            value.to_string_lossy()
        ))),
    }
}

impl Plugin {
    /// What this plugin offers this process: its platform and device count, under
    /// [`DEVICES_ENV`]. The first call creates one client to ask, and drops it; later calls
    /// answer from memory. A failure is not remembered: the next call asks again.
    ///
    /// That client first asks not to preallocate memory (`preallocate = false`, an option of
    /// JAX's GPU plugins), so that asking neither takes 75 % of a GPU's memory for a moment nor
    /// fails beside a client that holds it; a plugin that refuses the option (`INVALID_ARGUMENT`:
    /// the CPU plugin, a TPU plugin) is asked again with no options.
    pub fn offer(&'static self) -> Result<&'static Offer> {
        if let Some(offer) = self.offer.get() {
            return Ok(offer);
        }
        // One probe at a time: two CUDA clients created at once would each want most of the GPU.
        let _probing = self
            .probing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(offer) = self.offer.get() {
            return Ok(offer);
        }
        let cap = parse_cap(std::env::var_os(DEVICES_ENV).as_deref())?;
        let lean = ClientOptions {
            plugin_options: vec![("preallocate".to_owned(), PluginOption::Bool(false))],
            ..ClientOptions::default()
        };
        let client = match Client::new(self, &lean) {
            Err(err) if err.code() == Some(ErrorCode::INVALID_ARGUMENT) => {
                Client::new(self, &ClientOptions::default())?
            }
            other => other?,
        };
        let platform = client.platform_name()?;
        let devices = if platform == CPU_PLATFORM {
            None
        } else {
            Some(client.devices()?.len())
        };
        drop(client);
        Ok(self
            .offer
            .get_or_init(|| Offer::new(platform, devices, cap)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_with_fewer_devices_says_how_many_it_has() {
        let one_gpu = Offer::new("cuda", Some(1), None);
        assert_eq!(one_gpu.most_devices(), Some(1));
        assert!(one_gpu.check(1).is_ok());
        let short = one_gpu.check(4).unwrap_err();
        assert_eq!(short.to_string(), "needs 4 devices, the cuda plugin has 1");
        let (within, short) = one_gpu.counts_within(&[1, 2, 4, 8]);
        assert_eq!(within, [1]);
        let needs: Vec<usize> = short.iter().map(|s| s.needed).collect();
        assert_eq!(needs, [2, 4, 8]);
    }

    #[test]
    fn the_cpu_plugin_gives_any_count_unless_capped() {
        let cpu = Offer::new(CPU_PLATFORM, None, None);
        assert!(cpu.is_cpu());
        assert_eq!(cpu.most_devices(), None);
        assert_eq!(cpu.counts_within(&[1, 2, 4, 8]).0, [1, 2, 4, 8]);
        let capped = Offer::new(CPU_PLATFORM, None, Some(1));
        assert_eq!(capped.most_devices(), Some(1));
        assert_eq!(
            capped.check(2).unwrap_err().to_string(),
            "needs 2 devices, the cpu plugin has 1 (DISTRIBUTE_PJRT_DEVICES=1)"
        );
    }

    #[test]
    fn a_cap_above_the_device_count_changes_nothing() {
        let eight = Offer::new("cuda", Some(8), Some(16));
        assert_eq!(eight, Offer::new("cuda", Some(8), None));
        let two = Offer::new("cuda", Some(8), Some(2));
        assert_eq!(two.most_devices(), Some(2));
        assert!(two.check(4).unwrap_err().capped);
    }

    #[test]
    fn caps_are_counts_of_at_least_one() {
        assert_eq!(parse_cap(None).unwrap(), None);
        assert_eq!(parse_cap(Some(OsStr::new(""))).unwrap(), None);
        assert_eq!(parse_cap(Some(OsStr::new("2"))).unwrap(), Some(2));
        for bad in ["0", "-1", "two", "1.5"] {
            let err = parse_cap(Some(OsStr::new(bad))).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "DISTRIBUTE_PJRT_DEVICES={bad} is not a device count"
                )),
                "{err}"
            );
        }
    }
}
