//! Recursive halving-doubling all-reduce (TF's `build_recursive_hd_all_reduce`, COL-46,
//! COL-52).
//!
//! In hop `h` devices `d` and `d + 2^h` (with `d mod 2^(h+1) < 2^h`) swap halves of what they
//! hold, the left keeping the reduced first half and the right the reduced second half; after
//! `log2 N` hops each device holds one reduced `1/N` shard. The scatter runs the hops in reverse,
//! joining pairs back until every device holds everything.

use distribute_values::ReduceOp;

use super::shape::{flatten_tensors, join, restore_shape};
use super::{UnaryOp, apply_unary, check_red_op, combine};
use crate::flat::split_lengths;
use crate::{CollectiveError, Tensor};

/// The number of hops for `devices` devices; fails unless it is a power of 2.
fn num_hops(devices: usize) -> Result<u32, CollectiveError> {
    if !devices.is_power_of_two() {
        return Err(CollectiveError::InvalidArgument(format!(
            "recursive halving-doubling needs a power-of-2 number of devices, got {devices}"
        )));
    }
    Ok(devices.trailing_zeros())
}

/// Recursive halving-doubling all-reduce of one tensor per device.
///
/// Fails unless the device count is a power of 2, and unless each hop's shard splits into two
/// equal halves (the element count must be a multiple of the device count), as TF's even split.
pub fn recursive_hd_all_reduce(
    inputs: &[Tensor],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    check_red_op(red_op)?;
    let hops = num_hops(inputs.len())?;
    let (mut chunks, shape) = flatten_tensors(inputs)?;
    let devices: Vec<&str> = inputs.iter().map(Tensor::device).collect();
    for h in 0..hops {
        let span = 1 << h;
        let mut next = chunks.clone();
        for left in (0..devices.len()).filter(|d| d % (2 * span) < span) {
            let right = left + span;
            let halves = |t: &Tensor| {
                let len = t.num_elements();
                if !len.is_multiple_of(2) {
                    return Err(CollectiveError::InvalidArgument(format!(
                        "recursive halving-doubling: a shard of {len} elements cannot be halved; \
                         the element count must be a multiple of the device count ({})",
                        devices.len()
                    )));
                }
                split_lengths(t, &[len / 2, len / 2])
            };
            let (l, r) = (halves(&chunks[left])?, halves(&chunks[right])?);
            next[left] = combine(red_op, &[&l[0], &r[0]], devices[left])?;
            next[right] = combine(red_op, &[&l[1], &r[1]], devices[right])?;
        }
        chunks = next;
    }
    let mut chunks = chunks
        .into_iter()
        .map(|c| apply_unary(un_op, c))
        .collect::<Result<Vec<_>, _>>()?;
    for h in (0..hops).rev() {
        let span = 1 << h;
        let mut next = chunks.clone();
        for left in (0..devices.len()).filter(|d| d % (2 * span) < span) {
            let right = left + span;
            let pair = [chunks[left].clone(), chunks[right].clone()];
            next[left] = join(devices[left], &pair)?;
            next[right] = join(devices[right], &pair)?;
        }
        chunks = next;
    }
    restore_shape(chunks, &shape)
}
