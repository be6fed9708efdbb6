//! The program of the downstream crate that trains on several workers (copied into its
//! `src/main.rs`): a candle linear classifier on `MultiWorkerMirroredStrategy`, each replica
//! computing its own rows from its global id and the step, so 2 workers × 1 replica and 1
//! worker × 2 replicas see the same data. The chief writes every loss and weight as the hex of
//! its f32 bits to `--out` (replica 0's losses).

use std::collections::HashMap;
use std::error::Error;
use std::fmt::Write as _;
use std::num::NonZeroUsize;

use candle_core::{D, Device, Tensor};
use candle_nn::{Module, Optimizer, SGD, VarBuilder};
use distribute_candle::{Config, CpuThreads, DataParallel};
use distribute_device_spec::LocalDevices;
use distribute_multi_worker::{MultiWorkerConfig, MultiWorkerMirroredStrategy};
use distribute_strategy::Strategy;
use distribute_values::ReduceOp;

const STEPS: usize = 8;
const ROWS_PER_REPLICA: usize = 8;

/// The value of `--name VALUE` on the command line.
fn arg(name: &str) -> Result<String, Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let at = args
        .iter()
        .position(|a| a == name)
        .ok_or(format!("missing {name}"))?;
    Ok(args
        .get(at + 1)
        .ok_or(format!("{name} needs a value"))?
        .clone())
}

/// Replica `replica`'s rows at `step`: 4 features and a class each.
fn batch(step: usize, replica: usize, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let seed = step * 131 + replica * 17;
    let x: Vec<f32> = (0..ROWS_PER_REPLICA * 4)
        .map(|i| ((seed + i * 7) % 13) as f32 / 13.0 - 0.4)
        .collect();
    let y: Vec<u32> = (0..ROWS_PER_REPLICA)
        .map(|i| ((seed + i * 5) % 3) as u32)
        .collect();
    Ok((
        Tensor::from_vec(x, (ROWS_PER_REPLICA, 4), device)?,
        Tensor::from_vec(y, ROWS_PER_REPLICA, device)?,
    ))
}

fn main() -> Result<(), Box<dyn Error>> {
    let replicas: usize = arg("--replicas")?.parse()?;
    let out = arg("--out")?;
    let strategy = MultiWorkerMirroredStrategy::with_config(MultiWorkerConfig {
        local_devices: LocalDevices::cpus(replicas),
        ..MultiWorkerConfig::default()
    })?;
    let config = Config {
        threads: CpuThreads::PerReplica(NonZeroUsize::MIN),
        ..Config::default()
    };
    let model = DataParallel::new(
        &strategy,
        config,
        |vb: VarBuilder| candle_nn::linear(4, 3, vb.pp("l1")),
        |vars| SGD::new(vars, 0.5),
    )?;
    // The same start in every run, whatever the initialiser drew.
    let weight: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) / 10.0).collect();
    model.assign(HashMap::from([
        (
            "l1.weight".to_owned(),
            Tensor::from_vec(weight, (3, 4), &Device::Cpu)?,
        ),
        (
            "l1.bias".to_owned(),
            Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu)?,
        ),
    ]))?;
    let mut report = String::new();
    for step in 0..STEPS {
        let losses = model.run(&(), |replica, ()| {
            let (x, y) = batch(step, replica.replica_id(), replica.device())?;
            let log_p = candle_nn::ops::log_softmax(&replica.model().forward(&x)?, D::Minus1)?;
            let picked = log_p.gather(&y.unsqueeze(1)?, 1)?.sum_all()?;
            let global_rows = (ROWS_PER_REPLICA * replica.num_replicas_in_sync()) as f64;
            let loss = (picked * (-1.0 / global_rows))?;
            replica.backward_step(&loss, ReduceOp::Sum)?;
            Ok(loss.to_scalar::<f32>()?)
        })?;
        // Replica 0's: the chief's first replica, however the replicas are spread.
        writeln!(report, "step {step} loss {:08x}", losses[0].to_bits())?;
    }
    for name in ["l1.weight", "l1.bias"] {
        let values = model.variable(0, name)?.flatten_all()?.to_vec1::<f32>()?;
        let bits: Vec<String> = values
            .iter()
            .map(|v| format!("{:08x}", v.to_bits()))
            .collect();
        writeln!(report, "{name} {}", bits.join(" "))?;
    }
    if strategy.is_chief() {
        std::fs::write(&out, report)?;
    }
    Ok(())
}
