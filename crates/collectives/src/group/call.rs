//! A collective call as the replicas make it: what one replica asks for (`Request`: the
//! operation and its tensors) and the call's name without its data (`CallName`), which every
//! replica must agree on. The last replica to arrive checks that all made the same call with
//! tensors of the same dtypes and shapes before anything is reduced, and names the first that
//! did not.

use std::sync::Arc;

use distribute_values::ReduceOp;

use crate::{CollectiveError, FusionPlan};
use distribute_tensor::Tensor;

/// What one replica asked for.
#[derive(Clone)]
pub(super) enum Request {
    AllReduce(ReduceOp, Tensor),
    /// The tensors, plus their fusion plan: the buckets their results share, and the dtypes and
    /// shapes replicas must agree on.
    BatchAllReduce(ReduceOp, Vec<Tensor>, Arc<FusionPlan>),
    AllGather(Tensor),
    ReduceScatter(ReduceOp, Tensor),
    Broadcast {
        root: usize,
        tensor: Option<Tensor>,
    },
}

impl Request {
    /// The operation, without its data: what every replica must agree on.
    pub(super) fn name(&self) -> CallName {
        match self {
            Request::AllReduce(op, _) => CallName::AllReduce(*op),
            Request::BatchAllReduce(op, _, plan) => CallName::BatchAllReduce(*op, Arc::clone(plan)),
            Request::AllGather(_) => CallName::AllGather,
            Request::ReduceScatter(op, _) => CallName::ReduceScatter(*op),
            Request::Broadcast { root, .. } => CallName::Broadcast { root: *root },
        }
    }

    /// The operation as messages name it.
    fn signature(&self) -> String {
        self.name().signature()
    }

    pub(super) fn tensors(&self) -> &[Tensor] {
        match self {
            Request::AllReduce(_, t) | Request::AllGather(t) | Request::ReduceScatter(_, t) => {
                std::slice::from_ref(t)
            }
            Request::BatchAllReduce(_, buckets, _) => buckets,
            Request::Broadcast { tensor, .. } => tensor.as_slice(),
        }
    }
}

/// A collective call without its data: what every replica must agree on, compared without
/// formatting anything (formatting is for messages only).
#[derive(Clone, PartialEq, Eq)]
pub(super) enum CallName {
    AllReduce(ReduceOp),
    BatchAllReduce(ReduceOp, Arc<FusionPlan>),
    AllGather,
    ReduceScatter(ReduceOp),
    Broadcast { root: usize },
}

impl CallName {
    pub(super) fn signature(&self) -> String {
        match self {
            CallName::AllReduce(op) => format!("all_reduce({op})"),
            CallName::BatchAllReduce(op, plan) => {
                format!("batch_all_reduce({op}, [{}])", plan.describe())
            }
            CallName::AllGather => "all_gather".to_owned(),
            CallName::ReduceScatter(op) => format!("reduce_scatter({op})"),
            CallName::Broadcast { root } => format!("broadcast(root {root})"),
        }
    }
}

fn describe(tensors: &[Tensor]) -> String {
    let parts: Vec<String> = tensors
        .iter()
        .map(|t| format!("{} {:?}", t.dtype(), t.shape()))
        .collect();
    parts.join(", ")
}

/// Every replica must have made the same call, with tensors of the same dtypes and shapes
/// (all-gather allows different first dimensions).
pub(super) fn check_agreement(requests: &[Request], call: u64) -> Result<(), CollectiveError> {
    let first = &requests[0];
    for (replica, request) in requests.iter().enumerate().skip(1) {
        let same_op = first.name() == request.name();
        let same_tensors = same_op
            && match (first, request) {
                (Request::AllGather(a), Request::AllGather(b)) => {
                    a.dtype() == b.dtype()
                        && a.rank() == b.rank()
                        && a.rank() > 0
                        && a.shape()[1..] == b.shape()[1..]
                }
                (Request::Broadcast { .. }, Request::Broadcast { .. }) => true,
                _ => first
                    .tensors()
                    .iter()
                    .zip(request.tensors())
                    .all(|(a, b)| a.dtype() == b.dtype() && a.shape() == b.shape()),
            };
        if !same_tensors {
            let what = |r: &Request| {
                if same_op {
                    describe(r.tensors())
                } else {
                    format!("{} of [{}]", r.signature(), describe(r.tensors()))
                }
            };
            return Err(CollectiveError::ReplicaMismatch {
                op: first.signature(),
                call,
                first_replica: 0,
                first: what(first),
                other_replica: replica,
                other: what(request),
            });
        }
    }
    Ok(())
}
