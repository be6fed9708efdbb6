//! Learning-rate schedules: [`Schedule`], the rate of each update, set on the optimizer before
//! the update by [`ReplicaStep::backward_step`](crate::ReplicaStep::backward_step) when the
//! model's [`Config::schedule`](crate::Config::schedule) has one.

use crate::Error;

/// How the rate falls after the warmup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decay {
    /// It stays at the peak rate.
    Constant,
    /// Half a cosine from the peak rate down to zero at the last update.
    Cosine,
    /// A straight line from the peak rate down to zero at the last update.
    Linear,
}

/// A learning-rate schedule: linear warmup to a peak rate, then a [`Decay`].
///
/// For `total` updates `T` and `warmup` `W`, update `s` (0-based) uses
///
/// - `lr·(s+1)/W` for `s < W`,
/// - then `lr·½(1 + cos(π·(s−W)/(T−W)))` ([`Decay::Cosine`]), `lr·(1 − (s−W)/(T−W))`
///   ([`Decay::Linear`]) or `lr` ([`Decay::Constant`]); from `s = T` on, the rate at `s = T`.
///
/// PyTorch's `LambdaLR` with the same function gives the same rates.
///
/// ```
/// use distribute_candle::{Decay, Schedule};
///
/// let schedule = Schedule::new(0.1, 2, 6, Decay::Cosine)?;
/// let rates: Vec<f64> = (0..7).map(|s| schedule.rate(s)).collect();
/// assert_eq!(rates[0], 0.05); // warmup: 0.1 · 1/2
/// assert_eq!(rates[1], 0.1); // the peak
/// assert_eq!(rates[2], 0.1); // the decay starts at the peak
/// assert!((rates[4] - 0.05).abs() < 1e-15); // halfway down
/// assert!(rates[6].abs() < 1e-15); // zero at T
/// # Ok::<(), distribute_candle::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    lr: f64,
    warmup: u64,
    total: u64,
    decay: Decay,
}

impl Schedule {
    /// `decay` from peak rate `lr` after `warmup` updates, reaching zero at update `total`.
    /// `lr` must be finite and positive, and `total > warmup` unless `decay` is
    /// [`Decay::Constant`].
    pub fn new(lr: f64, warmup: u64, total: u64, decay: Decay) -> Result<Self, Error> {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "a schedule's peak learning rate must be finite and positive, not {lr}"
            )));
        }
        if decay != Decay::Constant && total <= warmup {
            return Err(Error::InvalidArgument(format!(
                "a {decay:?} schedule needs more updates ({total}) than warmup updates \
                 ({warmup})"
            )));
        }
        Ok(Schedule {
            lr,
            warmup,
            total,
            decay,
        })
    }

    /// The peak rate.
    pub fn peak(&self) -> f64 {
        self.lr
    }

    /// The rate of update `step` (0-based: the number of updates before it).
    pub fn rate(&self, step: u64) -> f64 {
        self.lr * self.factor(step)
    }

    /// The multiple of the peak rate at update `step`, computed as the formula reads (so the
    /// rate is `LambdaLR`'s base rate times its function, bit for bit).
    fn factor(&self, step: u64) -> f64 {
        if step < self.warmup {
            return (step + 1) as f64 / self.warmup as f64;
        }
        if self.decay == Decay::Constant {
            return 1.0;
        }
        let done = (step.min(self.total) - self.warmup) as f64;
        let span = (self.total - self.warmup) as f64;
        match self.decay {
            Decay::Constant => 1.0,
            Decay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * done / span).cos()),
            Decay::Linear => 1.0 - done / span,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rates PyTorch's `LambdaLR(opt, lambda s: (s+1)/W if s < W else
    /// 0.5*(1+math.cos(math.pi*(s-W)/(T-W))))` sets for lr 0.1, W 3, T 10, steps 0..=10 (the
    /// function's values printed by Python's `repr`; `LambdaLR` multiplies the base rate by them).
    #[test]
    fn warmup_then_cosine_gives_lambda_lr_s_rates() {
        let schedule = Schedule::new(0.1, 3, 10, Decay::Cosine).unwrap();
        let lambdas = [
            0.3333333333333333,
            0.6666666666666666,
            1.0,
            1.0,
            0.9504844339512095,
            0.8117449009293668,
            0.6112604669781572,
            0.38873953302184283,
            0.18825509907063326,
            0.04951556604879048,
            0.0,
        ];
        for (s, lambda) in lambdas.iter().enumerate() {
            assert_eq!(schedule.rate(s as u64), 0.1 * lambda, "step {s}");
        }
        assert_eq!(schedule.rate(11), 0.0, "past the end it stays at zero");
    }

    #[test]
    fn linear_and_constant_decay() {
        let linear = Schedule::new(1.0, 0, 4, Decay::Linear).unwrap();
        let rates: Vec<f64> = (0..6).map(|s| linear.rate(s)).collect();
        assert_eq!(rates, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]);
        let constant = Schedule::new(0.5, 2, 0, Decay::Constant).unwrap();
        let rates: Vec<f64> = (0..4).map(|s| constant.rate(s)).collect();
        assert_eq!(rates, [0.25, 0.5, 0.5, 0.5]);
    }

    #[test]
    fn bad_schedules_are_refused_saying_why() {
        let err = Schedule::new(0.1, 5, 5, Decay::Cosine).unwrap_err();
        assert!(
            err.to_string().contains("more updates (5) than warmup"),
            "{err}"
        );
        let err = Schedule::new(f64::NAN, 0, 5, Decay::Cosine).unwrap_err();
        assert!(err.to_string().contains("finite and positive"), "{err}");
    }
}
