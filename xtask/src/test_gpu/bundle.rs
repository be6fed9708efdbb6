//! `cargo xtask test-gpu --build-only DIR [SUITE...]`: the GPU suites built into a folder,
//! stripped, with `run.sh` (the file beside this one, copied as it is) and `suites.txt` (what to
//! run and how), so that they run on a machine that has no Rust. The bundle's dry run on this
//! machine is [`super::dry_run()`]'s.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use super::suites::{Needs, SUITES, Suite};
use crate::cargo::cargo_program;

/// `run.sh`, which reads the suites to run from [`SUITE_LIST`] beside it.
const RUN_SCRIPT: &str = include_str!("run.sh");
/// The file in a bundle that lists its suites for `run.sh`.
const SUITE_LIST: &str = "suites.txt";
/// The most a device run carries back and forth.
pub(super) const BUNDLE_LIMIT: u64 = 64 << 20;
/// Executables larger than this go into the bundle xz-compressed (`NAME.xz`, which `run.sh`
/// unpacks): candle's CUDA suite is 52 MiB stripped, 33 MiB of it the GPU code of its kernels.
const COMPRESS_OVER: u64 = 16 << 20;
/// The variable that gives `run.sh` the folders of the libraries a `cuda-linked` suite links (on
/// the GPU machine it finds them in NVIDIA's wheels itself).
pub(super) const LINKED_LIBS_ENV: &str = "DISTRIBUTE_CUDA_LINKED_LIBS";
/// Builds the suites named in `names` (every suite when empty) into `dir` under their stable
/// names, stripped, with `run.sh` and its suite list.
pub(super) fn build_only(root: &Path, dir: &Path, names: &[String]) -> Result<()> {
    let suites = selected(names)?;
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
    let mut total = 0;
    for suite in &suites {
        let built = build_executable(root, suite)?;
        let copy = dir.join(suite.name);
        let compressed = dir.join(format!("{}.xz", suite.name));
        for stale in [&copy, &compressed] {
            if stale.symlink_metadata().is_ok() {
                fs::remove_file(stale)
                    .with_context(|| format!("could not remove {}", stale.display()))?;
            }
        }
        fs::copy(&built, &copy)
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
        total += size;
        eprintln!(
            "xtask: test-gpu: {} ({:.1} MiB) <- {}",
            shipped.display(),
            mib(size),
            built.display()
        );
    }
    let script = dir.join("run.sh");
    fs::write(&script, RUN_SCRIPT)
        .with_context(|| format!("could not write {}", script.display()))?;
    set_executable(&script)?;
    let list = dir.join(SUITE_LIST);
    fs::write(&list, suite_list(&suites))
        .with_context(|| format!("could not write {}", list.display()))?;
    total += fs::metadata(&script)?.len() + fs::metadata(&list)?.len();
    eprintln!(
        "xtask: test-gpu: {} holds {} suites, run.sh and {SUITE_LIST}, {:.1} MiB in all; on a \
         machine with an NVIDIA GPU run `{}/run.sh [SUITE...]`",
        dir.display(),
        suites.len(),
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

/// The suites `names` names, in table order; every suite when `names` is empty.
fn selected(names: &[String]) -> Result<Vec<&'static Suite>> {
    if let Some(unknown) = names
        .iter()
        .find(|name| !SUITES.iter().any(|suite| suite.name == name.as_str()))
    {
        let known: Vec<&str> = SUITES.iter().map(|suite| suite.name).collect();
        bail!("unknown GPU suite '{unknown}'; suites: {}", known.join(" "));
    }
    Ok(SUITES
        .iter()
        .filter(|suite| names.is_empty() || names.iter().any(|name| name == suite.name))
        .collect())
}

pub(super) fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("could not make {} executable", path.display()))
}

/// Builds one suite with `cargo … --no-run` and returns its executable.
fn build_executable(root: &Path, suite: &Suite) -> Result<PathBuf> {
    let args = suite.cargo_args(true);
    let cargo = cargo_program();
    eprintln!(
        "xtask: test-gpu: build {}: cargo {}",
        suite.name,
        args.join(" ")
    );
    let mut command = Command::new(&cargo);
    if suite.needs == Needs::CudaLinked {
        command.envs(crate::provision::cuda_toolkit::fetch(root)?.build_env(false)?);
    }
    let output = command
        .args(&args)
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{cargo}`"))?;
    if !output.status.success() {
        bail!(
            "building GPU suite {} failed: `cargo {}` exited with {}",
            suite.name,
            args.join(" "),
            output.status
        );
    }
    executable_from_messages(&String::from_utf8_lossy(&output.stdout), suite)
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

/// The suite list `run.sh` reads: one line per suite, `NAME NEEDS ARG...`, in run order.
fn suite_list(suites: &[&Suite]) -> String {
    let mut list = String::new();
    for suite in suites {
        let mut line = format!("{} {}", suite.name, suite.needs.word());
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
        let list = suite_list(&selected(&[]).unwrap());
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
        ] {
            assert!(list.lines().any(|l| l == line), "no `{line}` in:\n{list}");
        }
        let names = ["bench-tpu".to_owned(), "pjrt-plugin".to_owned()];
        let chosen: Vec<&str> = selected(&names).unwrap().iter().map(|s| s.name).collect();
        assert_eq!(chosen, ["pjrt-plugin", "bench-tpu"]);
        let err = selected(&["nonsense".to_owned()]).unwrap_err().to_string();
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
