//! A replica thread's GPU: set once on the thread (as `cudaSetDevice` is), read by the step, and
//! the thread's pinned uploader for its input batches.

use std::cell::RefCell;

use super::device::Gpu;
use super::upload::PinnedUploader;
use crate::{GpuError, Tensor, TensorError};

thread_local! {
    /// The GPU of a replica thread, with its uploader (see [`set_current_gpu`]).
    static CURRENT: RefCell<Option<(Gpu, PinnedUploader)>> = const { RefCell::new(None) };
}

/// Makes `gpu` the calling thread's GPU, as `cudaSetDevice` does for CUDA's runtime: binds its
/// context to the thread and keeps the handle for [`current_gpu`]. A strategy calls this on each
/// replica thread of a GPU device, with a stream of the replica's own.
pub fn set_current_gpu(gpu: Gpu) -> Result<(), GpuError> {
    gpu.bind_to_thread()?;
    let uploader = PinnedUploader::new(&gpu);
    CURRENT.with(|current| *current.borrow_mut() = Some((gpu, uploader)));
    Ok(())
}

/// The calling thread's GPU (a replica thread's device and stream), if it has one.
pub fn current_gpu() -> Option<Gpu> {
    CURRENT.with(|current| current.borrow().as_ref().map(|(gpu, _)| gpu.clone()))
}

/// `tensor` in the memory of the calling thread's GPU, uploaded through the thread's pinned
/// staging buffer; `tensor` unchanged on a thread without a GPU (a CPU replica). The way a step
/// moves its input batch to its replica's device.
pub fn to_current_gpu(tensor: &Tensor) -> Result<Tensor, TensorError> {
    CURRENT.with(|current| match current.borrow_mut().as_mut() {
        Some((_, uploader)) => uploader.upload(tensor),
        None => Ok(tensor.clone()),
    })
}
