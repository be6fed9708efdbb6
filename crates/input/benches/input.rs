//! Input throughput: a distributed dataset (split into per-replica batches, prefetched on a
//! background thread) against iterating the raw batched source, in the same run.
//!
//! `cargo xtask bench input` prints one JSON line per case:
//! `{"bench": "input", "source": …, "replicas": N, "samples_per_s": …, "raw_samples_per_s": …,
//! "ratio": …}`. Both loops consume every value (a checksum), so the ratio measures what the
//! split and the hand-over between threads cost a consumer; the checksums must agree. Rates are
//! medians of 31 repetitions, and the ratio is the median of each back-to-back pair's ratio,
//! the pair's order alternating (the machine is shared and noisy). Prefetch depth is `InputOptions`' default unless
//! `INPUT_BENCH_PREFETCH` sets it; `INPUT_BENCH_ONLY` (e.g. `memory:8,csv`) runs only the
//! cases it names. Without `--bench` in the arguments (as under
//! `cargo test --all-targets`) it runs tiny sizes once, checking results only.

use std::path::PathBuf;
use std::time::Instant;

use distribute_input::{
    CsvOptions, CsvSource, Dataset, DistributedDataset, InputOptions, InputWorkers, NpySource, npy,
};
use distribute_tensor::{DType, Tensor};

const FEATURES: usize = 32;
const BATCH: usize = 256;

struct Sizes {
    rows: usize,
    csv_rows: usize,
    repetitions: usize,
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let sizes = if full {
        Sizes {
            rows: 1 << 18,
            csv_rows: 1 << 15,
            repetitions: 31,
        }
    } else {
        Sizes {
            rows: 4096,
            csv_rows: 1024,
            repetitions: 1,
        }
    };
    let dir = std::env::temp_dir().join(format!("distribute-input-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp folder for the bench files");

    let memory = Dataset::from_tensors(features(0, sizes.rows))
        .unwrap()
        .batch(BATCH, false)
        .unwrap();
    for replicas in [1, 2, 4, 8] {
        run_case("memory", &memory, replicas, &sizes);
    }
    let npy_files = write_npy(&dir, sizes.rows, 8);
    let npy = Dataset::from_source(NpySource::new(&npy_files).unwrap())
        .batch(BATCH, false)
        .unwrap();
    run_case("npy", &npy, 2, &sizes);
    let csv_files = write_csv(&dir, sizes.csv_rows, 8);
    let options = CsvOptions {
        has_header: false,
        dtype: DType::F32,
        ..CsvOptions::default()
    };
    let csv = Dataset::from_source(CsvSource::new(&csv_files, options).unwrap())
        .batch(BATCH, false)
        .unwrap();
    run_case("csv", &csv, 2, &sizes);
    std::fs::remove_dir_all(&dir).ok();
}

/// Rows `start..start + rows` of small integers (exact in f32 and in f64 sums).
fn features(start: usize, rows: usize) -> Tensor {
    let data: Vec<f32> = (start * FEATURES..(start + rows) * FEATURES)
        .map(|i| (i % 7) as f32)
        .collect();
    Tensor::from_vec("/cpu:0", &[rows, FEATURES], data).unwrap()
}

fn write_npy(dir: &std::path::Path, rows: usize, files: usize) -> Vec<PathBuf> {
    (0..files)
        .map(|f| {
            let path = dir.join(format!("part-{f}.npy"));
            npy::write(&path, &features(f * rows / files, rows / files)).unwrap();
            path
        })
        .collect()
}

fn write_csv(dir: &std::path::Path, rows: usize, files: usize) -> Vec<PathBuf> {
    (0..files)
        .map(|f| {
            let path = dir.join(format!("part-{f}.csv"));
            let t = features(f * rows / files, rows / files);
            let values = t.to_vec::<f32>().unwrap();
            let text: String = values
                .chunks(FEATURES)
                .map(|row| {
                    row.iter()
                        .map(|v| v.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                        + "\n"
                })
                .collect();
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect()
}

fn checksum(t: &Tensor) -> f64 {
    let a = t.array::<f32>().unwrap();
    match a.as_slice() {
        Some(s) => s.iter().map(|x| f64::from(*x)).sum(),
        None => a.iter().map(|x| f64::from(*x)).sum(),
    }
}

/// Samples and checksum of one pass over the raw batches.
fn raw_pass(ds: &Dataset<Tensor>) -> (usize, f64) {
    let (mut samples, mut sum) = (0, 0.0);
    for batch in ds.iter() {
        let batch = batch.unwrap();
        samples += batch.shape()[0];
        sum += checksum(&batch);
    }
    (samples, sum)
}

/// Samples and checksum of one pass over the distributed steps.
fn distributed_pass(dist: &DistributedDataset<Tensor>) -> (usize, f64) {
    let (mut samples, mut sum) = (0, 0.0);
    // Steps as a training loop gets them: regrouped for `run`.
    for step in dist.iter() {
        for batch in step.unwrap().local_results() {
            samples += batch.shape()[0];
            sum += checksum(batch);
        }
    }
    (samples, sum)
}

/// Whether `INPUT_BENCH_ONLY` (a comma-separated list of `source` or `source:replicas`, e.g.
/// `memory:8,csv`) selects this case; every case runs when it is unset.
fn selected(source: &str, replicas: usize) -> bool {
    std::env::var("INPUT_BENCH_ONLY").map_or(true, |only| {
        only.split(',').any(|case| {
            let case = case.trim();
            case == source || case == format!("{source}:{replicas}")
        })
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn run_case(source: &str, ds: &Dataset<Tensor>, replicas: usize, sizes: &Sizes) {
    if !selected(source, replicas) {
        return;
    }
    let workers = InputWorkers::local((0..replicas).map(|i| format!("/cpu:{i}"))).unwrap();
    let prefetch: usize =
        std::env::var("INPUT_BENCH_PREFETCH").map_or(InputOptions::default().prefetch, |v| {
            v.parse()
                .expect("INPUT_BENCH_PREFETCH must be a number of steps")
        });
    let dist = DistributedDataset::new(
        ds.clone(),
        &workers,
        InputOptions {
            prefetch,
            ..InputOptions::default()
        },
    )
    .unwrap();
    // Warm the page cache and the allocator, and check the two paths agree.
    let reference = raw_pass(ds);
    assert_eq!(
        distributed_pass(&dist),
        reference,
        "{source}: distributed data differs from the source"
    );
    let (mut raw_rates, mut rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for repetition in 0..sizes.repetitions {
        let timed = |pass: &dyn Fn() -> (usize, f64)| {
            let start = Instant::now();
            let got = pass();
            (got, got.0 as f64 / start.elapsed().as_secs_f64())
        };
        // Alternating which loop goes first cancels a drift in the machine's load.
        let ((raw, raw_rate), (got, rate)) = if repetition % 2 == 0 {
            let raw = timed(&|| raw_pass(ds));
            (raw, timed(&|| distributed_pass(&dist)))
        } else {
            let got = timed(&|| distributed_pass(&dist));
            (timed(&|| raw_pass(ds)), got)
        };
        assert_eq!(
            (raw, got),
            (reference, reference),
            "{source}: a pass read different data"
        );
        raw_rates.push(raw_rate);
        rates.push(rate);
        // Each pair ran back to back, so its ratio sees the same load from other processes.
        ratios.push(rate / raw_rate);
    }
    let (raw, dist, ratio) = (median(raw_rates), median(rates), median(ratios));
    // Written by hand to keep the documented key order (serde_json sorts object keys).
    println!(
        "{{\"bench\": \"input\", \"source\": {}, \"replicas\": {replicas}, \
         \"samples_per_s\": {dist:.0}, \"raw_samples_per_s\": {raw:.0}, \"ratio\": {:.3}}}",
        serde_json::to_string(source).unwrap(),
        ratio
    );
}
