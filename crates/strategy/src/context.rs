//! The typed contexts: [`ReplicaContext`], which a step function gets inside one replica, and
//! [`CrossReplicaContext`], which merge functions and code outside `run` get. Cross-replica
//! operations exist only on the second type, so calling one from a replica does not compile.
//!
//! ```compile_fail
//! use distribute_strategy::{DefaultStrategy, Strategy};
//! use distribute_values::ReduceOp;
//!
//! let strategy = DefaultStrategy::new().unwrap();
//! strategy.run(|ctx, ()| {
//!     // A replica context has no `reduce_to`: reduce with `all_reduce`, or in a `merge_call`.
//!     ctx.reduce_to(ReduceOp::Sum, todo!(), todo!())?;
//!     Ok(())
//! }, &());
//! ```
//!
//! Nor can cross-replica code call `merge_call` (it is already in cross-replica context):
//!
//! ```compile_fail,E0599
//! use distribute_strategy::{DefaultStrategy, Strategy};
//!
//! let strategy = DefaultStrategy::new().unwrap();
//! strategy.cross_replica().merge_call((), |_, _| Ok(()));
//! ```
//!
//! Reduce ops and variable aggregations are different types, so passing an aggregation where a
//! reduce op is expected (TF's SM-49 `Invariant` error) does not compile:
//!
//! ```compile_fail,E0308
//! use distribute_tensor::Tensor;
//! use distribute_strategy::{DefaultStrategy, Strategy};
//! use distribute_values::{Leaf, VariableAggregation};
//!
//! let strategy = DefaultStrategy::new().unwrap();
//! let value = Leaf::Same(Tensor::scalar("/cpu:0", 1.0f32));
//! strategy.reduce(VariableAggregation::Sum, &value, None);
//! ```

mod cross_replica;
mod extended;
mod in_step;
mod replica;

pub use cross_replica::{CrossReplicaContext, UpdateContext};
pub use extended::{MergeArgs, MergeResult, StrategyExtended, initial_value_from_chief};
pub use in_step::in_replica_step;
pub(crate) use in_step::refuse_in_replica_step;
pub use replica::ReplicaContext;
