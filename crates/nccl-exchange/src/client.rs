//! A task's side of the exchange, the client of the leader: [`join`] connects (retrying while
//! the leader may not have started), says hello, checks the leader's proof and proves itself
//! with a key, and takes the id, refusing one from a leader that did not prove it knows the key.

use std::io::{self, ErrorKind, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use crate::ExchangeError;
use distribute_device_spec::TaskId;

use crate::UNIQUE_ID_BYTES;
use crate::auth::{CLUSTER_KEY_FILE_VAR, CLUSTER_KEY_VAR, ClusterKey, NONCE_BYTES, Session, nonce};
use crate::deadline::Deadline;
use crate::roster::Roster;
use crate::wire::{Hello, Reply, WireError};

/// The longest a client waits on one connection attempt before trying again.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest a client sleeps between connection attempts (the first sleep is 10 ms).
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A non-leader's side: connects to the leader, says hello, proves itself with a key and waits
/// for the id.
pub(crate) fn join(
    roster: &Roster<'_>,
    me: TaskId,
    (host, port): (&str, u16),
    key: Option<&ClusterKey>,
    deadline: Deadline,
) -> Result<[u8; UNIQUE_ID_BYTES], ExchangeError> {
    let start = Instant::now();
    let leader = roster.leader();
    let address = roster.leader_address();
    let waited = || Duration::from_millis(start.elapsed().as_millis() as u64);
    let timed_out = |missing: Vec<String>, waiting_for: String| ExchangeError::Timeout {
        task: me.to_string(),
        waited: waited(),
        missing,
        waiting_for,
    };
    let the_leader = format!("the leader {leader} at {address}");
    let broken = |reason: String| ExchangeError::Protocol {
        task: me.to_string(),
        peer: the_leader.clone(),
        reason,
    };
    let untrusted = |reason: String| ExchangeError::Unauthenticated {
        task: me.to_string(),
        peer: the_leader.clone(),
        reason,
    };
    let refused = |reason: String| ExchangeError::Refused {
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
