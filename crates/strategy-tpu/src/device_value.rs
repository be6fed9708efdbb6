//! Values on the replicas' devices: a step's inputs ([`StepInput`]), the [`DeviceValue`]s that
//! stay on the devices between steps, and the host ↔ device copies and type mapping behind them.

use std::sync::Arc;

use distribute_pjrt::stablehlo::TensorType;
use distribute_pjrt::{Buffer, ElementType};
use distribute_tensor::{DType, Tensor};
use distribute_values::{DistributedValues, Mirrored, PerReplica, ReplicaDeviceMap};

use crate::TpuError;
use crate::replicas::Replicas;

/// One input of a compiled step.
#[derive(Clone, Copy, Debug)]
pub enum StepInput<'a> {
    /// The same tensor for every replica (copied to each device).
    Same(&'a Tensor),
    /// One tensor per replica; all must have the same shape and dtype.
    PerReplica(&'a PerReplica<Tensor>),
    /// Values already on the devices, such as a previous step's outputs (no copy).
    Device(&'a DeviceValue),
}

/// A value held on every replica's device, one buffer each (weights between steps, outputs).
pub struct DeviceValue {
    pub(crate) buffers: Vec<Buffer>,
    pub(crate) ty: TensorType,
    /// Each replica's device name (shared: every step makes several values).
    pub(crate) device_map: Arc<ReplicaDeviceMap>,
}

impl std::fmt::Debug for DeviceValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<&str> = self.device_map.primary_devices().collect();
        write!(f, "DeviceValue({} on {devices:?})", self.ty)
    }
}

impl DeviceValue {
    /// A value held in `buffers`, one per replica of `replicas`, of per-replica type `ty`.
    pub(crate) fn on(replicas: &Replicas, buffers: Vec<Buffer>, ty: TensorType) -> DeviceValue {
        DeviceValue {
            buffers,
            ty,
            device_map: Arc::clone(&replicas.device_map),
        }
    }

    /// The per-replica type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Replica `r`'s value, copied to the host (waits for the step that computes it).
    pub fn replica(&self, r: usize) -> Result<Tensor, TpuError> {
        let buffer = self.buffers.get(r).ok_or_else(|| {
            TpuError::InvalidArgument(format!(
                "replica {r} out of range: {} replicas",
                self.buffers.len()
            ))
        })?;
        let shape: Vec<usize> = self.ty.dims.iter().map(|&d| d as usize).collect();
        let device =
            self.device_map.primary_devices().nth(r).ok_or_else(|| {
                TpuError::InvalidArgument(format!("replica {r} has no device name"))
            })?;
        Ok(match self.ty.element {
            ElementType::F32 => Tensor::from_vec(device, &shape, buffer.to_vec::<f32>()?)?,
            ElementType::F64 => Tensor::from_vec(device, &shape, buffer.to_vec::<f64>()?)?,
            ElementType::S32 => Tensor::from_vec(device, &shape, buffer.to_vec::<i32>()?)?,
            ElementType::S64 => Tensor::from_vec(device, &shape, buffer.to_vec::<i64>()?)?,
            other => {
                return Err(TpuError::Unimplemented(format!(
                    "reading {other} values back as tensors"
                )));
            }
        })
    }

    /// Every replica's value, on the host.
    pub fn to_per_replica(&self) -> Result<PerReplica<Tensor>, TpuError> {
        let values = (0..self.buffers.len())
            .map(|r| self.replica(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PerReplica::new(Arc::clone(&self.device_map), values)?)
    }

    /// Every replica's value as a `Mirrored` (for values an all-reduce made equal); fails if
    /// the replicas' copies differ in any bit.
    pub fn to_mirrored(&self) -> Result<Mirrored<Tensor>, TpuError> {
        let (values, map) = self.to_per_replica()?.into_parts();
        if let Some(r) = values.iter().position(|v| !v.bitwise_eq(&values[0])) {
            return Err(TpuError::InvalidArgument(format!(
                "replica {r}'s value differs from replica 0's, so it is not mirrored; read it \
                 with to_per_replica"
            )));
        }
        Ok(Mirrored::new(map, values)?)
    }
}

/// Copies `input` to every replica's device.
pub(crate) fn to_device(
    replicas: &Replicas,
    input: StepInput<'_>,
) -> Result<DeviceValue, TpuError> {
    let devices = &replicas.devices;
    let (buffers, ty) = match input {
        StepInput::Device(v) => {
            return Err(TpuError::InvalidArgument(format!(
                "{v:?} is already on the devices; pass it to steps as StepInput::Device"
            )));
        }
        StepInput::Same(t) => {
            let buffers = devices
                .iter()
                .map(|d| upload(&replicas.client, t, d))
                .collect::<Result<Vec<_>, _>>()?;
            (buffers, tensor_type(t)?)
        }
        StepInput::PerReplica(p) => {
            let values = p.values();
            if values.len() != devices.len() {
                return Err(TpuError::InvalidArgument(format!(
                    "{} replicas' values for a strategy of {} replicas",
                    values.len(),
                    devices.len()
                )));
            }
            let ty = tensor_type(&values[0])?;
            if let Some(r) = values
                .iter()
                .position(|v| tensor_type(v).ok().as_ref() != Some(&ty))
            {
                return Err(TpuError::InvalidArgument(format!(
                    "replica {r}'s value differs in shape or dtype from replica 0's ({ty})"
                )));
            }
            let buffers = values
                .iter()
                .zip(devices)
                .map(|(t, d)| upload(&replicas.client, t, d))
                .collect::<Result<Vec<_>, _>>()?;
            (buffers, ty)
        }
    };
    Ok(DeviceValue::on(replicas, buffers, ty))
}

fn element_type(dtype: DType) -> Result<ElementType, TpuError> {
    match dtype {
        DType::F32 => Ok(ElementType::F32),
        DType::F64 => Ok(ElementType::F64),
        DType::I32 => Ok(ElementType::S32),
        DType::I64 => Ok(ElementType::S64),
        other => Err(TpuError::Unimplemented(format!(
            "{} tensors as step inputs",
            other.name()
        ))),
    }
}

pub(crate) fn tensor_type(t: &Tensor) -> Result<TensorType, TpuError> {
    let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    Ok(TensorType::new(element_type(t.dtype())?, &dims))
}

pub(crate) fn upload(
    client: &distribute_pjrt::Client,
    t: &Tensor,
    device: &distribute_pjrt::Device,
) -> Result<Buffer, TpuError> {
    let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    Ok(match t.dtype() {
        DType::F32 => upload_elements::<f32>(client, t, &dims, device)?,
        DType::F64 => upload_elements::<f64>(client, t, &dims, device)?,
        DType::I32 => upload_elements::<i32>(client, t, &dims, device)?,
        DType::I64 => upload_elements::<i64>(client, t, &dims, device)?,
        other => {
            return Err(element_type(other).err().unwrap_or_else(|| {
                TpuError::Unimplemented(format!("{} step inputs", other.name()))
            }));
        }
    })
}

/// Copies a tensor of `T`s to `device`, straight from its array when that is one row-major
/// block (a batch's leaves are), through a row-major copy otherwise.
fn upload_elements<T: distribute_tensor::Element + distribute_pjrt::NativeType>(
    client: &distribute_pjrt::Client,
    t: &Tensor,
    dims: &[i64],
    device: &distribute_pjrt::Device,
) -> Result<Buffer, TpuError> {
    let array = t.array::<T>()?;
    Ok(match array.as_slice() {
        Some(elements) => client.buffer_from_host(elements, dims, device)?,
        None => client.buffer_from_host(&t.to_vec::<T>()?, dims, device)?,
    })
}
