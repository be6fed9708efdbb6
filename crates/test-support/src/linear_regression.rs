//! The reference linear-regression workload: 64 features, global batch 256, SGD at learning
//! rate 0.1 for 200 steps, weights and bias starting at zero. Other frameworks can generate
//! the same rows from this specification and train identically.
//!
//! Data (all f32, so every framework sees the same rows): `h` is lowbias32,
//! `u(k) = (h(k) >> 8) / 2^23 − 1`, `X[i][j] = u(64·i + j)`, `w_true[j] = ((j mod 9) − 4) / 4`,
//! `b_true = 0.5`, `noise[i] = u(0x9E3779B9 xor i) / 128`, and
//! `y[i] = f32(Σ_j X[i][j]·w_true[j] + b_true + noise[i])` summed in f64. Step `s` uses rows
//! `256·s … 256·s + 255`; replica `r` of a data-parallel run gets the `r`-th contiguous chunk
//! of each batch.

use ndarray::{Array1, Array2};

/// Features per row.
pub const FEATURES: usize = 64;
/// Rows per step, over all replicas.
pub const GLOBAL_BATCH: usize = 256;
/// SGD steps of a full run.
pub const STEPS: usize = 200;
/// The SGD learning rate.
pub const LEARNING_RATE: f32 = 0.1;
/// The bias the rows are generated with.
pub const TRUE_BIAS: f32 = 0.5;

/// lowbias32, with wrapping arithmetic: the hash every value of the data comes from.
pub fn h(mut k: u32) -> u32 {
    k ^= k >> 16;
    k = k.wrapping_mul(0x7feb_352d);
    k ^= k >> 15;
    k = k.wrapping_mul(0x846c_a68b);
    k ^= k >> 16;
    k
}

/// A number in [−1, 1) from `k`; every step is exact in f32.
pub fn u(k: u32) -> f32 {
    (h(k) >> 8) as f32 / 8_388_608.0 - 1.0
}

/// The weights the rows are generated with, `((j mod 9) − 4) / 4` (exact in f32).
pub fn true_weights() -> Vec<f32> {
    (0..FEATURES)
        .map(|j| ((j % 9) as f32 - 4.0) / 4.0)
        .collect()
}

/// The first `rows` rows: `X` (row-major, [`FEATURES`] per row) and `y`.
pub fn rows(rows: usize) -> (Vec<f32>, Vec<f32>) {
    let w_true = true_weights();
    let x: Vec<f32> = (0..rows * FEATURES).map(|k| u(k as u32)).collect();
    let y = x
        .chunks_exact(FEATURES)
        .enumerate()
        .map(|(i, row)| {
            let dot: f64 = row
                .iter()
                .zip(&w_true)
                .map(|(&x, &w)| x as f64 * w as f64)
                .sum();
            let noise = u(0x9E37_79B9 ^ i as u32) as f64 / 128.0;
            (dot + TRUE_BIAS as f64 + noise) as f32
        })
        .collect();
    (x, y)
}

/// The rows of `steps` global batches, in step order.
pub fn steps(steps: usize) -> (Vec<f32>, Vec<f32>) {
    rows(steps * GLOBAL_BATCH)
}

/// [`rows`] as ndarray arrays: `X` of shape `rows × FEATURES` and `y`.
pub fn arrays(rows: usize) -> (Array2<f32>, Array1<f32>) {
    let (x, y) = self::rows(rows);
    let x = Array2::from_shape_vec((rows, FEATURES), x).expect("rows × FEATURES values");
    (x, Array1::from(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_matches_the_specification() {
        // Values computed independently (Python) from the specification's formulas.
        assert_eq!(h(0), 0);
        assert_eq!(h(1), 0x6889_90c0);
        assert_eq!(h(0x9E37_79B9), 0x01fc_e552);
        assert_eq!(u(0), -1.0);
        assert_eq!(u(12345), 0.134_246_35);
        let (x, y) = steps(1);
        assert_eq!((x.len(), y.len()), (GLOBAL_BATCH * FEATURES, GLOBAL_BATCH));
        assert!(x.iter().all(|v| (-1.0..1.0).contains(v)));
        // y is within noise (|noise| < 1/128) of the true linear function.
        let w = true_weights();
        for (i, &yi) in y.iter().enumerate() {
            let row = &x[i * FEATURES..(i + 1) * FEATURES];
            let clean: f64 = row
                .iter()
                .zip(&w)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                + 0.5;
            assert!((yi as f64 - clean).abs() <= 1.0 / 128.0 + 1e-6, "row {i}");
        }
    }

    #[test]
    fn more_rows_extend_fewer_and_the_arrays_hold_the_same_values() {
        let (x, y) = rows(10);
        let (x2, y2) = rows(20);
        assert_eq!((&x[..], &y[..]), (&x2[..10 * FEATURES], &y2[..10]));
        let (xa, ya) = arrays(10);
        assert_eq!(xa.dim(), (10, FEATURES));
        assert_eq!(xa.iter().copied().collect::<Vec<_>>(), x);
        assert_eq!(ya.to_vec(), y);
    }
}
