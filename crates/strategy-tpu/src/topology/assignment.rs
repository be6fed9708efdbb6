//! [`DeviceAssignment`]: which cores each replica's logical devices run on, built by hand or
//! laid out over a [`Topology`] in ring or raster order ([`DeviceOrderMode`]).

use super::mesh::Topology;
use super::ring::ring_3d;
use super::{MESH_RANK, invalid};
use crate::TpuError;

/// Which physical cores each replica's logical cores run on: `[replica][logical core]` →
/// mesh coordinates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceAssignment {
    topology: Topology,
    core_assignment: Vec<Vec<[i32; MESH_RANK]>>,
}

impl DeviceAssignment {
    /// An assignment from `[replica][core][axis]` coordinates (rank 3, last dimension the mesh
    /// rank, every coordinate a core of `topology`).
    pub fn new(topology: Topology, core_assignment: &[Vec<Vec<i32>>]) -> Result<Self, TpuError> {
        let cores = core_assignment.first().map_or(0, Vec::len);
        if core_assignment.is_empty() || cores == 0 {
            return Err(invalid(
                "core_assignment must be a non-empty rank 3 array [replica][core][axis]".into(),
            ));
        }
        let mut assignment = Vec::with_capacity(core_assignment.len());
        for (replica, row) in core_assignment.iter().enumerate() {
            if row.len() != cores {
                return Err(invalid(format!(
                    "core_assignment must be a rank 3 array: replica {replica} has {} cores, \
                     replica 0 has {cores}",
                    row.len()
                )));
            }
            let mut mapped = Vec::with_capacity(cores);
            for (core, coords) in row.iter().enumerate() {
                let coords: [i32; MESH_RANK] = coords.as_slice().try_into().map_err(|_| {
                    invalid(format!(
                        "core_assignment's last dimension must equal the mesh rank \
                         {MESH_RANK}; replica {replica} core {core} has {} coordinates",
                        coords.len()
                    ))
                })?;
                topology.locate(coords)?;
                mapped.push(coords);
            }
            assignment.push(mapped);
        }
        Ok(DeviceAssignment {
            topology,
            core_assignment: assignment,
        })
    }

    /// TF's `device_assignment.build` with [`DeviceOrderMode::Auto`]: `num_replicas` copies
    /// of a `computation_shape` block of cores (default one core) spaced by
    /// `computation_stride` (default 1). See [`build_with_order`](Self::build_with_order).
    pub fn build(
        topology: Topology,
        computation_shape: Option<&[i32]>,
        computation_stride: Option<&[i32]>,
        num_replicas: usize,
    ) -> Result<Self, TpuError> {
        Self::build_with_order(
            topology,
            computation_shape,
            computation_stride,
            num_replicas,
            DeviceOrderMode::Auto,
        )
    }

    /// TF's `device_assignment.build`, step for step:
    ///
    /// - The replicas get a compact block of the mesh (`replica_shape`): dimensions are chosen
    ///   as close to a cube as possible, the most constrained first, the core axis before x, y
    ///   and z at equal sizes.
    /// - Ring order (TPU-11) when `mode` is `Ring`, or with `Auto` when a block spans the whole
    ///   core axis, there is no stride and the replicas fill the mesh: replicas follow
    ///   [`ring_3d`] over the replica block, and each replica's chips follow [`ring_3d`] over
    ///   the computation block, cores fastest. `Ring` where that does not hold is an error.
    /// - Otherwise raster order, core axis fastest, then x, y, z.
    /// - A topology with missing devices ignores the stride and hands out cores in task order.
    pub fn build_with_order(
        topology: Topology,
        computation_shape: Option<&[i32]>,
        computation_stride: Option<&[i32]>,
        num_replicas: usize,
        mode: DeviceOrderMode,
    ) -> Result<Self, TpuError> {
        let ones = [1; MESH_RANK];
        let shape = axis_values("computation_shape", computation_shape.unwrap_or(&ones))?;
        let stride = axis_values("computation_stride", computation_stride.unwrap_or(&ones))?;
        let mesh = topology.mesh_shape();
        let footprint: Vec<i32> = (0..MESH_RANK).map(|i| shape[i] * stride[i]).collect();
        if (0..MESH_RANK).any(|i| footprint[i] > mesh[i]) {
            return Err(invalid(format!(
                "computation footprint {footprint:?} (shape {shape:?} × stride {stride:?}) does \
                 not fit the mesh {mesh:?}"
            )));
        }
        let blocks: Vec<i32> = (0..MESH_RANK).map(|i| mesh[i] / footprint[i]).collect();
        // Strided blocks interleave: `stride` of them start within each footprint.
        let counts: Vec<i32> = (0..MESH_RANK).map(|i| blocks[i] * stride[i]).collect();
        let max_replicas: i64 = counts.iter().map(|&c| i64::from(c)).product();
        if num_replicas as i64 > max_replicas || num_replicas == 0 {
            return Err(invalid(format!(
                "{num_replicas} replicas of computation shape {shape:?} do not fit the mesh \
                 {mesh:?}: between 1 and {max_replicas} fit"
            )));
        }
        let cores_per_replica: i32 = shape.iter().product();
        if !topology.missing_devices().is_empty() {
            if stride.iter().any(|&s| s != 1) {
                return Err(invalid(
                    "a topology with missing devices takes no computation_stride".into(),
                ));
            }
            let per_task = topology.num_tpus_per_task();
            let all: Vec<Vec<i32>> = (0..num_replicas * cores_per_replica as usize)
                .filter_map(|id| topology.device_coordinates(id / per_task, id % per_task))
                .map(|c| c.to_vec())
                .collect();
            if all.len() < num_replicas * cores_per_replica as usize {
                return Err(invalid(format!(
                    "{num_replicas} replicas of {cores_per_replica} cores need more cores than \
                     the topology's {}",
                    topology.num_tasks() * per_task
                )));
            }
            let assignment: Vec<Vec<Vec<i32>>> = all
                .chunks(cores_per_replica as usize)
                .map(<[Vec<i32>]>::to_vec)
                .collect();
            return DeviceAssignment::new(topology, &assignment);
        }
        let replica_shape = replica_shape(&counts, num_replicas);
        let tiling = shape[MESH_RANK - 1] == mesh[MESH_RANK - 1]
            && stride.iter().all(|&s| s == 1)
            && num_replicas as i64 == max_replicas;
        let ring = match mode {
            DeviceOrderMode::Auto => tiling,
            DeviceOrderMode::Ring if !tiling => {
                return Err(invalid(
                    "DeviceOrderMode::Ring needs blocks spanning the core axis, no stride and \
                     replicas filling the mesh; use DeviceOrderMode::Auto"
                        .into(),
                ));
            }
            DeviceOrderMode::Ring => true,
            DeviceOrderMode::Mesh => false,
        };
        let mut assignment = Vec::with_capacity(num_replicas);
        if ring {
            let inner = ring_3d(shape[0], shape[1], shape[2]);
            let outer = ring_3d(replica_shape[0], replica_shape[1], replica_shape[2]);
            let cores = mesh[MESH_RANK - 1];
            for &[ox, oy, oz] in outer.iter().take(num_replicas) {
                let mut per_replica = Vec::new();
                for index in 0..cores_per_replica {
                    let [ix, iy, iz] = inner[(index / cores) as usize];
                    per_replica.push(vec![
                        ox * shape[0] + ix,
                        oy * shape[1] + iy,
                        oz * shape[2] + iz,
                        index % cores,
                    ]);
                }
                assignment.push(per_replica);
            }
            return DeviceAssignment::new(topology, &assignment);
        }
        // Raster order over the replica block, with the core axis (the last) fastest.
        let order: Vec<usize> = std::iter::once(MESH_RANK - 1)
            .chain(0..MESH_RANK - 1)
            .collect();
        for replica in 0..num_replicas {
            let mut t = replica as i32;
            let mut position = [0i32; MESH_RANK];
            for &axis in &order {
                position[axis] = t % replica_shape[axis];
                t /= replica_shape[axis];
            }
            let offset: Vec<i32> = (0..MESH_RANK)
                .map(|i| position[i] / stride[i] * footprint[i] + position[i] % stride[i])
                .collect();
            let mut cores = Vec::new();
            for x in 0..shape[0] {
                for y in 0..shape[1] {
                    for z in 0..shape[2] {
                        for w in 0..shape[3] {
                            let logical = [x, y, z, w];
                            cores.push(
                                (0..MESH_RANK)
                                    .map(|i| offset[i] + logical[i] * stride[i])
                                    .collect::<Vec<i32>>(),
                            );
                        }
                    }
                }
            }
            assignment.push(cores);
        }
        DeviceAssignment::new(topology, &assignment)
    }

    /// The topology.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Replicas.
    pub fn num_replicas(&self) -> usize {
        self.core_assignment.len()
    }

    /// Logical cores per replica.
    pub fn num_cores_per_replica(&self) -> usize {
        self.core_assignment[0].len()
    }

    fn check(&self, replica: usize, logical_core: usize) -> Result<[i32; MESH_RANK], TpuError> {
        self.core_assignment
            .get(replica)
            .and_then(|cores| cores.get(logical_core))
            .copied()
            .ok_or_else(|| {
                invalid(format!(
                    "replica {replica}, logical core {logical_core} out of range: {} replicas of \
                     {} cores",
                    self.num_replicas(),
                    self.num_cores_per_replica()
                ))
            })
    }

    /// Mesh coordinates of `replica`'s `logical_core`.
    pub fn coordinates(
        &self,
        replica: usize,
        logical_core: usize,
    ) -> Result<[i32; MESH_RANK], TpuError> {
        self.check(replica, logical_core)
    }

    /// The core's index within its task.
    pub fn tpu_ordinal(&self, replica: usize, logical_core: usize) -> Result<usize, TpuError> {
        self.topology
            .tpu_device_ordinal_at_coordinates(self.check(replica, logical_core)?)
    }

    /// The core's device name (see [`Topology::tpu_device_name_at_coordinates`]).
    pub fn tpu_device(
        &self,
        replica: usize,
        logical_core: usize,
        job: Option<&str>,
    ) -> Result<String, TpuError> {
        self.topology
            .tpu_device_name_at_coordinates(self.check(replica, logical_core)?, job)
    }

    /// The core's host CPU.
    pub fn host_device(
        &self,
        replica: usize,
        logical_core: usize,
        job: Option<&str>,
    ) -> Result<String, TpuError> {
        self.topology
            .cpu_device_name_at_coordinates(self.check(replica, logical_core)?, job)
    }

    /// The replicas whose `logical_core` runs on task `task`.
    pub fn lookup_replicas(
        &self,
        task: usize,
        logical_core: usize,
    ) -> Result<Vec<usize>, TpuError> {
        let replicas: Vec<usize> = (0..self.num_replicas())
            .filter(|&r| {
                self.check(r, logical_core)
                    .and_then(|c| self.topology.task_ordinal_at_coordinates(c))
                    .is_ok_and(|t| t == task)
            })
            .collect();
        if replicas.is_empty() {
            return Err(invalid(format!(
                "no replica runs logical core {logical_core} on task {task}"
            )));
        }
        Ok(replicas)
    }
}

/// How [`DeviceAssignment::build_with_order`] orders replicas and cores (TF's
/// `DeviceOrderMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceOrderMode {
    /// Rings where they apply (see [`DeviceAssignment::build_with_order`]), else raster order.
    #[default]
    Auto,
    /// Rings; an error where they do not apply.
    Ring,
    /// Raster order.
    Mesh,
}

/// How many replicas go along each axis: as close to a cube as possible, visiting axes by
/// increasing replica count, ties broken core axis first, then x, y, z (TF's `replica_shape`).
fn replica_shape(counts: &[i32], num_replicas: usize) -> [i32; MESH_RANK] {
    let mut shape = [1i32; MESH_RANK];
    let mut axes: Vec<(i32, usize)> = counts
        .iter()
        .enumerate()
        .map(|(i, &c)| (c, (i + 1) % MESH_RANK))
        .collect();
    axes.sort();
    let mut remaining = num_replicas as i64;
    let mut dims = MESH_RANK as i32;
    for (count, rotated) in axes {
        let axis = (rotated + MESH_RANK - 1) % MESH_RANK;
        let target = ceil_root(remaining, dims);
        shape[axis] = target.min(i64::from(count)) as i32;
        remaining = (remaining + i64::from(shape[axis]) - 1) / i64::from(shape[axis]);
        dims -= 1;
    }
    shape
}

/// ⌈n^(1/k)⌉, exactly (TF computes it in floating point; this agrees wherever that is exact).
fn ceil_root(n: i64, k: i32) -> i64 {
    let mut r = (n as f64).powf(1.0 / f64::from(k)).floor().max(1.0) as i64;
    // Correct the float estimate to the smallest r with r^k >= n.
    while r > 1 && (r - 1).checked_pow(k as u32).is_some_and(|p| p >= n) {
        r -= 1;
    }
    while r.checked_pow(k as u32).is_some_and(|p| p < n) {
        r += 1;
    }
    r
}

fn axis_values(name: &str, values: &[i32]) -> Result<[i32; MESH_RANK], TpuError> {
    let values: [i32; MESH_RANK] = values.try_into().map_err(|_| {
        invalid(format!(
            "{name} must have {MESH_RANK} entries (the mesh rank), got {values:?}"
        ))
    })?;
    if values.iter().any(|&v| v <= 0) {
        return Err(invalid(format!(
            "{name} entries must be positive, got {values:?}"
        )));
    }
    Ok(values)
}
