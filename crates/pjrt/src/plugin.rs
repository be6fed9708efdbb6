//! Finding and loading a PJRT plugin: `PJRT_PLUGIN` (a path to a plugin .so) wins, else the
//! pinned CPU plugin that `cargo xtask fetch-pjrt` installs under the workspace's `target/pjrt/`.
//! A missing plugin is an error that says how to get one; nothing here skips silently.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::api::Api;
use crate::error::{PjrtError, Result};
use crate::offer::Offer;

/// The environment variable naming a plugin .so to use instead of the pinned one.
pub const PLUGIN_ENV: &str = "PJRT_PLUGIN";

/// The pinned plugin's path below the workspace root. `xtask/src/pjrt.rs` installs it there; an
/// xtask test checks that both files spell it the same way.
pub const PINNED_PLUGIN_RELATIVE_PATH: &str =
    "target/pjrt/lammps-jax-pjrt-cpu-0.11.2/pjrt_c_api_cpu_plugin.so";

/// A loaded PJRT plugin. Loaded once per path per process and never unloaded: XLA plugins start
/// threads and register global state that `dlclose` would pull from under them.
pub struct Plugin {
    pub(crate) api: Api,
    /// What it offers this process, once asked ([`Plugin::offer`]).
    pub(crate) offer: OnceLock<Offer>,
    /// Held while [`Plugin::offer`] asks, so that it asks once.
    pub(crate) probing: Mutex<()>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.api.path)
            .field("version", &self.version())
            .finish()
    }
}

impl Plugin {
    /// Finds the plugin to use (see the module doc) and loads it.
    pub fn discover() -> Result<&'static Plugin> {
        let env = std::env::var_os(PLUGIN_ENV).map(PathBuf::from);
        let path = plugin_path(env.as_deref(), &pinned_plugin_path())?;
        Plugin::load(&path)
    }

    /// Loads the plugin at `path` (once per process; later calls return the same plugin), checks
    /// its API version and initializes it.
    pub fn load(path: &Path) -> Result<&'static Plugin> {
        static LOADED: OnceLock<Mutex<HashMap<PathBuf, &'static Plugin>>> = OnceLock::new();
        let key = path
            .canonicalize()
            .map_err(|err| PjrtError::PluginNotFound {
                detail: format!("{}: {err}", path.display()),
            })?;
        let mut loaded = LOADED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(plugin) = loaded.get(&key) {
            return Ok(plugin);
        }
        // SAFETY: the map guarantees one load and one initialization per file; that the file is
        // a PJRT plugin is the user's claim (PJRT_PLUGIN) or xtask's checksum-verified install.
        let api = unsafe { Api::load(&key) }?;
        let plugin: &'static Plugin = Box::leak(Box::new(Plugin {
            api,
            offer: OnceLock::new(),
            probing: Mutex::new(()),
        }));
        loaded.insert(key, plugin);
        Ok(plugin)
    }

    /// The PJRT C API version the plugin was built with, `(major, minor)`.
    pub fn version(&self) -> (i32, i32) {
        (self.api.major, self.api.minor)
    }

    /// The file the plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.api.path
    }
}

/// Where `cargo xtask fetch-pjrt` puts the pinned plugin, for this source tree.
pub fn pinned_plugin_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(PINNED_PLUGIN_RELATIVE_PATH)
}

/// The discovery rule without the environment: an explicit (`PJRT_PLUGIN`) path must exist; else
/// the pinned path must.
fn plugin_path(env: Option<&Path>, pinned: &Path) -> Result<PathBuf> {
    match env {
        Some(path) if !path.as_os_str().is_empty() => {
            if path.is_file() {
                Ok(path.to_owned())
            } else {
                Err(PjrtError::PluginNotFound {
                    detail: format!("{PLUGIN_ENV}={} is not a file", path.display()),
                })
            }
        }
        _ if pinned.is_file() => Ok(pinned.to_owned()),
        _ => Err(PjrtError::PluginNotFound {
            detail: format!(
                "{PLUGIN_ENV} is not set and the pinned plugin {} is not installed",
                pinned.display()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_plugin_says_how_to_get_one() {
        let nowhere = Path::new("/nonexistent/pjrt/plugin.so");
        for env in [None, Some(Path::new(""))] {
            let err = plugin_path(env, nowhere).unwrap_err().to_string();
            assert!(err.contains("PJRT_PLUGIN is not set"), "{err}");
            assert!(err.contains("/nonexistent/pjrt/plugin.so"), "{err}");
            assert!(err.contains("cargo xtask fetch-pjrt"), "{err}");
        }
        let err = plugin_path(Some(Path::new("/no/such.so")), nowhere)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("PJRT_PLUGIN=/no/such.so is not a file"),
            "{err}"
        );
        assert!(err.contains("cargo xtask fetch-pjrt"), "{err}");
    }

    #[test]
    fn the_environment_wins_over_the_pinned_plugin() {
        let this_file = Path::new(file!())
            .canonicalize()
            .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("src/plugin.rs"));
        let chosen = plugin_path(Some(&this_file), Path::new("/nonexistent")).unwrap();
        assert_eq!(chosen, this_file);
        let chosen = plugin_path(None, &this_file).unwrap();
        assert_eq!(chosen, this_file);
    }

    #[test]
    fn a_file_that_is_not_a_plugin_is_refused_by_name() {
        let not_a_plugin = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let err = Plugin::load(&not_a_plugin).unwrap_err();
        assert!(
            matches!(err, PjrtError::Load { .. }),
            "a text file cannot be dlopened: {err}"
        );
        assert!(err.to_string().contains("Cargo.toml"), "{err}");
    }
}
