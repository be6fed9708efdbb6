//! [`Fnv`]: 64-bit FNV-1a, the one hash the workspace agrees through across processes.

/// A running 64-bit FNV-1a hash, for values that processes compare with each other: stable across
/// processes, builds and platforms, unlike `std`'s hasher. Not a defence against anyone choosing
/// inputs. The agreement record every cross-process backend gathers (MPI's, NCCL's) hashes a
/// call's shape with it, the NCCL unique-id exchange its cluster (so that tasks of different
/// clusters refuse each other), checkpoints their contents, and distribute-candle the model
/// copies it compares across workers.
///
/// ```
/// use distribute_tensor::Fnv;
///
/// let mut hash = Fnv::new();
/// hash.bytes(b"a");
/// // FNV-1a's published value for "a": the same in every process.
/// assert_eq!(hash.0, 0xaf63_dc4c_8601_ec8c);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv(
    /// The hash of what was folded in so far.
    pub u64,
);

impl Fnv {
    /// The offset basis: the hash of nothing.
    pub fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// Folds `bytes` in.
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Fnv {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }
}

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv::new()
    }
}

#[cfg(test)]
mod tests {
    use super::Fnv;

    #[test]
    fn matches_the_published_value() {
        // FNV-1a's published value for "a", so the hash is the same on every build.
        assert_eq!(Fnv::new().bytes(b"a").0, 0xaf63_dc4c_8601_ec8c);
    }
}
