//! Shuffle all-reduce (TF's `build_shuffle_all_reduce`, COL-46, COL-51).
//!
//! Every input is cut into one ragged shard per gather device; gather device `g` reduces shard
//! `g` of all inputs, and every destination then joins all reduced shards. With as many gather
//! devices as inputs this is a reduce-scatter followed by an all-gather.

use distribute_values::ReduceOp;

use super::shape::{flatten_tensors, join, ragged_split, restore_shape};
use super::{UnaryOp, apply_unary, check_red_op, combine};
use crate::{CollectiveError, Tensor};

/// Reduces shard `g` of every 1-D input on `gather_devices[g]` (TF's `_build_shuffle_gather`).
pub(crate) fn shuffle_gather(
    inputs: &[Tensor],
    gather_devices: &[&str],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    let shards_by_source = inputs
        .iter()
        .map(|t| ragged_split(t, gather_devices.len()))
        .collect::<Result<Vec<_>, _>>()?;
    gather_devices
        .iter()
        .enumerate()
        .map(|(g, device)| {
            let shards: Vec<&Tensor> = shards_by_source.iter().map(|s| &s[g]).collect();
            apply_unary(un_op, combine(red_op, &shards, device)?)
        })
        .collect()
}

/// Every destination device receives all reduced shards, joined (TF's `_build_shuffle_scatter`).
pub(crate) fn shuffle_scatter(
    reduced_shards: &[Tensor],
    dst_devices: &[&str],
) -> Result<Vec<Tensor>, CollectiveError> {
    dst_devices
        .iter()
        .map(|d| join(d, reduced_shards))
        .collect()
}

/// Shuffle all-reduce of one tensor per device through `gather_devices` (one shard each).
///
/// Fails on an empty input list, differing shapes, or no gather device. Outputs keep the input
/// shape and are placed on the input devices.
pub fn shuffle_all_reduce(
    inputs: &[Tensor],
    gather_devices: &[&str],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    check_red_op(red_op)?;
    if gather_devices.is_empty() {
        return Err(CollectiveError::InvalidArgument(
            "a shuffle all-reduce needs at least one gather device".into(),
        ));
    }
    let (flat, shape) = flatten_tensors(inputs)?;
    let dst: Vec<&str> = flat.iter().map(Tensor::device).collect();
    let reduced = shuffle_gather(&flat, gather_devices, red_op, un_op)?;
    restore_shape(shuffle_scatter(&reduced, &dst)?, &shape)
}
