//! Behaviour tests of `MirroredStrategy`, named after the SM ids of
//! shared/reference/tf_behaviors.md section 4 (SM-01..SM-09 live in device-spec, the fault cases
//! of SM-15/SM-16 in tests/faults.rs).

mod construction;
mod equivalence;
mod nested;
mod reductions;
mod replicas;
mod seeds;
mod variables;

use distribute_device_spec::LocalDevices;
use distribute_mirrored::MirroredStrategy;

/// A strategy over `n` CPUs of this process.
pub(crate) fn cpus(n: usize) -> MirroredStrategy {
    MirroredStrategy::new(LocalDevices::cpus(n)).unwrap()
}

/// TF's two-replica test setup for variable updates: a GPU and the CPU.
pub(crate) fn gpu_and_cpu() -> MirroredStrategy {
    MirroredStrategy::new(&["/gpu:0", "/cpu:0"]).unwrap()
}
