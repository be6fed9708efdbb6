//! [`Roster`]: the ranks of a cluster (its chief and worker tasks in rank order, with their
//! addresses), the hash by which tasks of different clusters refuse each other, and the leader's
//! checks of who may join: [`Roster::admit`] and [`Roster::check_peer`].

use std::net::{IpAddr, SocketAddr};

use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
use distribute_tensor::Fnv;

use crate::wire::Hello;

/// The ranks of a cluster: its chief and worker tasks in rank order, with their addresses.
pub(crate) struct Roster<'a> {
    /// The chief and the workers in rank order, each with its address in the cluster spec.
    pub(crate) ranks: Vec<(TaskId, &'a str)>,
    /// The FNV-1a hash of the ranks' tasks and addresses, which a task's hello must match.
    pub(crate) hash: u64,
}

impl<'a> Roster<'a> {
    pub(crate) fn new(cluster: &'a ClusterSpec) -> Self {
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

    pub(crate) fn leader(&self) -> TaskId {
        self.ranks[0].0
    }

    pub(crate) fn leader_address(&self) -> &'a str {
        self.ranks[0].1
    }

    /// A rank whose host is not loopback (`127.*`, `::1`, `localhost`), with its address: the
    /// exchange then crosses hosts.
    pub(crate) fn remote_task(&self) -> Option<(TaskId, &'a str)> {
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
    pub(crate) fn check_peer(&self, rank: usize, peer: SocketAddr) -> Result<(), String> {
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
    pub(crate) fn admit(&self, hello: &Hello) -> Result<usize, String> {
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

/// `host:port` of a cluster spec, IPv6 hosts in brackets; the port must not be 0.
pub(crate) fn parse_address(address: &str) -> Result<(&str, u16), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::NONCE_BYTES;
    use crate::nccl_rank;

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
}
