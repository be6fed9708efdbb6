//! Cross-worker all-reduce and step timings, printed as JSON lines by worker 0: the program a
//! multi-worker benchmark launches under `mpirun -n W` (`--replicas R`, default 1).
//!
//! `multi_worker_all_reduce` lines compare `MpiAllReduce` (through a step's replica
//! collectives) with a raw `MPI_Allreduce` of the same bytes, timed in the same run:
//! `mpi_ratio` = raw time ÷ ours (1.0: the layer costs nothing). `multi_worker_step` is a trivial
//! step (one scalar all-reduce) through `run`.
//!
//! ```text
//! cargo build --release -p distribute-mirrored --features mpi --example multi_worker_bench
//! mpirun -n 2 target/release/examples/multi_worker_bench --replicas 1
//! ```

use std::time::{Duration, Instant};

use distribute_collectives::Tensor;
use distribute_mirrored::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::{Strategy, StrategyError};
use distribute_values::ReduceOp;

fn median(mut times: Vec<Duration>) -> f64 {
    times.sort_unstable();
    times[times.len() / 2].as_secs_f64()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let replicas: usize = match args.iter().position(|a| a == "--replicas") {
        Some(i) => args.get(i + 1).ok_or("--replicas needs a count")?.parse()?,
        None => 1,
    };
    let sizes: Vec<usize> = match args.iter().position(|a| a == "--bytes") {
        Some(i) => args
            .get(i + 1)
            .ok_or("--bytes needs a list")?
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()?,
        None => vec![4 << 10, 1 << 20, 64 << 20],
    };
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices: (0..replicas).map(|r| format!("/cpu:{r}")).collect(),
        ..MultiWorkerConfig::default()
    })?;
    let chief = strategy.is_chief();
    let workers = strategy.num_workers();
    for bytes in sizes {
        let len = bytes / 4;
        let reps = (256 << 20) / bytes.max(1);
        let reps = reps.clamp(5, 2000);
        // Ours: every replica all-reduces `reps` times inside one step; replica 0 times them.
        let ours = strategy.run(
            |ctx, ()| {
                let t = Tensor::from_vec(ctx.device(), &[len], vec![1.0f32; len])?;
                let mut times = Vec::with_capacity(reps);
                for _ in 0..reps + 3 {
                    let start = Instant::now();
                    ctx.collectives().all_reduce(ReduceOp::Sum, &t)?;
                    times.push(start.elapsed());
                }
                Ok::<f64, StrategyError>(median(times.split_off(3)))
            },
            &(),
        )?;
        let ours = *ours.local_results()[0];
        // Raw MPI_Allreduce of the same bytes, buffers reused.
        let world = strategy.backend().world();
        let send = vec![1.0f32; len];
        let mut recv = vec![0.0f32; len];
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps + 3 {
            let start = Instant::now();
            world.raw_all_reduce_sum_f32(&send, &mut recv);
            times.push(start.elapsed());
        }
        let raw = median(times.split_off(3));
        if chief {
            println!(
                "{}",
                serde_json::json!({
                    "bench": "multi_worker_all_reduce",
                    "workers": workers,
                    "replicas_per_worker": replicas,
                    "bytes": bytes,
                    "median_s": ours,
                    "algbw_gbps": bytes as f64 / ours / 1e9,
                    "mpi_ratio": raw / ours,
                })
            );
        }
    }
    let mut times = Vec::new();
    for _ in 0..503 {
        let start = Instant::now();
        strategy.run(
            |ctx, ()| ctx.all_reduce(ReduceOp::Sum, &Tensor::scalar(ctx.device(), 1.0f32)),
            &(),
        )?;
        times.push(start.elapsed());
    }
    if chief {
        println!(
            "{}",
            serde_json::json!({
                "bench": "multi_worker_step",
                "workers": workers,
                "median_s": median(times.split_off(3)),
            })
        );
    }
    Ok(())
}
