//! Provisioning: the native tools and libraries that the workspace's builds, tests and programs
//! need and that cargo does not bring, found on the system or fetched from pinned, checksummed
//! PyPI wheels (downloaded with curl or wget, no pip) and unpacked under the workspace's
//! `target/`.
//!
//! - [`pins`]: the one table of every pinned artifact (project, version, URL, SHA-256).
//! - [`wheel`]: a pinned wheel downloaded (or taken from `target/wheels/`), checked and unzipped.
//! - [`mpi`]: the Open MPI and libclang of the `mpi` feature, the system's or the wheels'
//!   (`DISTRIBUTE_MPI`), and the environment that makes cargo, the `mpi` crate's build and
//!   `mpirun` use them.
//! - [`pjrt`]: the PJRT plugins (CPU; JAX's CUDA plugin).
//! - [`nvrtc`]: NVRTC, which compiles the CUDA kernels.
//! - [`cuda_toolkit`]: nvcc and the link-time stubs that build candle's CUDA backend.
//!
//! Every entry point takes the workspace root, below which it installs; none knows xtask's
//! commands or uses anything of xtask outside this module, so that it can become a library of
//! its own (a `cargo-distribute` launcher needs the Open MPI and libclang resolution and its
//! environment). What it does goes to stderr, one `xtask: …` line per step.

pub(crate) mod cuda_toolkit;
pub(crate) mod mpi;
pub(crate) mod nvrtc;
pub(crate) mod pins;
pub(crate) mod pjrt;
pub(crate) mod wheel;
