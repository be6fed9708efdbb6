//! Running the GPU suites here: `cargo xtask test` runs the NVRTC-only suite, `cargo xtask
//! test-gpu` every suite on this machine's GPU, with a PASS/FAIL/SKIP summary.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::libs::{
    CUDA_PJRT_LIBRARY, NCCL_LIBRARY, SYSTEM_NCCL_DIRS, detect_gpu, find_cuda_pjrt, find_nccl,
    find_nvrtc, ld_library_path, link_nccl, python_site_dirs, wheel_lib_dirs,
};
use super::suites::{Kind, NVRTC_SUITE, Needs, SUITES, suite};
use crate::cargo::{cargo_env, metadata};
use crate::mpirun::resolve;
use crate::provision::{nvrtc, pjrt};

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

/// How a suite ended in `test-gpu`.
enum Outcome {
    Passed,
    Failed(String),
    Skipped(&'static str),
}

/// Runs every suite here, on this machine's GPU.
pub(super) fn run_here(root: &Path) -> Result<()> {
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

    let env_plugin = std::env::var_os("PJRT_PLUGIN").map(PathBuf::from);
    let installed = pjrt::Plugin::Cuda.install_path(root);
    let installed_dir = installed.parent().map(Path::to_path_buf);
    let cuda_pjrt = find_cuda_pjrt(env_plugin.as_deref(), installed_dir.as_slice(), &site_dirs)?;
    match &cuda_pjrt {
        Some(plugin) => eprintln!("xtask: test-gpu: CUDA PJRT plugin: {}", plugin.display()),
        None => eprintln!(
            "xtask: test-gpu: WARNING: no {CUDA_PJRT_LIBRARY} found (PJRT_PLUGIN, `cargo xtask \
             fetch-pjrt --plugin cuda`, the jax-cuda13-pjrt wheel of python3): the TpuStrategy \
             suites are SKIPPED"
        ),
    }

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

    // The suites with `mpi` build against the MPI of test-mpi and start their workers with its
    // mpirun: resolved once, when the first of them comes.
    let mut mpi = None;
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
        let mut suite_env: Vec<(String, std::ffi::OsString)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.to_os_string()))
            .collect();
        if suite.needs == Needs::CudaLinked {
            // Built with the pinned toolkit for this machine's GPU; run with cuBLAS, cuRAND and
            // the CUDA runtime of NVIDIA's wheels.
            let toolkit =
                crate::provision::cuda_toolkit::fetch(root).and_then(|t| t.build_env(true));
            let toolkit = match toolkit {
                Ok(env) => env,
                Err(err) => {
                    outcomes.push((suite.name, Outcome::Failed(format!("{err:#}"))));
                    continue;
                }
            };
            suite_env.extend(toolkit);
            let linked: Vec<PathBuf> = wheel_dirs
                .iter()
                .filter(|dir| {
                    dir.join(crate::provision::cuda_toolkit::CUDART).exists()
                        || crate::provision::cuda_toolkit::STUBS
                            .iter()
                            .any(|stub| dir.join(stub.soname).exists())
                })
                .cloned()
                .collect();
            suite_env.retain(|(k, _)| k != "LD_LIBRARY_PATH");
            suite_env.push((
                "LD_LIBRARY_PATH".to_owned(),
                super::libs::ld_library_path(&linked, Some(ld_library_path.clone()))?,
            ));
        }
        if suite.mpi() {
            match mpi.get_or_insert_with(|| metadata().and_then(|metadata| resolve(&metadata))) {
                Ok(mpi) => super::bundle::with_mpi(&mut suite_env, mpi, true),
                Err(err) => {
                    let why = format!("no MPI for its two-worker cases: {err:#}");
                    outcomes.push((suite.name, Outcome::Failed(why)));
                    continue;
                }
            }
        }
        if suite.needs == Needs::CudaPjrt {
            let Some(plugin) = &cuda_pjrt else {
                eprintln!(
                    "xtask: test-gpu: WARNING: SKIPPING {}: no {CUDA_PJRT_LIBRARY}",
                    suite.name
                );
                outcomes.push((suite.name, Outcome::Skipped("no CUDA PJRT plugin")));
                continue;
            };
            suite_env.push(("PJRT_PLUGIN".to_owned(), plugin.as_os_str().to_os_string()));
        }
        let mut args = suite.cargo_args(false);
        if suite.kind != Kind::Bench {
            // `cargo bench` passes `--bench` itself.
            args.push("--".to_owned());
            args.extend(suite.run_args().iter().map(|arg| (*arg).to_owned()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let suite_env: Vec<(&str, &OsStr)> = suite_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_os_str()))
            .collect();
        let outcome = match cargo_env(&format!("GPU suite {}", suite.name), &args, &suite_env) {
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
