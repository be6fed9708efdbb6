//! Mixed precision: a model that computes in bf16 or f16 while the optimizer updates f32 master
//! weights from gradients reduced in f32, and for f16 dynamic loss scaling whose decisions come
//! from the reduced gradients, so every replica and worker skips the same steps.

use candle_core::DType;

use crate::Error;

/// The precision a [`DataParallel`](crate::DataParallel) model trains in
/// ([`Config::precision`](crate::Config::precision)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Every variable in [`Config::dtype`](crate::Config::dtype), gradients reduced in it, the
    /// optimizer updating the model's own variables.
    #[default]
    Full,
    /// The model computes in bf16 (its floating-point variables are bf16 copies); the optimizer
    /// holds and updates f32 master weights, from the bf16 gradients converted to f32 and
    /// reduced in f32, and every update refreshes the bf16 copies. bf16 has f32's range: no
    /// loss scaling.
    MixedBf16,
    /// As [`MixedBf16`](Self::MixedBf16) in f16, with dynamic loss scaling: the loss is
    /// multiplied by a scale (from 2¹⁶) before `backward`, the reduced gradients divided by it;
    /// a step whose reduced gradients hold an infinity or NaN is skipped on every replica and
    /// worker (the decision is the reduced bucket's, the same everywhere) and halves the scale,
    /// and 2000 steps in a row without one double it (PyTorch's `GradScaler`). The scale travels
    /// in checkpoints.
    MixedF16,
}

impl Precision {
    /// The dtype the model computes in, when it is not the master weights'.
    pub(crate) fn compute(self) -> Option<DType> {
        match self {
            Precision::Full => None,
            Precision::MixedBf16 => Some(DType::BF16),
            Precision::MixedF16 => Some(DType::F16),
        }
    }

    /// The variables' dtype the model is built with, checking `dtype` (`Config::dtype`): mixed
    /// precision keeps f32 masters, so it needs `F32` there.
    pub(crate) fn build_dtype(self, dtype: DType) -> Result<DType, Error> {
        match self.compute() {
            None => Ok(dtype),
            Some(half) if dtype == DType::F32 => Ok(half),
            Some(_) => Err(Error::InvalidArgument(format!(
                "Config::precision {self:?} keeps f32 master weights: Config::dtype must be F32, \
                 not {}",
                dtype.as_str()
            ))),
        }
    }

    /// A fresh loss scale, for f16.
    pub(crate) fn loss_scale(self) -> Option<LossScale> {
        (self == Precision::MixedF16).then_some(LossScale {
            scale: INITIAL_SCALE,
            good_steps: 0,
        })
    }
}

/// The first loss scale (PyTorch's `GradScaler` default).
const INITIAL_SCALE: f64 = 65536.0;
/// Steps without an overflow before the scale doubles.
const GROWTH_INTERVAL: u64 = 2000;

/// Dynamic loss scaling's state: identical on every replica and worker, since every decision is
/// taken from the reduced gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LossScale {
    /// What the loss is multiplied by (a power of two, so scaling and unscaling are exact).
    pub(crate) scale: f64,
    /// Steps since the last overflow or growth.
    pub(crate) good_steps: u64,
}

impl LossScale {
    /// Records a step whose reduced gradients were finite (`true`) or not: the scale halves on
    /// an overflow and doubles after [`GROWTH_INTERVAL`] good steps.
    pub(crate) fn record(&mut self, finite: bool) {
        if finite {
            self.good_steps += 1;
            if self.good_steps == GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        } else {
            self.scale = (self.scale / 2.0).max(1.0);
            self.good_steps = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_halves_on_overflow_and_doubles_after_a_run_of_good_steps() {
        let mut s = Precision::MixedF16.loss_scale().unwrap();
        s.record(false);
        assert_eq!((s.scale, s.good_steps), (32768.0, 0));
        for _ in 0..GROWTH_INTERVAL {
            s.record(true);
        }
        assert_eq!((s.scale, s.good_steps), (65536.0, 0));
        assert_eq!(Precision::MixedBf16.loss_scale(), None);
    }

    #[test]
    fn mixed_precision_needs_f32_masters() {
        assert_eq!(
            Precision::MixedBf16.build_dtype(DType::F32).unwrap(),
            DType::BF16
        );
        assert_eq!(Precision::Full.build_dtype(DType::F16).unwrap(), DType::F16);
        let err = Precision::MixedF16.build_dtype(DType::F64).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Config::precision MixedF16 keeps f32 master weights: Config::dtype must be F32, not \
             f64"
        );
    }
}
