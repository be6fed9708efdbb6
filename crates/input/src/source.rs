//! [`Source`]: where a [`Dataset`](crate::Dataset)'s rows come from, and the built-in sources
//! that are not files: [`MemorySource`] (in memory), [`GeneratorSource`] (computed by a closure)
//! and [`RangeSource`] (the numbers `0..n`, made on demand). The file sources live beside
//! them: [`NpySource`](crate::NpySource) and [`CsvSource`](crate::CsvSource).
//!
//! A source hands out *blocks* of rows, in a fixed order, from the start on every pass; the
//! dataset cuts and joins them into batches.

use std::path::PathBuf;
use std::sync::Arc;

use distribute_tensor::Tensor;

use crate::{Batch, InputError};

/// A boxed, sendable iterator of fallible items: what sources and pipelines hand out.
pub type BoxIter<T> = Box<dyn Iterator<Item = Result<T, InputError>> + Send + 'static>;

/// Where a dataset's rows come from.
///
/// A source yields *blocks*: batches of any number of rows, in a fixed order, that the dataset
/// cuts into batches. File-based sources also list their files, so that the `File` auto-shard
/// policy can give each input pipeline its own files.
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_input::{Dataset, MemorySource, Source};
///
/// let source = MemorySource::new(Tensor::from_vec("/cpu:0", &[3], vec![1i64, 2, 3])?)?;
/// assert!(source.files().is_empty());
/// let blocks: Vec<Tensor> = source.blocks().collect::<Result<_, _>>()?;
/// assert_eq!(blocks[0].shape(), [3]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub trait Source: Send + Sync + 'static {
    /// The batch type of the blocks.
    type Item: Batch;

    /// The blocks from the start, in order. Errors name the file or element at fault.
    fn blocks(&self) -> BoxIter<Self::Item>;

    /// A short description for messages, e.g. `in-memory data` or `3 .npy files`.
    fn describe(&self) -> String;

    /// The files read, in order; empty for a source that is not file-based.
    fn files(&self) -> &[PathBuf] {
        &[]
    }

    /// The same kind of source reading only `files` (a subset of [`files`](Self::files)); for
    /// file sharding. Sources that are not file-based refuse.
    fn with_files(
        &self,
        files: Vec<PathBuf>,
    ) -> Result<Arc<dyn Source<Item = Self::Item>>, InputError> {
        let _ = files;
        Err(InputError::Shard {
            policy: "File",
            reason: format!(
                "{} is not read from files; use AutoShardPolicy::Data or Auto",
                self.describe()
            ),
        })
    }
}

/// A source of batches held in memory: the rows of one structure of tensors (TF's
/// `from_tensor_slices`).
#[derive(Debug, Clone)]
pub struct MemorySource<B> {
    data: B,
}

impl<B: Batch> MemorySource<B> {
    /// Rows of `data`; every leaf needs the same leading dimension.
    pub fn new(data: B) -> Result<Self, InputError> {
        data.rows("in-memory data")?;
        Ok(MemorySource { data })
    }
}

impl<B: Batch> Source for MemorySource<B> {
    type Item = B;

    fn blocks(&self) -> BoxIter<B> {
        Box::new(std::iter::once(Ok(self.data.clone())))
    }

    fn describe(&self) -> String {
        "in-memory data".into()
    }
}

/// A source whose blocks come from a closure that makes a fresh iterator for every pass (TF's
/// `from_generator`): for data computed on the fly or read from a place this crate does not
/// know.
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_input::{Dataset, GeneratorSource};
///
/// // Each block is one row of two features.
/// let source = GeneratorSource::new(|| {
///     (0..3i64).map(|i| Ok(Tensor::from_vec("/cpu:0", &[1, 2], vec![i, -i])?))
/// });
/// let ds = Dataset::from_source(source).batch(3, false)?;
/// let first = ds.iter().next().unwrap()?;
/// assert_eq!((first.shape(), first.to_vec::<i64>()?), (&[3, 2][..], vec![0, 0, 1, -1, 2, -2]));
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub struct GeneratorSource<F> {
    make: F,
}

impl<F> GeneratorSource<F> {
    /// A source calling `make` at the start of every pass for that pass's blocks.
    pub fn new(make: F) -> Self {
        GeneratorSource { make }
    }
}

impl<F, I, B> Source for GeneratorSource<F>
where
    F: Fn() -> I + Send + Sync + 'static,
    I: Iterator<Item = Result<B, InputError>> + Send + 'static,
    B: Batch,
{
    type Item = B;

    fn blocks(&self) -> BoxIter<B> {
        Box::new((self.make)())
    }

    fn describe(&self) -> String {
        "generated data".into()
    }
}

/// The numbers `0..n` as `int64` rows, made on demand in blocks of [`RangeSource::BLOCK_ROWS`]
/// (TF's `range` is lazy too): `range(1 << 40)` costs one block of memory, not 8 TiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeSource {
    n: usize,
}

impl RangeSource {
    /// Rows per block: the most a range holds in memory at once, and the unit a shuffle of a
    /// range permutes.
    pub const BLOCK_ROWS: usize = 1 << 16;

    /// The numbers `0..n`. Numbers above `i64::MAX` do not fit `int64`: reading reaches them as
    /// an error, after every number that fits.
    pub fn new(n: usize) -> Self {
        RangeSource { n }
    }
}

impl RangeSource {
    /// The block of numbers from `start` (a multiple of `BLOCK_ROWS` below `n`).
    fn block(self, start: usize) -> Result<Tensor, InputError> {
        let n = self.n;
        let end = start + (n - start).min(Self::BLOCK_ROWS);
        // BLOCK_ROWS divides 2^63, so a block lies either wholly inside int64 or wholly
        // outside it.
        let (Ok(first), Ok(last)) = (i64::try_from(start), i64::try_from(end - 1)) else {
            return Err(InputError::Pipeline(format!(
                "range({n}): the number {start} does not fit int64 (a range's elements are \
                 int64, as in TF); use a range of at most 2^63 numbers"
            )));
        };
        let data: Vec<i64> = (first..=last).collect();
        Ok(Tensor::from_vec(
            distribute_device_spec::DEFAULT_HOST,
            &[data.len()],
            data,
        )?)
    }
}

impl Source for RangeSource {
    type Item = Tensor;

    fn blocks(&self) -> BoxIter<Tensor> {
        let range = *self;
        let starts = (0..range.n).step_by(Self::BLOCK_ROWS);
        Box::new(starts.map(move |start| range.block(start)))
    }

    fn describe(&self) -> String {
        format!("range({})", self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dataset;

    /// `range(1 << 40)` once built all 2^40 numbers (8 TiB) before the first batch.
    #[test]
    fn a_huge_range_is_made_on_demand() {
        let ds = Dataset::range(1 << 40).batch(3, false).unwrap();
        let first: Vec<Vec<i64>> = ds
            .iter()
            .take(2)
            .map(|b| b.unwrap().to_vec::<i64>().unwrap())
            .collect();
        assert_eq!(first, [vec![0, 1, 2], vec![3, 4, 5]]);
        // Sharding keeps its phase across the blocks the range is made in.
        let sharded = Dataset::range(1 << 40).shard(1 << 17, 5).unwrap();
        let firsts: Vec<i64> = sharded
            .iter()
            .take(3)
            .map(|b| b.unwrap().to_vec::<i64>().unwrap()[0])
            .collect();
        assert_eq!(firsts, [5, 5 + (1 << 17), 5 + (2 << 17)]);
    }

    /// `range(usize::MAX)` once panicked at construction; its numbers fit int64 up to
    /// `i64::MAX`, and the block past it is an error, not a wrapped negative number.
    #[test]
    fn a_range_beyond_int64_reads_up_to_its_limit_then_fails() {
        let ds = Dataset::range(usize::MAX).batch(2, false).unwrap();
        assert_eq!(
            ds.iter().next().unwrap().unwrap().to_vec::<i64>().unwrap(),
            [0, 1]
        );
        let source = RangeSource::new(usize::MAX);
        let last_fitting = source.block((1 << 63) - RangeSource::BLOCK_ROWS).unwrap();
        assert_eq!(
            last_fitting.to_vec::<i64>().unwrap().last(),
            Some(&i64::MAX)
        );
        let err = source.block(1 << 63).unwrap_err();
        assert!(err.to_string().contains("does not fit int64"), "{err}");
    }
}
