//! [`Topology`] (a mesh of cores, which task owns each) and [`DeviceAssignment`] (which cores
//! each replica's logical devices run on), after TF's `tpu/topology.py` and
//! `tpu/device_assignment.py`.
//!
//! Meshes have rank 4 (x, y, z, core), as in current TF. Topologies serialize to the
//! `TopologyProto` wire format (fields 1–4: `mesh_shape`, `num_tasks`,
//! `num_tpu_devices_per_task`, `device_coordinates`), hand-encoded like the PJRT compile options.

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

    /// TF's `device_assignment.build`: `num_replicas` copies of a `computation_shape` block of
    /// cores (default one core) spaced by `computation_stride` (default 1), in raster order with
    /// the core axis fastest.
    ///
    /// TF orders replicas along a ring instead when a block spans the whole core axis and the
    /// replicas fill the mesh; that only changes which replica gets which block (ring
    /// bandwidth on physical TPUs), and is not implemented here.
    pub fn build(
        topology: Topology,
        computation_shape: Option<&[i32]>,
        computation_stride: Option<&[i32]>,
        num_replicas: usize,
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
        // Raster order with the core axis (the last) varying fastest, as TF.
        let order: Vec<usize> = std::iter::once(MESH_RANK - 1)
            .chain(0..MESH_RANK - 1)
            .collect();
        let mut assignment = Vec::with_capacity(num_replicas);
        for replica in 0..num_replicas {
            let mut t = replica as i32;
            let mut position = [0i32; MESH_RANK];
            for &axis in &order {
                position[axis] = t % counts[axis];
                t /= counts[axis];
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

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    put_varint(out, field << 3);
    put_varint(out, value);
}

/// A packed repeated int32 field (negative values as 10-byte varints, as protobuf does).
fn put_packed(out: &mut Vec<u8>, field: u64, values: impl Iterator<Item = i64>) {
    let mut body = Vec::new();
    for v in values {
        put_varint(&mut body, v as u64);
    }
    put_varint(out, (field << 3) | 2);
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
