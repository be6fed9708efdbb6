//! [`nccl_all_reduce_for_cluster`]: `distribute-collectives`' NCCL backend across the processes
//! of a cluster, the NCCL unique id handed from the leader to every task by this crate's exchange.

use std::time::Duration;

use distribute_collectives::CollectiveError;
use distribute_device_spec::{ClusterSpec, TaskId};
use distribute_nccl::{NcclAllReduce, require_nccl};

use crate::{ExchangeError, UNIQUE_ID_BYTES, exchange_unique_id, nccl_rank};

// The exchange moves the id as bytes, without NCCL: its length must be the one NCCL takes.
const _: () = assert!(UNIQUE_ID_BYTES == NcclAllReduce::UNIQUE_ID_BYTES);

/// This task's replicas of a multi-process run over `cluster` (chief and workers; every task
/// drives `gpus.len()` GPUs, the same count everywhere): task rank `t` owns NCCL ranks
/// `t·k .. t·k + k`. The leader (chief, else worker 0) makes the NCCL unique id and hands it to
/// the other tasks through [`exchange_unique_id`], waiting at most `deadline` for them; the
/// backend is then [`NcclAllReduce::from_unique_id`].
///
/// The exchange authenticates every task with the cluster key in the environment variable
/// `DISTRIBUTE_CLUSTER_KEY` (hex, at least 16 bytes, e.g. `openssl rand -hex 32`; or a file
/// named by `DISTRIBUTE_CLUSTER_KEY_FILE`), the same on every chief and worker task; a cluster
/// across hosts without one is an [`ExchangeError::Key`]. See
/// [`exchange_unique_id`](crate::exchange_unique_id#security).
pub fn nccl_all_reduce_for_cluster(
    cluster: &ClusterSpec,
    me: TaskId,
    gpus: &[usize],
    deadline: Duration,
) -> Result<NcclAllReduce, ExchangeError> {
    // Before the exchange: a task without NCCL fails at once, not after the others joined.
    require_nccl().map_err(CollectiveError::from)?;
    let task = nccl_rank(cluster, me)?;
    let id = match task.is_leader() {
        true => Some(NcclAllReduce::new_unique_id()?),
        false => None,
    };
    let id = exchange_unique_id(cluster, me, id, deadline)?;
    let k = gpus.len();
    Ok(NcclAllReduce::from_unique_id(
        id,
        task.world_size * k,
        task.rank * k,
        gpus,
        deadline,
    )?)
}
