//! Elements as bytes: how tensors travel between processes whatever their dtype (MPI moves
//! bytes; a variable's initial value goes to the other workers the same way). The one home of
//! tensor → bytes: backends and `VariableValue::to_wire` use these.

use crate::kernel::contiguous;
use crate::with_dtype;
use crate::{Element, Tensor, TensorError};

/// The elements of `values` as bytes.
pub fn element_bytes<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: every `Element` is a plain number type (f16, bf16, f32, f64, i32, i64) with no
    // padding; the byte view covers exactly the slice and borrows it.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// The elements of `values` as mutable bytes, to receive into.
pub fn element_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as `element_bytes`, and every bit pattern is a valid value of these types, so
    // whatever is written leaves valid elements.
    unsafe {
        std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), std::mem::size_of_val(values))
    }
}

/// A tensor's elements as native-endian bytes, in row-major order (a copy; a GPU tensor is
/// copied to the host first). Workers of one job run on one architecture, so the receiver reads
/// them back with [`element_bytes_mut`] of the same dtype.
pub fn tensor_bytes(tensor: &Tensor) -> Result<Vec<u8>, TensorError> {
    let host = tensor.to_host()?;
    with_dtype!(host.dtype(), T => {
        let array = host.array::<T>()?;
        Ok(match contiguous(array) {
            Some(slice) => element_bytes(slice).to_vec(),
            None => element_bytes(&array.iter().copied().collect::<Vec<T>>()).to_vec(),
        })
    })
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

    #[test]
    fn a_strided_tensor_travels_in_row_major_order() {
        let t = Tensor::from_vec("/cpu:0", &[2, 2], vec![1i32, 2, 3, 4]).unwrap();
        let transposed =
            Tensor::from_shared("/cpu:0", t.array::<i32>().unwrap().clone().reversed_axes());
        assert_eq!(
            tensor_bytes(&transposed).unwrap(),
            element_bytes(&[1i32, 3, 2, 4])
        );
    }
}
