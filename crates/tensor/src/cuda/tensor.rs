//! Tensors and GPU memory: the `Tensor` methods that need feature `cuda`, and host elements as the
//! bytes that uploads and downloads copy.

use std::borrow::Cow;
use std::sync::Arc;

use ndarray::{ArcArray, ArrayD, IxDyn};

use super::device::Gpu;
use super::memory::GpuArray;
use crate::tensor::{HostArray, Storage};
use crate::{DType, Element, Tensor, TensorError};

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

impl HostArray {
    /// The elements' bytes in row-major order, borrowed when the layout is standard.
    pub(crate) fn to_bytes(&self) -> Cow<'_, [u8]> {
        fn bytes<T: Element>(a: &ArcArray<T, IxDyn>) -> Cow<'_, [u8]> {
            match a.as_slice() {
                // SAFETY: every Element is plain old data (numbers, or u16 bit patterns for
                // f16/bf16) without padding, so its memory is valid as bytes.
                Some(s) => Cow::Borrowed(unsafe {
                    std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s))
                }),
                None => {
                    let v: Vec<T> = a.iter().copied().collect();
                    // SAFETY: as above.
                    let b = unsafe {
                        std::slice::from_raw_parts(
                            v.as_ptr().cast::<u8>(),
                            std::mem::size_of_val(&v[..]),
                        )
                    };
                    Cow::Owned(b.to_vec())
                }
            }
        }
        with_host!(self, a => bytes(a))
    }

    /// Elements of `dtype` and `shape` from their bytes in row-major order.
    pub(crate) fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> HostArray {
        fn build<T: Element>(shape: &[usize], bytes: &[u8]) -> HostArray {
            let n = bytes.len() / std::mem::size_of::<T>();
            // The copy below writes exactly `bytes.len()` bytes into `n` elements.
            assert_eq!(
                n * std::mem::size_of::<T>(),
                bytes.len(),
                "whole elements only"
            );
            let mut v = vec![T::zero(); n];
            // SAFETY: `v` holds exactly `bytes.len()` bytes of plain-old-data elements, every bit
            // pattern of which is a valid element.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    v.as_mut_ptr().cast::<u8>(),
                    bytes.len(),
                )
            };
            T::wrap(
                ArrayD::from_shape_vec(shape, v)
                    .expect("byte count matches the shape")
                    .into_shared(),
            )
        }
        with_dtype!(dtype, T => build::<T>(shape, bytes))
    }
}
