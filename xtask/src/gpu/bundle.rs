//! `cargo xtask test-gpu --build-only DIR`: the GPU suites built into a folder, stripped, with
//! `run.sh` (the file beside this one), which runs them on a machine that has no Rust.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use super::libs::{CUDA_TOOLKIT_DIRS, SYSTEM_NCCL_DIRS, SYSTEM_NVRTC_DIRS};
use super::suites::{Kind, Needs, SUITES, Suite};
use crate::{cargo_program, nvrtc};

/// Builds every suite into `dir` under its stable name, stripped, with `run.sh`.
pub(super) fn build_only(root: &Path, dir: &Path) -> Result<()> {
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
    for suite in SUITES {
        let built = build_executable(root, suite)?;
        let copy = dir.join(suite.name);
        if copy.symlink_metadata().is_ok() {
            fs::remove_file(&copy)
                .with_context(|| format!("could not remove {}", copy.display()))?;
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
        let size = fs::metadata(&copy)?.len();
        total += size;
        eprintln!(
            "xtask: test-gpu: {} ({:.1} MiB) <- {}",
            copy.display(),
            mib(size),
            built.display()
        );
    }
    let script = dir.join("run.sh");
    fs::write(&script, run_script())
        .with_context(|| format!("could not write {}", script.display()))?;
    set_executable(&script)?;
    total += fs::metadata(&script)?.len();
    eprintln!(
        "xtask: test-gpu: {} holds {} suites and run.sh, {:.1} MiB in all; on a machine with an \
         NVIDIA GPU run `{}/run.sh [SUITE...]`",
        dir.display(),
        SUITES.len(),
        mib(total),
        dir.display()
    );
    if total >= 64 << 20 {
        eprintln!("xtask: test-gpu: WARNING: over 64 MiB, more than a device run can carry");
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
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
    let output = Command::new(&cargo)
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
    let kind = match suite.kind {
        Kind::Test => "test",
        Kind::Bench => "bench",
    };
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

/// `run.sh` for a `--build-only` folder: bash with no Rust needed. It finds NCCL and NVRTC as
/// `test-gpu` does, runs every suite (or those named), prints PASS/FAIL/SKIP per suite and
/// exits 1 when one failed.
fn run_script() -> String {
    let names: Vec<&str> = SUITES.iter().map(|suite| suite.name).collect();
    let mut suites = String::new();
    for suite in SUITES {
        let needs = match suite.needs {
            Needs::Nvrtc => "nvrtc",
            Needs::Gpu => "gpu",
            Needs::Nccl => "nccl",
        };
        writeln!(
            suites,
            "run_suite {} {needs} {}",
            suite.name,
            suite.run_args().join(" ")
        )
        .expect("writing to a String cannot fail");
    }
    RUN_SCRIPT
        .replace("@SUITE_NAMES@", &names.join(" "))
        .replace("@NCCL_DIRS@", &SYSTEM_NCCL_DIRS.join(" "))
        .replace("@CUDA_TOOLKIT_DIRS@", &CUDA_TOOLKIT_DIRS.join(" "))
        .replace("@NVRTC_DIRS@", &SYSTEM_NVRTC_DIRS.join(" "))
        .replace("@NCCL_REQUIREMENT@", "nvidia-nccl-cu13")
        .replace("@NVRTC_REQUIREMENT@", nvrtc::REQUIREMENT)
        .replace("@SUITES@", &suites)
}

/// The script, with `@NAME@` placeholders that [`run_script`] fills in.
const RUN_SCRIPT: &str = include_str!("run.sh");

#[cfg(test)]
mod tests {
    use super::super::suites::suite;
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
        let err = executable_from_messages(MESSAGES, suite("collectives-nccl")).unwrap_err();
        assert!(
            err.to_string()
                .contains("no test executable 'nccl' of distribute-collectives"),
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
    fn run_sh_runs_every_suite_with_its_arguments() {
        let script = run_script();
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
        let placeholder = script
            .as_bytes()
            .windows(2)
            .any(|pair| pair[0] == b'@' && pair[1].is_ascii_uppercase());
        assert!(!placeholder, "a placeholder is left:\n{script}");
        for suite in SUITES {
            let line = format!("\nrun_suite {} ", suite.name);
            assert!(script.contains(&line), "no `{line}` in:\n{script}");
        }
        assert!(script.contains("run_suite collectives-nccl nccl --test-threads=1\n"));
        assert!(script.contains("run_suite bench-gpu gpu --bench\n"));
        assert!(script.contains("ln -s \"$nccl_dir/libnccl.so.2\" \"$libs/libnccl.so\""));
        assert!(script.contains("export DISTRIBUTE_REQUIRE_GPU=1 DISTRIBUTE_REQUIRE_NVRTC=1"));
    }
}
