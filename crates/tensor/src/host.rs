//! Host storage: [`Element`], the element types, and `HostArray`, a tensor's elements in host
//! memory, one variant per element type, with `with_host!` to reach the typed array inside.

use std::fmt;

use half::{bf16, f16};
use ndarray::{ArcArray, IxDyn};

use crate::DType;

mod sealed {
    pub trait Sealed {}
}

/// A type a [`Tensor`] can hold: `f16`, `bf16`, `f32`, `f64`, `i32`, `i64`.
///
/// Sealed: the reduction kernels and the storage enum know every implementor.
pub trait Element:
    Copy + Send + Sync + PartialEq + fmt::Debug + fmt::Display + 'static + sealed::Sealed
{
    /// The dtype tag of this type.
    const DTYPE: DType;
    /// Zero, the value of fresh tensors.
    fn zero() -> Self;
    /// The bit pattern, zero-extended: equal bits mean the very same value.
    fn to_bits(self) -> u64;
    #[doc(hidden)]
    fn wrap(array: ArcArray<Self, IxDyn>) -> HostArray;
    #[doc(hidden)]
    fn unwrap(array: &HostArray) -> Option<&ArcArray<Self, IxDyn>>;
    #[doc(hidden)]
    fn unwrap_mut(array: &mut HostArray) -> Option<&mut ArcArray<Self, IxDyn>>;
}

macro_rules! host_array {
    ($($variant:ident => $ty:ty, $zero:expr, $bits:expr;)*) => {
        /// Host storage of a tensor, one variant per element type.
        #[doc(hidden)]
        #[derive(Clone)]
        pub enum HostArray {
            $(
                #[doc(hidden)]
                $variant(ArcArray<$ty, IxDyn>),
            )*
        }

        $(
            impl sealed::Sealed for $ty {}
            impl Element for $ty {
                const DTYPE: DType = DType::$variant;
                fn zero() -> Self {
                    $zero
                }
                fn to_bits(self) -> u64 {
                    ($bits)(self)
                }
                fn wrap(array: ArcArray<Self, IxDyn>) -> HostArray {
                    HostArray::$variant(array)
                }
                fn unwrap(array: &HostArray) -> Option<&ArcArray<Self, IxDyn>> {
                    match array {
                        HostArray::$variant(a) => Some(a),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
                fn unwrap_mut(array: &mut HostArray) -> Option<&mut ArcArray<Self, IxDyn>> {
                    match array {
                        HostArray::$variant(a) => Some(a),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
            }
        )*

        impl HostArray {
            pub(crate) fn dtype(&self) -> DType {
                match self {
                    $(HostArray::$variant(_) => DType::$variant,)*
                }
            }

        }
    };
}

host_array! {
    F16 => f16, f16::ZERO, |x: f16| u64::from(x.to_bits());
    BF16 => bf16, bf16::ZERO, |x: bf16| u64::from(x.to_bits());
    F32 => f32, 0.0, |x: f32| u64::from(x.to_bits());
    F64 => f64, 0.0, f64::to_bits;
    I32 => i32, 0, |x: i32| u64::from(x as u32);
    I64 => i64, 0, |x: i64| x as u64;
}

/// Runs `$body` with `$a` bound to the typed `ArcArray` inside a `HostArray`, whatever its dtype.
macro_rules! with_host {
    ($host:expr, $a:ident => $body:expr) => {
        match $host {
            $crate::host::HostArray::F16($a) => $body,
            $crate::host::HostArray::BF16($a) => $body,
            $crate::host::HostArray::F32($a) => $body,
            $crate::host::HostArray::F64($a) => $body,
            $crate::host::HostArray::I32($a) => $body,
            $crate::host::HostArray::I64($a) => $body,
        }
    };
}

impl HostArray {
    pub(crate) fn shape(&self) -> &[usize] {
        with_host!(self, a => a.shape())
    }
}
