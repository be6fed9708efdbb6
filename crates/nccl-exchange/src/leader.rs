//! The leader's side of the exchange, a state machine over non-blocking sockets: [`lead`] binds
//! the leader's address, takes each connection through its stages (hello, then with a key the
//! challenge and the task's proof) without letting a slow or hostile one hold up the others,
//! and sends every rank the id once all have joined, or tells them who never came.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use crate::ExchangeError;
use distribute_device_spec::TaskId;

use crate::UNIQUE_ID_BYTES;
use crate::auth::{CLUSTER_KEY_FILE_VAR, CLUSTER_KEY_VAR, ClusterKey, PROOF_BYTES, Session, nonce};
use crate::deadline::Deadline;
use crate::roster::Roster;
use crate::wire::{HELLO_LEN, Hello, Reply, check_header};

/// How long the leader waits for the hello and the proof of a connection before it drops it.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the leader sleeps when no connection made progress.
const POLL_PAUSE: Duration = Duration::from_millis(2);
/// How long the leader may take to write a reply into a connection's buffer.
const SEND_TIMEOUT: Duration = Duration::from_millis(500);
/// How many refused or lost connections the leader's timeout error lists.
const MAX_NOTES: usize = 8;

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
pub(crate) fn lead(
    roster: &Roster<'_>,
    (host, port): (&str, u16),
    id: [u8; UNIQUE_ID_BYTES],
    key: Option<&ClusterKey>,
    timeout: Duration,
    deadline: Deadline,
) -> Result<[u8; UNIQUE_ID_BYTES], ExchangeError> {
    let me = roster.leader();
    let address = roster.leader_address();
    let listeners = bind(host, port).map_err(|reason| ExchangeError::Address {
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
            return Err(ExchangeError::Timeout {
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
        Err(ExchangeError::Protocol {
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
