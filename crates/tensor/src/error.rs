//! The crate's errors: [`TensorError`] for what a tensor operation refuses, [`GpuError`] for GPU
//! work that could not run.

use distribute_device_spec::DeviceSpecError;
use thiserror::Error;

use crate::DType;

/// What a tensor operation refused or could not do.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum TensorError {
    /// A bad argument (TF's `ValueError`); the message says which and what is allowed.
    #[error("{0}")]
    InvalidArgument(String),
    /// A tensor of one dtype where another was required.
    #[error("expected a {expected} tensor, got {actual}")]
    DTypeMismatch {
        /// The dtype required.
        expected: DType,
        /// The dtype given.
        actual: DType,
    },
    /// `Mean` of an integer tensor where no exact float64 path exists (a tensor's own axis
    /// reduction, the NCCL backend); the other reductions give TF's float64 mean.
    #[error("MEAN of {0} tensors is not supported: cast to a floating type, or reduce with SUM")]
    IntegerMean(DType),
    /// An internal invariant did not hold (TF's `assert`): the input is refused, never ignored.
    #[error("invariant violated: {0}")]
    Invariant(String),
    /// Host elements were asked of a tensor that lives in GPU memory.
    #[error(
        "the tensor on {device} lives in GPU memory: copy it to the host first \
         (Tensor::to_host)"
    )]
    OnGpu {
        /// The tensor's device.
        device: String,
    },
    /// A device name that does not parse.
    #[error(transparent)]
    Device(#[from] DeviceSpecError),
    /// GPU work could not run: no driver, no GPU, a missing library, or a failed CUDA call.
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Why GPU work could not run, with what to install where something is missing.
///
/// Availability is probed before the first CUDA call (cudarc panics when a library is missing),
/// so a machine without a driver, a GPU, NVRTC or NCCL gets one of these instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum GpuError {
    /// The CUDA driver library (libcuda.so.1) could not be loaded.
    #[error(
        "no NVIDIA driver: libcuda.so.1 could not be loaded. Install the NVIDIA driver (it \
         provides libcuda.so.1) or add its folder to LD_LIBRARY_PATH"
    )]
    NoDriver,
    /// The driver loaded but reports no GPU (or failed to initialise).
    #[error("the NVIDIA driver found no usable GPU: {0}")]
    NoGpu(String),
    /// A GPU index past the last GPU.
    #[error("GPU {ordinal} does not exist: this machine has {count} GPU(s)")]
    NoSuchGpu {
        /// The index asked for.
        ordinal: usize,
        /// How many GPUs the driver reports.
        count: usize,
    },
    /// NVRTC (the run-time CUDA compiler) could not be loaded.
    #[error(
        "NVRTC could not be loaded (libnvrtc.so.13), so the reduction kernels cannot be \
         compiled. Install the CUDA toolkit or `pip install nvidia-cuda-nvrtc==13.0.88`, and put \
         the folder holding libnvrtc.so.13 on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// A GPU library that a backend loads itself (NCCL, for the NCCL backend of
    /// `distribute-nccl`) could not be loaded; `hint` says what to install or link.
    #[error("{library} could not be loaded: {hint}")]
    MissingLibrary {
        /// The library, e.g. `NCCL`.
        library: &'static str,
        /// What to do: install it, or link the copy that was found.
        hint: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(String),
    /// NVRTC refused the kernel source (the log is included).
    #[error("NVRTC could not compile the reduction kernels: {0}")]
    Compile(String),
    /// A call into such a library failed.
    #[error("{library} call failed: {message}")]
    LibraryCall {
        /// The library, e.g. `NCCL`.
        library: &'static str,
        /// The call and the library's own words.
        message: String,
    },
}
