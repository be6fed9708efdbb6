//! Layer 2 of `distribute`: the values that flow between replicas.
//!
//! Owns [`ReduceOp`], [`VariableAggregation`], [`VariableSynchronization`],
//! [`ReplicaDeviceMap`], the distributed values [`PerReplica`] and [`Mirrored`] behind
//! [`DistributedValues`], nested structures — walked leaf by leaf with [`Nest`], regrouped
//! across replicas with [`regroup`] / [`select_replica`] / [`select_device_mirrored`] /
//! [`update_regroup`], named from their regrouped side with [`Distributed`], and
//! `#[derive(Nest)]` for users' structs — the distributed variables [`MirroredVariable`] and
//! [`SyncOnReadVariable`], and their checkpoint values. And [`Lock`], the workspace's one mutex
//! policy (a panicking holder poisons nothing), here because every crate with threads depends on
//! this one.
//!
//! Element types are generic. This crate starts no threads and knows nothing about device memory
//! or collectives: device names are opaque strings, reductions of tensors belong to
//! distribute-collectives, and replica vs cross-replica context is the strategy layer's typed
//! context, which calls the explicit `*_local` / `*_cross_replica` methods here.
//!
//! ```
//! use std::sync::Arc;
//! use distribute_values::{regroup, select_replica, Leaf, ReplicaDeviceMap};
//!
//! let map = Arc::new(ReplicaDeviceMap::new(["/device:GPU:0", "/device:GPU:1"])?);
//! // Each replica returned (loss, step); the step is the same everywhere.
//! let grouped = regroup(&map, vec![(0.5, 10), (0.25, 10)])?;
//! assert!(matches!(grouped.0, Leaf::PerReplica(_)));
//! assert_eq!(grouped.1, Leaf::Same(10));
//! assert_eq!(select_replica::<(f64, i32)>(1, &grouped)?, (0.25, 10));
//! # Ok::<(), distribute_values::ValuesError>(())
//! ```
//!
//! # Deliberate departures from TF
//!
//! Some reference behaviours (tf_behaviors.md, section 2) have no test because the port drops
//! them on purpose:
//!
//! - **VAL-21** (`is_tensor_like` false when one component is a Python float): every component
//!   of a `PerReplica<T>` has the one type `T`, so a mixed value cannot be built.
//! - **VAL-24, VAL-25** (attribute and operator forwarding to the local component, copies of
//!   the delegate): Python delegation through `__getattr__` and operator overloads. Here the
//!   component is read explicitly ([`DistributedValues::get`],
//!   [`DistributedValues::read_cross_replica`]) and operated on as a plain `T`.
//! - **VAL-27**, except "inside replica i → component i" (tested as [`DistributedValues::get`]):
//!   there is no implicit conversion of a `PerReplica` to a tensor, so using one where a tensor
//!   is expected, outside a replica or with the wrong dtype, is a compile error rather than a
//!   runtime `InvalidArgument`; references do not exist.
//! - **VAL-28**, the tracing cases (components handed to a traced function without retracing,
//!   flattening inside a replica context): there is no graph mode or `tf.function`.
//! - **VAL-29** (`tf.cond` between two PerReplica values; no type spec for Python sets): there
//!   is no graph-mode conditional; a Rust `if` picks either value, and every `T` is
//!   representable.
//! - The graph-mode half of **VAL-19**: there is no graph mode; the eager behaviour is tested.

// The derive macro names `::distribute_values`, which must resolve inside this crate too.
extern crate self as distribute_values;

mod aggregation;
mod checkpoint;
mod containers;
mod device_map;
mod distributed;
mod element;
mod error;
mod lock;
mod nest;
mod regroup;
mod update;
mod variable;

pub use aggregation::{ReduceOp, SyncKind, VariableAggregation, VariableSynchronization};
pub use checkpoint::SavedValue;
pub use containers::RegroupedOption;
pub use device_map::ReplicaDeviceMap;
pub use distributed::{DistributedValues, Mirrored, PerReplica};
pub use element::VariableValue;
pub use error::{ErrorKind, ValuesError};
pub use lock::Lock;
pub use nest::{LeafMapper, LeafVisitor, LeafZipper, Nest, Path, leaf_as};
pub use regroup::{
    Distributed, Leaf, Regroup, RegroupContext, RegroupOptions, Selection, UpdateGrouping, Wrap,
    regroup, regroup_with, select_device_mirrored, select_replica, select_replica_mirrored,
    update_regroup,
};
pub use update::UpdateOp;
pub use variable::{DistributedVariable, MirroredVariable, SyncOnReadVariable, VariableComponent};

/// `#[derive(Nest)]`: walk, regroup and select a struct field by field, so that it can be a
/// dataset's batch, a step's input and output, and one fused `all_reduce` payload.
///
/// For `struct Name { … }` it declares `NameRegrouped` with the same fields (and visibility),
/// each of the field's regrouped type, deriving `Debug`, `Clone` and `PartialEq`, and implements
/// [`Regroup`] and [`Nest`] for `Name` and [`Distributed`] for `NameRegrouped` (so `run` infers
/// `Name` from a `NameRegrouped` input). Tuple and unit structs work too; generic parameters get
/// a `Regroup` (or `Nest`) bound. With `#[nest(leaf)]` the type is a leaf instead: it regroups
/// to [`Leaf<Self>`], needs `Clone + PartialEq`, and is one leaf of a [`Nest`] walk. Enums can
/// only be leaves: their variants are not regrouped field by field.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup, select_replica, Leaf, Nest, ReplicaDeviceMap};
///
/// #[derive(Debug, Clone, PartialEq, Nest)]
/// #[nest(leaf)]
/// struct Token(u32);
///
/// #[derive(Debug, Clone, PartialEq, Nest)]
/// struct Batch(Vec<Token>, String);
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let xs = vec![Batch(vec![Token(1)], "x".into()), Batch(vec![Token(2)], "x".into())];
/// let grouped: BatchRegrouped = regroup(&map, xs.clone())?;
/// assert_eq!(grouped.1, Leaf::Same("x".to_owned()));
/// assert_eq!(select_replica::<Batch>(0, &grouped)?, xs[0]);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub use distribute_values_derive::Nest;
