//! The pinned wheels of xtask's own provisioning (the PJRT plugins, NVRTC, the CUDA toolkit),
//! fetched and checked by `distribute-launch`'s wheel code ([`distribute_launch::wheel`]), the
//! one copy of it: this module only says where xtask keeps a wheel put by hand.

use std::path::{Path, PathBuf};

use anyhow::Result;
use distribute_launch::pins::Pin;
pub(crate) use distribute_launch::wheel::{extract, extract_tree, require_platform, sha256_file};

/// Where a wheel put by hand is looked for, below the workspace root.
pub(crate) const DROP_DIR: &str = "target/wheels";

/// Returns the checked wheel of `pin` for the command `what` (`fetch-pjrt`, …): the one in
/// [`DROP_DIR`] if it is there with the pinned sum, else a fresh download into `scratch`.
pub(crate) fn download(root: &Path, pin: &Pin, scratch: &Path, what: &str) -> Result<PathBuf> {
    Ok(distribute_launch::wheel::download(
        &root.join(DROP_DIR),
        pin,
        scratch,
        what,
        "xtask",
    )?)
}

/// Fails unless `path` has SHA-256 `expected`.
pub(crate) fn check_sha256(path: &Path, expected: &str, what: &str) -> Result<()> {
    distribute_launch::wheel::check_sha256(path, expected)
        .map_err(|err| anyhow::anyhow!("{what}: {err}"))
}
