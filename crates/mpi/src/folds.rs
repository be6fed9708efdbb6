//! The cross-worker folds: every element folded exactly once, in worker order, by the same
//! kernel on every path (inline in the agreement, all-gathered, reduce-scattered then
//! all-gathered), so every worker gets the same bits; and the buffers they fold into.
use crate::agreement::{INLINE_BYTES, SLOT_WORDS};
use crate::shared::Shared;
use distribute_collectives::CollectiveError;
use distribute_collectives::backend::Record;
use distribute_tensor::{Element, Tensor};
use distribute_tensor::{
    bytes::{element_bytes as as_bytes, element_bytes_mut as as_bytes_mut, tensor_bytes},
    kernel::{Arith, contiguous, divide, reduce_slices},
    with_dtype,
};
use distribute_values::ReduceOp;
use ndarray::ArcArray;
use std::borrow::Cow;

/// From this many bytes the workers reduce-scatter + all-gather instead of all-gathering whole
/// buffers (which moves W−1 buffers into each worker, and folds all of it on every worker).
pub const SCATTER_MIN_BYTES: usize = 64 * 1024;

/// From this many bytes a fold's result is written into the buffer of an earlier result of the
/// same shape once no one holds it any more (the backend keeps a share of the last
/// [`KEPT_OUTPUTS`]): a fresh buffer this large costs a page fault per 4 KiB, about as much as
/// moving its bytes between workers.
pub(crate) const REUSE_MIN_BYTES: usize = 256 * 1024;

/// Results of at least [`REUSE_MIN_BYTES`] the backend keeps a share of.
pub(crate) const KEPT_OUTPUTS: usize = 4;

/// Tags of the two phases of [`Shared::scatter_fold`].
pub(crate) const REDUCE_SCATTER_TAG: i32 = 1;
pub(crate) const ALL_GATHER_TAG: i32 = 2;

/// The op local replicas reduce with: `Mean` sums, and divides once everything is summed.
pub(crate) fn local_op(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Mean => ReduceOp::Sum,
        other => other,
    }
}

impl Shared {
    /// The agreement on `record` and the reduction across workers of every bucket (host
    /// tensors, each worker's local result), `Mean` divided by `count` contributions. One bucket
    /// of at most [`INLINE_BYTES`] travels with the agreement: one round trip in all.
    pub(crate) fn reduce_across(
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
                owned_bytes = tensor_bytes(t)?;
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
    pub(crate) fn fold_slots<T: Arith>(
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
            reduce_slices(op, &blocks, &mut out, count);
        }
        Ok(Tensor::from_vec(like.device(), like.shape(), out)?)
    }

    /// The fold across workers of every worker's host `tensor` (same dtype and shape
    /// everywhere, agreed before), `Mean` divided by `count`: see the module docs for the two
    /// paths.
    pub(crate) fn fold_across(
        &self,
        op: ReduceOp,
        count: usize,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        if self.workers() == 1 {
            return match op {
                ReduceOp::Mean => Ok(divide(tensor, count)?),
                _ => Ok(tensor.clone()),
            };
        }
        with_dtype!(tensor.dtype(), T => self.fold_typed::<T>(op, count, tensor))
    }

    pub(crate) fn fold_typed<T: Arith>(
        &self,
        op: ReduceOp,
        count: usize,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let array = tensor.array::<T>()?;
        let data: Cow<'_, [T]> = match contiguous(array) {
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
    pub(crate) fn gather_fold<T: Arith>(
        &self,
        op: ReduceOp,
        count: usize,
        data: &[T],
        out: &mut [T],
        what: &dyn Fn() -> String,
    ) {
        let (w, n) = (self.workers(), data.len());
        let mut scratch = self.scratch.lock();
        let received = scratch_of::<T>(&mut scratch, n * w);
        self.world
            .all_gather(as_bytes(data), as_bytes_mut(received), self.deadline, what);
        let blocks: Vec<&[T]> = received.chunks(n.max(1)).take(w).collect();
        if n > 0 {
            reduce_slices(op, &blocks, out, count);
        }
    }

    /// Reduce-scatter then all-gather, point to point straight between the caller's buffers:
    /// worker `p` receives every worker's part `p`, folds them in worker order into its part of
    /// `out`, and sends that part to every other worker, which receives it into its own `out`.
    /// Each worker moves (W−1)/W of the buffer in and out twice, folds 1/W of it, and copies
    /// nothing locally.
    pub(crate) fn scatter_fold<T: Arith>(
        &self,
        op: ReduceOp,
        count: usize,
        data: &[T],
        out: &mut [T],
    ) {
        let (w, me, n) = (self.workers(), self.world.rank(), data.len());
        let part = n.div_ceil(w);
        let range = |p: usize| (p * part).min(n)..((p + 1) * part).min(n);
        let mine = range(me);
        self.scatter_part(op, count, data, &mut out[mine]);
        let peers = || (0..w).filter(move |&p| p != me);
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

    /// [`scatter_fold`](Self::scatter_fold)'s first half, the reduce-scatter: this worker's
    /// part of the fold (part `p` of `ceil(n / W)` elements for worker `p`) into `out`.
    pub(crate) fn scatter_part<T: Arith>(
        &self,
        op: ReduceOp,
        count: usize,
        data: &[T],
        out: &mut [T],
    ) {
        let (w, me, n) = (self.workers(), self.world.rank(), data.len());
        let part = n.div_ceil(w);
        let range = |p: usize| (p * part).min(n)..((p + 1) * part).min(n);
        let mine = range(me);
        let peers = || (0..w).filter(move |&p| p != me);
        let mut scratch = self.scratch.lock();
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
            reduce_slices(op, &blocks, out, count);
        }
    }

    /// This worker's part of the fold across workers of every worker's host `tensor` (same
    /// dtype and shape everywhere, agreed before; its first dimension divisible by the worker
    /// count): worker `p` gets rows `[p·rows/W, (p+1)·rows/W)`, folded in worker order exactly as
    /// [`fold_across`](Self::fold_across) folds them, so the part is the same bits as that slice
    /// of the all-reduce, while only the part is received and held (a reduce-scatter).
    pub(crate) fn fold_part(
        &self,
        op: ReduceOp,
        count: usize,
        tensor: &Tensor,
    ) -> Result<Tensor, CollectiveError> {
        let w = self.workers();
        let rows = tensor.shape().first().copied().unwrap_or(0);
        let me = self.world.rank();
        let mine = me * rows / w..(me + 1) * rows / w;
        if w == 1 || tensor.size_in_bytes() < SCATTER_MIN_BYTES {
            return Ok(self.fold_across(op, count, tensor)?.slice_rows(mine)?);
        }
        with_dtype!(tensor.dtype(), T => {
            let array = tensor.array::<T>()?;
            let data: Cow<'_, [T]> = match contiguous(array) {
                Some(slice) => Cow::Borrowed(slice),
                None => Cow::Owned(array.iter().copied().collect()),
            };
            let mut shape = tensor.shape().to_vec();
            shape[0] = mine.len();
            let mut out = vec![T::zero(); data.len() / w];
            self.scatter_part(op, count, &data, &mut out);
            Ok(Tensor::from_vec(tensor.device(), &shape, out)?)
        })
    }

    /// A tensor like `like` (dtype, shape, device) to write a fold into: the buffer of an
    /// earlier result that no one holds any more, else a fresh one.
    pub(crate) fn output<T: Element>(&self, like: &Tensor) -> Result<Tensor, CollectiveError> {
        if like.size_in_bytes() >= REUSE_MIN_BYTES {
            let mut kept = self.kept_outputs.lock();
            let free = kept.iter().position(|t| {
                t.shape() == like.shape() && t.array::<T>().is_ok_and(ArcArray::is_unique)
            });
            if let Some(i) = free {
                // The kept share drops on return, leaving the result the buffer's only holder.
                return Ok(kept.remove(i).copy_to_device_of(like)?);
            }
        }
        Ok(Tensor::from_vec(
            like.device(),
            like.shape(),
            vec![T::zero(); like.num_elements()],
        )?)
    }

    /// Keeps a share of a large `result` so that, once its holders drop it, the next fold of
    /// its size writes into it instead of faulting in fresh pages.
    pub(crate) fn keep_for_reuse(&self, result: &Tensor) {
        if result.size_in_bytes() < REUSE_MIN_BYTES {
            return;
        }
        let mut kept = self.kept_outputs.lock();
        if kept.len() == KEPT_OUTPUTS {
            kept.remove(0);
        }
        kept.push(result.clone());
    }
}

/// `buffer` viewed as `len` elements of `T`, grown to fit.
pub(crate) fn scratch_of<T: Element>(buffer: &mut Vec<u64>, len: usize) -> &mut [T] {
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    if buffer.len() < words {
        buffer.resize(words, 0);
    }
    // SAFETY: the buffer is 8-byte aligned (u64s), at least `len` elements of `T` long, and any
    // bit pattern is a valid `T`; the view borrows the buffer.
    unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr().cast::<T>(), len) }
}

/// `buffer` cut into consecutive slices of `lengths` (which must fit in it).
pub(crate) fn split_lengths<T>(
    mut buffer: &mut [T],
    lengths: impl Iterator<Item = usize>,
) -> Vec<&mut [T]> {
    lengths
        .map(|len| {
            let (head, tail) = std::mem::take(&mut buffer).split_at_mut(len);
            buffer = tail;
            head
        })
        .collect()
}
