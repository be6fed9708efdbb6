//! Buffers kept identical after each step: the variables whose [`VarPolicy`] is `Mean` or
//! `FirstReplica`, all-reduced in one bucket per dtype (name order), as gradients are.

use candle_core::{Device, Tensor, Var};
use distribute_strategy::ReplicaContext;
use distribute_values::ReduceOp;

use crate::policy::VarPolicy;
use crate::variables::VarInfo;
use crate::{Error, gradients};

/// Sets this replica's copy of every `Mean` buffer to the mean over all replicas and workers,
/// and of every `FirstReplica` buffer to global replica 0's. Every replica calls it after its
/// step; with one replica in sync there is nothing to do.
pub(crate) fn synchronize(
    ctx: &ReplicaContext<'_>,
    manifest: &[VarInfo],
    policies: &[VarPolicy],
    vars: &[Var],
    device: &Device,
    kept: &mut gradients::Buckets,
) -> Result<(), Error> {
    if ctx.num_replicas_in_sync() == 1 {
        return Ok(());
    }
    // Replica 0's value is the sum of its value and every other replica's zeros: exact.
    for (kind, op) in [
        (VarPolicy::Mean, ReduceOp::Mean),
        (VarPolicy::FirstReplica, ReduceOp::Sum),
    ] {
        let chosen: Vec<usize> = (0..policies.len())
            .filter(|&i| policies[i] == kind)
            .collect();
        if chosen.is_empty() {
            continue;
        }
        let sub: Vec<VarInfo> = chosen.iter().map(|&i| manifest[i].clone()).collect();
        let contributes = kind == VarPolicy::Mean || ctx.replica_id() == 0;
        let values: Vec<Option<Tensor>> = chosen
            .iter()
            .map(|&i| contributes.then(|| vars[i].as_tensor().clone()))
            .collect();
        let reduced = gradients::all_reduce(ctx, op, &sub, &values, device, kept)?;
        for (&i, value) in chosen.iter().zip(reduced) {
            if let Some(value) = value {
                vars[i].set(&value)?;
            }
        }
    }
    Ok(())
}
