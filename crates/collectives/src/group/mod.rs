//! The in-process group engine: [`CollectiveGroup`], the rendezvous of the N replica threads of
//! one process, and the shared-memory collectives they run through it (all-reduce, all-gather,
//! reduce-scatter, broadcast, batched all-reduce). It is no backend but what backends are built
//! on: the shared-memory and reduction-to-one backends each hold a group (with their
//! [`ReducePlan`]), the MPI backend reduces its local replicas through one before crossing
//! processes, and the NCCL backend takes its settings ([`GroupConfig`]).
//!
//! Each replica thread holds a [`Member`]. A call publishes the replica's tensors (reference-
//! counted clones, so nothing dangles) and waits at a barrier; the last replica to arrive checks
//! that every replica made the same call with the same dtypes and shapes, then either computes
//! the result alone (small tensors: one barrier, no extra hand-offs) or lays out a shared output
//! that the replicas fill in parallel, each claiming the next piece until none is left (large
//! tensors: a second barrier before anyone reads it), so a replica the scheduler holds back
//! delays the others by one piece, not by its whole share. Every replica gets the same result
//! buffer, shared without copying; each element is folded in replica order by exactly one
//! thread, so the bits do not depend on who computed what.
//!
//! Replicas meet at a [`Rendezvous`], so every wait has a deadline; a replica that never arrives,
//! a mismatched call, or a replica that panics (its `Member` is dropped while unwinding) fails
//! the others with an error naming the replicas — never a hang.
//!
//! - this file: [`CollectiveGroup`], its settings ([`GroupConfig`], [`ReducePlan`]) and the
//!   state its replicas share.
//! - `call`: what one replica asks for, and the call's name that every replica must agree on
//!   (checked by the last to arrive, with the tensors' dtypes and shapes).
//! - `plan`: how the last arriver plans an agreed call (as the [`ReducePlan`] says), on the host
//!   or a GPU, into outputs reused from call to call.
//! - `outcome`: what it planned, which every replica reads.
//! - `sliced`: a large reduction's outputs, cut into pieces the replicas claim one at a time,
//!   and the fold that reduces a range of elements in replica order.
//! - `member`: [`Member`], a replica's handle ([`CollectiveGroup::member`]), through which it
//!   makes its calls.

mod call;
mod member;
mod outcome;
mod plan;
mod sliced;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::CollectiveError;
use crate::rendezvous::Rendezvous;
use call::Request;
use distribute_tensor::Tensor;
use distribute_values::Lock;
use outcome::Outcome;

pub use member::Member;

/// Settings of a [`CollectiveGroup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// How long a replica waits for the others at one barrier before the call fails with
    /// `DeadlineExceeded` and the group is aborted.
    pub deadline: Duration,
    /// Who reduces.
    pub plan: ReducePlan,
    /// Batched reductions pack same-dtype tensors into buckets of about this many bytes (0: one
    /// bucket per dtype run), so many small tensors cost one reduction, not one each.
    pub bytes_per_pack: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            deadline: Duration::from_secs(300),
            plan: ReducePlan::Sliced {
                min_bytes: 256 * 1024,
            },
            bytes_per_pack: 4 << 20,
        }
    }
}

/// How a [`CollectiveGroup`] reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReducePlan {
    /// One replica (the last to arrive) reduces everything, then every replica shares the result:
    /// TF's `ReductionToOneDevice` in host memory.
    OneReducer,
    /// Tensors of at least `min_bytes` are split into N slices that the N replicas reduce in
    /// parallel; smaller ones are reduced by one replica, where a second barrier would cost more
    /// than the work.
    Sliced {
        /// The size from which the work is split.
        min_bytes: usize,
    },
}

/// How many of the last outputs a group keeps for reuse.
const SPARES: usize = 4;

struct Shared {
    num_replicas: usize,
    config: GroupConfig,
    rendezvous: Rendezvous,
    /// What each replica published for the current call. This and `outcome` are cleared by
    /// `reset` before the step after a failed one; every other lock of the group guards data
    /// that is whole after any panic (a list of spares).
    slots: Box<[Lock<Option<Request>>]>,
    /// The current call's outcome, set by its last arriver and cleared by the last replica to
    /// read it, so no input or output buffer stays referenced after the call.
    outcome: Lock<Option<Arc<Outcome>>>,
    /// Replicas that have read the current outcome.
    consumed: AtomicUsize,
    /// Collective calls completed, for messages.
    calls: AtomicU64,
    /// The last outputs, each reused by a later call of its dtype and shape once no one holds it
    /// any more: 64 MiB of fresh pages per call would cost more than the reduction, and even a
    /// small output's allocation is a good part of a 4 KiB all-reduce.
    spares: Lock<Vec<Tensor>>,
    /// Which replicas have a live [`Member`]: two handles for one replica (two strategies
    /// sharing a backend) would meet the wrong peers and silently mix their sums.
    claimed: Box<[AtomicBool]>,
}

/// The rendezvous of a fixed number of replica threads in one process. Cheap to clone; all
/// clones are the same group.
///
/// ```
/// use distribute_collectives::backend::CollectiveGroup;
/// use distribute_collectives::GroupConfig;
/// use distribute_tensor::Tensor;
/// use distribute_values::ReduceOp;
///
/// let group = CollectiveGroup::new(2, GroupConfig::default())?;
/// let sums: Vec<Tensor> = std::thread::scope(|s| {
///     let handles: Vec<_> = (0..2)
///         .map(|r| {
///             let member = group.member(r).unwrap();
///             s.spawn(move || {
///                 let t = Tensor::from_vec(&format!("/cpu:{r}"), &[2], vec![1.0f32, r as f32])?;
///                 member.all_reduce(ReduceOp::Sum, &t)
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
/// });
/// assert_eq!(sums[0].to_vec::<f32>()?, [2.0, 1.0]);
/// assert_eq!(sums[1].device(), "/cpu:1");
/// assert!(sums[0].shares_buffer_with(&sums[1]));
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
#[derive(Clone)]
pub struct CollectiveGroup {
    shared: Arc<Shared>,
}

impl fmt::Debug for CollectiveGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectiveGroup")
            .field("num_replicas", &self.shared.num_replicas)
            .field("config", &self.shared.config)
            .field("aborted", &self.shared.rendezvous.is_aborted())
            .finish()
    }
}

impl CollectiveGroup {
    /// A group of `num_replicas` replicas (at least 1).
    pub fn new(num_replicas: usize, config: GroupConfig) -> Result<Self, CollectiveError> {
        if num_replicas == 0 {
            return Err(CollectiveError::InvalidArgument(
                "a collective group needs at least one replica".into(),
            ));
        }
        Ok(CollectiveGroup {
            shared: Arc::new(Shared {
                num_replicas,
                config,
                rendezvous: Rendezvous::new(num_replicas, config.deadline)?,
                slots: (0..num_replicas).map(|_| Lock::new(None)).collect(),
                outcome: Lock::new(None),
                consumed: AtomicUsize::new(0),
                calls: AtomicU64::new(0),
                spares: Lock::new(Vec::with_capacity(SPARES)),
                claimed: (0..num_replicas).map(|_| AtomicBool::new(false)).collect(),
            }),
        })
    }

    /// The number of replicas.
    pub fn num_replicas(&self) -> usize {
        self.shared.num_replicas
    }

    /// The settings.
    pub fn config(&self) -> GroupConfig {
        self.shared.config
    }

    /// Fails every current and future call with `reason` until [`CollectiveGroup::reset`].
    pub fn abort(&self, reason: impl Into<String>) {
        self.shared.rendezvous.abort(reason);
    }

    /// Why the group was aborted, if it was.
    pub fn abort_reason(&self) -> Option<String> {
        self.shared.rendezvous.abort_reason()
    }

    /// The barrier the replicas meet at, for marking the start and end of their steps.
    pub fn rendezvous(&self) -> &Rendezvous {
        &self.shared.rendezvous
    }

    /// Makes an aborted group usable again. Call it only when no replica is inside a call (a
    /// strategy does, after every replica thread has finished its step).
    pub fn reset(&self) {
        let shared = &self.shared;
        for slot in shared.slots.iter() {
            slot.lock().take();
        }
        shared.outcome.lock().take();
        shared.consumed.store(0, Ordering::SeqCst);
        shared.rendezvous.reset();
    }
}

/// What the files' tests share: a step run on every replica's thread, and inputs whose sums show
/// the order they were folded in.
#[cfg(test)]
mod testing {
    use super::{CollectiveGroup, Member};
    use distribute_tensor::Tensor;

    pub(super) fn run_on<T: Send>(
        group: &CollectiveGroup,
        step: impl Fn(&Member) -> T + Sync,
    ) -> Vec<T> {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..group.num_replicas())
                .map(|r| {
                    let member = group.member(r).unwrap();
                    let step = &step;
                    s.spawn(move || step(&member))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Values whose sums round differently in different orders.
    pub(super) fn input(r: usize, len: usize) -> Tensor {
        let data: Vec<f32> = (0..len)
            .map(|i| ((i * 31 + r * 7) as f32).sin() * 10f32.powi((i % 7) as i32 - 3))
            .collect();
        Tensor::from_vec(&format!("/cpu:{r}"), &[len], data).unwrap()
    }

    pub(super) fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }
}
