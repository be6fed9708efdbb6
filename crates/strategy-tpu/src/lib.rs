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
//! - [`TpuVariable`] ([`TpuStrategy::create_device_variable`]): mirrored and sync-on-read
//!   variables kept as one PJRT buffer per replica. Steps take them as state
//!   ([`TpuFunction::run_updating`], [`TpuFunction::run_steps_updating`]) and their new values
//!   replace the buffers on the devices; reads copy to the host with TF's cross-replica rules.
//! - Input ([`TpuStrategy::input_workers`], the `Strategy::distribute_dataset` override,
//!   [`TpuStrategy::device_batches`]): workers by host, batches on the TPU devices or the host,
//!   a short last batch padded to the compiled shape with a mask, prefetch into device buffers.
//!
//! Why a separate step API: the [`distribute_strategy::ReplicaContext`] that `Strategy::run`
//! hands a step works on concrete host [`distribute_tensor::Tensor`]s, and a Rust closure
//! over them cannot be traced into a program. A compiled step instead manipulates symbolic
//! [`distribute_pjrt::stablehlo::Value`]s, the way a `tf.function` body manipulates symbolic
//! tensors. `Strategy::run` (eager closures over tensors) runs on the host on one thread per
//! replica, so code written for any strategy still runs here: a private
//! [`distribute_mirrored::MirroredStrategy`] over the replicas' device names runs those steps,
//! their `merge_call`s and their contexts' cross-device ops. That is this crate's only use of
//! `distribute-mirrored`, a dependency `docs/architecture.md` allows on purpose.
//!
//! # Reference behaviours not covered
//!
//! Of TPU-01..TPU-28 (tf_behaviors.md, section 5), these have no test, on purpose or for now:
//!
//! - **TPU-16** beyond the out-of-range check, **TPU-17**, **TPU-18**: model parallelism
//!   (variables on logical device 1, `TPU_REPLICATED_CORE` devices, `assign_to_logical_device`,
//!   `split_to_logical_devices`) needs SPMD partitioning, which this strategy does not compile;
//!   an assignment with more than one core per replica is refused as `Unimplemented`.
//! - **TPU-20** is computed ([`replica_order`]) but not applied to input: with one host and
//!   cores in index order it is the identity, the only layout a PJRT client gives here.
//! - **TPU-21**, sparse and ragged elements: the input crate's batches hold dense tensors
//!   only, so such a dataset cannot be built; per-replica replication is refused and tested.
//! - **TPU-26** reads the all-core strategy's MEAN variable on the host and hands the value to
//!   the sub-strategies' steps: a [`TpuVariable`] belongs to one strategy's client, and each
//!   sub-strategy here opens its own, so their steps cannot take its buffers.
//!
//! This crate knows PJRT only through `distribute-pjrt`, and nothing about particular plugins:
//! [`TpuConfig`] asks for all of a plugin's devices or the first N, and `distribute-pjrt` alone
//! knows that the CPU plugin's device count is a client option.
//!
//! Module dependencies run one way: `replicas` (client, devices, names) ← `device_value` ←
//! `variable` ← `function` (with `step_builder`) ← `strategy` ← `input`.

mod device_value;
mod error;
mod function;
mod input;
mod replicas;
mod step_builder;
mod strategy;
pub mod topology;
mod variable;

pub use device_value::{DeviceValue, StepInput};
pub use error::TpuError;
pub use function::TpuFunction;
pub use input::{DeviceBatches, input_workers_for, replica_order};
pub use step_builder::StepBuilder;
pub use strategy::{TpuConfig, TpuStrategy};
pub use topology::{DeviceAssignment, DeviceOrderMode, Topology};
pub use variable::TpuVariable;
