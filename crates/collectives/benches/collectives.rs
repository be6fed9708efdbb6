//! `cargo xtask bench collectives`: all-reduce from persistent replica threads, one JSON line per
//! case, with nccl-tests' bandwidth definitions and the machine's a+b→out memory bandwidth
//! measured in the same run.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a quick smoke run that still
//! checks the results. `COLLECTIVES_BENCH_BYTES=4096,67108864` runs only those sizes, at 2
//! replicas or at `COLLECTIVES_BENCH_REPLICAS` (1 measures a call's own cost, with no peer to
//! wait for), for profiling one case.

use std::sync::Arc;
use std::time::{Duration, Instant};

use distribute_collectives::{
    CrossDeviceOps, GroupConfig, ReductionToOneDevice, SharedMemoryAllReduce,
};
use serde_json::json;

#[path = "rig/mod.rs"]
mod rig;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (replica_counts, sizes, membw_bytes): (&[usize], &[usize], usize) = if full {
        (
            &[2, 4, 8],
            &[4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB],
            64 * MIB,
        )
    } else {
        (&[2, 3], &[4 * KIB, 64 * KIB], MIB)
    };
    let only: Option<Vec<usize>> = std::env::var("COLLECTIVES_BENCH_BYTES").ok().map(|list| {
        list.split(',')
            .map(|b| {
                b.trim()
                    .parse()
                    .expect("COLLECTIVES_BENCH_BYTES: byte counts")
            })
            .collect()
    });
    let only_replicas: [usize; 1] = [std::env::var("COLLECTIVES_BENCH_REPLICAS").map_or(2, |n| {
        n.parse()
            .expect("COLLECTIVES_BENCH_REPLICAS: a replica count")
    })];
    let (replica_counts, sizes) = match &only {
        Some(only) => (&only_replicas[..], &only[..]),
        None => (replica_counts, sizes),
    };
    let membw = memory_bandwidth(membw_bytes, full);
    for &replicas in replica_counts {
        for &bytes in sizes {
            for backend in ["SharedMemoryAllReduce", "ReductionToOneDevice"] {
                let ops: Arc<dyn CrossDeviceOps> = match backend {
                    "SharedMemoryAllReduce" => Arc::new(
                        SharedMemoryAllReduce::new(replicas, GroupConfig::default()).unwrap(),
                    ),
                    _ => Arc::new(
                        ReductionToOneDevice::new(replicas, GroupConfig::default()).unwrap(),
                    ),
                };
                let rig = rig::Rig::new(ops, replicas, bytes);
                check(&rig, replicas, bytes);
                let median = median_time(
                    &rig,
                    if full {
                        Duration::from_millis(25)
                    } else {
                        Duration::from_micros(200)
                    },
                    if full { 11 } else { 3 },
                );
                let t = median.as_secs_f64();
                let algbw = bytes as f64 / t / 1e9;
                let busbw = algbw * 2.0 * (replicas - 1) as f64 / replicas as f64;
                // Every input is read once and the shared output written once.
                let traffic = (replicas + 1) as f64 * bytes as f64 / t / 1e9;
                println!(
                    "{}",
                    json!({
                        "op": "all_reduce", "backend": backend, "replicas": replicas, "bytes": bytes,
                        "median_s": t, "algbw_gbps": algbw, "busbw_gbps": busbw,
                        "membw_ratio": traffic / membw,
                    })
                );
            }
        }
    }
}

/// The all-reduce sums correctly before it is timed.
fn check(rig: &rig::Rig, replicas: usize, bytes: usize) {
    let out = rig.result().to_vec::<f32>().unwrap();
    let expected: Vec<f32> = (0..replicas)
        .map(|r| rig::input(r, bytes).to_vec::<f32>().unwrap())
        .fold(vec![0.0; bytes / 4], |acc, x| {
            acc.iter().zip(&x).map(|(a, b)| a + b).collect()
        });
    assert_eq!(
        out, expected,
        "all-reduce of {bytes} bytes over {replicas} replicas"
    );
}

/// The median per-call time over `batches` batches of calls, each batch lasting about `target`.
fn median_time(rig: &rig::Rig, target: Duration, batches: usize) -> Duration {
    rig.run(3);
    let once = rig.run(5) / 5;
    let iters = (target.as_nanos() / once.as_nanos().max(1)).clamp(1, 1_000_000) as usize;
    let mut per_call: Vec<Duration> = (0..batches)
        .map(|_| rig.run(iters) / iters as u32)
        .collect();
    per_call.sort();
    per_call[batches / 2]
}

/// GB/s of memory traffic for `out = a + b` on f32 arrays of `bytes`, the best of one thread and
/// all cores; printed as its own line.
fn memory_bandwidth(bytes: usize, full: bool) -> f64 {
    let len = bytes / 4;
    let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..len).map(|i| 2.0 * i as f32).collect();
    let mut out = vec![0.0f32; len];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut best = 0.0f64;
    for threads in [1, cores] {
        let mut times = Vec::new();
        for _ in 0..if full { 9 } else { 3 } {
            let start = Instant::now();
            let chunk = len.div_ceil(threads);
            std::thread::scope(|s| {
                for ((o, x), y) in out
                    .chunks_mut(chunk)
                    .zip(a.chunks(chunk))
                    .zip(b.chunks(chunk))
                {
                    s.spawn(move || {
                        for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
                            *o = x + y;
                        }
                    });
                }
            });
            times.push(start.elapsed());
        }
        times.sort();
        let gbps = 3.0 * bytes as f64 / times[times.len() / 2].as_secs_f64() / 1e9;
        println!(
            "{}",
            json!({"op": "membw_a_plus_b", "threads": threads, "bytes": bytes, "gbps": gbps})
        );
        best = best.max(gbps);
    }
    assert!(out[len - 1] == 3.0 * (len - 1) as f32);
    best
}
