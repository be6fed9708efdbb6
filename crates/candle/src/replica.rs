//! One replica's state ([`Replica`]: its copy of the model, its optimizer, its variables in name
//! order, its device) and how it is built from the user's closures on a strategy's device.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use distribute_device_spec::{DeviceKind, LocalDevice};

use crate::gradients::Buckets;
use crate::precision::{LossScale, Precision};
use crate::variables::{self, VarInfo};
use crate::{Error, StepError};

/// One replica's model, optimizer and variables.
pub(crate) struct Replica<M, O> {
    pub(crate) model: M,
    pub(crate) optimizer: O,
    /// The model's variables in name order (the manifest's): with mixed precision, the f32
    /// master weights the optimizer updates.
    pub(crate) vars: Vec<Var>,
    /// With mixed precision, the variables the model computes with, name order: half-precision
    /// copies of the floating-point masters (the other variables are the masters themselves).
    pub(crate) compute: Option<Vec<Var>>,
    /// With f16 mixed precision, dynamic loss scaling's state.
    pub(crate) loss_scale: Option<LossScale>,
    pub(crate) device: Device,
    /// Gradients summed over micro-batches since the last update, name order.
    pub(crate) accumulated: Option<Vec<Option<Tensor>>>,
    /// The gradient buckets kept from one step to the next, and where they live.
    pub(crate) buckets: Buckets,
    /// Updates applied (the schedule's position, saved in checkpoints).
    pub(crate) updates: u64,
    /// The global norm of the last reduced gradients, when clipping took it.
    pub(crate) grad_norm: Option<f64>,
    /// With [`Sharding`](crate::Sharding), this replica's shards and their optimizer state.
    pub(crate) shards: Option<crate::shard::Shards>,
    /// The last step's buffer buckets (as `buckets`, for [`VarPolicy::Mean`] and
    /// [`VarPolicy::FirstReplica`] buffers).
    pub(crate) buffer_buckets: Buckets,
}

/// Builds every local replica's model and optimizer; their manifests.
#[allow(clippy::type_complexity)]
pub(crate) fn build_replicas<M, O, FM, FO, EM, EO>(
    devices: &[LocalDevice],
    first: usize,
    dtype: DType,
    precision: Precision,
    build_model: &FM,
    build_optimizer: &FO,
    sharded: bool,
) -> Result<(Vec<Replica<M, O>>, Vec<Vec<VarInfo>>), Error>
where
    FM: Fn(VarBuilder<'_>) -> Result<M, EM>,
    EM: Into<StepError>,
    FO: Fn(Vec<Var>) -> Result<O, EO>,
    EO: Into<StepError>,
{
    let mut replicas = Vec::with_capacity(devices.len());
    let mut manifests = Vec::with_capacity(devices.len());
    for (r, device) in devices.iter().enumerate() {
        let failed = |source: StepError| Error::Replica {
            replica: first + r,
            source,
        };
        let device = candle_device(device)?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, precision.build_dtype(dtype)?, &device);
        let model = build_model(vb).map_err(|e| failed(e.into()))?;
        let (mut manifest, model_vars) = {
            let data = varmap.data().lock().unwrap_or_else(|e| e.into_inner());
            variables::sorted(&data)
        };
        let (vars, compute) = match precision.compute() {
            None => (model_vars, None),
            Some(half) => {
                let masters = masters_of(&model_vars, half)?;
                for (info, master) in manifest.iter_mut().zip(&masters) {
                    info.dtype = master.dtype();
                }
                (masters, Some(model_vars))
            }
        };
        // A sharded model's optimizer updates pieces of the variables, whose state the shards
        // hold: built over no variable, it allocates no state of its own for them.
        let optimizer_vars = match sharded {
            true => Vec::new(),
            false => vars.clone(),
        };
        let optimizer = build_optimizer(optimizer_vars).map_err(|e| failed(e.into()))?;
        replicas.push(Replica {
            model,
            optimizer,
            vars,
            compute,
            loss_scale: precision.loss_scale(),
            device,
            accumulated: None,
            buckets: Buckets::default(),
            updates: 0,
            grad_norm: None,
            shards: None,
            buffer_buckets: Buckets::default(),
        });
        manifests.push(manifest);
    }
    Ok((replicas, manifests))
}

/// f32 master weights for the model's variables of dtype `half` (copies); every other variable
/// is its own master.
fn masters_of(model_vars: &[Var], half: DType) -> Result<Vec<Var>, Error> {
    model_vars
        .iter()
        .map(|v| match v.dtype() == half {
            true => Ok(Var::from_tensor(&v.as_tensor().to_dtype(DType::F32)?)?),
            false => Ok(v.clone()),
        })
        .collect()
}

impl<M, O> Replica<M, O> {
    /// The variables the model computes with, name order: the half-precision copies with mixed
    /// precision, else the variables themselves.
    pub(crate) fn compute_vars(&self) -> &[Var] {
        self.compute.as_deref().unwrap_or(&self.vars)
    }

    /// With mixed precision, sets every half-precision copy from its master (after an update,
    /// a restore, an assignment).
    pub(crate) fn refresh_compute(&self) -> Result<(), Error> {
        self.refresh_compute_at(0..self.vars.len())
    }

    /// With mixed precision, sets the half-precision copies of variables `indices` from their
    /// masters.
    pub(crate) fn refresh_compute_at(
        &self,
        indices: impl IntoIterator<Item = usize>,
    ) -> Result<(), Error> {
        let Some(compute) = &self.compute else {
            return Ok(());
        };
        for i in indices {
            let (copy, master) = (&compute[i], &self.vars[i]);
            if copy.dtype() != master.dtype() {
                copy.set(&master.as_tensor().to_dtype(copy.dtype())?)?;
            }
        }
        Ok(())
    }

    /// With mixed precision, sets the masters of variables `indices` from their half-precision
    /// copies (buffers the forward pass changed there).
    pub(crate) fn pull_from_compute(&self, indices: &[usize]) -> Result<(), Error> {
        let Some(compute) = &self.compute else {
            return Ok(());
        };
        for &i in indices {
            if compute[i].dtype() != self.vars[i].dtype() {
                self.vars[i].set(&compute[i].as_tensor().to_dtype(self.vars[i].dtype())?)?;
            }
        }
        Ok(())
    }
}

/// Whether candle runs this replica on the CPU.
pub(crate) fn is_cpu(device: &LocalDevice) -> bool {
    *device.kind() == DeviceKind::Cpu
}

/// The candle device of a replica: the CPU, or with feature `cuda` candle's CUDA device of a
/// `/gpu:N` replica.
pub(crate) fn candle_device(device: &LocalDevice) -> Result<Device, Error> {
    let reason = match device.kind() {
        DeviceKind::Cpu => return Ok(Device::Cpu),
        DeviceKind::Gpu => match crate::gpu::cuda_device(device.index() as usize) {
            Ok(device) => return Ok(device),
            Err(reason) => reason,
        },
        DeviceKind::Tpu => "a candle step is Rust code that runs eagerly, which TpuStrategy's \
                            compiled XLA programs cannot trace; train candle models with \
                            MirroredStrategy"
            .into(),
        _ => "candle has no backend for this device type; use CPU or GPU replicas".into(),
    };
    Err(Error::Device {
        device: device.name().to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use distribute_device_spec::LocalDevices;

    use super::*;

    #[test]
    fn cpu_replicas_get_the_cpu_and_the_others_a_device_or_the_reason_why_not() {
        let devices = LocalDevices::new(["/cpu:0", "/gpu:0", "/tpu:0"]).unwrap();
        assert!(matches!(candle_device(&devices[0]), Ok(Device::Cpu)));
        // A GPU replica is refused by a build without `cuda` (saying which feature), and by one
        // with it on a machine without that GPU (candle's reason); with the GPU, it is a CUDA
        // device.
        let gpu_reason = if crate::gpu::HAS_CUDA {
            "candle could not open CUDA device 0"
        } else {
            "feature `cuda`"
        };
        let mut refused = vec![(&devices[2], "MirroredStrategy")];
        match candle_device(&devices[1]) {
            Ok(gpu) => assert!(crate::gpu::HAS_CUDA && gpu.is_cuda()),
            Err(_) => refused.push((&devices[1], gpu_reason)),
        }
        for (device, reason) in refused {
            let err = candle_device(device).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("replica device '{}': ", device.name())),
                "{err}"
            );
            assert!(err.contains(reason), "{err}");
        }
    }
}
