//! The exchange's messages as bytes (the conversation is in the crate's docs, under *Protocol*):
//! a task's [`Hello`] and the leader's [`Reply`], each starting with the magic `dst-uid\0` and
//! the protocol version, integers big-endian. Only bytes: no sockets, no keys.

use std::io::{ErrorKind, Read};

use distribute_device_spec::{TaskId, TaskType};

use crate::UNIQUE_ID_BYTES;
use crate::auth::{NONCE_BYTES, Nonce, PROOF_BYTES, Proof, SEALED_BYTES};

const MAGIC: [u8; 8] = *b"dst-uid\0";
const VERSION: u16 = 2;
/// Magic and version: what both a hello and a reply start with.
const HEADER_LEN: usize = MAGIC.len() + 2;
/// The bytes of a hello: the header, task type and index, world size, cluster hash, key scheme
/// and nonce.
pub(crate) const HELLO_LEN: usize = HEADER_LEN + 1 + 4 + 4 + 8 + 1 + NONCE_BYTES;
/// The longest message a reply carries; longer ones are cut.
const MAX_MESSAGE: usize = 1024;

const STATUS_ID: u8 = 0;
const STATUS_REFUSED: u8 = 1;
const STATUS_ABANDONED: u8 = 2;
const STATUS_CHALLENGE: u8 = 3;
const STATUS_SEALED: u8 = 4;

/// What a task sends the leader when it connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The task that says hello.
    pub(crate) task: TaskId,
    /// How many ranks its cluster spec has.
    pub(crate) world_size: u32,
    /// Its cluster's [`Roster`](crate::roster::Roster) hash.
    pub(crate) cluster_hash: u64,
    /// Whether the task has a cluster key, so the leader must challenge it.
    pub(crate) keyed: bool,
    /// The task's fresh random bytes for the handshake (zeros without a key).
    pub(crate) nonce: Nonce,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
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

    pub(crate) fn decode(bytes: &[u8; HELLO_LEN]) -> Result<Self, String> {
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
pub(crate) fn check_header(prefix: &[u8], what: &str) -> Result<(), String> {
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
pub(crate) enum Reply {
    /// Every rank joined: the unique id, in clear (no cluster key).
    Id([u8; UNIQUE_ID_BYTES]),
    /// Every rank joined: the unique id sealed for this connection (see
    /// [`Session::seal`](crate::auth::Session::seal)).
    Sealed([u8; SEALED_BYTES]),
    /// The leader's nonce and its proof of the cluster key, asking for the task's proof.
    Challenge { nonce: Nonce, proof: Proof },
    /// This task may not join, and why.
    Refused(String),
    /// The leader gave up: the tasks that never joined.
    Abandoned(Vec<String>),
}

impl Reply {
    pub(crate) fn encode(&self) -> Vec<u8> {
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

    pub(crate) fn read(from: &mut impl Read) -> Result<Self, WireError> {
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
pub(crate) enum WireError {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
