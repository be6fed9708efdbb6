//! Reductions and broadcasts made in cross-replica context, where one thread holds every
//! replica's value: the bodies every backend's [`CrossDeviceOps`](crate::CrossDeviceOps) methods
//! share — reduce on one device and deliver a copy to each destination, fuse a batch into
//! buckets — and TF's `simple_broadcast` and `reduce_non_distributed_value`.

use distribute_values::{Leaf, Mirrored, ReduceOp};

use crate::{CollectiveError, Destinations, FusionPlan};
use distribute_device_spec::{DeviceKind, DeviceSpec};
use distribute_tensor::{AnyTensor, IndexedSlices, Placement, Tensor, kernel};

/// One copy per destination device: the plain copy for one device, else a `Mirrored` in
/// destination order (TF's `simple_broadcast`). Host copies share the buffer.
pub(crate) fn simple_broadcast(
    tensor: &Tensor,
    destinations: &Destinations,
) -> Result<Leaf<Tensor>, CollectiveError> {
    deliver(destinations, |device| Ok(tensor.copy_to(device)?))
}

/// One copy per destination (see [`Tensor::copy_to`]: host values share their buffer, GPU values
/// are copied to each destination GPU).
pub fn deliver<T>(
    destinations: &Destinations,
    copy: impl Fn(&str) -> Result<T, CollectiveError>,
) -> Result<Leaf<T>, CollectiveError> {
    let copies: Vec<T> = destinations
        .as_slice()
        .iter()
        .map(|d| copy(d))
        .collect::<Result<_, _>>()?;
    if copies.len() == 1 {
        return Ok(Leaf::Same(copies.into_iter().next().expect("one copy")));
    }
    Ok(Leaf::Mirrored(Mirrored::new(
        destinations.map().clone(),
        copies,
    )?))
}

/// The reduction of `values` placed on `device`, on the calling thread: dense values element-wise,
/// sparse values by concatenation (MEAN then divides the slices' values).
fn reduce_on(
    op: ReduceOp,
    values: &[AnyTensor],
    device: &str,
) -> Result<AnyTensor, CollectiveError> {
    if values.is_empty() {
        return Err(CollectiveError::InvalidArgument(
            "cannot reduce an empty list of per-replica values".into(),
        ));
    }
    let n = values.len();
    if values.iter().all(|v| !v.is_sparse()) {
        let dense: Vec<&Tensor> = values
            .iter()
            .map(|v| match v {
                AnyTensor::Dense(t) => t,
                AnyTensor::Sparse(_) => unreachable!("all dense"),
            })
            .collect();
        return Ok(AnyTensor::Dense(kernel::reduce_tensors(
            op, &dense, device, n,
        )?));
    }
    let sparse: Vec<IndexedSlices> = values
        .iter()
        .map(|v| match v {
            AnyTensor::Sparse(s) => Ok(s.clone()),
            AnyTensor::Dense(_) => Err(CollectiveError::InvalidArgument(
                "cannot reduce dense and sparse (IndexedSlices) values together: densify the \
                 sparse ones or keep them apart"
                    .into(),
            )),
        })
        .collect::<Result<_, _>>()?;
    let summed = IndexedSlices::concat(device, &sparse)?;
    match op {
        ReduceOp::Sum => Ok(AnyTensor::Sparse(summed)),
        ReduceOp::Mean => {
            let values = kernel::divide(summed.values(), n)?;
            Ok(AnyTensor::Sparse(IndexedSlices::new(
                values,
                summed.indices().to_vec(),
                summed.dense_shape().to_vec(),
            )?))
        }
        ReduceOp::Min | ReduceOp::Max => Err(CollectiveError::InvalidArgument(format!(
            "{op} is not defined for sparse (IndexedSlices) values, which reduce by \
             concatenation; use SUM or MEAN"
        ))),
    }
}

/// The cross-replica `reduce` of every backend: reduces `values` on `reduce_device` (the first
/// destination when `None`) and delivers a copy to every destination (a value already alone on
/// its one destination is returned as it is).
pub fn reduce_and_deliver(
    op: ReduceOp,
    values: &[AnyTensor],
    destinations: &Destinations,
    reduce_device: Option<&str>,
) -> Result<Leaf<AnyTensor>, CollectiveError> {
    if let Some(result) =
        single_value_in_place(values, destinations).filter(|_| !is_integer_mean_of(op, values))
    {
        return Ok(result);
    }
    let device = reduce_device.unwrap_or(&destinations.as_slice()[0]);
    let device = reduce_device_for_placement(values, destinations, device);
    let reduced = reduce_on(op, values, device)?;
    deliver(destinations, |device| Ok(reduced.copy_to(device)?))
}

/// Where a reduction of `values` runs: `device`, except that GPU values bound for a GPU
/// destination reduce on that GPU even when `device` is a CPU, so every GPU destination gets a
/// GPU copy (host results are never uploaded implicitly).
fn reduce_device_for_placement<'a>(
    values: &[AnyTensor],
    destinations: &'a Destinations,
    device: &'a str,
) -> &'a str {
    let on_gpu = values.iter().any(|v| match v {
        AnyTensor::Dense(t) => t.placement() != Placement::Host,
        AnyTensor::Sparse(_) => false,
    });
    let names_gpu = |d: &str| {
        d.parse::<DeviceSpec>()
            .is_ok_and(|spec| spec.device_kind() == Some(DeviceKind::Gpu))
    };
    if on_gpu
        && !names_gpu(device)
        && let Some(gpu_destination) = destinations.as_slice().iter().find(|d| names_gpu(d))
    {
        return gpu_destination;
    }
    device
}

/// [`CrossDeviceOps::batch_reduce`](crate::CrossDeviceOps::batch_reduce) with fusion: pairs whose values are all dense, on the same
/// devices and bound for the same destinations are packed per replica into buckets of
/// `bytes_per_pack` bytes, reduced bucket by bucket and cut apart again. Element-wise reduction
/// makes the results bitwise equal to reducing the pairs one by one; other pairs are reduced
/// one by one.
pub(crate) fn fused_batch_reduce(
    op: ReduceOp,
    pairs: &[(&[AnyTensor], &Destinations)],
    bytes_per_pack: usize,
    reduce_one: impl Fn(&[AnyTensor], &Destinations) -> Result<Leaf<AnyTensor>, CollectiveError>,
) -> Result<Vec<Leaf<AnyTensor>>, CollectiveError> {
    let mut results: Vec<Option<Leaf<AnyTensor>>> = vec![None; pairs.len()];
    // Groups of fusable pairs, keyed by their value devices and destinations.
    let mut groups: Vec<(Vec<&str>, &Destinations, Vec<usize>)> = Vec::new();
    for (i, (values, destinations)) in pairs.iter().enumerate() {
        // Packing works on host memory; GPU values are reduced one by one, on their GPU.
        let fusable = values.len() > 1
            && values.iter().all(|v| match v {
                AnyTensor::Dense(t) => t.placement() == Placement::Host,
                AnyTensor::Sparse(_) => false,
            });
        if !fusable {
            results[i] = Some(reduce_one(values, destinations)?);
            continue;
        }
        let devices: Vec<&str> = values.iter().map(AnyTensor::device).collect();
        match groups
            .iter_mut()
            .find(|(d, dest, _)| *d == devices && *dest == *destinations)
        {
            Some((_, _, members)) => members.push(i),
            None => groups.push((devices, destinations, vec![i])),
        }
    }
    for (devices, destinations, members) in groups {
        let replica_tensors = |r: usize| -> Vec<Tensor> {
            members
                .iter()
                .map(|&i| match &pairs[i].0[r] {
                    AnyTensor::Dense(t) => t.clone(),
                    AnyTensor::Sparse(_) => unreachable!("fusable pairs are dense"),
                })
                .collect()
        };
        let first = replica_tensors(0);
        let plan = FusionPlan::new(&first, bytes_per_pack);
        let packed = (0..devices.len())
            .map(|r| plan.pack(&replica_tensors(r)))
            .collect::<Result<Vec<_>, _>>()?;
        let buckets = (0..plan.num_buckets())
            .map(|b| {
                let values: Vec<AnyTensor> = packed
                    .iter()
                    .map(|p| AnyTensor::Dense(p[b].clone()))
                    .collect();
                match reduce_on(op, &values, &destinations.as_slice()[0])? {
                    AnyTensor::Dense(t) => Ok(t),
                    AnyTensor::Sparse(_) => unreachable!("dense in, dense out"),
                }
            })
            .collect::<Result<Vec<_>, CollectiveError>>()?;
        for (i, reduced) in members.into_iter().zip(plan.unpack_reduced(op, &buckets)?) {
            let reduced = AnyTensor::Dense(reduced);
            results[i] = Some(deliver(
                destinations,
                |device| Ok(reduced.copy_to(device)?),
            )?);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every pair reduced"))
        .collect())
}

/// Whether reducing `values` with `op` is an integer `Mean`, which changes the dtype (float64) even
/// for one value, so the one-value shortcut does not apply.
fn is_integer_mean_of(op: ReduceOp, values: &[AnyTensor]) -> bool {
    values
        .first()
        .is_some_and(|v| kernel::is_integer_mean(op, v.dtype()))
}

/// TF's shortcut: one value already on the one destination is returned as it is, and no
/// reduction runs (MEAN of one value is that value).
fn single_value_in_place(
    values: &[AnyTensor],
    destinations: &Destinations,
) -> Option<Leaf<AnyTensor>> {
    match values {
        // Same device, so the copy only relabels: it cannot fail.
        [only] if destinations.len() == 1 && destinations.matches(values) => only
            .copy_to(&destinations.as_slice()[0])
            .ok()
            .map(Leaf::Same),
        _ => None,
    }
}

/// TF's `reduce_non_distributed_value`: reduce a value that is the same on every replica (not a
/// per-replica value) and deliver it to `destinations`.
///
/// MEAN gives the value itself; SUM is only defined for one replica (it would multiply the value
/// by the replica count, which is almost always a bug), except for zeros, which sum to zeros.
///
/// ```
/// use distribute_collectives::{Destinations, reduce_non_distributed_value};
/// use distribute_tensor::Tensor;
/// use distribute_values::ReduceOp;
///
/// let five = Tensor::scalar("/cpu:0", 5.0f32);
/// let dest = Destinations::device("/cpu:0")?;
/// assert!(reduce_non_distributed_value(ReduceOp::Sum, &five, &dest, 2).is_err());
/// assert!(reduce_non_distributed_value(ReduceOp::Mean, &five, &dest, 2).is_ok());
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
pub fn reduce_non_distributed_value(
    op: ReduceOp,
    value: &Tensor,
    destinations: &Destinations,
    num_replicas: usize,
) -> Result<Leaf<Tensor>, CollectiveError> {
    let is_zero = {
        let zeros = Tensor::zeros(value.device(), value.dtype(), value.shape())?;
        zeros == *value
    };
    if op == ReduceOp::Sum && num_replicas > 1 && !is_zero {
        return Err(CollectiveError::InvalidArgument(format!(
            "a non-DistributedValues value {value} cannot be reduced with ReduceOp.SUM across \
             {num_replicas} replicas: the sum would be {num_replicas} times the value; reduce a \
             per-replica value, or use MEAN"
        )));
    }
    simple_broadcast(value, destinations)
}
