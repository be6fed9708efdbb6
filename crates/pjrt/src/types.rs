//! Element types shared by buffers and the StableHLO builder, and the Rust types that map onto
//! them.

use std::fmt;

/// An array element type (`PJRT_Buffer_Type`; the discriminants are the C enum's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ElementType {
    /// Boolean (`i1` in StableHLO, one byte per element on the host).
    Pred = 1,
    /// Signed 8-bit integer.
    S8 = 2,
    /// Signed 32-bit integer.
    S32 = 4,
    /// Signed 64-bit integer.
    S64 = 5,
    /// Unsigned 8-bit integer.
    U8 = 6,
    /// Unsigned 32-bit integer (what `replica_id` returns).
    U32 = 8,
    /// Unsigned 64-bit integer.
    U64 = 9,
    /// IEEE half precision.
    F16 = 10,
    /// IEEE single precision.
    F32 = 11,
    /// IEEE double precision.
    F64 = 12,
    /// bfloat16.
    Bf16 = 13,
}

impl ElementType {
    /// The type's name in StableHLO text (`f32`, `i32`, `ui32`, `i1`, …).
    pub fn mlir_name(self) -> &'static str {
        match self {
            ElementType::Pred => "i1",
            ElementType::S8 => "i8",
            ElementType::S32 => "i32",
            ElementType::S64 => "i64",
            ElementType::U8 => "ui8",
            ElementType::U32 => "ui32",
            ElementType::U64 => "ui64",
            ElementType::F16 => "f16",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
            ElementType::Bf16 => "bf16",
        }
    }

    /// Bytes per element on the host.
    pub fn size_in_bytes(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 => 1,
            ElementType::F16 | ElementType::Bf16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::U64 | ElementType::F64 => 8,
        }
    }

    /// Whether it is a floating-point type (decides how constants are printed).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            ElementType::F16 | ElementType::F32 | ElementType::F64 | ElementType::Bf16
        )
    }

    /// The type for a `PJRT_Buffer_Type` value, if this crate knows it.
    pub(crate) fn from_raw(raw: i32) -> Option<ElementType> {
        const ALL: [ElementType; 11] = [
            ElementType::Pred,
            ElementType::S8,
            ElementType::S32,
            ElementType::S64,
            ElementType::U8,
            ElementType::U32,
            ElementType::U64,
            ElementType::F16,
            ElementType::F32,
            ElementType::F64,
            ElementType::Bf16,
        ];
        ALL.into_iter().find(|t| *t as i32 == raw)
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir_name())
    }
}

mod sealed {
    pub trait Sealed {
        /// The value as an MLIR literal that parses back to the same bits.
        fn mlir_literal(self) -> String;
    }
}

/// A Rust type whose values can be copied to and from device buffers bit for bit.
///
/// Sealed: each implementor is plain data without padding whose every bit pattern is valid, which
/// is what makes the byte copies in [`crate::Buffer::to_vec`] sound.
pub trait NativeType: sealed::Sealed + Copy + Default + 'static {
    /// The matching element type.
    const TYPE: ElementType;
}

macro_rules! native_int {
    ($($t:ty => $e:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {
            fn mlir_literal(self) -> String {
                self.to_string()
            }
        }
        impl NativeType for $t {
            const TYPE: ElementType = ElementType::$e;
        }
    )*};
}

macro_rules! native_float {
    ($($t:ty => $e:ident, $hex_digits:literal),* $(,)?) => {$(
        impl sealed::Sealed for $t {
            fn mlir_literal(self) -> String {
                if self.is_finite() {
                    // Display prints the shortest digits that round-trip, never an exponent; MLIR
                    // wants a '.' in a float literal.
                    let text = self.to_string();
                    if text.contains('.') { text } else { format!("{text}.0") }
                } else {
                    // MLIR reads hexadecimal literals as the float's bits (NaN, infinities).
                    format!("0x{:0width$X}", self.to_bits(), width = $hex_digits)
                }
            }
        }
        impl NativeType for $t {
            const TYPE: ElementType = ElementType::$e;
        }
    )*};
}

native_int!(i8 => S8, i32 => S32, i64 => S64, u8 => U8, u32 => U32, u64 => U64);
native_float!(f32 => F32, 8, f64 => F64, 16);

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;

    #[test]
    fn float_literals_round_trip_and_always_have_a_point() {
        assert_eq!(1.0f32.mlir_literal(), "1.0");
        assert_eq!(0.1f32.mlir_literal(), "0.1");
        assert_eq!((-2.5f64).mlir_literal(), "-2.5");
        assert_eq!(1e20f32.mlir_literal(), "100000000000000000000.0");
        assert_eq!(f32::INFINITY.mlir_literal(), "0x7F800000");
        assert_eq!(f64::NEG_INFINITY.mlir_literal(), "0xFFF0000000000000");
        let tiny = 1.0e-7f32;
        assert_eq!(tiny.mlir_literal().parse::<f32>().unwrap(), tiny);
    }
}
