//! Your own struct through the whole stack: `#[derive(Nest)]` makes `Rows` a dataset's batch
//! and a step's input (each replica gets its own `Rows`, its chunk of the global batch), and
//! `Sums` one fused `all_reduce` payload: both of a replica's tensors travel in one call.
//!
//! ```text
//! cargo run -p distribute --example nested_struct -- 2   # the number of replicas
//! ```

use distribute::prelude::*;
use distribute::tensor::Tensor;
use distribute::values::select_replica;

/// A batch of examples: features `[rows, 2]` and targets `[rows]`.
#[derive(Debug, Clone, PartialEq, Nest)]
pub(crate) struct Rows {
    pub(crate) x: Tensor,
    pub(crate) y: Tensor,
}

/// What each replica contributes: Σ x·y over its rows, and how many rows it had.
#[derive(Debug, Clone, PartialEq, Nest)]
pub(crate) struct Sums {
    pub(crate) xy: Tensor,
    pub(crate) rows: Tensor,
}

/// Σ x·y and the row count of every global batch of 4, summed over `replicas` replicas (as
/// replica 0 got them).
pub(crate) fn sums_per_step(replicas: usize) -> Result<Vec<Sums>, Box<dyn std::error::Error>> {
    let strategy = MirroredStrategy::new(LocalDevices::cpus(replicas))?;
    // Row i has features [i, 1] and target i.
    let n = 8;
    let all = Rows {
        x: Tensor::from_vec(
            "/cpu:0",
            &[n, 2],
            (0..n).flat_map(|i| [i as f32, 1.0]).collect(),
        )?,
        y: Tensor::from_vec("/cpu:0", &[n], (0..n).map(|i| i as f32).collect())?,
    };
    let dataset = Dataset::from_tensors(all)?.batch(4, false)?;
    let dataset = strategy.distribute_dataset(dataset, InputOptions::default())?;
    let mut steps = Vec::new();
    for batch in &dataset {
        // `batch` is a `RowsRegrouped`: each field holds every replica's chunk.
        let total = strategy.run(
            |ctx, rows: Rows| {
                let (x, y) = (rows.x.to_vec::<f32>()?, rows.y.to_vec::<f32>()?);
                let mut xy = vec![0.0f32; 2];
                for (row, y) in x.chunks(2).zip(&y) {
                    xy[0] += row[0] * y;
                    xy[1] += row[1] * y;
                }
                let mine = Sums {
                    xy: Tensor::from_vec(ctx.device(), &[2], xy)?,
                    rows: Tensor::scalar(ctx.device(), y.len() as f32),
                };
                ctx.all_reduce(ReduceOp::Sum, &mine) // one rendezvous for the whole struct
            },
            &batch?,
        )?;
        // `total` is a `SumsRegrouped`, which names `Sums` back: replica 0's sums.
        steps.push(select_replica::<Sums>(0, &total)?);
    }
    Ok(steps)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let replicas = std::env::args().nth(1).map_or(Ok(2), |r| r.parse())?;
    for (step, Sums { xy, rows }) in sums_per_step(replicas)?.into_iter().enumerate() {
        let (xy, rows) = (xy.to_vec::<f32>()?, rows.to_vec::<f32>()?[0]);
        println!("step {step}: {rows} rows over {replicas} replicas, Σ x·y = {xy:?}");
    }
    Ok(())
}
