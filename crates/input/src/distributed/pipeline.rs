//! One local input pipeline: its [`Plan`] (dataset, share of the pieces, replicas' devices)
//! and its steps ([`LocalSteps`]). The pipeline cuts its dataset's batches into *pieces*
//! (slices of batches, in order), keeps its share of them, and hands its replicas one piece
//! each per step ([`LocalStep`]), sliced, placed and padded as the plan says.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use crate::split::split_sizes_iter;
use crate::{Batch, Dataset, DatasetIter, InputError, Masked, PartialBatch};

/// One local input pipeline: its dataset, its share of the pieces and its replicas' devices.
pub(super) struct Plan<B: Batch> {
    pub(super) dataset: Dataset<B>,
    /// Pieces each batch is cut into (1 for whole batches).
    pub(super) pieces_per_batch: usize,
    /// `(P, p)` under data sharding: this is pipeline `p` of `P`, all reading the same stream.
    pub(super) keep: Option<(usize, usize)>,
    /// Rows of a full piece, the size padding pads to.
    pub(super) full_piece: usize,
    /// Rows of a full batch, below which `DropRemainder` drops a batch (0 for rebatched data,
    /// whose sizes vary by design).
    pub(super) full_batch: usize,
    pub(super) partial: PartialBatch,
    /// Where each replica's batch is placed.
    pub(super) placement: Vec<String>,
}

/// A local step: each replica's batch and, under [`PartialBatch::PadWithMask`], how many of
/// its rows are real. Without padding every row is real and `real` stays empty, which saves a
/// vector per step.
pub(super) struct LocalStep<B> {
    pub(super) batches: Vec<B>,
    pub(super) real: Vec<usize>,
}

impl<B: Batch> LocalStep<B> {
    pub(super) fn with_capacity(replicas: usize, partial: PartialBatch) -> Self {
        let padded = partial == PartialBatch::PadWithMask;
        LocalStep {
            batches: Vec::with_capacity(replicas),
            real: Vec::with_capacity(if padded { replicas } else { 0 }),
        }
    }

    /// Adds `piece`, sliced, placed on `device` and padded as `plan` says.
    pub(super) fn push(
        &mut self,
        piece: &Piece<B>,
        plan: &Plan<B>,
        device: &str,
    ) -> Result<(), InputError> {
        self.batches.push(finish(piece, plan, device)?);
        if plan.partial == PartialBatch::PadWithMask {
            self.real.push(piece.1.len());
        }
        Ok(())
    }

    /// Each batch with its mask: 1.0 for real rows, 0.0 for padding.
    pub(super) fn masked(self) -> Result<Vec<Masked<B>>, InputError> {
        let LocalStep { batches, real } = self;
        batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let rows = b.rows("a replica's batch")?;
                Masked::pad(b, real.get(i).copied().unwrap_or(rows), rows)
            })
            .collect()
    }
}

/// A piece not yet placed: rows `range` of a batch. Slicing and placing happen in one go once
/// the replica is known, which touches the source buffer's shared reference count once per
/// piece instead of three times (a slice, a placed copy, the slice dropped); the consumer's
/// thread touches that count too, so every touch can cost a cache miss.
pub(super) type Piece<B> = (Arc<B>, Range<usize>);

/// A 0-row batch of `batch`'s structure. A copy, not a slice: a slice would keep the whole
/// batch's buffer (often a whole file's block) alive for as long as the empty batch is kept.
pub(super) fn zero_rows<B: Batch>(batch: &B) -> Result<Arc<B>, InputError> {
    Ok(Arc::new(batch.select_rows(&[])?))
}

/// One pipeline's steps: its kept pieces, one per replica per step.
pub(super) struct LocalSteps<B: Batch> {
    pub(super) plan: Arc<Plan<B>>,
    pub(super) batches: DatasetIter<B>,
    /// Pieces cut from batches and not yet handed out.
    pub(super) ready: VecDeque<Piece<B>>,
    /// A 0-row batch of the dataset's structure, for replicas without data.
    pub(super) empty: Option<Arc<B>>,
    pub(super) ended: bool,
}

impl<B: Batch> LocalSteps<B> {
    pub(super) fn new(plan: Arc<Plan<B>>) -> Self {
        LocalSteps {
            batches: plan.dataset.iter(),
            plan,
            ready: VecDeque::new(),
            empty: None,
            ended: false,
        }
    }

    fn cut(&mut self, batch: B) -> Result<(), InputError> {
        let plan = &self.plan;
        let rows = batch.rows("a dataset batch")?;
        if plan.partial == PartialBatch::DropRemainder && rows < plan.full_batch {
            // Only the last batch is short.
            self.ended = true;
            return Ok(());
        }
        if self.empty.is_none() {
            self.empty = Some(zero_rows(&batch)?);
        }
        let batch = Arc::new(batch);
        let mut offset = 0;
        for size in split_sizes_iter(rows, plan.pieces_per_batch) {
            self.ready
                .push_back((Arc::clone(&batch), offset..offset + size));
            offset += size;
        }
        Ok(())
    }

    /// The next step. Under data sharding a step is a group of `P·R` consecutive pieces of
    /// the stream every pipeline reads, piece `j` going to pipeline `j mod P`, replica
    /// `j div P`; so all pipelines agree on the number of steps, and one whose share of the
    /// last group is short gets empty batches (IN-27, IN-30).
    fn step(&mut self) -> Result<Option<LocalStep<B>>, InputError> {
        let replicas = self.plan.placement.len();
        let group = self.plan.keep.map_or(replicas, |(num, _)| num * replicas);
        while self.ready.len() < group && !self.ended {
            match self.batches.next() {
                Some(batch) => self.cut(batch?)?,
                None => self.ended = true,
            }
        }
        if self.ready.is_empty()
            || (self.ready.len() < group && self.plan.partial == PartialBatch::DropRemainder)
        {
            self.ready.clear();
            return Ok(None);
        }
        let take = group.min(self.ready.len());
        let (plan, empty) = (&self.plan, &self.empty);
        let empty_piece = || {
            let empty = empty.as_ref().expect("set by the batch that made a piece");
            (Arc::clone(empty), 0..0)
        };
        let mut step = LocalStep::with_capacity(replicas, plan.partial);
        match plan.keep {
            None => {
                for device in &plan.placement {
                    let piece = self.ready.pop_front().unwrap_or_else(empty_piece);
                    step.push(&piece, plan, device)?;
                }
            }
            Some((num, mine)) => {
                let mut mine = self.ready.drain(..take).skip(mine).step_by(num);
                for device in &plan.placement {
                    let piece = mine.next().unwrap_or_else(empty_piece);
                    step.push(&piece, plan, device)?;
                }
            }
        }
        Ok(Some(step))
    }
}

/// Slices, places and (if the policy says so) pads one replica's batch.
fn finish<B: Batch>(
    (batch, range): &Piece<B>,
    plan: &Plan<B>,
    device: &str,
) -> Result<B, InputError> {
    let piece = batch.slice_rows_onto(range.clone(), device)?;
    if plan.partial == PartialBatch::PadWithMask {
        piece.pad_rows(plan.full_piece)
    } else {
        Ok(piece)
    }
}

impl<B: Batch> Iterator for LocalSteps<B> {
    type Item = Result<LocalStep<B>, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended && self.ready.is_empty() {
            return None;
        }
        match self.step() {
            Ok(step) => step.map(Ok),
            Err(e) => {
                self.ended = true;
                self.ready.clear();
                Some(Err(e))
            }
        }
    }
}
