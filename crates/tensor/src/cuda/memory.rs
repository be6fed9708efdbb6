//! Tensor elements in GPU memory, and the copies between host and GPUs.

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use ndarray::{ArcArray, ArrayD, IxDyn};

use super::device::{Gpu, driver_error};
use crate::host::HostArray;
use crate::{DType, Element, GpuError, with_dtype};

/// The storage of a GPU tensor: its bytes on one GPU, never written after they are filled (every
/// operation makes a new buffer), so clones share them like host tensors share theirs. Part of
/// the backend kit: a GPU backend in another crate (`distribute-nccl`) reads and makes tensors'
/// GPU storage through it.
#[derive(Clone)]
pub struct GpuArray {
    /// The element type.
    pub dtype: DType,
    /// The shape, row-major.
    pub shape: Arc<[usize]>,
    /// The elements' bytes (one byte for an empty array).
    pub bytes: Arc<CudaSlice<u8>>,
    /// The GPU, with the stream that filled `bytes`.
    pub gpu: Gpu,
}

impl GpuArray {
    /// An uninitialised buffer for `shape` elements of `dtype`; the caller fills all of it.
    pub fn alloc(gpu: &Gpu, dtype: DType, shape: &[usize]) -> Result<CudaSlice<u8>, GpuError> {
        GpuArray::alloc_bytes(gpu, shape.iter().product::<usize>() * dtype.size_in_bytes())
    }

    /// An uninitialised buffer of `len` bytes; the caller fills all of it.
    ///
    /// An empty buffer still takes one byte: the driver's handling of zero-byte allocations is
    /// not something to depend on. Sizes are always taken from the shape, never from the buffer.
    pub fn alloc_bytes(gpu: &Gpu, len: usize) -> Result<CudaSlice<u8>, GpuError> {
        // SAFETY: every caller writes the whole logical buffer (a copy, a kernel or a collective)
        // before it is read.
        unsafe { gpu.stream().alloc::<u8>(len.max(1)) }.map_err(driver_error)
    }

    /// The bytes the elements take (the buffer may be one byte longer for an empty array).
    pub fn num_bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }

    /// An array over `bytes`, filled on `gpu`'s stream with `shape` elements of `dtype`.
    pub fn new(gpu: &Gpu, dtype: DType, shape: &[usize], bytes: CudaSlice<u8>) -> GpuArray {
        GpuArray {
            dtype,
            shape: shape.into(),
            bytes: Arc::new(bytes),
            gpu: gpu.clone(),
        }
    }

    /// Host elements copied to `gpu`.
    pub(crate) fn upload(host: &HostArray, gpu: &Gpu) -> Result<GpuArray, GpuError> {
        let src = host.to_bytes();
        let mut bytes = GpuArray::alloc(gpu, host.dtype(), host.shape())?;
        if !src.is_empty() {
            gpu.stream()
                .memcpy_htod(src.as_ref(), &mut bytes)
                .map_err(driver_error)?;
            // The copy reads pageable host memory the caller may free: wait for it.
            gpu.synchronize()?;
        }
        Ok(GpuArray::new(gpu, host.dtype(), host.shape(), bytes))
    }

    /// The elements copied back to host memory.
    pub(crate) fn download(&self) -> Result<HostArray, GpuError> {
        let mut out = vec![0u8; self.num_bytes()];
        if !out.is_empty() {
            let stream = self.gpu.stream();
            stream
                .memcpy_dtoh(&self.bytes.slice(..out.len()), out.as_mut_slice())
                .map_err(driver_error)?;
            stream.synchronize().map_err(driver_error)?;
        }
        Ok(HostArray::from_bytes(self.dtype, &self.shape, &out))
    }

    /// The same elements on `gpu`: shared when it is this array's device, else copied (a peer
    /// copy between GPUs), queued on `gpu`'s stream.
    pub(crate) fn copy_to(&self, gpu: &Gpu) -> Result<GpuArray, GpuError> {
        if gpu.ordinal() == self.gpu.ordinal() {
            return Ok(self.clone());
        }
        let mut bytes = GpuArray::alloc(gpu, self.dtype, &self.shape)?;
        let len = self.num_bytes();
        if len > 0 {
            gpu.stream()
                .memcpy_dtod(&self.bytes.slice(..len), &mut bytes.slice_mut(..len))
                .map_err(driver_error)?;
            // cudarc records the source's read on the source's own stream, which a peer copy
            // queued on `gpu`'s stream does not cover: make the source stream wait for the copy,
            // so the source is not freed (and its memory reused) while the copy still reads it.
            self.bytes
                .stream()
                .join(gpu.stream())
                .map_err(driver_error)?;
        }
        Ok(GpuArray::new(gpu, self.dtype, &self.shape, bytes))
    }

    pub(crate) fn ordinal(&self) -> usize {
        self.gpu.ordinal()
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
