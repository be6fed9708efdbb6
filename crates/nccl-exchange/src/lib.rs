//! The exchange of NCCL's unique id across processes: the leader task hands the 128 bytes of its
//! `ncclUniqueId` to every other chief and worker task of the [`ClusterSpec`] over TCP,
//! authenticated with the cluster key ([`ClusterKey`]). With feature `nccl`,
//! `nccl_all_reduce_for_cluster` builds `distribute-nccl`'s `NcclAllReduce` across the
//! processes on it.
//!
//! A layer above `distribute-collectives`, with its own [`ExchangeError`]: the transport of
//! NCCL's unique id across processes and nothing else. It knows nothing about strategies, MPI (an
//! MPI job broadcasts the id over MPI instead) or tensors, and without feature `nccl` nothing
//! about CUDA or NCCL either (the id is just bytes), so it always builds and is tested on
//! machines without a GPU. Only builds that want NCCL across processes depend on it (the facade's
//! feature `nccl`): nothing CPU-only compiles it.
//!
//! Every rank of an NCCL communicator calls `ncclCommInitRank` with the same id, which one rank
//! makes with `ncclGetUniqueId`. This crate moves only those bytes, like the TCP store that
//! bootstraps torch's process groups; tensors travel through NCCL itself.
//!
//! # Who takes part
//!
//! The chief and the workers, one rank each, numbered as [`ClusterSpec::id_in_cluster`] numbers
//! them: the chief is rank 0 and worker `i` is rank `i + 1`; without a chief, worker `i` is rank
//! `i`. Rank 0 (the cluster's collective leader: the chief, else worker 0) leads the exchange.
//! Parameter servers and evaluators are no ranks and are refused. See [`nccl_rank`].
//!
//! # Protocol (version 2; integers big-endian)
//!
//! The leader listens on the port of its own address in the cluster spec: on that IP when the
//! host is an IP address, else on every address its name resolves to (`localhost` binds loopback
//! only, never every interface; a Kubernetes headless service resolves to the pod's own address).
//! Every other task connects to it, retrying with short sleeps until its timeout since the leader
//! may start later, and sends a hello of 60 bytes: the magic `dst-uid\0`, the version (u16), its
//! task type (u8: 0 chief, 1 worker, 2 ps, 3 evaluator), its task index (u32), the number of ranks
//! it believes in (u32), a hash of its cluster's chief and worker addresses in rank order (u64),
//! whether it has a cluster key (u8: 0 no, 1 HMAC-SHA256) and a fresh random nonce (32 bytes).
//!
//! The leader refuses a bad hello at once (unknown task, another cluster spec, a peer whose IP is
//! not the one the cluster spec gives its task, a key on one side only). With a key, it answers a
//! good hello with a challenge: its own fresh nonce and its proof of the key; the task checks that
//! proof (so a process squatting on the leader's port is found out before the task says anything
//! it could use) and answers with its own proof (32 bytes); a task whose proof fails is refused.
//! (`auth.rs` says what the proofs cover.) A task that proved itself joins, unless its task
//! already joined on a connection still open.
//!
//! When every rank has joined, the leader sends each the id: sealed for that connection with a key
//! derived from the handshake (status 4: ciphertext and tag, 160 bytes), or in clear without a key
//! (status 0: 128 bytes). When its timeout passes first, it tells those that joined which tasks
//! never came and fails naming them, so that no task goes on into an NCCL initialisation that
//! would hang. A reply is the magic, the version, a status (u8) and its body: status 1 (refused:
//! why) and 2 (abandoned: the missing tasks, comma-separated) carry a UTF-8 message (u16 length, at
//! most 1024 bytes), status 3 (challenge) the leader's nonce and proof (64 bytes).
//!
//! # Security
//!
//! The launcher gives every chief and worker task the same random key ([`ClusterKey`]:
//! `DISTRIBUTE_CLUSTER_KEY` in hex, or a file named by `DISTRIBUTE_CLUSTER_KEY_FILE`). Both sides
//! then prove they know it, so a stranger that can reach the leader gets nothing (not even the id
//! in clear on the wire) and cannot take a task's place, and a process on the leader's port is an
//! error on every task. Without a key the exchange does not run, even on one machine (where
//! another user's process could take part), except through the named opt-out
//! `DISTRIBUTE_UNAUTHENTICATED_EXCHANGE=1` ([`ExchangeAuth::Unauthenticated`]), which logs a
//! warning each time and is refused where a task's address is not loopback (`127.*`, `::1`,
//! `localhost`).
//!
//! # Failures
//!
//! Every failure is an [`ExchangeError`], never a hang or a panic: every socket operation has a
//! timeout (none when the timeout is too long to be added to the clock, such as
//! [`Duration::MAX`]: then the exchange waits without limit); the leader reads hellos and proofs
//! without blocking, so a connection that sends nothing or garbage is dropped (after two seconds at
//! most) without holding up the others. Only the resolution of a host name, done by the system, is
//! not bounded by the timeout.
//!
//! # Files
//!
//! This file holds the entry points ([`exchange_unique_id`] and its two variants); `unique_id`
//! says what they move ([`UNIQUE_ID_BYTES`]), `rank` numbers the tasks ([`nccl_rank`]), `roster`
//! lists a cluster's ranks and checks who may join, `wire` encodes the messages, `leader` and
//! `client` are the two sides of the conversation, `deadline` bounds their waits, `auth` holds
//! the cluster key and the HMAC handshake, and `all_reduce` (feature `nccl`) builds the NCCL
//! backend on the exchange.

mod auth;
mod client;
mod deadline;
mod error;
mod leader;
mod rank;
mod roster;
mod unique_id;
mod wire;

#[cfg(feature = "nccl")]
mod all_reduce;

use std::time::Duration;

use distribute_device_spec::{ClusterSpec, TaskId};

#[cfg(feature = "nccl")]
pub use all_reduce::nccl_all_reduce_for_cluster;
pub use auth::{
    CLUSTER_KEY_FILE_VAR, CLUSTER_KEY_VAR, ClusterKey, ExchangeAuth, MIN_CLUSTER_KEY_BYTES,
    UNAUTHENTICATED_VAR,
};
pub use error::ExchangeError;
pub use rank::{NcclRank, nccl_rank};
pub use unique_id::UNIQUE_ID_BYTES;

use crate::deadline::Deadline;
use crate::roster::{Roster, parse_address};

/// Sends the leader's unique id to every other chief and worker task of `cluster`, or receives
/// it: every task calls this with the same cluster spec and gets the leader's id back.
///
/// `id` is `Some` exactly on the leader (see [`NcclRank::is_leader`]) and `None` on every other
/// task; anything else is an [`ExchangeError::InvalidArgument`]. The leader returns once it has
/// sent every task the id, the others once they have it; a cluster of one task returns the id at
/// once, without networking. Within `timeout` (give the leader time to start; one too long to add
/// to the clock, such as [`Duration::MAX`], waits without limit), every task either has the id or
/// fails: [`ExchangeError::Timeout`] names the tasks that never joined on the leader,
/// and the leader's address on the others; a task the leader refuses (another cluster spec, a task
/// already joined, no key or the wrong one) gets [`ExchangeError::Refused`].
///
/// # Security
///
/// The tasks authenticate each other with the cluster key the launcher gives every chief and
/// worker task: the environment variable `DISTRIBUTE_CLUSTER_KEY` ([`CLUSTER_KEY_VAR`]) holding at
/// least 16 random bytes in hex, made e.g. with `openssl rand -hex 32`, or
/// `DISTRIBUTE_CLUSTER_KEY_FILE` ([`CLUSTER_KEY_FILE_VAR`]) naming a file that holds it. The
/// leader sends the id, encrypted, only to a task that proved it knows the key, and a task accepts
/// an id only from a leader that proved it too: a process on the leader's port is a
/// [`ExchangeError::Unauthenticated`]. Where a task's address in the cluster spec is an
/// IP, the leader also refuses a connection from any other IP. Without a key the exchange does not
/// run ([`ExchangeError::Key`], saying how to make one; it also reports a key that does
/// not parse), even on one machine, where another user's process could take a task's place; the
/// only way to run without one is the named opt-out `DISTRIBUTE_UNAUTHENTICATED_EXCHANGE=1`
/// ([`ExchangeAuth::Unauthenticated`]: loopback-only clusters, a warning each time).
/// [`exchange_unique_id_with_key`] takes the key as an argument instead.
///
/// ```
/// use std::time::Duration;
///
/// use distribute_nccl_exchange::{UNIQUE_ID_BYTES, exchange_unique_id, nccl_rank};
/// use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
///
/// // A cluster of one task needs no networking, so no key.
/// let cluster = ClusterSpec::from_json(r#"{"worker": ["localhost:2222"]}"#)?;
/// let me = TaskId::new(TaskType::Worker, 0);
/// // The leader passes the id from ncclGetUniqueId; every other task passes None.
/// let id = nccl_rank(&cluster, me)?.is_leader().then_some([7; UNIQUE_ID_BYTES]);
/// let shared = exchange_unique_id(&cluster, me, id, Duration::from_secs(60))?;
/// assert_eq!(shared, [7; UNIQUE_ID_BYTES]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn exchange_unique_id(
    cluster: &ClusterSpec,
    me: TaskId,
    id: Option<[u8; UNIQUE_ID_BYTES]>,
    timeout: Duration,
) -> Result<[u8; UNIQUE_ID_BYTES], ExchangeError> {
    match ExchangeAuth::from_env() {
        Ok(ExchangeAuth::Key(key)) => exchange_unique_id_with_key(cluster, me, id, &key, timeout),
        Ok(ExchangeAuth::Unauthenticated) => {
            exchange_unique_id_unauthenticated(cluster, me, id, timeout)
        }
        // One task alone exchanges nothing, so needs no key.
        Err(_) if cluster_of_one(cluster, me, id) => exchange(cluster, me, id, None, timeout),
        Err(e) => Err(e),
    }
}

/// Whether `me` is the only task of `cluster` and passes its own id: nothing crosses a socket.
fn cluster_of_one(cluster: &ClusterSpec, me: TaskId, id: Option<[u8; UNIQUE_ID_BYTES]>) -> bool {
    id.is_some() && nccl_rank(cluster, me).is_ok_and(|rank| rank.world_size == 1)
}

/// [`exchange_unique_id`] with the cluster key given rather than read from the environment.
///
/// ```
/// use std::time::Duration;
///
/// use distribute_nccl_exchange::{ClusterKey, exchange_unique_id_with_key};
/// use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
///
/// let cluster = ClusterSpec::from_json(r#"{"worker": ["localhost:2222"]}"#)?;
/// let key = ClusterKey::from_hex("00112233445566778899aabbccddeeff")?;
/// let me = TaskId::new(TaskType::Worker, 0);
/// let id = Some([7; 128]);
/// let shared = exchange_unique_id_with_key(&cluster, me, id, &key, Duration::MAX)?;
/// assert_eq!(shared, [7; 128]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn exchange_unique_id_with_key(
    cluster: &ClusterSpec,
    me: TaskId,
    id: Option<[u8; UNIQUE_ID_BYTES]>,
    key: &ClusterKey,
    timeout: Duration,
) -> Result<[u8; UNIQUE_ID_BYTES], ExchangeError> {
    exchange(cluster, me, id, Some(key), timeout)
}

/// [`exchange_unique_id`] without authentication, the explicitly named opt-out
/// ([`ExchangeAuth::Unauthenticated`]): any process that reaches the leader first gets the id
/// and takes a task's place, so it logs a warning every time it runs, and a cluster whose
/// addresses are not all loopback refuses it ([`ExchangeError::Key`]).
pub fn exchange_unique_id_unauthenticated(
    cluster: &ClusterSpec,
    me: TaskId,
    id: Option<[u8; UNIQUE_ID_BYTES]>,
    timeout: Duration,
) -> Result<[u8; UNIQUE_ID_BYTES], ExchangeError> {
    log::warn!(
        "unique-id exchange: {me} runs WITHOUT a cluster key ({UNAUTHENTICATED_VAR}), so any \
         process that reaches the leader first could take a task's place; give every task the \
         same key in {CLUSTER_KEY_VAR} instead"
    );
    exchange(cluster, me, id, None, timeout)
}

/// The exchange, with a key or (the opt-out, loopback only) without.
fn exchange(
    cluster: &ClusterSpec,
    me: TaskId,
    id: Option<[u8; UNIQUE_ID_BYTES]>,
    key: Option<&ClusterKey>,
    timeout: Duration,
) -> Result<[u8; UNIQUE_ID_BYTES], ExchangeError> {
    let rank = nccl_rank(cluster, me)?;
    let roster = Roster::new(cluster);
    let id = match (rank.is_leader(), id) {
        (true, None) => {
            return Err(ExchangeError::InvalidArgument(format!(
                "{me} leads the unique-id exchange of this cluster: pass the id it made with \
                 ncclGetUniqueId"
            )));
        }
        (false, Some(_)) => {
            return Err(ExchangeError::InvalidArgument(format!(
                "{me} is rank {}, not the leader of the unique-id exchange ({} is): pass None and \
                 receive the leader's id",
                rank.rank,
                roster.leader()
            )));
        }
        (true, Some(id)) if rank.world_size == 1 => return Ok(id),
        (_, id) => id,
    };
    let leader_address = roster.leader_address();
    let (host, port) = parse_address(leader_address).map_err(|reason| ExchangeError::Address {
        task: roster.leader().to_string(),
        address: leader_address.to_owned(),
        reason,
    })?;
    if let (None, Some((task, address))) = (key, roster.remote_task()) {
        return Err(ExchangeError::Key(format!(
            "{me} will not run the exchange across hosts without a cluster key ({task} is at \
             {address}, not loopback), as any host that reaches the leader could take a task's \
             place and join the communicator: give every chief and worker task the same random \
             key in {CLUSTER_KEY_VAR} (hex, at least 32 digits, e.g. from `openssl rand -hex \
             32`), or in a file named by {CLUSTER_KEY_FILE_VAR}"
        )));
    }
    let deadline = Deadline::after(timeout);
    match id {
        Some(id) => leader::lead(&roster, (host, port), id, key, timeout, deadline),
        None => client::join(&roster, me, (host, port), key, deadline),
    }
}
