//! Pinned PyPI wheels as a source of native libraries: `pip download --no-deps` one wheel into a
//! scratch folder, check its SHA-256 against a pinned sum, unzip the members that are needed.
//! Shared by `fetch-pjrt` ([`crate::pjrt`]) and `fetch-nvrtc` ([`crate::nvrtc`]).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

/// Runs `python3 -m pip download --no-deps --only-binary :all: EXTRA... --dest SCRATCH
/// REQUIREMENT` for the command `what` (`fetch-pjrt`, …) and returns the one wheel it saved.
/// `hint` ends the error when pip ran but could not get the wheel.
pub(crate) fn pip_download(
    what: &str,
    requirement: &str,
    extra: &[&str],
    scratch: &Path,
    hint: &str,
) -> Result<PathBuf> {
    require_pip(what)?;
    eprintln!(
        "xtask: {what}: python3 -m pip download --no-deps {}{requirement}",
        extra
            .iter()
            .map(|arg| format!("{arg} "))
            .collect::<String>()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(["--only-binary", ":all:"])
        .args(extra)
        .arg("--dest")
        .arg(scratch)
        .arg(requirement)
        .status()
        .context("could not run `python3 -m pip`")?;
    if !status.success() {
        bail!("`pip download {requirement}` failed ({status}); {hint}");
    }
    single_wheel(scratch)
}

/// Fails with a message that says what to install when `python3 -m pip` does not run.
fn require_pip(what: &str) -> Result<()> {
    let probe = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match probe {
        Ok(status) if status.success() => Ok(()),
        Ok(_) => bail!(
            "{what} needs pip, but `python3 -m pip` does not run: install it (Debian/Ubuntu: \
             `apt-get install python3-pip`; or `python3 -m ensurepip`)"
        ),
        Err(err) => bail!(
            "{what} needs Python 3 with pip, but `python3` could not be started ({err}): install \
             Python 3 and pip (Debian/Ubuntu: `apt-get install python3-pip`)"
        ),
    }
}

/// Unzips `members` of `wheel` into `destination` (each keeps its path inside the wheel).
pub(crate) fn extract(wheel: &Path, members: &[&str], destination: &Path) -> Result<()> {
    let status = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\n\
             wheel = zipfile.ZipFile(sys.argv[1])\n\
             for member in sys.argv[3:]:\n    wheel.extract(member, sys.argv[2])",
        ])
        .arg(wheel)
        .arg(destination)
        .args(members)
        .status()
        .context("could not run python3 to unzip the wheel")?;
    if !status.success() {
        bail!(
            "could not extract {members:?} from {} ({status})",
            wheel.display()
        );
    }
    Ok(())
}

fn single_wheel(folder: &Path) -> Result<PathBuf> {
    let wheels: Vec<PathBuf> = fs::read_dir(folder)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    match wheels.as_slice() {
        [wheel] => Ok(wheel.clone()),
        _ => bail!(
            "expected one wheel in {}, found {wheels:?}",
            folder.display()
        ),
    }
}

/// Fails unless `path` has SHA-256 `expected`; the error tells to rerun `cargo xtask {what}`.
pub(crate) fn check_sha256(path: &Path, expected: &str, what: &str) -> Result<()> {
    let actual = sha256_file(path)?;
    if actual != expected {
        bail!(
            "{} has SHA-256 {actual}, expected the pinned {expected}; the download is corrupt or \
             was replaced: delete it and run `cargo xtask {what}` again",
            path.display()
        );
    }
    Ok(())
}

/// The SHA-256 of a file's contents, in lowercase hex.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        fs::File::open(path).with_context(|| format!("could not open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let read = file
            .read(&mut chunk)
            .with_context(|| format!("could not read {}", path.display()))?;
        if read == 0 {
            break;
        }
        hasher.update(&chunk[..read]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_a_known_digest() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("abc");
        fs::write(&file, b"abc").unwrap();
        assert_eq!(
            sha256_file(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let err = check_sha256(&file, "00", "fetch-nvrtc").unwrap_err();
        assert!(
            format!("{err:#}").contains("run `cargo xtask fetch-nvrtc` again"),
            "{err:#}"
        );
        let err = check_sha256(Path::new("/nonexistent"), "00", "fetch-pjrt").unwrap_err();
        assert!(format!("{err:#}").contains("could not open"), "{err:#}");
    }

    #[test]
    fn one_wheel_or_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(single_wheel(dir.path()).is_err());
        fs::write(dir.path().join("a-1.0-py3-none-any.whl"), b"").unwrap();
        fs::write(dir.path().join("notes.txt"), b"").unwrap();
        assert_eq!(
            single_wheel(dir.path()).unwrap(),
            dir.path().join("a-1.0-py3-none-any.whl")
        );
        fs::write(dir.path().join("b-1.0-py3-none-any.whl"), b"").unwrap();
        assert!(single_wheel(dir.path()).is_err());
    }
}
