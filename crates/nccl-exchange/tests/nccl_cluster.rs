//! NCCL across processes on a real GPU (feature `nccl`): two ranks on one GPU as two processes
//! (distinct NCCL_HOSTID, so each looks like a node: NCCL before 2.30 refuses two ranks of one
//! process on the same GPU), their NCCL unique id handed over by the authenticated exchange
//! through `nccl_all_reduce_for_cluster`; and a frozen rank, which ends the other's wait at the
//! deadline.
//!
//! Without a GPU or NCCL the tests say why and pass, unless `DISTRIBUTE_REQUIRE_GPU=1` /
//! `DISTRIBUTE_REQUIRE_NCCL=1` (set by `cargo xtask test-gpu`), which make them fail.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distribute_collectives::{CollectiveError, CrossDeviceOps};
use distribute_device_spec::{ClusterSpec, TaskId, TaskType};
use distribute_nccl::require_nccl;
use distribute_nccl_exchange::{CLUSTER_KEY_VAR, ClusterKey, nccl_all_reduce_for_cluster};
use distribute_tensor::Tensor;
use distribute_tensor::cuda::{Gpu, gpu_count, require_nvrtc};
use distribute_values::ReduceOp;
use half::bf16;

const DEADLINE: Duration = Duration::from_secs(60);

/// Whether this machine has a GPU whose NCCL and NVRTC load; else it says why and the test
/// passes, unless the environment requires a GPU and NCCL (then it fails).
fn gpu_and_nccl() -> bool {
    let why = match gpu_count() {
        Ok(0) => "the driver reports no GPU".to_owned(),
        Ok(_) => match require_nccl().and_then(|()| require_nvrtc()) {
            Ok(()) => return true,
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    let required = ["DISTRIBUTE_REQUIRE_GPU", "DISTRIBUTE_REQUIRE_NCCL"]
        .into_iter()
        .any(|var| std::env::var(var).is_ok_and(|v| v == "1"));
    assert!(!required, "a GPU and NCCL are required here: {why}");
    eprintln!("skipped: {why}");
    false
}

/// The environment variable that makes this test binary act as one rank of
/// `two_processes_share_one_gpu`.
const CHILD: &str = "DISTRIBUTE_NCCL_CHILD";

/// What each rank of a two-process launch left: whether it exited successfully (`None`: still
/// running when the first rank ended a frozen-peer launch, then killed) and its output.
struct Ranks {
    statuses: [Option<bool>; 2],
    logs: [String; 2],
}

/// Starts this test binary's ignored test `child` as ranks 0 and 1 of a two-task cluster on one
/// GPU (`env` set in both), and waits for both, or with `first_ends` only for rank 0 (the other
/// is then killed: a frozen rank never ends by itself). Panics past 180 s.
fn launch_two_ranks(child: &str, env: &[(&str, &str)], first_ends: bool) -> Ranks {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let cluster = format!(r#"{{"worker": ["127.0.0.1:{port}", "127.0.0.1:1"]}}"#);
    // One fresh key for the job, as a launcher makes: the exchange always authenticates.
    let key = ClusterKey::generate().unwrap().to_hex();
    let exe = std::env::current_exe().unwrap();
    // Output goes to files, not pipes: a chatty rank (NCCL_DEBUG=INFO) must not block on a full
    // pipe that is read only after it exits.
    let logs = tempfile::tempdir().unwrap();
    let log = |rank: usize| logs.path().join(format!("rank-{rank}.log"));
    let mut children: Vec<_> = (0..2)
        .map(|rank| {
            let out = std::fs::File::create(log(rank)).unwrap();
            let err = out.try_clone().unwrap();
            Command::new(&exe)
                .args(["--exact", child, "--ignored", "--nocapture"])
                .env(CHILD, rank.to_string())
                .env("DISTRIBUTE_CLUSTER", &cluster)
                .env(CLUSTER_KEY_VAR, &key)
                .envs(env.iter().copied())
                // Each rank looks like a node of its own, so NCCL accepts both on one GPU.
                .env("NCCL_HOSTID", format!("distribute-test-host-{rank}"))
                .env("NCCL_SOCKET_IFNAME", "lo")
                .env("NCCL_IB_DISABLE", "1")
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err))
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut statuses = [None; 2];
    let waited = |statuses: &[Option<bool>; 2]| match first_ends {
        true => statuses[0].is_none(),
        false => statuses.iter().any(Option::is_none),
    };
    while waited(&statuses) {
        for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = child.try_wait().unwrap().map(|s| s.success());
            }
        }
        if start.elapsed() > Duration::from_secs(180) {
            children.iter_mut().for_each(|c| {
                let _ = c.kill();
            });
            panic!("the ranks of {child} did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for child in &mut children {
        // A stopped process dies of SIGKILL too.
        let _ = child.kill();
        let _ = child.wait();
    }
    let logs = [0, 1].map(|rank| {
        let text = std::fs::read_to_string(log(rank)).unwrap();
        eprintln!("--- {child}: rank {rank} ---\n{text}");
        text
    });
    Ranks { statuses, logs }
}

#[test]
fn two_processes_share_one_gpu() {
    if !gpu_and_nccl() {
        return;
    }
    let ranks = launch_two_ranks("rank_of_two_processes", &[], false);
    for rank in 0..2 {
        assert_eq!(ranks.statuses[rank], Some(true), "rank {rank} failed");
        assert!(
            ranks.logs[rank].contains("RANK OK"),
            "rank {rank} did not finish its checks"
        );
    }
}

/// Which moment rank 1 freezes at in `a_frozen_rank_ends_the_others_wait_at_the_deadline`.
const FREEZE: &str = "DISTRIBUTE_NCCL_FREEZE";

/// The deadline of the frozen-peer launches.
const FROZEN_DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn a_frozen_rank_ends_the_others_wait_at_the_deadline() {
    if !gpu_and_nccl() {
        return;
    }
    // Rank 1 stops (SIGSTOP) after the unique-id exchange, before its communicator's setup, or
    // after a first healthy all-reduce, before the next: rank 0 must fail at its deadline (its
    // non-blocking setup or call polled, then aborted), never hang.
    for (moment, expected) in [
        ("setup", "NCCL communicator setup (rank 0 of 2)"),
        ("step", "NCCL all_reduce (agreement) (rank 0 of 2)"),
    ] {
        let ranks = launch_two_ranks("frozen_rank_of_two_processes", &[(FREEZE, moment)], true);
        assert_eq!(ranks.statuses[0], Some(true), "{moment}: rank 0 failed");
        let line = ranks.logs[0]
            .lines()
            .find(|l| l.starts_with("WAIT ENDED"))
            .unwrap_or_else(|| panic!("{moment}: rank 0 never reported its wait's end"));
        assert!(line.contains(expected), "{moment}: {line}");
        assert!(line.contains("deadline"), "{moment}: {line}");
    }
}

/// One rank of `a_frozen_rank_ends_the_others_wait_at_the_deadline` (run by it, in a child
/// process): rank 1 freezes at the moment `FREEZE` names; rank 0 reports how its wait ended.
#[test]
#[ignore = "a child process of a_frozen_rank_ends_the_others_wait_at_the_deadline"]
fn frozen_rank_of_two_processes() {
    let rank: usize = std::env::var(CHILD).unwrap().parse().unwrap();
    let moment = std::env::var(FREEZE).unwrap();
    let cluster = ClusterSpec::from_json(&std::env::var("DISTRIBUTE_CLUSTER").unwrap()).unwrap();
    let me = TaskId::new(TaskType::Worker, rank as u32);
    let gpu = Gpu::open(0).unwrap();
    let freeze = || {
        println!("FREEZING");
        // Stops this process before returning (a `kill -STOP` child may let it run on, and
        // needs a `kill` binary the machine may lack).
        // SAFETY: raise only sends a signal to this process.
        let stopped = unsafe { libc::raise(libc::SIGSTOP) };
        assert_eq!(stopped, 0, "raise(SIGSTOP) failed");
    };
    let ops = nccl_all_reduce_for_cluster(&cluster, me, &[0], FROZEN_DEADLINE).unwrap();
    if rank == 1 && moment == "setup" {
        freeze();
    }
    let started = Instant::now();
    let outcome = ops.replica_collectives(0).and_then(|member| {
        let x = Tensor::from_vec("/gpu:0", &[1 << 10], vec![1.0f32; 1 << 10])?.to_gpu(&gpu)?;
        member.all_reduce(ReduceOp::Sum, &x)?;
        if rank == 1 && moment == "step" {
            freeze();
        }
        member.all_reduce(ReduceOp::Sum, &x).map(drop)
    });
    match outcome {
        Err(e) => println!("WAIT ENDED after {:?}: {e}", started.elapsed()),
        Ok(()) => panic!("rank {rank}: the frozen peer's collective completed"),
    }
}

/// One rank of `two_processes_share_one_gpu` (run by it, in a child process).
#[test]
#[ignore = "a child process of two_processes_share_one_gpu"]
fn rank_of_two_processes() {
    let rank: usize = std::env::var(CHILD)
        .expect("run by two_processes_share_one_gpu")
        .parse()
        .unwrap();
    let cluster = ClusterSpec::from_json(&std::env::var("DISTRIBUTE_CLUSTER").unwrap()).unwrap();
    let me = TaskId::new(TaskType::Worker, rank as u32);
    let gpu = Gpu::open(0).unwrap();
    let ops = nccl_all_reduce_for_cluster(&cluster, me, &[0], DEADLINE).unwrap();
    let member = ops.replica_collectives(0).unwrap();

    // all_reduce: rank r contributes r + 1 → 3 everywhere; f32, bf16 and i64 in one batch.
    let x = Tensor::from_vec("/gpu:0", &[1 << 16], vec![(rank + 1) as f32; 1 << 16])
        .unwrap()
        .to_gpu(&gpu)
        .unwrap();
    let y = Tensor::from_vec("/gpu:0", &[5], vec![bf16::from_f32(rank as f32 + 0.5); 5]).unwrap();
    let z = Tensor::from_vec("/gpu:0", &[2], vec![i64::MAX - rank as i64, 7]).unwrap();
    let out = member
        .batch_all_reduce(ReduceOp::Sum, &[x.clone(), y, z])
        .unwrap();
    assert!(out[0].to_vec::<f32>().is_err(), "GPU input, GPU result");
    assert!(
        out[0]
            .to_host()
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|&v| v == 3.0)
    );
    assert_eq!(
        out[1].to_vec::<bf16>().unwrap(),
        vec![bf16::from_f32(2.0); 5]
    );
    assert_eq!(
        out[2].to_vec::<i64>().unwrap(),
        [(i64::MAX).wrapping_add(i64::MAX - 1), 14]
    );
    let mean = member
        .all_reduce(ReduceOp::Mean, &x)
        .unwrap()
        .to_host()
        .unwrap();
    assert!(mean.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.5));

    // all_gather with different row counts: rank 0 has 1 row, rank 1 has 2.
    let rows = rank + 1;
    let mine = Tensor::from_vec("/gpu:0", &[rows, 2], vec![rank as f32; rows * 2]).unwrap();
    let gathered = member.all_gather(&mine).unwrap();
    assert_eq!(gathered.shape(), [3, 2]);
    assert_eq!(gathered.to_vec::<f32>().unwrap(), [0., 0., 1., 1., 1., 1.]);

    // reduce_scatter: 4 rows, each rank keeps 2 of the sum.
    let full = Tensor::from_vec("/gpu:0", &[4], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let part = member.reduce_scatter(ReduceOp::Sum, &full).unwrap();
    let expect = if rank == 0 { [2.0, 4.0] } else { [6.0, 8.0] };
    assert_eq!(part.to_vec::<f32>().unwrap(), expect);

    // broadcast from rank 1: rank 0 passes nothing and learns dtype and shape.
    let root_value = Tensor::from_vec("/gpu:0", &[2, 2], vec![9i32, 8, 7, 6]).unwrap();
    let got = member
        .broadcast(1, (rank == 1).then_some(&root_value))
        .unwrap()
        .to_host()
        .unwrap();
    assert_eq!(got.shape(), [2, 2]);
    assert_eq!(got.to_vec::<i32>().unwrap(), [9, 8, 7, 6]);

    // Different shapes on the two ranks: both get a ReplicaMismatch, nobody hangs.
    let odd = Tensor::from_vec("/gpu:0", &[3 + rank], vec![1.0f32; 3 + rank]).unwrap();
    match member.all_reduce(ReduceOp::Sum, &odd) {
        Err(CollectiveError::ReplicaMismatch { .. }) => {}
        other => panic!("expected a ReplicaMismatch, got {other:?}"),
    }
    // The communicator still works after a refused call.
    let again = member.all_reduce(ReduceOp::Max, &full).unwrap();
    assert_eq!(again.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    println!("RANK OK");
}
