//! [`VariableValue`]: the arithmetic that distributed variables need from their element type,
//! and how [`UpdateOp`], the three updates TensorFlow variables support (`update`), applies to
//! one.
//!
//! Scalars implement it here; the collectives layer implements it for its tensors. Nothing here
//! knows where the values live.

use std::fmt;

use crate::{UpdateOp, ValuesError};

/// The value of a distributed variable: what aggregation (Sum, Mean) and updates (add, subtract)
/// need. Errors (overflow, mismatched shapes) are `ValuesError::Arithmetic`.
///
/// ```
/// use distribute_values::VariableValue;
///
/// assert_eq!(7.0_f64.divide_by_count(2)?, 3.5);
/// assert_eq!(7_i32.divide_by_count(2)?, 3); // integers truncate, as TF's cast does
/// assert!(i8::MAX.try_add(&1).is_err());
/// assert!(!5_i64.is_floating());
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub trait VariableValue: Clone + fmt::Debug {
    /// Whether the value has a floating-point type; `Mean` aggregation needs one.
    fn is_floating(&self) -> bool;

    /// Whether the value is zero. Summing a non-distributed zero over replicas is allowed
    /// (it is zero whatever the count); the default says "not known to be zero".
    fn is_zero(&self) -> bool {
        false
    }

    /// The value's bytes, for another process (a multi-worker strategy sends the chief's
    /// initial values to every worker); `None` for a type that cannot travel.
    fn to_wire(&self) -> Option<Vec<u8>> {
        None
    }

    /// A value like `self` (same type, dtype and shape) holding `bytes` that
    /// [`to_wire`](Self::to_wire) gave for another process's value; `None` when they do not fit.
    fn like_from_wire(&self, bytes: &[u8]) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = bytes;
        None
    }

    /// `self + other`.
    fn try_add(&self, other: &Self) -> Result<Self, ValuesError>;

    /// `self - other`.
    fn try_sub(&self, other: &Self) -> Result<Self, ValuesError>;

    /// `self / count`: a mean, or one replica's share of a sum. Integers truncate toward zero.
    fn divide_by_count(&self, count: usize) -> Result<Self, ValuesError>;

    /// The sum of `values` (at least one), left to right. Types whose reduction rounds only once
    /// (tensors of f16 / bf16 accumulate in f32) override it, so aggregating a variable gives the
    /// same bits as an all-reduce of the same values.
    fn sum_all(values: &[Self]) -> Result<Self, ValuesError> {
        let (first, rest) = values
            .split_first()
            .ok_or_else(|| ValuesError::Arithmetic("cannot sum an empty list of values".into()))?;
        rest.iter().try_fold(first.clone(), |acc, v| acc.try_add(v))
    }

    /// The mean of `values` (at least one): [`sum_all`](Self::sum_all) divided by the count,
    /// unless the type reduces with one rounding (as tensors do).
    fn mean_all(values: &[Self]) -> Result<Self, ValuesError> {
        Self::sum_all(values)?.divide_by_count(values.len())
    }
}

macro_rules! float_impls {
    ($($ty:ty),*) => {$(
        impl VariableValue for $ty {
            fn is_floating(&self) -> bool {
                true
            }

            fn is_zero(&self) -> bool {
                *self == 0.0
            }

            fn to_wire(&self) -> Option<Vec<u8>> {
                Some(self.to_le_bytes().to_vec())
            }

            fn like_from_wire(&self, bytes: &[u8]) -> Option<Self> {
                Some(<$ty>::from_le_bytes(bytes.try_into().ok()?))
            }

            fn try_add(&self, other: &Self) -> Result<Self, ValuesError> {
                Ok(self + other)
            }

            fn try_sub(&self, other: &Self) -> Result<Self, ValuesError> {
                Ok(self - other)
            }

            fn divide_by_count(&self, count: usize) -> Result<Self, ValuesError> {
                if count == 0 {
                    return Err(ValuesError::Arithmetic("cannot divide by a count of 0".into()));
                }
                // Replica counts are far below 2^24, so the conversion is exact.
                Ok(self / count as $ty)
            }
        }
    )*};
}

float_impls!(f32, f64);

macro_rules! int_impls {
    ($($ty:ty),*) => {$(
        impl VariableValue for $ty {
            fn is_floating(&self) -> bool {
                false
            }

            fn is_zero(&self) -> bool {
                *self == 0
            }

            fn to_wire(&self) -> Option<Vec<u8>> {
                Some(self.to_le_bytes().to_vec())
            }

            fn like_from_wire(&self, bytes: &[u8]) -> Option<Self> {
                Some(<$ty>::from_le_bytes(bytes.try_into().ok()?))
            }

            fn try_add(&self, other: &Self) -> Result<Self, ValuesError> {
                self.checked_add(*other).ok_or_else(|| {
                    ValuesError::Arithmetic(format!(
                        "{self} + {other} overflows {}; use a wider type", stringify!($ty)
                    ))
                })
            }

            fn try_sub(&self, other: &Self) -> Result<Self, ValuesError> {
                self.checked_sub(*other).ok_or_else(|| {
                    ValuesError::Arithmetic(format!(
                        "{self} - {other} overflows {}; use a wider or signed type",
                        stringify!($ty)
                    ))
                })
            }

            fn divide_by_count(&self, count: usize) -> Result<Self, ValuesError> {
                let divisor = <$ty>::try_from(count).ok().filter(|d| *d != 0).ok_or_else(|| {
                    ValuesError::Arithmetic(format!(
                        "cannot divide a {} by a count of {count}", stringify!($ty)
                    ))
                })?;
                Ok(self / divisor)
            }
        }
    )*};
}

int_impls!(
    i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize
);

impl UpdateOp {
    /// The new value after applying this update with `value` to `current`.
    pub fn apply<T: VariableValue>(self, current: &T, value: &T) -> Result<T, ValuesError> {
        match self {
            UpdateOp::Assign => Ok(value.clone()),
            UpdateOp::AssignAdd => current.try_add(value),
            UpdateOp::AssignSub => current.try_sub(value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn division_by_a_zero_count_is_an_error() {
        assert!(1.0_f32.divide_by_count(0).is_err());
        assert!(1_u8.divide_by_count(0).is_err());
        // A count that does not fit the type cannot divide it either.
        assert!(1_u8.divide_by_count(300).is_err());
    }

    #[test]
    fn integer_overflow_is_reported() {
        let err = 0_u32.try_sub(&1).unwrap_err();
        assert!(err.to_string().contains("overflows u32"), "{err}");
    }
}
