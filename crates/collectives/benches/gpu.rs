//! `cargo bench -p distribute-collectives --features cuda --bench gpu`: the GPU reduction kernel
//! against the GPU's own device-to-device copy bandwidth, measured in the same run, one JSON line
//! per case.
//!
//! Each case sums `inputs` tensors of `bytes` bytes on GPU 0 through
//! `ReductionToOneDevice::reduce` (values and destination on `/gpu:0`: the NVRTC kernel, plus the
//! output's stream-ordered allocation and the launch), and copies a buffer of the same size with
//! `cuMemcpyDtoDAsync` into a preallocated one. Traffic: the reduction reads every input and
//! writes the output, `(inputs + 1) × bytes`; the copy reads and writes, `2 × bytes`. `ratio` is
//! the reduction's GB/s over the copy's: the kernel is memory bound, so 0.8 or more means it
//! streams at close to the memory system's speed. Times are medians of 21 samples after a
//! warm-up, each sample a batch of calls lasting about 2 ms, closed by a synchronize of the
//! stream the work is queued on.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a quick smoke run. Without a
//! GPU it prints `{"skipped": "<why>"}` and succeeds, unless `DISTRIBUTE_REQUIRE_GPU=1`.

use std::error::Error;
use std::time::{Duration, Instant};

use distribute_collectives::{CrossDeviceOps, Destinations, GroupConfig, ReductionToOneDevice};
use distribute_tensor::cuda::{Gpu, gpu_count, nvrtc_available, require_nvrtc};
use distribute_tensor::{AnyTensor, DType, Placement, Tensor};
use distribute_values::{Leaf, ReduceOp};
use half::{bf16, f16};
use serde_json::json;

type BoxError = Box<dyn Error>;

const MIB: usize = 1 << 20;

fn main() {
    let required = std::env::var("DISTRIBUTE_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let gpu = match open_gpu() {
        Ok(gpu) => gpu,
        Err(why) => {
            println!("{}", json!({ "skipped": why }));
            if required {
                eprintln!("DISTRIBUTE_REQUIRE_GPU=1 but {why}");
                std::process::exit(1);
            }
            return;
        }
    };
    let full = std::env::args().any(|a| a == "--bench");
    if let Err(e) = run(&gpu, full) {
        eprintln!("the GPU benchmark failed: {e}");
        std::process::exit(1);
    }
}

/// GPU 0, or why it cannot run the reduction kernels.
fn open_gpu() -> Result<Gpu, String> {
    match gpu_count() {
        Err(e) => Err(format!("no GPU: {e}")),
        Ok(0) => Err("no GPU: the NVIDIA driver reports 0 GPUs".to_owned()),
        Ok(_) if !nvrtc_available() => Err(format!(
            "the GPU reduction kernels cannot be compiled: {}",
            require_nvrtc()
                .err()
                .map_or_else(String::new, |e| e.to_string())
        )),
        Ok(_) => Gpu::open(0).map_err(|e| format!("GPU 0 does not open: {e}")),
    }
}

fn run(gpu: &Gpu, full: bool) -> Result<(), BoxError> {
    let (major, minor) = gpu.compute_capability()?;
    let name = gpu.name()?;
    println!(
        "{}",
        json!({
            "device": name, "compute_capability": format!("{major}.{minor}"),
            "gpus": gpu_count()?, "mode": if full { "bench" } else { "smoke" },
        })
    );
    let (cases, input_counts, reps): (&[(DType, usize)], &[usize], usize) = if full {
        (
            &[
                (DType::F32, MIB),
                (DType::F32, 16 * MIB),
                (DType::F32, 64 * MIB),
                (DType::F32, 256 * MIB),
                (DType::BF16, 64 * MIB),
                (DType::F16, 64 * MIB),
            ],
            &[2, 4],
            21,
        )
    } else {
        (&[(DType::F32, MIB)], &[2], 3)
    };
    for &(dtype, bytes) in cases {
        for &inputs in input_counts {
            let line = bench_case(gpu, dtype, bytes, inputs, reps)?;
            println!("{line}");
        }
    }
    Ok(())
}

/// Replica `replica`'s input: `bytes` of `dtype`, small values whose sums are exact.
fn input(dtype: DType, replica: usize, bytes: usize) -> Result<Tensor, BoxError> {
    let len = bytes / dtype.size_in_bytes();
    let value = |i: usize| (i % 61) as f32 * 0.25 + replica as f32;
    let device = format!("/cpu:{}", replica + 1);
    Ok(match dtype {
        DType::F32 => Tensor::from_vec(&device, &[len], (0..len).map(value).collect())?,
        DType::BF16 => Tensor::from_vec(
            &device,
            &[len],
            (0..len).map(|i| bf16::from_f32(value(i))).collect(),
        )?,
        DType::F16 => Tensor::from_vec(
            &device,
            &[len],
            (0..len).map(|i| f16::from_f32(value(i))).collect(),
        )?,
        other => return Err(format!("no benchmark input for {other}").into()),
    })
}

/// The one tensor a reduction to one destination delivered.
fn single(result: Leaf<AnyTensor>) -> Result<Tensor, BoxError> {
    match result {
        Leaf::Same(AnyTensor::Dense(t)) => Ok(t),
        _ => Err("a reduction to one device gave more than one dense tensor".into()),
    }
}

fn bench_case(
    gpu: &Gpu,
    dtype: DType,
    bytes: usize,
    inputs: usize,
    reps: usize,
) -> Result<serde_json::Value, BoxError> {
    let host = (0..inputs)
        .map(|r| input(dtype, r, bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let values = host
        .iter()
        .map(|t| Ok(AnyTensor::Dense(t.to_device("/gpu:0").to_gpu(gpu)?)))
        .collect::<Result<Vec<_>, BoxError>>()?;
    let ops = ReductionToOneDevice::new(inputs, GroupConfig::default())?;
    let to_gpu = Destinations::device("/gpu:0")?;

    // The result is right before it is timed: the host kernel's bits.
    let reduced = single(ops.reduce(ReduceOp::Sum, &values, &to_gpu)?)?;
    let host_values: Vec<AnyTensor> = host.iter().cloned().map(AnyTensor::Dense).collect();
    let expected = single(ops.reduce(
        ReduceOp::Sum,
        &host_values,
        &Destinations::device("/cpu:0")?,
    )?)?;
    if reduced.placement() == Placement::Host || !reduced.bitwise_eq(&expected) {
        return Err(format!(
            "the GPU sum of {inputs} x {bytes} bytes of {dtype} differs from the host's (or did \
             not run on the GPU)"
        )
        .into());
    }
    drop((reduced, expected, host_values, host));

    let reduce_s = median_seconds(gpu, reps, || {
        drop(ops.reduce(ReduceOp::Sum, &values, &to_gpu)?);
        Ok(())
    })?;

    let stream = gpu.stream();
    let src = stream.alloc_zeros::<u8>(bytes)?;
    let mut dst = stream.alloc_zeros::<u8>(bytes)?;
    let copy_s = median_seconds(gpu, reps, || {
        stream.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?;

    let reduce_gbps = (inputs + 1) as f64 * bytes as f64 / reduce_s / 1e9;
    let copy_gbps = 2.0 * bytes as f64 / copy_s / 1e9;
    Ok(json!({
        "op": "gpu_reduce_sum", "backend": "ReductionToOneDevice", "dtype": dtype.name(),
        "inputs": inputs, "bytes": bytes,
        "reduce_median_s": reduce_s, "reduce_gbps": reduce_gbps,
        "copy_median_s": copy_s, "copy_gbps": copy_gbps,
        "ratio": reduce_gbps / copy_gbps,
    }))
}

/// The median time per call of `call` over `reps` samples, after a warm-up. Each sample queues
/// calls for about 2 ms and then waits for the GPU, so the time is the GPU's, not the launch's.
fn median_seconds(
    gpu: &Gpu,
    reps: usize,
    mut call: impl FnMut() -> Result<(), BoxError>,
) -> Result<f64, BoxError> {
    let mut batch = |iters: usize| -> Result<Duration, BoxError> {
        let start = Instant::now();
        for _ in 0..iters {
            call()?;
        }
        gpu.synchronize()?;
        Ok(start.elapsed())
    };
    batch(3)?;
    let once = batch(3)? / 3;
    let iters = (Duration::from_millis(2).as_nanos() / once.as_nanos().max(1)).clamp(1, 1000);
    let iters = usize::try_from(iters).unwrap_or(1);
    let mut samples = (0..reps)
        .map(|_| Ok(batch(iters)?.as_secs_f64() / iters as f64))
        .collect::<Result<Vec<f64>, BoxError>>()?;
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}
