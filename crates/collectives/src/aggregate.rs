//! Aggregating gradients on one device (TF's `cross_device_utils` helpers, COL-33, COL-34,
//! COL-40): add dense tensors, concatenate sparse ones, divide either kind by a count (a dense
//! tensor alone: [`Tensor::divided_by`]), and aggregate one gradient by copying its replicas to
//! one place.

use distribute_values::ReduceOp;
use half::{bf16, f16};

use crate::kernel::{divide, reduce_tensors};
use crate::{AnyTensor, CollectiveError, DType, IndexedSlices, Tensor};

/// Sums `values` on the first value's device (TF's `aggregate_tensors_or_indexed_slices`).
///
/// All dense → the element-wise sum. All sparse → the slices concatenated, still sparse (their
/// dense value is the sum). A mix → the dense sum, sparse values densified first, as TF's
/// `add_n` does. Fails on an empty list or mismatched shapes or dtypes.
///
/// ```
/// use distribute_collectives::{AnyTensor, Tensor, aggregate_tensors_or_indexed_slices};
///
/// let a = Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0])?;
/// let b = Tensor::from_vec("/cpu:0", &[2], vec![3.0f32, 4.0])?;
/// let sum = aggregate_tensors_or_indexed_slices(&[a.into(), b.into()])?;
/// assert_eq!(sum.to_dense()?.to_vec::<f32>()?, [4.0, 6.0]);
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
pub fn aggregate_tensors_or_indexed_slices(
    values: &[AnyTensor],
) -> Result<AnyTensor, CollectiveError> {
    let first = values.first().ok_or_else(|| {
        CollectiveError::InvalidArgument("cannot aggregate an empty list of values".into())
    })?;
    let device = first.device();
    if values.iter().all(AnyTensor::is_sparse) {
        let parts: Vec<IndexedSlices> = values
            .iter()
            .filter_map(|v| match v {
                AnyTensor::Sparse(s) => Some(s.clone()),
                AnyTensor::Dense(_) => None,
            })
            .collect();
        return Ok(IndexedSlices::concat(device, &parts)?.into());
    }
    let dense = values
        .iter()
        .map(AnyTensor::to_dense)
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&Tensor> = dense.iter().collect();
    Ok(reduce_tensors(ReduceOp::Sum, &refs, device, refs.len())?.into())
}

/// `value / n`, keeping the kind: an [`IndexedSlices`] stays sparse with its values divided
/// (TF's `divide_by_n_tensors_or_indexed_slices`). Fails for `n == 0` and integer dtypes.
pub fn divide_by_n(value: &AnyTensor, n: usize) -> Result<AnyTensor, CollectiveError> {
    Ok(match value {
        AnyTensor::Dense(t) => divide(t, n)?.into(),
        AnyTensor::Sparse(s) => IndexedSlices::new(
            divide(s.values(), n)?,
            s.indices().to_vec(),
            s.dense_shape().to_vec(),
        )?
        .into(),
    })
}

/// True when any element of `tensor` is infinite or NaN (never for integers).
pub fn has_inf_or_nan(tensor: &Tensor) -> Result<bool, CollectiveError> {
    Ok(match tensor.dtype() {
        DType::F16 => tensor.array::<f16>()?.iter().any(|x| !x.is_finite()),
        DType::BF16 => tensor.array::<bf16>()?.iter().any(|x| !x.is_finite()),
        DType::F32 => tensor.array::<f32>()?.iter().any(|x| !x.is_finite()),
        DType::F64 => tensor.array::<f64>()?.iter().any(|x| !x.is_finite()),
        DType::I32 | DType::I64 => false,
    })
}

/// One gradient, aggregated from its per-replica copies: the summed gradient with the first
/// pair's variable, and, when asked for, whether any input was not finite.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregatedGradient<V> {
    /// The sum (or mean) of the gradients, on the first gradient's device.
    pub grad: Tensor,
    /// The variable of the first pair.
    pub var: V,
    /// `Some(true)` when the check was on and some gradient held an inf or NaN.
    pub has_inf_or_nan: Option<bool>,
}

/// Sums the gradients of `grad_and_vars` by copying them to the first one's device (TF's
/// `aggregate_single_gradient_using_copy`).
///
/// With `use_mean` and more than one gradient the sum is divided by their count; a single
/// gradient is returned unchanged. With `check_inf_nan` the result says whether any input
/// element is infinite or NaN. Fails on an empty list or mismatched gradients.
pub fn aggregate_single_gradient_using_copy<V: Clone>(
    grad_and_vars: &[(Tensor, V)],
    use_mean: bool,
    check_inf_nan: bool,
) -> Result<AggregatedGradient<V>, CollectiveError> {
    let (first, var) = grad_and_vars.first().ok_or_else(|| {
        CollectiveError::InvalidArgument("cannot aggregate an empty list of gradients".into())
    })?;
    let grads: Vec<&Tensor> = grad_and_vars.iter().map(|(g, _)| g).collect();
    let mut grad = reduce_tensors(ReduceOp::Sum, &grads, first.device(), grads.len())?;
    if use_mean && grads.len() > 1 {
        grad = divide(&grad, grads.len())?;
    }
    let has_inf_or_nan = if check_inf_nan {
        let mut any = false;
        for g in &grads {
            any |= has_inf_or_nan(g)?;
        }
        Some(any)
    } else {
        None
    };
    Ok(AggregatedGradient {
        grad,
        var: var.clone(),
        has_inf_or_nan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inf_nan_check_covers_every_float_dtype_and_never_flags_integers() {
        let f16s = Tensor::from_vec("/cpu:0", &[2], vec![f16::ONE, f16::INFINITY]).unwrap();
        let bf16s = Tensor::from_vec("/cpu:0", &[1], vec![bf16::NAN]).unwrap();
        let f64s = Tensor::from_vec("/cpu:0", &[2], vec![1.0f64, f64::MAX]).unwrap();
        let ints = Tensor::from_vec("/cpu:0", &[1], vec![i64::MAX]).unwrap();
        assert!(has_inf_or_nan(&f16s).unwrap());
        assert!(has_inf_or_nan(&bf16s).unwrap());
        assert!(!has_inf_or_nan(&f64s).unwrap());
        assert!(!has_inf_or_nan(&ints).unwrap());
    }

    #[test]
    fn empty_inputs_are_refused() {
        assert!(aggregate_tensors_or_indexed_slices(&[]).is_err());
        assert!(aggregate_single_gradient_using_copy::<()>(&[], true, true).is_err());
        let t = Tensor::from_vec("/cpu:0", &[1], vec![1.0f32]).unwrap();
        assert!(divide_by_n(&t.into(), 0).is_err());
    }
}
