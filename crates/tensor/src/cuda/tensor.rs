//! Tensors and GPU memory: the `Tensor` methods that need feature `cuda`.

use std::sync::Arc;

use super::device::Gpu;
use super::memory::GpuArray;
use crate::tensor::Storage;
use crate::{Tensor, TensorError};

impl Tensor {
    /// A tensor over GPU storage, labelled `device` (for GPU backends: see [`GpuArray`]).
    pub fn from_gpu_array(device: Arc<str>, array: GpuArray) -> Tensor {
        Tensor {
            storage: Storage::Gpu(array),
            device,
        }
    }

    /// The label a copy on `gpu` gets: this tensor's own when it names that GPU, else the GPU's
    /// canonical name.
    pub fn gpu_label(&self, gpu: &Gpu) -> Arc<str> {
        match Gpu::index_of(&self.device) {
            Ok(Some(ordinal)) if ordinal == gpu.ordinal() => self.device.clone(),
            _ => gpu.device_name().into(),
        }
    }

    /// The GPU storage on `gpu`'s device: shared if it is there, else copied there (uploaded
    /// from the host, or a peer copy from another GPU).
    pub fn gpu_array_on(&self, gpu: &Gpu) -> Result<GpuArray, TensorError> {
        Ok(match &self.storage {
            Storage::Host(host) => GpuArray::upload(host, gpu)?,
            Storage::Gpu(array) => array.copy_to(gpu)?,
        })
    }

    /// The tensor in the memory of `gpu` (feature `cuda`): uploaded from the host, copied from
    /// another GPU, or shared when it is already there. It keeps its label when that names `gpu`,
    /// else takes the GPU's canonical name. Input batches upload faster through a
    /// [`PinnedUploader`](crate::cuda::PinnedUploader).
    pub fn to_gpu(&self, gpu: &Gpu) -> Result<Tensor, TensorError> {
        Ok(Tensor::from_gpu_array(
            self.gpu_label(gpu),
            self.gpu_array_on(gpu)?,
        ))
    }
}
