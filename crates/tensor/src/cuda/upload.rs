//! [`PinnedUploader`]: input batches uploaded through page-locked memory.

use cudarc::driver::PinnedHostSlice;

use super::device::{Gpu, driver_error};
use super::memory::GpuArray;
use crate::{Tensor, TensorError};

/// Uploads host tensors through a page-locked staging buffer, the fast path for input batches:
/// the copy from pinned memory runs asynchronously on the GPU's stream, and the staging buffer is
/// reused for the next batch of the same size (writing it waits for the previous copy).
///
/// Owned by one thread (a replica's input feeder).
pub struct PinnedUploader {
    gpu: Gpu,
    staging: Option<PinnedHostSlice<u8>>,
}

impl PinnedUploader {
    /// An uploader to `gpu`'s stream.
    pub fn new(gpu: &Gpu) -> PinnedUploader {
        PinnedUploader {
            gpu: gpu.clone(),
            staging: None,
        }
    }

    /// `tensor` copied to the GPU (labelled as [`Tensor::to_gpu`] labels it). A tensor already
    /// on a GPU is copied or shared as `to_gpu` does.
    pub fn upload(&mut self, tensor: &Tensor) -> Result<Tensor, TensorError> {
        let Some(host) = tensor.host_storage() else {
            return tensor.to_gpu(&self.gpu);
        };
        let src = host.to_bytes();
        let mut bytes = GpuArray::alloc(&self.gpu, host.dtype(), host.shape())?;
        if !src.is_empty() {
            if self.staging.as_ref().is_none_or(|s| s.len() != src.len()) {
                let context = self.gpu.context();
                // SAFETY: the buffer is written in full below before any copy reads it.
                let fresh =
                    unsafe { context.alloc_pinned::<u8>(src.len()) }.map_err(driver_error)?;
                self.staging = Some(fresh);
            }
            let staging = self.staging.as_mut().expect("allocated above");
            // Waits for the previous upload's copy out of this buffer to finish.
            staging
                .as_mut_slice()
                .map_err(driver_error)?
                .copy_from_slice(&src);
            self.gpu
                .stream()
                .memcpy_htod(&*staging, &mut bytes.slice_mut(..src.len()))
                .map_err(driver_error)?;
        }
        let array = GpuArray::new(&self.gpu, host.dtype(), host.shape(), bytes);
        Ok(Tensor::from_gpu_array(tensor.gpu_label(&self.gpu), array))
    }
}
