//! What the machine has without fetching anything: the system's Open MPI (`mpirun` and
//! `mpicc` on `PATH`) and its version, the libclang bindgen would load, the C compiler's
//! headers, and whether this process runs as root.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// The system's Open MPI, as found on `PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SystemMpi {
    pub(crate) mpirun: PathBuf,
    /// E.g. `Open MPI 4.1.4`.
    pub(crate) version: String,
}

/// What the machine has without fetching anything.
#[derive(Debug)]
pub(crate) struct System {
    /// Open MPI, or why it is not usable.
    pub(crate) mpi: Result<SystemMpi, String>,
    /// The libclang library bindgen would load, or why there is none.
    pub(crate) libclang: Result<PathBuf, String>,
}

/// The folder of the C compiler's own headers (`stddef.h`): `$CC` or `cc`, asked with
/// `-print-file-name=include` (gcc) or `-print-resource-dir` (clang).
pub(crate) fn compiler_headers() -> Result<PathBuf> {
    let cc = std::env::var_os("CC").unwrap_or_else(|| OsString::from("cc"));
    for (arg, suffix) in [
        ("-print-file-name=include", ""),
        ("-print-resource-dir", "include"),
    ] {
        let Ok(output) = Command::new(&cc).arg(arg).output() else {
            continue;
        };
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join(suffix);
        if output.status.success() && dir.join("stddef.h").is_file() {
            return Ok(dir);
        }
    }
    Err(Error::Unavailable(format!(
        "the `mpi` feature needs a C compiler (`{}`, or $CC; Rust's linker needs one too) whose \
         headers have stddef.h, for the mpi crate's build with the libclang wheel: install \
         gcc or clang",
        cc.to_string_lossy()
    )))
}

/// `Open MPI X.Y.Z` from what `mpirun --version` printed (`mpirun (Open MPI) 4.1.4`), or `None`
/// for another MPI.
pub(crate) fn open_mpi_version(output: &str) -> Option<String> {
    let line = output.lines().next()?;
    let (_, after) = line.split_once("(Open MPI)")?;
    let version = after.trim();
    (!version.is_empty()).then(|| format!("Open MPI {version}"))
}

/// The system's Open MPI on `path`, or why it is not usable.
pub(crate) fn probe_system_mpi(path: Option<&OsStr>) -> Result<SystemMpi, String> {
    let mpirun = find_on_path("mpirun", path)
        .ok_or("no `mpirun` on PATH (Open MPI; Debian/Ubuntu package openmpi-bin)")?;
    let output = Command::new(&mpirun)
        .arg("--version")
        .output()
        .map_err(|err| format!("`{}` does not start ({err})", mpirun.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let version = open_mpi_version(&stdout).ok_or_else(|| {
        format!(
            "`{}` is not Open MPI's (`--version`: {}); the tests and launchers need Open MPI",
            mpirun.display(),
            stdout.lines().next().unwrap_or("nothing")
        )
    })?;
    let mpicc_runs = find_on_path("mpicc", path).is_some_and(|mpicc| {
        Command::new(mpicc)
            .arg("--showme:version")
            .output()
            .is_ok_and(|output| output.status.success())
    });
    if !mpicc_runs {
        return Err(
            "no `mpicc` with the MPI headers (Debian/Ubuntu package libopenmpi-dev)".to_owned(),
        );
    }
    Ok(SystemMpi { mpirun, version })
}

/// The first executable file `name` in the folders of `path`.
fn find_on_path(name: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

/// The libclang library bindgen (clang-sys) would find: in `LIBCLANG_PATH`, LLVM's folders or
/// the system library folders.
pub(crate) fn find_libclang() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LIBCLANG_PATH")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    for parent in ["/usr/lib", "/usr/local/lib", "/usr/lib64"] {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        dirs.push(PathBuf::from(parent));
        let mut more: Vec<PathBuf> = entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("llvm") {
                    Some(entry.path().join("lib"))
                } else if name.ends_with("-linux-gnu") {
                    Some(entry.path())
                } else {
                    None
                }
            })
            .collect();
        // Newest LLVM first, as clang-sys prefers it.
        more.sort();
        more.reverse();
        dirs.extend(more);
    }
    dirs.iter().find_map(|dir| libclang_in(dir))
}

/// The libclang library in `dir` (not libclang-cpp), if any.
fn libclang_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libclang")
                && !name.starts_with("libclang-cpp")
                && name.contains(".so")
        })
        .map(|entry| entry.path())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Whether this process runs as root (user id 0).
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|id| id == "0"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_open_mpi_has_a_version() {
        assert_eq!(
            open_mpi_version("mpirun (Open MPI) 4.1.4\n\nReport bugs to ...").as_deref(),
            Some("Open MPI 4.1.4")
        );
        assert_eq!(
            open_mpi_version("mpirun (Open MPI) 5.0.11\n").as_deref(),
            Some("Open MPI 5.0.11")
        );
        assert_eq!(
            open_mpi_version("HYDRA build details:\n    Version: 4.2.0"),
            None
        );
        assert_eq!(open_mpi_version(""), None);
    }
}
