//! A build without feature `cuda`: no tensor is in GPU memory. The same API as `cuda::bridge`
//! (the crate root names whichever is built `crate::gpu`), with a GPU buffer type that has no
//! values, so the shared files' `match` arms on GPU storage need no `cfg` and compile away.

use distribute_values::ReduceOp;

use crate::host::HostArray;
use crate::{DType, GpuError, TensorError};

/// GPU storage, of which a build without `cuda` has none.
#[derive(Clone)]
pub(crate) enum GpuArray {}

impl GpuArray {
    pub(crate) fn dtype(&self) -> DType {
        match *self {}
    }

    pub(crate) fn shape(&self) -> &[usize] {
        match *self {}
    }

    pub(crate) fn ordinal(&self) -> usize {
        match *self {}
    }

    pub(crate) fn download(&self) -> Result<HostArray, GpuError> {
        match *self {}
    }

    pub(crate) fn shares_buffer_with(&self, _other: &GpuArray) -> bool {
        match *self {}
    }

    pub(crate) fn for_device(&self, _device: &str) -> Result<Option<GpuArray>, TensorError> {
        match *self {}
    }
}

/// Every input is in host memory, so no reduction runs on a GPU. Generic over the input type
/// (a [`Tensor`](crate::Tensor)), so this file needs nothing of the tensor's own file.
pub(crate) fn reduce_if_on_gpu<T>(
    _op: ReduceOp,
    _inputs: &[&T],
    _device: &str,
    _divisor: usize,
) -> Result<Option<T>, TensorError> {
    Ok(None)
}
