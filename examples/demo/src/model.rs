//! The model: a multilayer perceptron (11 inputs → hidden tanh units → 1 output) on the host,
//! its forward pass and its backprop as fused loops over contiguous f32 rows (`kernels`, with a
//! vectorisable f32 tanh of the demo's own, `tanh`), and the metrics and comparisons of trained
//! parameters. Both strategies' training loops use it; of strategies it knows only how to read
//! its parameters from tensors.

mod kernels;
mod tanh;

use std::borrow::Cow;

use anyhow::Result;
use distribute::prelude::*;
use distribute::tensor::Tensor;
use ndarray::{Array1, Array2, ArrayView, ArrayView1, ArrayView2, Dimension, Ix1, Ix2};

use crate::data::{FEATURES, Split, SplitMix};
use kernels::{Sums, Weights};

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

    /// Whether every parameter has the same bits as in `other` (so 0.0 and −0.0 differ).
    pub fn same_bits(&self, other: &Params) -> bool {
        let bits = |p: &Params| p.flat().into_iter().map(f32::to_bits).collect::<Vec<_>>();
        bits(self) == bits(other)
    }

    /// The parameters back from [`Params::flat`]'s order for a model of `hidden` units.
    pub(crate) fn from_flat(flat: &[f32], hidden: usize) -> Result<Self, StrategyError> {
        let slices = ParamSlices::from_flat(flat, hidden)?;
        Ok(Params {
            w1: Array2::from_shape_vec((FEATURES, hidden), slices.w1.into_owned())
                .map_err(|e| StrategyError::InvalidArgument(e.to_string()))?,
            b1: Array1::from(slices.b1.into_owned()),
            w2: Array1::from(slices.w2.into_owned()),
            b2: slices.b2,
        })
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

    /// The parameters as row-major slices, borrowed unless an array is not in standard layout.
    pub(crate) fn slices(&self) -> Result<ParamSlices<'_>, StrategyError> {
        ParamSlices::new(self.w1.view(), self.b1.view(), self.w2.view(), self.b2)
    }
}

/// The model's parameters as row-major slices, borrowed from a [`Params`] or from the mirrored
/// variables' tensors without copying them.
pub(crate) struct ParamSlices<'a> {
    w1: Cow<'a, [f32]>,
    b1: Cow<'a, [f32]>,
    w2: Cow<'a, [f32]>,
    b2: f32,
}

impl<'a> ParamSlices<'a> {
    /// Checks that `w1` is `FEATURES × hidden` and `b1` and `w2` have `hidden` entries.
    fn new(
        w1: ArrayView2<'a, f32>,
        b1: ArrayView1<'a, f32>,
        w2: ArrayView1<'a, f32>,
        b2: f32,
    ) -> Result<Self, StrategyError> {
        let hidden = b1.len();
        if hidden == 0 || w1.dim() != (FEATURES, hidden) || w2.len() != hidden {
            return Err(StrategyError::InvalidArgument(format!(
                "the model's parameters must be w1 {FEATURES} × hidden, b1 and w2 of hidden \
                 entries, with hidden > 0; got w1 {:?}, b1 {:?}, w2 {:?}",
                w1.shape(),
                b1.shape(),
                w2.shape()
            )));
        }
        Ok(ParamSlices {
            w1: row_major(w1),
            b1: row_major(b1),
            w2: row_major(w2),
            b2,
        })
    }

    /// The parameters of `[w1, b1, w2, b2]` tensors (the order of [`Params::to_tensors`]).
    pub(crate) fn from_tensors(tensors: &'a [Tensor]) -> Result<Self, StrategyError> {
        let [w1, b1, w2, b2] = tensors else {
            return Err(StrategyError::InvalidArgument(format!(
                "the model has 4 parameter tensors, got {}",
                tensors.len()
            )));
        };
        let b2 = b2.view::<f32, Ix1>()?;
        let &[b2] = b2.as_slice().unwrap_or_default() else {
            return Err(StrategyError::InvalidArgument(format!(
                "the output bias has one element, got shape {:?}",
                b2.shape()
            )));
        };
        ParamSlices::new(w1.view()?, b1.view()?, w2.view()?, b2)
    }

    /// The parameters of a model of `hidden` units borrowed from [`Params::flat`]'s order.
    pub(crate) fn from_flat(flat: &'a [f32], hidden: usize) -> Result<Self, StrategyError> {
        let (w1_len, b_len) = (FEATURES * hidden, hidden);
        if hidden == 0 || flat.len() != w1_len + 2 * b_len + 1 {
            return Err(StrategyError::InvalidArgument(format!(
                "a model of {hidden} hidden units has {} parameters, got {}",
                w1_len + 2 * b_len + 1,
                flat.len()
            )));
        }
        let (w1, rest) = flat.split_at(w1_len);
        let (b1, rest) = rest.split_at(b_len);
        let (w2, b2) = rest.split_at(b_len);
        Ok(ParamSlices {
            w1: Cow::Borrowed(w1),
            b1: Cow::Borrowed(b1),
            w2: Cow::Borrowed(w2),
            b2: b2[0],
        })
    }

    fn weights(&self) -> Weights<'_> {
        Weights {
            w1: &self.w1,
            b1: &self.b1,
            w2: &self.w2,
            b2: self.b2,
        }
    }

    /// The sums over the rows of `x` of the gradients of the squared error, `[w1, b1, w2, b2]`,
    /// and the sum of squared errors. Sums, not means, so that replicas with different numbers
    /// of rows add up to the global batch's gradient.
    ///
    /// Everything per row is f32; the sums over rows are f64. The sum over a batch must not
    /// depend on how the batch was cut across replicas, and f32 sums of 64 + 64 rows and of 128
    /// rows differ in their last bits, which thousands of momentum steps amplified past 1e-5
    /// (3e-5 after 6000 steps on 2 replicas). In f64 they agree to ~1e-16 and round alike.
    /// Each term is a product of two f32 values, exact in f64, added row after row in batch
    /// order: no f64 copy of the rows is made.
    pub(crate) fn gradient_sums(
        &self,
        x: ArrayView2<f32>,
        y: ArrayView1<f32>,
    ) -> Result<(Gradients, f64), StrategyError> {
        if x.ncols() != FEATURES || x.nrows() != y.len() {
            return Err(StrategyError::InvalidArgument(format!(
                "a batch needs {FEATURES} features and one score a row; got x {:?} and y {:?}",
                x.shape(),
                y.shape()
            )));
        }
        let hidden = self.b1.len();
        let mut sums = Sums::zeros(hidden);
        kernels::accumulate_gradients(self.weights(), &row_major(x), &row_major(y), &mut sums);
        let mut w1 = sums.w1b1;
        let b1 = w1.split_off(FEATURES * hidden);
        Ok((
            Gradients {
                w1,
                b1,
                w2: sums.w2,
                b2: sums.b2,
            },
            sums.squared_error,
        ))
    }

    /// The predicted scores of the rows of `x`.
    fn predict(&self, x: ArrayView2<f32>) -> Result<Vec<f32>, StrategyError> {
        if x.ncols() != FEATURES {
            return Err(StrategyError::InvalidArgument(format!(
                "inputs have {FEATURES} features a row, got shape {:?}",
                x.shape()
            )));
        }
        let mut predicted = vec![0.0; x.nrows()];
        kernels::predict(self.weights(), &row_major(x), &mut predicted);
        Ok(predicted)
    }
}

/// The elements of `a` in row-major order: borrowed when `a` is laid out so.
fn row_major<'a, D: Dimension>(a: ArrayView<'a, f32, D>) -> Cow<'a, [f32]> {
    match a.to_slice() {
        Some(elements) => Cow::Borrowed(elements),
        None => Cow::Owned(a.iter().copied().collect()),
    }
}

/// Gradient sums of the four parameters, row-major like the parameters.
pub(crate) struct Gradients {
    /// `FEATURES × hidden`.
    pub(crate) w1: Vec<f64>,
    pub(crate) b1: Vec<f64>,
    pub(crate) w2: Vec<f64>,
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
    let predicted = Array1::from(params.slices()?.predict(x)?);
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

#[cfg(test)]
mod tests {
    use ndarray::{Array, s};

    use super::*;

    /// A batch of `rows` rows of features in [−2, 2) and scores near 5.5.
    fn batch(rows: usize, seed: u64) -> (Array2<f32>, Array1<f32>) {
        let mut rng = SplitMix(seed);
        let x = Array::from_shape_simple_fn((rows, FEATURES), || 2.0 * rng.symmetric());
        let y = Array::from_shape_simple_fn(rows, || 5.5 + rng.symmetric());
        (x, y)
    }

    /// The gradient sums computed the plain way: every value in f64, libm's tanh.
    fn reference_sums(params: &Params, x: &Array2<f32>, y: &Array1<f32>) -> (Vec<f64>, f64) {
        let hidden = params.b1.len();
        let mut grads = vec![0.0f64; (FEATURES + 2) * hidden + 1];
        let mut squared_error = 0.0;
        for (row, &score) in x.rows().into_iter().zip(y) {
            let h: Vec<f64> = (0..hidden)
                .map(|j| {
                    let z = (0..FEATURES).fold(f64::from(params.b1[j]), |z, f| {
                        z + f64::from(row[f]) * f64::from(params.w1[(f, j)])
                    });
                    z.tanh()
                })
                .collect();
            let predicted = (0..hidden).fold(f64::from(params.b2), |p, j| {
                p + h[j] * f64::from(params.w2[j])
            });
            let error = predicted - f64::from(score);
            squared_error += error * error;
            let d = 2.0 * error;
            for j in 0..hidden {
                let dh = d * f64::from(params.w2[j]) * (1.0 - h[j] * h[j]);
                for f in 0..FEATURES {
                    grads[f * hidden + j] += f64::from(row[f]) * dh;
                }
                grads[FEATURES * hidden + j] += dh;
                grads[(FEATURES + 1) * hidden + j] += h[j] * d;
            }
            grads[(FEATURES + 2) * hidden] += d;
        }
        (grads, squared_error)
    }

    fn flat(grads: &Gradients) -> Vec<f64> {
        let mut all = grads.w1.clone();
        all.extend(&grads.b1);
        all.extend(&grads.w2);
        all.push(grads.b2);
        all
    }

    #[test]
    fn gradient_sums_are_the_f64_reference_to_f32_precision() {
        for (hidden, rows) in [(1, 3), (8, 30), (37, 45), (256, 19)] {
            let params = Params::init(hidden, 5.5, 3);
            let (x, y) = batch(rows, 11);
            let (grads, squared_error) = params
                .slices()
                .unwrap()
                .gradient_sums(x.view(), y.view())
                .unwrap();
            let (want, want_squared_error) = reference_sums(&params, &x, &y);
            let got = flat(&grads);
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * scale,
                    "hidden {hidden}: gradient {i} is {g}, the reference {w}"
                );
            }
            assert!((squared_error - want_squared_error).abs() <= 1e-5 * want_squared_error);
        }
    }

    /// The promise behind the 1-replica vs N-replica check: the gradient of a batch cut in two
    /// and summed is the whole batch's, to f64 rounding, and the same f32 mean.
    #[test]
    fn a_batch_cut_in_two_sums_to_the_whole_batch() {
        let params = Params::init(32, 5.5, 5);
        let (x, y) = batch(128, 13);
        let slices = params.slices().unwrap();
        let (whole, whole_squared_error) = slices.gradient_sums(x.view(), y.view()).unwrap();
        let (a, a_squared_error) = slices
            .gradient_sums(x.slice(s![..50, ..]), y.slice(s![..50]))
            .unwrap();
        let (b, b_squared_error) = slices
            .gradient_sums(x.slice(s![50.., ..]), y.slice(s![50..]))
            .unwrap();
        let whole = flat(&whole);
        let scale = whole.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for ((w, a), b) in whole.iter().zip(flat(&a)).zip(flat(&b)) {
            let cut = a + b;
            assert!((w - cut).abs() <= 1e-13 * scale, "{w} vs {cut}");
            assert_eq!((w / 128.0) as f32, (cut / 128.0) as f32);
        }
        let cut = a_squared_error + b_squared_error;
        assert!((whole_squared_error - cut).abs() <= 1e-13 * cut);
    }

    #[test]
    fn a_row_major_copy_of_a_transposed_layout_gives_the_same_bits() {
        let params = Params::init(8, 5.5, 5);
        let (x, y) = batch(20, 17);
        let fortran_x = x.t().as_standard_layout().t().to_owned();
        assert!(fortran_x.as_slice().is_none());
        let slices = params.slices().unwrap();
        let (a, _) = slices.gradient_sums(x.view(), y.view()).unwrap();
        let (b, _) = slices.gradient_sums(fortran_x.view(), y.view()).unwrap();
        let bits = |g: &Gradients| flat(g).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
    }

    #[test]
    fn mismatched_shapes_are_errors_not_panics() {
        let params = Params::init(8, 5.5, 5);
        let slices = params.slices().unwrap();
        let (x, y) = batch(10, 1);
        let short_y = y.slice(s![..9]);
        assert!(slices.gradient_sums(x.view(), short_y).is_err());
        let narrow_x = x.slice(s![.., ..10]);
        assert!(slices.gradient_sums(narrow_x, y.view()).is_err());
        assert!(slices.predict(narrow_x).is_err());
        let no_units = Params::init(0, 5.5, 5);
        assert!(no_units.slices().is_err());
        let bad = Params {
            w2: Array1::zeros(7),
            ..params.clone()
        };
        assert!(bad.slices().is_err());
        let tensors = params.to_tensors("/cpu:0");
        assert!(ParamSlices::from_tensors(&tensors[..3]).is_err());
        let mut two_biases = tensors.clone();
        two_biases[3] = Tensor::from_array("/cpu:0", Array1::from_elem(2, 1.0f32));
        assert!(ParamSlices::from_tensors(&two_biases).is_err());
        assert!(ParamSlices::from_tensors(&tensors).is_ok());
    }

    #[test]
    fn flat_parameters_come_back_as_they_went_and_wrong_lengths_are_errors() {
        let params = Params::init(8, 5.5, 5);
        let flat = params.flat();
        assert!(Params::from_flat(&flat, 8).unwrap().same_bits(&params));
        let mut negated = flat.clone();
        negated[0] = -negated[0];
        assert!(!Params::from_flat(&negated, 8).unwrap().same_bits(&params));
        // The flat view computes the same gradient sums as the arrays it came from.
        let (x, y) = batch(12, 3);
        let from_arrays = params.slices().unwrap();
        let from_flat = ParamSlices::from_flat(&flat, 8).unwrap();
        let (a, a_error) = from_arrays.gradient_sums(x.view(), y.view()).unwrap();
        let (b, b_error) = from_flat.gradient_sums(x.view(), y.view()).unwrap();
        assert_eq!((a.w1, a.b1, a.w2, a.b2), (b.w1, b.b1, b.w2, b.b2));
        assert_eq!(a_error, b_error);
        assert!(Params::from_flat(&flat[1..], 8).is_err());
        assert!(Params::from_flat(&flat, 7).is_err());
        assert!(Params::from_flat(&[], 0).is_err());
    }
}
