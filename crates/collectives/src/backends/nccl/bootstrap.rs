//! The unique-id exchange of a multi-process NCCL run: the leader task hands the 128 bytes of its
//! `ncclUniqueId` to every other chief and worker task of the [`ClusterSpec`].
//!
//! Every rank of an NCCL communicator calls `ncclCommInitRank` with the same id, which one rank
//! makes with `ncclGetUniqueId`. This module moves only those bytes, like the TCP store that
//! bootstraps torch's process groups; tensors travel through NCCL itself. It knows nothing about
//! CUDA or NCCL (the id is just bytes), so it is always compiled and tested.
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
//! See [`auth`](super::auth) for what the proofs cover. A task that proved itself joins, unless its
//! task already joined on a connection still open.
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
//! Every failure is a [`CollectiveError`], never a hang or a panic: every socket operation has a
//! timeout (none when the timeout is too long to be added to the clock, such as
//! [`Duration::MAX`]: then the exchange waits without limit); the leader reads hellos and proofs
//! without blocking, so a connection that sends nothing or garbage is dropped (after two seconds at
//! most) without holding up the others. Only the resolution of a host name, done by the system, is
//! not bounded by the timeout.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use distribute_device_spec::{ClusterSpec, TaskId, TaskType};

use super::auth::{
    CLUSTER_KEY_FILE_VAR, CLUSTER_KEY_VAR, ClusterKey, ExchangeAuth, NONCE_BYTES, Nonce,
    PROOF_BYTES, Proof, SEALED_BYTES, Session, UNAUTHENTICATED_VAR, nonce,
};
use super::fnv::Fnv;
use crate::CollectiveError;

/// The 128 bytes every rank of an NCCL communicator must share (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// How long the leader waits for the hello and the proof of a connection before it drops it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

const MAGIC: [u8; 8] = *b"dst-uid\0";
const VERSION: u16 = 2;
/// Magic and version: what both a hello and a reply start with.
const HEADER_LEN: usize = MAGIC.len() + 2;
const HELLO_LEN: usize = HEADER_LEN + 1 + 4 + 4 + 8 + 1 + NONCE_BYTES;
/// The longest message a reply carries; longer ones are cut.
const MAX_MESSAGE: usize = 1024;
/// The longest a client waits on one connection attempt before trying again.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest a client sleeps between connection attempts (the first sleep is 10 ms).
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long the leader sleeps when no connection made progress.
const POLL_PAUSE: Duration = Duration::from_millis(2);
/// How long the leader may take to write a reply into a connection's buffer.
const SEND_TIMEOUT: Duration = Duration::from_millis(500);
/// How many refused or lost connections the leader's timeout error lists.
const MAX_NOTES: usize = 8;

const STATUS_ID: u8 = 0;
const STATUS_REFUSED: u8 = 1;
const STATUS_ABANDONED: u8 = 2;
const STATUS_CHALLENGE: u8 = 3;
const STATUS_SEALED: u8 = 4;

/// A task's place in the NCCL communicator of a multi-process run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclRank {
    /// The task's rank: the chief is 0 and the workers follow it in index order (worker `i` is
    /// rank `i` without a chief), as [`ClusterSpec::id_in_cluster`] numbers them.
    pub rank: usize,
    /// How many ranks there are: the chief and the workers.
    pub world_size: usize,
}

impl NcclRank {
    /// Whether this task leads the unique-id exchange (rank 0: the chief, else worker 0), so it
    /// makes the id with `ncclGetUniqueId` and passes it to [`exchange_unique_id`].
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }
}

/// The NCCL rank of task `me` of `cluster` and the number of ranks.
///
/// Fails when `me` is not in the cluster ([`CollectiveError::Device`]) or is a parameter server
/// or an evaluator, which are no ranks ([`CollectiveError::InvalidArgument`]).
pub fn nccl_rank(cluster: &ClusterSpec, me: TaskId) -> Result<NcclRank, CollectiveError> {
    if !matches!(me.task_type, TaskType::Chief | TaskType::Worker) {
        return Err(CollectiveError::InvalidArgument(format!(
            "{me} takes no part in the NCCL unique-id exchange: only the chief and the workers \
             are NCCL ranks"
        )));
    }
    Ok(NcclRank {
        rank: cluster.id_in_cluster(me)?,
        world_size: cluster.worker_count(me.task_type)?,
    })
}

/// Sends the leader's unique id to every other chief and worker task of `cluster`, or receives
/// it: every task calls this with the same cluster spec and gets the leader's id back.
///
/// `id` is `Some` exactly on the leader (see [`NcclRank::is_leader`]) and `None` on every other
/// task; anything else is a [`CollectiveError::InvalidArgument`]. The leader returns once it has
/// sent every task the id, the others once they have it; a cluster of one task returns the id at
/// once, without networking. Within `timeout` (give the leader time to start; one too long to add
/// to the clock, such as [`Duration::MAX`], waits without limit), every task either has the id or
/// fails: [`CollectiveError::BootstrapTimeout`] names the tasks that never joined on the leader,
/// and the leader's address on the others; a task the leader refuses (another cluster spec, a task
/// already joined, no key or the wrong one) gets [`CollectiveError::BootstrapRefused`].
///
/// # Security
///
/// The tasks authenticate each other with the cluster key the launcher gives every chief and
/// worker task: the environment variable `DISTRIBUTE_CLUSTER_KEY` ([`CLUSTER_KEY_VAR`]) holding at
/// least 16 random bytes in hex, made e.g. with `openssl rand -hex 32`, or
/// `DISTRIBUTE_CLUSTER_KEY_FILE` ([`CLUSTER_KEY_FILE_VAR`]) naming a file that holds it. The
/// leader sends the id, encrypted, only to a task that proved it knows the key, and a task accepts
/// an id only from a leader that proved it too: a process on the leader's port is a
/// [`CollectiveError::BootstrapUnauthenticated`]. Where a task's address in the cluster spec is an
/// IP, the leader also refuses a connection from any other IP. Without a key the exchange does not
/// run ([`CollectiveError::BootstrapKey`], saying how to make one; it also reports a key that does
/// not parse), even on one machine, where another user's process could take a task's place; the
/// only way to run without one is the named opt-out `DISTRIBUTE_UNAUTHENTICATED_EXCHANGE=1`
/// ([`ExchangeAuth::Unauthenticated`]: loopback-only clusters, a warning each time).
/// [`exchange_unique_id_with_key`] takes the key as an argument instead.
///
/// ```
/// use std::time::Duration;
///
/// use distribute_collectives::backend::nccl_bootstrap::{UNIQUE_ID_BYTES, exchange_unique_id, nccl_rank};
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
) -> Result<[u8; UNIQUE_ID_BYTES], CollectiveError> {
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
/// use distribute_collectives::backend::nccl_bootstrap::{ClusterKey, exchange_unique_id_with_key};
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
) -> Result<[u8; UNIQUE_ID_BYTES], CollectiveError> {
    exchange(cluster, me, id, Some(key), timeout)
}

/// [`exchange_unique_id`] without authentication, the explicitly named opt-out
/// ([`ExchangeAuth::Unauthenticated`]): any process that reaches the leader first gets the id
/// and takes a task's place, so it logs a warning every time it runs, and a cluster whose
/// addresses are not all loopback refuses it ([`CollectiveError::BootstrapKey`]).
pub fn exchange_unique_id_unauthenticated(
    cluster: &ClusterSpec,
    me: TaskId,
    id: Option<[u8; UNIQUE_ID_BYTES]>,
    timeout: Duration,
) -> Result<[u8; UNIQUE_ID_BYTES], CollectiveError> {
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
) -> Result<[u8; UNIQUE_ID_BYTES], CollectiveError> {
    let rank = nccl_rank(cluster, me)?;
    let roster = Roster::new(cluster);
    let id = match (rank.is_leader(), id) {
        (true, None) => {
            return Err(CollectiveError::InvalidArgument(format!(
                "{me} leads the unique-id exchange of this cluster: pass the id it made with \
                 ncclGetUniqueId"
            )));
        }
        (false, Some(_)) => {
            return Err(CollectiveError::InvalidArgument(format!(
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
    let (host, port) =
        parse_address(leader_address).map_err(|reason| CollectiveError::BootstrapAddress {
            task: roster.leader().to_string(),
            address: leader_address.to_owned(),
            reason,
        })?;
    if let (None, Some((task, address))) = (key, roster.remote_task()) {
        return Err(CollectiveError::BootstrapKey(format!(
            "{me} will not run the exchange across hosts without a cluster key ({task} is at \
             {address}, not loopback), as any host that reaches the leader could take a task's \
             place and join the communicator: give every chief and worker task the same random \
             key in {CLUSTER_KEY_VAR} (hex, at least 32 digits, e.g. from `openssl rand -hex \
             32`), or in a file named by {CLUSTER_KEY_FILE_VAR}"
        )));
    }
    let deadline = Deadline::after(timeout);
    match id {
        Some(id) => lead(&roster, (host, port), id, key, timeout, deadline),
        None => join(&roster, me, (host, port), key, deadline),
    }
}

/// When the exchange gives up: `None` for a timeout too long to add to the clock (no limit).
#[derive(Debug, Clone, Copy)]
struct Deadline(Option<Instant>);

impl Deadline {
    fn after(timeout: Duration) -> Self {
        Self(Instant::now().checked_add(timeout))
    }

    fn passed(&self) -> bool {
        self.0.is_some_and(|deadline| Instant::now() >= deadline)
    }

    /// The time left, `None` without a limit.
    fn left(&self) -> Option<Duration> {
        self.0
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }

    /// A socket timeout for what is left, at least 1 ms (a zero socket timeout is an error);
    /// `None` (block) without a limit.
    fn io_timeout(&self) -> Option<Duration> {
        self.left().map(|left| left.max(Duration::from_millis(1)))
    }
}

/// The ranks of a cluster: its chief and worker tasks in rank order, with their addresses.
struct Roster<'a> {
    ranks: Vec<(TaskId, &'a str)>,
    hash: u64,
}

impl<'a> Roster<'a> {
    fn new(cluster: &'a ClusterSpec) -> Self {
        let ranks: Vec<(TaskId, &str)> = [TaskType::Chief, TaskType::Worker]
            .into_iter()
            .flat_map(|task_type| {
                cluster
                    .tasks(task_type)
                    .iter()
                    .enumerate()
                    .map(move |(index, address)| {
                        (TaskId::new(task_type, index as u32), address.as_str())
                    })
            })
            .collect();
        let mut hash = Fnv::new();
        for (task, address) in &ranks {
            hash.bytes(task.task_type.as_str().as_bytes())
                .bytes(&[0])
                .bytes(address.as_bytes())
                .bytes(&[0]);
        }
        Self {
            ranks,
            hash: hash.0,
        }
    }

    fn leader(&self) -> TaskId {
        self.ranks[0].0
    }

    fn leader_address(&self) -> &'a str {
        self.ranks[0].1
    }

    /// A rank whose host is not loopback (`127.*`, `::1`, `localhost`), with its address: the
    /// exchange then crosses hosts.
    fn remote_task(&self) -> Option<(TaskId, &'a str)> {
        let loopback = |address: &str| match parse_address(address) {
            Ok((host, _)) => match host.parse::<IpAddr>() {
                Ok(ip) => ip.to_canonical().is_loopback(),
                Err(_) => {
                    let host = host.trim_end_matches('.').to_ascii_lowercase();
                    host == "localhost" || host.ends_with(".localhost")
                }
            },
            Err(_) => false,
        };
        self.ranks
            .iter()
            .find(|(_, address)| !loopback(address))
            .copied()
    }

    /// Why `peer` may not be rank `rank`: the cluster spec gives that task another IP.
    fn check_peer(&self, rank: usize, peer: SocketAddr) -> Result<(), String> {
        let (task, address) = self.ranks[rank];
        let Ok((host, _)) = parse_address(address) else {
            return Ok(());
        };
        match host.parse::<IpAddr>() {
            Ok(ip) if !ip.is_unspecified() && ip.to_canonical() != peer.ip().to_canonical() => {
                Err(format!(
                    "it connects from {}, but {task}'s address in the cluster spec is {address}",
                    peer.ip()
                ))
            }
            // A name may resolve to many addresses, or to none of the peer's own.
            _ => Ok(()),
        }
    }

    fn rank_of(&self, task: TaskId) -> Option<usize> {
        self.ranks.iter().position(|(t, _)| *t == task)
    }

    /// The rank of the task saying `hello` to the leader, or why it may not join.
    fn admit(&self, hello: &Hello) -> Result<usize, String> {
        if hello.world_size as usize != self.ranks.len() {
            return Err(format!(
                "its cluster spec has {} chief and worker tasks, the leader's has {}",
                hello.world_size,
                self.ranks.len()
            ));
        }
        if hello.cluster_hash != self.hash {
            return Err(format!(
                "its cluster spec differs from the leader's (the same {} chief and worker \
                 tasks, but other addresses or another chief)",
                self.ranks.len()
            ));
        }
        match self.rank_of(hello.task) {
            None => Err(format!(
                "{} is not a chief or worker task of the leader's cluster",
                hello.task
            )),
            Some(0) => Err(format!(
                "{} is the leader itself: two processes claim to lead",
                hello.task
            )),
            Some(rank) => Ok(rank),
        }
    }
}

/// What a task sends the leader when it connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    task: TaskId,
    world_size: u32,
    cluster_hash: u64,
    /// Whether the task has a cluster key, so the leader must challenge it.
    keyed: bool,
    /// The task's fresh random bytes for the handshake (zeros without a key).
    nonce: Nonce,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
        let task_type = match self.task.task_type {
            TaskType::Chief => 0,
            TaskType::Worker => 1,
            TaskType::Ps => 2,
            TaskType::Evaluator => 3,
        };
        let mut bytes = [0; HELLO_LEN];
        let mut out = &mut bytes[..];
        for field in [
            &MAGIC[..],
            &VERSION.to_be_bytes(),
            &[task_type],
            &self.task.index.to_be_bytes(),
            &self.world_size.to_be_bytes(),
            &self.cluster_hash.to_be_bytes(),
            &[u8::from(self.keyed)],
            &self.nonce,
        ] {
            let (head, rest) = out.split_at_mut(field.len());
            head.copy_from_slice(field);
            out = rest;
        }
        bytes
    }

    fn decode(bytes: &[u8; HELLO_LEN]) -> Result<Self, String> {
        check_header(bytes, "hello")?;
        let task_type = match bytes[HEADER_LEN] {
            0 => TaskType::Chief,
            1 => TaskType::Worker,
            2 => TaskType::Ps,
            3 => TaskType::Evaluator,
            other => return Err(format!("its hello has an unknown task type {other}")),
        };
        let u32_at = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
        let keyed = match bytes[HEADER_LEN + 17] {
            0 => false,
            1 => true,
            other => return Err(format!("its hello has an unknown key scheme {other}")),
        };
        Ok(Self {
            task: TaskId::new(task_type, u32_at(HEADER_LEN + 1)),
            world_size: u32_at(HEADER_LEN + 5),
            cluster_hash: u64::from_be_bytes(
                bytes[HEADER_LEN + 9..HEADER_LEN + 17].try_into().unwrap(),
            ),
            keyed,
            nonce: bytes[HEADER_LEN + 18..].try_into().unwrap(),
        })
    }
}

/// Checks as much of the magic and the version as `prefix` holds, so garbage is refused early.
fn check_header(prefix: &[u8], what: &str) -> Result<(), String> {
    let magic = &prefix[..prefix.len().min(MAGIC.len())];
    if magic != &MAGIC[..magic.len()] {
        return Err(format!(
            "it speaks another protocol: its {what} starts with {:?}, not {:?}",
            String::from_utf8_lossy(magic),
            String::from_utf8_lossy(&MAGIC),
        ));
    }
    if let Some(version) = prefix.get(MAGIC.len()..HEADER_LEN) {
        let version = u16::from_be_bytes([version[0], version[1]]);
        if version != VERSION {
            return Err(format!(
                "it speaks version {version} of the unique-id exchange, this task {VERSION}"
            ));
        }
    }
    Ok(())
}

/// What the leader answers a hello.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    /// Every rank joined: the unique id, in clear (no cluster key).
    Id([u8; UNIQUE_ID_BYTES]),
    /// Every rank joined: the unique id sealed for this connection (see [`Session::seal`]).
    Sealed([u8; SEALED_BYTES]),
    /// The leader's nonce and its proof of the cluster key, asking for the task's proof.
    Challenge { nonce: Nonce, proof: Proof },
    /// This task may not join, and why.
    Refused(String),
    /// The leader gave up: the tasks that never joined.
    Abandoned(Vec<String>),
}

impl Reply {
    fn encode(&self) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&VERSION.to_be_bytes());
        let message = match self {
            Self::Id(id) => {
                bytes.push(STATUS_ID);
                bytes.extend_from_slice(id);
                return bytes;
            }
            Self::Sealed(sealed) => {
                bytes.push(STATUS_SEALED);
                bytes.extend_from_slice(sealed);
                return bytes;
            }
            Self::Challenge { nonce, proof } => {
                bytes.push(STATUS_CHALLENGE);
                bytes.extend_from_slice(nonce);
                bytes.extend_from_slice(proof);
                return bytes;
            }
            Self::Refused(reason) => {
                bytes.push(STATUS_REFUSED);
                reason.clone()
            }
            Self::Abandoned(missing) => {
                bytes.push(STATUS_ABANDONED);
                missing.join(",")
            }
        };
        let mut end = message.len().min(MAX_MESSAGE);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        bytes.extend_from_slice(&(end as u16).to_be_bytes());
        bytes.extend_from_slice(&message.as_bytes()[..end]);
        bytes
    }

    fn read(from: &mut impl Read) -> Result<Self, WireError> {
        let mut header = [0; HEADER_LEN + 1];
        read_exact(from, &mut header)?;
        check_header(&header, "reply").map_err(WireError::Garbage)?;
        let status = header[HEADER_LEN];
        match status {
            STATUS_ID => {
                let mut id = [0; UNIQUE_ID_BYTES];
                read_exact(from, &mut id)?;
                return Ok(Self::Id(id));
            }
            STATUS_SEALED => {
                let mut sealed = [0; SEALED_BYTES];
                read_exact(from, &mut sealed)?;
                return Ok(Self::Sealed(sealed));
            }
            STATUS_CHALLENGE => {
                let (mut nonce, mut proof) = ([0; NONCE_BYTES], [0; PROOF_BYTES]);
                read_exact(from, &mut nonce)?;
                read_exact(from, &mut proof)?;
                return Ok(Self::Challenge { nonce, proof });
            }
            _ => {}
        }
        let mut len = [0; 2];
        read_exact(from, &mut len)?;
        let len = usize::from(u16::from_be_bytes(len));
        if len > MAX_MESSAGE {
            return Err(WireError::Garbage(format!(
                "its reply announces a message of {len} bytes, more than {MAX_MESSAGE}"
            )));
        }
        let mut message = vec![0; len];
        read_exact(from, &mut message)?;
        let message = String::from_utf8_lossy(&message).into_owned();
        match status {
            STATUS_REFUSED => Ok(Self::Refused(message)),
            STATUS_ABANDONED => Ok(Self::Abandoned(
                message
                    .split(',')
                    .filter(|task| !task.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )),
            other => Err(WireError::Garbage(format!(
                "its reply has an unknown status {other}"
            ))),
        }
    }
}

/// Why a reply could not be read.
#[derive(Debug)]
enum WireError {
    /// The read timeout passed.
    Timeout,
    /// The peer closed the connection or reset it.
    Closed(String),
    /// Bytes that are not this protocol.
    Garbage(String),
}

fn read_exact(from: &mut impl Read, buf: &mut [u8]) -> Result<(), WireError> {
    from.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => WireError::Timeout,
        ErrorKind::UnexpectedEof => {
            WireError::Closed("it closed the connection before sending the id".into())
        }
        _ => WireError::Closed(format!("reading its reply failed: {e}")),
    })
}

/// `host:port` of a cluster spec, IPv6 hosts in brackets; the port must not be 0.
fn parse_address(address: &str) -> Result<(&str, u16), String> {
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| "is not host:port".to_owned())?;
    let host = match host.strip_prefix('[') {
        Some(bracketed) => bracketed
            .strip_suffix(']')
            .ok_or_else(|| "has an unclosed '[' in its host".to_owned())?,
        None if host.contains(':') => {
            return Err("has an IPv6 host without brackets: write it as [host]:port".into());
        }
        None => host,
    };
    if host.is_empty() {
        return Err("has no host".into());
    }
    match port.parse::<u16>() {
        Ok(port) if port != 0 => Ok((host, port)),
        _ => Err(format!(
            "has port '{port}', which is not a number from 1 to 65535"
        )),
    }
}

/// A connection the leader has not admitted yet: it reads the hello, then (with a key) the proof.
struct Pending<'k> {
    stream: TcpStream,
    peer: SocketAddr,
    /// What has arrived of the message this stage waits for.
    received: Vec<u8>,
    /// When the connection was accepted: the whole handshake has [`HANDSHAKE_TIMEOUT`].
    since: Instant,
    stage: Stage<'k>,
}

/// What the leader waits for on a pending connection.
enum Stage<'k> {
    Hello,
    /// The task's proof of the key, after the leader's challenge.
    Proof {
        hello: Hello,
        rank: usize,
        session: Session<'k>,
    },
}

impl Stage<'_> {
    fn wants(&self) -> (usize, &'static str) {
        match self {
            Self::Hello => (HELLO_LEN, "a hello"),
            Self::Proof { .. } => (PROOF_BYTES, "a proof of the cluster key"),
        }
    }
}

impl Pending<'_> {
    /// Reads what has arrived: `None` while this stage's message is incomplete, else the message
    /// or why the connection is dropped.
    fn poll(&mut self) -> Option<Result<Vec<u8>, String>> {
        let (len, what) = self.stage.wants();
        let mut chunk = [0; HELLO_LEN];
        loop {
            let want = len - self.received.len();
            match self.stream.read(&mut chunk[..want]) {
                Ok(0) => {
                    return Some(Err(format!(
                        "it closed the connection after {} of the {len} bytes of {what}",
                        self.received.len()
                    )));
                }
                Ok(n) => {
                    self.received.extend_from_slice(&chunk[..n]);
                    if matches!(self.stage, Stage::Hello)
                        && let Err(reason) = check_header(&self.received, "hello")
                    {
                        return Some(Err(reason));
                    }
                    if self.received.len() == len {
                        return Some(Ok(std::mem::take(&mut self.received)));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return (self.since.elapsed() >= HANDSHAKE_TIMEOUT).then(|| {
                        Err(format!(
                            "it sent {} of the {len} bytes of {what} in {HANDSHAKE_TIMEOUT:?}",
                            self.received.len()
                        ))
                    });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(format!("reading {what} failed: {e}"))),
            }
        }
    }
}

/// A task that has joined the leader and waits for the id.
struct Joined<'k> {
    stream: TcpStream,
    peer: SocketAddr,
    /// Its handshake, which seals the id; `None` without a key.
    session: Option<Session<'k>>,
}

impl Joined<'_> {
    /// Whether the connection is still open (the task may have given up and restarted).
    fn is_open(&self) -> bool {
        match self.stream.peek(&mut [0]) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e.kind() == ErrorKind::WouldBlock,
        }
    }
}

/// Writes `reply`; the stream may be non-blocking.
fn write_reply(stream: &mut TcpStream, reply: &Reply) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(SEND_TIMEOUT))?;
    stream.write_all(&reply.encode())?;
    stream.flush()
}

/// Writes `reply` and closes the sending side.
fn send(stream: &mut TcpStream, reply: &Reply) -> io::Result<()> {
    write_reply(stream, reply)?;
    // The reply is out; a peer that already closed is not this side's failure.
    let _ = stream.shutdown(Shutdown::Write);
    Ok(())
}

/// The connections the leader refused or lost, for its timeout error.
#[derive(Default)]
struct Notes {
    kept: Vec<String>,
    more: usize,
}

impl Notes {
    fn push(&mut self, note: String) {
        if self.kept.len() < MAX_NOTES {
            self.kept.push(note);
        } else {
            self.more += 1;
        }
    }
}

impl fmt::Display for Notes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kept.is_empty() {
            return Ok(());
        }
        write!(f, " (meanwhile: {}", self.kept.join("; "))?;
        if self.more > 0 {
            write!(f, "; and {} more", self.more)?;
        }
        f.write_str(")")
    }
}

/// Tells a connection why it may not join, best effort (a peer that sent garbage may not read
/// it), and notes it for the leader's timeout error.
fn refuse(
    notes: &mut Notes,
    me: TaskId,
    mut stream: TcpStream,
    peer: SocketAddr,
    claimed: Option<TaskId>,
    reason: String,
) {
    let who = match claimed {
        Some(task) => format!("{task} from {peer}"),
        None => peer.to_string(),
    };
    log::warn!("unique-id exchange: {me} refused {who}: {reason}");
    let _ = send(&mut stream, &Reply::Refused(reason.clone()));
    notes.push(format!("refused {who}: {reason}"));
}

/// Binds the leader's `host:port`: that IP, or every address the name resolves to that is this
/// machine's (never every interface).
fn bind(host: &str, port: u16) -> Result<Vec<TcpListener>, String> {
    let mut addresses: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("does not resolve: {e}"))?
            .collect(),
    };
    // A resolver may name an address twice, which would then be "in use" by this very leader.
    let mut seen = Vec::new();
    addresses.retain(|address| {
        let first = !seen.contains(address);
        seen.push(*address);
        first
    });
    let mut listeners = Vec::new();
    let mut not_here = Vec::new();
    for address in addresses {
        let bound = TcpListener::bind(address)
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener));
        match bound {
            Ok(listener) => listeners.push(listener),
            // A name may also resolve to an address this machine lacks (::1 without IPv6).
            Err(e) if e.kind() == ErrorKind::AddrNotAvailable => {
                not_here.push(format!("cannot be bound as {address}: {e}"));
            }
            Err(e) => {
                let hint = match e.kind() {
                    ErrorKind::AddrInUse => " (another process listens on that port)",
                    _ => "",
                };
                return Err(format!("cannot be bound as {address}: {e}{hint}"));
            }
        }
    }
    if listeners.is_empty() {
        return Err(if not_here.is_empty() {
            "resolves to no address".to_owned()
        } else {
            format!(
                "{} (the address is not this machine's)",
                not_here.join("; ")
            )
        });
    }
    Ok(listeners)
}

/// Where a pending connection goes once its message arrived.
enum Step<'k> {
    /// It may join: its stream, its peer, its hello, its rank and its handshake (with a key).
    Join((TcpStream, SocketAddr, Hello, usize, Option<Session<'k>>)),
    /// It was challenged and owes its proof.
    Wait(Pending<'k>),
    /// It may not join, and why.
    Refuse {
        stream: TcpStream,
        peer: SocketAddr,
        claimed: Option<TaskId>,
        reason: String,
    },
}

/// Takes a pending connection one step on with the message it sent (or why it failed).
fn advance<'k>(
    roster: &Roster<'_>,
    key: Option<&'k ClusterKey>,
    pending: Pending<'k>,
    message: Result<Vec<u8>, String>,
) -> Step<'k> {
    let Pending {
        mut stream,
        peer,
        since,
        stage,
        ..
    } = pending;
    let claimed = match &stage {
        Stage::Proof { hello, .. } => Some(hello.task),
        Stage::Hello => None,
    };
    let message = match message {
        Ok(message) => message,
        Err(reason) => {
            return Step::Refuse {
                stream,
                peer,
                claimed,
                reason,
            };
        }
    };
    match stage {
        Stage::Hello => {
            let hello_bytes: [u8; HELLO_LEN] = match message.as_slice().try_into() {
                Ok(bytes) => bytes,
                Err(_) => {
                    let reason = format!("its hello has {} bytes, not {HELLO_LEN}", message.len());
                    return Step::Refuse {
                        stream,
                        peer,
                        claimed,
                        reason,
                    };
                }
            };
            let hello = match Hello::decode(&hello_bytes) {
                Ok(hello) => hello,
                Err(reason) => {
                    return Step::Refuse {
                        stream,
                        peer,
                        claimed,
                        reason,
                    };
                }
            };
            let admitted = roster
                .admit(&hello)
                .and_then(|rank| roster.check_peer(rank, peer).map(|()| rank))
                .and_then(|rank| check_keys(key.is_some(), hello.keyed).map(|()| rank));
            let rank = match admitted {
                Ok(rank) => rank,
                Err(reason) => {
                    return Step::Refuse {
                        stream,
                        peer,
                        claimed: Some(hello.task),
                        reason,
                    };
                }
            };
            let Some(key) = key else {
                return Step::Join((stream, peer, hello, rank, None));
            };
            // With a key, the task joins only once it proves it knows the key.
            let challenge = nonce().and_then(|nonce| {
                let session = Session::new(key, &hello_bytes, &nonce);
                let proof = session.leader_proof();
                write_reply(&mut stream, &Reply::Challenge { nonce, proof })
                    .and_then(|()| stream.set_nonblocking(true))
                    .map_err(|e| format!("sending the challenge failed: {e}"))
                    .map(|()| session)
            });
            match challenge {
                Ok(session) => Step::Wait(Pending {
                    stream,
                    peer,
                    received: Vec::with_capacity(PROOF_BYTES),
                    since,
                    stage: Stage::Proof {
                        hello,
                        rank,
                        session,
                    },
                }),
                Err(reason) => Step::Refuse {
                    stream,
                    peer,
                    claimed: Some(hello.task),
                    reason,
                },
            }
        }
        Stage::Proof {
            hello,
            rank,
            session,
        } => {
            if session.is_client_proof(&message) {
                Step::Join((stream, peer, hello, rank, Some(session)))
            } else {
                Step::Refuse {
                    stream,
                    peer,
                    claimed,
                    reason: "it did not prove it knows the cluster key (it has another key)".into(),
                }
            }
        }
    }
}

/// The leader's side: waits for every other rank to join, then sends each the id.
fn lead(
    roster: &Roster<'_>,
    (host, port): (&str, u16),
    id: [u8; UNIQUE_ID_BYTES],
    key: Option<&ClusterKey>,
    timeout: Duration,
    deadline: Deadline,
) -> Result<[u8; UNIQUE_ID_BYTES], CollectiveError> {
    let me = roster.leader();
    let address = roster.leader_address();
    let listeners = bind(host, port).map_err(|reason| CollectiveError::BootstrapAddress {
        task: me.to_string(),
        address: address.to_owned(),
        reason,
    })?;
    log::debug!(
        "unique-id exchange: {me} listens on {:?} for {} tasks",
        listeners
            .iter()
            .filter_map(|listener| listener.local_addr().ok())
            .collect::<Vec<_>>(),
        roster.ranks.len() - 1
    );

    let mut joined: Vec<Option<Joined<'_>>> = roster.ranks.iter().map(|_| None).collect();
    let mut pending: Vec<Pending<'_>> = Vec::new();
    let mut notes = Notes::default();
    loop {
        let mut progressed = false;
        for listener in &listeners {
            loop {
                match listener.accept() {
                    Ok((stream, peer)) => {
                        progressed = true;
                        match stream.set_nonblocking(true) {
                            Ok(()) => pending.push(Pending {
                                stream,
                                peer,
                                received: Vec::with_capacity(HELLO_LEN),
                                since: Instant::now(),
                                stage: Stage::Hello,
                            }),
                            Err(e) => notes.push(format!("dropped {peer}: {e}")),
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    // Out of file descriptors, say: try again after the pause.
                    Err(e) => {
                        log::warn!("unique-id exchange: {me} failed to accept a connection: {e}");
                        break;
                    }
                }
            }
        }
        let mut i = 0;
        while i < pending.len() {
            let Some(outcome) = pending[i].poll() else {
                i += 1;
                continue;
            };
            progressed = true;
            let (stream, peer, hello, rank, session) =
                match advance(roster, key, pending.swap_remove(i), outcome) {
                    Step::Join(joining) => joining,
                    Step::Wait(next) => {
                        pending.push(next);
                        continue;
                    }
                    Step::Refuse {
                        stream,
                        peer,
                        claimed,
                        reason,
                    } => {
                        refuse(&mut notes, me, stream, peer, claimed, reason);
                        continue;
                    }
                };
            match &joined[rank] {
                Some(first) if first.is_open() => {
                    let reason = format!("{} already joined from {}", hello.task, first.peer);
                    refuse(&mut notes, me, stream, peer, Some(hello.task), reason);
                }
                _ => {
                    log::debug!("unique-id exchange: {} joined from {peer}", hello.task);
                    joined[rank] = Some(Joined {
                        stream,
                        peer,
                        session,
                    });
                }
            }
        }

        let complete = joined.iter().skip(1).all(Option::is_some);
        let passed = deadline.passed();
        if complete || passed {
            // A task that gave up (its timeout may be shorter) is missing again; it may come back.
            for ((task, _), slot) in roster.ranks.iter().zip(&mut joined) {
                if slot.as_ref().is_some_and(|joined| !joined.is_open())
                    && let Some(Joined { peer, .. }) = slot.take()
                {
                    log::warn!(
                        "unique-id exchange: {task} from {peer} left before the id was sent"
                    );
                    notes.push(format!(
                        "{task} from {peer} closed its connection before the id was sent"
                    ));
                }
            }
            if complete && joined.iter().skip(1).all(Option::is_some) {
                break;
            }
        }
        if passed {
            let missing: Vec<String> = roster
                .ranks
                .iter()
                .zip(&joined)
                .skip(1)
                .filter(|(_, joined)| joined.is_none())
                .map(|((task, _), _)| task.to_string())
                .collect();
            for joined in joined.iter_mut().flatten() {
                // Best effort: it fails on its own timeout if this does not reach it.
                let _ = send(&mut joined.stream, &Reply::Abandoned(missing.clone()));
            }
            return Err(CollectiveError::BootstrapTimeout {
                task: me.to_string(),
                waited: timeout,
                waiting_for: format!(
                    "tasks [{}] to join it at {address}{notes}",
                    missing.join(", ")
                ),
                missing,
            });
        }
        if !progressed {
            thread::sleep(POLL_PAUSE.min(deadline.left().unwrap_or(POLL_PAUSE)));
        }
    }

    let mut failed = Vec::new();
    for ((task, _), joined) in roster.ranks.iter().zip(&mut joined).skip(1) {
        let Some(joined) = joined else { continue };
        let reply = match &joined.session {
            Some(session) => Reply::Sealed(session.seal(&id)),
            None => Reply::Id(id),
        };
        if let Err(e) = send(&mut joined.stream, &reply) {
            failed.push(format!("{task} at {}: {e}", joined.peer));
        }
    }
    if failed.is_empty() {
        Ok(id)
    } else {
        Err(CollectiveError::BootstrapProtocol {
            task: me.to_string(),
            peer: failed.join("; "),
            reason: "sending the id failed, so that task will not join the communicator".into(),
        })
    }
}

/// Why a task with a key (`task_keyed`) or without may not join a leader with one or without.
fn check_keys(leader_keyed: bool, task_keyed: bool) -> Result<(), String> {
    match (leader_keyed, task_keyed) {
        (true, false) => Err(format!(
            "the leader authenticates its tasks and this one has no cluster key: give every chief \
             and worker task the same key in {CLUSTER_KEY_VAR} or {CLUSTER_KEY_FILE_VAR}"
        )),
        (false, true) => Err(format!(
            "this task has a cluster key and the leader has none: give every chief and worker \
             task the same key in {CLUSTER_KEY_VAR} or {CLUSTER_KEY_FILE_VAR}"
        )),
        _ => Ok(()),
    }
}

/// A non-leader's side: connects to the leader, says hello, proves itself with a key and waits
/// for the id.
fn join(
    roster: &Roster<'_>,
    me: TaskId,
    (host, port): (&str, u16),
    key: Option<&ClusterKey>,
    deadline: Deadline,
) -> Result<[u8; UNIQUE_ID_BYTES], CollectiveError> {
    let start = Instant::now();
    let leader = roster.leader();
    let address = roster.leader_address();
    let waited = || Duration::from_millis(start.elapsed().as_millis() as u64);
    let timed_out = |missing: Vec<String>, waiting_for: String| CollectiveError::BootstrapTimeout {
        task: me.to_string(),
        waited: waited(),
        missing,
        waiting_for,
    };
    let the_leader = format!("the leader {leader} at {address}");
    let broken = |reason: String| CollectiveError::BootstrapProtocol {
        task: me.to_string(),
        peer: the_leader.clone(),
        reason,
    };
    let untrusted = |reason: String| CollectiveError::BootstrapUnauthenticated {
        task: me.to_string(),
        peer: the_leader.clone(),
        reason,
    };
    let refused = |reason: String| CollectiveError::BootstrapRefused {
        task: me.to_string(),
        leader: leader.to_string(),
        address: address.to_owned(),
        reason,
    };
    let nonce = match key {
        Some(_) => nonce().map_err(&broken)?,
        None => [0; NONCE_BYTES],
    };
    let hello = Hello {
        task: me,
        world_size: roster.ranks.len() as u32,
        cluster_hash: roster.hash,
        keyed: key.is_some(),
        nonce,
    }
    .encode();
    let mut stream = connect(host, port, deadline).map_err(|last_error| {
        timed_out(
            vec![leader.to_string()],
            format!("{the_leader} to accept a connection (last error: {last_error})"),
        )
    })?;
    let no_reply = || {
        timed_out(
            Vec::new(),
            format!(
                "the id from {the_leader}, which took the hello but still waits for other tasks"
            ),
        )
    };
    let sent = |e: io::Error, what: &str| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => no_reply(),
        _ => broken(format!("sending {what} failed: {e}")),
    };
    // Nagle would hold the hello back for nothing; failing to turn it off only costs latency.
    let _ = stream.set_nodelay(true);
    stream
        .set_write_timeout(deadline.io_timeout())
        .and_then(|()| stream.write_all(&hello))
        .and_then(|()| stream.flush())
        .map_err(|e| sent(e, "the hello"))?;
    stream
        .set_read_timeout(deadline.io_timeout())
        .map_err(|e| broken(format!("setting a read timeout failed: {e}")))?;
    let read_reply = |stream: &mut TcpStream| {
        // The read timeout shrinks with the time left.
        stream
            .set_read_timeout(deadline.io_timeout())
            .map_err(|e| broken(format!("setting a read timeout failed: {e}")))?;
        match Reply::read(stream) {
            Ok(reply) => Ok(reply),
            Err(WireError::Timeout) => Err(no_reply()),
            Err(WireError::Closed(reason) | WireError::Garbage(reason)) => Err(broken(reason)),
        }
    };
    let abandoned = |missing: Vec<String>| {
        timed_out(
            missing.clone(),
            format!(
                "tasks [{}] to join {the_leader}, which then gave up",
                missing.join(", ")
            ),
        )
    };

    let Some(key) = key else {
        return match read_reply(&mut stream)? {
            Reply::Id(id) => Ok(id),
            Reply::Refused(reason) => Err(refused(reason)),
            Reply::Abandoned(missing) => Err(abandoned(missing)),
            Reply::Challenge { .. } | Reply::Sealed(_) => Err(refused(format!(
                "the leader authenticates its tasks and this one has no cluster key: give every \
                 chief and worker task the same key in {CLUSTER_KEY_VAR} or \
                 {CLUSTER_KEY_FILE_VAR}"
            ))),
        };
    };
    let session = match read_reply(&mut stream)? {
        Reply::Challenge { nonce, proof } => {
            let session = Session::new(key, &hello, &nonce);
            if !session.is_leader_proof(&proof) {
                return Err(untrusted(
                    "it did not prove it knows the cluster key: another process holds the \
                     leader's port, or the leader has another key"
                        .into(),
                ));
            }
            session
        }
        Reply::Id(_) | Reply::Sealed(_) => {
            return Err(untrusted(
                "it sent an id without proving it knows the cluster key (the id is ignored): \
                 another process holds the leader's port, or the leader runs without a key"
                    .into(),
            ));
        }
        // Not authenticated, but a process on the port could as well close the connection.
        Reply::Refused(reason) => {
            return Err(refused(format!(
                "{reason} (said before the leader proved it knows the cluster key)"
            )));
        }
        Reply::Abandoned(missing) => return Err(abandoned(missing)),
    };
    stream
        .set_write_timeout(deadline.io_timeout())
        .and_then(|()| stream.write_all(&session.client_proof()))
        .and_then(|()| stream.flush())
        .map_err(|e| sent(e, "the proof of the cluster key"))?;
    match read_reply(&mut stream)? {
        Reply::Sealed(sealed) => session.open(&sealed).ok_or_else(|| {
            untrusted("the sealed id does not verify: it was altered on the way".into())
        }),
        Reply::Refused(reason) => Err(refused(reason)),
        Reply::Abandoned(missing) => Err(abandoned(missing)),
        Reply::Id(_) | Reply::Challenge { .. } => Err(broken(
            "it answered the proof with neither a sealed id nor a refusal".into(),
        )),
    }
}

/// Connects to `host:port`, retrying with growing pauses until `deadline`; the last error when
/// it passes.
fn connect(host: &str, port: u16, deadline: Deadline) -> Result<TcpStream, String> {
    let mut last_error = "the timeout passed before the first attempt".to_owned();
    let mut pause = Duration::from_millis(10);
    loop {
        match (host, port).to_socket_addrs() {
            Ok(addrs) => {
                for addr in addrs {
                    let left = deadline.left().unwrap_or(CONNECT_TIMEOUT);
                    if left.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&addr, left.min(CONNECT_TIMEOUT)) {
                        Ok(stream) => return Ok(stream),
                        Err(e) => last_error = format!("{addr}: {e}"),
                    }
                }
            }
            Err(e) => last_error = format!("'{host}' does not resolve: {e}"),
        }
        let left = deadline.left().unwrap_or(MAX_RETRY_PAUSE);
        if left.is_zero() {
            return Err(last_error);
        }
        thread::sleep(pause.min(left));
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(json: &str) -> ClusterSpec {
        ClusterSpec::from_json(json).unwrap()
    }

    #[test]
    fn ranks_follow_id_in_cluster() {
        for json in [
            r#"{"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]}"#,
            r#"{"worker": ["w0:1", "w1:1", "w2:1"], "evaluator": ["e:1"]}"#,
        ] {
            let cluster = cluster(json);
            let roster = Roster::new(&cluster);
            for (rank, (task, address)) in roster.ranks.iter().enumerate() {
                assert_eq!(cluster.id_in_cluster(*task).unwrap(), rank);
                assert_eq!(cluster.tasks(task.task_type)[task.index as usize], *address);
                let nccl = nccl_rank(&cluster, *task).unwrap();
                assert_eq!(nccl.rank, rank);
                assert_eq!(nccl.world_size, roster.ranks.len());
                assert_eq!(nccl.is_leader(), rank == 0);
            }
            let leader = roster.leader();
            assert_eq!(
                cluster.collective_leader(leader).unwrap(),
                format!("/job:{}/replica:0/task:{}", leader.task_type, leader.index)
            );
        }
    }

    #[test]
    fn ps_and_evaluator_are_no_ranks() {
        let cluster = cluster(r#"{"worker": ["w0:1"], "ps": ["p:1"], "evaluator": ["e:1"]}"#);
        for task_type in [TaskType::Ps, TaskType::Evaluator] {
            let error = nccl_rank(&cluster, TaskId::new(task_type, 0)).unwrap_err();
            let only = matches!(&error, CollectiveError::InvalidArgument(m) if m.contains("only"));
            assert!(only, "{error}");
        }
    }

    #[test]
    fn the_cluster_hash_covers_the_ranks_addresses_in_order() {
        let hash = |json| Roster::new(&cluster(json)).hash;
        let base = hash(r#"{"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}"#);
        assert_eq!(
            base,
            hash(r#"{"worker": ["w0:1", "w1:1"], "chief": ["c:1"], "ps": ["p:1"]}"#)
        );
        for other in [
            r#"{"chief": ["c:1"], "worker": ["w1:1", "w0:1"]}"#,
            r#"{"chief": ["c:2"], "worker": ["w0:1", "w1:1"]}"#,
            r#"{"worker": ["c:1", "w0:1", "w1:1"]}"#,
        ] {
            assert_ne!(base, hash(other), "{other}");
        }
    }

    #[test]
    fn hellos_round_trip() {
        for task in [
            TaskId::new(TaskType::Chief, 0),
            TaskId::new(TaskType::Worker, 70_000),
            TaskId::new(TaskType::Ps, 1),
            TaskId::new(TaskType::Evaluator, 0),
        ] {
            let hello = Hello {
                task,
                world_size: 5,
                cluster_hash: 0x0123_4567_89ab_cdef,
                keyed: task.index == 0,
                nonce: std::array::from_fn(|i| i as u8),
            };
            let bytes = hello.encode();
            assert_eq!(&bytes[..8], b"dst-uid\0");
            assert_eq!(Hello::decode(&bytes), Ok(hello));
        }
    }

    #[test]
    fn bad_hellos_are_refused_with_a_reason() {
        let good = Hello {
            task: TaskId::new(TaskType::Worker, 1),
            world_size: 2,
            cluster_hash: 7,
            keyed: true,
            nonce: [0; NONCE_BYTES],
        }
        .encode();
        let mut bad_magic = good;
        bad_magic[0] = b'G';
        let mut bad_version = good;
        bad_version[9] = 1;
        let mut bad_type = good;
        bad_type[HEADER_LEN] = 9;
        let mut bad_scheme = good;
        bad_scheme[HEADER_LEN + 17] = 2;
        for (bytes, expected) in [
            (bad_magic, "another protocol"),
            (bad_version, "version 1"),
            (bad_type, "unknown task type 9"),
            (bad_scheme, "unknown key scheme 2"),
        ] {
            let error = Hello::decode(&bytes).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
        // Garbage is caught from its first bytes, a version from its first ten.
        assert!(check_header(b"GET", "hello").is_err());
        assert!(check_header(b"dst", "hello").is_ok());
        assert!(check_header(&bad_version[..HEADER_LEN], "hello").is_err());
    }

    #[test]
    fn the_leader_admits_only_its_own_ranks() {
        let cluster = cluster(r#"{"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}"#);
        let roster = Roster::new(&cluster);
        let hello = |task_type, index, world_size, cluster_hash| Hello {
            task: TaskId::new(task_type, index),
            world_size,
            cluster_hash,
            keyed: false,
            nonce: [0; NONCE_BYTES],
        };
        let hash = roster.hash;
        assert_eq!(roster.admit(&hello(TaskType::Worker, 1, 3, hash)), Ok(2));
        for (hello, expected) in [
            (
                hello(TaskType::Worker, 1, 4, hash),
                "has 4 chief and worker tasks, the leader's has 3",
            ),
            (
                hello(TaskType::Worker, 1, 3, hash ^ 1),
                "differs from the leader's",
            ),
            (
                hello(TaskType::Worker, 2, 3, hash),
                "worker:2 is not a chief or worker task",
            ),
            (
                hello(TaskType::Ps, 0, 3, hash),
                "ps:0 is not a chief or worker task",
            ),
            (
                hello(TaskType::Chief, 0, 3, hash),
                "chief:0 is the leader itself",
            ),
        ] {
            let error = roster.admit(&hello).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn replies_round_trip() {
        for reply in [
            Reply::Id(std::array::from_fn(|i| i as u8)),
            Reply::Sealed(std::array::from_fn(|i| (i * 3) as u8)),
            Reply::Challenge {
                nonce: [1; NONCE_BYTES],
                proof: [2; PROOF_BYTES],
            },
            Reply::Refused("no".into()),
            Reply::Refused(String::new()),
            Reply::Abandoned(vec!["worker:1".into(), "worker:3".into()]),
            Reply::Abandoned(Vec::new()),
        ] {
            let bytes = reply.encode();
            assert_eq!(Reply::read(&mut bytes.as_slice()).unwrap(), reply);
        }
    }

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let reply = Reply::Refused("é".repeat(MAX_MESSAGE));
        let Reply::Refused(message) = Reply::read(&mut reply.encode().as_slice()).unwrap() else {
            panic!("not a refusal");
        };
        assert_eq!(message, "é".repeat(MAX_MESSAGE / 2));
    }

    #[test]
    fn bad_replies_are_errors() {
        let id = Reply::Id([1; UNIQUE_ID_BYTES]).encode();
        let mut unknown_status = Reply::Refused("x".into()).encode();
        unknown_status[HEADER_LEN] = 9;
        let mut too_long = Reply::Refused(String::new()).encode();
        too_long[HEADER_LEN + 1..].copy_from_slice(&2000u16.to_be_bytes());
        for (bytes, expected) in [
            (&b"HTTP/1.1 400 Bad Request\r\n\r\n"[..], "another protocol"),
            (&id[..20], "closed the connection"),
            (&unknown_status[..], "unknown status 9"),
            (&too_long[..], "2000 bytes"),
        ] {
            let error = match Reply::read(&mut &bytes[..]) {
                Err(WireError::Garbage(e) | WireError::Closed(e)) => e,
                other => panic!("{other:?}"),
            };
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn addresses_parse_as_host_and_port() {
        assert_eq!(parse_address("10.0.0.1:2222"), Ok(("10.0.0.1", 2222)));
        assert_eq!(parse_address("worker-0.svc:80"), Ok(("worker-0.svc", 80)));
        assert_eq!(parse_address("[::1]:2222"), Ok(("::1", 2222)));
        for (address, expected) in [
            ("localhost", "is not host:port"),
            (":2222", "has no host"),
            ("[]:2222", "has no host"),
            ("::1:2222", "without brackets"),
            ("[::1:2222", "unclosed"),
            ("host:http", "port 'http'"),
            ("host:0", "port '0'"),
            ("host:65536", "port '65536'"),
        ] {
            let error = parse_address(address).unwrap_err();
            assert!(error.contains(expected), "{address}: {error}");
        }
    }

    #[test]
    fn a_cluster_is_loopback_only_when_every_rank_is() {
        for json in [
            r#"{"chief": ["127.0.0.1:1"], "worker": ["[::1]:1", "localhost:2"], "ps": ["h:1"]}"#,
            r#"{"worker": ["127.8.9.1:1", "LocalHost.:1", "a.localhost:1"]}"#,
        ] {
            assert_eq!(Roster::new(&cluster(json)).remote_task(), None, "{json}");
        }
        for (json, remote) in [
            (
                r#"{"chief": ["127.0.0.1:1"], "worker": ["10.0.0.2:1"]}"#,
                "10.0.0.2:1",
            ),
            (r#"{"worker": ["localhost:1", "w1:1"]}"#, "w1:1"),
            (
                r#"{"worker": ["localhost:1", "[::ffff:10.0.0.1]:1"]}"#,
                "[::ffff:10.0.0.1]:1",
            ),
            (r#"{"worker": ["localhost:1", "localhost"]}"#, "localhost"),
        ] {
            let cluster = cluster(json);
            let roster = Roster::new(&cluster);
            assert_eq!(roster.remote_task().map(|(_, a)| a), Some(remote), "{json}");
        }
    }

    #[test]
    fn a_peer_must_come_from_its_tasks_ip() {
        let cluster = cluster(r#"{"worker": ["10.0.0.1:1", "10.0.0.2:1", "w2:1", "0.0.0.0:1"]}"#);
        let roster = Roster::new(&cluster);
        let peer = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 40_000);
        assert_eq!(roster.check_peer(1, peer("10.0.0.2")), Ok(()));
        assert_eq!(roster.check_peer(1, peer("::ffff:10.0.0.2")), Ok(()));
        let error = roster.check_peer(1, peer("10.0.0.3")).unwrap_err();
        assert_eq!(
            error,
            "it connects from 10.0.0.3, but worker:1's address in the cluster spec is 10.0.0.2:1"
        );
        // A name, or an address that is no one's, says nothing of the peer's IP.
        assert_eq!(roster.check_peer(2, peer("10.9.9.9")), Ok(()));
        assert_eq!(roster.check_peer(3, peer("10.9.9.9")), Ok(()));
    }

    #[test]
    fn a_deadline_past_the_clocks_end_is_no_deadline() {
        for timeout in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            let deadline = Deadline::after(timeout);
            assert!(!deadline.passed());
            assert_eq!((deadline.left(), deadline.io_timeout()), (None, None));
        }
        let soon = Deadline::after(Duration::ZERO);
        assert!(soon.passed());
        assert_eq!(soon.io_timeout(), Some(Duration::from_millis(1)));
    }
}
