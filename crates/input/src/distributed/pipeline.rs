//! One local input pipeline: its [`Plan`] (dataset, share of the pieces, replicas' devices)
//! and its steps ([`LocalSteps`]). The pipeline cuts its dataset's batches into *pieces*
//! (slices of batches, in order), keeps its share of them, and hands its replicas one piece
//! each per step ([`LocalStep`]), sliced, placed and padded as the plan says.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use crate::dataset::Cut;
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
        let placed = piece.0.slice_rows_onto(piece.1.clone(), device)?;
        self.push_placed(placed, piece.1.len(), plan)
    }

    /// Adds `piece` as [`push`](Self::push) does, sliced from the copy of its batch placed on
    /// `device` that `placed` keeps (made once per batch and replica, then reused for every
    /// piece of the same batch): slicing a placed batch shares its device name, where placing
    /// every piece would allocate one per tensor per step, freed on the consumer's thread.
    fn push_via(
        &mut self,
        piece: &Piece<B>,
        plan: &Plan<B>,
        device: &str,
        placed: &mut Option<(Arc<B>, B)>,
    ) -> Result<(), InputError> {
        let (batch, range) = piece;
        let on_device = match placed {
            Some((source, on_device)) if Arc::ptr_eq(source, batch) => on_device,
            _ => {
                &placed
                    .insert((Arc::clone(batch), batch.to_device(device)?))
                    .1
            }
        };
        let sliced = on_device.slice_rows(range.clone())?;
        self.push_placed(sliced, range.len(), plan)
    }

    /// Adds a replica's batch of `real` rows, padded as `plan` says.
    fn push_placed(&mut self, batch: B, real: usize, plan: &Plan<B>) -> Result<(), InputError> {
        if plan.partial == PartialBatch::PadWithMask {
            self.batches.push(batch.pad_rows(plan.full_piece)?);
            self.real.push(real);
        } else {
            self.batches.push(batch);
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

/// A piece not yet placed: rows `range` of a batch (often a whole source block, which the
/// dataset's batch is a range of). Slicing and placing happen in one go once the replica is
/// known, which touches the source buffer's shared reference count once per piece instead of
/// three times (a slice, a placed copy, the slice dropped); the consumer's thread touches that
/// count too, so every touch can cost a cache miss.
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
    /// For each replica, the batch its last piece came from and that batch placed on the
    /// replica's device, reused while pieces come from the same batch.
    placed: Vec<Option<(Arc<B>, B)>>,
    pub(super) ended: bool,
}

impl<B: Batch> LocalSteps<B> {
    pub(super) fn new(plan: Arc<Plan<B>>) -> Self {
        LocalSteps {
            batches: plan.dataset.iter(),
            placed: vec![None; plan.placement.len()],
            plan,
            ready: VecDeque::new(),
            empty: None,
            ended: false,
        }
    }

    fn cut(&mut self, batch: Cut<B>) -> Result<(), InputError> {
        let plan = &self.plan;
        // Rows of a block were counted when the block was read.
        let (batch, first, rows) = match batch {
            Cut::Rows(block, range) => (block, range.start, range.len()),
            Cut::Own(batch) => {
                let rows = batch.rows("a dataset batch")?;
                (Arc::new(batch), 0, rows)
            }
        };
        if plan.partial == PartialBatch::DropRemainder && rows < plan.full_batch {
            // Only the last batch is short.
            self.ended = true;
            return Ok(());
        }
        if self.empty.is_none() {
            self.empty = Some(zero_rows(&*batch)?);
        }
        let mut offset = first;
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
            match self.batches.next_cut() {
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
        let LocalSteps {
            plan,
            empty,
            ready,
            placed,
            ..
        } = self;
        let empty_piece = || {
            let empty = empty.as_ref().expect("set by the batch that made a piece");
            (Arc::clone(empty), 0..0)
        };
        let mut step = LocalStep::with_capacity(replicas, plan.partial);
        match plan.keep {
            None => {
                for (device, placed) in plan.placement.iter().zip(placed) {
                    let piece = ready.pop_front().unwrap_or_else(empty_piece);
                    step.push_via(&piece, plan, device, placed)?;
                }
            }
            Some((num, mine)) => {
                let mut mine = ready.drain(..take).skip(mine).step_by(num);
                for (device, placed) in plan.placement.iter().zip(placed) {
                    let piece = mine.next().unwrap_or_else(empty_piece);
                    step.push_via(&piece, plan, device, placed)?;
                }
            }
        }
        Ok(Some(step))
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
