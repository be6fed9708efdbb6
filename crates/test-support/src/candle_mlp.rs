//! The reference classification workload of `distribute-candle` (its `candle_mlp` example), so
//! other frameworks can train exactly the same thing:
//!
//! - [`ROWS`] = 8192 rows of [`FEATURES`] = 64 features: row `i`, feature `j` is
//!   `((i·64 + j)·2654435761 mod 2^32) / 2^32 − 0.5` (u64 arithmetic, the quotient in f64,
//!   stored as f32);
//! - label `i` is the argmax over `k` in `0..10` of `Σ_j x[i][j]·t[k][j]`, in f64 from the f64
//!   features (before rounding), with `t[k][j] = ((k·64 + j)·40503 mod 2^16) / 2^16 − 0.5`;
//! - the model is 64 → 512 ReLU → 512 ReLU → 10 (`candle_nn::Linear` layers `l1`, `l2`, `l3`),
//!   the loss the mean cross-entropy over the global batch of [`GLOBAL_BATCH`] = 512, plain SGD
//!   at [`LEARNING_RATE`] = 0.05; step `s` takes rows `(s·512 mod 8192) ..` + 512 in order (no
//!   shuffle), cut into contiguous per-replica chunks in global replica order; [`STEPS`] = 200.

/// Rows of the data set.
pub const ROWS: usize = 8192;
/// Features per row.
pub const FEATURES: usize = 64;
/// Classes.
pub const CLASSES: usize = 10;
/// Hidden units of both hidden layers.
pub const HIDDEN: usize = 512;
/// Rows per step, over all replicas.
pub const GLOBAL_BATCH: usize = 512;
/// Plain SGD's learning rate.
pub const LEARNING_RATE: f64 = 0.05;
/// Training steps of the reference run.
pub const STEPS: usize = 200;

/// Feature `j` of row `i`, in f64 (before the f32 rounding).
pub fn feature(i: usize, j: usize) -> f64 {
    let k = (i * FEATURES + j) as u64;
    (k.wrapping_mul(2_654_435_761) % (1u64 << 32)) as f64 / (1u64 << 32) as f64 - 0.5
}

/// The weight of class `k` for feature `j` in the labelling rule.
pub fn teacher(k: usize, j: usize) -> f64 {
    let n = (k * FEATURES + j) as u64;
    (n * 40_503 % (1u64 << 16)) as f64 / (1u64 << 16) as f64 - 0.5
}

/// Every row's features (row-major, `ROWS × FEATURES`, f32) and label (`0..CLASSES`).
pub fn rows() -> (Vec<f32>, Vec<i64>) {
    let mut x = Vec::with_capacity(ROWS * FEATURES);
    let mut labels = Vec::with_capacity(ROWS);
    for i in 0..ROWS {
        let row: Vec<f64> = (0..FEATURES).map(|j| feature(i, j)).collect();
        let scores = (0..CLASSES).map(|k| {
            row.iter()
                .enumerate()
                .map(|(j, x)| x * teacher(k, j))
                .sum::<f64>()
        });
        let label = scores
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (k, s)| {
                if s > best.1 { (k, s) } else { best }
            })
            .0;
        x.extend(row.iter().map(|&v| v as f32));
        labels.push(label as i64);
    }
    (x, labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_follow_the_specification() {
        let (x, labels) = rows();
        assert_eq!(x.len(), ROWS * FEATURES);
        assert_eq!(x[0], -0.5);
        // (1·2654435761 mod 2^32) / 2^32 − 0.5
        assert_eq!(x[1], (2_654_435_761.0f64 / 4_294_967_296.0 - 0.5) as f32);
        assert!(x.iter().all(|v| (-0.5..0.5).contains(v)));
        let mut seen = [0usize; CLASSES];
        for &l in &labels {
            seen[l as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "every class occurs: {seen:?}");
    }
}
