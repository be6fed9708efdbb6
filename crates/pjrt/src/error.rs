//! [`PjrtError`], the crate's one error type: plugin discovery and loading, the plugin's own
//! errors (with its message), and misuse caught before a call reaches the plugin.

use std::fmt;
use std::path::PathBuf;

use crate::ElementType;
use crate::offer::{Shortfall, cap_note};

/// How to get a plugin; every "no plugin" error ends with it.
pub(crate) const HOW_TO_GET_A_PLUGIN: &str = "run `cargo xtask fetch-pjrt` to install the pinned \
     CPU plugin (lammps-jax-pjrt-cpu 0.11.2) under target/pjrt/, or set PJRT_PLUGIN to the path \
     of a PJRT plugin .so (for example xla_cuda_plugin.so from the jax-cuda13-pjrt wheel)";

/// A PJRT status code (`PJRT_Error_Code`, absl's codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorCode(pub i32);

impl ErrorCode {
    /// `INVALID_ARGUMENT`: what compilers report for programs they reject.
    pub const INVALID_ARGUMENT: ErrorCode = ErrorCode(3);

    /// The code's absl name, or `code N` for one this crate does not know.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        usize::try_from(self.0)
            .ok()
            .and_then(|i| NAMES.get(i))
            .copied()
            .unwrap_or("unknown code")
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Everything that can go wrong between this crate and a PJRT plugin.
#[derive(Debug, thiserror::Error)]
pub enum PjrtError {
    /// Neither `PJRT_PLUGIN` nor the pinned plugin points at a file.
    #[error("no PJRT plugin found: {detail}; {HOW_TO_GET_A_PLUGIN}")]
    PluginNotFound {
        /// Where the crate looked.
        detail: String,
    },
    /// The dynamic loader refused the file.
    #[error(
        "could not load PJRT plugin {path}: {source}; check that it is a plugin .so built for this platform"
    )]
    Load {
        /// The file.
        path: PathBuf,
        /// The loader's reason.
        source: libloading::Error,
    },
    /// The file loaded but exports no `GetPjrtApi`.
    #[error(
        "{path} does not export GetPjrtApi, so it is not a PJRT plugin (jaxlib's own libraries are not plugins); {HOW_TO_GET_A_PLUGIN}"
    )]
    NotAPlugin {
        /// The file.
        path: PathBuf,
    },
    /// The plugin speaks a PJRT C API whose layouts this crate does not know.
    #[error(
        "PJRT plugin {path} speaks C API {major}.{minor}, but this crate speaks {expected_major}.x (struct layouts checked at {expected_major}.{checked_minor}); a different major version rearranges structs, so no call is safe. {HOW_TO_GET_A_PLUGIN}"
    )]
    VersionMismatch {
        /// The file.
        path: PathBuf,
        /// The plugin's major version.
        major: i32,
        /// The plugin's minor version.
        minor: i32,
        /// The major version this crate speaks.
        expected_major: i32,
        /// The minor version whose layouts this crate checked.
        checked_minor: i32,
    },
    /// The plugin's function table ends before a function this crate calls.
    #[error(
        "PJRT plugin {path} (C API {major}.{minor}) has {functions} functions, but this crate calls function #{needed}; use a newer plugin. {HOW_TO_GET_A_PLUGIN}"
    )]
    TableTooShort {
        /// The file.
        path: PathBuf,
        /// The plugin's major version.
        major: i32,
        /// The plugin's minor version.
        minor: i32,
        /// Functions in the plugin's table.
        functions: usize,
        /// The highest index this crate calls.
        needed: usize,
    },
    /// A PJRT call failed; `message` is the plugin's (for a compile, the compiler's) own text.
    #[error("{call} failed with {code}: {message}")]
    Api {
        /// The PJRT function, e.g. `PJRT_Client_Compile`.
        call: &'static str,
        /// The plugin's status code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// Host data or a read-back used another element type than the buffer's.
    #[error(
        "element type mismatch: the buffer holds {found:?}, the caller asked for {expected:?}; read it with the matching Rust type"
    )]
    ElementType {
        /// The type the caller used.
        expected: ElementType,
        /// The buffer's type.
        found: ElementType,
    },
    /// A client was asked for more devices than the plugin has (or may use, under
    /// `DISTRIBUTE_PJRT_DEVICES`); refused before a client is created where the plugin's offer
    /// already says so.
    #[error(
        "asked for {} devices, but the {} plugin {} has {}{}",
        shortfall.needed,
        shortfall.platform,
        path.display(),
        shortfall.has,
        cap_note(shortfall.capped, shortfall.has)
    )]
    NotEnoughDevices {
        /// The plugin's file.
        path: PathBuf,
        /// How many were asked for and how many it has.
        shortfall: Shortfall,
    },
    /// Arguments that would make an invalid call or program, caught before the plugin sees them.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl PjrtError {
    /// The plugin's status code, for [`PjrtError::Api`].
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            PjrtError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// This crate's `Result`.
pub type Result<T, E = PjrtError> = std::result::Result<T, E>;
