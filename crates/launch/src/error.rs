//! The launcher's one error type.

use std::path::PathBuf;

/// What went wrong while finding or fetching MPI, building or running a job.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder could not be read, written or created.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A pinned wheel could not be downloaded by any of the programs tried.
    #[error(
        "{what}: could not download {url} ({failures}). Check that files.pythonhosted.org is \
         reachable (curl and wget honour HTTPS_PROXY), install curl if neither program runs, or \
         download the file by other means to {} and run again", dropped.display()
    )]
    Download {
        /// What needed the wheel.
        what: String,
        /// The pinned URL.
        url: String,
        /// Why each program failed.
        failures: String,
        /// Where a wheel fetched by hand is taken from.
        dropped: PathBuf,
    },
    /// A file does not have its pinned SHA-256.
    #[error(
        "{} has SHA-256 {actual}, expected the pinned {expected}; the download is corrupt or was \
         replaced: delete it and run again", path.display()
    )]
    Checksum {
        /// The file.
        path: PathBuf,
        /// Its SHA-256.
        actual: String,
        /// The pinned one.
        expected: String,
    },
    /// A wheel is not the zip file it should be, or lacks a file it should have.
    #[error("{0}")]
    Wheel(String),
    /// `DISTRIBUTE_MPI` has a value that names no choice.
    #[error("DISTRIBUTE_MPI='{0}' is not one of auto, system, wheel")]
    Choice(String),
    /// MPI or libclang cannot be had here; the message says what to install or set.
    #[error("{0}")]
    Unavailable(String),
    /// A program (cargo, mpirun, the C compiler) could not be started or failed.
    #[error("{0}")]
    Command(String),
    /// The command line of `cargo distribute` is not understood.
    #[error("{0}\n\n{usage}", usage = crate::cli::USAGE)]
    Usage(String),
}

impl Error {
    /// An [`Error::Io`] saying what was done to which path.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

/// The launcher's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
