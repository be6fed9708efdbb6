//! Layer 8 of `distribute`: [`TpuStrategy`], data parallelism as one XLA program replicated over
//! the devices of a PJRT plugin (TPU cores in production, CPU devices in tests, GPUs with a CUDA
//! plugin), after TF's `TPUStrategy`.
//!
//! - [`topology`]: [`Topology`] and [`DeviceAssignment`] (TF's `tpu/topology.py`,
//!   `tpu/device_assignment.py`), with TF's validation errors.
//! - [`TpuStrategy`]: implements [`distribute_strategy::Strategy`]. Compiled steps go through
//!   [`TpuStrategy::function`]: a step written against [`StepBuilder`] is traced to StableHLO
//!   once per input signature, compiled once with `num_replicas = N` (cached), and launched on
//!   every replica's device; [`StepBuilder::all_reduce`] becomes a cross-replica all-reduce in the
//!   program, and [`TpuFunction::run_steps`] runs k steps in one device-side loop.
//!
//! Why a separate step API: the [`distribute_strategy::ReplicaContext`] that `Strategy::run`
//! hands a step works on concrete host [`distribute_collectives::Tensor`]s, and a Rust closure
//! over them cannot be traced into a program. A compiled step instead manipulates symbolic
//! [`distribute_pjrt::stablehlo::Value`]s, the way a `tf.function` body manipulates symbolic
//! tensors. `Strategy::run` (eager closures over tensors) runs on the host on one thread per
//! replica, as MirroredStrategy does, so code written for any strategy still runs here.
//!
//! This crate knows PJRT only through `distribute-pjrt`, and nothing about particular plugins
//! beyond the CPU plugin's `cpu_device_count` option.

mod error;
mod function;
mod input;
mod strategy;
pub mod topology;
mod variable;

pub use error::TpuError;
pub use function::{DeviceValue, StepBuilder, StepInput, TpuFunction};
pub use input::{DeviceBatches, input_workers_for, replica_order};
pub use strategy::{TpuConfig, TpuStrategy};
pub use topology::{DeviceAssignment, DeviceOrderMode, Topology};
pub use variable::TpuVariable;
