//! Shape plumbing shared by the algorithms: flattening inputs with shape restore (COL-47,
//! COL-56), TF's padded split into equal pieces and its inverse (COL-49, COL-50), and the ragged
//! split whose last piece takes the remainder (COL-51).

use crate::flat::{concat, flatten, require_1d, reshape, split_lengths, zero_pad};
use crate::{CollectiveError, Tensor};

/// Every input as a 1-D tensor, plus the shape they all had (to restore on the outputs).
///
/// Fails on an empty list, or on shapes that differ (they cannot be merged). Host tensors always
/// have fully known shapes, so TF's "statically known shape" error cannot arise here.
pub fn flatten_tensors(tensors: &[Tensor]) -> Result<(Vec<Tensor>, Vec<usize>), CollectiveError> {
    let first = tensors.first().ok_or_else(|| {
        CollectiveError::InvalidArgument("tensors cannot be empty: pass one per device".into())
    })?;
    if let Some(other) = tensors.iter().find(|t| t.shape() != first.shape()) {
        return Err(CollectiveError::InvalidArgument(format!(
            "shapes {:?} and {:?} cannot be merged: every device must hold the same shape",
            first.shape(),
            other.shape()
        )));
    }
    let shape = first.shape().to_vec();
    let flat = if shape.len() == 1 {
        tensors.to_vec()
    } else {
        tensors.iter().map(flatten).collect::<Result<_, _>>()?
    };
    Ok((flat, shape))
}

/// Gives each output back the shape its inputs had (a no-op for 1-D shapes).
pub(crate) fn restore_shape(
    outputs: Vec<Tensor>,
    shape: &[usize],
) -> Result<Vec<Tensor>, CollectiveError> {
    if shape.len() == 1 {
        return Ok(outputs);
    }
    outputs.iter().map(|t| reshape(t, shape)).collect()
}

/// The pieces of a [`padded_split`] and how many zeros were appended to make them equal.
#[derive(Debug, Clone)]
pub struct PaddedSplit {
    /// `pieces` tensors of equal length.
    pub pieces: Vec<Tensor>,
    /// Zeros appended at the end of the last piece(s).
    pub pad_len: usize,
}

/// Splits a 1-D tensor into `pieces` equal pieces, zero-padding the end as needed (TF's
/// `_padded_split`).
///
/// Each piece has `ceil(len / pieces)` elements, so 10 into 4 gives 4×3 with pad 2 and 3 into 5
/// gives 5×1 with pad 2. (TF reaches the same lengths through three branches.)
pub fn padded_split(tensor: &Tensor, pieces: usize) -> Result<PaddedSplit, CollectiveError> {
    let len = require_1d(tensor, "padded_split")?;
    if pieces == 0 {
        return Err(CollectiveError::InvalidArgument(
            "padded_split: the number of pieces must be at least 1".into(),
        ));
    }
    let piece_len = len.div_ceil(pieces);
    let pad_len = piece_len * pieces - len;
    let padded = zero_pad(tensor, pad_len)?;
    let pieces = split_lengths(&padded, &vec![piece_len; pieces])?;
    Ok(PaddedSplit { pieces, pad_len })
}

/// Drops the last `pad_len` elements of every 1-D tensor (TF's `_strip_padding`).
///
/// Fails on an empty list, on a tensor of rank > 1, and on a pad longer than the tensor.
pub fn strip_padding(tensors: &[Tensor], pad_len: usize) -> Result<Vec<Tensor>, CollectiveError> {
    let first = tensors.first().ok_or_else(|| {
        CollectiveError::InvalidArgument("strip_padding: tensors cannot be empty".into())
    })?;
    if first.rank() > 1 {
        return Err(CollectiveError::InvalidArgument(format!(
            "strip_padding: tensors must be 1-D, got shape {:?}",
            first.shape()
        )));
    }
    tensors
        .iter()
        .map(|t| {
            let len = require_1d(t, "strip_padding")?;
            let keep = len.checked_sub(pad_len).ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "strip_padding: pad length {pad_len} is longer than the tensor ({len} elements)"
                ))
            })?;
            t.slice_rows(0..keep)
        })
        .collect()
}

/// Splits a 1-D tensor into `pieces` pieces of `len / pieces` elements, the last taking the
/// remainder, so it may be longer: 10 into 4 → [2, 2, 2, 4] (TF's `_ragged_split`).
pub fn ragged_split(tensor: &Tensor, pieces: usize) -> Result<Vec<Tensor>, CollectiveError> {
    let len = require_1d(tensor, "ragged_split")?;
    if pieces == 0 {
        return Err(CollectiveError::InvalidArgument(
            "ragged_split: the number of pieces must be at least 1".into(),
        ));
    }
    let piece_len = len / pieces;
    let mut lengths = vec![piece_len; pieces];
    lengths[pieces - 1] = len - piece_len * (pieces - 1);
    split_lengths(tensor, &lengths)
}

/// Joins reduced shards on `device` (the scatter side of shuffle and the ring).
pub(crate) fn join(device: &str, shards: &[Tensor]) -> Result<Tensor, CollectiveError> {
    concat(device, shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(len: usize) -> Tensor {
        Tensor::from_vec("/cpu:0", &[len], (0..len as i32).collect()).unwrap()
    }

    #[test]
    fn empty_tensors_split_into_empty_pieces() {
        let split = padded_split(&iota(0), 4).unwrap();
        assert_eq!((split.pieces.len(), split.pad_len), (4, 0));
        assert!(split.pieces.iter().all(|p| p.num_elements() == 0));
        assert!(padded_split(&iota(3), 0).is_err());
        assert!(ragged_split(&iota(3), 0).is_err());
    }

    #[test]
    fn restore_shape_is_the_inverse_of_flatten() {
        let t = Tensor::from_vec("/cpu:0", &[2, 1, 3], (0..6).collect::<Vec<i32>>()).unwrap();
        let (flat, shape) = flatten_tensors(std::slice::from_ref(&t)).unwrap();
        assert_eq!(restore_shape(flat, &shape).unwrap(), [t]);
    }
}
