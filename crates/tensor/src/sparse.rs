//! Sparse gradients ([`IndexedSlices`], TF's `IndexedSlices`) and [`AnyTensor`], the dense-or-sparse
//! value that cross-device operations accept.
//!
//! Sparse values reduce by concatenation (TF's behaviour): a sum keeps every slice, duplicates
//! included, and only densifying adds duplicates up.

use std::fmt;

use crate::kernel::Arith;
use crate::tensor::try_filled;
use crate::with_dtype;
use crate::{DType, Tensor, TensorError};

/// Rows of a conceptually dense tensor: `values[i]` is row `indices[i]` of a tensor of shape
/// `dense_shape`. Indices may repeat; their rows add up.
///
/// ```
/// use distribute_tensor::{IndexedSlices, Tensor};
///
/// let values = Tensor::from_vec("/cpu:0", &[2, 2], vec![3.0f32, 4.0, 5.0, 6.0])?;
/// let slices = IndexedSlices::new(values, vec![1, 3], vec![5, 2])?;
/// let dense = slices.to_dense()?;
/// assert_eq!(dense.to_vec::<f32>()?, [0., 0., 3., 4., 0., 0., 5., 6., 0., 0.]);
/// # Ok::<(), distribute_tensor::TensorError>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct IndexedSlices {
    values: Tensor,
    indices: Vec<usize>,
    dense_shape: Vec<usize>,
}

impl IndexedSlices {
    /// Checks that there is one index per row of `values`, each below `dense_shape[0]`, and that
    /// the rows have the shape of `dense_shape` without its first dimension.
    pub fn new(
        values: Tensor,
        indices: Vec<usize>,
        dense_shape: Vec<usize>,
    ) -> Result<IndexedSlices, TensorError> {
        let invalid = |why: String| Err(TensorError::InvalidArgument(why));
        let Some((&rows, row_shape)) = dense_shape.split_first() else {
            return invalid("IndexedSlices need a dense shape of rank ≥ 1".into());
        };
        if values.shape().first() != Some(&indices.len()) || &values.shape()[1..] != row_shape {
            return invalid(format!(
                "IndexedSlices values of shape {:?} do not fit {} indices into dense shape \
                 {dense_shape:?}: expected values of shape [{}, {}]",
                values.shape(),
                indices.len(),
                indices.len(),
                row_shape
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        if let Some(&bad) = indices.iter().find(|&&i| i >= rows) {
            return invalid(format!(
                "IndexedSlices index {bad} is out of range for a dense shape with {rows} rows"
            ));
        }
        Ok(IndexedSlices {
            values,
            indices,
            dense_shape,
        })
    }

    /// The rows, shape `[indices.len(), dense_shape[1..]…]`.
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// The row of the dense tensor each value row belongs to.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// The shape of the dense tensor.
    pub fn dense_shape(&self) -> &[usize] {
        &self.dense_shape
    }

    /// The device of the values.
    pub fn device(&self) -> &str {
        self.values.device()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.values.dtype()
    }

    /// The same slices on `device`, sharing the buffer.
    pub fn to_device(&self, device: &str) -> IndexedSlices {
        IndexedSlices {
            values: self.values.to_device(device),
            ..self.clone()
        }
    }

    /// The same slices on `device`, moving the values as [`Tensor::copy_to`] does.
    pub fn copy_to(&self, device: &str) -> Result<IndexedSlices, TensorError> {
        Ok(IndexedSlices {
            values: self.values.copy_to(device)?,
            ..self.clone()
        })
    }

    /// The dense tensor: zeros, with every slice added to its row (duplicates add up, in index
    /// order, with the reduction kernel's arithmetic: f16/bf16 accumulate in f32 and round once,
    /// integers wrap).
    ///
    /// Fails, without allocating, when the dense shape holds more elements than memory can.
    pub fn to_dense(&self) -> Result<Tensor, TensorError> {
        fn densify<T: Arith>(slices: &IndexedSlices) -> Result<Tensor, TensorError> {
            let mut acc = try_filled(&slices.dense_shape, T::Acc::default())?;
            // Fits: the whole dense shape's element count did.
            let row_len = slices.dense_shape[1..].iter().product::<usize>();
            let values = slices.values.array::<T>()?;
            for (row, &index) in slices.indices.iter().enumerate() {
                let source = values.index_axis(ndarray::Axis(0), row);
                let target = &mut acc[index * row_len..(index + 1) * row_len];
                for (a, &x) in target.iter_mut().zip(source.iter()) {
                    *a = T::add(*a, x.load());
                }
            }
            let dense: Vec<T> = acc.into_iter().map(T::store).collect();
            Tensor::from_vec(slices.device(), &slices.dense_shape, dense)
        }
        with_dtype!(self.dtype(), T => densify::<T>(self))
    }

    /// The slices of every input in order, on `device` (TF's sparse SUM). Fails when dense
    /// shapes or dtypes differ.
    pub fn concat(device: &str, parts: &[IndexedSlices]) -> Result<IndexedSlices, TensorError> {
        let first = parts.first().ok_or_else(|| {
            TensorError::InvalidArgument("cannot reduce an empty list of IndexedSlices".into())
        })?;
        if let Some(other) = parts.iter().find(|p| p.dense_shape != first.dense_shape) {
            return Err(TensorError::InvalidArgument(format!(
                "IndexedSlices with dense shapes {:?} and {:?} cannot be reduced together",
                first.dense_shape, other.dense_shape
            )));
        }
        let values: Vec<Tensor> = parts.iter().map(|p| p.values.clone()).collect();
        let values = Tensor::concat_rows(device, &values)?;
        let indices = parts
            .iter()
            .flat_map(|p| p.indices.iter().copied())
            .collect();
        IndexedSlices::new(values, indices, first.dense_shape.clone())
    }
}

impl fmt::Debug for IndexedSlices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "IndexedSlices(indices={:?}, dense_shape={:?}, values={})",
            self.indices, self.dense_shape, self.values
        )
    }
}

/// A dense [`Tensor`] or sparse [`IndexedSlices`]: what `reduce` and `batch_reduce` accept.
#[derive(Clone, PartialEq)]
pub enum AnyTensor {
    /// A dense tensor.
    Dense(Tensor),
    /// Rows of a dense tensor.
    Sparse(IndexedSlices),
}

impl AnyTensor {
    /// The device the value is placed on.
    pub fn device(&self) -> &str {
        match self {
            AnyTensor::Dense(t) => t.device(),
            AnyTensor::Sparse(s) => s.device(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            AnyTensor::Dense(t) => t.dtype(),
            AnyTensor::Sparse(s) => s.dtype(),
        }
    }

    /// True for [`AnyTensor::Sparse`] (TF's `is_indexed_slices`).
    pub fn is_sparse(&self) -> bool {
        matches!(self, AnyTensor::Sparse(_))
    }

    /// The same value on `device`, sharing buffers.
    pub fn to_device(&self, device: &str) -> AnyTensor {
        match self {
            AnyTensor::Dense(t) => AnyTensor::Dense(t.to_device(device)),
            AnyTensor::Sparse(s) => AnyTensor::Sparse(s.to_device(device)),
        }
    }

    /// The same value on `device`, moving memory as [`Tensor::copy_to`] does.
    pub fn copy_to(&self, device: &str) -> Result<AnyTensor, TensorError> {
        Ok(match self {
            AnyTensor::Dense(t) => AnyTensor::Dense(t.copy_to(device)?),
            AnyTensor::Sparse(s) => AnyTensor::Sparse(s.copy_to(device)?),
        })
    }

    /// The dense tensor, densifying sparse slices.
    pub fn to_dense(&self) -> Result<Tensor, TensorError> {
        match self {
            AnyTensor::Dense(t) => Ok(t.clone()),
            AnyTensor::Sparse(s) => s.to_dense(),
        }
    }
}

impl From<Tensor> for AnyTensor {
    fn from(t: Tensor) -> Self {
        AnyTensor::Dense(t)
    }
}

impl From<IndexedSlices> for AnyTensor {
    fn from(s: IndexedSlices) -> Self {
        AnyTensor::Sparse(s)
    }
}

impl fmt::Debug for AnyTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyTensor::Dense(t) => fmt::Debug::fmt(t, f),
            AnyTensor::Sparse(s) => fmt::Debug::fmt(s, f),
        }
    }
}

impl fmt::Display for AnyTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dense shape's product once overflowed (a panic in debug builds, a wrapped and wrong
    /// size in release) or allocated without bound; now each is a typed error.
    #[test]
    fn an_absurd_dense_shape_is_an_error_not_a_crash() {
        for dense_shape in [
            vec![usize::MAX, 2],
            vec![1 << 40, 1 << 40],
            vec![1, usize::MAX / 2],
            vec![1 << 60],
        ] {
            let row_shape = &dense_shape[1..];
            // No rows: the values are empty whatever the row shape.
            let values =
                Tensor::from_vec("/cpu:0", &[&[0][..], row_shape].concat(), Vec::<f32>::new())
                    .unwrap();
            let slices = IndexedSlices::new(values, vec![], dense_shape.clone()).unwrap();
            let err = slices.to_dense().unwrap_err();
            assert!(
                matches!(&err, TensorError::InvalidArgument(m) if m.contains("too large")),
                "{dense_shape:?}: {err:?}"
            );
        }
    }
}
