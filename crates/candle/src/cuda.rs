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
///
/// Its work is queued on the calling thread's per-thread stream: a replica's steps on its
/// thread's, the caller's reads and writes on the caller's, ordered against each other by
/// [`settle`] and [`StepDone`]. (`Device::new_cuda_with_stream` would order them by one stream,
/// but an explicit stream turns cudarc's event tracking on for the whole context, events
/// recorded and waited for around every kernel: with it, the small model of `benches/gpu.rs`
/// ran at 0.79–0.82× a plain candle loop on an H200, against 1.05–1.10× without.)
pub(crate) fn cuda_device(ordinal: usize) -> Result<Device, String> {
    Device::new_cuda(ordinal)
        .map_err(|e| format!("candle could not open CUDA device {ordinal}: {e}"))
}

/// Waits until all GPU work queued on `device`'s GPU by any thread is done (the CUDA context's
/// synchronize); nothing on the CPU. What the caller's thread does between two steps (reads,
/// checks, saves, assigned values) is ordered this way against the replicas' threads.
pub(crate) fn settle(device: &Device) -> Result<(), crate::Error> {
    if let Device::Cuda(cuda) = device {
        cuda.cuda_stream()
            .context()
            .synchronize()
            .map_err(candle_core::Error::wrap)?;
    }
    Ok(())
}

/// The GPU work a replica's thread has queued on its device by the end of a step: the caller's
/// thread makes its own stream wait for it (the host does not wait), so that what the caller
/// then does with the step's results (reads, frees) follows the step on the GPU.
pub(crate) struct StepDone(Option<candle_core::cuda_backend::cudarc::driver::CudaEvent>);

impl StepDone {
    /// Marks what the calling thread has queued on `device` so far (nothing on the CPU).
    pub(crate) fn mark(device: &Device) -> Result<StepDone, crate::Error> {
        Ok(StepDone(match device {
            Device::Cuda(cuda) => Some(
                cuda.cuda_stream()
                    .record_event(None)
                    .map_err(candle_core::Error::wrap)?,
            ),
            _ => None,
        }))
    }

    /// Makes the calling thread's stream on `device` wait for the marked work.
    pub(crate) fn order_after(&self, device: &Device) -> Result<(), crate::Error> {
        if let (Some(event), Device::Cuda(cuda)) = (&self.0, device) {
            cuda.cuda_stream()
                .wait(event)
                .map_err(candle_core::Error::wrap)?;
        }
        Ok(())
    }
}
