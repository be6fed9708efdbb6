//! [`Gpu`]: a CUDA device and the stream work on it is queued to.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};
use distribute_device_spec::{DeviceKind, DeviceSpec};
use distribute_values::Lock;

use super::probe::gpu_count;
use crate::{GpuError, TensorError};

/// A driver error as the crate's [`GpuError`].
pub fn driver_error(e: DriverError) -> GpuError {
    GpuError::Driver(format!("{e:?}"))
}

/// One GPU and one stream on it. Cloning shares both.
///
/// [`Gpu::open`] returns the process-wide handle of a device (its context is the driver's primary
/// context, shared by every handle of the device); [`Gpu::with_new_stream`] makes a handle with its
/// own stream, which is what each replica thread of a strategy owns, so replicas never queue
/// behind one another.
#[derive(Clone)]
pub struct Gpu {
    stream: Arc<CudaStream>,
}

impl Gpu {
    /// The shared handle of GPU `ordinal`; fails with what to install when there is no driver,
    /// and with [`GpuError::NoSuchGpu`] past the last GPU.
    ///
    /// The first open of a device makes its memory pool keep what is freed rather than return it
    /// to the driver at each synchronize, as TensorFlow's and PyTorch's allocators keep theirs.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        // A GPU goes in once opened: a panic while opening one leaves the list as it was.
        static OPENED: Lock<Vec<Option<Gpu>>> = Lock::new(Vec::new());
        let count = gpu_count()?;
        if ordinal >= count {
            return Err(GpuError::NoSuchGpu { ordinal, count });
        }
        let mut opened = OPENED.lock();
        if opened.len() <= ordinal {
            opened.resize(ordinal + 1, None);
        }
        if let Some(gpu) = &opened[ordinal] {
            return Ok(gpu.clone());
        }
        let context = CudaContext::new(ordinal).map_err(driver_error)?;
        keep_freed_memory(&context)?;
        let gpu = Gpu {
            stream: context.new_stream().map_err(driver_error)?,
        };
        opened[ordinal] = Some(gpu.clone());
        Ok(gpu)
    }

    /// The GPU a device name points at: `Some(index)` for `/gpu:N` or `…/device:GPU:N`, `None`
    /// for any other device.
    pub fn index_of(device: &str) -> Result<Option<usize>, TensorError> {
        let spec: DeviceSpec = device.parse()?;
        Ok(match (spec.device_kind(), spec.device_index()) {
            (Some(DeviceKind::Gpu), Some(index)) => Some(index as usize),
            _ => None,
        })
    }

    /// The same GPU with a stream of its own (a replica thread's).
    pub fn with_new_stream(&self) -> Result<Gpu, GpuError> {
        Ok(Gpu {
            stream: self.stream.context().new_stream().map_err(driver_error)?,
        })
    }

    /// The device index.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The canonical device name, `/job:localhost/replica:0/task:0/device:GPU:N`.
    pub fn device_name(&self) -> String {
        format!(
            "/job:localhost/replica:0/task:0/device:GPU:{}",
            self.ordinal()
        )
    }

    /// The product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(&self) -> Result<String, GpuError> {
        self.stream.context().name().map_err(driver_error)
    }

    /// The compute capability, e.g. `(9, 0)` for Hopper.
    pub fn compute_capability(&self) -> Result<(i32, i32), GpuError> {
        self.stream
            .context()
            .compute_capability()
            .map_err(driver_error)
    }

    /// The stream work is queued to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// Makes this GPU's context current on the calling thread (raw driver and NCCL calls use the
    /// current context; cudarc's own calls bind it themselves).
    pub fn bind_to_thread(&self) -> Result<(), GpuError> {
        self.stream.context().bind_to_thread().map_err(driver_error)
    }

    /// Waits until everything queued on this handle's stream has run.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().map_err(driver_error)
    }
}

/// Makes the device's current memory pool (where cudarc's stream-ordered allocations come from)
/// keep the memory freed into it instead of returning it to the driver at every synchronize (its
/// release threshold, 0 by default, becomes unlimited). Every reduction allocates its output and
/// frees its inputs' staging: without this, each step maps that memory anew, which costs more
/// than the reduction itself for large tensors. Memory once used stays with the process, for any
/// user of the pool in it (candle's allocations come from the same one).
fn keep_freed_memory(context: &CudaContext) -> Result<(), GpuError> {
    if !context.has_async_alloc() {
        return Ok(());
    }
    context.bind_to_thread().map_err(driver_error)?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and the context's device.
    unsafe { sys::cuDeviceGetMemPool(&mut pool, context.cu_device()) }
        .result()
        .map_err(driver_error)?;
    let mut threshold = u64::MAX;
    // SAFETY: the pool just returned; the release threshold attribute takes a u64.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&raw mut threshold).cast(),
        )
    }
    .result()
    .map_err(driver_error)
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gpu({})", self.ordinal())
    }
}

impl PartialEq for Gpu {
    /// Same device and same stream.
    fn eq(&self, other: &Gpu) -> bool {
        Arc::ptr_eq(&self.stream, &other.stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_point_at_gpus() {
        assert_eq!(Gpu::index_of("/gpu:3").unwrap(), Some(3));
        assert_eq!(
            Gpu::index_of("/job:localhost/replica:0/task:0/device:GPU:1").unwrap(),
            Some(1)
        );
        assert_eq!(Gpu::index_of("/cpu:0").unwrap(), None);
        assert!(Gpu::index_of("/gpu:x").is_err());
    }
}
