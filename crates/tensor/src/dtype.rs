//! [`DType`], the element types a tensor can hold, and [`with_dtype!`](crate::with_dtype), the
//! one dispatch from a dtype to its Rust type.

use std::fmt;

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: f32's exponent with 8 bits of mantissa.
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
}

impl DType {
    /// Every dtype, in declaration order (`dtype as usize` is its index).
    pub const ALL: [DType; 6] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
    ];

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// True for the floating-point types, the ones `Mean` can reduce.
    pub fn is_floating(self) -> bool {
        !matches!(self, DType::I32 | DType::I64)
    }

    /// TF's name: `float16`, `bfloat16`, `float32`, `float64`, `int32`, `int64`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I32 => "int32",
            DType::I64 => "int64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `$body` with the type alias `$t` naming the Rust type of a [`DType`]: the workspace's one
/// dispatch from a dtype to its element type.
///
/// ```
/// use distribute_tensor::{Tensor, with_dtype};
///
/// let t = Tensor::from_vec("/cpu:0", &[2], vec![1.5f32, 2.5])?;
/// // The body is compiled once per dtype, with `T` the element type of that arm.
/// let bytes = with_dtype!(t.dtype(), T => t.to_vec::<T>()?.len() * std::mem::size_of::<T>());
/// assert_eq!(bytes, 8);
/// # Ok::<(), distribute_tensor::TensorError>(())
/// ```
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F16 => {
                type $t = $crate::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $t = $crate::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::DType::I64 => {
                type $t = i64;
                $body
            }
        }
    };
}
