//! Reproducible dropout: masks drawn from a counter-based generator keyed by the job's seed, the
//! replica, the update and the call within the step, so every replica draws its own mask, the
//! same run twice draws the same masks, and a run resumed from a checkpoint (which restores the
//! update count) draws the masks the uninterrupted run drew. candle's own `dropout` draws from
//! the CPU's thread-local generator, which cannot be seeded.

use candle_core::{Device, Tensor};

use crate::Error;

/// SplitMix64's finaliser: a bijection of 64-bit words whose outputs pass statistical tests for
/// consecutive inputs (Steele, Lea, Flood 2014).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where a mask's random numbers come from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Key {
    /// [`Config::seed`](crate::Config::seed).
    pub(crate) seed: u64,
    /// The global replica id.
    pub(crate) replica: u64,
    /// Updates applied before this step.
    pub(crate) update: u64,
    /// Dropout calls before this one in the step.
    pub(crate) call: u64,
}

impl Key {
    /// The stream's start: every field mixed in, so neighbouring keys give unrelated streams.
    fn stream(self) -> u64 {
        [self.replica, self.update, self.call]
            .iter()
            .fold(mix(self.seed), |h, &x| {
                mix(h ^ x.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            })
    }
}

/// `xs` with each element zeroed with probability `p` and the others scaled by `1 / (1 − p)`
/// (candle's and PyTorch's dropout), the mask drawn from `key`.
pub(crate) fn dropout(xs: &Tensor, p: f32, key: Key, device: &Device) -> Result<Tensor, Error> {
    if !(0.0..1.0).contains(&p) {
        return Err(Error::InvalidArgument(format!(
            "dropout probability has to be in [0, 1), got {p}"
        )));
    }
    let scale = 1.0 / (1.0 - p);
    let stream = key.stream();
    let mask: Vec<f32> = (0..xs.elem_count() as u64)
        .map(|i| {
            // The top 24 bits as a uniform f32 in [0, 1).
            let u = (mix(stream.wrapping_add(i)) >> 40) as f32 / (1u64 << 24) as f32;
            if u >= p { scale } else { 0.0 }
        })
        .collect();
    let mask = Tensor::from_vec(mask, xs.shape(), device)?.to_dtype(xs.dtype())?;
    Ok(xs.mul(&mask)?)
}

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;

    fn key(replica: u64, update: u64, call: u64) -> Key {
        Key {
            seed: 7,
            replica,
            update,
            call,
        }
    }

    fn kept(key: Key) -> Vec<f32> {
        let xs = Tensor::ones(4096, DType::F32, &Device::Cpu).unwrap();
        dropout(&xs, 0.25, key, &Device::Cpu)
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn a_key_gives_the_same_mask_and_other_keys_other_masks() {
        let a = kept(key(0, 3, 0));
        assert_eq!(a, kept(key(0, 3, 0)));
        for other in [key(1, 3, 0), key(0, 4, 0), key(0, 3, 1)] {
            assert_ne!(a, kept(other), "{other:?}");
        }
        // About a quarter dropped, the rest scaled by 4/3.
        let dropped = a.iter().filter(|&&x| x == 0.0).count();
        assert!((900..1150).contains(&dropped), "{dropped} of 4096 dropped");
        assert!(a.iter().all(|&x| x == 0.0 || x == 1.0 / 0.75));
    }

    #[test]
    fn a_bad_probability_is_refused() {
        let xs = Tensor::ones(2, DType::F32, &Device::Cpu).unwrap();
        let err = dropout(&xs, 1.0, key(0, 0, 0), &Device::Cpu).unwrap_err();
        assert_eq!(
            err.to_string(),
            "dropout probability has to be in [0, 1), got 1"
        );
    }
}
