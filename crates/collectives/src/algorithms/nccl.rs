//! The NCCL builder's contract on the host (TF's `build_nccl_all_reduce`, COL-53): an all-sum of
//! one tensor per device, then the optional unary op, with the input shape restored.
//!
//! NCCL only sums, so any other reduction is refused here exactly as TF refuses it; the device
//! backend behind the `nccl` feature has the same contract, which this function states
//! executably.

use distribute_values::ReduceOp;

use super::shape::{flatten_tensors, restore_shape};
use super::{UnaryOp, apply_unary, combine};
use crate::{CollectiveError, Tensor};

/// All-sum of one tensor per device: every output is the sum of all inputs, in input order,
/// placed on its input's device.
///
/// Fails for any `red_op` other than `Sum`, and on an empty list or differing shapes.
pub fn nccl_all_reduce(
    inputs: &[Tensor],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    if red_op != ReduceOp::Sum {
        return Err(CollectiveError::InvalidArgument(format!(
            "red_op {red_op:?} is not supported by the NCCL all-reduce: it only sums"
        )));
    }
    let (flat, shape) = flatten_tensors(inputs)?;
    let refs: Vec<&Tensor> = flat.iter().collect();
    let sum = combine(red_op, &refs, flat[0].device())?;
    let outputs = flat
        .iter()
        .map(|t| apply_unary(un_op, sum.to_device(t.device())))
        .collect::<Result<Vec<_>, _>>()?;
    restore_shape(outputs, &shape)
}
