//! CUDA replicas (feature `cuda`): a `/gpu:N` replica trains on candle's CUDA device `N`.
//!
//! When every local replica is on a GPU, a replica's gradient buckets stay in its GPU's memory
//! ([`pack_on_gpu`], [`unpack_from_gpu`]): the strategy's collectives reduce them there (NCCL,
//! or the reduction kernels), and candle's stream is ordered against theirs with events. With
//! CPU replicas beside GPU ones, the buckets travel through the host. The initial values still
//! do (docs/candle.md, GPUs).

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DriverError};
use candle_core::cuda_backend::{CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Storage, Tensor};
use distribute_tensor::TensorError;
use distribute_tensor::cuda::{Gpu, GpuArray, current_gpu, driver_error};

use crate::Error;

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
pub(crate) fn settle(device: &Device) -> Result<(), Error> {
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
    pub(crate) fn mark(device: &Device) -> Result<StepDone, Error> {
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
    pub(crate) fn order_after(&self, device: &Device) -> Result<(), Error> {
        if let (Some(event), Device::Cuda(cuda)) = (&self.0, device) {
            cuda.cuda_stream()
                .wait(event)
                .map_err(candle_core::Error::wrap)?;
        }
        Ok(())
    }
}

/// The GPU of candle's CUDA `device` as the tensor crate's handle: the replica thread's own
/// (its stream, set by a strategy whose replica threads own their GPU) when it is that device,
/// else the process-wide handle of the device.
fn bucket_gpu(device: &CudaDevice) -> Result<Gpu, Error> {
    let ordinal = device.cuda_stream().context().ordinal();
    match current_gpu() {
        Some(gpu) if gpu.ordinal() == ordinal => Ok(gpu),
        _ => Ok(Gpu::open(ordinal).map_err(TensorError::from)?),
    }
}

/// The gradients `parts` (each variable's element count and gradient, `None` for zeros) of a
/// replica on candle's CUDA `device`, packed into one bucket of `padded` elements of `dtype` in
/// the memory of that GPU (zeros after the gradients): one device-to-device copy per gradient,
/// nothing through the host. The bucket is a tensor of the tensor crate labelled `label`, whose
/// collectives then reduce it on the GPUs (NCCL, or the reduction kernels); `None` when `device`
/// is no CUDA device.
///
/// Ordering without waiting on the host: the copies run on the bucket GPU's stream after an
/// event marking what the replica's thread queued on candle's stream (the backward pass), and
/// candle's stream then waits for the copies (so candle frees or reuses no gradient before they
/// have read it). Whoever reads the bucket next waits for the copies through the bucket's own
/// event (cudarc's tracking on the tensor crate's streams).
pub(crate) fn pack_on_gpu<'g>(
    dtype: DType,
    parts: impl Iterator<Item = (usize, Option<&'g Tensor>)>,
    padded: usize,
    label: &str,
    device: &Device,
) -> Result<Option<distribute_tensor::Tensor>, Error> {
    let Device::Cuda(cuda) = device else {
        return Ok(None);
    };
    let gpu = bucket_gpu(cuda)?;
    let size = dtype.size_in_bytes();
    let mut bucket = GpuArray::alloc_bytes(&gpu, padded * size).map_err(TensorError::from)?;
    // Contiguous first (a copy on candle's stream where a gradient is not), so that the event
    // below marks every gradient's last write; kept until candle's stream has waited for the
    // bucket's copies, so candle frees none of them while they are read.
    let parts = parts
        .map(|(n, grad)| Ok((n, grad.map(Tensor::contiguous).transpose()?)))
        .collect::<Result<Vec<_>, Error>>()?;
    let candle_stream = cuda.cuda_stream();
    let stream = gpu.stream();
    let wrap = |e: DriverError| Error::from(TensorError::from(driver_error(e)));
    stream
        .wait(&candle_stream.record_event(None).map_err(wrap)?)
        .map_err(wrap)?;
    let mut at = 0;
    for (n, grad) in &parts {
        let n = *n;
        let mut dst = bucket.slice_mut(at * size..(at + n) * size);
        match grad {
            None => stream.memset_zeros(&mut dst).map_err(wrap)?,
            Some(grad) => {
                let (storage, layout) = grad.storage_and_layout();
                let (Storage::Cuda(storage), Some((start, end))) =
                    (&*storage, layout.contiguous_offsets())
                else {
                    return Err(Error::InvalidArgument(format!(
                        "a gradient on {label} is not in the memory of candle's CUDA device"
                    )));
                };
                debug_assert_eq!(end - start, n);
                macro_rules! copy_as {
                    ($ty:ty) => {{
                        let src = storage.as_cuda_slice::<$ty>()?.slice(start..end);
                        // SAFETY: `dst` spans exactly `n` elements of `$ty` (`n * size` bytes),
                        // and every bit pattern of a float is a valid byte.
                        let mut dst = unsafe { dst.transmute_mut::<$ty>(n) }
                            .expect("the bucket's range holds n elements");
                        stream.memcpy_dtod(&src, &mut dst).map_err(wrap)?;
                    }};
                }
                match dtype {
                    DType::F32 => copy_as!(f32),
                    DType::F64 => copy_as!(f64),
                    DType::BF16 => copy_as!(half::bf16),
                    DType::F16 => copy_as!(half::f16),
                    other => unreachable!("supported() refused {other:?}"),
                }
            }
        }
        at += n;
    }
    if padded > at {
        stream
            .memset_zeros(&mut bucket.slice_mut(at * size..padded * size))
            .map_err(wrap)?;
    }
    candle_stream
        .wait(&stream.record_event(None).map_err(wrap)?)
        .map_err(wrap)?;
    drop(parts);
    let array = GpuArray::new(&gpu, to_tensor_dtype(dtype), &[padded], bucket);
    Ok(Some(distribute_tensor::Tensor::from_gpu_array(
        label.into(),
        array,
    )))
}

/// The reduced `bucket` as one candle tensor of `dtype` on candle's CUDA `device`, when both the
/// bucket and the device are on a GPU (`None` otherwise: the bucket came back through the host,
/// as an MPI backend without NCCL returns it). The bucket's memory becomes the candle tensor's
/// when nothing else holds it, else it is copied once on the device; either way candle's stream
/// first waits for the stream that owns the bucket (an event, not the host).
pub(crate) fn unpack_from_gpu(
    bucket: &mut Option<distribute_tensor::Tensor>,
    dtype: DType,
    device: &Device,
) -> Result<Option<Tensor>, Error> {
    let (Device::Cuda(cuda), Some(tensor)) = (device, bucket.as_ref()) else {
        return Ok(None);
    };
    if tensor.placement() == distribute_tensor::Placement::Host {
        return Ok(None);
    }
    let ordinal = cuda.cuda_stream().context().ordinal();
    let len = tensor.num_elements();
    let tensor = bucket.take().expect("checked above");
    let gpu = Gpu::open(ordinal).map_err(TensorError::from)?;
    let array = tensor.gpu_array_on(&gpu)?;
    drop(tensor);
    let candle_stream = cuda.cuda_stream();
    let wrap = |e: DriverError| Error::from(TensorError::from(driver_error(e)));
    macro_rules! take_as {
        ($ty:ty) => {{
            let slice: CudaSlice<$ty> = match Arc::try_unwrap(array.bytes) {
                Ok(bytes) if bytes.len() == len * dtype.size_in_bytes() && len > 0 => {
                    let owner = bytes.stream().clone();
                    // The owning stream first waits for every read and write recorded on the
                    // bucket (the collective's, a peer's copy), then candle's for the owner:
                    // candle's work, and its eventual free, come after all of them.
                    let ptr = bytes.leak();
                    candle_stream.join(&owner).map_err(wrap)?;
                    // SAFETY: `ptr` is a live allocation of `len` elements of `$ty` (its byte
                    // length checked above) on this device, filled by the reduction candle's
                    // stream now waits for, and nothing else holds it (leaked from the sole
                    // holder): candle's slice owns and frees it.
                    unsafe { candle_stream.upgrade_device_ptr::<$ty>(ptr, len) }
                }
                bytes => {
                    let bytes: Arc<CudaSlice<u8>> = match bytes {
                        Ok(sole) => Arc::new(sole),
                        Err(shared) => shared,
                    };
                    // SAFETY: candle allocates `len` elements, all written by the copy below.
                    let mut out =
                        unsafe { candle_stream.alloc::<$ty>(len.max(1)) }.map_err(wrap)?;
                    if len > 0 {
                        // The copy after what filled the bucket (the collective).
                        candle_stream.join(bytes.stream()).map_err(wrap)?;
                        // SAFETY: the bucket holds at least `len` elements of `$ty`.
                        let src = unsafe { bytes.transmute::<$ty>(len) }
                            .expect("the bucket holds its elements");
                        candle_stream
                            .memcpy_dtod(&src, &mut out.slice_mut(..len))
                            .map_err(wrap)?;
                        // candle's context records no read on the bucket: its owner waits
                        // for the copy before it may free or reuse the memory.
                        bytes.stream().join(&candle_stream).map_err(wrap)?;
                    }
                    out
                }
            };
            CudaStorage::wrap_cuda_slice(slice, cuda.clone())
        }};
    }
    let storage = match dtype {
        DType::F32 => take_as!(f32),
        DType::F64 => take_as!(f64),
        DType::BF16 => take_as!(half::bf16),
        DType::F16 => take_as!(half::f16),
        other => unreachable!("pack refused {other:?}"),
    };
    Ok(Some(Tensor::from_storage(
        Storage::Cuda(storage),
        len,
        BackpropOp::none(),
        false,
    )))
}

/// The tensor crate's dtype of a candle float dtype.
fn to_tensor_dtype(dtype: DType) -> distribute_tensor::DType {
    match dtype {
        DType::F32 => distribute_tensor::DType::F32,
        DType::F64 => distribute_tensor::DType::F64,
        DType::BF16 => distribute_tensor::DType::BF16,
        DType::F16 => distribute_tensor::DType::F16,
        other => unreachable!("supported() refused {other:?}"),
    }
}
