//! Hierarchical copy all-reduce for a DGX-1-like machine (TF's
//! `aggregate_gradients_using_hierarchical_copy`, COL-42).
//!
//! The devices form two equal groups, `[0, n/2)` and `[n/2, n)`, linked fully within a group.
//! Tensor `i` is summed within each group at that group's root (group 0's root is `i mod n`,
//! group 1's is `n/2` further on), the two partial sums are added at group 0's root, and the
//! total is copied to group 1's root and from each root to its group's members. Rotating the
//! root with `i` spreads the work over all devices.

use distribute_values::ReduceOp;

use super::combine;
use crate::{CollectiveError, Tensor};

/// Sums each tensor position across devices by hierarchical copy.
///
/// `replica_grads[d]` holds device `d`'s tensors (the same count and shapes on every device);
/// the result has the same layout, every tensor equal to the full sum and placed on its device.
/// Fails unless there is an even number (≥ 2) of devices, the two-group topology it assumes,
/// and one tensor list per device.
pub fn hierarchical_copy_all_reduce<S: AsRef<str>>(
    devices: &[S],
    replica_grads: &[Vec<Tensor>],
) -> Result<Vec<Vec<Tensor>>, CollectiveError> {
    let n = devices.len();
    if n < 2 || !n.is_multiple_of(2) {
        return Err(CollectiveError::InvalidArgument(format!(
            "hierarchical copy assumes two equal groups of devices (a DGX-1): needs an even \
             number of at least 2 devices, got {n}"
        )));
    }
    if replica_grads.len() != n {
        return Err(CollectiveError::InvalidArgument(format!(
            "hierarchical copy needs one tensor list per device: {n} devices, {} lists",
            replica_grads.len()
        )));
    }
    let count = replica_grads[0].len();
    if let Some(bad) = replica_grads.iter().position(|g| g.len() != count) {
        return Err(CollectiveError::InvalidArgument(format!(
            "device 0 has {count} tensors but device {bad} has {}; every device must pass the \
             same tensors",
            replica_grads[bad].len()
        )));
    }
    let device = |d: usize| devices[d].as_ref();
    let group_size = n / 2;
    let mut out: Vec<Vec<Tensor>> = vec![Vec::with_capacity(count); n];
    // Tensor i of every device, device-major as TF's `zip(*replica_grads)`.
    let columns: Vec<Vec<&Tensor>> = (0..count)
        .map(|i| replica_grads.iter().map(|g| &g[i]).collect())
        .collect();
    for (i, column) in columns.iter().enumerate() {
        let root0 = i % n;
        let root1 = (root0 + group_size) % n;
        let (begin0, begin1) = if root0 < group_size {
            (0, group_size)
        } else {
            (group_size, 0)
        };
        let group_sum = |begin: usize, root: usize| {
            combine(
                ReduceOp::Sum,
                &column[begin..begin + group_size],
                device(root),
            )
        };
        let sum0 = group_sum(begin0, root0)?;
        let sum1 = group_sum(begin1, root1)?;
        let total = combine(ReduceOp::Sum, &[&sum0, &sum1], device(root0))?;
        let at_root1 = total.to_device(device(root1));
        for (d, slot) in out.iter_mut().enumerate() {
            let source = if (root0 < group_size) == (d < group_size) {
                &total
            } else {
                &at_root1
            };
            slot.push(source.to_device(device(d)));
        }
    }
    Ok(out)
}
