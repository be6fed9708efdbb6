//! GPU memory, copies and reduction kernels (feature `cuda`), through cudarc with CUDA loaded at
//! run time.
//!
//! Part of layer 3 (collectives): knows devices and tensors, nothing about strategies. Every entry
//! point probes the libraries first ([`gpu_count`], [`nvrtc_available`]): cudarc panics on the first
//! call into a library that is missing, so a machine without a driver, a GPU or NVRTC gets a
//! [`GpuError`](crate::GpuError) saying what to install instead.
//!
//! - [`Gpu`]: one device and one stream. [`Gpu::open`] gives the process-wide handle of a device
//!   (used for cross-replica work); [`Gpu::with_new_stream`] gives a replica thread its own stream.
//! - Tensors move with [`Tensor::to_gpu`](crate::Tensor::to_gpu),
//!   [`Tensor::to_host`](crate::Tensor::to_host) and [`Tensor::copy_to`](crate::Tensor::copy_to);
//!   [`PinnedUploader`] stages input batches in page-locked memory so uploads run asynchronously.
//! - A replica thread's GPU is thread-local, as CUDA's current device is: a strategy calls
//!   [`set_current_gpu`] on each replica thread; a step reads it with [`current_gpu`] and moves its
//!   input there with [`to_current_gpu`].
//! - [`kernel_source`] is the CUDA C of the reduction kernels, compiled once per architecture with
//!   NVRTC, to PTX for checks ([`compile_reduction_kernels`]) and to a CUBIN for the GPU at hand
//!   ([`compile_reduction_cubin`]); they fold inputs in replica order exactly as the host
//!   kernel does, so GPU and CPU reductions give the same bits.

pub(crate) mod bridge;
mod current;
mod device;
mod kernels;
mod memory;
mod nvrtc;
mod probe;
mod tensor;
mod upload;

pub use current::{current_gpu, set_current_gpu, to_current_gpu};
pub use device::{Gpu, driver_error};
pub(crate) use kernels::reduce_if_on_gpu;
pub use kernels::{compile_reduction_cubin, compile_reduction_kernels, kernel_source};
pub use memory::GpuArray;
pub use probe::{gpu_count, library_present, nvrtc_available, require_nvrtc};
pub use upload::PinnedUploader;
