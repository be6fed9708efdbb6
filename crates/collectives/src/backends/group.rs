//! [`CollectiveGroup`]: the rendezvous of the N replica threads of one process, and the
//! shared-memory collectives they run through it (all-reduce, all-gather, reduce-scatter,
//! broadcast, batched all-reduce).
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

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distribute_values::ReduceOp;
use ndarray::{Array, IxDyn};

use crate::kernel::{self, Arith, ExactInt, Stores};
use crate::rendezvous::{Rendezvous, lock_ignoring_poison as lock};
use crate::tensor::with_dtype;
use crate::{CollectiveError, DType, FusionPlan, ReplicaCollectives, Tensor};

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

/// The outcome of a call where some replica passed a GPU tensor: the last arriver reduces on a
/// GPU (the reduction kernel folds in replica order, as on the host), and every replica copies the
/// result to its own device. Gathers and scatters of GPU tensors are the NCCL backend's.
fn plan_on_gpu(requests: Vec<Request>, n: usize) -> Result<Outcome, CollectiveError> {
    let reduce_bucket = |op: ReduceOp, b: usize| {
        let inputs: Vec<&Tensor> = requests.iter().map(|r| &r.tensors()[b]).collect();
        // On the first GPU input's device, so the result stays in GPU memory: each replica then
        // shares it, copies it to its own GPU, or downloads it for a CPU device.
        let device = inputs
            .iter()
            .find(|t| t.placement() != crate::Placement::Host)
            .unwrap_or(&inputs[0])
            .device();
        kernel::reduce_tensors(op, &inputs, device, n)
    };
    match &requests[0] {
        Request::AllReduce(op, _) => Ok(Outcome::Shared(vec![reduce_bucket(*op, 0)?])),
        Request::BatchAllReduce(op, first, _) => Ok(Outcome::Shared(
            (0..first.len())
                .map(|b| reduce_bucket(*op, b))
                .collect::<Result<_, _>>()?,
        )),
        Request::Broadcast { root, .. } => broadcast_outcome(&requests, *root),
        Request::AllGather(_) | Request::ReduceScatter(..) => Err(CollectiveError::Unimplemented(
            "all_gather and reduce_scatter of GPU tensors need the NCCL backend (feature `nccl`); \
             copy the tensors to the host, or use NcclAllReduce"
                .into(),
        )),
    }
}

/// Every replica gets the root's tensor, wherever it lives.
fn broadcast_outcome(requests: &[Request], root: usize) -> Result<Outcome, CollectiveError> {
    let tensor = requests[root].tensors().first().cloned().ok_or_else(|| {
        CollectiveError::InvalidArgument(format!(
            "broadcast: the root replica {root} passed no tensor"
        ))
    })?;
    Ok(Outcome::Shared(vec![tensor]))
}

/// What one replica asked for.
#[derive(Clone)]
enum Request {
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
    fn name(&self) -> CallName {
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

    fn tensors(&self) -> &[Tensor] {
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
enum CallName {
    AllReduce(ReduceOp),
    BatchAllReduce(ReduceOp, Arc<FusionPlan>),
    AllGather,
    ReduceScatter(ReduceOp),
    Broadcast { root: usize },
}

impl CallName {
    fn signature(&self) -> String {
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

/// The result of a call, computed by the last replica to arrive.
enum Outcome {
    /// Every replica returns these, one entry per tensor of the call.
    Shared(Vec<Tensor>),
    /// Every replica returns this error.
    Failed(CollectiveError),
    /// The replicas reduce the pieces of every output, each claiming the next unclaimed one,
    /// then all wait, then all share the outputs.
    Sliced {
        works: Vec<SlicedWork>,
        pieces: Vec<Piece>,
        /// The next piece to claim.
        next: AtomicUsize,
    },
    /// Each replica reduces its own rows of the inputs.
    Scatter {
        op: ReduceOp,
        inputs: Vec<Tensor>,
        rows_per_replica: usize,
    },
}

/// A shared output that the replicas fill in parallel, one disjoint piece at a time.
struct SlicedWork {
    op: ReduceOp,
    inputs: Vec<Tensor>,
    /// What the replicas get: the output, or (in a batch) this tensor's part of its bucket's
    /// output; either way it keeps the written buffer alive.
    result: Tensor,
    /// Address of the first element written, through which the replicas write.
    output_ptr: usize,
    /// How many elements are written.
    len: usize,
    /// How the output is written: streaming stores when it is larger than the caches.
    stores: Stores,
}

/// Elements `start..end` of output `work`: one replica's unit of work in a sliced reduction.
struct Piece {
    work: usize,
    start: usize,
    end: usize,
}

/// The most output bytes in one piece of a sliced reduction: large enough that claiming a piece
/// (one atomic add) costs nothing beside it, small enough that a replica the scheduler holds
/// back mid-piece delays the others by little.
const PIECE_BYTES: usize = 512 << 10;

/// How many of the last outputs a group keeps for reuse.
const SPARES: usize = 4;

struct Shared {
    num_replicas: usize,
    config: GroupConfig,
    rendezvous: Rendezvous,
    /// What each replica published for the current call.
    slots: Box<[Mutex<Option<Request>>]>,
    /// The current call's outcome, set by its last arriver and cleared by the last replica to
    /// read it, so no input or output buffer stays referenced after the call.
    outcome: Mutex<Option<Arc<Outcome>>>,
    /// Replicas that have read the current outcome.
    consumed: AtomicUsize,
    /// Collective calls completed, for messages.
    calls: AtomicU64,
    /// The last outputs, each reused by a later call of its dtype and shape once no one holds it
    /// any more: 64 MiB of fresh pages per call would cost more than the reduction, and even a
    /// small output's allocation is a good part of a 4 KiB all-reduce.
    spares: Mutex<Vec<Tensor>>,
    /// Which replicas have a live [`Member`]: two handles for one replica (two strategies
    /// sharing a backend) would meet the wrong peers and silently mix their sums.
    claimed: Box<[AtomicBool]>,
}

/// The rendezvous of a fixed number of replica threads in one process. Cheap to clone; all
/// clones are the same group.
///
/// ```
/// use distribute_collectives::backend::CollectiveGroup;
/// use distribute_collectives::{GroupConfig, Tensor};
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
                slots: (0..num_replicas).map(|_| Mutex::new(None)).collect(),
                outcome: Mutex::new(None),
                consumed: AtomicUsize::new(0),
                calls: AtomicU64::new(0),
                spares: Mutex::new(Vec::with_capacity(SPARES)),
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

    /// The handle replica `replica` makes its calls through. If the thread holding it panics,
    /// dropping it aborts the group so the other replicas fail instead of waiting.
    ///
    /// A replica has at most one live handle: asking again while it exists is an error (two
    /// strategies cannot share one backend's replicas).
    pub fn member(&self, replica: usize) -> Result<Member, CollectiveError> {
        if replica >= self.shared.num_replicas {
            return Err(CollectiveError::InvalidArgument(format!(
                "replica {replica} is out of range for a group of {} replicas",
                self.shared.num_replicas
            )));
        }
        if self.shared.claimed[replica].swap(true, Ordering::SeqCst) {
            return Err(CollectiveError::InvalidArgument(format!(
                "replica {replica} of this collective group is already in use: a group (and the \
                 cross-device ops holding it) serves one strategy; build one per strategy"
            )));
        }
        Ok(Member {
            group: self.clone(),
            replica,
        })
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
            lock(slot).take();
        }
        lock(&shared.outcome).take();
        shared.consumed.store(0, Ordering::SeqCst);
        shared.rendezvous.reset();
    }
}

impl Shared {
    /// Runs on the last arriver: checks that every replica made the same call, then plans it.
    fn plan(&self) -> Outcome {
        let requests: Vec<Request> = self
            .slots
            .iter()
            .map(|slot| {
                lock(slot)
                    .take()
                    .expect("every replica published a request")
            })
            .collect();
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if let Err(error) = check_agreement(&requests, call) {
            return Outcome::Failed(error);
        }
        match self.plan_checked(requests) {
            Ok(outcome) => outcome,
            Err(error) => Outcome::Failed(error),
        }
    }

    fn plan_checked(&self, requests: Vec<Request>) -> Result<Outcome, CollectiveError> {
        let n = self.num_replicas;
        if requests.iter().any(|r| {
            r.tensors()
                .iter()
                .any(|t| t.placement() != crate::Placement::Host)
        }) {
            return plan_on_gpu(requests, n);
        }
        match &requests[0] {
            Request::AllReduce(op, first) => {
                let op = *op;
                let dtype = kernel::reduced_dtype(op, first.dtype());
                let bytes = first.num_elements() * dtype.size_in_bytes();
                if !self.splits(bytes) && requests.iter().all(|r| r.tensors()[0].is_contiguous()) {
                    // The common small case: reduced here and now, straight from the requests.
                    let inputs: Vec<&Tensor> = requests.iter().map(|r| &r.tensors()[0]).collect();
                    let (output, ptr) = self.output_buffer(dtype, first.shape(), first);
                    let target = Output {
                        dtype,
                        ptr,
                        stores: Stores::for_output(bytes),
                    };
                    let len = output.num_elements();
                    // SAFETY: `ptr` points at the elements of `output`, just made or taken from
                    // the spares because no one else held it, and no one sees it before the
                    // outcome is published.
                    unsafe { reduce_into(op, &inputs, target, 0, len, n) };
                    return Ok(Outcome::Shared(vec![output]));
                }
                let inputs: Vec<Tensor> = requests
                    .into_iter()
                    .map(|r| match r {
                        Request::AllReduce(_, t) => t,
                        _ => unreachable!("agreement checked"),
                    })
                    .collect();
                let works = vec![self.plan_sliced(op, inputs)?];
                Ok(self.sliced_or_shared(works))
            }
            Request::BatchAllReduce(op, first, plan) => {
                let works = self.plan_batch(*op, first, plan, &requests)?;
                Ok(self.sliced_or_shared(works))
            }
            Request::AllGather(first) => {
                let inputs: Vec<Tensor> = requests.iter().map(|r| r.tensors()[0].clone()).collect();
                Ok(Outcome::Shared(vec![Tensor::concat_rows(
                    first.device(),
                    &inputs,
                )?]))
            }
            Request::ReduceScatter(op, first) => {
                let rows = first.shape().first().copied().unwrap_or(0);
                if first.rank() == 0 || rows % n != 0 {
                    return Err(CollectiveError::InvalidArgument(format!(
                        "reduce_scatter needs a first dimension divisible by the {n} replicas, \
                         got shape {:?}",
                        first.shape()
                    )));
                }
                Ok(Outcome::Scatter {
                    op: *op,
                    inputs: requests.iter().map(|r| r.tensors()[0].clone()).collect(),
                    rows_per_replica: rows / n,
                })
            }
            Request::Broadcast { root, .. } => broadcast_outcome(&requests, *root),
        }
    }

    /// Splits the work among the replicas when it is big enough to pay for the second barrier;
    /// otherwise the last arriver (this thread) does it all now.
    fn sliced_or_shared(&self, works: Vec<SlicedWork>) -> Outcome {
        let bytes: usize = works
            .iter()
            .map(|w| w.len * w.result.dtype().size_in_bytes())
            .sum();
        if self.splits(bytes) {
            let pieces = self.pieces(&works);
            return Outcome::Sliced {
                works,
                pieces,
                next: AtomicUsize::new(0),
            };
        }
        let mut outputs = Vec::with_capacity(works.len());
        for work in works {
            work.reduce_range(0, work.len, self.num_replicas);
            outputs.push(work.result);
        }
        Outcome::Shared(outputs)
    }

    /// Whether outputs of `bytes` bytes in all are reduced by every replica in parallel.
    fn splits(&self, bytes: usize) -> bool {
        matches!(self.config.plan, ReducePlan::Sliced { min_bytes }
            if self.num_replicas > 1 && bytes >= min_bytes)
    }

    /// Cuts the outputs of `works` into pieces of at most [`PIECE_BYTES`], at least one per
    /// replica for each output, each a whole number of cache lines (of the output's elements) so
    /// that two replicas rarely write one line.
    fn pieces(&self, works: &[SlicedWork]) -> Vec<Piece> {
        let mut pieces = Vec::new();
        for (w, work) in works.iter().enumerate() {
            let len = work.len;
            let size = work.result.dtype().size_in_bytes();
            let line = (64 / size).max(1);
            let piece = len
                .div_ceil(self.num_replicas)
                .min(PIECE_BYTES / size)
                .div_ceil(line)
                .max(1)
                * line;
            pieces.extend((0..len).step_by(piece).map(|start| Piece {
                work: w,
                start,
                end: (start + piece).min(len),
            }));
        }
        pieces
    }

    /// Lays out the reduction of `inputs` (one per replica) into one output, reusing a spare
    /// output that no one holds any more.
    fn plan_sliced(
        &self,
        op: ReduceOp,
        inputs: Vec<Tensor>,
    ) -> Result<SlicedWork, CollectiveError> {
        // An integer `Mean` writes float64 (TF's true division).
        let dtype = kernel::reduced_dtype(op, inputs[0].dtype());
        // Strided inputs (transposed views) are made contiguous once, here.
        let inputs: Vec<Tensor> = inputs.into_iter().map(contiguous).collect();
        let (output, output_ptr) = self.output_buffer(dtype, inputs[0].shape(), &inputs[0]);
        let stores = Stores::for_output(output.size_in_bytes());
        Ok(SlicedWork {
            op,
            inputs,
            len: output.num_elements(),
            result: output,
            output_ptr,
            stores,
        })
    }

    /// Lays out a batch: each bucket of `plan` is one output (reused like any other), and each
    /// tensor of the batch is reduced straight from the replicas' tensors into its part of it,
    /// so nothing is packed (copied) first. Every replica gets the parts, shaped as the
    /// tensors they reduce.
    fn plan_batch(
        &self,
        op: ReduceOp,
        first: &[Tensor],
        plan: &FusionPlan,
        requests: &[Request],
    ) -> Result<Vec<SlicedWork>, CollectiveError> {
        let mut works = Vec::with_capacity(first.len());
        for b in 0..plan.num_buckets() {
            let members = plan.members(b).ok_or_else(|| {
                CollectiveError::Invariant(format!("the fusion plan has no bucket {b}"))
            })?;
            let like = &first[members.start];
            let dtype = kernel::reduced_dtype(op, like.dtype());
            let size = dtype.size_in_bytes();
            let total: usize = first[members.clone()]
                .iter()
                .map(Tensor::num_elements)
                .sum();
            let (bucket, ptr) = self.output_buffer(dtype, &[total], like);
            let stores = Stores::for_output(total * size);
            let mut offset = 0;
            for m in members {
                let len = first[m].num_elements();
                let part = crate::flat::reshape(
                    &bucket.slice_rows(offset..offset + len)?,
                    first[m].shape(),
                )?;
                works.push(SlicedWork {
                    op,
                    // Strided inputs (transposed views) are made contiguous once, here.
                    inputs: requests
                        .iter()
                        .map(|r| contiguous(r.tensors()[m].clone()))
                        .collect(),
                    result: part,
                    output_ptr: ptr + offset * size,
                    len,
                    stores,
                });
                offset += len;
            }
        }
        Ok(works)
    }

    /// A writable output of `dtype` shaped and labelled like `like`: a spare of that dtype and
    /// shape that no one else holds, else a new one, which becomes a spare.
    fn output_buffer(&self, dtype: DType, shape: &[usize], like: &Tensor) -> (Tensor, usize) {
        let mut spares = lock(&self.spares);
        let found = spares
            .iter()
            .position(|t| t.dtype() == dtype && t.shape() == shape && t.is_sole_holder());
        let (tensor, ptr) = match found {
            // Taken out so that the spare list does not count as a holder.
            Some(i) => {
                let spare = spares.swap_remove(i);
                with_dtype!(dtype, T => writable::<T>(Some(spare), shape, like))
            }
            None => {
                if spares.len() == SPARES {
                    spares.remove(0);
                }
                with_dtype!(dtype, T => writable::<T>(None, shape, like))
            }
        };
        spares.push(tensor.clone());
        (tensor, ptr)
    }
}

/// A tensor of `shape` labelled like `like` and the address of its elements: `spare`'s buffer
/// when it is held by nothing else, else a new one.
fn writable<T: Arith>(spare: Option<Tensor>, shape: &[usize], like: &Tensor) -> (Tensor, usize) {
    let reusable = spare
        .and_then(|t| t.array::<T>().ok().cloned())
        .filter(|a| a.is_unique() && a.is_standard_layout());
    let mut array =
        reusable.unwrap_or_else(|| Array::from_elem(IxDyn(shape), T::zero()).into_shared());
    // The array is its buffer's only holder, so this does not copy; the buffer stays where it
    // is for as long as the tensor lives.
    let ptr = array.as_mut_ptr() as usize;
    (Tensor::from_shared_like(array, like), ptr)
}

/// The tensor itself if its elements are contiguous, else a contiguous copy.
fn contiguous(tensor: Tensor) -> Tensor {
    fn typed<T: Arith>(tensor: Tensor) -> Tensor {
        let array = tensor.array::<T>().expect("dtype dispatched");
        if array.is_standard_layout() {
            return tensor;
        }
        let owned = array.as_standard_layout().into_owned();
        Tensor::from_shared(tensor.device(), owned.into_shared())
    }
    with_dtype!(tensor.dtype(), T => typed::<T>(tensor))
}

/// Every replica must have made the same call, with tensors of the same dtypes and shapes
/// (all-gather allows different first dimensions).
fn check_agreement(requests: &[Request], call: u64) -> Result<(), CollectiveError> {
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

/// One replica's handle on a [`CollectiveGroup`]: every collective call goes through it.
///
/// All replicas must make the same calls in the same order; each call returns when every
/// replica has made it.
pub struct Member {
    group: CollectiveGroup,
    replica: usize,
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Member(replica {} of {})",
            self.replica,
            self.group.num_replicas()
        )
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.group.shared.claimed[self.replica].store(false, Ordering::SeqCst);
        if std::thread::panicking() {
            self.group
                .abort(format!("replica {} panicked", self.replica));
        }
    }
}

impl Member {
    /// This member's replica id.
    pub fn replica(&self) -> usize {
        self.replica
    }

    /// The group.
    pub fn group(&self) -> &CollectiveGroup {
        &self.group
    }

    /// The element-wise reduction of every replica's `tensor`, shared by all replicas and labelled
    /// with this replica's device. `Mean` divides by the replica count.
    pub fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.call(Request::AllReduce(op, tensor.clone()))?;
        out.swap_remove(0).copy_to_device_of(tensor)
    }

    /// [`Member::all_reduce`] of several tensors in one rendezvous; results in input order,
    /// bitwise equal to reducing them one by one. The results of same-dtype tensors share buckets
    /// of about [`GroupConfig::bytes_per_pack`] bytes (one output each, like a fused all-reduce),
    /// but nothing is packed: each tensor is reduced straight from the replicas' own. A batch of
    /// one tensor is that tensor's [`Member::all_reduce`], so every replica must pass one tensor
    /// then, or every replica more.
    pub fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if tensors.is_empty() {
            return Ok(Vec::new());
        }
        if tensors.len() == 1
            || tensors
                .iter()
                .any(|t| t.placement() != crate::Placement::Host)
        {
            // Packing works on host memory: GPU tensors are reduced one call each.
            return tensors.iter().map(|t| self.all_reduce(op, t)).collect();
        }
        let plan = Arc::new(FusionPlan::new(tensors, self.group.config().bytes_per_pack));
        let reduced = self.call(Request::BatchAllReduce(op, tensors.to_vec(), plan))?;
        if reduced.len() != tensors.len() {
            return Err(CollectiveError::Invariant(format!(
                "{} tensors were all-reduced but {} came back",
                tensors.len(),
                reduced.len()
            )));
        }
        reduced
            .into_iter()
            .zip(tensors)
            .map(|(r, t)| r.copy_to_device_of(t))
            .collect()
    }

    /// Every replica's `tensor` concatenated along the first axis, in replica order. Tensors may
    /// differ in their first dimension only.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.call(Request::AllGather(tensor.clone()))?;
        out.swap_remove(0).copy_to(tensor.device())
    }

    /// This replica's rows of the reduction: the first dimension is split into N equal parts
    /// and replica r gets part r.
    pub fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.call(Request::ReduceScatter(op, tensor.clone()))?;
        out.swap_remove(0).copy_to(tensor.device())
    }

    /// Replica `root`'s tensor on every replica; the others pass `None`.
    pub fn broadcast(
        &self,
        root: usize,
        tensor: Option<&Tensor>,
    ) -> Result<Tensor, CollectiveError> {
        if root >= self.group.num_replicas() {
            return Err(CollectiveError::InvalidArgument(format!(
                "broadcast root {root} is out of range for {} replicas",
                self.group.num_replicas()
            )));
        }
        let mut out = self.call(Request::Broadcast {
            root,
            tensor: tensor.cloned(),
        })?;
        Ok(out.swap_remove(0))
    }

    fn call(&self, request: Request) -> Result<Vec<Tensor>, CollectiveError> {
        let shared = &*self.group.shared;
        let name = request.name();
        let call = shared.calls.load(Ordering::SeqCst);
        let what = || format!("{} #{call}", name.signature());
        *lock(&shared.slots[self.replica]) = Some(request);
        shared.rendezvous.arrive(self.replica, &what, || {
            let outcome = shared.plan();
            *lock(&shared.outcome) = Some(Arc::new(outcome));
        })?;
        let outcome = {
            let mut slot = lock(&shared.outcome);
            let outcome = slot.clone().expect("the last arriver stored an outcome");
            if shared.consumed.fetch_add(1, Ordering::SeqCst) + 1 == shared.num_replicas {
                shared.consumed.store(0, Ordering::SeqCst);
                slot.take();
            }
            outcome
        };
        match &*outcome {
            Outcome::Shared(tensors) => Ok(tensors.clone()),
            Outcome::Failed(error) => Err(error.clone()),
            Outcome::Scatter {
                op,
                inputs,
                rows_per_replica,
            } => {
                let start = self.replica * rows_per_replica;
                let parts = inputs
                    .iter()
                    .map(|t| {
                        t.slice_rows(start..start + rows_per_replica)
                            .map(contiguous)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Tensor> = parts.iter().collect();
                let n = shared.num_replicas;
                Ok(vec![kernel::reduce_tensors(
                    *op,
                    &refs,
                    inputs[0].device(),
                    n,
                )?])
            }
            Outcome::Sliced {
                works,
                pieces,
                next,
            } => {
                // Relaxed is enough: the claims only need to be distinct, and the barrier below
                // publishes the outputs.
                while let Some(piece) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                    works[piece.work].reduce_range(piece.start, piece.end, shared.num_replicas);
                }
                shared.rendezvous.arrive(self.replica, &what, || {})?;
                Ok(works.iter().map(|w| w.result.clone()).collect())
            }
        }
    }
}

impl ReplicaCollectives for Member {
    fn replica(&self) -> usize {
        Member::replica(self)
    }
    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::all_reduce(self, op, tensor)
    }
    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        Member::batch_all_reduce(self, op, tensors)
    }
    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::all_gather(self, tensor)
    }
    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Member::reduce_scatter(self, op, tensor)
    }
    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError> {
        Member::broadcast(self, root, tensor)
    }
}

impl SlicedWork {
    /// Reduces elements `start..end` of every input into the output. Callers give disjoint
    /// ranges and read the output only after all ranges are done.
    fn reduce_range(&self, start: usize, end: usize, num_replicas: usize) {
        let output = Output {
            dtype: self.result.dtype(),
            ptr: self.output_ptr,
            stores: self.stores,
        };
        // SAFETY: `output_ptr` points at the elements of `self.output`, which `self` keeps alive,
        // and the callers' ranges are within it, disjoint, and read only once all are done.
        unsafe { reduce_into(self.op, &self.inputs, output, start, end, num_replicas) };
    }
}

/// Where a reduction writes: the elements of an output tensor of `dtype` at address `ptr`.
#[derive(Clone, Copy)]
struct Output {
    dtype: DType,
    ptr: usize,
    stores: Stores,
}

/// Reduces elements `start..end` of the contiguous `inputs` (one dtype and shape) into
/// `output`, dividing a `Mean` by `num_replicas`.
///
/// # Safety
///
/// `output.ptr` must point at the elements of a live tensor of `output.dtype` (the reduced
/// dtype of the inputs') holding at least `end` elements, that nothing else writes or reads in
/// `start..end` while this runs.
unsafe fn reduce_into<I: std::borrow::Borrow<Tensor>>(
    op: ReduceOp,
    inputs: &[I],
    output: Output,
    start: usize,
    end: usize,
    num_replicas: usize,
) {
    fn slices<T: crate::tensor::Element, I: std::borrow::Borrow<Tensor>>(
        inputs: &[I],
        start: usize,
        end: usize,
    ) -> Vec<&[T]> {
        inputs
            .iter()
            .map(|t| {
                let all = t
                    .borrow()
                    .array::<T>()
                    .ok()
                    .and_then(|a| a.as_slice())
                    .expect("planned inputs are contiguous and of one dtype");
                &all[start..end]
            })
            .collect()
    }
    /// # Safety
    ///
    /// As for `reduce_into`.
    unsafe fn typed<T: Arith, I: std::borrow::Borrow<Tensor>>(
        op: ReduceOp,
        inputs: &[I],
        output: Output,
        start: usize,
        end: usize,
        num_replicas: usize,
    ) {
        let inputs = slices::<T, I>(inputs, start, end);
        // SAFETY: the caller's contract.
        let out = unsafe {
            std::slice::from_raw_parts_mut((output.ptr as *mut T).add(start), end - start)
        };
        kernel::reduce_slices_with(op, &inputs, out, num_replicas, output.stores);
    }
    /// The float64 output of an integer `Mean`, from inputs of the integer type `T`.
    ///
    /// # Safety
    ///
    /// As for `reduce_into`; the output is float64 (`reduced_dtype`).
    unsafe fn integer_mean<T: ExactInt, I: std::borrow::Borrow<Tensor>>(
        inputs: &[I],
        output: Output,
        start: usize,
        end: usize,
        n: usize,
    ) {
        let inputs = slices::<T, I>(inputs, start, end);
        // SAFETY: the caller's contract.
        let out = unsafe {
            std::slice::from_raw_parts_mut((output.ptr as *mut f64).add(start), end - start)
        };
        kernel::integer_mean_slices(&inputs, out, n);
    }
    if start >= end {
        return;
    }
    // SAFETY (all arms): the caller's contract, passed on.
    unsafe {
        match inputs[0].borrow().dtype() {
            DType::I32 if op == ReduceOp::Mean => {
                integer_mean::<i32, I>(inputs, output, start, end, num_replicas)
            }
            DType::I64 if op == ReduceOp::Mean => {
                integer_mean::<i64, I>(inputs, output, start, end, num_replicas)
            }
            _ => {
                with_dtype!(output.dtype, T => typed::<T, I>(op, inputs, output, start, end, num_replicas))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_on<T: Send>(group: &CollectiveGroup, step: impl Fn(&Member) -> T + Sync) -> Vec<T> {
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
    fn input(r: usize, len: usize) -> Tensor {
        let data: Vec<f32> = (0..len)
            .map(|i| ((i * 31 + r * 7) as f32).sin() * 10f32.powi((i % 7) as i32 - 3))
            .collect();
        Tensor::from_vec(&format!("/cpu:{r}"), &[len], data).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    #[test]
    fn outputs_past_the_caches_are_streamed_and_give_the_one_reducer_bits() {
        // Past STREAM_MIN_BYTES, and not a whole number of pieces or tiles.
        let len = kernel::STREAM_MIN_BYTES / 4 + 1001;
        for n in [2, 3] {
            let inputs: Vec<Tensor> = (0..n).map(|r| input(r, len)).collect();
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let host = kernel::reduce_tensors(ReduceOp::Sum, &refs, "/cpu:0", n).unwrap();
            for plan in [ReducePlan::OneReducer, ReducePlan::Sliced { min_bytes: 0 }] {
                let config = GroupConfig {
                    plan,
                    ..GroupConfig::default()
                };
                let group = CollectiveGroup::new(n, config).unwrap();
                let out = run_on(&group, |m| {
                    m.all_reduce(ReduceOp::Sum, &inputs[m.replica()]).unwrap()
                });
                for (r, t) in out.iter().enumerate() {
                    assert_eq!(t.device(), format!("/cpu:{r}"));
                    assert!(
                        bits(t) == bits(&host),
                        "{plan:?}, {n} replicas, replica {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_batch_of_one_tensor_is_its_all_reduce() {
        let group = CollectiveGroup::new(2, GroupConfig::default()).unwrap();
        let out = run_on(&group, |m| {
            let t = crate::flat::reshape(&input(m.replica(), 12), &[3, 4]).unwrap();
            let batched = m
                .batch_all_reduce(ReduceOp::Mean, std::slice::from_ref(&t))
                .unwrap();
            let single = m.all_reduce(ReduceOp::Mean, &t).unwrap();
            (batched, single)
        });
        for (batched, single) in &out {
            assert_eq!(batched.len(), 1);
            assert_eq!(batched[0].shape(), [3, 4]);
            assert!(bits(&batched[0]) == bits(single));
        }
    }

    #[test]
    fn a_batch_reduces_strided_tensors_into_shared_buckets_without_packing() {
        let group = CollectiveGroup::new(2, GroupConfig::default()).unwrap();
        let out = run_on(&group, |m| {
            let r = m.replica();
            let values: Vec<f32> = input(r, 12).to_vec().unwrap();
            // A transposed view: its elements are not in row-major order in memory.
            let strided = Tensor::from_array(
                &format!("/cpu:{r}"),
                ndarray::Array2::from_shape_vec((3, 4), values)
                    .unwrap()
                    .reversed_axes(),
            );
            let tensors = [input(r, 5), strided.clone(), input(r + 7, 9)];
            let batched = m.batch_all_reduce(ReduceOp::Sum, &tensors).unwrap();
            let single: Vec<Tensor> = tensors
                .iter()
                .map(|t| m.all_reduce(ReduceOp::Sum, t).unwrap())
                .collect();
            (batched, single)
        });
        for (batched, single) in &out {
            for (b, s) in batched.iter().zip(single) {
                assert_eq!(b.shape(), s.shape());
                assert!(b.bitwise_eq(s), "{b} vs {s}");
            }
            // One bucket: the results are consecutive parts of one output.
            let address = |t: &Tensor| t.array::<f32>().unwrap().as_ptr() as usize;
            assert_eq!(address(&batched[2]), address(&batched[0]) + (5 + 12) * 4);
        }
    }

    #[test]
    fn pieces_cover_every_output_once_in_whole_cache_lines() {
        let group = CollectiveGroup::new(3, GroupConfig::default()).unwrap();
        for len in [1, 15, 16, 17, 1000, (PIECE_BYTES / 4) * 5 + 3] {
            let inputs: Vec<Tensor> = (0..3).map(|r| input(r, len)).collect();
            let works = vec![
                group
                    .shared
                    .plan_sliced(ReduceOp::Sum, inputs.clone())
                    .unwrap(),
                group.shared.plan_sliced(ReduceOp::Sum, inputs).unwrap(),
            ];
            let pieces = group.shared.pieces(&works);
            for w in 0..2 {
                let mine: Vec<&Piece> = pieces.iter().filter(|p| p.work == w).collect();
                assert!(mine.len() >= 3.min(len.div_ceil(16)), "len {len}");
                assert_eq!(mine[0].start, 0);
                assert_eq!(mine.last().unwrap().end, len);
                for pair in mine.windows(2) {
                    assert_eq!(pair[0].end, pair[1].start);
                    assert_eq!(pair[1].start % 16, 0, "len {len}");
                    assert!(pair[1].start - pair[0].start <= PIECE_BYTES / 4);
                }
            }
        }
    }
}
