//! The secret of the unique-id exchange ([`ClusterKey`]) and what both sides compute with it: a
//! challenge–response in HMAC-SHA256 and the sealing of the id on the wire.
//!
//! The protocol runs in `leader.rs` and `client.rs`; this file knows only bytes (no sockets, no
//! cluster specs, no NCCL).
//!
//! # The handshake
//!
//! Every proof and the sealing key are HMAC-SHA256 under the cluster key of a *transcript*: the
//! client's whole hello (protocol version, its task, the world size, the cluster hash and its fresh
//! 32-byte nonce) followed by the leader's fresh 32-byte nonce. Each value has its own label, so a
//! proof made in one direction is never accepted in the other, and fresh nonces from both sides
//! make every proof and key new per connection (a recorded exchange replays nothing). Proofs are
//! compared in constant time (`Mac::verify_slice`).
//!
//! The id is sealed with the key of that connection: XORed with a keystream of HMAC-SHA256 blocks
//! (HMAC as a PRF in counter mode) and followed by an HMAC tag over the ciphertext
//! (encrypt-then-MAC), so only a task that knows the key reads it and an altered id is refused.

use std::ffi::OsString;
use std::fmt;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ExchangeError;

use crate::UNIQUE_ID_BYTES;

/// The environment variable holding the cluster key in hex, read by
/// [`exchange_unique_id`](crate::exchange_unique_id) and so `nccl_all_reduce_for_cluster`: every
/// chief and worker task of one cluster gets the same random key, e.g. from
/// `openssl rand -hex 32`.
pub const CLUSTER_KEY_VAR: &str = "DISTRIBUTE_CLUSTER_KEY";

/// The environment variable naming a file that holds the cluster key in hex (surrounding white
/// space ignored), for launchers that mount secrets as files; set it or [`CLUSTER_KEY_VAR`], not
/// both.
pub const CLUSTER_KEY_FILE_VAR: &str = "DISTRIBUTE_CLUSTER_KEY_FILE";

/// The named opt-out of authentication: `1` in this variable, with no cluster key given, runs
/// the unique-id exchange without one, so that any process that reaches the leader first can take
/// a task's place; a warning is logged every time. Never on a machine or network shared with
/// others.
pub const UNAUTHENTICATED_VAR: &str = "DISTRIBUTE_UNAUTHENTICATED_EXCHANGE";

/// The fewest bytes a cluster key has (32 hex digits); `openssl rand -hex 32` makes 32 bytes.
pub const MIN_CLUSTER_KEY_BYTES: usize = 16;

/// The most bytes a cluster key has, so a wrong file cannot make the reader allocate without bound.
const MAX_KEY_BYTES: usize = 1024;

/// The fresh random bytes each side contributes to a handshake.
pub(crate) const NONCE_BYTES: usize = 32;
/// The length of a proof (an HMAC-SHA256 tag).
pub(crate) const PROOF_BYTES: usize = 32;
/// The id sealed on the wire: the ciphertext and its tag.
pub(crate) const SEALED_BYTES: usize = UNIQUE_ID_BYTES + PROOF_BYTES;

pub(crate) type Nonce = [u8; NONCE_BYTES];
pub(crate) type Proof = [u8; PROOF_BYTES];

type HmacSha256 = Hmac<Sha256>;

const LEADER_PROOF: &[u8] = b"dst-uid leader proof\0";
const CLIENT_PROOF: &[u8] = b"dst-uid client proof\0";
const SEAL_KEY: &[u8] = b"dst-uid seal key\0";
const KEYSTREAM: &[u8] = b"dst-uid keystream\0";
const SEAL_TAG: &[u8] = b"dst-uid seal tag\0";

/// The secret every chief and worker task of a cluster shares, proving to each other that they
/// belong to it in the unique-id exchange.
///
/// Made from hex ([`ClusterKey::from_hex`]) or from the environment ([`ClusterKey::from_env`]:
/// [`CLUSTER_KEY_VAR`], or a file named by [`CLUSTER_KEY_FILE_VAR`]); at least
/// [`MIN_CLUSTER_KEY_BYTES`] bytes. Its `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey(Vec<u8>);

impl ClusterKey {
    /// A key from hex digits (either case; surrounding white space ignored): at least
    /// [`MIN_CLUSTER_KEY_BYTES`] bytes (32 digits), at most 1024. Anything else is a
    /// [`ExchangeError::Key`].
    pub fn from_hex(hex: &str) -> Result<Self, ExchangeError> {
        Self::parse(hex).map_err(ExchangeError::Key)
    }

    /// The key the launcher gave this process: [`CLUSTER_KEY_VAR`] (hex), or the file named by
    /// [`CLUSTER_KEY_FILE_VAR`] (hex); `None` when neither is set. A key that does not parse, a
    /// file that cannot be read, or both variables set is a [`ExchangeError::Key`].
    pub fn from_env() -> Result<Option<Self>, ExchangeError> {
        Self::from_vars(&|name| std::env::var_os(name)).map_err(ExchangeError::Key)
    }

    /// [`ClusterKey::from_env`] over any source of variables.
    fn from_vars(lookup: &impl Fn(&str) -> Option<OsString>) -> Result<Option<Self>, String> {
        match (lookup(CLUSTER_KEY_VAR), lookup(CLUSTER_KEY_FILE_VAR)) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(format!(
                "both {CLUSTER_KEY_VAR} and {CLUSTER_KEY_FILE_VAR} are set: set one"
            )),
            (Some(hex), None) => {
                let hex = hex
                    .into_string()
                    .map_err(|_| format!("{CLUSTER_KEY_VAR} is not UTF-8"))?;
                Self::parse(&hex)
                    .map(Some)
                    .map_err(|e| format!("{CLUSTER_KEY_VAR}: {e}"))
            }
            (None, Some(path)) => Self::read(Path::new(&path))
                .map(Some)
                .map_err(|e| format!("{CLUSTER_KEY_FILE_VAR} ({}): {e}", path.display())),
        }
    }

    /// A fresh random key of 32 bytes from the operating system: what a launcher makes once per
    /// job and hands to every task ([`ClusterKey::to_hex`] into [`CLUSTER_KEY_VAR`]).
    pub fn generate() -> Result<Self, ExchangeError> {
        let mut bytes = vec![0; 32];
        getrandom::fill(&mut bytes).map_err(|e| {
            ExchangeError::Key(format!(
                "the operating system gave no random bytes for a cluster key: {e}"
            ))
        })?;
        Ok(Self(bytes))
    }

    /// The key in lowercase hex, as [`CLUSTER_KEY_VAR`] and [`ClusterKey::from_hex`] take it.
    /// It is the secret itself: hand it only to the tasks of the job.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    fn read(path: &Path) -> Result<Self, String> {
        use std::io::Read;
        let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
        // Room for the longest key in hex, with white space around it.
        let cap = (2 * MAX_KEY_BYTES + 64) as u64;
        let mut text = String::new();
        file.take(cap + 1)
            .read_to_string(&mut text)
            .map_err(|e| e.to_string())?;
        if text.len() as u64 > cap {
            return Err(format!(
                "the file is longer than a key ({cap} bytes or more)"
            ));
        }
        Self::parse(&text)
    }

    fn parse(hex: &str) -> Result<Self, String> {
        let hex = hex.trim();
        if !hex.len().is_multiple_of(2) {
            return Err(format!(
                "a key in hex has an even number of digits, this one {}",
                hex.len()
            ));
        }
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        };
        let bytes = hex
            .as_bytes()
            .chunks_exact(2)
            .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| "a key is hex digits (0-9, a-f) and nothing else".to_owned())?;
        if bytes.len() < MIN_CLUSTER_KEY_BYTES || bytes.len() > MAX_KEY_BYTES {
            return Err(format!(
                "a key has {MIN_CLUSTER_KEY_BYTES} to {MAX_KEY_BYTES} bytes ({} to {} hex \
                 digits), this one {}; make one with `openssl rand -hex 32`",
                2 * MIN_CLUSTER_KEY_BYTES,
                2 * MAX_KEY_BYTES,
                bytes.len()
            ));
        }
        Ok(Self(bytes))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.0).expect("HMAC accepts a key of any length")
    }
}

/// How a task of the unique-id exchange proves that it belongs to the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExchangeAuth {
    /// The cluster key every chief and worker task was given: the leader hands the id, sealed,
    /// only to a task that proves it knows the key, and a task takes an id only from a leader
    /// that proves it too.
    Key(ClusterKey),
    /// No authentication, the explicitly named opt-out ([`UNAUTHENTICATED_VAR`]): any process
    /// that reaches the leader first gets the id and takes a task's place. Allowed only where
    /// every task is on loopback; a warning is logged each time it is used.
    Unauthenticated,
}

impl ExchangeAuth {
    /// What the launcher gave this process: the key in [`CLUSTER_KEY_VAR`] or the file named by
    /// [`CLUSTER_KEY_FILE_VAR`], else the opt-out [`UNAUTHENTICATED_VAR`]`=1`. Neither, both, a
    /// key that does not parse, or the opt-out set to anything but `1` is a
    /// [`ExchangeError::Key`] that says how to make a key.
    pub fn from_env() -> Result<Self, ExchangeError> {
        Self::from_vars(|name| std::env::var_os(name)).map_err(ExchangeError::Key)
    }

    /// [`ExchangeAuth::from_env`] over any source of variables.
    fn from_vars(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self, String> {
        let key = ClusterKey::from_vars(&lookup)?;
        let opt_out = lookup(UNAUTHENTICATED_VAR);
        match (key, opt_out) {
            (Some(key), None) => Ok(Self::Key(key)),
            (None, Some(value)) if value == "1" => Ok(Self::Unauthenticated),
            (None, Some(value)) => Err(format!(
                "{UNAUTHENTICATED_VAR}={value:?}: the opt-out of authentication is `1`, or unset"
            )),
            (Some(_), Some(_)) => Err(format!(
                "a cluster key and {UNAUTHENTICATED_VAR} are both set: give the key and unset \
                 the opt-out"
            )),
            (None, None) => Err(format!(
                "no cluster key: the unique-id exchange authenticates every task, so give every \
                 chief and worker task of the job the same random key in {CLUSTER_KEY_VAR} \
                 (make one with `openssl rand -hex 32`, or `ClusterKey::generate().to_hex()`), \
                 or in a file named by {CLUSTER_KEY_FILE_VAR}; `cargo xtask launch` does it for \
                 you. To run without one on a machine of your own, set {UNAUTHENTICATED_VAR}=1 \
                 (any local process could then take a task's place)"
            )),
        }
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey({} bytes)", self.0.len())
    }
}

/// Fresh random bytes from the operating system.
pub(crate) fn nonce() -> Result<Nonce, String> {
    let mut nonce = [0; NONCE_BYTES];
    getrandom::fill(&mut nonce)
        .map_err(|e| format!("the operating system gave no random bytes: {e}"))?;
    Ok(nonce)
}

/// One connection's handshake: both proofs and the sealing key, bound to its transcript.
pub(crate) struct Session<'k> {
    key: &'k ClusterKey,
    transcript: Vec<u8>,
}

impl<'k> Session<'k> {
    /// The session of the client's `hello` (its bytes, nonce included) and the leader's nonce.
    pub(crate) fn new(key: &'k ClusterKey, hello: &[u8], leader_nonce: &Nonce) -> Self {
        Self {
            key,
            transcript: [hello, leader_nonce].concat(),
        }
    }

    fn tagged(&self, label: &[u8]) -> HmacSha256 {
        let mut mac = self.key.mac();
        mac.update(label);
        mac.update(&self.transcript);
        mac
    }

    /// What the leader sends to prove it knows the key.
    pub(crate) fn leader_proof(&self) -> Proof {
        self.tagged(LEADER_PROOF).finalize().into_bytes().into()
    }

    /// What the client sends to prove it knows the key.
    pub(crate) fn client_proof(&self) -> Proof {
        self.tagged(CLIENT_PROOF).finalize().into_bytes().into()
    }

    /// Whether `proof` is the leader's, compared in constant time.
    pub(crate) fn is_leader_proof(&self, proof: &[u8]) -> bool {
        self.tagged(LEADER_PROOF).verify_slice(proof).is_ok()
    }

    /// Whether `proof` is the client's, compared in constant time.
    pub(crate) fn is_client_proof(&self, proof: &[u8]) -> bool {
        self.tagged(CLIENT_PROOF).verify_slice(proof).is_ok()
    }

    fn seal_mac(&self) -> HmacSha256 {
        let key = self.tagged(SEAL_KEY).finalize().into_bytes();
        HmacSha256::new_from_slice(&key).expect("HMAC accepts a key of any length")
    }

    fn xor_keystream(&self, bytes: &mut [u8; UNIQUE_ID_BYTES]) {
        let seal = self.seal_mac();
        for (counter, block) in bytes.chunks_mut(PROOF_BYTES).enumerate() {
            let mut mac = seal.clone();
            mac.update(KEYSTREAM);
            mac.update(&(counter as u32).to_be_bytes());
            for (byte, pad) in block.iter_mut().zip(mac.finalize().into_bytes()) {
                *byte ^= pad;
            }
        }
    }

    fn tag(&self, ciphertext: &[u8]) -> HmacSha256 {
        let mut mac = self.seal_mac();
        mac.update(SEAL_TAG);
        mac.update(ciphertext);
        mac
    }

    /// The id encrypted for this connection, followed by its tag.
    pub(crate) fn seal(&self, id: &[u8; UNIQUE_ID_BYTES]) -> [u8; SEALED_BYTES] {
        let mut ciphertext = *id;
        self.xor_keystream(&mut ciphertext);
        let mut sealed = [0; SEALED_BYTES];
        sealed[..UNIQUE_ID_BYTES].copy_from_slice(&ciphertext);
        sealed[UNIQUE_ID_BYTES..].copy_from_slice(&self.tag(&ciphertext).finalize().into_bytes());
        sealed
    }

    /// The id [`Session::seal`] sealed, or `None` when its tag does not verify.
    pub(crate) fn open(&self, sealed: &[u8; SEALED_BYTES]) -> Option<[u8; UNIQUE_ID_BYTES]> {
        let (ciphertext, tag) = sealed.split_at(UNIQUE_ID_BYTES);
        self.tag(ciphertext).verify_slice(tag).ok()?;
        let mut id: [u8; UNIQUE_ID_BYTES] = ciphertext.try_into().ok()?;
        self.xor_keystream(&mut id);
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn key() -> ClusterKey {
        ClusterKey::from_hex(HEX).unwrap()
    }

    #[test]
    fn keys_parse_from_hex_of_16_bytes_or_more() {
        assert_eq!(key().0, (0..32).collect::<Vec<u8>>());
        assert_eq!(
            ClusterKey::from_hex(&format!(" {}\n", HEX.to_uppercase())).unwrap(),
            key()
        );
        assert!(ClusterKey::from_hex(&HEX[..32]).is_ok());
        for (hex, expected) in [
            (&HEX[..30], "this one 15"),
            (&HEX[..31], "even number of digits"),
            ("", "this one 0"),
            (&"zz".repeat(16), "hex digits"),
            (&"ab".repeat(MAX_KEY_BYTES + 1), "this one 1025"),
        ] {
            let error = ClusterKey::from_hex(hex).unwrap_err();
            assert!(
                matches!(&error, ExchangeError::Key(m) if m.contains(expected)),
                "{error}"
            );
        }
        assert_eq!(format!("{:?}", key()), "ClusterKey(32 bytes)");
    }

    #[test]
    fn the_environment_gives_a_key_in_a_variable_or_a_file() {
        let vars = |pairs: Vec<(&'static str, OsString)>| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.clone())
            }
        };
        assert_eq!(ClusterKey::from_vars(&vars(vec![])), Ok(None));
        assert_eq!(
            ClusterKey::from_vars(&vars(vec![(CLUSTER_KEY_VAR, HEX.into())])),
            Ok(Some(key()))
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, format!("{HEX}\n")).unwrap();
        assert_eq!(
            ClusterKey::from_vars(&vars(vec![(CLUSTER_KEY_FILE_VAR, file.clone().into())])),
            Ok(Some(key()))
        );
        let long = dir.path().join("long");
        std::fs::write(&long, vec![b'a'; 1 << 20]).unwrap();
        for (pairs, expected) in [
            (
                vec![
                    (CLUSTER_KEY_VAR, HEX.into()),
                    (CLUSTER_KEY_FILE_VAR, file.into()),
                ],
                "set one",
            ),
            (
                vec![(CLUSTER_KEY_VAR, "12".into())],
                "DISTRIBUTE_CLUSTER_KEY: a key has",
            ),
            (
                vec![(CLUSTER_KEY_FILE_VAR, dir.path().join("none").into())],
                "DISTRIBUTE_CLUSTER_KEY_FILE (",
            ),
            (
                vec![(CLUSTER_KEY_FILE_VAR, long.into())],
                "longer than a key",
            ),
        ] {
            let error = ClusterKey::from_vars(&vars(pairs)).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn the_exchange_needs_a_key_or_the_named_opt_out() {
        let vars = |pairs: Vec<(&'static str, &'static str)>| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            ExchangeAuth::from_vars(vars(vec![(CLUSTER_KEY_VAR, HEX)])),
            Ok(ExchangeAuth::Key(key()))
        );
        assert_eq!(
            ExchangeAuth::from_vars(vars(vec![(UNAUTHENTICATED_VAR, "1")])),
            Ok(ExchangeAuth::Unauthenticated)
        );
        for (pairs, expected) in [
            (vec![], "no cluster key"),
            (vec![], "openssl rand -hex 32"),
            (vec![], "DISTRIBUTE_UNAUTHENTICATED_EXCHANGE=1"),
            (
                vec![(UNAUTHENTICATED_VAR, "yes")],
                "the opt-out of authentication is `1`",
            ),
            (
                vec![(CLUSTER_KEY_VAR, HEX), (UNAUTHENTICATED_VAR, "1")],
                "both set",
            ),
            (
                vec![(CLUSTER_KEY_VAR, "12")],
                "DISTRIBUTE_CLUSTER_KEY: a key has",
            ),
        ] {
            let error = ExchangeAuth::from_vars(vars(pairs)).unwrap_err();
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }

    #[test]
    fn generated_keys_are_fresh_and_round_trip_through_hex() {
        let (a, b) = (
            ClusterKey::generate().unwrap(),
            ClusterKey::generate().unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(a.to_hex().len(), 64);
        assert_eq!(ClusterKey::from_hex(&a.to_hex()).unwrap(), a);
    }

    #[test]
    fn proofs_hold_only_for_their_key_transcript_and_direction() {
        let key = key();
        let other = ClusterKey::from_hex(&HEX.replace('0', "1")).unwrap();
        let session = Session::new(&key, b"hello", &[1; NONCE_BYTES]);
        assert!(session.is_leader_proof(&session.leader_proof()));
        assert!(session.is_client_proof(&session.client_proof()));
        assert_ne!(session.leader_proof(), session.client_proof());
        assert!(!session.is_client_proof(&session.leader_proof()));
        assert!(!session.is_leader_proof(&session.client_proof()));
        for stranger in [
            Session::new(&other, b"hello", &[1; NONCE_BYTES]),
            Session::new(&key, b"hellO", &[1; NONCE_BYTES]),
            Session::new(&key, b"hello", &[2; NONCE_BYTES]),
        ] {
            assert!(!session.is_client_proof(&stranger.client_proof()));
            assert!(!stranger.is_leader_proof(&session.leader_proof()));
        }
        assert!(!session.is_client_proof(&[]));
    }

    #[test]
    fn a_sealed_id_opens_only_in_its_session_and_unaltered() {
        let key = key();
        let id: [u8; UNIQUE_ID_BYTES] = std::array::from_fn(|i| i as u8);
        let session = Session::new(&key, b"hello", &[1; NONCE_BYTES]);
        let sealed = session.seal(&id);
        assert_eq!(session.open(&sealed), Some(id));
        // No byte of the id shows through in place.
        assert!(
            sealed[..UNIQUE_ID_BYTES]
                .iter()
                .zip(&id)
                .filter(|(a, b)| a == b)
                .count()
                < 8
        );
        let mut altered = sealed;
        altered[5] ^= 1;
        assert_eq!(session.open(&altered), None);
        let next = Session::new(&key, b"hello", &[2; NONCE_BYTES]);
        assert_eq!(next.open(&sealed), None);
        assert_ne!(next.seal(&id), sealed);
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
