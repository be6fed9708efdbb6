//! What the shared files (`tensor`) need of GPU storage, with feature `cuda`. `crate::no_cuda` has the same API for builds without it; the crate root names
//! whichever is built `crate::gpu`, so the shared files carry no `cfg`.

use std::sync::Arc;

use super::device::Gpu;
pub(crate) use super::memory::GpuArray;
use crate::{DType, TensorError};

impl GpuArray {
    /// The element type.
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    /// The size of each dimension.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// True when both read the same GPU buffer.
    pub(crate) fn shares_buffer_with(&self, other: &GpuArray) -> bool {
        Arc::ptr_eq(&self.bytes, &other.bytes)
    }

    /// The storage of a copy labelled `device`: shared when `device` names this array's GPU,
    /// copied to the GPU it names, `None` when it names no GPU (the copy goes to the host).
    pub(crate) fn for_device(&self, device: &str) -> Result<Option<GpuArray>, TensorError> {
        Ok(match Gpu::index_of(device)? {
            Some(ordinal) if ordinal == self.ordinal() => Some(self.clone()),
            Some(ordinal) => Some(self.copy_to(&Gpu::open(ordinal)?)?),
            None => None,
        })
    }
}
