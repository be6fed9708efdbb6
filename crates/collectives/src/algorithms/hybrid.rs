//! Two-level all-reduces (COL-54..COL-56): reduce within each task first (NCCL all-sum, or a
//! shuffle gather onto one device per task), run an upper-level algorithm across tasks on one
//! value per task, then spread each task's result back to its devices.
//!
//! Inputs are flattened first and every output gets the input shape back, whatever the levels
//! do in between.

use distribute_device_spec::DeviceSpec;
use distribute_values::ReduceOp;

use super::nccl::nccl_all_reduce;
use super::recursive_hd::recursive_hd_all_reduce;
use super::ring::ring_all_reduce;
use super::shape::{flatten_tensors, restore_shape};
use super::shuffle::{shuffle_all_reduce, shuffle_gather, shuffle_scatter};
use super::{UnaryOp, apply_unary, check_red_op};
use crate::{CollectiveError, Tensor};

/// Devices and values grouped by task, in the order each task is first seen.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskGroups<T> {
    /// The devices of each task.
    pub devices: Vec<Vec<String>>,
    /// The values of each task, parallel to `devices`.
    pub values: Vec<Vec<T>>,
    /// The position of each value in the input list, parallel to `values`: where a result
    /// computed for that value goes back to.
    pub indices: Vec<Vec<usize>>,
}

/// Groups `values` (one per device) by the task of their device (TF's `_split_by_task`).
///
/// A task is keyed by (job, defaulting to `localhost`; replica, defaulting to 0; task). Fails
/// when the counts differ (`InvalidArgument`) and when a device names no task or does not parse
/// (`Invariant`, as TF asserts).
pub fn split_by_task<S: AsRef<str>, T: Clone>(
    devices: &[S],
    values: &[T],
) -> Result<TaskGroups<T>, CollectiveError> {
    if devices.len() != values.len() {
        return Err(CollectiveError::InvalidArgument(format!(
            "split_by_task needs one value per device: {} devices, {} values",
            devices.len(),
            values.len()
        )));
    }
    let mut keys: Vec<(String, u32, u32)> = Vec::new();
    let mut groups = TaskGroups {
        devices: Vec::new(),
        values: Vec::new(),
        indices: Vec::new(),
    };
    for (position, (device, value)) in devices.iter().zip(values).enumerate() {
        let device = device.as_ref();
        let spec: DeviceSpec = device.parse().map_err(|e| {
            CollectiveError::Invariant(format!("failed to parse device '{device}': {e}"))
        })?;
        let task = spec.task().ok_or_else(|| {
            CollectiveError::Invariant(format!(
                "device '{device}' names no task; hybrid all-reduces need /task:N on every device"
            ))
        })?;
        let key = (
            spec.job().unwrap_or("localhost").to_owned(),
            spec.replica().unwrap_or(0),
            task,
        );
        let index = match keys.iter().position(|k| *k == key) {
            Some(i) => i,
            None => {
                keys.push(key);
                groups.devices.push(Vec::new());
                groups.values.push(Vec::new());
                groups.indices.push(Vec::new());
                keys.len() - 1
            }
        };
        groups.devices[index].push(device.to_owned());
        groups.values[index].push(value.clone());
        groups.indices[index].push(position);
    }
    Ok(groups)
}

impl<T> TaskGroups<T> {
    /// Puts per-task results (parallel to `values`) back into input order.
    fn scatter<U>(&self, per_task: Vec<Vec<U>>) -> Result<Vec<U>, CollectiveError> {
        let count = self.indices.iter().map(Vec::len).sum();
        let mut slots: Vec<Option<U>> = (0..count).map(|_| None).collect();
        for (results, indices) in per_task.into_iter().zip(&self.indices) {
            if results.len() != indices.len() {
                return Err(CollectiveError::Invariant(format!(
                    "a task of {} devices got {} results back",
                    indices.len(),
                    results.len()
                )));
            }
            for (result, &i) in results.into_iter().zip(indices) {
                slots[i] = Some(result);
            }
        }
        slots
            .into_iter()
            .map(|slot| {
                slot.ok_or_else(|| {
                    CollectiveError::Invariant("a device got no result from its task".into())
                })
            })
            .collect()
    }
}

/// Runs `red_f` on more than one input; a single input is returned as it is, or with `un_op`
/// applied when there is one (TF's `_reduce_non_singleton`): an upper level over one task has
/// nothing to reduce, and ring all-reduce refuses fewer than 2 inputs.
pub fn reduce_non_singleton(
    inputs: &[Tensor],
    red_f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>, CollectiveError>,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    if inputs.len() > 1 {
        return red_f(inputs);
    }
    inputs
        .iter()
        .map(|t| apply_unary(un_op, t.clone()))
        .collect()
}

/// NCCL within each task, `upper` across the first device of each task, then a copy of each
/// task's result to its devices (TF's `_build_nccl_hybrid`). Outputs come back in input order,
/// where TF concatenates them task by task; the two agree for worker-major device lists.
fn nccl_hybrid(
    inputs: &[Tensor],
    upper: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>, CollectiveError>,
) -> Result<Vec<Tensor>, CollectiveError> {
    let (flat, shape) = flatten_tensors(inputs)?;
    let devices: Vec<&str> = flat.iter().map(Tensor::device).collect();
    let tasks = split_by_task(&devices, &flat)?;
    let up = tasks
        .values
        .iter()
        .map(|values| Ok(nccl_all_reduce(values, ReduceOp::Sum, None)?.swap_remove(0)))
        .collect::<Result<Vec<_>, CollectiveError>>()?;
    let level2 = upper(&up)?;
    let per_task = tasks
        .devices
        .iter()
        .zip(&level2)
        .map(|(devices, result)| devices.iter().map(|d| result.to_device(d)).collect())
        .collect();
    restore_shape(tasks.scatter(per_task)?, &shape)
}

/// A shuffle gather onto `gather_devices[w]` within each task `w`, `upper` across those, then a
/// shuffle scatter back to each task's devices (TF's `_build_shuffle_hybrid`), in input order.
fn shuffle_hybrid(
    inputs: &[Tensor],
    gather_devices: &[&str],
    red_op: ReduceOp,
    upper: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>, CollectiveError>,
) -> Result<Vec<Tensor>, CollectiveError> {
    let (flat, shape) = flatten_tensors(inputs)?;
    let devices: Vec<&str> = flat.iter().map(Tensor::device).collect();
    let tasks = split_by_task(&devices, &flat)?;
    if gather_devices.len() != tasks.values.len() {
        return Err(CollectiveError::InvalidArgument(format!(
            "a shuffle hybrid needs one gather device per worker: {} gather devices for {} \
             workers",
            gather_devices.len(),
            tasks.values.len()
        )));
    }
    let up = tasks
        .values
        .iter()
        .zip(gather_devices)
        .map(|(values, g)| Ok(shuffle_gather(values, &[g], red_op, None)?.swap_remove(0)))
        .collect::<Result<Vec<_>, CollectiveError>>()?;
    let level2 = upper(&up)?;
    let mut per_task = Vec::with_capacity(tasks.devices.len());
    for (devices, result) in tasks.devices.iter().zip(&level2) {
        let dst: Vec<&str> = devices.iter().map(String::as_str).collect();
        per_task.push(shuffle_scatter(std::slice::from_ref(result), &dst)?);
    }
    restore_shape(tasks.scatter(per_task)?, &shape)
}

/// NCCL all-sum within each task, then a ring (with `subdiv` subchunks) across tasks.
pub fn nccl_then_ring(
    inputs: &[Tensor],
    subdiv: usize,
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    check_nccl_op(red_op)?;
    nccl_hybrid(inputs, |up| {
        reduce_non_singleton(
            up,
            |x| ring_all_reduce(x, x.len(), subdiv, &[0], red_op, un_op),
            un_op,
        )
    })
}

/// NCCL all-sum within each task, then recursive halving-doubling across tasks.
pub fn nccl_then_recursive_hd(
    inputs: &[Tensor],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    check_nccl_op(red_op)?;
    nccl_hybrid(inputs, |up| recursive_hd_all_reduce(up, red_op, un_op))
}

/// NCCL all-sum within each task, then a shuffle through `gather_devices` across tasks.
pub fn nccl_then_shuffle(
    inputs: &[Tensor],
    gather_devices: &[&str],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    check_nccl_op(red_op)?;
    nccl_hybrid(inputs, |up| {
        shuffle_all_reduce(up, gather_devices, red_op, un_op)
    })
}

/// A shuffle onto one gather device per task, then a ring across the gather devices.
///
/// Fails when `gather_devices` does not hold exactly one device per task.
pub fn shuffle_then_ring(
    inputs: &[Tensor],
    gather_devices: &[&str],
    subdiv: usize,
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    check_red_op(red_op)?;
    shuffle_hybrid(inputs, gather_devices, red_op, |up| {
        reduce_non_singleton(
            up,
            |x| ring_all_reduce(x, x.len(), subdiv, &[0], red_op, un_op),
            un_op,
        )
    })
}

/// A shuffle onto one gather device per task (`first_gather_devices`), then a shuffle across
/// them through `second_gather_devices`.
pub fn shuffle_then_shuffle(
    inputs: &[Tensor],
    first_gather_devices: &[&str],
    second_gather_devices: &[&str],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    check_red_op(red_op)?;
    shuffle_hybrid(inputs, first_gather_devices, red_op, |up| {
        reduce_non_singleton(
            up,
            |x| shuffle_all_reduce(x, second_gather_devices, red_op, un_op),
            un_op,
        )
    })
}

/// The NCCL level sums; the upper level must combine the same way for the result to be a sum.
fn check_nccl_op(red_op: ReduceOp) -> Result<(), CollectiveError> {
    if red_op != ReduceOp::Sum {
        return Err(CollectiveError::InvalidArgument(format!(
            "red_op {red_op:?} is not supported by the NCCL all-reduce: it only sums"
        )));
    }
    Ok(())
}
