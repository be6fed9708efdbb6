//! [`Dataset`]: a re-iterable pipeline of batches, read from a [`Source`] (in memory,
//! `.npy` files, CSV files, or a user's own), optionally repeated, shuffled, sharded and
//! batched; its combinators, and [`DatasetIter`], which cuts the source's blocks into batches.
//! The sources themselves live in `source.rs` (the trait and the built-in ones), `npy.rs`
//! and `csv_source.rs`.
//!
//! Sources hand out *blocks* of rows (a whole in-memory array, one file); batching cuts and joins
//! blocks along the rows, sharing buffers where a batch lies inside one block. Every call to
//! [`Dataset::iter`] starts from the beginning, so iterating twice gives the same batches.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use distribute_tensor::Tensor;

use crate::source::{BoxIter, MemorySource, RangeSource, Source};
use crate::{Batch, InputError};

/// How a dataset groups rows into batches: batches of `sizes[0]`, `sizes[1]`, … rows in turn.
///
/// ```
/// use distribute_input::BatchSpec;
///
/// let spec = BatchSpec { sizes: vec![3, 2], drop_remainder: false };
/// assert_eq!((spec.uniform_size(), spec.max_size()), (None, 3));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSpec {
    /// Rows of each batch, used in turn; a single entry for ordinary batching.
    pub sizes: Vec<usize>,
    /// Whether a short last batch is dropped.
    pub drop_remainder: bool,
}

impl BatchSpec {
    /// The batch size when every batch has the same size.
    pub fn uniform_size(&self) -> Option<usize> {
        let first = *self.sizes.first()?;
        self.sizes.iter().all(|s| *s == first).then_some(first)
    }

    /// The largest batch size.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// How a dataset shuffles its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShuffleSpec {
    /// The seed: the same seed gives the same orders.
    pub seed: u64,
    /// Whether every iteration (epoch) gets a new order, or all repeat the first.
    pub reshuffle_each_iteration: bool,
}

/// A re-iterable pipeline: source → repeat → shuffle → shard rows → batch → shard batches.
///
/// `shard` applies to rows before [`batch`](Self::batch) and to whole batches after it, as
/// TF's `shard` applies to whatever the elements are at that point. Without a batching step the
/// dataset yields one-row batches (every value keeps a leading dimension in this crate).
///
/// ```
/// use distribute_input::Dataset;
///
/// let ds = Dataset::range(10).batch(4, false)?;
/// let batches: Vec<Vec<i64>> = ds.iter().map(|b| b?.to_vec::<i64>().map_err(Into::into))
///     .collect::<Result<_, distribute_input::InputError>>()?;
/// assert_eq!(batches, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
///
/// let sharded = Dataset::range(10).shard(2, 1)?.batch(2, true)?;
/// let first = sharded.iter().next().unwrap()?;
/// assert_eq!(first.to_vec::<i64>()?, [1, 3]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub struct Dataset<B: Batch> {
    source: Arc<dyn Source<Item = B>>,
    repeat: usize,
    row_shard: Option<(usize, usize)>,
    batch: Option<BatchSpec>,
    batch_shard: Option<(usize, usize)>,
    shuffle: Option<ShuffleSpec>,
    /// Iterations started so far, for reshuffling. A clone starts from the same count, so the
    /// clones that input pipelines read shuffle alike and shard consistently.
    epochs: AtomicU64,
}

impl<B: Batch> Clone for Dataset<B> {
    fn clone(&self) -> Self {
        Dataset {
            source: Arc::clone(&self.source),
            repeat: self.repeat,
            row_shard: self.row_shard,
            batch: self.batch.clone(),
            batch_shard: self.batch_shard,
            shuffle: self.shuffle,
            epochs: AtomicU64::new(self.epochs.load(Ordering::Relaxed)),
        }
    }
}

impl<B: Batch> fmt::Debug for Dataset<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("source", &self.source.describe())
            .field("repeat", &self.repeat)
            .field("row_shard", &self.row_shard)
            .field("batch", &self.batch)
            .field("batch_shard", &self.batch_shard)
            .field("shuffle", &self.shuffle)
            .finish()
    }
}

impl Dataset<Tensor> {
    /// The `int64` numbers `0..n` on the host, one per row (TF's `range`), made on demand: see
    /// [`RangeSource`].
    pub fn range(n: usize) -> Dataset<Tensor> {
        Dataset::from_source(RangeSource::new(n))
    }
}

impl<B: Batch> Dataset<B> {
    /// The rows of an in-memory structure of tensors (TF's `from_tensor_slices`).
    pub fn from_tensors(data: B) -> Result<Self, InputError> {
        Ok(Dataset::from_source(MemorySource::new(data)?))
    }

    /// A dataset reading `source`.
    pub fn from_source(source: impl Source<Item = B>) -> Self {
        Dataset::from_shared_source(Arc::new(source))
    }

    /// A dataset reading a shared source.
    pub fn from_shared_source(source: Arc<dyn Source<Item = B>>) -> Self {
        Dataset {
            source,
            repeat: 1,
            row_shard: None,
            batch: None,
            batch_shard: None,
            shuffle: None,
            epochs: AtomicU64::new(0),
        }
    }

    /// The source read.
    pub fn source(&self) -> &Arc<dyn Source<Item = B>> {
        &self.source
    }

    /// The batching step, if any.
    pub fn batch_spec(&self) -> Option<&BatchSpec> {
        self.batch.as_ref()
    }

    /// The source's rows `times` times over (before sharding and batching, so a batch may span
    /// two epochs, as in TF).
    pub fn repeat(mut self, times: usize) -> Result<Self, InputError> {
        if times == 0 {
            return Err(InputError::Pipeline(
                "repeat(0) would make an empty dataset; repeat at least once".into(),
            ));
        }
        if self.row_shard.is_some() || self.batch.is_some() || self.shuffle.is_some() {
            return Err(InputError::Pipeline(
                "repeat must come before shuffle, shard and batch".into(),
            ));
        }
        self.repeat = self.repeat.checked_mul(times).ok_or_else(|| {
            InputError::Pipeline(format!(
                "repeat({times}) after repeat({}) asks for more than usize::MAX passes; repeat \
                 once with the total",
                self.repeat
            ))
        })?;
        Ok(self)
    }

    /// Shuffles the rows of each source block (all rows of in-memory data, each file's rows of
    /// a file source, each [`RangeSource::BLOCK_ROWS`] rows of a range) with a seeded generator: the same seed gives the same order. With
    /// `reshuffle_each_iteration`, each call to [`iter`](Self::iter) gets a new order (IN-38).
    pub fn shuffle(
        mut self,
        seed: u64,
        reshuffle_each_iteration: bool,
    ) -> Result<Self, InputError> {
        if self.row_shard.is_some() || self.batch.is_some() {
            return Err(InputError::Pipeline(
                "shuffle must come before shard and batch".into(),
            ));
        }
        self.shuffle = Some(ShuffleSpec {
            seed,
            reshuffle_each_iteration,
        });
        Ok(self)
    }

    /// Keeps every `num`-th element starting at `index`: rows before [`batch`](Self::batch),
    /// whole batches after it.
    pub fn shard(mut self, num: usize, index: usize) -> Result<Self, InputError> {
        if num == 0 || index >= num {
            return Err(InputError::Pipeline(format!(
                "shard({num}, {index}): the index must be in 0..num and num at least 1"
            )));
        }
        let slot = if self.batch.is_some() {
            &mut self.batch_shard
        } else {
            &mut self.row_shard
        };
        if slot.is_some() {
            return Err(InputError::Pipeline(
                "the dataset is already sharded at this stage; shard once with the combined \
                 count"
                    .into(),
            ));
        }
        *slot = Some((num, index));
        Ok(self)
    }

    /// Groups rows into batches of `size` (the last one shorter unless `drop_remainder`).
    pub fn batch(mut self, size: usize, drop_remainder: bool) -> Result<Self, InputError> {
        if size == 0 {
            return Err(InputError::Pipeline("batch size must be at least 1".into()));
        }
        if self.batch.is_some() {
            return Err(InputError::Pipeline(
                "the dataset is already batched; nested batches are not supported".into(),
            ));
        }
        self.batch = Some(BatchSpec {
            sizes: vec![size],
            drop_remainder,
        });
        Ok(self)
    }

    /// Cuts the rows into batches of `sizes[0]`, `sizes[1]`, … rows in turn, across the
    /// boundaries of any earlier batches (TF's `rebatch` with explicit sizes, IN-46). A size of
    /// 0 gives an empty batch. On a dataset batched without `drop_remainder`, this replaces the
    /// batching; the rows are the same.
    ///
    /// ```
    /// use distribute_input::{batch_sizes_for_worker, Dataset};
    ///
    /// // Worker 1 of 2, 2 replicas each, global batch 7: its replicas' sizes in turn.
    /// let sizes = batch_sizes_for_worker(7, 2, 2, 1)?;
    /// let ds = Dataset::range(7).rebatch(sizes, false)?;
    /// let rows: Vec<usize> = ds.iter().map(|b| Ok(b?.shape()[0])).collect::<Result<_, distribute_input::InputError>>()?;
    /// assert_eq!(rows, [2, 1, 2, 2]);
    /// # Ok::<(), distribute_input::InputError>(())
    /// ```
    pub fn rebatch(
        mut self,
        sizes: impl Into<Vec<usize>>,
        drop_remainder: bool,
    ) -> Result<Self, InputError> {
        let sizes = sizes.into();
        if sizes.iter().all(|s| *s == 0) {
            return Err(InputError::Pipeline(format!(
                "rebatch sizes {sizes:?} take no rows, so the dataset would never end; give at \
                 least one size above 0"
            )));
        }
        if self.batch_shard.is_some() || self.batch.as_ref().is_some_and(|b| b.drop_remainder) {
            return Err(InputError::Pipeline(
                "rebatch cuts the rows again, so it needs a dataset batched without \
                 drop_remainder and not sharded by batch"
                    .into(),
            ));
        }
        self.batch = Some(BatchSpec {
            sizes,
            drop_remainder,
        });
        Ok(self)
    }

    /// The same pipeline reading `source` instead (for file sharding).
    pub(crate) fn with_source(&self, source: Arc<dyn Source<Item = B>>) -> Self {
        Dataset {
            source,
            ..self.clone()
        }
    }

    /// Makes the next [`iter`](Self::iter) iteration number `epoch` (0 for the first), whose
    /// order a shuffle with `reshuffle_each_iteration` depends on: how a resumed job reads the
    /// epoch it stopped in.
    pub(crate) fn set_next_epoch(&self, epoch: u64) {
        self.epochs.store(epoch, Ordering::Relaxed);
    }

    /// The batches, from the start. After an error the iterator ends.
    pub fn iter(&self) -> DatasetIter<B> {
        let origin = self.source.describe();
        let source = Arc::clone(&self.source);
        let repeat = self.repeat;
        let blocks: BoxIter<B> = Box::new((0..repeat).flat_map(move |_| source.blocks()));
        let epoch = self.epochs.fetch_add(1, Ordering::Relaxed);
        let shuffle = self.shuffle.map(|s| {
            let epoch = if s.reshuffle_each_iteration { epoch } else { 0 };
            (s.seed, epoch)
        });
        DatasetIter {
            shuffle,
            blocks_seen: 0,
            blocks,
            origin,
            row_shard: self.row_shard,
            spec: self.batch.clone().unwrap_or(BatchSpec {
                sizes: vec![1],
                drop_remainder: false,
            }),
            slot: 0,
            empty: None,
            exhausted: false,
            batch_shard: self.batch_shard,
            rows_seen: 0,
            batches_seen: 0,
            pending: Vec::new(),
            pending_rows: 0,
            current: None,
            done: false,
        }
    }
}

impl<B: Batch> IntoIterator for &Dataset<B> {
    type Item = Result<B, InputError>;
    type IntoIter = DatasetIter<B>;
    fn into_iter(self) -> DatasetIter<B> {
        self.iter()
    }
}

/// The batches of a [`Dataset`], in order; `None` at the end of data.
pub struct DatasetIter<B: Batch> {
    blocks: BoxIter<B>,
    origin: String,
    /// `(seed, epoch)` when rows are shuffled.
    shuffle: Option<(u64, u64)>,
    blocks_seen: u64,
    row_shard: Option<(usize, usize)>,
    spec: BatchSpec,
    /// How many batches were cut, for the size of the next one.
    slot: usize,
    /// A 0-row batch (its own empty buffer), for sizes of 0.
    empty: Option<B>,
    /// Whether the source has ended.
    exhausted: bool,
    batch_shard: Option<(usize, usize)>,
    /// Rows of the source read so far, for the row shard's phase.
    rows_seen: usize,
    batches_seen: usize,
    /// Parts of the next batch, taken from earlier blocks.
    pending: Vec<B>,
    pending_rows: usize,
    /// The block being cut, with the index of its first unused row and its row count.
    current: Option<(Arc<B>, usize, usize)>,
    done: bool,
}

impl<B: Batch> DatasetIter<B> {
    /// The next block after row sharding, or `None` at the end of the source.
    fn next_block(&mut self) -> Option<Result<(B, usize), InputError>> {
        let block = match self.blocks.next()? {
            Ok(block) => block,
            Err(e) => return Some(Err(e)),
        };
        let rows = match block.rows(&self.origin) {
            Ok(rows) => rows,
            Err(e) => return Some(Err(e)),
        };
        let block = match self.shuffle {
            Some((seed, epoch)) => {
                let order = permutation(rows, seed, epoch, self.blocks_seen);
                match block.select_rows(&order) {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                }
            }
            None => block,
        };
        self.blocks_seen += 1;
        let first = self.rows_seen;
        self.rows_seen += rows;
        let Some((num, index)) = self.row_shard else {
            return Some(Ok((block, rows)));
        };
        let start = (index + num - first % num) % num;
        let kept = if start >= rows {
            0
        } else {
            (rows - start).div_ceil(num)
        };
        Some(block.stride_rows(start, num).map(|b| (b, kept)))
    }

    fn join_pending(&mut self) -> Result<B, InputError> {
        let parts: Vec<&B> = self.pending.iter().collect();
        let joined = B::concat_rows(&parts).map_err(|e| InputError::Mismatch {
            origin: self.origin.clone(),
            detail: format!("consecutive blocks cannot form one batch: {e}"),
        });
        self.pending.clear();
        self.pending_rows = 0;
        joined
    }

    /// The next batch before batch sharding.
    fn next_batch(&mut self) -> Option<Result<Cut<B>, InputError>> {
        let size = self.spec.sizes[self.slot % self.spec.sizes.len()];
        let batch = self.cut(size);
        if matches!(batch, Some(Ok(_))) {
            self.slot += 1;
        }
        batch
    }

    /// The next `size` rows, or fewer at the end.
    fn cut(&mut self, size: usize) -> Option<Result<Cut<B>, InputError>> {
        if size == 0 && !self.exhausted {
            // As TF's rebatch: an empty batch without reading on, so long as the end has not
            // been seen.
            if let Some(empty) = &self.empty {
                return Some(Ok(Cut::Own(empty.clone())));
            }
        }
        loop {
            if self.current.is_none() {
                let next = if self.exhausted {
                    None
                } else {
                    self.next_block()
                };
                match next {
                    Some(Ok((block, rows))) => {
                        if self.empty.is_none() {
                            // A copy: a slice would keep this block alive all pass.
                            match block.select_rows(&[]) {
                                Ok(empty) => self.empty = Some(empty),
                                Err(e) => return Some(Err(e)),
                            }
                        }
                        self.current = Some((Arc::new(block), 0, rows))
                    }
                    Some(Err(e)) => return Some(Err(e)),
                    None => {
                        self.exhausted = true;
                        if self.pending_rows == 0 || self.spec.drop_remainder {
                            return None;
                        }
                        return Some(self.join_pending().map(Cut::Own));
                    }
                }
            }
            let (block, used, rows) = self.current.as_mut().expect("set above");
            let take = (size - self.pending_rows).min(*rows - *used);
            let range = *used..*used + take;
            *used += take;
            let block = if *used == *rows {
                self.current.take().expect("set above").0
            } else {
                Arc::clone(block)
            };
            if take == size {
                return Some(Ok(Cut::Rows(block, range)));
            }
            if take > 0 {
                match block.slice_rows(range) {
                    Ok(piece) => self.pending.push(piece),
                    Err(e) => return Some(Err(e)),
                }
                self.pending_rows += take;
            }
            if self.pending_rows == size {
                return Some(self.join_pending().map(Cut::Own));
            }
        }
    }
}

impl<B: Batch> DatasetIter<B> {
    /// The next batch as cut: rows of a source block, or a batch of its own. The distributed
    /// pipeline cuts replicas' pieces from the block directly, so a batch inside one block is
    /// never materialised.
    pub(crate) fn next_cut(&mut self) -> Option<Result<Cut<B>, InputError>> {
        if self.done {
            return None;
        }
        loop {
            let item = self.next_batch();
            match &item {
                None | Some(Err(_)) => {
                    self.done = true;
                    return item;
                }
                Some(Ok(_)) => {}
            }
            let k = self.batches_seen;
            self.batches_seen += 1;
            match self.batch_shard {
                Some((num, index)) if k % num != index => continue,
                _ => return item,
            }
        }
    }
}

impl<B: Batch> Iterator for DatasetIter<B> {
    type Item = Result<B, InputError>;

    fn next(&mut self) -> Option<Self::Item> {
        let batch = self.next_cut()?.and_then(Cut::into_batch);
        self.done |= batch.is_err();
        Some(batch)
    }
}

/// A batch as a [`DatasetIter`] cuts it.
pub(crate) enum Cut<B> {
    /// Rows `range` of a source block (after shuffling and row sharding), not yet sliced.
    Rows(Arc<B>, Range<usize>),
    /// A batch with buffers of its own: joined from several blocks, or empty.
    Own(B),
}

impl<B: Batch> Cut<B> {
    /// The batch, sharing the block's buffers where it lies inside one.
    pub(crate) fn into_batch(self) -> Result<B, InputError> {
        match self {
            Cut::Rows(block, range) => block.slice_rows(range),
            Cut::Own(batch) => Ok(batch),
        }
    }
}

/// A Fisher–Yates permutation of `0..n` from SplitMix64 seeded by `(seed, epoch, block)`:
/// small, fast and the same on every platform, which is all a shuffle needs.
fn permutation(n: usize, seed: u64, epoch: u64, block: u64) -> Vec<usize> {
    let mut state = seed
        ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ block.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // The modulo bias is below 2^-40 for any realistic n.
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(ds: &Dataset<Tensor>) -> Vec<Vec<i64>> {
        ds.iter()
            .map(|b| b.unwrap().to_vec::<i64>().unwrap())
            .collect()
    }

    /// Blocks of uneven sizes, so batches straddle blocks.
    struct Blocks(Vec<Vec<i64>>);

    impl Source for Blocks {
        type Item = Tensor;
        fn blocks(&self) -> BoxIter<Tensor> {
            let blocks = self.0.clone();
            Box::new(
                blocks
                    .into_iter()
                    .map(|b| Ok(Tensor::from_vec("/cpu:0", &[b.len()], b)?)),
            )
        }
        fn describe(&self) -> String {
            "test blocks".into()
        }
    }

    #[test]
    fn batches_straddle_blocks_and_row_shards_keep_their_phase() {
        let ds = Dataset::from_source(Blocks(vec![
            vec![0, 1, 2],
            vec![],
            vec![3],
            vec![4, 5, 6, 7, 8],
        ]));
        assert_eq!(
            collect(&ds.clone().batch(2, false).unwrap()),
            [vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7], vec![8]]
        );
        assert_eq!(
            collect(&ds.clone().shard(3, 2).unwrap().batch(2, true).unwrap()),
            [vec![2, 5]]
        );
        assert_eq!(
            collect(&ds.shard(2, 1).unwrap()),
            [vec![1], vec![3], vec![5], vec![7]]
        );
    }

    #[test]
    fn repeat_and_batch_shard() {
        let ds = Dataset::range(3)
            .repeat(2)
            .unwrap()
            .batch(2, false)
            .unwrap()
            .shard(2, 0)
            .unwrap();
        assert_eq!(collect(&ds), [vec![0, 1], vec![1, 2]]);
    }

    fn flat(ds: &Dataset<Tensor>) -> Vec<i64> {
        collect(ds).into_iter().flatten().collect()
    }

    #[test]
    fn ranges_across_blocks_read_as_one_sequence() {
        let n = 2 * RangeSource::BLOCK_ROWS + 7;
        let all: Vec<i64> = (0..n as i64).collect();
        assert_eq!(flat(&Dataset::range(n).batch(1000, false).unwrap()), all);
        let sharded = Dataset::range(n)
            .shard(3, 1)
            .unwrap()
            .batch(999, true)
            .unwrap();
        let expected: Vec<i64> = all.iter().copied().skip(1).step_by(3).collect();
        let kept = expected.len() / 999 * 999;
        assert_eq!(flat(&sharded), expected[..kept]);
        let twice = Dataset::range(n)
            .repeat(2)
            .unwrap()
            .batch(4096, false)
            .unwrap();
        assert_eq!(flat(&twice), [all.clone(), all].concat());
    }

    /// Repeat counts once multiplied unchecked (a panic in debug builds, a wrapped count in
    /// release).
    #[test]
    fn repeat_counts_that_overflow_are_an_error() {
        let err = Dataset::range(3)
            .repeat(usize::MAX)
            .unwrap()
            .repeat(2)
            .unwrap_err();
        assert!(
            err.to_string().contains("more than usize::MAX passes"),
            "{err}"
        );
        assert_eq!(
            flat(&Dataset::range(2).repeat(2).unwrap().repeat(3).unwrap()),
            [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
        );
    }

    #[test]
    fn pipeline_order_is_checked() {
        assert!(
            Dataset::range(3)
                .batch(1, false)
                .unwrap()
                .batch(2, false)
                .is_err()
        );
        assert!(
            Dataset::range(3)
                .batch(1, false)
                .unwrap()
                .repeat(2)
                .is_err()
        );
        assert!(Dataset::range(3).shard(2, 2).is_err());
        assert!(Dataset::range(3).batch(0, false).is_err());
    }

    #[test]
    fn a_bad_block_ends_iteration_after_its_error() {
        struct Bad;
        impl Source for Bad {
            type Item = Tensor;
            fn blocks(&self) -> BoxIter<Tensor> {
                Box::new(
                    [
                        Ok(Tensor::scalar("/cpu:0", 1i64)),
                        Ok(Tensor::scalar("/cpu:0", 2i64)),
                    ]
                    .into_iter(),
                )
            }
            fn describe(&self) -> String {
                "scalars".into()
            }
        }
        let mut it = Dataset::from_source(Bad).iter();
        let err = it.next().unwrap().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("scalars: element the top level is rank 0"),
            "{err}"
        );
        assert!(it.next().is_none());
    }
}
