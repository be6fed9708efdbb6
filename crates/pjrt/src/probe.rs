//! Asking a plugin what it offers ([`Plugin::offer`]): one client is created, asked for its
//! platform and device count, and dropped; the answer is remembered, under the [`DEVICES_ENV`]
//! cap ([`parse_cap`]). Asking needs a [`Client`], so this sits above the runtime, apart from
//! [`Offer`] and [`Shortfall`](crate::Shortfall), which the runtime and the errors use.

use std::ffi::OsStr;

use crate::error::{ErrorCode, PjrtError, Result};
use crate::offer::{CPU_PLATFORM, DEVICES_ENV, Offer};
use crate::plugin::Plugin;
use crate::runtime::{Client, ClientOptions, PluginOption};

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
