//! [`NcclRank`]: a task's place among the NCCL ranks of a multi-process run. The chief and the
//! workers are ranks, numbered as [`ClusterSpec::id_in_cluster`] numbers them; parameter servers
//! and evaluators are none.

use crate::ExchangeError;
use distribute_device_spec::{ClusterSpec, TaskId, TaskType};

/// A task's place in the NCCL communicator of a multi-process run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclRank {
    /// The task's rank: the chief is 0 and the workers follow it in index order (worker `i` is
    /// rank `i` without a chief), as [`ClusterSpec::id_in_cluster`] numbers them.
    pub rank: usize,
    /// How many ranks there are: the chief and the workers.
    pub world_size: usize,
}

impl NcclRank {
    /// Whether this task leads the unique-id exchange (rank 0: the chief, else worker 0), so it
    /// makes the id with `ncclGetUniqueId` and passes it to
    /// [`exchange_unique_id`](crate::exchange_unique_id).
    pub fn is_leader(&self) -> bool {
        self.rank == 0
    }
}

/// The NCCL rank of task `me` of `cluster` and the number of ranks.
///
/// Fails when `me` is not in the cluster ([`ExchangeError::Device`]) or is a parameter server
/// or an evaluator, which are no ranks ([`ExchangeError::InvalidArgument`]).
pub fn nccl_rank(cluster: &ClusterSpec, me: TaskId) -> Result<NcclRank, ExchangeError> {
    if !matches!(me.task_type, TaskType::Chief | TaskType::Worker) {
        return Err(ExchangeError::InvalidArgument(format!(
            "{me} takes no part in the NCCL unique-id exchange: only the chief and the workers \
             are NCCL ranks"
        )));
    }
    Ok(NcclRank {
        rank: cluster.id_in_cluster(me)?,
        world_size: cluster.worker_count(me.task_type)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ps_and_evaluator_are_no_ranks() {
        let json = r#"{"worker": ["w0:1"], "ps": ["p:1"], "evaluator": ["e:1"]}"#;
        let cluster = ClusterSpec::from_json(json).unwrap();
        for task_type in [TaskType::Ps, TaskType::Evaluator] {
            let error = nccl_rank(&cluster, TaskId::new(task_type, 0)).unwrap_err();
            let only = matches!(&error, ExchangeError::InvalidArgument(m) if m.contains("only"));
            assert!(only, "{error}");
        }
    }
}
