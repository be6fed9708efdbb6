//! The one place that chooses a strategy's cross-device ops from (local devices, workers):
//! [`OpsPlan::for_devices`] says which; the strategy builds them (`distribute-mirrored`'s
//! `choose_the_best` the ones of one process, `distribute-multi-worker` a job's).
//!
//! | workers | local devices | ops |
//! |---|---|---|
//! | 1 | every device a CPU | `SharedMemoryAllReduce` |
//! | 1 | two or more GPUs, nothing else | `NcclAllReduce` (`distribute-nccl`: feature `nccl`, NCCL loadable), else `ReductionToOneDevice` |
//! | 1 | anything else (one GPU, GPUs and CPUs) | `ReductionToOneDevice` |
//! | 2+ | every device a GPU | NCCL across every worker's GPUs (feature `nccl`), else MPI's all-reduce through the host |
//! | 2+ | anything else | MPI's hierarchical all-reduce (`distribute-mpi`) |
//!
//! TensorFlow infers `ReductionToOneDevice` for one CPU worker; the shared-memory all-reduce gives
//! the same bits in parallel, so it is chosen here.

use distribute_device_spec::{DeviceKind, LocalDevices};

/// Which cross-device ops a strategy's replicas get, from its local devices and the number of
/// workers (see the module's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsPlan {
    /// One worker, every device a CPU: the in-process all-reduce in shared memory.
    SharedMemoryAllReduce,
    /// One worker with two or more GPUs and nothing else: NCCL among them (falls back to
    /// [`OpsPlan::ReductionToOneDevice`] where NCCL cannot be had, saying why).
    NcclAllReduce,
    /// One worker otherwise: reduce on one device and copy to the others.
    ReductionToOneDevice,
    /// Several workers, every device a GPU: NCCL across every worker's GPUs (falls back to
    /// [`OpsPlan::MpiAllReduce`] without the `nccl` feature).
    NcclAcrossWorkers,
    /// Several workers otherwise: MPI's hierarchical all-reduce (local shared memory, then
    /// across the workers).
    MpiAllReduce,
}

impl OpsPlan {
    /// The plan for `devices` (this worker's) in a job of `workers` workers.
    ///
    /// ```
    /// use distribute_collectives::OpsPlan;
    /// use distribute_device_spec::LocalDevices;
    ///
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::cpus(2), 1), OpsPlan::SharedMemoryAllReduce);
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::gpus(2), 1), OpsPlan::NcclAllReduce);
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::cpus(1), 3), OpsPlan::MpiAllReduce);
    /// assert_eq!(OpsPlan::for_devices(&LocalDevices::gpus(1), 2), OpsPlan::NcclAcrossWorkers);
    /// ```
    pub fn for_devices(devices: &LocalDevices, workers: usize) -> OpsPlan {
        let all = |kind: DeviceKind| devices.iter().all(|d| *d.kind() == kind);
        match (workers > 1, all(DeviceKind::Cpu), all(DeviceKind::Gpu)) {
            (false, true, _) => OpsPlan::SharedMemoryAllReduce,
            (false, _, true) if devices.len() >= 2 => OpsPlan::NcclAllReduce,
            (false, ..) => OpsPlan::ReductionToOneDevice,
            (true, _, true) => OpsPlan::NcclAcrossWorkers,
            (true, ..) => OpsPlan::MpiAllReduce,
        }
    }
}
