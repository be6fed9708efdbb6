//! `cargo bench -p distribute-nccl --bench two_ranks`: NCCL all-reduce between two ranks in two
//! processes sharing GPU 0 (each process a distinct `NCCL_HOSTID`, as two hosts would be, so
//! NCCL connects them through its socket transport on loopback: `NCCL_SOCKET_IFNAME=lo`,
//! `NCCL_IB_DISABLE=1`, so that it neither probes InfiniBand cards nor waits on them), at
//! 4 KiB, 1 MiB and 64 MiB of f32, one JSON line per size with nccl-tests' bandwidths (algbw =
//! bytes / time, busbw = algbw × 2(n−1)/n). The GPU's device-to-device copy bandwidth of the
//! same run is `bench-gpu`'s (the kernel-vs-copy bench beside it in the GPU bundle).
//!
//! The process started by cargo makes the NCCL unique id and starts itself twice as the ranks
//! (`DISTRIBUTE_NCCL_BENCH_RANK`), passing the id in the environment; rank 0 prints the lines.
//! Each sample is one `all_reduce` call, which returns when its result is on the GPU; a case's
//! time is the median of its samples after a warm-up. Without `--bench`, a quick smoke run.
//!
//! Without a GPU or NCCL it prints `{"skipped": "<why>"}` and succeeds, unless
//! `DISTRIBUTE_REQUIRE_NCCL=1` (set by `cargo xtask test-gpu`).

use std::error::Error;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distribute_collectives::CrossDeviceOps;
use distribute_nccl::NcclAllReduce;
use distribute_nccl::require_nccl;
use distribute_tensor::Tensor;
use distribute_tensor::cuda::{Gpu, gpu_count};
use distribute_values::ReduceOp;
use serde_json::json;

type BoxError = Box<dyn Error>;

/// Set in a rank's process: its rank.
const RANK: &str = "DISTRIBUTE_NCCL_BENCH_RANK";
/// Set in a rank's process: the unique id, in hex.
const ID: &str = "DISTRIBUTE_NCCL_BENCH_ID";
/// How long a rank may wait for the other.
const DEADLINE: Duration = Duration::from_secs(120);
const SIZES: [usize; 3] = [4 << 10, 1 << 20, 64 << 20];

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let result = match std::env::var(RANK) {
        Ok(rank) => rank_main(&rank, full),
        Err(_) => launch(full),
    };
    if let Err(e) = result {
        eprintln!("the two-rank NCCL benchmark failed: {e}");
        std::process::exit(1);
    }
}

/// Makes the id and runs the two ranks; prints rank 0's lines.
fn launch(full: bool) -> Result<(), BoxError> {
    let why_not = match (gpu_count(), require_nccl()) {
        (Err(e), _) => Some(format!("no GPU: {e}")),
        (Ok(0), _) => Some("no GPU: the NVIDIA driver reports 0 GPUs".to_owned()),
        (_, Err(e)) => Some(e.to_string()),
        (Ok(_), Ok(())) => None,
    };
    if let Some(why) = why_not {
        println!("{}", json!({ "bench": "nccl_two_ranks", "skipped": why }));
        if std::env::var("DISTRIBUTE_REQUIRE_NCCL").is_ok_and(|v| v == "1") {
            return Err(format!("DISTRIBUTE_REQUIRE_NCCL=1 but {why}").into());
        }
        return Ok(());
    }
    let id: String = NcclAllReduce::new_unique_id()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let exe = std::env::current_exe()?;
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let mut command = Command::new(&exe);
            if full {
                command.arg("--bench");
            }
            command
                .env(RANK, rank.to_string())
                .env(ID, &id)
                .env("NCCL_HOSTID", format!("distribute-bench-rank-{rank}"))
                .env("NCCL_SOCKET_IFNAME", "lo")
                .env("NCCL_IB_DISABLE", "1")
                .stdout(if rank == 0 {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                })
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut failed = Vec::new();
    for (rank, mut child) in ranks.into_iter().enumerate() {
        let status = child.wait()?;
        if !status.success() {
            failed.push(format!("rank {rank} exited with {status}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; ").into())
    }
}

/// One rank: joins the world of two on GPU 0 and times the all-reduces.
fn rank_main(rank: &str, full: bool) -> Result<(), BoxError> {
    let rank: usize = rank.parse()?;
    let hex = std::env::var(ID)?;
    let mut id = [0u8; NcclAllReduce::UNIQUE_ID_BYTES];
    for (i, byte) in id.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or("the id is short")?, 16)?;
    }
    let ops = NcclAllReduce::from_unique_id(id, 2, rank, &[0], DEADLINE)?;
    let replica = ops.replica_collectives(0)?;
    let gpu = Gpu::open(0)?;
    let samples = if full { 51 } else { 3 };
    for bytes in SIZES {
        let len = bytes / 4;
        let host = Tensor::from_vec(
            "/cpu:0",
            &[len],
            (0..len)
                .map(|i| (i % 61) as f32 + rank as f32)
                .collect::<Vec<f32>>(),
        )?;
        let input = host.to_gpu(&gpu)?;
        // The first call connects the ranks (NCCL's lazy setup); the warm-up keeps it out.
        for _ in 0..3 {
            replica.all_reduce(ReduceOp::Sum, &input)?;
        }
        let mut times = Vec::with_capacity(samples);
        for _ in 0..samples {
            let start = Instant::now();
            let out = replica.all_reduce(ReduceOp::Sum, &input)?;
            times.push(start.elapsed().as_secs_f64());
            drop(out);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let algbw = bytes as f64 / median / 1e9;
        if rank == 0 {
            println!(
                "{}",
                json!({
                    "bench": "nccl_two_ranks", "ranks": 2, "processes": 2, "gpus": 1,
                    "bytes": bytes, "dtype": "f32", "median_s": median,
                    "algbw_gbps": algbw, "busbw_gbps": algbw,
                    "nccl_version": NcclAllReduce::nccl_version()?,
                    "mode": if full { "bench" } else { "smoke" },
                })
            );
        }
    }
    Ok(())
}
