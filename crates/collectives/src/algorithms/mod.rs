//! Host implementations of TensorFlow's all-reduce algorithms (`all_reduce.py`): ring with
//! subchunks, shuffle, recursive halving-doubling, hierarchical copy, and the two-level hybrids
//! that reduce within each task first.
//!
//! Every function takes one tensor per participating device (each tensor carries its device)
//! and returns one fully reduced tensor per device, in input order, after running the
//! algorithm's real data movement on host tensors: the same chunks travel the same paths and are
//! combined in the same order as TF's graph would. Element-wise combining goes through the
//! crate's fixed-order kernel.
//!
//! What they are today: host implementations of the algorithms in TF's `all_reduce.py`, tested
//! against the element-wise mean (COL-42..COL-56), usable as executable references for device
//! backends. No [`CrossDeviceOps`](crate::CrossDeviceOps) backend selects them yet, so a strategy
//! cannot choose one of them as its all-reduce.
//!
//! `red_op` is the pairwise or n-ary combination (`Sum`, `Min`, `Max`); a mean is a `Sum`
//! followed by a [`UnaryOp`] dividing by the participant count, applied once per reduced shard
//! exactly where TF applies `un_op`.

mod hierarchical_copy;
mod hybrid;
mod nccl;
mod recursive_hd;
mod ring;
mod shape;
mod shuffle;

pub use hierarchical_copy::hierarchical_copy_all_reduce;
pub use hybrid::{
    TaskGroups, nccl_then_recursive_hd, nccl_then_ring, nccl_then_shuffle, reduce_non_singleton,
    shuffle_then_ring, shuffle_then_shuffle, split_by_task,
};
pub use nccl::nccl_all_reduce;
pub use recursive_hd::recursive_hd_all_reduce;
pub use ring::{RingGather, RingPermutations, ring_all_reduce, ring_gather, ring_permutations};
pub use shape::{PaddedSplit, flatten_tensors, padded_split, ragged_split, strip_padding};
pub use shuffle::shuffle_all_reduce;

use distribute_values::ReduceOp;

use crate::kernel::reduce_tensors;
use crate::{CollectiveError, Tensor};

/// An element-wise operation applied to each fully reduced shard before it is sent back to
/// the devices (TF's `un_op`), e.g. `&|t: &Tensor| t.divided_by(n)`, dividing by the
/// participant count to turn a sum into a mean.
pub type UnaryOp<'a> = &'a dyn Fn(&Tensor) -> Result<Tensor, CollectiveError>;

/// Refuses `Mean` as a combining step: averaging pairwise partial results is not a mean of the
/// inputs, so callers ask for `Sum` and divide with a [`UnaryOp`].
fn check_red_op(red_op: ReduceOp) -> Result<(), CollectiveError> {
    if red_op == ReduceOp::Mean {
        return Err(CollectiveError::InvalidArgument(
            "an all-reduce algorithm combines with Sum, Min or Max; for a mean, combine with \
             Sum and pass a unary op that divides by the number of participants"
                .into(),
        ));
    }
    Ok(())
}

/// Combines `inputs` element-wise in their order, placing the result on `device`.
fn combine(red_op: ReduceOp, inputs: &[&Tensor], device: &str) -> Result<Tensor, CollectiveError> {
    reduce_tensors(red_op, inputs, device, inputs.len())
}

/// Applies `un_op` when there is one; the result stays on `tensor`'s device.
fn apply_unary(un_op: Option<UnaryOp<'_>>, tensor: Tensor) -> Result<Tensor, CollectiveError> {
    match un_op {
        Some(op) => Ok(op(&tensor)?.to_device(tensor.device())),
        None => Ok(tensor),
    }
}
