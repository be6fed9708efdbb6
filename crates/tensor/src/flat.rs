//! Flat (1-D) views of tensors: reshape, split into pieces, join.
//!
//! The fusion plan and the batched all-reduce move data as 1-D runs of elements; this is the one
//! place that knows how. Host tensors of standard layout reshape and split without copying (they
//! share the `ArcArray` buffer); only joins allocate.

use ndarray::IxDyn;

use crate::{Element, with_dtype};
use crate::{Tensor, TensorError};

/// `tensor` with a new shape holding the same number of elements, in row-major order.
pub fn reshape(tensor: &Tensor, shape: &[usize]) -> Result<Tensor, TensorError> {
    let wanted: usize = shape.iter().product();
    if wanted != tensor.num_elements() {
        return Err(TensorError::InvalidArgument(format!(
            "cannot reshape a tensor of shape {:?} ({} elements) to {shape:?} ({wanted} elements)",
            tensor.shape(),
            tensor.num_elements()
        )));
    }
    fn typed<T: Element>(tensor: &Tensor, shape: &[usize]) -> Result<Tensor, TensorError> {
        let array = tensor.array::<T>()?;
        if array.is_standard_layout()
            && let Ok(shared) = array.clone().into_shape_with_order(IxDyn(shape))
        {
            return Ok(Tensor::from_shared_like(shared, tensor));
        }
        Tensor::from_vec(tensor.device(), shape, array.iter().copied().collect())
    }
    with_dtype!(tensor.dtype(), T => typed::<T>(tensor, shape))
}

/// `tensor` as a 1-D tensor of all its elements.
pub fn flatten(tensor: &Tensor) -> Result<Tensor, TensorError> {
    reshape(tensor, &[tensor.num_elements()])
}

/// Fails unless `tensor` is 1-D; `what` names the caller for the message.
pub fn require_1d(tensor: &Tensor, what: &str) -> Result<usize, TensorError> {
    match tensor.shape() {
        [len] => Ok(*len),
        shape => Err(TensorError::InvalidArgument(format!(
            "{what}: the input tensor must be 1-D, got shape {shape:?}; flatten it first"
        ))),
    }
}

/// Consecutive pieces of a 1-D tensor with the given lengths, which must add up to its length.
pub fn split_lengths(tensor: &Tensor, lengths: &[usize]) -> Result<Vec<Tensor>, TensorError> {
    let len = require_1d(tensor, "split")?;
    let total: usize = lengths.iter().sum();
    if total != len {
        return Err(TensorError::InvalidArgument(format!(
            "cannot split {len} elements into pieces of lengths {lengths:?} (total {total})"
        )));
    }
    let mut start = 0;
    lengths
        .iter()
        .map(|&l| {
            let piece = tensor.slice_rows(start..start + l);
            start += l;
            piece
        })
        .collect()
}

/// The 1-D tensors joined end to end on `device`.
pub fn concat(device: &str, pieces: &[Tensor]) -> Result<Tensor, TensorError> {
    if let [only] = pieces {
        if only.device() == device {
            return Ok(only.clone());
        }
        return Ok(only.to_device(device));
    }
    Tensor::concat_rows(device, pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_shares_a_contiguous_buffer_and_keeps_row_major_order() {
        let t = Tensor::from_vec("/cpu:0", &[2, 3], (0..6).collect::<Vec<i32>>()).unwrap();
        let flat = flatten(&t).unwrap();
        assert_eq!(flat.shape(), [6]);
        assert_eq!(flat.to_vec::<i32>().unwrap(), [0, 1, 2, 3, 4, 5]);
        let back = reshape(&flat, &[3, 2]).unwrap();
        assert_eq!(back.to_vec::<i32>().unwrap(), [0, 1, 2, 3, 4, 5]);
        assert!(reshape(&t, &[4]).is_err());
    }

    #[test]
    fn split_and_concat_round_trip() {
        let t = Tensor::from_vec("/cpu:0", &[5], vec![1.0f32, 2., 3., 4., 5.]).unwrap();
        let parts = split_lengths(&t, &[2, 0, 3]).unwrap();
        assert_eq!(
            parts.iter().map(Tensor::num_elements).collect::<Vec<_>>(),
            [2, 0, 3]
        );
        assert!(split_lengths(&t, &[2, 2]).is_err());
        let joined = concat("/cpu:1", &parts).unwrap();
        assert_eq!(
            (joined.device(), joined.to_vec::<f32>().unwrap()),
            ("/cpu:1", t.to_vec().unwrap())
        );
    }
}
