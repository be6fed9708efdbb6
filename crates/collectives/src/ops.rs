//! [`CrossDeviceOps`]: how values move between devices — reductions and broadcasts made in
//! cross-replica context (one thread holds every replica's value), and the per-replica
//! collectives ([`ReplicaCollectives`]) that replica threads call.
//!
//! Backends: [`ReductionToOneDevice`] (reduce on one device, copy to the destinations) and
//! [`SharedMemoryAllReduce`] (every replica thread reduces a slice in parallel). Both reduce in
//! replica order, so they give the same bits. [`choose_the_best`] picks one for a device list.

use std::fmt;
use std::sync::Arc;

use distribute_device_spec::{DeviceKind, LocalDevice, LocalDevices, canonicalize};
use distribute_values::{Leaf, Mirrored, ReduceOp, ReplicaDeviceMap};

use crate::group::{CollectiveGroup, GroupConfig, Member, ReducePlan};
use crate::{AnyTensor, CollectiveError, FusionPlan, IndexedSlices, Tensor, kernel};

/// The devices a reduction or broadcast delivers to: one or more distinct devices, by their
/// canonical names.
///
/// TF also takes a tensor, a variable or a distributed value as destinations; here those are
/// [`Destinations::of_value`] and [`Destinations::of_map`].
///
/// ```
/// use distribute_collectives::Destinations;
///
/// let d = Destinations::devices(["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1"])?;
/// assert_eq!(
///     d.as_slice(),
///     ["/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:1"]
/// );
/// assert!(Destinations::device("").is_err());
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destinations {
    devices: Vec<String>,
    /// The same devices as a map, shared by the `Mirrored` results.
    map: Arc<ReplicaDeviceMap>,
}

impl Destinations {
    /// One device.
    pub fn device(device: &str) -> Result<Destinations, CollectiveError> {
        Destinations::devices([device])
    }

    /// Several devices, in order. Empty lists, empty or malformed names and repeated devices are
    /// refused.
    pub fn devices<S: AsRef<str>>(
        devices: impl IntoIterator<Item = S>,
    ) -> Result<Destinations, CollectiveError> {
        let devices = devices
            .into_iter()
            .map(|d| canonical_device(d.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if devices.is_empty() {
            return Err(CollectiveError::InvalidArgument(
                "destinations can not be empty: name at least one device".into(),
            ));
        }
        Ok(Destinations {
            map: Arc::new(ReplicaDeviceMap::new(devices.iter().cloned())?),
            devices,
        })
    }

    /// The device a value is placed on (TF passes a tensor as its own destination).
    pub fn of_value(value: &AnyTensor) -> Result<Destinations, CollectiveError> {
        Destinations::device(value.device())
    }

    /// The primary devices of a distributed value's replicas.
    pub fn of_map(map: &ReplicaDeviceMap) -> Result<Destinations, CollectiveError> {
        Destinations::devices(map.primary_devices())
    }

    /// The canonical device names.
    pub fn as_slice(&self) -> &[String] {
        &self.devices
    }

    /// The number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Never true: destinations are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// True when `values` live on exactly these devices, in any order (TF's device matching).
    pub fn matches(&self, values: &[AnyTensor]) -> bool {
        let mut mine: Vec<&str> = self.as_slice().iter().map(String::as_str).collect();
        let Ok(mut theirs) = values
            .iter()
            .map(|v| canonical_device(v.device()))
            .collect::<Result<Vec<_>, _>>()
        else {
            return false;
        };
        mine.sort_unstable();
        theirs.sort_unstable();
        mine.len() == theirs.len() && mine.iter().zip(&theirs).all(|(a, b)| a == b)
    }
}

/// The canonical name of `device`; the empty name is refused (TF's `check_destinations`).
fn canonical_device(device: &str) -> Result<String, CollectiveError> {
    if device.is_empty() {
        return Err(CollectiveError::InvalidArgument(
            "a destination device can not be empty: place the value on a device".into(),
        ));
    }
    Ok(canonicalize(device, None)?)
}

/// Collective calls made from inside a replica's thread: every replica calls the same methods in
/// the same order, and each call returns when all replicas have made it.
///
/// Not `Send`: a handle may own per-thread resources (an NCCL communicator), so it is created on
/// the replica's thread and stays there.
pub trait ReplicaCollectives: fmt::Debug {
    /// This handle's replica id.
    fn replica(&self) -> usize;
    /// The element-wise reduction of every replica's tensor.
    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError>;
    /// Several all-reduces in one rendezvous.
    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError>;
    /// Every replica's tensor concatenated along the first axis, in replica order.
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError>;
    /// This replica's equal share of the rows of the reduction.
    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError>;
    /// Replica `root`'s tensor on every replica.
    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError>;
}

impl ReplicaCollectives for Member {
    fn replica(&self) -> usize {
        Member::replica(self)
    }
    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::all_reduce(self, op, tensor)
    }
    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        Member::batch_all_reduce(self, op, tensors)
    }
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::all_gather(self, tensor)
    }
    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::reduce_scatter(self, op, tensor)
    }
    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError> {
        Member::broadcast(self, root, tensor)
    }
}

/// How values move between the devices of a strategy (TF's `CrossDeviceOps`).
///
/// `reduce`, `batch_reduce` and `broadcast` run in cross-replica context with every replica's
/// value in hand; [`CrossDeviceOps::replica_collectives`] gives each replica thread its handle for
/// collective calls.
pub trait CrossDeviceOps: Send + Sync + fmt::Debug {
    /// The backend's name, e.g. `ReductionToOneDevice`.
    fn name(&self) -> &'static str;

    /// Reduces one value per replica and delivers the result to `destinations`: the plain value
    /// for one destination device, else a `Mirrored` of copies in destination order.
    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError>;

    /// Several reductions; result `i` equals `reduce(op, pairs[i].0, pairs[i].1)`.
    fn batch_reduce(
        &self,
        op: ReduceOp,
        pairs: &[(&[AnyTensor], &Destinations)],
    ) -> Result<Vec<Leaf<AnyTensor>>, CollectiveError> {
        pairs
            .iter()
            .map(|(values, destinations)| self.reduce(op, values, destinations))
            .collect()
    }

    /// A copy of `tensor` on every destination device.
    fn broadcast(
        &self,
        tensor: &Tensor,
        destinations: &Destinations,
    ) -> Result<Leaf<Tensor>, CollectiveError> {
        simple_broadcast(tensor, destinations)
    }

    /// Replica `replica`'s handle for collective calls; call it on the replica's own thread (an
    /// NCCL communicator must stay on the thread that uses it).
    fn replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError>;

    /// Fails every pending and future replica collective until [`CrossDeviceOps::reset`] (used
    /// when a replica fails).
    fn abort(&self, reason: &str);

    /// Makes the replica collectives usable again after an abort.
    fn reset(&self);

    /// How many replicas the replica collectives are built for, when the backend has a fixed
    /// count (a strategy checks it against its devices).
    fn num_replicas(&self) -> Option<usize> {
        None
    }

    /// Called before the replicas start a step (a strategy's `run`).
    fn begin_step(&self) {}

    /// Called when `replica` has finished its step: collectives it will never join fail at once
    /// instead of waiting for the deadline.
    fn replica_finished(&self, replica: usize) {
        let _ = replica;
    }
}

/// One copy per destination device: the plain copy for one device, else a `Mirrored` in
/// destination order (TF's `simple_broadcast`). Host copies share the buffer.
pub fn simple_broadcast(
    tensor: &Tensor,
    destinations: &Destinations,
) -> Result<Leaf<Tensor>, CollectiveError> {
    deliver(destinations, |device| tensor.copy_to(device))
}

/// One copy per destination (see [`Tensor::copy_to`]: host values share their buffer, GPU values
/// are copied to each destination GPU).
fn deliver<T>(
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
        destinations.map.clone(),
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

/// Reduces `values` on `device` and delivers a copy to every destination (a value already alone
/// on its one destination is returned as it is).
pub(crate) fn reduce_and_deliver(
    op: ReduceOp,
    values: &[AnyTensor],
    destinations: &Destinations,
    device: &str,
) -> Result<Leaf<AnyTensor>, CollectiveError> {
    if let Some(result) = single_value_in_place(values, destinations) {
        return Ok(result);
    }
    let device = reduce_device_for_placement(values, destinations, device);
    let reduced = reduce_on(op, values, device)?;
    deliver(destinations, |device| reduced.copy_to(device))
}

/// Where a reduction of `values` runs: `device`, except that GPU values bound for a GPU
/// destination reduce on that GPU even when `device` is a CPU, so every GPU destination gets a
/// GPU copy (host results are never uploaded implicitly).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn reduce_device_for_placement<'a>(
    values: &[AnyTensor],
    destinations: &'a Destinations,
    device: &'a str,
) -> &'a str {
    #[cfg(feature = "cuda")]
    {
        let on_gpu = values.iter().any(|v| match v {
            AnyTensor::Dense(t) => t.placement() != crate::Placement::Host,
            AnyTensor::Sparse(_) => false,
        });
        let names_gpu = |d: &str| matches!(crate::cuda::Gpu::index_of(d), Ok(Some(_)));
        if on_gpu
            && !names_gpu(device)
            && let Some(gpu_destination) = destinations.as_slice().iter().find(|d| names_gpu(d))
        {
            return gpu_destination;
        }
    }
    device
}

/// [`CrossDeviceOps::batch_reduce`] with fusion: pairs whose values are all dense, on the same
/// devices and bound for the same destinations are packed per replica into buckets of
/// `bytes_per_pack` bytes, reduced bucket by bucket and cut apart again. Element-wise reduction
/// makes the results bitwise equal to reducing the pairs one by one; other pairs are reduced
/// one by one.
fn fused_batch_reduce(
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
                AnyTensor::Dense(t) => t.placement() == crate::Placement::Host,
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
        for (i, reduced) in members.into_iter().zip(plan.unpack(&buckets)?) {
            let reduced = AnyTensor::Dense(reduced);
            results[i] = Some(deliver(destinations, |device| reduced.copy_to(device))?);
        }
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every pair reduced"))
        .collect())
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

/// The [`CrossDeviceOps`] methods of a backend whose replica collectives meet in its
/// `group: CollectiveGroup`: fused batches, per-replica handles, abort/reset and the step hooks.
macro_rules! group_backed_methods {
    () => {
        fn batch_reduce(
            &self,
            op: ReduceOp,
            pairs: &[(&[AnyTensor], &Destinations)],
        ) -> Result<Vec<Leaf<AnyTensor>>, CollectiveError> {
            let bytes = self.group.config().bytes_per_pack;
            fused_batch_reduce(op, pairs, bytes, |values, destinations| {
                self.reduce(op, values, destinations)
            })
        }

        fn replica_collectives(
            &self,
            replica: usize,
        ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError> {
            Ok(Box::new(self.group.member(replica)?))
        }

        fn abort(&self, reason: &str) {
            self.group.abort(reason);
        }

        fn reset(&self) {
            self.group.reset();
        }

        fn num_replicas(&self) -> Option<usize> {
            Some(self.group.num_replicas())
        }

        fn begin_step(&self) {
            self.group.rendezvous().begin_step();
        }

        fn replica_finished(&self, replica: usize) {
            self.group.rendezvous().finish(replica);
        }
    };
}

/// Reduces on one device (the configured one, else the first destination), then copies the
/// result to every destination. TF's default for devices without NCCL.
#[derive(Debug)]
pub struct ReductionToOneDevice {
    reduce_device: Option<String>,
    group: CollectiveGroup,
}

impl ReductionToOneDevice {
    /// A backend for `num_replicas` replica threads, reducing on the first destination device.
    pub fn new(num_replicas: usize, config: GroupConfig) -> Result<Self, CollectiveError> {
        let config = GroupConfig {
            plan: ReducePlan::OneReducer,
            ..config
        };
        Ok(ReductionToOneDevice {
            reduce_device: None,
            group: CollectiveGroup::new(num_replicas, config)?,
        })
    }

    /// Always reduces on `device`.
    pub fn with_reduce_device(mut self, device: &str) -> Result<Self, CollectiveError> {
        self.reduce_device = Some(canonical_device(device)?);
        Ok(self)
    }

    /// The device reductions of `values` to `destinations` run on: the configured one, else the
    /// first destination, else the first value's.
    pub fn reduce_device_for<'a>(
        &'a self,
        values: &'a [AnyTensor],
        destinations: &'a Destinations,
    ) -> &'a str {
        self.reduce_device
            .as_deref()
            .or(destinations.as_slice().first().map(String::as_str))
            .or(values.first().map(AnyTensor::device))
            .unwrap_or_default()
    }
}

impl CrossDeviceOps for ReductionToOneDevice {
    fn name(&self) -> &'static str {
        "ReductionToOneDevice"
    }

    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        reduce_and_deliver(
            op,
            values,
            destinations,
            self.reduce_device_for(values, destinations),
        )
    }

    group_backed_methods!();
}

/// The in-process shared-memory all-reduce: for large tensors every replica thread reduces one
/// slice of all inputs in parallel and all replicas share the result buffer; small tensors are
/// reduced by the last replica to arrive. Falls back to [`ReductionToOneDevice`]'s path when the
/// values' devices differ from the destinations or values are sparse, as TF's
/// `AllReduceCrossDeviceOps` does.
#[derive(Debug)]
pub struct SharedMemoryAllReduce {
    group: CollectiveGroup,
}

impl SharedMemoryAllReduce {
    /// A backend for `num_replicas` replica threads.
    pub fn new(num_replicas: usize, config: GroupConfig) -> Result<Self, CollectiveError> {
        Ok(SharedMemoryAllReduce {
            group: CollectiveGroup::new(num_replicas, config)?,
        })
    }

    /// The group replica threads meet in.
    pub fn group(&self) -> &CollectiveGroup {
        &self.group
    }
}

impl CrossDeviceOps for SharedMemoryAllReduce {
    fn name(&self) -> &'static str {
        "SharedMemoryAllReduce"
    }

    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        // In cross-replica context one thread holds every value, so the reduction runs here, in
        // the same order as the replicas' all-reduce: both give the same bits.
        reduce_and_deliver(op, values, destinations, &destinations.as_slice()[0])
    }

    group_backed_methods!();
}

/// The backend for a strategy's devices, and why it was chosen (also logged at info level).
///
/// All local CPUs → [`SharedMemoryAllReduce`]. Two or more GPUs, with feature `nccl` and NCCL
/// loadable → `NcclAllReduce`. Anything else → [`ReductionToOneDevice`], and the reason says why
/// NCCL was not used (feature off, one GPU, NCCL missing, NCCL refusing the devices). Devices of
/// other workers need a multi-process backend: build `NcclAllReduce::for_cluster` yourself.
///
/// ```
/// use distribute_collectives::{choose_the_best, GroupConfig};
/// use distribute_device_spec::LocalDevices;
///
/// let devices = LocalDevices::new(["/cpu:0", "/cpu:1"])?;
/// let (ops, why) = choose_the_best(&devices, GroupConfig::default())?;
/// assert_eq!(ops.name(), "SharedMemoryAllReduce");
/// assert!(why.contains("CPUs of this process"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn choose_the_best(
    devices: &LocalDevices,
    config: GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), CollectiveError> {
    if devices.is_remote() {
        return Err(CollectiveError::Unimplemented(format!(
            "device '{}' belongs to another worker; cross-process collectives (MPI or NCCL \
             across hosts) are not part of this build",
            devices[0]
        )));
    }
    let n = devices.len();
    let not_cpu = devices.iter().find(|d| *d.kind() != DeviceKind::Cpu);
    let (ops, reason): (Arc<dyn CrossDeviceOps>, String) = match not_cpu {
        None => (
            Arc::new(SharedMemoryAllReduce::new(n, config)?),
            format!(
                "SharedMemoryAllReduce: all {n} devices are CPUs of this process, so replicas \
                 reduce in shared memory, each a slice in parallel"
            ),
        ),
        Some(other) => {
            let other = other.kind();
            let gpus: Option<Vec<usize>> = devices.iter().map(LocalDevice::gpu_index).collect();
            match nccl_backend(gpus.as_deref(), &config) {
                Ok((ops, why)) => (ops, why),
                Err(why_not) => (
                    Arc::new(ReductionToOneDevice::new(n, config)?),
                    format!(
                        "ReductionToOneDevice: the devices include {other} and {why_not}; values \
                         are reduced on one device"
                    ),
                ),
            }
        }
    };
    log::info!("choose_the_best: {reason}");
    Ok((ops, reason))
}

/// The NCCL backend for `gpus` (every device a GPU), or why not.
#[cfg_attr(not(feature = "nccl"), allow(unused_variables))]
fn nccl_backend(
    gpus: Option<&[usize]>,
    config: &GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), String> {
    let Some(gpus) = gpus else {
        return Err("not every device is a GPU, which NCCL needs".into());
    };
    if gpus.len() < 2 {
        return Err("there is only one GPU, so there is nothing for NCCL to do".into());
    }
    #[cfg(feature = "nccl")]
    {
        match crate::NcclAllReduce::new(gpus, config.deadline) {
            Ok(ops) => Ok((
                Arc::new(ops),
                format!(
                    "NcclAllReduce: {} GPUs of this process and NCCL loads, so replicas reduce \
                     with NCCL",
                    gpus.len()
                ),
            )),
            Err(e) => Err(format!("NCCL could not be used: {e}")),
        }
    }
    #[cfg(not(feature = "nccl"))]
    Err("this build has no NCCL backend (build distribute-collectives with feature `nccl`)".into())
}

/// TF's `reduce_non_distributed_value`: reduce a value that is the same on every replica (not a
/// per-replica value) and deliver it to `destinations`.
///
/// MEAN gives the value itself; SUM is only defined for one replica (it would multiply the value
/// by the replica count, which is almost always a bug), except for zeros, which sum to zeros.
///
/// ```
/// use distribute_collectives::{reduce_non_distributed_value, Destinations, Tensor};
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
        let zeros = Tensor::zeros(value.device(), value.dtype(), value.shape());
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
