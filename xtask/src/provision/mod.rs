//! Provisioning: the native tools and libraries that the workspace's tests and GPU suites need
//! and that cargo does not bring, fetched from pinned, checksummed PyPI wheels (downloaded with
//! curl or wget, no pip) and unpacked under the workspace's `target/`.
//!
//! - [`pins`]: the table of xtask's pinned artifacts (project, version, URL, SHA-256).
//! - [`wheel`]: where xtask keeps a wheel put by hand; the fetching and checking is
//!   `distribute-launch`'s.
//! - [`pjrt`]: the PJRT plugins (CPU; JAX's CUDA plugin).
//! - [`nvrtc`]: NVRTC, which compiles the CUDA kernels.
//! - [`cuda_toolkit`]: nvcc and the link-time stubs that build candle's CUDA backend.
//!
//! Open MPI and libclang are not here: `distribute-launch` finds or fetches them for xtask as
//! for users (`crate::mpirun`). Every entry point takes the workspace root, below which it
//! installs. What it does goes to stderr, one `xtask: …` line per step.

pub(crate) mod cuda_toolkit;
pub(crate) mod nvrtc;
pub(crate) mod pins;
pub(crate) mod pjrt;
pub(crate) mod wheel;
