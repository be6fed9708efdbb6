//! `cargo xtask bench tpu`: the linear-regression step of shared/notes/targets.md (64 features,
//! global batch 256, SGD lr 0.1) on TpuStrategy and on MirroredStrategy in one run, one JSON line
//! per case: `tpu_compile` (trace + compile + first step), `tpu_step` (one launch per step,
//! the weights a device variable whose buffers each step replaces, the data on the devices),
//! `tpu_run_steps` (all steps in one device loop carrying the variable) and
//! `mirrored_step` (host threads, host all-reduce). `median_s` is per step (per compile);
//! `platform` is the PJRT plugin's (`cpu`, `cuda`) for the `tpu_*` cases and `cpu` for
//! `mirrored_step`.
//!
//! It runs on 1, 2 and 4 replicas, those the plugin can give (one GPU gives 1; see
//! `tests/devices/mod.rs`), and prints a `skipped:` line for each count it cannot. Without
//! `--bench` (as `cargo test --all-targets` runs it) it does a quick smoke run on 1 and 2
//! replicas that still checks that both strategies train the same weights.

use std::time::Instant;

use distribute_device_spec::LocalDevices;
use distribute_mirrored::MirroredStrategy;
use distribute_tpu::{StepInput, TpuConfig, TpuStrategy};
use serde_json::json;

#[path = "../tests/devices/mod.rs"]
mod devices;
#[path = "../tests/workload/mod.rs"]
mod workload;
use workload::{data, sgd_step, shards, stack, train_mirrored, weights};

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (replica_counts, steps, repeats): (&[usize], usize, usize) = if full {
        (&[1, 2, 4], 200, 7)
    } else {
        (&[1, 2], 5, 1)
    };
    let platform = devices::offer().platform();
    // MirroredStrategy's replicas are host threads whatever the plugin is.
    let report = |bench: &str, replicas: usize, median_s: f64| {
        let platform = if bench == "mirrored_step" {
            "cpu"
        } else {
            platform
        };
        println!(
            "{}",
            json!({"bench": bench, "platform": platform, "replicas": replicas,
                   "median_s": median_s, "per_s": 1.0 / median_s})
        );
    };
    let (x, y) = data();
    for n in devices::counts(replica_counts) {
        let tpu = TpuStrategy::new(TpuConfig::cpu(n)).unwrap_or_else(|err| panic!("{err}"));
        let (xs, ys) = shards(&tpu, &x, &y);
        let xd = tpu.to_device(StepInput::PerReplica(&xs)).unwrap();
        let yd = tpu.to_device(StepInput::PerReplica(&ys)).unwrap();

        let compile = median(repeats, || {
            let w = weights(&tpu);
            let start = Instant::now();
            let f = tpu.function(sgd_step);
            f.run_updating(&[&w], &[StepInput::Device(&xd), StepInput::Device(&yd)])
                .unwrap();
            w.read_replica(0).unwrap();
            start.elapsed().as_secs_f64()
        });
        report("tpu_compile", n, compile);

        let f = tpu.function(sgd_step);
        // Compile outside the timed steps.
        let w = weights(&tpu);
        f.run_updating(&[&w], &[StepInput::Device(&xd), StepInput::Device(&yd)])
            .unwrap();
        w.read_replica(0).unwrap();
        let mut tpu_weights = Vec::new();
        let step = median(repeats, || {
            // The weights stay on the devices between steps: each step's new buffers replace
            // the variable's, with no copy to the host until the read after the loop.
            let w = weights(&tpu);
            let start = Instant::now();
            for _ in 0..steps {
                f.run_updating(&[&w], &[StepInput::Device(&xd), StepInput::Device(&yd)])
                    .unwrap();
            }
            tpu_weights = w.read_replica(0).unwrap().to_vec::<f32>().unwrap();
            start.elapsed().as_secs_f64() / steps as f64
        });
        report("tpu_step", n, step);

        let stacked_x = tpu
            .to_device(StepInput::PerReplica(&stack(&tpu, &xs, steps)))
            .unwrap();
        let stacked_y = tpu
            .to_device(StepInput::PerReplica(&stack(&tpu, &ys, steps)))
            .unwrap();
        let data = [StepInput::Device(&stacked_x), StepInput::Device(&stacked_y)];
        // The first call compiles the loop program; time the ones after it.
        let w = weights(&tpu);
        f.run_steps_updating(steps, &[&w], &[], &data).unwrap();
        w.read_replica(0).unwrap();
        let mut loop_weights = Vec::new();
        let run_steps = median(repeats, || {
            let w = weights(&tpu);
            let start = Instant::now();
            f.run_steps_updating(steps, &[&w], &[], &data).unwrap();
            loop_weights = w.read_replica(0).unwrap().to_vec::<f32>().unwrap();
            start.elapsed().as_secs_f64() / steps as f64
        });
        report("tpu_run_steps", n, run_steps);

        let mirrored = MirroredStrategy::new(LocalDevices::cpus(n)).unwrap();
        let mut mirrored_weights = Vec::new();
        let mirrored_step = median(repeats, || {
            let start = Instant::now();
            mirrored_weights = train_mirrored(&mirrored, &x, &y, steps);
            start.elapsed().as_secs_f64() / steps as f64
        });
        report("mirrored_step", n, mirrored_step);

        for (what, weights) in [("tpu_step", &tpu_weights), ("tpu_run_steps", &loop_weights)] {
            let worst = weights
                .iter()
                .zip(&mirrored_weights)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 1e-5,
                "{what} weights differ from MirroredStrategy's by {worst}"
            );
        }
    }
}

fn median(repeats: usize, mut sample: impl FnMut() -> f64) -> f64 {
    let mut times: Vec<f64> = (0..repeats).map(|_| sample()).collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
