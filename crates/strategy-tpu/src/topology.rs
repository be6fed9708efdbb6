//! [`Topology`] (a mesh of cores, which task owns each) and [`DeviceAssignment`] (which cores
//! each replica's logical devices run on), after TF's `tpu/topology.py` and
//! `tpu/device_assignment.py`.
//!
//! Meshes have rank 4 (x, y, z, core), as in current TF. Topologies serialize to the
//! `TopologyProto` wire format (fields 1–4: `mesh_shape`, `num_tasks`,
//! `num_tpu_devices_per_task`, `device_coordinates`), hand-encoded like the PJRT compile options.

use distribute_pjrt::protobuf::{WIRE_LEN, put_key, put_varint, put_varint_field};

use crate::TpuError;

/// The rank of every mesh (x, y, z, core).
pub const MESH_RANK: usize = 4;

fn invalid(message: String) -> TpuError {
    TpuError::InvalidArgument(message)
}

/// The physical layout of a TPU system: the mesh's shape and the mesh coordinates of every core,
/// by task and by device within the task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    mesh_shape: [i32; MESH_RANK],
    /// `[task][device]` → coordinates.
    device_coordinates: Vec<Vec<[i32; MESH_RANK]>>,
}

impl Topology {
    /// A topology from its mesh shape (4 positive entries) and `[task][device][axis]`
    /// coordinates (rank 3, last dimension the mesh rank).
    pub fn new(
        mesh_shape: &[i32],
        device_coordinates: &[Vec<Vec<i32>>],
    ) -> Result<Topology, TpuError> {
        let mesh_shape = check_mesh_shape(mesh_shape)?;
        let devices_per_task = device_coordinates.first().map_or(0, Vec::len);
        let mut coordinates = Vec::with_capacity(device_coordinates.len());
        for (task, devices) in device_coordinates.iter().enumerate() {
            if devices.len() != devices_per_task {
                return Err(invalid(format!(
                    "device_coordinates must be a rank 3 array: task {task} has {} devices, task 0 \
                     has {devices_per_task}",
                    devices.len()
                )));
            }
            let mut row = Vec::with_capacity(devices.len());
            for (device, coords) in devices.iter().enumerate() {
                let coords: [i32; MESH_RANK] = coords.as_slice().try_into().map_err(|_| {
                    invalid(format!(
                        "device_coordinates' last dimension must equal the mesh rank \
                         {MESH_RANK}; task {task} device {device} has {} coordinates",
                        coords.len()
                    ))
                })?;
                if coords.iter().any(|&c| c < 0) {
                    return Err(invalid(format!(
                        "device coordinates must be non-negative; task {task} device {device} \
                         has {coords:?}"
                    )));
                }
                row.push(coords);
            }
            coordinates.push(row);
        }
        Ok(Topology {
            mesh_shape,
            device_coordinates: coordinates,
        })
    }

    /// One task with `n` cores along the last mesh axis: mesh `[1, 1, 1, n]`, core `i` at
    /// `(0, 0, 0, i)`. This is how a PJRT client's devices are laid out here.
    pub fn single_host(n: usize) -> Result<Topology, TpuError> {
        let n = i32::try_from(n).map_err(|_| invalid(format!("{n} cores is too many")))?;
        let coordinates = vec![(0..n).map(|i| vec![0, 0, 0, i]).collect()];
        Topology::new(&[1, 1, 1, n], &coordinates)
    }

    /// The mesh's shape.
    pub fn mesh_shape(&self) -> [i32; MESH_RANK] {
        self.mesh_shape
    }

    /// The mesh's rank (always [`MESH_RANK`]).
    pub fn mesh_rank(&self) -> usize {
        MESH_RANK
    }

    /// Tasks (hosts).
    pub fn num_tasks(&self) -> usize {
        self.device_coordinates.len()
    }

    /// Cores per task.
    pub fn num_tpus_per_task(&self) -> usize {
        self.device_coordinates.first().map_or(0, Vec::len)
    }

    /// The coordinates of `device` of `task`.
    pub fn device_coordinates(&self, task: usize, device: usize) -> Option<[i32; MESH_RANK]> {
        self.device_coordinates.get(task)?.get(device).copied()
    }

    fn locate(&self, coordinates: [i32; MESH_RANK]) -> Result<(usize, usize), TpuError> {
        self.device_coordinates
            .iter()
            .enumerate()
            .find_map(|(task, devices)| {
                devices
                    .iter()
                    .position(|c| *c == coordinates)
                    .map(|device| (task, device))
            })
            .ok_or_else(|| invalid(format!("no core at mesh coordinates {coordinates:?}")))
    }

    /// The task owning the core at `coordinates`.
    pub fn task_ordinal_at_coordinates(
        &self,
        coordinates: [i32; MESH_RANK],
    ) -> Result<usize, TpuError> {
        Ok(self.locate(coordinates)?.0)
    }

    /// The core's index within its task.
    pub fn tpu_device_ordinal_at_coordinates(
        &self,
        coordinates: [i32; MESH_RANK],
    ) -> Result<usize, TpuError> {
        Ok(self.locate(coordinates)?.1)
    }

    /// The host CPU of the core at `coordinates`: `/job:J/task:T/device:CPU:0`, without the job
    /// when `job` is `None`.
    pub fn cpu_device_name_at_coordinates(
        &self,
        coordinates: [i32; MESH_RANK],
        job: Option<&str>,
    ) -> Result<String, TpuError> {
        let task = self.task_ordinal_at_coordinates(coordinates)?;
        Ok(format!("{}/task:{task}/device:CPU:0", job_prefix(job)))
    }

    /// The core at `coordinates`: `/job:J/task:T/device:TPU:D`, without the job when `job` is
    /// `None`.
    pub fn tpu_device_name_at_coordinates(
        &self,
        coordinates: [i32; MESH_RANK],
        job: Option<&str>,
    ) -> Result<String, TpuError> {
        let (task, device) = self.locate(coordinates)?;
        Ok(format!(
            "{}/task:{task}/device:TPU:{device}",
            job_prefix(job)
        ))
    }

    /// Mesh coordinates that no core covers.
    pub fn missing_devices(&self) -> Vec<[i32; MESH_RANK]> {
        let [a, b, c, d] = self.mesh_shape;
        let mut missing = Vec::new();
        for x in 0..a {
            for y in 0..b {
                for z in 0..c {
                    for w in 0..d {
                        let coords = [x, y, z, w];
                        if self.locate(coords).is_err() {
                            missing.push(coords);
                        }
                    }
                }
            }
        }
        missing
    }

    /// The `TopologyProto` bytes.
    pub fn serialize(&self) -> Vec<u8> {
        let mut out = Vec::new();
        put_packed(&mut out, 1, self.mesh_shape.iter().map(|&v| i64::from(v)));
        put_varint_field(&mut out, 2, self.num_tasks() as u64);
        put_varint_field(&mut out, 3, self.num_tpus_per_task() as u64);
        put_packed(
            &mut out,
            4,
            self.device_coordinates
                .iter()
                .flatten()
                .flatten()
                .map(|&v| i64::from(v)),
        );
        out
    }

    /// Parses `TopologyProto` bytes: the counts must be non-negative, and the coordinates number
    /// tasks × devices × rank, none negative.
    pub fn parse(bytes: &[u8]) -> Result<Topology, TpuError> {
        let mut mesh_shape = Vec::new();
        let mut num_tasks = 0i64;
        let mut per_task = 0i64;
        let mut coordinates = Vec::new();
        let mut reader = Reader { bytes, at: 0 };
        while !reader.done() {
            let key = reader.varint()?;
            match (key >> 3, key & 7) {
                (1, 2) => mesh_shape.extend(reader.packed()?),
                (1, 0) => mesh_shape.push(reader.varint()? as i64),
                (2, 0) => num_tasks = reader.varint()? as i64,
                (3, 0) => per_task = reader.varint()? as i64,
                (4, 2) => coordinates.extend(reader.packed()?),
                (4, 0) => coordinates.push(reader.varint()? as i64),
                (_, wire) => reader.skip(wire)?,
            }
        }
        if num_tasks < 0 || per_task < 0 {
            return Err(invalid(format!(
                "num_tasks ({num_tasks}) and num_tpu_devices_per_task ({per_task}) must be \
                 non-negative"
            )));
        }
        let mesh: Vec<i32> = mesh_shape.iter().map(|&v| v as i32).collect();
        let rank = mesh.len() as i64;
        if coordinates.len() as i64 != num_tasks * per_task * rank {
            return Err(invalid(format!(
                "the topology has {} device coordinates, expected tasks × devices × mesh rank = \
                 {num_tasks} × {per_task} × {rank}",
                coordinates.len()
            )));
        }
        if coordinates.iter().any(|&c| c < 0) {
            return Err(invalid("device coordinates must be non-negative".into()));
        }
        let rank = rank as usize;
        let nested: Vec<Vec<Vec<i32>>> = if rank == 0 || per_task == 0 {
            vec![Vec::new(); num_tasks as usize]
        } else {
            coordinates
                .chunks(per_task as usize * rank)
                .map(|task| {
                    task.chunks(rank)
                        .map(|c| c.iter().map(|&v| v as i32).collect())
                        .collect()
                })
                .collect()
        };
        Topology::new(&mesh, &nested)
    }
}

fn job_prefix(job: Option<&str>) -> String {
    job.map(|j| format!("/job:{j}")).unwrap_or_default()
}

fn check_mesh_shape(mesh_shape: &[i32]) -> Result<[i32; MESH_RANK], TpuError> {
    let shape: [i32; MESH_RANK] = mesh_shape.try_into().map_err(|_| {
        invalid(format!(
            "mesh_shape must have {MESH_RANK} entries (x, y, z, core), got {mesh_shape:?}"
        ))
    })?;
    if shape.iter().any(|&d| d <= 0) {
        return Err(invalid(format!(
            "mesh_shape entries must be positive, got {mesh_shape:?}"
        )));
    }
    Ok(shape)
}

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
        let mesh = topology.mesh_shape;
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

/// TF's `_open_ring_2d`: a ring over an `x_size` × `y_size` plane at height `z`, leaving out
/// (0, 0, z): along x on even rows from x = 1, back on odd rows, then down the x = 0 column.
///
/// ```
/// let ring = distribute_tpu::topology::open_ring_2d(2, 2, 0);
/// assert_eq!(ring, [[1, 0, 0], [1, 1, 0], [0, 1, 0]]);
/// ```
pub fn open_ring_2d(x_size: i32, y_size: i32, z: i32) -> Vec<[i32; 3]> {
    let mut ring = Vec::new();
    for i in 0..y_size / 2 {
        for x in 1..x_size {
            ring.push([x, 2 * i, z]);
        }
        for x in (1..x_size).rev() {
            ring.push([x, 2 * i + 1, z]);
        }
    }
    for y in (1..y_size).rev() {
        ring.push([0, y, z]);
    }
    ring
}

/// TF's `_ring_3d`: a ring through every chip of an `x` × `y` × `z` block (TPU-11).
///
/// - Two sizes of 1: a line along the third axis.
/// - Any odd size above 1: raster order, z outermost, then y, then x.
/// - Otherwise (0, 0, 0) first, then a 2-D ring over the two axes above 1, or, when all three
///   are, 2-D rings plane by plane (every other one reversed) and back down the z axis.
///
/// ```
/// use distribute_tpu::topology::ring_3d;
///
/// assert_eq!(ring_3d(1, 1, 3), [[0, 0, 0], [0, 0, 1], [0, 0, 2]]);
/// ```
pub fn ring_3d(x_size: i32, y_size: i32, z_size: i32) -> Vec<[i32; 3]> {
    match (x_size, y_size, z_size) {
        (1, 1, _) => return (0..z_size).map(|z| [0, 0, z]).collect(),
        (1, _, 1) => return (0..y_size).map(|y| [0, y, 0]).collect(),
        (_, 1, 1) => return (0..x_size).map(|x| [x, 0, 0]).collect(),
        _ => {}
    }
    if [x_size, y_size, z_size]
        .iter()
        .any(|&d| d > 1 && d % 2 != 0)
    {
        let mut ring = Vec::new();
        for z in 0..z_size {
            for y in 0..y_size {
                for x in 0..x_size {
                    ring.push([x, y, z]);
                }
            }
        }
        return ring;
    }
    let mut ring = vec![[0, 0, 0]];
    if z_size == 1 {
        ring.extend(open_ring_2d(x_size, y_size, 0));
    } else if y_size == 1 {
        ring.extend(
            open_ring_2d(x_size, z_size, 0)
                .into_iter()
                .map(|[x, z, y]| [x, y, z]),
        );
    } else if x_size == 1 {
        ring.extend(
            open_ring_2d(y_size, z_size, 0)
                .into_iter()
                .map(|[y, z, x]| [x, y, z]),
        );
    } else {
        for z in 0..z_size {
            let plane = open_ring_2d(x_size, y_size, z);
            if z % 2 == 0 {
                ring.extend(plane);
            } else {
                ring.extend(plane.into_iter().rev());
            }
        }
        for z in (1..z_size).rev() {
            ring.push([0, 0, z]);
        }
    }
    ring
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

// ---- protobuf wire format (only what TopologyProto needs) --------------------------------------

/// A packed repeated int32 field (negative values as 10-byte varints, as protobuf does).
fn put_packed(out: &mut Vec<u8>, field: u64, values: impl Iterator<Item = i64>) {
    let mut body = Vec::new();
    for v in values {
        put_varint(&mut body, v as u64);
    }
    put_key(out, field, WIRE_LEN);
    put_varint(out, body.len() as u64);
    out.extend(body);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn varint(&mut self) -> Result<u64, TpuError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .bytes
                .get(self.at)
                .ok_or_else(|| invalid("truncated TopologyProto".into()))?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(invalid("malformed varint in TopologyProto".into()))
    }

    fn length_delimited(&mut self) -> Result<&[u8], TpuError> {
        let len = self.varint()? as usize;
        let end = self.at.checked_add(len).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| invalid("truncated TopologyProto".into()))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    /// Packed int32s; negative ones arrive as 64-bit two's complement.
    fn packed(&mut self) -> Result<Vec<i64>, TpuError> {
        let body = self.length_delimited()?;
        let mut inner = Reader { bytes: body, at: 0 };
        let mut values = Vec::new();
        while !inner.done() {
            values.push(inner.varint()? as i64);
        }
        Ok(values)
    }

    fn skip(&mut self, wire: u64) -> Result<(), TpuError> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.advance(8),
            2 => self.length_delimited().map(drop),
            5 => self.advance(4),
            _ => Err(invalid(format!(
                "unsupported wire type {wire} in TopologyProto"
            ))),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), TpuError> {
        if self.at + n > self.bytes.len() {
            return Err(invalid("truncated TopologyProto".into()));
        }
        self.at += n;
        Ok(())
    }
}
