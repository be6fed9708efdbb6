//! [`NcclAllReduce`]: how communicators are made (all in this process, or one rank per process
//! from a shared unique id), and the cross-replica side of the backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use distribute_values::{Leaf, Lock, ReduceOp};

use crate::communicator::{self, Communicator};
use crate::member::NcclMember;
use crate::shared::Shared;
use distribute_collectives::backend::reduce_and_deliver;
use distribute_tensor::cuda::Gpu;

use crate::probe::require_nccl;
use distribute_collectives::{
    CollectiveError, CrossDeviceOps, Destinations, GroupConfig, ReplicaCollectives, StepLifecycle,
};
use distribute_tensor::AnyTensor;

/// How replica threads get their communicators.
pub(super) enum Setup {
    /// Made together on construction; replica `r` takes slot `r` (a `take`, which cannot leave
    /// a slot half taken).
    Local(Lock<Vec<Option<Communicator>>>),
    /// Each replica thread joins the world with its rank.
    Ranked {
        id: [u8; NcclAllReduce::UNIQUE_ID_BYTES],
        world: usize,
        first_rank: usize,
    },
}

/// The NCCL backend (TF's `NcclAllReduce`): replica threads reduce GPU tensors with NCCL; values
/// reduced in cross-replica context go through the reduction kernel on the destination GPU, as
/// with [`ReductionToOneDevice`](distribute_collectives::ReductionToOneDevice).
pub struct NcclAllReduce {
    gpus: Vec<usize>,
    setup: Setup,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NcclAllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclAllReduce")
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

impl NcclAllReduce {
    /// The bytes of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`), which every rank of a
    /// communicator must share: what [`NcclAllReduce::new_unique_id`] makes and
    /// [`NcclAllReduce::from_unique_id`] takes.
    pub const UNIQUE_ID_BYTES: usize = communicator::UNIQUE_ID_BYTES;

    /// One replica per GPU of `gpus` (indices), all in this process: the communicators are made
    /// now with `ncclCommInitAll`. NCCL before 2.30 refuses the same GPU twice.
    pub fn new(gpus: &[usize], deadline: Duration) -> Result<NcclAllReduce, CollectiveError> {
        require_nccl()?;
        if gpus.is_empty() {
            return Err(CollectiveError::InvalidArgument(
                "NcclAllReduce needs at least one GPU".into(),
            ));
        }
        let handles = gpus
            .iter()
            .map(|&g| Gpu::open(g)?.with_new_stream())
            .collect::<Result<Vec<_>, _>>()?;
        let communicators = Communicator::init_all(handles, deadline)?
            .into_iter()
            .map(Some)
            .collect();
        Ok(NcclAllReduce::with_setup(
            gpus,
            Setup::Local(Lock::new(communicators)),
            deadline,
        ))
    }

    /// A fresh NCCL unique id, made by the one task (the leader) that hands it to the others.
    pub fn new_unique_id() -> Result<[u8; Self::UNIQUE_ID_BYTES], CollectiveError> {
        require_nccl()?;
        Ok(Communicator::unique_id()?)
    }

    /// This process's replicas in a world of `world` ranks: local replica `r` runs on GPU
    /// `gpus[r]` as rank `first_rank + r`. Every process passes the same `id`; each replica thread
    /// joins when it takes its collectives handle, and the join waits until every rank has.
    ///
    /// Moving the id between processes is not this crate's: `distribute-nccl-exchange` hands it
    /// over TCP from a cluster's leader (its `nccl_all_reduce_for_cluster` then calls this), and
    /// an MPI job broadcasts it.
    pub fn from_unique_id(
        id: [u8; Self::UNIQUE_ID_BYTES],
        world: usize,
        first_rank: usize,
        gpus: &[usize],
        deadline: Duration,
    ) -> Result<NcclAllReduce, CollectiveError> {
        require_nccl()?;
        if gpus.is_empty() || first_rank + gpus.len() > world {
            return Err(CollectiveError::InvalidArgument(format!(
                "ranks {first_rank}..{} do not fit a world of {world}",
                first_rank + gpus.len()
            )));
        }
        for &g in gpus {
            Gpu::open(g)?;
        }
        Ok(NcclAllReduce::with_setup(
            gpus,
            Setup::Ranked {
                id,
                world,
                first_rank,
            },
            deadline,
        ))
    }

    fn with_setup(gpus: &[usize], setup: Setup, deadline: Duration) -> NcclAllReduce {
        NcclAllReduce {
            gpus: gpus.to_vec(),
            setup,
            shared: Arc::new(Shared {
                aborted: AtomicBool::new(false),
                reason: Lock::new(String::new()),
                deadline,
            }),
        }
    }

    /// The NCCL library's version, e.g. 22809 for 2.28.9.
    pub fn nccl_version() -> Result<i32, CollectiveError> {
        require_nccl()?;
        Ok(Communicator::version()?)
    }
}

impl CrossDeviceOps for NcclAllReduce {
    fn name(&self) -> &'static str {
        "NcclAllReduce"
    }

    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        // In cross-replica context one thread holds every value: the communicators belong to
        // the replica threads, so this reduces with the kernel on the first destination's GPU.
        reduce_and_deliver(op, values, destinations, None)
    }

    fn replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError> {
        let shared = &self.shared;
        let Some(&ordinal) = self.gpus.get(replica) else {
            return Err(CollectiveError::InvalidArgument(format!(
                "replica {replica} is out of range for {} replicas",
                self.gpus.len()
            )));
        };
        let comm = match &self.setup {
            Setup::Local(slots) => slots
                .lock()
                .get_mut(replica)
                .and_then(Option::take)
                .ok_or_else(|| {
                    CollectiveError::InvalidArgument(format!(
                        "replica {replica}'s NCCL communicator is already taken: one strategy \
                         per NcclAllReduce"
                    ))
                })?,
            Setup::Ranked {
                id,
                world,
                first_rank,
            } => {
                // Non-blocking: the setup waits for every other rank, which a frozen process
                // never is; it is polled against the deadline instead.
                let gpu = Gpu::open(ordinal)?.with_new_stream()?;
                Communicator::init_rank(gpu, *id, *world, first_rank + replica, shared.deadline)?
            }
        };
        Ok(Box::new(NcclMember {
            replica,
            comm,
            shared: self.shared.clone(),
        }))
    }

    fn num_replicas(&self) -> Option<usize> {
        Some(self.gpus.len())
    }
}

impl StepLifecycle for NcclAllReduce {
    fn abort(&self, reason: &str) {
        *self.shared.reason.lock() = reason.to_owned();
        self.shared.aborted.store(true, Ordering::SeqCst);
    }

    fn reset(&self) {
        self.shared.aborted.store(false, Ordering::SeqCst);
    }
}

/// The NCCL backend for `gpus` (two or more GPU indices of this process), and why it was
/// chosen; or why NCCL could not be used.
pub fn nccl_backend(
    gpus: &[usize],
    config: &GroupConfig,
) -> Result<(Arc<dyn CrossDeviceOps>, String), String> {
    match NcclAllReduce::new(gpus, config.deadline) {
        Ok(ops) => Ok((
            Arc::new(ops),
            format!(
                "NcclAllReduce: {} GPUs of this process and NCCL loads, so replicas reduce with \
                 NCCL",
                gpus.len()
            ),
        )),
        Err(e) => Err(format!("NCCL could not be used: {e}")),
    }
}
