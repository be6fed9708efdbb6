//! The crate's one error type: what can go wrong while the unique id travels.

use std::time::Duration;

use distribute_collectives::CollectiveError;
use distribute_device_spec::DeviceSpecError;
use thiserror::Error;

/// Why the unique-id exchange (or, with feature `nccl`, the NCCL communicator built on it)
/// failed. Every wait ends in one of these, never a hang: the timeouts name the tasks waited for.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The exchange did not complete within its timeout.
    #[error(
        "unique-id exchange: {task} gave up after {waited:?} waiting for {waiting_for}; start \
         every chief and worker task with the same cluster spec, or raise the timeout"
    )]
    Timeout {
        /// The task that gave up, e.g. `chief:0`.
        task: String,
        /// How long it waited.
        waited: Duration,
        /// The tasks known to be missing (on the leader: those that never joined; on another
        /// task: the leader it never reached, or the tasks the leader reported); may be empty.
        missing: Vec<String>,
        /// What it waited for, with the last error seen.
        waiting_for: String,
    },
    /// A task's address in the cluster spec cannot be used for the unique-id exchange.
    #[error("unique-id exchange: {task}'s address '{address}' {reason}")]
    Address {
        /// The task whose address it is, e.g. `chief:0`.
        task: String,
        /// The address, as the cluster spec gives it.
        address: String,
        /// What is wrong: it does not parse, does not resolve, or cannot be bound.
        reason: String,
    },
    /// The leader of the unique-id exchange refused this task.
    #[error("unique-id exchange: the leader {leader} at {address} refused {task}: {reason}")]
    Refused {
        /// The refused task.
        task: String,
        /// The leader, e.g. `chief:0`.
        leader: String,
        /// The leader's address.
        address: String,
        /// Why, e.g. a cluster spec that differs from the leader's.
        reason: String,
    },
    /// A peer broke the unique-id exchange: it closed the connection early, sent bytes that are
    /// not this protocol, or could not be written to.
    #[error("unique-id exchange between {task} and {peer}: {reason}")]
    Protocol {
        /// The task that saw the failure.
        task: String,
        /// The other side: a task, an address, or both.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// The unique-id exchange has no usable cluster key: a cluster across hosts without one, or a
    /// key that does not parse or cannot be read.
    #[error("unique-id exchange: {0}")]
    Key(String),
    /// A peer of the unique-id exchange did not prove it knows the cluster key: a process other
    /// than the leader holds the leader's port, or the leader has another key.
    #[error("unique-id exchange: {task} does not trust {peer}: {reason}")]
    Unauthenticated {
        /// The task that checked, e.g. `worker:1`.
        task: String,
        /// The peer that failed, e.g. `the leader chief:0 at 10.0.0.1:2222`.
        peer: String,
        /// What it failed.
        reason: String,
    },
    /// A bad argument: an id where none belongs, a task that is no rank; the message says which.
    #[error("{0}")]
    InvalidArgument(String),
    /// A task that is not in the cluster spec, or a spec that does not parse.
    #[error(transparent)]
    Device(#[from] DeviceSpecError),
    /// NCCL's setup on the exchanged id failed (feature `nccl`): NCCL missing, no GPU, or a
    /// communicator that did not form within the deadline.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
}
