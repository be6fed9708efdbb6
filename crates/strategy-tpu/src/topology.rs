//! [`Topology`] (a mesh of cores, which task owns each) and [`DeviceAssignment`] (which cores
//! each replica's logical devices run on), after TF's `tpu/topology.py` and
//! `tpu/device_assignment.py`.
//!
//! Meshes have rank 4 (x, y, z, core), as in current TF. Topologies serialize to the
//! `TopologyProto` wire format (fields 1–4: `mesh_shape`, `num_tasks`,
//! `num_tpu_devices_per_task`, `device_coordinates`), hand-encoded like the PJRT compile options.
//!
//! - [`mesh`]: [`Topology`] and its `TopologyProto` form.
//! - [`assignment`]: [`DeviceAssignment`] and [`DeviceOrderMode`].
//! - [`ring`]: TF's ring orders over chip blocks ([`ring_3d`], [`open_ring_2d`]).
//! - `wire`: the few protobuf wire-format pieces `TopologyProto` needs.

mod assignment;
mod mesh;
mod ring;
mod wire;

pub use assignment::{DeviceAssignment, DeviceOrderMode};
pub use mesh::Topology;
pub use ring::{open_ring_2d, ring_3d};

use crate::TpuError;

/// The rank of every mesh (x, y, z, core).
pub const MESH_RANK: usize = 4;

fn invalid(message: String) -> TpuError {
    TpuError::InvalidArgument(message)
}
