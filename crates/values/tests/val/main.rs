//! Behaviour tests of distribute-values, named after the reference behaviours VAL-01..VAL-46
//! (tf_behaviors.md, section 2). One test binary keeps link time down.

mod checkpoint;
mod device_map;
mod distributed;
mod nest;
mod properties;
mod regroup;
mod variables;

use std::sync::Arc;

use distribute_values::{DistributedValues, Leaf, ReplicaDeviceMap};

/// A map of `n` CPU devices, `/job:localhost/replica:0/task:0/device:CPU:i`.
pub fn cpus(n: usize) -> Arc<ReplicaDeviceMap> {
    Arc::new(
        ReplicaDeviceMap::new(
            (0..n).map(|i| format!("/job:localhost/replica:0/task:0/device:CPU:{i}")),
        )
        .unwrap(),
    )
}

/// The values of a leaf that must be a `PerReplica`.
#[track_caller]
pub fn per_replica<T: Clone + std::fmt::Debug>(leaf: &Leaf<T>) -> Vec<T> {
    match leaf {
        Leaf::PerReplica(v) => v.values().to_vec(),
        other => panic!("expected a PerReplica, got {other:?}"),
    }
}

/// The values of a leaf that must be `Mirrored`.
#[track_caller]
pub fn mirrored<T: Clone + std::fmt::Debug>(leaf: &Leaf<T>) -> Vec<T> {
    match leaf {
        Leaf::Mirrored(v) => v.values().to_vec(),
        other => panic!("expected a Mirrored, got {other:?}"),
    }
}
