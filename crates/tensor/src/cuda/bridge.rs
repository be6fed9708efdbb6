//! What the shared files (`tensor`, `kernel`, `cross_replica`) need of GPUs, with feature
//! `cuda`. `crate::no_cuda` has the same API for builds without it; the crate root names
//! whichever is built `crate::gpu`, so the shared files carry no `cfg`.

use std::sync::Arc;

use distribute_values::ReduceOp;

use super::device::Gpu;
use super::kernels::reduce_on_gpu;
pub(crate) use super::memory::GpuArray;
use crate::{DType, Placement, Tensor, TensorError};

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

/// The reduction of `inputs` when one of them is in GPU memory, on a GPU (placed on `device`, or
/// in host memory when `device` names no GPU); `None` when every input is in host memory.
pub(crate) fn reduce_if_on_gpu(
    op: ReduceOp,
    inputs: &[&Tensor],
    device: &str,
    divisor: usize,
) -> Result<Option<Tensor>, TensorError> {
    let Some(gpu) = gpu_for_reduction(inputs, device)? else {
        return Ok(None);
    };
    let array = reduce_on_gpu(op, inputs, &gpu, divisor)?;
    let reduced = Tensor::from_gpu_array(device.into(), array);
    // The reduction ran on a GPU because an input lives there; a destination that names no
    // GPU gets the result in host memory.
    match Gpu::index_of(device)? {
        Some(_) => Ok(Some(reduced)),
        None => reduced.to_host().map(Some),
    }
}

/// The GPU a reduction runs on: none when every input is in host memory (host data is never
/// uploaded implicitly); else the GPU `device` names, or the first GPU input's.
fn gpu_for_reduction(inputs: &[&Tensor], device: &str) -> Result<Option<Gpu>, TensorError> {
    let first_gpu = inputs.iter().find_map(|t| match t.placement() {
        Placement::Cuda { ordinal } => Some(ordinal),
        _ => None,
    });
    let Some(first_gpu) = first_gpu else {
        return Ok(None);
    };
    let ordinal = Gpu::index_of(device)?.unwrap_or(first_gpu);
    Ok(Some(Gpu::open(ordinal)?))
}
