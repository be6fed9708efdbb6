//! The wine-quality data (`linfa-datasets`' 1599 red wines, 11 measurements each): a seeded
//! 20 % validation split, standardized with the training rows' statistics, and the seeded
//! generator the demo uses for it and for the initial weights.

use anyhow::{Result, ensure};

/// Measurements per wine: the model's inputs.
pub const FEATURES: usize = 11;

/// Share of the wines held out for validation.
const VALIDATION_FRACTION: f64 = 0.2;

/// Rows of standardized features (`FEATURES` per row, row-major) and their quality scores.
#[derive(Debug, Clone)]
pub struct Split {
    /// The features, standardized with the training split's mean and deviation.
    pub x: Vec<f32>,
    /// The quality scores (3 to 8).
    pub y: Vec<f32>,
}

impl Split {
    /// The number of wines.
    pub fn rows(&self) -> usize {
        self.y.len()
    }
}

/// The wine-quality data, split into training and validation rows.
#[derive(Debug, Clone)]
pub struct WineData {
    /// The rows trained on.
    pub train: Split,
    /// The held-out rows.
    pub validation: Split,
}

/// Loads the red wines, holds out a seeded random 20 % for validation and standardizes every
/// feature with the training rows' mean and standard deviation (so nothing of the validation
/// rows leaks into training).
pub fn load_wine(seed: u64) -> Result<WineData> {
    // linfa-datasets brings its own ndarray version: go through plain iterators, not its types.
    let wines = linfa_datasets::winequality();
    let x: Vec<f64> = wines.records.iter().copied().collect();
    let y: Vec<f64> = wines.targets.iter().map(|&q| q as f64).collect();
    let rows = y.len();
    ensure!(
        rows > 10 && x.len() == rows * FEATURES,
        "the wine-quality data has {} values for {rows} rows; expected {FEATURES} features a row",
        x.len()
    );
    let order = permutation(rows, seed);
    let held_out = (rows as f64 * VALIDATION_FRACTION).round() as usize;
    let (validation_rows, train_rows) = order.split_at(held_out);

    let mut mean = [0.0f64; FEATURES];
    let mut deviation = [0.0f64; FEATURES];
    for &i in train_rows {
        for (j, m) in mean.iter_mut().enumerate() {
            *m += x[i * FEATURES + j];
        }
    }
    mean.iter_mut().for_each(|m| *m /= train_rows.len() as f64);
    for &i in train_rows {
        for (j, d) in deviation.iter_mut().enumerate() {
            *d += (x[i * FEATURES + j] - mean[j]).powi(2);
        }
    }
    deviation
        .iter_mut()
        .for_each(|d| *d = (*d / train_rows.len() as f64).sqrt().max(1e-12));
    let split = |picked: &[usize]| Split {
        x: picked
            .iter()
            .flat_map(|&i| (0..FEATURES).map(move |j| (i, j)))
            .map(|(i, j)| ((x[i * FEATURES + j] - mean[j]) / deviation[j]) as f32)
            .collect(),
        y: picked.iter().map(|&i| y[i] as f32).collect(),
    };
    Ok(WineData {
        train: split(train_rows),
        validation: split(validation_rows),
    })
}

/// SplitMix64: a small seeded generator, the same on every platform.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [−1, 1).
    pub(crate) fn symmetric(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A seeded Fisher–Yates permutation of `0..n`.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}
