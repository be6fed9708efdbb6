//! What a plugin offers this process: its platform and how many devices a client may have,
//! learned once per plugin and process ([`Plugin::offer`](crate::Plugin::offer)), so that a
//! caller asking for more is refused before a client is created (the CUDA plugin's client takes
//! most of the GPU's memory as it starts), and a test that needs more devices can say so and skip.
//!
//! [`DEVICES_ENV`] caps the count, as `CUDA_VISIBLE_DEVICES` does for CUDA. On the CPU plugin,
//! whose device count is a client option, it makes the plugin one of exactly that many devices:
//! that is how a one-GPU machine's count is tried on a machine without a GPU.

/// The environment variable that caps how many of a plugin's devices this process may use (a
/// count of at least 1). Unset or empty: every device the plugin has (on the CPU plugin, as
/// many as asked for).
pub const DEVICES_ENV: &str = "DISTRIBUTE_PJRT_DEVICES";

/// The platform name of the CPU plugin, the one plugin whose device count is a client option.
pub const CPU_PLATFORM: &str = "cpu";

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
}
