//! Without feature `cuda`: a `/gpu:N` replica is refused with the way to get one.

use candle_core::{DType, Device, Tensor};

use crate::Error;

/// Whether this build has candle's CUDA backend.
#[cfg(test)]
pub(crate) const HAS_CUDA: bool = false;

/// Why this build has no CUDA device to give.
pub(crate) fn cuda_device(_ordinal: usize) -> Result<Device, String> {
    Err(
        "this build of distribute-candle has no CUDA backend: turn on its feature `cuda` \
         (candle's CUDA backend, which needs the CUDA toolkit's nvcc at build time and links \
         libcuda, cuBLAS and cuRAND; docs/candle.md, GPUs)"
            .into(),
    )
}

/// Nothing to wait for: this build has no GPU devices.
pub(crate) fn settle(_device: &Device) -> Result<(), crate::Error> {
    Ok(())
}

/// Nothing to mark: this build has no GPU devices.
pub(crate) struct StepDone;

impl StepDone {
    /// Nothing to mark.
    pub(crate) fn mark(_device: &Device) -> Result<StepDone, crate::Error> {
        Ok(StepDone)
    }

    /// Nothing to wait for.
    pub(crate) fn order_after(&self, _device: &Device) -> Result<(), crate::Error> {
        Ok(())
    }
}

/// No GPU bucket: this build has no CUDA devices, so gradients are packed on the host.
pub(crate) fn pack_on_gpu<'g>(
    _dtype: DType,
    _parts: impl Iterator<Item = (usize, Option<&'g Tensor>)>,
    _padded: usize,
    _label: &str,
    _device: &Device,
) -> Result<Option<distribute_tensor::Tensor>, Error> {
    Ok(None)
}

/// No GPU bucket: this build's buckets are all on the host.
pub(crate) fn unpack_from_gpu(
    _bucket: &mut Option<distribute_tensor::Tensor>,
    _dtype: DType,
    _device: &Device,
) -> Result<Option<Tensor>, Error> {
    Ok(None)
}
