//! The GPU suites: the test and bench targets behind the `cuda` and `nccl` features, which the
//! workspace tests leave out (they need NVRTC, a GPU or NCCL), and the commands that run them.
//!
//! - `cargo xtask test` runs the one suite a machine without a GPU can run, [`NVRTC_SUITE`]
//!   (kernels compiled to PTX), with the NVRTC of `fetch-nvrtc` ([`test_nvrtc`]).
//! - `cargo xtask ci` also runs clippy with the GPU features on (`cuda`, then `cuda` + `nccl`;
//!   [`clippy_args`]).
//! - `cargo xtask test-gpu` runs every suite here on a machine with an NVIDIA GPU, or with
//!   `--build-only DIR` builds them into `DIR` with a `run.sh` that runs them on another
//!   machine that has no Rust ([`command`]).
//!
//! cudarc loads CUDA, NVRTC and NCCL at run time. It looks for `libnccl.so` and
//! `libnccl.so.<CUDA major>` but never `libnccl.so.2`, the only name the PyPI NCCL wheels ship,
//! so both runners put a folder with a `libnccl.so -> …/libnccl.so.2` symlink on
//! `LD_LIBRARY_PATH` (see `../shared/notes/cuda-nccl.md`). The tests skip what is missing
//! unless `DISTRIBUTE_REQUIRE_{NVRTC,GPU,NCCL}=1`, which the runners set.

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;

use crate::{cargo_env, cargo_program, nvrtc, workspace_root};

/// What a suite needs besides a build with its feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Needs {
    /// NVRTC only: runs on a machine without a GPU.
    Nvrtc,
    /// A GPU with its driver (and NVRTC).
    Gpu,
    /// A GPU and NCCL.
    Nccl,
}

/// The kind of cargo target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integration test (`tests/NAME.rs`), run with `--test-threads=1`.
    Test,
    /// A `harness = false` bench (`benches/NAME.rs`) that prints JSON lines, run with `--bench`.
    Bench,
}

/// One GPU suite: a test or bench target of a package, built with one feature.
#[derive(Debug)]
pub(crate) struct Suite {
    /// The stable name: of the executable in a `--build-only` folder, and in summaries.
    pub(crate) name: &'static str,
    pub(crate) package: &'static str,
    pub(crate) kind: Kind,
    /// The cargo target name (`--test NAME` / `--bench NAME`).
    pub(crate) target: &'static str,
    /// The package feature the target requires (`required-features`).
    pub(crate) feature: &'static str,
    pub(crate) needs: Needs,
}

/// Every GPU suite, in the order they run. The one table to edit when targets change.
pub(crate) const SUITES: &[Suite] = &[
    Suite {
        name: "collectives-nvrtc",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "nvrtc",
        feature: "cuda",
        needs: Needs::Nvrtc,
    },
    Suite {
        name: "collectives-gpu",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "gpu",
        feature: "cuda",
        needs: Needs::Gpu,
    },
    Suite {
        name: "collectives-nccl",
        package: "distribute-collectives",
        kind: Kind::Test,
        target: "nccl",
        feature: "nccl",
        needs: Needs::Nccl,
    },
    Suite {
        name: "mirrored-gpu",
        package: "distribute-mirrored",
        kind: Kind::Test,
        target: "gpu",
        feature: "cuda",
        needs: Needs::Gpu,
    },
    Suite {
        name: "bench-gpu",
        package: "distribute-collectives",
        kind: Kind::Bench,
        target: "gpu",
        feature: "cuda",
        needs: Needs::Gpu,
    },
];

/// The suite `cargo xtask test` runs on every machine.
pub(crate) const NVRTC_SUITE: &str = "collectives-nvrtc";

/// The packages that have the `cuda` and `nccl` features; `cargo xtask ci` lints them with both.
pub(crate) const FEATURE_PACKAGES: &[&str] = &[
    "distribute-collectives",
    "distribute-mirrored",
    "distribute",
];

/// Folders where a system install puts `libnccl.so.2`, searched after the Python wheels.
const SYSTEM_NCCL_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/local/cuda/lib64",
    "/usr/local/nccl/lib",
    "/usr/local/lib",
];
/// Folders where a CUDA toolkit puts `libnvrtc.so.<major>`, searched before the Python wheels.
const CUDA_TOOLKIT_DIRS: &[&str] = &["/usr/local/cuda/lib64"];
/// Folders where a distribution's packages put NVRTC, searched after the Python wheels.
const SYSTEM_NVRTC_DIRS: &[&str] = &["/usr/lib/x86_64-linux-gnu", "/usr/lib64"];
/// The NCCL library the wheels and system packages ship.
const NCCL_LIBRARY: &str = "libnccl.so.2";

impl Suite {
    /// `FEATURE` qualified by the package, which cargo accepts with one `-p` or several.
    fn feature_flag(&self) -> String {
        format!("{}/{}", self.package, self.feature)
    }

    /// `cargo ARGS` that builds (`no_run`) or runs this suite. Extra arguments for the
    /// executable come after `--`.
    fn cargo_args(&self, no_run: bool) -> Vec<String> {
        let (subcommand, target_flag) = match self.kind {
            Kind::Test => ("test", "--test"),
            Kind::Bench => ("bench", "--bench"),
        };
        let mut args = vec![subcommand.to_owned()];
        if no_run {
            args.extend(["--no-run", "--message-format=json-render-diagnostics"].map(String::from));
        }
        args.extend([
            "--package".to_owned(),
            self.package.to_owned(),
            "--features".to_owned(),
            self.feature_flag(),
            target_flag.to_owned(),
            self.target.to_owned(),
        ]);
        args
    }

    /// What the executable is run with.
    fn run_args(&self) -> &'static [&'static str] {
        match self.kind {
            Kind::Test => &["--test-threads=1"],
            Kind::Bench => &["--bench"],
        }
    }
}

fn suite(name: &str) -> &'static Suite {
    SUITES
        .iter()
        .find(|suite| suite.name == name)
        .unwrap_or_else(|| panic!("no GPU suite named {name}"))
}

/// `cargo clippy` arguments that lint every target of [`FEATURE_PACKAGES`] with `features` (such
/// as `cuda`, or `cuda` and `nccl`) on, warnings denied. CI lints both sets: code gated on one
/// feature alone can warn where the pair does not.
pub(crate) fn clippy_args(features: &[&str]) -> Vec<String> {
    let mut args = vec!["clippy".to_owned(), "--all-targets".to_owned()];
    for package in FEATURE_PACKAGES {
        args.extend(["--package".to_owned(), (*package).to_owned()]);
    }
    let features: Vec<String> = FEATURE_PACKAGES
        .iter()
        .flat_map(|package| features.iter().map(move |f| format!("{package}/{f}")))
        .collect();
    args.extend([
        "--features".to_owned(),
        features.join(","),
        "--".to_owned(),
        "-D".to_owned(),
        "warnings".to_owned(),
    ]);
    args
}

/// Runs [`NVRTC_SUITE`] with the pinned NVRTC of `fetch-nvrtc` and `DISTRIBUTE_REQUIRE_NVRTC=1`:
/// the CUDA kernels must compile on every machine, GPU or not. `extra` goes to the test binary.
pub(crate) fn test_nvrtc(root: &Path, extra: &[String]) -> Result<()> {
    let nvrtc_dir = nvrtc::fetch(root)?;
    let suite = suite(NVRTC_SUITE);
    let ld_library_path = ld_library_path(&[nvrtc_dir], std::env::var_os("LD_LIBRARY_PATH"))?;
    let mut args = suite.cargo_args(false);
    if !extra.is_empty() {
        args.push("--".to_owned());
        args.extend(extra.iter().cloned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cargo_env(
        &format!("GPU suite {} (NVRTC only)", suite.name),
        &args,
        &[
            ("LD_LIBRARY_PATH", &ld_library_path),
            ("DISTRIBUTE_REQUIRE_NVRTC", OsStr::new("1")),
        ],
    )
}

/// `cargo xtask test-gpu [--build-only DIR]`.
pub(crate) fn command(args: &[String]) -> Result<()> {
    let root = workspace_root();
    match args {
        [] => run_here(&root),
        [flag, dir] if flag == "--build-only" => build_only(&root, Path::new(dir)),
        [flag] if flag.starts_with("--build-only=") => {
            build_only(&root, Path::new(&flag["--build-only=".len()..]))
        }
        _ => bail!("usage: cargo xtask test-gpu [--build-only DIR] (got {args:?})"),
    }
}

/// How a suite ended in `test-gpu`.
enum Outcome {
    Passed,
    Failed(String),
    Skipped(&'static str),
}

/// Runs every suite here, on this machine's GPU.
fn run_here(root: &Path) -> Result<()> {
    let Some(evidence) = detect_gpu() else {
        bail!(
            "no NVIDIA GPU found (`nvidia-smi -L` lists none, there is no /dev/nvidia0, and \
             libcuda.so.1 does not load); use `cargo xtask test-gpu --build-only DIR` to build \
             the GPU suites with a run.sh for another machine"
        );
    };
    eprintln!("xtask: test-gpu: GPU: {evidence}");
    let site_dirs = python_site_dirs();
    let wheel_dirs = wheel_lib_dirs(&site_dirs);

    let env_nccl_dir = std::env::var_os("NCCL_LIB_DIR").map(PathBuf::from);
    let nccl_dir = find_nccl(env_nccl_dir.as_deref(), &wheel_dirs, SYSTEM_NCCL_DIRS)?;
    let gpu_libs = root.join("target/gpu-libs");
    if gpu_libs.exists() {
        fs::remove_dir_all(&gpu_libs)
            .with_context(|| format!("could not remove {}", gpu_libs.display()))?;
    }
    fs::create_dir_all(&gpu_libs)
        .with_context(|| format!("could not create {}", gpu_libs.display()))?;
    match &nccl_dir {
        Some(dir) => {
            let library = dir.join(NCCL_LIBRARY);
            link_nccl(&gpu_libs, &library)?;
            eprintln!(
                "xtask: test-gpu: NCCL: {} (linked as {}/libnccl.so)",
                library.display(),
                gpu_libs.display()
            );
        }
        None => eprintln!(
            "xtask: test-gpu: WARNING: no {NCCL_LIBRARY} found (NCCL_LIB_DIR, the \
             nvidia-nccl-cu13/-cu12 wheels of python3, {}): the NCCL suites are SKIPPED; \
             `python3 -m pip install nvidia-nccl-cu13` or set NCCL_LIB_DIR",
            SYSTEM_NCCL_DIRS.join(", ")
        ),
    }

    let nvrtc_dir = match find_nvrtc(&wheel_dirs) {
        Some(dir) => dir,
        None => nvrtc::fetch(root)?,
    };
    eprintln!("xtask: test-gpu: NVRTC: {}", nvrtc_dir.display());

    let ld_library_path = ld_library_path(
        &[gpu_libs.clone(), nvrtc_dir],
        std::env::var_os("LD_LIBRARY_PATH"),
    )?;
    let mut env: Vec<(&str, &OsStr)> = vec![
        ("LD_LIBRARY_PATH", &ld_library_path),
        ("DISTRIBUTE_REQUIRE_GPU", OsStr::new("1")),
        ("DISTRIBUTE_REQUIRE_NVRTC", OsStr::new("1")),
    ];
    if nccl_dir.is_some() {
        env.push(("DISTRIBUTE_REQUIRE_NCCL", OsStr::new("1")));
    }

    let mut outcomes = Vec::new();
    for suite in SUITES {
        if suite.needs == Needs::Nccl && nccl_dir.is_none() {
            eprintln!(
                "xtask: test-gpu: WARNING: SKIPPING {}: no {NCCL_LIBRARY}",
                suite.name
            );
            outcomes.push((suite.name, Outcome::Skipped("no NCCL")));
            continue;
        }
        let mut args = suite.cargo_args(false);
        if suite.kind == Kind::Test {
            // `cargo bench` passes `--bench` itself.
            args.push("--".to_owned());
            args.extend(suite.run_args().iter().map(|arg| (*arg).to_owned()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let outcome = match cargo_env(&format!("GPU suite {}", suite.name), &args, &env) {
            Ok(()) => Outcome::Passed,
            Err(err) => Outcome::Failed(format!("{err:#}")),
        };
        outcomes.push((suite.name, outcome));
    }

    eprintln!("xtask: test-gpu: summary");
    let mut failed = Vec::new();
    for (name, outcome) in &outcomes {
        match outcome {
            Outcome::Passed => eprintln!("  PASS  {name}"),
            Outcome::Failed(why) => {
                eprintln!("  FAIL  {name}: {why}");
                failed.push(*name);
            }
            Outcome::Skipped(why) => eprintln!("  SKIP  {name} ({why})"),
        }
    }
    if !failed.is_empty() {
        bail!("GPU suites failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Evidence of an NVIDIA GPU: `nvidia-smi -L`'s GPUs, else /dev/nvidia0, else a loadable
/// libcuda.so.1 (a container may have the driver library without nvidia-smi).
fn detect_gpu() -> Option<String> {
    if let Ok(output) = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        let listing = String::from_utf8_lossy(&output.stdout);
        let gpus: Vec<&str> = listing
            .lines()
            .filter(|line| line.starts_with("GPU "))
            .collect();
        if output.status.success() && !gpus.is_empty() {
            return Some(gpus.join("; "));
        }
    }
    if Path::new("/dev/nvidia0").exists() {
        return Some("/dev/nvidia0 exists".to_owned());
    }
    // SAFETY: loading the CUDA driver library runs only its initialisers, which have no
    // preconditions; nothing is called through it and it is unloaded at once.
    if unsafe { libloading::Library::new("libcuda.so.1") }.is_ok() {
        return Some("libcuda.so.1 loads".to_owned());
    }
    None
}

/// The folders `python3` installs packages into (site-packages, user site, `sys.path`),
/// existing ones only, in its order; none without python3.
fn python_site_dirs() -> Vec<PathBuf> {
    let output = Command::new("python3")
        .args([
            "-c",
            "import site, sys\n\
             print('\\n'.join([*site.getsitepackages(), site.getusersitepackages(), *sys.path]))",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let Ok(output) = output else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let dir = PathBuf::from(line);
        if !line.is_empty() && dir.is_dir() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// The `nvidia/*/lib` folders of NVIDIA's wheels in `site_dirs` (`nvidia/nccl/lib` of
/// nvidia-nccl-cu12, `nvidia/cu13/lib` of the CUDA 13 wheels, …), sorted within each site.
fn wheel_lib_dirs(site_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for site in site_dirs {
        let Ok(entries) = fs::read_dir(site.join("nvidia")) else {
            continue;
        };
        let mut libs: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path().join("lib")))
            .filter(|lib| lib.is_dir())
            .collect();
        libs.sort();
        found.extend(libs);
    }
    found
}

/// The folder with `libnccl.so.2`: `env_dir` (`NCCL_LIB_DIR`, an error when it lacks the
/// library), else the first of `wheel_dirs`, else of `system_dirs`.
fn find_nccl(
    env_dir: Option<&Path>,
    wheel_dirs: &[PathBuf],
    system_dirs: &[&str],
) -> Result<Option<PathBuf>> {
    if let Some(dir) = env_dir {
        if dir.join(NCCL_LIBRARY).exists() {
            return Ok(Some(dir.to_path_buf()));
        }
        bail!("NCCL_LIB_DIR={} has no {NCCL_LIBRARY}", dir.display());
    }
    Ok(wheel_dirs
        .iter()
        .cloned()
        .chain(system_dirs.iter().map(PathBuf::from))
        .find(|dir| dir.join(NCCL_LIBRARY).exists()))
}

/// The folder with `libnvrtc.so.<major>`: a CUDA toolkit's, else a wheel's, else a system
/// package's; `None` sends the caller to `fetch-nvrtc`.
fn find_nvrtc(wheel_dirs: &[PathBuf]) -> Option<PathBuf> {
    CUDA_TOOLKIT_DIRS
        .iter()
        .map(PathBuf::from)
        .chain(wheel_dirs.iter().cloned())
        .chain(SYSTEM_NVRTC_DIRS.iter().map(PathBuf::from))
        .find(|dir| has_nvrtc(dir))
}

/// Whether `dir` holds `libnvrtc.so.<digits>`, a name cudarc loads.
fn has_nvrtc(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(|entry| entry.ok()).any(|entry| {
        entry
            .file_name()
            .to_str()
            .and_then(|name| name.strip_prefix("libnvrtc.so."))
            .is_some_and(|major| !major.is_empty() && major.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// Makes `dir/libnccl.so` a symlink to `library`, the name cudarc loads.
fn link_nccl(dir: &Path, library: &Path) -> Result<()> {
    let link = dir.join("libnccl.so");
    if link.symlink_metadata().is_ok() {
        fs::remove_file(&link).with_context(|| format!("could not remove {}", link.display()))?;
    }
    std::os::unix::fs::symlink(library, &link)
        .with_context(|| format!("could not link {} to {}", link.display(), library.display()))
}

/// `dirs` then the entries of `existing` (an `LD_LIBRARY_PATH`), `:`-joined.
fn ld_library_path(dirs: &[PathBuf], existing: Option<OsString>) -> Result<OsString> {
    let mut all: Vec<PathBuf> = dirs.to_vec();
    if let Some(existing) = existing {
        all.extend(std::env::split_paths(&existing).filter(|dir| !dir.as_os_str().is_empty()));
    }
    std::env::join_paths(all).context("a library folder's path contains ':'")
}

/// Builds every suite into `dir` under its stable name, stripped, with `run.sh`.
fn build_only(root: &Path, dir: &Path) -> Result<()> {
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

const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Generated by `cargo xtask test-gpu --build-only DIR` (xtask/src/gpu.rs): runs distribute's GPU
# suites on a machine with an NVIDIA GPU. Needs bash, and python3 only to find NVIDIA's wheels.
#
#   run.sh [SUITE...]     every suite when none is named; suites: @SUITE_NAMES@
#
#   NCCL_LIB_DIR=DIR      the folder with libnccl.so.2 (else: the nvidia-nccl-cu13/-cu12 wheel
#                         of python3, then @NCCL_DIRS@)
#   NVRTC_LIB_DIR=DIR     the folder with libnvrtc.so.<major> (else: @CUDA_TOOLKIT_DIRS@, then the
#                         wheels of python3, then @NVRTC_DIRS@)
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || exit 2
cd "$here" || exit 2

known=(@SUITE_NAMES@)
selected=("$@")
for name in ${selected[@]+"${selected[@]}"}; do
  case " ${known[*]} " in
    *" $name "*) ;;
    *) echo "run.sh: unknown suite '$name'; suites: ${known[*]}" >&2; exit 2 ;;
  esac
done

# The first of the folders given after PATTERN that holds a file matching PATTERN.
first_dir_with() {
  local pattern="$1" dir file
  shift
  for dir in "$@"; do
    for file in "$dir"/$pattern; do
      if [ -e "$file" ]; then
        echo "$dir"
        return 0
      fi
    done
  done
  return 1
}

# The nvidia/*/lib folders of NVIDIA's wheels in python3's site-packages, one per line.
wheel_lib_dirs() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 -c 'import site, sys
print("\n".join([*site.getsitepackages(), site.getusersitepackages(), *sys.path]))' 2>/dev/null |
    while IFS= read -r site; do
      [ -n "$site" ] || continue
      for dir in "$site"/nvidia/*/lib; do
        if [ -d "$dir" ]; then echo "$dir"; fi
      done
    done
}
wheel_dirs=()
while IFS= read -r dir; do wheel_dirs+=("$dir"); done < <(wheel_lib_dirs)

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L
else
  echo "run.sh: no nvidia-smi on PATH"
fi

libs="$(mktemp -d "${TMPDIR:-/tmp}/distribute-gpu-libs.XXXXXX")" || exit 2
trap 'rm -rf "$libs"' EXIT

if [ -n "${NCCL_LIB_DIR:-}" ]; then
  if [ ! -e "$NCCL_LIB_DIR/libnccl.so.2" ]; then
    echo "run.sh: NCCL_LIB_DIR=$NCCL_LIB_DIR has no libnccl.so.2" >&2
    exit 2
  fi
  nccl_dir="$NCCL_LIB_DIR"
else
  nccl_dir="$(first_dir_with libnccl.so.2 ${wheel_dirs[@]+"${wheel_dirs[@]}"} @NCCL_DIRS@)" ||
    nccl_dir=""
fi
if [ -n "$nccl_dir" ]; then
  # cudarc loads libnccl.so or libnccl.so.<CUDA major>, never libnccl.so.2.
  ln -s "$nccl_dir/libnccl.so.2" "$libs/libnccl.so"
  export DISTRIBUTE_REQUIRE_NCCL=1
  echo "run.sh: NCCL: $nccl_dir/libnccl.so.2"
else
  echo "run.sh: WARNING: no libnccl.so.2 found: the NCCL suites are SKIPPED" >&2
  echo "run.sh: WARNING: \`python3 -m pip install @NCCL_REQUIREMENT@\` or set NCCL_LIB_DIR" >&2
fi

if [ -n "${NVRTC_LIB_DIR:-}" ]; then
  nvrtc_dir="$NVRTC_LIB_DIR"
else
  nvrtc_dir="$(first_dir_with 'libnvrtc.so.[0-9]*' @CUDA_TOOLKIT_DIRS@ \
    ${wheel_dirs[@]+"${wheel_dirs[@]}"} @NVRTC_DIRS@)" || nvrtc_dir=""
fi
if [ -n "$nvrtc_dir" ]; then
  echo "run.sh: NVRTC: $nvrtc_dir"
else
  echo "run.sh: WARNING: no libnvrtc.so.<major> found: the suites that compile kernels will" \
    "FAIL; \`python3 -m pip install @NVRTC_REQUIREMENT@\` or set NVRTC_LIB_DIR" >&2
fi

export LD_LIBRARY_PATH="$libs${nvrtc_dir:+:$nvrtc_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DISTRIBUTE_REQUIRE_GPU=1 DISTRIBUTE_REQUIRE_NVRTC=1
echo "run.sh: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

summary=()
failures=0
# run_suite NAME NEEDS ARGS...: runs ./NAME ARGS unless not selected or NCCL is missing.
run_suite() {
  local name="$1" needs="$2" rc
  shift 2
  if [ ${#selected[@]} -gt 0 ] && [[ " ${selected[*]} " != *" $name "* ]]; then
    return 0
  fi
  if [ "$needs" = nccl ] && [ -z "$nccl_dir" ]; then
    echo "run.sh: WARNING: SKIPPING $name: no libnccl.so.2" >&2
    summary+=("SKIP  $name (no NCCL)")
    return 0
  fi
  echo "=== $name: ./$name $*"
  "./$name" "$@"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    summary+=("PASS  $name")
  else
    summary+=("FAIL  $name (exit $rc)")
    failures=$((failures + 1))
  fi
}

@SUITES@
echo "=== summary"
for line in ${summary[@]+"${summary[@]}"}; do echo "  $line"; done
if [ "$failures" -gt 0 ]; then
  echo "run.sh: $failures suite(s) FAILED" >&2
  exit 1
fi
echo "run.sh: every suite run passed"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_unique_names_and_the_nvrtc_suite() {
        for (i, suite) in SUITES.iter().enumerate() {
            assert!(
                SUITES[..i].iter().all(|other| other.name != suite.name),
                "{}",
                suite.name
            );
        }
        assert_eq!(suite(NVRTC_SUITE).needs, Needs::Nvrtc);
    }

    #[test]
    fn cargo_args_name_package_feature_and_target() {
        assert_eq!(
            suite("collectives-nccl").cargo_args(false).join(" "),
            "test --package distribute-collectives --features distribute-collectives/nccl \
             --test nccl"
        );
        assert_eq!(
            suite("bench-gpu").cargo_args(true).join(" "),
            "bench --no-run --message-format=json-render-diagnostics --package \
             distribute-collectives --features distribute-collectives/cuda --bench gpu"
        );
    }

    #[test]
    fn clippy_lints_every_feature_package_with_cuda_and_nccl() {
        let args = clippy_args(&["cuda", "nccl"]).join(" ");
        assert!(
            args.starts_with("clippy --all-targets --package distribute-collectives --package"),
            "{args}"
        );
        assert!(
            args.contains(
                "--features distribute-collectives/cuda,distribute-collectives/nccl,\
                 distribute-mirrored/cuda,distribute-mirrored/nccl,distribute/cuda,distribute/nccl"
            ),
            "{args}"
        );
        assert!(args.ends_with("-- -D warnings"), "{args}");
    }

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

    /// A fake site-packages with the layouts of nvidia-nccl-cu12 and the CUDA 13 wheels.
    fn fake_site() -> tempfile::TempDir {
        let site = tempfile::tempdir().unwrap();
        for (dir, file) in [
            ("nvidia/nccl/lib", "libnccl.so.2"),
            ("nvidia/cu13/lib", "libnvrtc.so.13"),
            ("nvidia/cu13/lib", "libnvrtc-builtins.so.13.0"),
            ("nvidia/cublas/lib", "libcublas.so.13"),
        ] {
            fs::create_dir_all(site.path().join(dir)).unwrap();
            fs::write(site.path().join(dir).join(file), b"").unwrap();
        }
        fs::create_dir_all(site.path().join("nvidia/cu13/include")).unwrap();
        site
    }

    #[test]
    fn nccl_is_found_in_a_wheel_and_nccl_lib_dir_wins() {
        let site = fake_site();
        let wheel_dirs =
            wheel_lib_dirs(&[site.path().to_path_buf(), PathBuf::from("/nonexistent")]);
        assert_eq!(
            wheel_dirs,
            ["nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/nccl/lib"]
                .map(|dir| site.path().join(dir))
        );
        assert_eq!(
            find_nccl(None, &wheel_dirs, &[]).unwrap(),
            Some(site.path().join("nvidia/nccl/lib"))
        );
        assert_eq!(find_nccl(None, &[], &["/nonexistent"]).unwrap(), None);

        let own = tempfile::tempdir().unwrap();
        assert!(find_nccl(Some(own.path()), &wheel_dirs, &[]).is_err());
        fs::write(own.path().join(NCCL_LIBRARY), b"").unwrap();
        assert_eq!(
            find_nccl(Some(own.path()), &wheel_dirs, &[]).unwrap(),
            Some(own.path().to_path_buf())
        );
        let system = own.path().to_str().unwrap();
        assert_eq!(
            find_nccl(None, &[], &["/nonexistent", system]).unwrap(),
            Some(own.path().to_path_buf())
        );
    }

    #[test]
    fn nvrtc_is_recognised_by_its_versioned_name() {
        let site = fake_site();
        assert!(has_nvrtc(&site.path().join("nvidia/cu13/lib")));
        assert!(!has_nvrtc(&site.path().join("nvidia/nccl/lib")));
        let only_builtins = tempfile::tempdir().unwrap();
        fs::write(only_builtins.path().join("libnvrtc-builtins.so.13.0"), b"").unwrap();
        fs::write(only_builtins.path().join("libnvrtc.so"), b"").unwrap();
        assert!(!has_nvrtc(only_builtins.path()));
    }

    #[test]
    fn the_nccl_link_has_the_name_cudarc_loads() {
        let site = fake_site();
        let libs = tempfile::tempdir().unwrap();
        let library = site.path().join("nvidia/nccl/lib").join(NCCL_LIBRARY);
        link_nccl(libs.path(), &library).unwrap();
        // Linking again replaces the link.
        link_nccl(libs.path(), &library).unwrap();
        assert_eq!(
            fs::read_link(libs.path().join("libnccl.so")).unwrap(),
            library
        );
    }

    #[test]
    fn ld_library_path_puts_new_folders_first() {
        let joined = ld_library_path(
            &[PathBuf::from("/a"), PathBuf::from("/b")],
            Some(OsString::from("/c::/d")),
        )
        .unwrap();
        assert_eq!(joined, "/a:/b:/c:/d");
        assert_eq!(ld_library_path(&[PathBuf::from("/a")], None).unwrap(), "/a");
    }

    #[test]
    fn test_gpu_rejects_unknown_arguments() {
        let err = command(&["--frobnicate".to_owned()]).unwrap_err();
        assert!(
            err.to_string().contains("usage: cargo xtask test-gpu"),
            "{err}"
        );
    }
}
