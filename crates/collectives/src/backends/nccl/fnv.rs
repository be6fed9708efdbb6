//! 64-bit FNV-1a, the hash both NCCL pieces agree through: the unique-id exchange hashes the
//! cluster so tasks of different clusters refuse each other, and a call's signature hashes dtypes
//! and shapes. Stable across processes, builds and platforms, unlike `std`'s hasher.

/// A running FNV-1a hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    /// The offset basis: the hash of nothing.
    pub(crate) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// Folds `bytes` in.
    pub(crate) fn bytes(&mut self, bytes: &[u8]) -> &mut Fnv {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
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
