//! Tensors as distributed values: [`Regroup`] (a tensor is a leaf, collapsed only when every
//! replica returned the very same tensor), [`Nest`] (a tensor is one leaf of a nested
//! structure) and [`VariableValue`] (so mirrored and sync-on-read variables can hold tensors).

use distribute_values::{
    Leaf, LeafMapper, LeafVisitor, LeafZipper, Mirrored, Nest, Path, PerReplica, Regroup,
    RegroupContext, Selection, ValuesError, VariableValue, Wrap,
};
use std::sync::Arc;

use crate::with_dtype;
use crate::{Tensor, kernel};

/// Regrouping collapses tensors by identity (same buffer, same device), as TF does with `is`:
/// comparing every element of large per-replica results would cost a pass over them, and two
/// replicas that computed equal values on their own devices still hold two tensors.
impl Regroup for Tensor {
    type Regrouped = Leaf<Tensor>;

    fn regroup_replicas(
        replicas: Vec<Tensor>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Leaf<Tensor>, ValuesError> {
        let Some(first) = replicas.first() else {
            return Err(path.mismatch("no replica returned a value"));
        };
        let identical = replicas[1..]
            .iter()
            .all(|t| t.device() == first.device() && t.shares_buffer_with(first));
        if identical && !cx.options().always_wrap {
            return Ok(Leaf::Same(
                replicas.into_iter().next().expect("one replica"),
            ));
        }
        let devices = Arc::clone(cx.devices());
        Ok(match cx.options().wrap {
            Wrap::PerReplica => Leaf::PerReplica(PerReplica::new(devices, replicas)?),
            Wrap::Mirrored => Leaf::Mirrored(Mirrored::new(devices, replicas)?),
        })
    }

    fn select(
        regrouped: &Leaf<Tensor>,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Tensor, ValuesError> {
        regrouped.select_leaf(selection, path)
    }
}

/// A tensor is a leaf: walks over nested structures (the fused all-reduce, a dataset's batches)
/// see it whole.
impl Nest for Tensor {
    fn visit_leaves<V: LeafVisitor>(
        &self,
        path: &Path<'_>,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        visitor.leaf(path, self)
    }

    fn map_leaves<M: LeafMapper>(&self, path: &Path<'_>, mapper: &mut M) -> Result<Self, M::Error> {
        mapper.leaf(path, self)
    }

    fn zip_leaves<Z: LeafZipper>(
        parts: &[&Self],
        path: &Path<'_>,
        zipper: &mut Z,
    ) -> Result<Self, Z::Error> {
        zipper.leaf(path, parts)
    }
}

fn arithmetic(error: crate::TensorError) -> ValuesError {
    ValuesError::Arithmetic(error.to_string())
}

/// Element-wise arithmetic for variables; shapes and dtypes must match.
impl VariableValue for Tensor {
    fn is_floating(&self) -> bool {
        self.dtype().is_floating()
    }

    fn is_zero(&self) -> bool {
        Tensor::zeros(self.device(), self.dtype(), self.shape()).is_ok_and(|zeros| *self == zeros)
    }

    /// The elements' native-endian bytes (workers of one job run on one architecture).
    fn to_wire(&self) -> Option<Vec<u8>> {
        crate::bytes::tensor_bytes(self).ok()
    }

    fn like_from_wire(&self, bytes: &[u8]) -> Option<Tensor> {
        with_dtype!(self.dtype(), T => {
            let mut values = vec![<T as crate::Element>::zero(); self.num_elements()];
            let target = crate::bytes::element_bytes_mut(&mut values);
            if target.len() != bytes.len() {
                return None;
            }
            target.copy_from_slice(bytes);
            let host = Tensor::from_vec(self.device(), self.shape(), values).ok()?;
            // Back where the value lived (a GPU copy for a GPU variable).
            host.copy_to(self.device()).ok()
        })
    }

    fn try_add(&self, other: &Tensor) -> Result<Tensor, ValuesError> {
        kernel::reduce_tensors(
            distribute_values::ReduceOp::Sum,
            &[self, other],
            self.device(),
            2,
        )
        .map_err(arithmetic)
    }

    fn try_sub(&self, other: &Tensor) -> Result<Tensor, ValuesError> {
        kernel::subtract(self, other).map_err(arithmetic)
    }

    /// One fixed-order reduction, as the all-reduce does: f16 / bf16 accumulate in f32 and round
    /// once, so a variable's Sum or Mean aggregate has the same bits as the collective's.
    fn sum_all(values: &[Tensor]) -> Result<Tensor, ValuesError> {
        let first = values
            .first()
            .ok_or_else(|| ValuesError::Arithmetic("cannot sum an empty list of tensors".into()))?;
        let refs: Vec<&Tensor> = values.iter().collect();
        kernel::reduce_tensors(
            distribute_values::ReduceOp::Sum,
            &refs,
            first.device(),
            values.len(),
        )
        .map_err(arithmetic)
    }

    fn mean_all(values: &[Tensor]) -> Result<Tensor, ValuesError> {
        let first = values
            .first()
            .ok_or_else(|| ValuesError::Arithmetic("cannot average an empty list".into()))?;
        if !first.is_floating() {
            // Integers: the truncating mean the values crate defines for variables, not the
            // collectives' float64 mean.
            return Tensor::sum_all(values)?.divide_by_count(values.len());
        }
        let refs: Vec<&Tensor> = values.iter().collect();
        kernel::reduce_tensors(
            distribute_values::ReduceOp::Mean,
            &refs,
            first.device(),
            values.len(),
        )
        .map_err(arithmetic)
    }

    fn divide_by_count(&self, count: usize) -> Result<Tensor, ValuesError> {
        if self.dtype().is_floating() {
            return kernel::divide(self, count).map_err(arithmetic);
        }
        // Integers truncate toward zero, as the values crate's scalars (and TF's cast) do.
        int_divide(self, count)
    }
}

/// Integer division by `count`, truncating toward zero.
fn int_divide(tensor: &Tensor, count: usize) -> Result<Tensor, ValuesError> {
    let zero = || ValuesError::Arithmetic(format!("cannot divide a tensor by a count of {count}"));
    let divided = match tensor.dtype() {
        crate::DType::I32 => {
            let d = i32::try_from(count)
                .ok()
                .filter(|d| *d != 0)
                .ok_or_else(zero)?;
            let a = tensor.array::<i32>().map_err(arithmetic)?.mapv(|x| x / d);
            Tensor::from_shared(tensor.device(), a.into_shared())
        }
        crate::DType::I64 => {
            let d = i64::try_from(count)
                .ok()
                .filter(|d| *d != 0)
                .ok_or_else(zero)?;
            let a = tensor.array::<i64>().map_err(arithmetic)?.mapv(|x| x / d);
            Tensor::from_shared(tensor.device(), a.into_shared())
        }
        other => unreachable!("{other} is floating, handled by the caller"),
    };
    Ok(divided)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_leaves_of_nested_structures() {
        let value = (
            Tensor::scalar("/cpu:0", 1.0f32),
            vec![Tensor::scalar("/cpu:0", 2.0f32)],
            None::<Tensor>,
        );
        let leaves = value.leaves::<Tensor>().unwrap();
        assert_eq!(leaves.len(), 2);
        let doubled = value
            .try_map_leaves(|_, t: &Tensor| Ok::<_, ValuesError>(t.divided_by(2).unwrap()))
            .unwrap();
        assert_eq!(doubled.1[0].to_vec::<f32>().unwrap(), [1.0]);
        let err = (Tensor::scalar("/cpu:0", 1.0f32), 3i32)
            .leaves::<Tensor>()
            .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("Tensor at .1, found a i32"), "{message}");
    }
}
