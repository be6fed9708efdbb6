//! Layer 7 of `distribute`: XLA through the PJRT C API, the interface JAX itself uses.
//!
//! A plugin (a `.so` exporting `GetPjrtApi`, shipped in PyPI wheels such as
//! `lammps-jax-pjrt-cpu` or `jax-cuda13-pjrt`) is loaded at run time, so nothing XLA is needed
//! to build. Three thin layers, after cudarc's sys / result / safe split:
//!
//! - `sys`: `#[repr(C)]` argument structs and function-table indices from `pjrt_c_api.h`;
//! - `api`: one checked `unsafe fn` per C function, returning the plugin's message on error;
//! - the safe types [`Client`], [`Device`], [`Buffer`], [`LoadedExecutable`], [`Execution`], which
//!   free what they own.
//!
//! Programs are StableHLO text from [`stablehlo::Builder`], compiled with [`CompileOptions`] for
//! N replicas. [`Plugin::discover`] finds a plugin: `PJRT_PLUGIN`, else the pinned CPU plugin that
//! `cargo xtask fetch-pjrt` installs; a missing plugin is an error that says how to get one.
//! [`Plugin::offer`] says how many devices it has (capped by [`DEVICES_ENV`]) before a client is
//! made for a count it cannot give.
//!
//! Reading a result is the per-step latency a training loop pays, so [`Buffer::to_vec`] reads a
//! buffer that lives in host memory (the CPU plugin's) where it lies, as JAX hands CPU arrays to
//! NumPy, and waits by polling for [`ClientOptions::await_spin`] before it sleeps.
//!
//! ```
//! use distribute_pjrt::stablehlo::{AllReduceOp, Builder, ReplicaGroups, TensorType};
//! use distribute_pjrt::{Client, ClientOptions, ElementType, Plugin};
//!
//! let client = Client::new(Plugin::discover()?, &ClientOptions::cpu(2))?;
//! let mut b = Builder::new();
//! let x = b.parameter(TensorType::new(ElementType::F32, &[2]));
//! let sum = b.all_reduce(&x, AllReduceOp::Sum, &ReplicaGroups::all(2))?;
//! let module = b.build("sum", &[sum], 2)?;
//! let program = client.compile(module.text(), &module.compile_options())?;
//! let devices = client.devices()?;
//! let a = client.buffer_from_host(&[1.0f32, 2.0], &[2], &devices[0])?;
//! let b = client.buffer_from_host(&[10.0f32, 20.0], &[2], &devices[1])?;
//! let outputs = program.execute(&[vec![&a], vec![&b]])?.wait()?;
//! assert_eq!(outputs[1][0].to_vec::<f32>()?, [11.0, 22.0]);
//! # Ok::<(), distribute_pjrt::PjrtError>(())
//! ```
//!
//! This crate knows nothing of strategies, replicas' Rust threads or distributed values: it is a
//! binding and a program builder. `distribute-tpu` builds the strategy on top.

// Poisoned locks are taken as they are (`PoisonError::into_inner`): the workspace's one policy,
// which `distribute_values::Lock` is everywhere else and this leaf crate cannot depend on. Sound
// for each: `Plugin::probing` and a buffer's `in_place_read` guard no data, and the loaded
// plugins and a client's in-flight completions change by one whole entry at a time.
mod api;
mod error;
mod offer;
mod options;
mod plugin;
mod probe;
pub mod protobuf;
mod runtime;
pub mod stablehlo;
mod sys;
mod types;

pub use error::{ErrorCode, PjrtError, Result};
pub use offer::{CPU_PLATFORM, DEVICES_ENV, Offer, Shortfall};
pub use options::CompileOptions;
pub use plugin::{PINNED_PLUGIN_RELATIVE_PATH, PLUGIN_ENV, Plugin, pinned_plugin_path};
pub use probe::parse_cap;
pub use runtime::{
    Buffer, Client, ClientOptions, DEFAULT_AWAIT_SPIN, DEFAULT_MAX_IN_FLIGHT, Device, Execution,
    LoadedExecutable, MAX_IN_FLIGHT, PluginOption,
};
pub use types::{ElementType, NativeType};
