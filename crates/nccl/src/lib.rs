//! `distribute-nccl`: [`NcclAllReduce`], the NCCL backend — all-reduce, batched all-reduce (one
//! NCCL group call), all-gather, reduce-scatter and broadcast between GPU replicas.
//!
//! Layer: a backend beside the in-process ones of `distribute-collectives`, built from its root
//! traits and errors and its published kit (`distribute_collectives::backend`), and from
//! `distribute-tensor`'s GPU memory (`distribute_tensor::cuda`). Knows nothing about strategies,
//! MPI or how a unique id travels between processes. Building it enables the tensor crate's feature `cuda` (CUDA and NCCL are loaded at run
//! time, so it builds without them); a strategy takes it behind its feature `nccl`. Two ways to
//! build the backend:
//! - one process driving several GPUs (`NcclAllReduce::new`): the communicators are made
//!   together with `ncclCommInitAll` (`Communicator::init_all`), and each replica thread
//!   takes its own;
//! - one rank per process or per GPU across machines ([`NcclAllReduce::from_unique_id`]), every
//!   process given the same NCCL unique id: `distribute-nccl-exchange` hands it from a cluster's
//!   leader to every task over TCP (its `nccl_all_reduce_for_cluster`), `distribute-mpi`
//!   broadcasts it over an MPI job. This crate does not move the id between processes.
//!
//! A call returns when its result is on the GPU: the replica thread waits for the stream, polling
//! NCCL's asynchronous error and the backend's abort flag, and gives up at the deadline by
//! aborting the communicator. A replica that never makes a call, or makes a different one, is
//! reported as an error rather than hanging the others: every call first gathers each rank's
//! dtype and shape (an all-gather of one agreement record per rank, `Record::WORDS` words) and fails on every rank when they disagree.
//!
//! Ranks of several processes ([`NcclAllReduce::from_unique_id`]) use NCCL's non-blocking
//! communicators: joining one (`ncclCommInitRankConfig` waits for every rank), the first
//! collective's lazy connections and the teardown are polled against the deadline too, so a
//! rank that never starts or freezes is an error on the others. Not covered: the one-process
//! setup (`ncclCommInitAll`, blocking, with no other process to wait for) and, on its
//! communicators, the lazy connections inside the first collective, which wait for the other
//! replica threads (`NCCL_RUNTIME_CONNECT=0` moves them to init). A replica that skips a call
//! is caught by the deadline (`GroupConfig::deadline`), not at once.
//!
//! NCCL reduces in its own order (rings, trees), so results are not bitwise equal to the
//! replica-order host kernel beyond two ranks; use `ReductionToOneDevice`
//! on GPUs where bits matter more than bandwidth.
//!
//! Files, named by role as in every backend: `all_reduce` (the backend), `communicator` (RAII
//! over an NCCL communicator, and its collectives: every `unsafe` NCCL call of a replica),
//! `member` (a replica thread's handle, which gathers the one agreement record,
//! `distribute_collectives::backend::Record`, before each call) and `shared` (what the backend
//! and the handles share: the abort and the deadline).

mod all_reduce;
mod communicator;
mod member;
mod probe;
mod shared;

pub use all_reduce::{NcclAllReduce, nccl_backend};
pub use probe::{nccl_available, require_nccl};
