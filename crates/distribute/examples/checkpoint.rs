//! A checkpoint saved on N replicas and restored on M. A distributed variable saves its
//! *logical* value (`save`): a mirrored variable its one value, a sync-on-read sum its total.
//! `restore` spreads it over however many replicas the new strategy has, so the replica count
//! may change between the run that saves and the one that resumes.
//!
//! ```text
//! cargo run -p distribute --example checkpoint -- 4 3   # save on 4 replicas, restore on 3
//! ```

use std::collections::BTreeMap;
use std::error::Error;
use std::path::Path;

use distribute::prelude::*;
use distribute::values::SavedValue;

/// A weight every replica keeps a copy of, and the examples seen, which each replica counts
/// on its own copy and a read sums.
fn variables(strategy: &MirroredStrategy) -> Result<[DistributedVariable<f64>; 2], StrategyError> {
    let sum_on_read = VariableOptions {
        synchronization: VariableSynchronization::OnRead,
        aggregation: VariableAggregation::Sum,
        trainable: None,
    };
    Ok([
        strategy.create_variable("weight", 0.0, VariableOptions::default())?,
        strategy.create_variable("seen", 0.0, sum_on_read)?,
    ])
}

/// Trains 3 steps on `replicas` replicas and writes the checkpoint to `path`: JSON, one
/// plain value per variable.
pub(crate) fn train_and_save(replicas: usize, path: &Path) -> Result<[f64; 2], Box<dyn Error>> {
    let strategy = MirroredStrategy::new(LocalDevices::cpus(replicas))?;
    let [weight, seen] = variables(&strategy)?;
    for _ in 0..3 {
        strategy.run(
            |ctx, ()| {
                // Replica r saw r + 1 examples; the weight takes one step of 0.5 per step.
                ctx.update_variable(&seen, UpdateOp::AssignAdd, ctx.replica_id() as f64 + 1.0)?;
                ctx.merge_call((), |cross, ()| {
                    cross.update(&weight, UpdateOp::AssignAdd, &Leaf::Same(0.5))
                })
            },
            &(),
        )?;
    }
    let checkpoint = BTreeMap::from([("weight", weight.save()?), ("seen", seen.save()?)]);
    std::fs::write(path, serde_json::to_string(&checkpoint)?)?;
    let cross = strategy.cross_replica();
    Ok([cross.read_var(&weight)?, cross.read_var(&seen)?])
}

/// Restores the checkpoint at `path` on `replicas` replicas: the logical values, and each
/// replica's own copy of `seen`.
pub(crate) fn restore(
    replicas: usize,
    path: &Path,
) -> Result<([f64; 2], Vec<f64>), Box<dyn Error>> {
    let strategy = MirroredStrategy::new(LocalDevices::cpus(replicas))?;
    let [weight, seen] = variables(&strategy)?;
    let checkpoint: BTreeMap<String, SavedValue<f64>> =
        serde_json::from_str(&std::fs::read_to_string(path)?)?;
    weight.restore(&checkpoint["weight"])?;
    seen.restore(&checkpoint["seen"])?;
    let copies = (0..replicas)
        .map(|r| seen.component(r).map(|copy| copy.read()))
        .collect::<Result<_, _>>()?;
    let cross = strategy.cross_replica();
    Ok(([cross.read_var(&weight)?, cross.read_var(&seen)?], copies))
}

fn main() -> Result<(), Box<dyn Error>> {
    let arg = |i, default| std::env::args().nth(i).map_or(Ok(default), |a| a.parse());
    let (saved_on, restored_on) = (arg(1, 4)?, arg(2, 3)?);
    let path = std::env::temp_dir().join("distribute-checkpoint-example.json");
    let [weight, seen] = train_and_save(saved_on, &path)?;
    println!(
        "saved on {saved_on} replicas: weight {weight}, seen {seen} ({})",
        path.display()
    );
    let ([weight, seen], copies) = restore(restored_on, &path)?;
    println!(
        "restored on {restored_on} replicas: weight {weight}, seen {seen} (copies {copies:?})"
    );
    Ok(())
}
