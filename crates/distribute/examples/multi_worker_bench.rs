//! `cargo xtask bench multi-worker`: `MultiWorkerMirroredStrategy` across worker processes,
//! started by `mpirun -n W` (built with the feature `mpi`). The chief prints one JSON line per
//! case:
//!
//! - `multi_worker_all_reduce`: one `all_reduce` (SUM, f32) inside a step, timed on local
//!   replica 0 from the call to its result, for 4 KiB, 1 MiB and 64 MiB; `mpi_ratio` is a raw
//!   `MPI_Allreduce` of the same bytes, timed in the same run, over ours (1 means no overhead);
//! - `multi_worker_step`: one `run` of a step that only returns its replica id;
//! - `multi_worker_linreg`: the reference linear regression's steps per second.
//!
//! Every worker makes the same number of calls (fixed counts, not time budgets: a worker that
//! stopped early would leave the others waiting). Medians, since the machine is shared.
//!
//! ```text
//! cargo build --release -p distribute --example multi_worker_bench --features mpi
//! mpirun -n 2 target/release/examples/multi_worker_bench --replicas 1
//! ```

#[cfg(feature = "mpi")]
#[path = "linear_regression.rs"]
#[allow(dead_code)]
mod linear_regression;

#[cfg(feature = "mpi")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    bench::run()
}

#[cfg(not(feature = "mpi"))]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    Err("the multi-worker bench needs the `mpi` feature: `cargo xtask bench multi-worker`".into())
}

#[cfg(feature = "mpi")]
mod bench {
    use std::time::Instant;

    use distribute::collectives::MpiWorld;
    use distribute::prelude::*;
    use serde_json::json;

    use super::linear_regression;

    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;
    /// Message sizes and how many timed calls each gets.
    const SIZES: [(usize, usize); 3] = [(4 * KIB, 2000), (MIB, 200), (64 * MIB, 12)];
    const TRIVIAL_STEPS: usize = 3000;
    const LINREG_STEPS: usize = 1000;

    pub(super) fn run() -> Result<(), Box<dyn std::error::Error>> {
        let mut replicas = 1;
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--replicas" => {
                    replicas = args
                        .next()
                        .and_then(|n| n.parse().ok())
                        .filter(|n| *n > 0)
                        .ok_or("--replicas needs a positive number")?;
                }
                other => return Err(format!("unknown argument '{other}'; use --replicas N").into()),
            }
        }
        let devices: Vec<String> = (0..replicas).map(|r| format!("/cpu:{r}")).collect();
        let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
            local_devices: devices,
            ..MultiWorkerConfig::default()
        })?;
        let workers = strategy.num_workers();
        let chief = strategy.is_chief();
        let world = MpiWorld::get()?;

        for (bytes, calls) in SIZES {
            let len = bytes / 4;
            // Replica id `i` contributes i + 1 everywhere, on its own device.
            let inputs =
                per_replica_inputs(strategy.distribute_values_from_function(|id, _| {
                    Tensor::from_vec(
                        &format!("/cpu:{}", id % replicas),
                        &[len],
                        vec![(id + 1) as f32; len],
                    )
                    .expect("as many values as the shape holds")
                })?)?;
            // The expected sum, checked once: 1 + 2 + … + W·R.
            let n = strategy.num_replicas_in_sync();
            let expected = (n * (n + 1) / 2) as f32;
            let mut ours = Vec::with_capacity(calls);
            let mut raw = Vec::with_capacity(calls);
            let send = vec![1.0f32; len];
            let mut recv = vec![0.0f32; len];
            // Alternate blocks of each, so that both see the same machine.
            for round in 0..2 {
                for call in 0..calls / 2 {
                    let (seconds, first): (Leaf<f64>, Leaf<f32>) = strategy.run(
                        |ctx, t: Tensor| {
                            let start = Instant::now();
                            let sum = ctx.all_reduce(ReduceOp::Sum, &t)?;
                            let seconds = start.elapsed().as_secs_f64();
                            Ok((seconds, sum.to_vec::<f32>()?[0]))
                        },
                        &inputs,
                    )?;
                    if round == 0 && call == 0 && *first.local_results()[0] != expected {
                        return Err(format!(
                            "the all-reduce of {bytes} bytes gave {}, not {expected}",
                            first.local_results()[0]
                        )
                        .into());
                    }
                    ours.push(*seconds.local_results()[0]);
                }
                for _ in 0..calls / 2 {
                    let start = Instant::now();
                    world.raw_all_reduce_sum_f32(&send, &mut recv);
                    raw.push(start.elapsed().as_secs_f64());
                }
            }
            let (ours, raw) = (median(&mut ours), median(&mut raw));
            if chief {
                println!(
                    "{}",
                    json!({
                        "bench": "multi_worker_all_reduce", "workers": workers,
                        "replicas_per_worker": replicas, "bytes": bytes, "median_s": ours,
                        "algbw_gbps": bytes as f64 / ours / 1e9, "mpi_ratio": raw / ours,
                        "mpi_median_s": raw,
                    })
                );
            }
        }

        let mut steps = Vec::with_capacity(TRIVIAL_STEPS);
        for _ in 0..TRIVIAL_STEPS {
            let start = Instant::now();
            let ids: Leaf<usize> = strategy.run(|ctx, ()| Ok(ctx.replica_id()), &())?;
            steps.push(start.elapsed().as_secs_f64());
            std::hint::black_box(ids);
        }
        if chief {
            println!(
                "{}",
                json!({
                    "bench": "multi_worker_step", "workers": workers,
                    "replicas_per_worker": replicas, "median_s": median(&mut steps),
                })
            );
        }
        drop(strategy);

        let (trained, _, chief) = linear_regression::train_multi_worker(replicas, LINREG_STEPS)?;
        if chief {
            println!(
                "{}",
                json!({
                    "bench": "multi_worker_linreg", "workers": workers,
                    "replicas_per_worker": replicas, "steps_per_s": trained.steps_per_s,
                })
            );
        }
        Ok(())
    }

    fn median(values: &mut [f64]) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }
}
