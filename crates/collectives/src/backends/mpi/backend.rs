//! [`MpiAllReduce`]: the hierarchical cross-worker backend. Local replicas reduce in shared
//! memory (the process's [`CollectiveGroup`]), local replica 0's thread makes one agreement and
//! one cross-process collective per fused bucket, and the result goes back to every local
//! replica through the group.
//!
//! Bit-identical everywhere: every element of a cross-worker reduction is folded exactly once,
//! in worker order, by the same code. Below [`SCATTER_MIN_BYTES`] every worker all-gathers every
//! worker's local result and folds the W blocks in worker order itself (one round). From it the
//! buffer is cut into W parts and the workers reduce-scatter then all-gather, point to point
//! between their own buffers: worker `p` receives every worker's part `p`, folds them in worker
//! order straight into its result, and sends that part to every other worker, which receives it
//! straight into its result. Both paths fold element `i` as `x₀ ⊕ x₁ ⊕ … ⊕ x_{W-1}` (`Mean`
//! divided in the same pass) with the same kernel, so they give the same bits, and no MPI
//! reduction (whose fold order the standard leaves to each rank) is involved.
//!
//! Measured on 2 workers (shared memory; the multi-worker bench's `mpi_ratio`, runs alternating
//! between the variants, 1 MiB / 64 MiB): all-gathering whole buffers into fresh results
//! 0.71–0.97 / 0.74–0.94; the same writing into released earlier results' buffers (see
//! [`MpiAllReduce`]; a fresh 64 MiB buffer's page faults cost as much as its transfer)
//! 0.78–1.02 / 1.06–1.13; reduce-scatter + all-gather into fresh results 0.90–1.05 / 0.77; both
//! 0.96–0.99 / 1.85–2.05.
//!
//! Every cross-worker call starts with an agreement: one all-gather of a fixed-size slot per
//! worker (its record, see `agreement`, and an inline payload). A reduction of at most
//! [`INLINE_BYTES`] travels in that slot, so small all-reduces cost one round trip, agreement
//! included; larger ones move afterwards (an all-gather, or the two point-to-point rounds).

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distribute_values::{Leaf, ReduceOp};
use ndarray::ArcArray;

use super::agreement::{Call, Record, Status, Verdict, judge};
use super::bytes::{element_bytes as as_bytes, element_bytes_mut as as_bytes_mut};
use super::world::MpiWorld;
use crate::backends::group::{CollectiveGroup, GroupConfig, Member};
use crate::cross_replica::deliver;
use crate::kernel::{self, Arith};
use crate::rendezvous::lock_ignoring_poison as lock;
use crate::tensor::with_dtype;
use crate::{
    AnyTensor, CollectiveError, CrossDeviceOps, Destinations, Element, FusionPlan,
    ReplicaCollectives, StepLifecycle, Tensor,
};

/// From this many bytes the workers reduce-scatter + all-gather instead of all-gathering whole
/// buffers (which moves W−1 buffers into each worker, and folds all of it on every worker).
pub const SCATTER_MIN_BYTES: usize = 64 * 1024;

/// The payload an agreement carries: a reduction this small travels with it.
pub const INLINE_BYTES: usize = 4096;

/// Words per worker in an agreement: the record, then the inline payload.
const SLOT_WORDS: usize = Record::WORDS + INLINE_BYTES / 8;

// An agreement slot travels as one eager message on shared memory (see `EAGER_LIMIT_BYTES`).
const _: () = assert!(SLOT_WORDS * 8 <= super::world::EAGER_LIMIT_BYTES);

/// From this many bytes a fold's result is written into the buffer of an earlier result of the
/// same shape once no one holds it any more (the backend keeps a share of the last
/// [`KEPT_OUTPUTS`]): a fresh buffer this large costs a page fault per 4 KiB, about as much as
/// moving its bytes between workers.
const REUSE_MIN_BYTES: usize = 256 * 1024;

/// Results of at least [`REUSE_MIN_BYTES`] the backend keeps a share of.
const KEPT_OUTPUTS: usize = 4;

/// Tags of the two phases of [`Inner::scatter_fold`].
const REDUCE_SCATTER_TAG: i32 = 1;
const ALL_GATHER_TAG: i32 = 2;

/// Bytes of a failed worker's message carried to the others.
const MESSAGE_BYTES: usize = 512;

/// The hierarchical all-reduce across the worker processes of an MPI job (see the module docs):
/// reductions span every local replica of every worker, and every replica of every worker gets
/// bit-identical results.
///
/// Global replica `w·R + r` is worker `w`'s local replica `r` (R local replicas per worker, the
/// same on every worker). A strategy calls [`MpiAllReduce::finish_step`] after each step, so a
/// worker whose step failed is named on every worker.
///
/// Results of at least 256 KiB share their buffer with the backend, which keeps the last four:
/// once every holder has dropped one, the next reduction of its dtype and shape writes into it
/// instead of a fresh buffer (whose page faults cost as much as the transfer). Reading is
/// unaffected; writing into such a result in place (`Tensor::array_mut`) copies it first, as for
/// any shared buffer.
#[derive(Debug, Clone)]
pub struct MpiAllReduce {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    group: CollectiveGroup,
    devices: Vec<String>,
    world: &'static MpiWorld,
    deadline: Duration,
    bytes_per_pack: usize,
    /// Set when an agreement showed another worker's failure: this worker's failure in the same
    /// step is then a consequence.
    remote_failure: Mutex<Option<usize>>,
    /// The receive buffer of cross-worker folds, kept between calls: a fresh one per call costs
    /// a page fault per 4 KiB, as much as the transfer itself. Grows to the largest fold's need
    /// (W × bytes below [`SCATTER_MIN_BYTES`], (W−1)/W × bytes from it) and stays.
    scratch: Mutex<Vec<u64>>,
    /// Shares of recent large fold results (see [`REUSE_MIN_BYTES`]).
    kept_outputs: Mutex<Vec<Tensor>>,
}

impl MpiAllReduce {
    /// Replica `replica`'s handle: its member of the local group and the shared backend.
    fn member(&self, replica: usize) -> Result<MpiMember, CollectiveError> {
        Ok(MpiMember {
            member: self.inner.group.member(replica)?,
            inner: Arc::clone(&self.inner),
            device: self.inner.devices[replica].clone(),
        })
    }

    /// A backend for this process's replicas on `devices` (host devices, one replica thread
    /// each), initialising MPI if no one has. Every worker must have the same number of local
    /// replicas: they check it here, together, so every worker of the job must build its
    /// backend (a collective call).
    ///
    /// `config.deadline` bounds every wait, local and cross-process; a cross-process wait past it
    /// aborts the job.
    pub fn new<S: AsRef<str>>(devices: &[S], config: GroupConfig) -> Result<Self, CollectiveError> {
        let world = MpiWorld::get()?;
        let local_replicas = devices.len();
        let backend = MpiAllReduce {
            inner: Arc::new(Inner {
                group: CollectiveGroup::new(local_replicas, config)?,
                devices: devices.iter().map(|d| d.as_ref().to_owned()).collect(),
                world,
                deadline: config.deadline,
                bytes_per_pack: config.bytes_per_pack,
                remote_failure: Mutex::new(None),
                scratch: Mutex::new(Vec::new()),
                kept_outputs: Mutex::new(Vec::new()),
            }),
        };
        // Every worker checks that all have the same local replica count before any step.
        let record = Record::bare(Call::Exchange, Status::Ok).with_extra(local_replicas as i64);
        backend.inner.agree(record, "").map_err(|e| match e {
            CollectiveError::WorkersDisagree(_) => CollectiveError::InvalidArgument(format!(
                "every worker must run the same number of local replicas; this worker has \
                 {local_replicas} ({e})"
            )),
            other => other,
        })?;
        Ok(backend)
    }

    /// The process world (rank = worker, size = workers).
    pub fn world(&self) -> &'static MpiWorld {
        self.inner.world
    }

    /// This process's worker index.
    pub fn worker(&self) -> usize {
        self.inner.world.rank()
    }

    /// The number of workers.
    pub fn num_workers(&self) -> usize {
        self.inner.world.size()
    }

    /// Local replicas per worker.
    pub fn local_replicas(&self) -> usize {
        self.inner.group.num_replicas()
    }

    /// Every replica of every worker.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.num_workers() * self.local_replicas()
    }

    /// The local group (shared-memory rendezvous of this process's replicas).
    pub fn group(&self) -> &CollectiveGroup {
        &self.inner.group
    }

    /// The end-of-step agreement: every worker calls it once after each step, with its step's
    /// error message if it failed. Returns `Ok` when every worker's step succeeded, else
    /// [`CollectiveError::WorkerFailed`] naming the first worker that failed on its own, with its
    /// message — the same error on every worker. A worker still in a collective when another
    /// ends fails that collective and comes here too; ending waits for it (within the deadline).
    pub fn finish_step(&self, failure: Option<&str>) -> Result<(), CollectiveError> {
        let status = match failure {
            None => Status::Ok,
            Some(_) if lock(&self.inner.remote_failure).is_some() => Status::FailedAsConsequence,
            Some(_) => Status::Failed,
        };
        let message = failure.unwrap_or("");
        loop {
            let Gathered {
                verdict, failed, ..
            } = self
                .inner
                .agree_raw(Record::bare(Call::EndStep, status), message, &[]);
            match verdict {
                Verdict::AllEnded => return Ok(()),
                Verdict::WorkerFailed {
                    all_ended: true, ..
                } => {
                    let (worker, message) = failed.expect("a failure carries its message");
                    return Err(CollectiveError::WorkerFailed { worker, message });
                }
                // Some workers are still in a call: they fail it now and come here next.
                Verdict::WorkerFailed { .. } | Verdict::Disagree(_) | Verdict::Agreed => {}
            }
        }
    }

    /// Every worker's `bytes` (the same length on every worker), in worker order: a hook for
    /// what must be agreed between steps or inside one (e.g. an input pipeline's end of data).
    /// Call it from one thread per worker, in the same order relative to the other cross-worker
    /// calls on every worker.
    pub fn exchange(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
        let record = Record::bare(Call::Exchange, Status::Ok).with_extra(bytes.len() as i64);
        let inner = &self.inner;
        inner.agree(record, "")?;
        let mut all = vec![0u8; bytes.len() * inner.world.size()];
        inner
            .world
            .all_gather(bytes, &mut all, inner.deadline, &|| {
                "an exchange".to_owned()
            });
        if bytes.is_empty() {
            return Ok(vec![Vec::new(); inner.world.size()]);
        }
        Ok(all.chunks(bytes.len()).map(<[u8]>::to_vec).collect())
    }

    /// Worker 0's values of `tensors` on every worker (each worker passes its own, of the same
    /// dtypes and shapes): how variables start identical although initialisers differ.
    pub fn broadcast_from_chief(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let inner = &self.inner;
        inner.agree(Record::of(Call::ChiefValues, None, &refs), "")?;
        if inner.world.size() == 1 {
            return Ok(tensors.to_vec());
        }
        tensors
            .iter()
            .map(|t| {
                let t = t.to_host()?;
                with_dtype!(t.dtype(), T => {
                    let mut values: Vec<T> = t.to_vec::<T>()?;
                    inner.world.broadcast(0, as_bytes_mut(&mut values), inner.deadline, &|| {
                        "the chief's values".to_owned()
                    });
                    Tensor::from_vec(t.device(), t.shape(), values)
                })
            })
            .collect()
    }

    /// Worker 0's `bytes` on every worker (each passes its own, of the same length): how a
    /// variable of any [`VariableValue`](distribute_values::VariableValue) type starts with the
    /// chief's initial value.
    pub fn bytes_from_chief(&self, bytes: &[u8]) -> Result<Vec<u8>, CollectiveError> {
        let inner = &self.inner;
        let record = Record::bare(Call::ChiefValues, Status::Ok).with_extra(bytes.len() as i64);
        inner.agree(record, "")?;
        let mut buffer = bytes.to_vec();
        if inner.world.size() > 1 {
            inner.world.broadcast(0, &mut buffer, inner.deadline, &|| {
                "the chief's values".to_owned()
            });
        }
        Ok(buffer)
    }

    /// Every worker's `tensor` joined along `axis`, in worker order, on the host (each worker
    /// passes one value, e.g. its local replicas' already joined): the length of `axis` may
    /// differ per worker, the dtype, rank and other dimensions may not (a mismatch is an error
    /// on every worker).
    pub fn all_gather_across_workers(
        &self,
        tensor: &Tensor,
        axis: usize,
    ) -> Result<Tensor, CollectiveError> {
        let inner = &self.inner;
        let local = tensor.to_host()?;
        // Agreed first, so a bad axis (the same on every worker, or a disagreement) fails
        // every worker alike.
        let records = inner.agree(Record::gather_along(&local, axis), "")?;
        if axis >= local.rank() {
            return Err(CollectiveError::InvalidArgument(format!(
                "an all-gather along axis {axis} of a tensor of rank {}: the axis must be below \
                 the rank",
                local.rank()
            )));
        }
        if inner.workers() == 1 {
            return Ok(local);
        }
        let lengths: Vec<usize> = records.iter().map(|r| r.rows as usize).collect();
        let shape = local.shape();
        let outside: usize = shape
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != axis)
            .map(|(_, &d)| d)
            .product();
        let (counts, displs) = gather_layout(
            lengths.iter().map(|&l| l * outside),
            local.dtype().size_in_bytes(),
        )?;
        let total: usize = lengths.iter().sum::<usize>() * outside;
        let parts = with_dtype!(local.dtype(), T => {
            let mine: Vec<T> = local.to_vec::<T>()?;
            let mut all = vec![T::zero(); total];
            inner.world.all_gather_varcount(
                as_bytes(&mine),
                as_bytes_mut(&mut all),
                &counts,
                &displs,
                inner.deadline,
                &|| format!("the all-gather of {local} along axis {axis}"),
            );
            let mut at = 0;
            lengths
                .iter()
                .map(|&l| {
                    let mut part_shape = shape.to_vec();
                    part_shape[axis] = l;
                    let part = all[at..at + l * outside].to_vec();
                    at += l * outside;
                    Tensor::from_vec(local.device(), &part_shape, part)
                })
                .collect::<Result<Vec<Tensor>, _>>()?
        });
        Tensor::concat(local.device(), &parts, axis)
    }

    /// The reduction of `tensor` across workers only (each worker passes one value, already
    /// reduced over its local replicas): `Sum`, `Min`, `Max`, or `Mean` over the workers.
    pub fn all_reduce_across_workers(
        &self,
        op: ReduceOp,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let inner = &self.inner;
        kernel::check_op(op, tensor.dtype())?;
        let record = Record::of(Call::Reduce, Some(op), &[tensor]).with_extra(1);
        let mut out = inner.reduce_across(record, op, inner.workers(), &[tensor.to_host()?])?;
        Ok(out.swap_remove(0))
    }
}

impl Tensor {
    /// A host tensor's elements as bytes (a copy).
    fn to_wire_bytes(&self) -> Result<Vec<u8>, CollectiveError> {
        with_dtype!(self.dtype(), T => {
            let array = self.array::<T>()?;
            Ok(match kernel::contiguous(array) {
                Some(slice) => as_bytes(slice).to_vec(),
                None => as_bytes(&array.iter().copied().collect::<Vec<T>>()).to_vec(),
            })
        })
    }
}

/// What an agreement gathered.
struct Gathered {
    /// Every worker's record, in worker order.
    records: Vec<Record>,
    verdict: Verdict,
    /// The worker to name and its message, when one failed.
    failed: Option<(usize, String)>,
    /// Every worker's slot (record and inline payload); empty with one worker.
    slots: Vec<i64>,
}

/// The op local replicas reduce with: `Mean` sums, and divides once everything is summed.
fn local_op(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Mean => ReduceOp::Sum,
        other => other,
    }
}

impl Inner {
    fn workers(&self) -> usize {
        self.world.size()
    }

    /// Gathers every worker's record and `inline` payload (and, when one failed, every
    /// worker's message) and judges them. Every agreement moves the same fixed-size slot per
    /// worker, whatever the worker is doing, so workers in different calls still meet in one
    /// collective; a reduction of at most [`INLINE_BYTES`] rides in the slot, so it costs one
    /// round trip in all. With one worker, judges this worker's record alone.
    fn agree_raw(&self, record: Record, message: &str, inline: &[u8]) -> Gathered {
        let w = self.workers();
        let (records, slots) = if w == 1 {
            (vec![record], Vec::new())
        } else {
            let mut mine = vec![0i64; SLOT_WORDS];
            mine[..Record::WORDS].copy_from_slice(&record.words());
            as_bytes_mut(&mut mine[Record::WORDS..])[..inline.len()].copy_from_slice(inline);
            let mut all = vec![0i64; SLOT_WORDS * w];
            self.world
                .all_gather(&mine[..], &mut all, self.deadline, &|| {
                    format!("the agreement on {record}")
                });
            self.world.agreement_done();
            let records = all
                .chunks(SLOT_WORDS)
                .map(|slot| {
                    Record::from_words(&slot[..Record::WORDS]).unwrap_or_else(|| {
                        self.world.abort_job(
                            "another worker sent an agreement this build cannot read (workers \
                             built from different sources?)",
                        )
                    })
                })
                .collect();
            (records, all)
        };
        let verdict = judge(&records);
        let failed = match verdict {
            Verdict::WorkerFailed { worker, .. } => Some((worker, self.messages(message, worker))),
            _ => None,
        };
        Gathered {
            records,
            verdict,
            failed,
            slots,
        }
    }

    /// The message of `worker`, gathered from every worker (each passes its own).
    fn messages(&self, mine: &str, worker: usize) -> String {
        let mut send = [0u8; MESSAGE_BYTES];
        let mut end = mine.len().min(MESSAGE_BYTES);
        while !mine.is_char_boundary(end) {
            end -= 1;
        }
        send[..end].copy_from_slice(&mine.as_bytes()[..end]);
        let w = self.workers();
        if w == 1 {
            return mine[..end].to_owned();
        }
        let mut all = vec![0u8; MESSAGE_BYTES * w];
        self.world
            .all_gather(&send[..], &mut all, self.deadline, &|| {
                "the failed worker's message".to_owned()
            });
        let theirs = &all[worker * MESSAGE_BYTES..(worker + 1) * MESSAGE_BYTES];
        let len = theirs.iter().position(|&b| b == 0).unwrap_or(MESSAGE_BYTES);
        String::from_utf8_lossy(&theirs[..len]).into_owned()
    }

    /// [`Inner::agree_raw`] for a call: every worker's record when they agree, else the error
    /// every worker returns alike.
    fn agree(&self, record: Record, message: &str) -> Result<Vec<Record>, CollectiveError> {
        Ok(self.agree_with(record, message, &[])?.0)
    }

    /// [`Inner::agree`] with an inline payload; also returns every worker's slot.
    fn agree_with(
        &self,
        record: Record,
        message: &str,
        inline: &[u8],
    ) -> Result<(Vec<Record>, Vec<i64>), CollectiveError> {
        let Gathered {
            records,
            verdict,
            failed,
            slots,
        } = self.agree_raw(record, message, inline);
        match verdict {
            Verdict::Agreed | Verdict::AllEnded => Ok((records, slots)),
            Verdict::WorkerFailed { .. } => {
                let (worker, message) = failed.expect("a failure carries its message");
                *lock(&self.remote_failure) = Some(worker);
                Err(CollectiveError::WorkerFailed { worker, message })
            }
            Verdict::Disagree(description) => Err(CollectiveError::WorkersDisagree(description)),
        }
    }

    /// The agreement on `record` and the reduction across workers of every bucket (host
    /// tensors, each worker's local result), `Mean` divided by `count` contributions. One bucket
    /// of at most [`INLINE_BYTES`] travels with the agreement: one round trip in all.
    fn reduce_across(
        &self,
        record: Record,
        op: ReduceOp,
        count: usize,
        buckets: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let small = match buckets {
            [one] if one.size_in_bytes() <= INLINE_BYTES => Some(one),
            _ => None,
        };
        let owned_bytes;
        let inline: &[u8] = match small {
            Some(t) => {
                owned_bytes = t.to_wire_bytes()?;
                &owned_bytes
            }
            None => &[],
        };
        let (_, slots) = self.agree_with(record, "", inline)?;
        match small {
            // Every worker's bucket has this size (agreed), so every worker took this path.
            Some(t) if self.workers() > 1 => Ok(vec![with_dtype!(t.dtype(), T => {
                self.fold_slots::<T>(op, count, t, &slots)
            })?]),
            _ => buckets
                .iter()
                .map(|b| self.fold_across(op, count, b))
                .collect(),
        }
    }

    /// The fold, in worker order, of the payloads in every worker's agreement slot (`Mean`
    /// divided by `count`).
    fn fold_slots<T: Arith>(
        &self,
        op: ReduceOp,
        count: usize,
        like: &Tensor,
        slots: &[i64],
    ) -> Result<Tensor, CollectiveError> {
        let n = like.num_elements();
        let blocks: Vec<&[T]> = slots
            .chunks(SLOT_WORDS)
            .map(|slot| {
                let payload = &slot[Record::WORDS..];
                // SAFETY: the payload is 8-byte aligned (it starts on an i64), holds at least
                // `n` elements of `T` (the agreed size, at most INLINE_BYTES) written by a
                // worker from the same dtype, and any bit pattern is a valid `T`.
                unsafe { std::slice::from_raw_parts(payload.as_ptr().cast::<T>(), n) }
            })
            .collect();
        let mut out = vec![T::zero(); n];
        if n > 0 {
            kernel::reduce_slices(op, &blocks, &mut out, count);
        }
        Tensor::from_vec(like.device(), like.shape(), out)
    }

    /// The fold across workers of every worker's host `tensor` (same dtype and shape
    /// everywhere, agreed before), `Mean` divided by `count`: see the module docs for the two
    /// paths.
    fn fold_across(
        &self,
        op: ReduceOp,
        count: usize,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        if self.workers() == 1 {
            return match op {
                ReduceOp::Mean => kernel::divide(tensor, count),
                _ => Ok(tensor.clone()),
            };
        }
        with_dtype!(tensor.dtype(), T => self.fold_typed::<T>(op, count, tensor))
    }

    fn fold_typed<T: Arith>(
        &self,
        op: ReduceOp,
        count: usize,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let array = tensor.array::<T>()?;
        let data: Cow<'_, [T]> = match kernel::contiguous(array) {
            Some(slice) => Cow::Borrowed(slice),
            None => Cow::Owned(array.iter().copied().collect()),
        };
        let what = || {
            format!(
                "the reduction of a {} {:?} tensor",
                tensor.dtype(),
                tensor.shape()
            )
        };
        let mut result = self.output::<T>(tensor)?;
        let out = result
            .array_mut::<T>()?
            .as_slice_mut()
            .ok_or_else(|| CollectiveError::Invariant("a fold's output is contiguous".into()))?;
        if std::mem::size_of_val(&data[..]) >= SCATTER_MIN_BYTES {
            self.scatter_fold(op, count, &data, out);
        } else {
            self.gather_fold(op, count, &data, out, &what);
        }
        self.keep_for_reuse(&result);
        Ok(result)
    }

    /// Every worker's `data` gathered whole, then folded by every worker: one round, the path
    /// of small buffers.
    fn gather_fold<T: Arith>(
        &self,
        op: ReduceOp,
        count: usize,
        data: &[T],
        out: &mut [T],
        what: &dyn Fn() -> String,
    ) {
        let (w, n) = (self.workers(), data.len());
        let mut scratch = lock(&self.scratch);
        let received = scratch_of::<T>(&mut scratch, n * w);
        self.world
            .all_gather(as_bytes(data), as_bytes_mut(received), self.deadline, what);
        let blocks: Vec<&[T]> = received.chunks(n.max(1)).take(w).collect();
        if n > 0 {
            kernel::reduce_slices(op, &blocks, out, count);
        }
    }

    /// Reduce-scatter then all-gather, point to point straight between the caller's buffers:
    /// worker `p` receives every worker's part `p`, folds them in worker order into its part of
    /// `out`, and sends that part to every other worker, which receives it into its own `out`.
    /// Each worker moves (W−1)/W of the buffer in and out twice, folds 1/W of it, and copies
    /// nothing locally.
    fn scatter_fold<T: Arith>(&self, op: ReduceOp, count: usize, data: &[T], out: &mut [T]) {
        let (w, me, n) = (self.workers(), self.world.rank(), data.len());
        let part = n.div_ceil(w);
        let range = |p: usize| (p * part).min(n)..((p + 1) * part).min(n);
        let mine = range(me);
        let peers = || (0..w).filter(move |&p| p != me);
        let mut scratch = lock(&self.scratch);
        let received = scratch_of::<T>(&mut scratch, mine.len() * (w - 1));
        let sends: Vec<(usize, &[u8])> = peers().map(|p| (p, as_bytes(&data[range(p)]))).collect();
        let receives = peers()
            .zip(split_lengths(
                &mut *received,
                (0..w - 1).map(|_| mine.len()),
            ))
            .map(|(p, block)| (p, as_bytes_mut(block)))
            .collect();
        self.world
            .send_receive(&sends, receives, REDUCE_SCATTER_TAG, self.deadline, &|| {
                format!("the reduce-scatter of {n} {} elements", T::DTYPE)
            });
        let mut theirs = received.chunks(mine.len().max(1));
        let blocks: Vec<&[T]> = (0..w)
            .map(|p| match p == me {
                true => &data[mine.clone()],
                false => theirs.next().unwrap_or(&[]),
            })
            .collect();
        if !mine.is_empty() {
            kernel::reduce_slices(op, &blocks, &mut out[mine.clone()], count);
        }
        let mut parts = split_lengths(out, (0..w).map(|p| range(p).len()));
        let own: &mut [T] = std::mem::take(&mut parts[me]);
        let own = &*own;
        let sends: Vec<(usize, &[u8])> = peers().map(|p| (p, as_bytes(own))).collect();
        let receives = parts
            .into_iter()
            .enumerate()
            .filter(|&(p, _)| p != me)
            .map(|(p, block)| (p, as_bytes_mut(block)))
            .collect();
        self.world
            .send_receive(&sends, receives, ALL_GATHER_TAG, self.deadline, &|| {
                format!("the all-gather of {n} reduced {} elements", T::DTYPE)
            });
    }

    /// A tensor like `like` (dtype, shape, device) to write a fold into: the buffer of an
    /// earlier result that no one holds any more, else a fresh one.
    fn output<T: Element>(&self, like: &Tensor) -> Result<Tensor, CollectiveError> {
        if like.size_in_bytes() >= REUSE_MIN_BYTES {
            let mut kept = lock(&self.kept_outputs);
            let free = kept.iter().position(|t| {
                t.shape() == like.shape() && t.array::<T>().is_ok_and(ArcArray::is_unique)
            });
            if let Some(i) = free {
                let Tensor { storage, .. } = kept.remove(i);
                return Ok(Tensor {
                    storage,
                    device: Arc::clone(&like.device),
                });
            }
        }
        Tensor::from_vec(
            like.device(),
            like.shape(),
            vec![T::zero(); like.num_elements()],
        )
    }

    /// Keeps a share of a large `result` so that, once its holders drop it, the next fold of
    /// its size writes into it instead of faulting in fresh pages.
    fn keep_for_reuse(&self, result: &Tensor) {
        if result.size_in_bytes() < REUSE_MIN_BYTES {
            return;
        }
        let mut kept = lock(&self.kept_outputs);
        if kept.len() == KEPT_OUTPUTS {
            kept.remove(0);
        }
        kept.push(result.clone());
    }
}

/// `buffer` viewed as `len` elements of `T`, grown to fit.
fn scratch_of<T: Element>(buffer: &mut Vec<u64>, len: usize) -> &mut [T] {
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    if buffer.len() < words {
        buffer.resize(words, 0);
    }
    // SAFETY: the buffer is 8-byte aligned (u64s), at least `len` elements of `T` long, and any
    // bit pattern is a valid `T`; the view borrows the buffer.
    unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr().cast::<T>(), len) }
}

/// `buffer` cut into consecutive slices of `lengths` (which must fit in it).
fn split_lengths<T>(mut buffer: &mut [T], lengths: impl Iterator<Item = usize>) -> Vec<&mut [T]> {
    lengths
        .map(|len| {
            let (head, tail) = std::mem::take(&mut buffer).split_at_mut(len);
            buffer = tail;
            head
        })
        .collect()
}

/// One local replica's handle: the local group's member, and the backend for the cross-process
/// step its thread makes when it is local replica 0.
#[derive(Debug)]
struct MpiMember {
    member: Member,
    inner: Arc<Inner>,
    /// This replica's device, for results of calls it passed no tensor to.
    device: String,
}

impl MpiMember {
    fn local_replicas(&self) -> usize {
        self.inner.group.num_replicas()
    }

    /// Runs `cross` on local replica 0's thread and hands its `count` tensors to every local
    /// replica, each labelled with `device`. A failure of `cross` aborts the local group, so the
    /// other local replicas fail too instead of waiting.
    fn via_leader(
        &self,
        count: usize,
        device: &str,
        cross: impl FnOnce() -> Result<Vec<Tensor>, CollectiveError>,
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if self.local_replicas() == 1 {
            return cross();
        }
        if self.member.replica() == 0 {
            let results = cross().inspect_err(|e| self.inner.group.abort(e.to_string()))?;
            for t in &results {
                self.member.broadcast(0, Some(t))?;
            }
            return Ok(results);
        }
        (0..count)
            .map(|_| self.member.broadcast(0, None)?.copy_to(device))
            .collect()
    }

    /// The local reduction of every local replica's `tensors` (themselves with one replica).
    fn local_batch(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if self.local_replicas() == 1 {
            return tensors.iter().map(Tensor::to_host).collect();
        }
        self.member
            .batch_all_reduce(op, tensors)?
            .iter()
            .map(Tensor::to_host)
            .collect()
    }
}

impl ReplicaCollectives for MpiMember {
    fn replica(&self) -> usize {
        self.member.replica()
    }

    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let mut out = self.batch_all_reduce(op, std::slice::from_ref(tensor))?;
        Ok(out.swap_remove(0))
    }

    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if let Some(t) = tensors.first() {
            kernel::check_op(op, t.dtype())?;
        }
        let local = self.local_batch(local_op(op), tensors)?;
        let inner = &self.inner;
        let plan = FusionPlan::new(&local, inner.bytes_per_pack);
        let total = inner.workers() * self.local_replicas();
        let device = tensors.first().map_or("", |t| t.device());
        // One tensor is its own bucket: no packing, no unpacking (a copy each way saved).
        let single = local.len() == 1;
        let buckets = self.via_leader(plan.num_buckets(), device, || {
            let refs: Vec<&Tensor> = local.iter().collect();
            let record = Record::of(Call::AllReduce, Some(op), &refs);
            match single {
                true => inner.reduce_across(record, op, total, &local),
                false => inner.reduce_across(record, op, total, &plan.pack(&local)?),
            }
        })?;
        let reduced = match single {
            true => buckets,
            false => plan.unpack(&buckets)?,
        };
        reduced
            .into_iter()
            .zip(tensors)
            .map(|(r, t)| r.copy_to(t.device()))
            .collect()
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let local = if self.local_replicas() == 1 {
            tensor.to_host()?
        } else {
            self.member.all_gather(tensor)?.to_host()?
        };
        let inner = &self.inner;
        let mut out = self.via_leader(1, tensor.device(), || {
            let records = inner.agree(Record::of(Call::AllGather, None, &[&local]), "")?;
            if local.rank() == 0 {
                return Err(CollectiveError::InvalidArgument(
                    "all_gather concatenates along the first axis: a scalar has none; reshape \
                     it to [1]"
                        .into(),
                ));
            }
            if inner.workers() == 1 {
                return Ok(vec![local.clone()]);
            }
            let row: usize = local.shape()[1..].iter().product();
            let rows: Vec<usize> = records.iter().map(|r| r.rows as usize).collect();
            let (counts, displs) =
                gather_layout(rows.iter().map(|&r| r * row), local.dtype().size_in_bytes())?;
            let total_rows: usize = rows.iter().sum();
            let mut shape = local.shape().to_vec();
            shape[0] = total_rows;
            with_dtype!(local.dtype(), T => {
                let mine: Vec<T> = local.to_vec::<T>()?;
                let mut all = vec![T::zero(); total_rows * row];
                inner.world.all_gather_varcount(
                    as_bytes(&mine),
                    as_bytes_mut(&mut all),
                    &counts,
                    &displs,
                    inner.deadline,
                    &|| format!("the all_gather of {local}"),
                );
                Ok(vec![Tensor::from_vec(tensor.device(), &shape, all)?])
            })
        })?;
        out.swap_remove(0).copy_to(tensor.device())
    }

    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let reduced = self.all_reduce(op, tensor)?;
        let n = self.inner.workers() * self.local_replicas();
        let rows = reduced.shape().first().copied().unwrap_or(0);
        if rows % n != 0 {
            return Err(CollectiveError::InvalidArgument(format!(
                "reduce_scatter: the first dimension ({rows}) must divide evenly among the {n} \
                 replicas of every worker"
            )));
        }
        let part = rows / n;
        let global = self.inner.world.rank() * self.local_replicas() + self.member.replica();
        reduced.slice_rows(global * part..(global + 1) * part)
    }

    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError> {
        let inner = &self.inner;
        let r = self.local_replicas();
        if root >= inner.workers() * r {
            return Err(CollectiveError::InvalidArgument(format!(
                "broadcast root {root} is out of range for {} replicas ({} workers × {r})",
                inner.workers() * r,
                inner.workers()
            )));
        }
        let (root_worker, local_root) = (root / r, root % r);
        let device = tensor.map_or_else(|| self.device.clone(), |t| t.device().to_owned());
        let local = if inner.world.rank() != root_worker {
            None
        } else if r == 1 {
            Some(
                tensor
                    .ok_or_else(|| {
                        CollectiveError::InvalidArgument(format!(
                            "broadcast: the root replica {root} passed no tensor"
                        ))
                    })?
                    .to_host()?,
            )
        } else {
            Some(self.member.broadcast(local_root, tensor)?.to_host()?)
        };
        let mut out = self.via_leader(1, &device, || {
            let record = match &local {
                Some(t) => Record::of(Call::Broadcast, None, &[t]),
                None => Record::bare(Call::Broadcast, Status::Ok),
            };
            let records = inner.agree(record.with_extra(root as i64), "")?;
            let source = &records[root_worker];
            let (Some(dtype), Some(shape)) = (source.single_dtype(), source.shape()) else {
                return Err(CollectiveError::InvalidArgument(format!(
                    "broadcast across workers carries tensors of rank up to {}",
                    super::agreement::MAX_DIMS
                )));
            };
            if inner.workers() == 1 {
                return Ok(vec![local.clone().expect("one worker is the root")]);
            }
            with_dtype!(dtype, T => {
                let mut values: Vec<T> = match &local {
                    Some(t) => t.to_vec::<T>()?,
                    None => vec![T::zero(); shape.iter().product()],
                };
                inner.world.broadcast(root_worker, as_bytes_mut(&mut values), inner.deadline, &|| {
                    format!("the broadcast from replica {root}")
                });
                Ok(vec![Tensor::from_vec(&device, &shape, values)?])
            })
        })?;
        out.swap_remove(0).copy_to(&device)
    }
}

impl CrossDeviceOps for MpiAllReduce {
    fn name(&self) -> &'static str {
        "MpiAllReduce"
    }

    /// The reduction of this worker's `values` and every other worker's (each worker passes its
    /// local replicas' values, dense), delivered to this worker's `destinations`.
    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        let mut out = self.batch_reduce(op, &[(values, destinations)])?;
        Ok(out.swap_remove(0))
    }

    /// Every pair reduced over its local values, then one agreement and one cross-process
    /// collective per fused bucket of the local results.
    fn batch_reduce(
        &self,
        op: ReduceOp,
        pairs: &[(&[AnyTensor], &Destinations)],
    ) -> Result<Vec<Leaf<AnyTensor>>, CollectiveError> {
        let inner = &self.inner;
        let mut local = Vec::with_capacity(pairs.len());
        let mut count = None;
        for (values, destinations) in pairs {
            let dense: Vec<&Tensor> = values
                .iter()
                .map(|v| match v {
                    AnyTensor::Dense(t) => Ok(t),
                    AnyTensor::Sparse(_) => Err(CollectiveError::Unimplemented(
                        "sparse (IndexedSlices) values across workers: densify them first".into(),
                    )),
                })
                .collect::<Result<_, _>>()?;
            if count.is_some_and(|c| c != dense.len()) {
                return Err(CollectiveError::InvalidArgument(
                    "a batch_reduce across workers needs the same number of values in every pair"
                        .into(),
                ));
            }
            count = Some(dense.len());
            let first = dense.first().ok_or_else(|| {
                CollectiveError::InvalidArgument("cannot reduce an empty list of values".into())
            })?;
            kernel::check_op(op, first.dtype())?;
            let host: Vec<Tensor> = dense
                .iter()
                .map(|t| t.to_host())
                .collect::<Result<_, _>>()?;
            let refs: Vec<&Tensor> = host.iter().collect();
            local.push(kernel::reduce_tensors(
                local_op(op),
                &refs,
                &destinations.as_slice()[0],
                1,
            )?);
        }
        let count = count.unwrap_or(0);
        let refs: Vec<&Tensor> = local.iter().collect();
        let record = Record::of(Call::Reduce, Some(op), &refs).with_extra(count as i64);
        let plan = FusionPlan::new(&local, inner.bytes_per_pack);
        let buckets =
            inner.reduce_across(record, op, count * inner.workers(), &plan.pack(&local)?)?;
        plan.unpack(&buckets)?
            .into_iter()
            .zip(pairs)
            .map(|(reduced, (_, destinations))| {
                let reduced = AnyTensor::Dense(reduced);
                deliver(destinations, |device| reduced.copy_to(device))
            })
            .collect()
    }

    fn replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Box<dyn ReplicaCollectives>, CollectiveError> {
        Ok(Box::new(self.member(replica)?))
    }

    fn movable_replica_collectives(
        &self,
        replica: usize,
    ) -> Result<Option<Box<dyn ReplicaCollectives + Send>>, CollectiveError> {
        // MPI runs with MPI_THREAD_SERIALIZED and every cross-process call is made under one
        // lock, so the thread that makes it may change from call to call.
        Ok(Some(Box::new(self.member(replica)?)))
    }

    fn num_replicas(&self) -> Option<usize> {
        Some(self.local_replicas())
    }
}

impl StepLifecycle for MpiAllReduce {
    fn abort(&self, reason: &str) {
        self.inner.group.abort(reason);
    }

    fn reset(&self) {
        self.inner.group.reset();
        *lock(&self.inner.remote_failure) = None;
    }

    fn begin_step(&self) {
        self.inner.group.rendezvous().begin_step();
    }

    fn replica_finished(&self, replica: usize) {
        // The hook has no error channel; a replica outside the group has no barrier to leave.
        let _ = self.inner.group.rendezvous().finish(replica);
    }
}

/// The byte counts and displacements of an all-gather whose workers send `elements` elements of
/// `size` bytes each, in worker order: MPI counts them in `i32`, so a part or an offset past
/// 2 GiB is an error rather than a wrapped count.
fn gather_layout(
    elements: impl Iterator<Item = usize>,
    size: usize,
) -> Result<(Vec<i32>, Vec<i32>), CollectiveError> {
    let too_big = || {
        CollectiveError::InvalidArgument(
            "an all-gather across workers moves at most 2 GiB per worker".into(),
        )
    };
    let counts: Vec<i32> = elements
        .map(|n| {
            n.checked_mul(size)
                .and_then(|bytes| i32::try_from(bytes).ok())
                .ok_or_else(too_big)
        })
        .collect::<Result<_, _>>()?;
    let displs: Vec<i32> = counts
        .iter()
        .scan(0i64, |at, &c| {
            let here = *at;
            *at += i64::from(c);
            Some(i32::try_from(here).map_err(|_| too_big()))
        })
        .collect::<Result<_, _>>()?;
    Ok((counts, displs))
}
