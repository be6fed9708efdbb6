//! Cross-worker all-reduce and step timings, printed as JSON lines by worker 0: the program a
//! multi-worker benchmark launches under `mpirun -n W` (`--replicas R`, default 1).
//!
//! `multi_worker_all_reduce` lines compare `MpiAllReduce` (through a step's replica
//! collectives) with a raw `MPI_Allreduce` of the same bytes, timed in the same run:
//! `mpi_ratio` = raw time ÷ ours (1.0: the layer costs nothing). The two take turns, a block of
//! calls each, so noise from a shared machine falls on both alike; the raw calls reuse their
//! buffers, as a plain MPI program would, and ours get a fresh result per call, as a user does. `multi_worker_step` is a trivial
//! step (one scalar all-reduce) through `run`.
//!
//! ```text
//! cargo build --release -p distribute-multi-worker --example multi_worker_bench
//! mpirun -n 2 target/release/examples/multi_worker_bench --replicas 1
//! ```

use std::time::Instant;

use distribute_device_spec::LocalDevices;
use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::{Strategy, StrategyError};
use distribute_tensor::Tensor;
use distribute_values::ReduceOp;

/// Rounds of ours-then-raw blocks per size, after one warm-up round.
const ROUNDS: usize = 8;

fn median(mut seconds: Vec<f64>) -> f64 {
    seconds.sort_unstable_by(f64::total_cmp);
    seconds[seconds.len() / 2]
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
        local_devices: LocalDevices::cpus(replicas),
        ..MultiWorkerConfig::default()
    })?;
    let chief = strategy.is_chief();
    let workers = strategy.num_workers();
    let world = distribute_mpi::MpiWorld::get()?;
    for bytes in sizes {
        let len = bytes / 4;
        let reps = ((1 << 30) / bytes.max(1)).clamp(16, 2000);
        let block = reps.div_ceil(ROUNDS);
        // Ours and the raw MPI_Allreduce take turns, a block of calls each, so both see the
        // same machine (other processes, caches, clock); the first round is warm-up. Ours: a
        // step in which every replica all-reduces `block` times (local replica 0's thread
        // times them); raw: this thread, between steps, as a plain MPI program would.
        let t = Tensor::from_vec("/cpu:0", &[len], vec![1.0f32; len])?;
        let (send, mut recv) = (vec![1.0f32; len], vec![0.0f32; len]);
        let (mut ours, mut raw) = (Vec::new(), Vec::new());
        for round in 0..=ROUNDS {
            let step = strategy.run(
                |ctx, ()| {
                    let t = t.to_device(ctx.device());
                    let mut times = Vec::with_capacity(block);
                    for _ in 0..block {
                        let start = Instant::now();
                        ctx.collectives().all_reduce(ReduceOp::Sum, &t)?;
                        times.push(start.elapsed().as_secs_f64());
                    }
                    Ok::<Vec<f64>, StrategyError>(times)
                },
                &(),
            )?;
            let mut raw_block = Vec::with_capacity(block);
            for _ in 0..block {
                let start = Instant::now();
                world.raw_all_reduce_sum_f32(&send, &mut recv);
                raw_block.push(start.elapsed().as_secs_f64());
            }
            if round > 0 {
                ours.extend(step.iter().map(|leaf| *leaf.local_results()[0]));
                raw.extend(raw_block);
            }
        }
        let (ours, raw) = (median(ours), median(raw));
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
        times.push(start.elapsed().as_secs_f64());
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
