//! The [`Strategy`] trait: what every way of running replicas offers its users.

use std::sync::Arc;

use distribute_collectives::{Destinations, Tensor};
use distribute_values::{
    DistributedValues, DistributedVariable, Leaf, PerReplica, ReduceOp, Regroup, VariableValue,
};

use crate::StrategyError;
use crate::context::{CrossReplicaContext, ReplicaContext, StrategyExtended};
use crate::variables::{VariableOptions, create_distributed_variable};

/// A way to run one step function on N replicas (TF's `tf.distribute.Strategy`).
///
/// `run` hands every replica its part of the inputs and a [`ReplicaContext`]; the results come
/// back regrouped (`PerReplica` where replicas differ). Everything else — reductions, variable
/// creation, cross-replica updates — goes through [`Strategy::cross_replica`].
pub trait Strategy: Send + Sync {
    /// The object-safe core the contexts use.
    fn extended(&self) -> &dyn StrategyExtended;

    /// Runs `step` once on every replica and regroups the results.
    ///
    /// Replica `r` gets `select_replica(r, inputs)`: its own value of every per-replica leaf, and
    /// plain values as they are. If any replica fails or panics, the others are released from
    /// their collectives and `merge_call`s, and the first root-cause error is returned.
    fn run<I, O, F>(&self, step: F, inputs: &I::Regrouped) -> Result<O::Regrouped, StrategyError>
    where
        I: Regroup,
        I::Regrouped: Sync,
        O: Regroup + Send,
        F: Fn(&ReplicaContext<'_>, I) -> Result<O, StrategyError> + Sync;

    /// The number of replicas that run each step.
    fn num_replicas_in_sync(&self) -> usize {
        self.extended().num_replicas()
    }

    /// The cross-replica context: reductions, broadcasts and variable updates outside `run`.
    fn cross_replica(&self) -> CrossReplicaContext<'_> {
        CrossReplicaContext::new(self.extended())
    }

    /// Reduces a result of `run` to one tensor on the host CPU (TF's `strategy.reduce`).
    ///
    /// With an `axis`, each replica's tensor is first reduced along it, so `Mean` is the mean over
    /// every element along that axis on every replica (weighted by how many each replica had),
    /// not the mean of the replicas' means.
    fn reduce(
        &self,
        op: ReduceOp,
        value: &Leaf<Tensor>,
        axis: Option<usize>,
    ) -> Result<Tensor, StrategyError> {
        let cross = self.cross_replica();
        let host = Destinations::device(self.extended().host_device())?;
        let reduced = match (axis, value) {
            (None, value) => cross.reduce_to(op, value, &host)?,
            (Some(axis), Leaf::PerReplica(p)) => {
                // Sum along the axis on each replica, then across replicas; a mean divides by
                // the total length of the axis over all replicas.
                let inner = match op {
                    ReduceOp::Mean => ReduceOp::Sum,
                    other => other,
                };
                let mut count = 0;
                let parts = p
                    .values()
                    .iter()
                    .map(|t| {
                        count += t.shape().get(axis).copied().unwrap_or(0);
                        t.reduce_axis(inner, axis)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let parts =
                    Leaf::PerReplica(PerReplica::new(Arc::clone(p.shared_device_map()), parts)?);
                match (op, cross.reduce_to(inner, &parts, &host)?) {
                    (ReduceOp::Mean, Leaf::Same(total)) => Leaf::Same(total.divided_by(count)?),
                    (_, total) => total,
                }
            }
            (Some(axis), Leaf::Same(t)) => {
                cross.reduce_to(op, &Leaf::Same(t.reduce_axis(op, axis)?), &host)?
            }
            (Some(axis), Leaf::Mirrored(m)) => {
                let copies = m
                    .values()
                    .iter()
                    .map(|t| t.reduce_axis(op, axis))
                    .collect::<Result<Vec<_>, _>>()?;
                let reduced =
                    distribute_values::Mirrored::new(Arc::clone(m.shared_device_map()), copies)?;
                cross.reduce_to(op, &Leaf::Mirrored(reduced), &host)?
            }
        };
        match reduced {
            Leaf::Same(t) => Ok(t),
            // A mirrored mean is returned without communication: take its first copy to the host.
            Leaf::Mirrored(m) => Ok(m
                .into_iter()
                .next()
                .expect("a mirrored value has copies")
                .to_device(self.extended().host_device())),
            Leaf::PerReplica(_) => Err(StrategyError::Invariant(
                "a reduction to one device gave per-replica values".into(),
            )),
        }
    }

    /// Creates a distributed variable on every replica's device (in the strategy's scope, in TF's
    /// terms): mirrored for on-write synchronization, sync-on-read for on-read.
    fn create_variable<T: VariableValue>(
        &self,
        name: &str,
        initial: T,
        options: VariableOptions,
    ) -> Result<DistributedVariable<T>, StrategyError>
    where
        Self: Sized,
    {
        create_distributed_variable(name, self.extended().device_map(), initial, options)
    }

    /// One value per replica from `value_fn(replica_id, num_replicas)` (TF's
    /// `distribute_values_from_function`); always a `PerReplica`, even when the values are equal.
    fn distribute_values_from_function<T>(
        &self,
        value_fn: impl Fn(usize, usize) -> T,
    ) -> Result<PerReplica<T>, StrategyError>
    where
        Self: Sized,
    {
        let n = self.num_replicas_in_sync();
        let values = (0..n).map(|r| value_fn(r, n)).collect();
        Ok(PerReplica::new(
            Arc::clone(self.extended().device_map()),
            values,
        )?)
    }
}
