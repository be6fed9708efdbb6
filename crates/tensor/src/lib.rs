//! Layer 3 of `distribute`: [`Tensor`], a dense array of one [`DType`] placed on a device, in
//! host memory or (feature `cuda`) in one GPU's memory, with what every crate above needs of
//! tensors: [`IndexedSlices`] and [`AnyTensor`], tensors as bytes ([`bytes`]), flat views
//! ([`flat`]), the deterministic element-wise reduction kernels ([`kernel`]), the one hash the
//! workspace agrees through across processes ([`Fnv`]) and [`with_dtype!`], the one dispatch
//! from a [`DType`] to its Rust type.
//!
//! Knows device names (layer 1) and distributed values (layer 2: a tensor is a `Regroup` leaf,
//! a `Nest` leaf and a `VariableValue`); knows nothing about collectives, replicas, strategies,
//! input pipelines or any transport between processes or devices (MPI, NCCL, sockets). GPU
//! memory and the NVRTC kernels live in `cuda` (feature `cuda`); the shared files reach them
//! through one small API that a build without `cuda` provides too (`no_cuda`), so `cfg`
//! appears only on `mod` lines.

mod dtype;
// `with_host!` reaches the modules below by textual scope.
#[macro_use]
mod host;
pub mod bytes;
mod distributed;
mod error;
pub mod flat;
mod fnv;
pub mod kernel;
mod sparse;
mod tensor;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
mod no_cuda;

/// What the shared files need of GPUs, with feature `cuda` and without: GPU storage (`gpu`,
/// which knows nothing of tensors) and the reduction of inputs of which one is on a GPU.
#[cfg(feature = "cuda")]
use cuda::bridge as gpu;
#[cfg(feature = "cuda")]
pub(crate) use cuda::reduce_if_on_gpu;
#[cfg(not(feature = "cuda"))]
use no_cuda as gpu;
#[cfg(not(feature = "cuda"))]
pub(crate) use no_cuda::reduce_if_on_gpu;

pub use dtype::DType;
pub use error::{GpuError, TensorError};
pub use fnv::Fnv;
/// The half-precision element types, as [`with_dtype!`] names them.
pub use half::{bf16, f16};
pub use host::Element;
pub use sparse::{AnyTensor, IndexedSlices};
pub use tensor::{Placement, Tensor};
