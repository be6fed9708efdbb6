//! [`Topology`]: the mesh's shape and which task owns each core, with its `TopologyProto` form.

use super::wire::{Reader, put_packed, put_varint_field};
use super::{MESH_RANK, invalid};
use crate::TpuError;

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

    pub(super) fn locate(&self, coordinates: [i32; MESH_RANK]) -> Result<(usize, usize), TpuError> {
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
