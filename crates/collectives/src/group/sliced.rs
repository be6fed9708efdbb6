//! A large reduction's work, shared by the replicas: each output (`SlicedWork`) is cut into
//! pieces of whole cache lines that the replicas claim one at a time, and every element is folded
//! in replica order by exactly one thread, so the bits do not depend on who computed what. The
//! fold (`reduce_into`) is also how the last arriver reduces a small call alone.

use distribute_values::ReduceOp;

use distribute_tensor::kernel::{self, Arith, ExactInt, Stores};
use distribute_tensor::with_dtype;
use distribute_tensor::{DType, Tensor};

/// A shared output that the replicas fill in parallel, one disjoint piece at a time.
pub(super) struct SlicedWork {
    pub(super) op: ReduceOp,
    pub(super) inputs: Vec<Tensor>,
    /// What the replicas get: the output, or (in a batch) this tensor's part of its bucket's
    /// output; either way it keeps the written buffer alive.
    pub(super) result: Tensor,
    /// Address of the first element written, through which the replicas write.
    pub(super) output_ptr: usize,
    /// How many elements are written.
    pub(super) len: usize,
    /// How the output is written: streaming stores when it is larger than the caches.
    pub(super) stores: Stores,
}

/// Elements `start..end` of output `work`: one replica's unit of work in a sliced reduction.
pub(super) struct Piece {
    pub(super) work: usize,
    pub(super) start: usize,
    pub(super) end: usize,
}

/// The most output bytes in one piece of a sliced reduction: large enough that claiming a piece
/// (one atomic add) costs nothing beside it, small enough that a replica the scheduler holds
/// back mid-piece delays the others by little.
const PIECE_BYTES: usize = 512 << 10;

/// Cuts the outputs of `works` into pieces of at most [`PIECE_BYTES`], at least one per
/// replica (of `num_replicas`) for each output, each a whole number of cache lines (of the
/// output's elements) so that two replicas rarely write one line.
pub(super) fn pieces(works: &[SlicedWork], num_replicas: usize) -> Vec<Piece> {
    let mut pieces = Vec::new();
    for (w, work) in works.iter().enumerate() {
        let len = work.len;
        let size = work.result.dtype().size_in_bytes();
        let line = (64 / size).max(1);
        let piece = len
            .div_ceil(num_replicas)
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

impl SlicedWork {
    /// Reduces elements `start..end` of every input into the output. Callers give disjoint
    /// ranges and read the output only after all ranges are done.
    pub(super) fn reduce_range(&self, start: usize, end: usize, num_replicas: usize) {
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
pub(super) struct Output {
    pub(super) dtype: DType,
    pub(super) ptr: usize,
    pub(super) stores: Stores,
}

/// Reduces elements `start..end` of the contiguous `inputs` (one dtype and shape) into
/// `output`, dividing a `Mean` by `num_replicas`.
///
/// # Safety
///
/// `output.ptr` must point at the elements of a live tensor of `output.dtype` (the reduced
/// dtype of the inputs') holding at least `end` elements, that nothing else writes or reads in
/// `start..end` while this runs.
pub(super) unsafe fn reduce_into<I: std::borrow::Borrow<Tensor>>(
    op: ReduceOp,
    inputs: &[I],
    output: Output,
    start: usize,
    end: usize,
    num_replicas: usize,
) {
    fn slices<T: distribute_tensor::Element, I: std::borrow::Borrow<Tensor>>(
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
    use crate::group::testing::{bits, input, run_on};
    use crate::group::{CollectiveGroup, GroupConfig, ReducePlan};

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
            let pieces = pieces(&works, 3);
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
