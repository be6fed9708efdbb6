//! The model: a multilayer perceptron (11 inputs → hidden tanh units → 1 output) on the host,
//! its forward pass and its backprop written with ndarray, and the metrics and comparisons of
//! trained parameters. Both strategies' training loops use it.

use anyhow::Result;
use distribute::prelude::*;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, Ix1, Ix2};

use crate::data::{FEATURES, Split, SplitMix};

/// The model's parameters on the host: `w1` is `FEATURES × hidden` (row-major), `b1` and `w2`
/// have `hidden` entries, `b2` one.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Input → hidden weights.
    pub w1: Array2<f32>,
    /// Hidden biases.
    pub b1: Array1<f32>,
    /// Hidden → output weights.
    pub w2: Array1<f32>,
    /// Output bias.
    pub b2: f32,
}

impl Params {
    /// Glorot-uniform weights (suited to tanh), zero hidden biases, and the output bias at the
    /// mean score, so the first predictions are centred on it rather than on 0.
    pub fn init(hidden: usize, mean_score: f32, seed: u64) -> Self {
        // A stream of its own, apart from the split's, which uses `seed` as it is.
        let mut rng = SplitMix(seed ^ 0xA5A5_A5A5_A5A5_A5A5);
        let limit1 = (6.0 / (FEATURES + hidden) as f32).sqrt();
        let limit2 = (6.0 / (hidden + 1) as f32).sqrt();
        Params {
            w1: Array2::from_shape_simple_fn((FEATURES, hidden), || limit1 * rng.symmetric()),
            b1: Array1::zeros(hidden),
            w2: Array1::from_shape_simple_fn(hidden, || limit2 * rng.symmetric()),
            b2: mean_score,
        }
    }

    /// Every parameter in one list (w1, b1, w2, b2), for comparing runs.
    pub fn flat(&self) -> Vec<f32> {
        let mut all: Vec<f32> = self.w1.iter().copied().collect();
        all.extend(self.b1.iter());
        all.extend(self.w2.iter());
        all.push(self.b2);
        all
    }

    /// The parameters as tensors on `device`, in the order of [`Params::from_tensors`].
    pub(crate) fn to_tensors(&self, device: &str) -> Vec<Tensor> {
        vec![
            Tensor::from_array(device, self.w1.clone()),
            Tensor::from_array(device, self.b1.clone()),
            Tensor::from_array(device, self.w2.clone()),
            Tensor::from_array(device, Array1::from_elem(1, self.b2)),
        ]
    }

    /// The parameters back from `[w1, b1, w2, b2]` tensors.
    pub(crate) fn from_tensors(tensors: &[Tensor]) -> Result<Self, StrategyError> {
        let [w1, b1, w2, b2] = tensors else {
            return Err(StrategyError::InvalidArgument(format!(
                "the model has 4 parameter tensors, got {}",
                tensors.len()
            )));
        };
        Ok(Params {
            w1: w1.view::<f32, Ix2>()?.to_owned(),
            b1: b1.view::<f32, Ix1>()?.to_owned(),
            w2: w2.view::<f32, Ix1>()?.to_owned(),
            b2: b2.view::<f32, Ix1>()?[0],
        })
    }

    /// The predicted scores of `x` (rows × `FEATURES`), with the hidden activations.
    pub(crate) fn forward(&self, x: ArrayView2<f32>) -> (Array2<f32>, Array1<f32>) {
        let hidden = (x.dot(&self.w1) + &self.b1).mapv(f32::tanh);
        let predicted = hidden.dot(&self.w2) + self.b2;
        (hidden, predicted)
    }

    /// The sums over the rows of `x` of the gradients of the squared error, `[w1, b1, w2, b2]`,
    /// and the sum of squared errors. Sums, not means, so that replicas with different numbers
    /// of rows add up to the global batch's gradient.
    ///
    /// Everything per row is f32; the sums over rows are f64. The sum over a batch must not
    /// depend on how the batch was cut across replicas, and f32 sums of 64 + 64 rows and of 128
    /// rows differ in their last bits, which thousands of momentum steps amplified past 1e-5
    /// (3e-5 after 6000 steps on 2 replicas). In f64 they agree to ~1e-16 and round alike.
    pub(crate) fn gradient_sums(&self, x: ArrayView2<f32>, y: ArrayView1<f32>) -> (Gradients, f64) {
        let (hidden, predicted) = self.forward(x);
        let error = predicted - y;
        // d(err²)/d(prediction) = 2·err; backprop through the output layer, then through tanh
        // (d tanh(z)/dz = 1 − tanh²).
        let d_out = &error * 2.0;
        let d_hidden =
            d_out.view().insert_axis(Axis(1)).to_owned() * &self.w2 * hidden.mapv(|h| 1.0 - h * h);
        let wide2 = |a: ArrayView2<f32>| a.mapv(f64::from);
        let wide1 = |a: &Array1<f32>| a.mapv(f64::from);
        let (d_out, d_hidden, error) = (wide1(&d_out), wide2(d_hidden.view()), wide1(&error));
        (
            Gradients {
                w1: wide2(x).t().dot(&d_hidden),
                b1: d_hidden.sum_axis(Axis(0)),
                w2: wide2(hidden.view()).t().dot(&d_out),
                b2: d_out.sum(),
            },
            error.dot(&error),
        )
    }
}

/// Gradient sums of the four parameters.
pub(crate) struct Gradients {
    pub(crate) w1: Array2<f64>,
    pub(crate) b1: Array1<f64>,
    pub(crate) w2: Array1<f64>,
    pub(crate) b2: f64,
}

/// Regression metrics of a model on some rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// Mean squared error.
    pub mse: f32,
    /// Mean absolute error.
    pub mae: f32,
    /// Share of wines whose predicted score rounds to the true one (|error| < 0.5).
    pub within_half: f32,
}

/// The metrics of `params` on `split`.
pub fn evaluate(params: &Params, split: &Split) -> Result<Metrics> {
    let x = ArrayView2::from_shape((split.rows(), FEATURES), &split.x)?;
    let (_, predicted) = params.forward(x);
    let n = split.rows() as f32;
    let errors = predicted - ArrayView1::from(&split.y);
    Ok(Metrics {
        mse: errors.dot(&errors) / n,
        mae: errors.mapv(f32::abs).sum() / n,
        within_half: errors.iter().filter(|e| e.abs() < 0.5).count() as f32 / n,
    })
}

/// The largest absolute difference between two runs' parameters; NaN if either has a NaN, so
/// that a diverged run never passes for an equal one (`f32::max` would skip the NaNs).
pub fn max_weight_difference(a: &Params, b: &Params) -> f32 {
    a.flat()
        .iter()
        .zip(b.flat())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |max, d| if d > max || d.is_nan() { d } else { max })
}
