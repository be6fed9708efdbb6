//! The loops of the model's forward and backward pass over contiguous row-major rows, fused so
//! that a block of rows stays in L1 cache from the first dot product to the gradient sums, and
//! compiled once per SIMD level the CPU may have (picked at run time).
//!
//! What the 1-replica vs N-replica check needs from them:
//! - every row's f32 values (activations, prediction, backprop) are computed by the same
//!   operations in the same order whatever the batch size and wherever the row sits in it;
//! - every gradient element is the f64 sum of exact f64 products of f32 values, added row after
//!   row in batch order, so the sums of two halves of a batch add up to the whole batch's sum
//!   within f64 rounding (see `Params::gradient_sums`);
//! - no reassociation, and fused multiply-adds only where the product is exact (f32 × f32 in
//!   f64), where they round as a multiply and an add do: the SIMD variants give the same bits
//!   as the portable one (a test compares them).

use super::FEATURES;
use super::tanh::tanh_in_place;

/// Rows whose products are added to the sums in one pass over them: each sum is loaded and
/// stored once for `GROUP` rows, and their activations and backprop (2 × 4 × hidden f64) stay
/// in L1 cache.
const GROUP: usize = 4;

/// Hidden units a step of the kernels' loops handles: a 512-bit register of f32 or of f64.
const LANES_F32: usize = 16;
const LANES_F64: usize = 8;

/// Lanes of the f32 dot product's partial sums: a fixed number, so that its rounding does not
/// depend on the SIMD width.
const DOT_LANES: usize = 8;

/// The model's parameters as row-major slices: `w1` is `FEATURES × hidden`.
#[derive(Clone, Copy)]
pub(super) struct Weights<'a> {
    pub(super) w1: &'a [f32],
    pub(super) b1: &'a [f32],
    pub(super) w2: &'a [f32],
    pub(super) b2: f32,
}

impl Weights<'_> {
    fn hidden(&self) -> usize {
        self.b1.len()
    }
}

/// Sums over rows, in f64: `w1b1` holds the input weights' gradient (`FEATURES × hidden`,
/// row-major) followed by the hidden biases' (`hidden`).
pub(super) struct Sums {
    pub(super) w1b1: Vec<f64>,
    pub(super) w2: Vec<f64>,
    pub(super) b2: f64,
    pub(super) squared_error: f64,
}

impl Sums {
    pub(super) fn zeros(hidden: usize) -> Self {
        Sums {
            w1b1: vec![0.0; (FEATURES + 1) * hidden],
            w2: vec![0.0; hidden],
            b2: 0.0,
            squared_error: 0.0,
        }
    }
}

/// Adds the gradient sums of the squared error over the rows of `x` (`FEATURES` each) with
/// scores `y` to `sums`. The caller has checked every length.
pub(super) fn accumulate_gradients(weights: Weights<'_>, x: &[f32], y: &[f32], sums: &mut Sums) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { x86::gradients_avx512(weights, x, y, sums) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: as above.
            return unsafe { x86::gradients_avx2(weights, x, y, sums) };
        }
    }
    gradients::<false>(weights, x, y, sums);
}

/// The predicted scores of the rows of `x` into `predicted` (one per row).
pub(super) fn predict(weights: Weights<'_>, x: &[f32], predicted: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { x86::predict_avx2(weights, x, predicted) };
        }
    }
    predict_rows(weights, x, predicted);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The kernels compiled for x86-64 SIMD levels above the baseline's SSE2.

    use super::{Sums, Weights, gradients, predict_rows};

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) fn gradients_avx512(weights: Weights<'_>, x: &[f32], y: &[f32], sums: &mut Sums) {
        gradients::<true>(weights, x, y, sums);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn gradients_avx2(weights: Weights<'_>, x: &[f32], y: &[f32], sums: &mut Sums) {
        gradients::<true>(weights, x, y, sums);
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn predict_avx2(weights: Weights<'_>, x: &[f32], predicted: &mut [f32]) {
        predict_rows(weights, x, predicted);
    }
}

/// The forward pass, backprop and gradient sums of all rows, `GROUP` rows at a time; `FUSED`
/// where the CPU has fused multiply-adds.
#[inline(always)]
fn gradients<const FUSED: bool>(weights: Weights<'_>, x: &[f32], y: &[f32], sums: &mut Sums) {
    let hidden = weights.hidden();
    let chunked = Chunked::new(&weights);
    let mut h = vec![0.0f32; hidden];
    // The group's activations and backprop in f64, row after row: converted once, then used
    // by every feature's sums.
    let mut activations = vec![0.0f64; GROUP * hidden];
    let mut backprop = vec![0.0f64; GROUP * hidden];
    for (x_group, y_group) in x.chunks(GROUP * FEATURES).zip(y.chunks(GROUP)) {
        // Each row's features with a 1 appended: their products with the backprop give the
        // input weights' gradient, the 1 the hidden biases'.
        // Stored by feature: `inputs[f]` holds feature f of each of the group's rows.
        let mut inputs = [[1.0f64; GROUP]; FEATURES + 1];
        let mut d_out = [0.0f64; GROUP];
        let (x_rows, _) = x_group.as_chunks::<FEATURES>();
        for (i, (features, &score)) in x_rows.iter().zip(y_group).enumerate() {
            let predicted = forward_row(weights, &chunked, features, &mut h);
            let error = predicted - score;
            // d(err²)/d(prediction) = 2·err; backprop through the output layer, then through
            // tanh (d tanh(z)/dz = 1 − tanh²).
            let d = error * 2.0;
            let wide_h = &mut activations[i * hidden..][..hidden];
            let wide_dh = &mut backprop[i * hidden..][..hidden];
            for (((wide_h, wide_dh), &h), &w2) in
                wide_h.iter_mut().zip(wide_dh).zip(&h).zip(weights.w2)
            {
                *wide_h = f64::from(h);
                *wide_dh = f64::from(d * w2 * (1.0 - h * h));
            }
            for (input, &v) in inputs.iter_mut().zip(features) {
                input[i] = f64::from(v);
            }
            d_out[i] = f64::from(d);
            sums.squared_error += f64::from(error) * f64::from(error);
            sums.b2 += f64::from(d);
        }
        let rows = y_group.len();
        fn row(data: &[f64], i: usize, hidden: usize) -> &[f64] {
            &data[i * hidden..][..hidden]
        }
        if rows == GROUP {
            let backprop: [&[f64]; GROUP] = std::array::from_fn(|i| row(&backprop, i, hidden));
            for (sums, &input) in sums.w1b1.chunks_exact_mut(hidden).zip(&inputs) {
                add_products::<FUSED, GROUP>(sums, input, backprop);
            }
            let activations = std::array::from_fn(|i| row(&activations, i, hidden));
            add_products::<FUSED, GROUP>(&mut sums.w2, d_out, activations);
        } else {
            for i in 0..rows {
                let backprop = [row(&backprop, i, hidden)];
                for (sums, input) in sums.w1b1.chunks_exact_mut(hidden).zip(&inputs) {
                    add_products::<FUSED, 1>(sums, [input[i]], backprop);
                }
                add_products::<FUSED, 1>(&mut sums.w2, [d_out[i]], [row(&activations, i, hidden)]);
            }
        }
    }
}

/// `sums[j] += c[0]·rows[0][j] + c[1]·rows[1][j] + …`, added one row after the other (the
/// order of a row-by-row sum). Products of f32 values are exact in f64, so each sum is the
/// same whatever the SIMD width, fused (`FUSED`) or not; the pass over `j` is what vectorises.
#[inline(always)]
fn add_products<const FUSED: bool, const R: usize>(
    sums: &mut [f64],
    coefficients: [f64; R],
    rows: [&[f64]; R],
) {
    let n = sums.len();
    let rows = rows.map(|row| row[..n].as_chunks::<LANES_F64>());
    let (chunks, tail) = sums.as_chunks_mut::<LANES_F64>();
    for (k, chunk) in chunks.iter_mut().enumerate() {
        let mut acc = *chunk;
        for (&c, (row, _)) in coefficients.iter().zip(&rows) {
            for (sum, &v) in acc.iter_mut().zip(&row[k]) {
                *sum = if FUSED {
                    c.mul_add(v, *sum)
                } else {
                    *sum + c * v
                };
            }
        }
        *chunk = acc;
    }
    for (j, sum) in tail.iter_mut().enumerate() {
        for (&c, (_, row_tail)) in coefficients.iter().zip(&rows) {
            *sum = if FUSED {
                c.mul_add(row_tail[j], *sum)
            } else {
                *sum + c * row_tail[j]
            };
        }
    }
}

/// The predicted scores of the rows of `x`.
#[inline(always)]
fn predict_rows(weights: Weights<'_>, x: &[f32], predicted: &mut [f32]) {
    let chunked = Chunked::new(&weights);
    let mut h = vec![0.0f32; weights.hidden()];
    let (rows, _) = x.as_chunks::<FEATURES>();
    for (features, p) in rows.iter().zip(predicted) {
        *p = forward_row(weights, &chunked, features, &mut h);
    }
}

/// The input layer's weights cut into chunks of `LANES_F32` hidden units and the rest: `w1`
/// by feature, then `b1`.
struct Chunked<'a> {
    w1: [(&'a [[f32; LANES_F32]], &'a [f32]); FEATURES],
    b1: (&'a [[f32; LANES_F32]], &'a [f32]),
}

impl<'a> Chunked<'a> {
    #[inline(always)]
    fn new(weights: &Weights<'a>) -> Self {
        let hidden = weights.hidden();
        let mut rows = weights.w1.chunks_exact(hidden);
        Chunked {
            w1: std::array::from_fn(|_| rows.next().unwrap_or_default().as_chunks()),
            b1: weights.b1.as_chunks(),
        }
    }
}

/// One row's hidden activations into `h`, and its predicted score.
#[inline(always)]
fn forward_row(
    weights: Weights<'_>,
    chunked: &Chunked<'_>,
    features: &[f32; FEATURES],
    h: &mut [f32],
) -> f32 {
    // The sums of a chunk of hidden units stay in registers over the features.
    let (chunks, tail) = h.as_chunks_mut::<LANES_F32>();
    for (k, chunk) in chunks.iter_mut().enumerate() {
        let mut acc = chunked.b1.0[k];
        for (&v, (w1, _)) in features.iter().zip(&chunked.w1) {
            for (z, &w) in acc.iter_mut().zip(&w1[k]) {
                *z += v * w;
            }
        }
        *chunk = acc;
    }
    for (j, z) in tail.iter_mut().enumerate() {
        let mut sum = chunked.b1.1[j];
        for (&v, (_, w1_tail)) in features.iter().zip(&chunked.w1) {
            sum += v * w1_tail[j];
        }
        *z = sum;
    }
    tanh_in_place(h);
    dot(h, weights.w2) + weights.b2
}

/// Σ a·b in f32, in `DOT_LANES` partial sums added up in a fixed order.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; DOT_LANES];
    let whole = a.len().min(b.len()) / DOT_LANES * DOT_LANES;
    for (a, b) in a[..whole]
        .chunks_exact(DOT_LANES)
        .zip(b[..whole].chunks_exact(DOT_LANES))
    {
        for ((lane, &a), &b) in lanes.iter_mut().zip(a).zip(b) {
            *lane += a * b;
        }
    }
    for ((lane, &a), &b) in lanes.iter_mut().zip(&a[whole..]).zip(&b[whole..]) {
        *lane += a * b;
    }
    let [l0, l1, l2, l3, l4, l5, l6, l7] = lanes;
    ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [−1, 1).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state >> 8) as f32 / (1 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn bits(sums: &Sums) -> Vec<u64> {
        let mut all: Vec<u64> = sums.w1b1.iter().map(|v| v.to_bits()).collect();
        all.extend(sums.w2.iter().map(|v| v.to_bits()));
        all.extend([sums.b2.to_bits(), sums.squared_error.to_bits()]);
        all
    }

    /// Every SIMD level the CPU has, and every tile width, give the portable kernel's bits,
    /// for hidden sizes that fill tiles and ones that leave a remainder.
    #[test]
    fn every_simd_variant_gives_the_same_bits() {
        for hidden in [1, 5, 8, 13, 32, 37] {
            let (w1, b1, w2) = (
                values(FEATURES * hidden, 1),
                values(hidden, 2),
                values(hidden, 3),
            );
            let weights = Weights {
                w1: &w1,
                b1: &b1,
                w2: &w2,
                b2: 0.25,
            };
            let rows = 5 * GROUP + 3;
            let (x, y) = (values(rows * FEATURES, 4), values(rows, 5));
            let run = |kernel: &dyn Fn(&mut Sums)| {
                let mut sums = Sums::zeros(hidden);
                kernel(&mut sums);
                bits(&sums)
            };
            let portable = run(&|s| gradients::<false>(weights, &x, &y, s));
            assert_eq!(run(&|s| gradients::<true>(weights, &x, &y, s)), portable);
            assert_eq!(
                run(&|s| accumulate_gradients(weights, &x, &y, s)),
                portable,
                "hidden {hidden}"
            );
            let mut predicted = vec![0.0; rows];
            let mut want = vec![0.0; rows];
            predict(weights, &x, &mut predicted);
            predict_rows(weights, &x, &mut want);
            assert_eq!(predicted, want);
        }
    }
}
