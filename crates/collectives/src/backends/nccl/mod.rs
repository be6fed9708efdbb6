//! `NcclAllReduce`: the NCCL backend (feature `nccl`) — all-reduce, batched all-reduce (one
//! NCCL group call), all-gather, reduce-scatter and broadcast between GPU replicas.
//!
//! Part of layer 3 (collectives); knows nothing about strategies. Two ways to build it:
//! - one process driving several GPUs (`NcclAllReduce::new`): the communicators are made
//!   together with `ncclCommInitAll` (cudarc's `Comm::from_devices`), and each replica thread
//!   takes its own;
//! - one rank per process or per GPU across machines ([`NcclAllReduce::from_unique_id`], or
//!   [`NcclAllReduce::for_cluster`], which hands the NCCL unique id from the cluster's leader to
//!   every task through [`exchange_unique_id`](crate::backend::nccl_bootstrap::exchange_unique_id)).
//!
//! A call returns when its result is on the GPU: the replica thread waits for the stream, polling
//! NCCL's asynchronous error and the backend's abort flag, and gives up at the deadline by
//! aborting the communicator. A replica that never makes a call, or makes a different one, is
//! reported as an error rather than hanging the others: every call first gathers each rank's
//! dtype and shape (a 32-byte all-gather) and fails on every rank when they disagree.
//!
//! Not covered by the deadline: NCCL's own blocking steps — joining a communicator
//! (`ncclCommInitRank` waits for every rank) and, with NCCL's default lazy connection setup
//! (`NCCL_RUNTIME_CONNECT=1`), connecting peers inside the first collective. A rank that never
//! starts can hang the others there; set `NCCL_RUNTIME_CONNECT=0` to connect at init. A replica
//! that skips a call is caught by the deadline (`GroupConfig::deadline`), not at once.
//!
//! NCCL reduces in its own order (rings, trees), so results are not bitwise equal to the
//! replica-order host kernel beyond two ranks; use [`ReductionToOneDevice`](crate::ReductionToOneDevice)
//! on GPUs where bits matter more than bandwidth.
//!
//! Files: [`bootstrap`] (the unique-id exchange over TCP: only bytes, so always compiled and
//! tested), [`auth`] (its cluster key, HMAC handshake and sealed id), `fnv` (the hash both sides agree through); with feature `nccl` `all_reduce` (the
//! backend), `communicator` (RAII over an NCCL communicator), `signature` (what every rank agrees
//! on before a call) and `member` (a replica thread's handle); without it `absent` (why there is
//! no NCCL backend).

pub(crate) mod auth;
pub(crate) mod bootstrap;
mod fnv;

#[cfg(not(feature = "nccl"))]
mod absent;
#[cfg(feature = "nccl")]
mod all_reduce;
#[cfg(feature = "nccl")]
mod communicator;
#[cfg(feature = "nccl")]
mod member;
#[cfg(feature = "nccl")]
mod signature;

#[cfg(not(feature = "nccl"))]
pub(crate) use absent::nccl_backend;
#[cfg(feature = "nccl")]
pub use all_reduce::NcclAllReduce;
#[cfg(feature = "nccl")]
pub(crate) use all_reduce::nccl_backend;
