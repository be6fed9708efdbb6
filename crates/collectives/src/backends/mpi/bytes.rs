//! Elements as bytes: how tensors travel between processes whatever their dtype (MPI moves
//! bytes; a variable's initial value goes to the other workers the same way).

use crate::Element;

/// The elements of `values` as bytes.
pub(crate) fn element_bytes<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: every `Element` is a plain number type (f16, bf16, f32, f64, i32, i64) with no
    // padding; the byte view covers exactly the slice and borrows it.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// The elements of `values` as mutable bytes, to receive into.
pub(crate) fn element_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as `element_bytes`, and every bit pattern is a valid value of these types, so
    // whatever is written leaves valid elements.
    unsafe {
        std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), std::mem::size_of_val(values))
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    #[test]
    fn bytes_round_trip_every_dtype_width() {
        let values = [1.5f64, -2.25];
        let mut back = [0f64; 2];
        element_bytes_mut(&mut back).copy_from_slice(element_bytes(&values));
        assert_eq!(back, values);
        let halves = [f16::from_f32(0.5), f16::from_f32(-3.0)];
        assert_eq!(element_bytes(&halves).len(), 4);
        let ints = [7i32, -1];
        assert_eq!(
            element_bytes(&ints),
            [7, 0, 0, 0, 255, 255, 255, 255].map(u8::from_le)
        );
    }
}
