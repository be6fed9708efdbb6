//! [`StrategyExtended`]: the object-safe core of a strategy that both contexts call into, and
//! the type-erased `merge_call` arguments and results it moves between replicas.

use std::any::Any;
use std::sync::Arc;

use distribute_collectives::{CrossDeviceOps, Workers};
use distribute_device_spec::LocalDevices;
use distribute_values::{ReplicaDeviceMap, VariableValue};

use crate::StrategyError;

/// Arguments one replica passes to `merge_call`, type-erased for the rendezvous.
pub type MergeArgs = Box<dyn Any + Send>;

/// What replica 0's merge function returned, shared with every replica.
pub type MergeResult = Arc<dyn Any + Send + Sync>;

/// The object-safe core of a strategy, which its contexts call into (TF's `StrategyExtended`).
pub trait StrategyExtended: Send + Sync {
    /// The replicas' devices.
    fn device_map(&self) -> &Arc<ReplicaDeviceMap>;

    /// This process's replicas' devices, parsed once and typed (kind, index), in replica order:
    /// what adapters read instead of parsing device names again.
    fn local_devices(&self) -> &LocalDevices;

    /// The number of replicas this process runs (its device map's).
    fn num_replicas(&self) -> usize {
        self.device_map().num_replicas()
    }

    /// How values move between the devices.
    fn cross_device_ops(&self) -> &dyn CrossDeviceOps;

    /// The host CPU device, where `Strategy::reduce` delivers.
    fn host_device(&self) -> &str;

    /// The worker processes of this job, through the one cross-worker seam: `None` in one
    /// process (and for every in-process strategy). Checkpoints, variables' initial values,
    /// sync-on-read aggregates and input pipelines reach the other workers through it.
    fn workers(&self) -> Option<&dyn Workers> {
        None
    }

    /// The `merge_call` rendezvous: `replica` deposits `args` and waits for every replica; replica
    /// 0 then calls its `merge` with every replica's arguments in replica order, and every replica
    /// gets the result. Fails (never hangs) when replicas make different numbers of calls or one
    /// of them fails.
    fn merge(
        &self,
        replica: usize,
        args: MergeArgs,
        merge: &mut dyn FnMut(Vec<MergeArgs>) -> Result<MergeResult, StrategyError>,
    ) -> Result<MergeResult, StrategyError>;
}

/// Who this process is in the job, derived from [`StrategyExtended::workers`] alone, so no
/// strategy can answer one of these differently from its workers: in one process (no workers)
/// one worker with every replica, the chief.
impl dyn StrategyExtended + '_ {
    /// This process's worker index (0 is the chief; 0 in one process).
    pub fn worker_index(&self) -> usize {
        self.workers().map_or(0, |w| w.rank())
    }

    /// The number of worker processes (1 in one process).
    pub fn num_workers(&self) -> usize {
        self.workers().map_or(1, |w| w.size())
    }

    /// The number of replicas that run each step together: every replica of every worker (as
    /// [`num_replicas`](StrategyExtended::num_replicas) in one process): what
    /// `num_replicas_in_sync` says.
    pub fn total_replicas(&self) -> usize {
        self.num_replicas() * self.num_workers()
    }

    /// The global id of this process's first replica: 0 in one process; `w·R` on worker `w` of
    /// a multi-worker run with R replicas per worker.
    pub fn first_replica_id(&self) -> usize {
        self.num_replicas() * self.worker_index()
    }

    /// Whether this process is the chief (worker 0), which writes checkpoints and summaries:
    /// always in one process.
    pub fn is_chief(&self) -> bool {
        self.worker_index() == 0
    }

    /// Whether this process initializes variables (TF's `experimental_should_init`): every
    /// process does (across workers the chief's initial values then reach all).
    pub fn should_init(&self) -> bool {
        true
    }

    /// Whether this process writes checkpoints (TF's `should_checkpoint`): the chief.
    pub fn should_checkpoint(&self) -> bool {
        self.is_chief()
    }

    /// Whether this process writes summaries (TF's `should_save_summary`): the chief.
    pub fn should_save_summary(&self) -> bool {
        self.is_chief()
    }

    /// Whether each worker runs its own copy of the program (TF's
    /// `experimental_between_graph`): with workers; not in one process, whose program drives
    /// every replica.
    pub fn between_graph(&self) -> bool {
        self.workers().is_some()
    }
}

/// The initial value variable `name` starts with: `initial` in one process; the chief's
/// (worker 0's) `initial` on every worker of a multi-worker run, so every worker starts
/// identical even when their initialisers differ. Every worker must call it for the same
/// variables in the same order (`Strategy::create_variable` and
/// `ReplicaContext::create_variable` do).
///
/// Errors: across workers, a value type without [`VariableValue::to_wire`], or a chief's value
/// of another dtype or shape than this worker's.
pub fn initial_value_from_chief<T: VariableValue>(
    extended: &dyn StrategyExtended,
    name: &str,
    initial: T,
) -> Result<T, StrategyError> {
    if extended.total_replicas() == extended.num_replicas() {
        return Ok(initial);
    }
    let bytes = initial.to_wire().ok_or_else(|| {
        StrategyError::InvalidArgument(format!(
            "variable {name}: its value type cannot be sent to the other workers (it has no \
             VariableValue::to_wire); use tensors or numbers"
        ))
    })?;
    let Some(workers) = extended.workers() else {
        return Ok(initial);
    };
    let chiefs = workers.bytes_from_chief(&bytes)?;
    initial.like_from_wire(&chiefs).ok_or_else(|| {
        StrategyError::InvalidArgument(format!(
            "variable {name}: the chief's initial value does not fit this worker's (another \
             dtype or shape)"
        ))
    })
}
