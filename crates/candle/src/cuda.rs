//! CUDA replicas (feature `cuda`): a `/gpu:N` replica trains on candle's CUDA device `N`.
//!
//! Gradients and the initial values still travel through host memory: the bucket of a GPU
//! replica is copied to the host, reduced by the strategy's collectives there, and copied back
//! (see docs/candle.md, GPUs, for why the GPU collectives are not used yet).

use candle_core::Device;

/// Whether this build has candle's CUDA backend.
#[cfg(test)]
pub(crate) const HAS_CUDA: bool = true;

/// candle's CUDA device `ordinal`, or candle's reason why not (no driver, no such GPU).
pub(crate) fn cuda_device(ordinal: usize) -> Result<Device, String> {
    Device::new_cuda(ordinal)
        .map_err(|e| format!("candle could not open CUDA device {ordinal}: {e}"))
}
