//! [`Batch`]: the row operations input pipelines need (count, slice, stride, select, join, pad,
//! place) on any nested structure ([`Nest`]) whose leaves are tensors sharing a leading batch
//! dimension; and [`Masked`], a batch padded to a fixed size with its mask.
//!
//! The structure walk is the values crate's; this file only says what happens to each tensor.
//! The row operations are built on `Tensor`'s public API; strided rows share the buffer, so a
//! sharded in-memory dataset copies nothing until batches are joined or padded. Selecting,
//! joining and padding copy whole rows with `memcpy` (`rows.rs`) where the tensors are in
//! standard layout, and fall back to ndarray's general operations otherwise; a slice that stays
//! on its tensor's device keeps the tensor's shared device name instead of allocating one.

use std::ops::Range;

use distribute_tensor::{Tensor, with_dtype};
use distribute_values::{Nest, Path, Regroup, ValuesError};
use ndarray::{Axis, Slice};

use crate::{InputError, rows};

/// A batch of examples: a [`Nest`] whose every leaf is a [`Tensor`] with the same size along
/// axis 0, the rows.
///
/// Implemented for every `Nest` (and `Regroup`, so a step regroups into a strategy's `run`
/// inputs) that is `Clone + Send + Sync + 'static`: a tensor, tuples,
/// `Vec`s, maps and `Option`s of batches, [`Masked`], and users' `#[derive(Nest)]` structs.
/// A leaf that is not a tensor is an [`InputError::NotATensor`] naming its path, reported by
/// the first operation that meets it ([`rows`](Self::rows), which every source's block goes
/// through).
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_input::Batch;
/// use distribute_values::Nest;
///
/// #[derive(Debug, Clone, Nest)]
/// struct Example {
///     features: Tensor,
///     labels: Tensor,
///     weights: Option<Tensor>,
/// }
///
/// let batch = Example {
///     features: Tensor::from_vec("/cpu:0", &[4, 2], (0..8).map(|x| x as f32).collect())?,
///     labels: Tensor::from_vec("/cpu:0", &[4], vec![0i64, 1, 0, 1])?,
///     weights: None,
/// };
/// assert_eq!(batch.rows("example")?, 4);
/// let half = batch.slice_rows(2..4)?;
/// assert_eq!(half.labels.to_vec::<i64>()?, [0, 1]);
/// let padded = half.pad_rows(3)?;
/// assert_eq!(padded.features.shape(), [3, 2]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub trait Batch: Nest + Regroup + Clone + Send + Sync + 'static {
    /// The number of rows. `origin` names where the batch came from, for the errors: a leaf
    /// that is not a tensor, a rank-0 leaf, leaves with different row counts, or no leaf at all.
    fn rows(&self, origin: &str) -> Result<usize, InputError> {
        // Every step calls this, so paths are only printed when something is wrong.
        let mut first: Option<Option<usize>> = None;
        let mut wrong = false;
        self.for_each_leaf(|_, t: &Tensor| {
            let rows = t.shape().first().copied();
            wrong |= rows.is_none() || first.is_some_and(|first| first != rows);
            first.get_or_insert(rows);
            Ok::<_, InputError>(())
        })
        .map_err(|e| not_a_tensor(e, origin))?;
        match first {
            None => Err(InputError::Mismatch {
                origin: origin.to_owned(),
                detail: "a batch needs at least one tensor".into(),
            }),
            Some(Some(rows)) if !wrong => Ok(rows),
            Some(_) => Err(rows_error(self, origin)),
        }
    }

    /// Rows `range` of every leaf, sharing the buffers.
    fn slice_rows(&self, range: Range<usize>) -> Result<Self, InputError> {
        map_tensors(self, "slicing rows", |path, t| {
            slice_onto(path, t, range.clone(), t.device())
        })
    }

    /// Rows `range` of every leaf placed on `device`, sharing the buffers: `slice_rows` then
    /// `to_device` without the intermediate batch.
    fn slice_rows_onto(&self, range: Range<usize>, device: &str) -> Result<Self, InputError> {
        map_tensors(self, "slicing rows", |path, t| {
            slice_onto(path, t, range.clone(), device)
        })
    }

    /// Rows `start`, `start + step`, `start + 2·step`, … of every leaf, sharing the buffers.
    fn stride_rows(&self, start: usize, step: usize) -> Result<Self, InputError> {
        if step == 0 {
            return Err(InputError::InvalidOption(
                "a row stride must be at least 1".into(),
            ));
        }
        map_tensors(self, "striding rows", |path, t| {
            stride_tensor(path, t, start, step)
        })
    }

    /// Rows `indices` of every leaf, in that order (a copy).
    fn select_rows(&self, indices: &[usize]) -> Result<Self, InputError> {
        map_tensors(self, "selecting rows", |path, t| {
            select_tensor(path, t, indices)
        })
    }

    /// The parts joined along the rows, on the first part's devices. Parts whose structures
    /// differ (list lengths, map keys, `Some` and `None`) are an error naming where.
    fn concat_rows(parts: &[&Self]) -> Result<Self, InputError> {
        if parts.len() == 1 {
            return Ok(parts[0].clone());
        }
        Self::try_zip_leaves(parts, |_, leaves: &[&Tensor]| {
            let device = leaves.first().map_or("", |t| t.device());
            if let Some(joined) = rows::join(device, leaves) {
                return Ok(joined);
            }
            let owned: Vec<Tensor> = leaves.iter().map(|t| (*t).clone()).collect();
            Ok(Tensor::concat_rows(device, &owned)?)
        })
        .map_err(|e| match e {
            InputError::Values(ValuesError::StructureMismatch { path, detail }) => {
                InputError::Mismatch {
                    origin: "joining batches".into(),
                    detail: format!(
                        "at {path}, {detail}: every batch of a dataset needs the same structure"
                    ),
                }
            }
            other => not_a_tensor(other, "joining batches"),
        })
    }

    /// Every leaf extended with rows of zeros to `rows` rows; a batch already that long is
    /// returned as it is, a longer one is an error.
    fn pad_rows(&self, rows: usize) -> Result<Self, InputError> {
        map_tensors(self, "padding rows", |path, t| pad_tensor(path, t, rows))
    }

    /// Every leaf placed on `device`; host tensors share their buffers.
    fn to_device(&self, device: &str) -> Result<Self, InputError> {
        map_tensors(self, "placing a batch", |_, t| Ok(t.to_device(device)))
    }
}

impl<B: Nest + Regroup + Clone + Send + Sync + 'static> Batch for B {}

/// `batch` with `f` applied to every leaf, all of which must be tensors; `doing` names the
/// operation in the error for a leaf that is not one.
fn map_tensors<B: Batch>(
    batch: &B,
    doing: &str,
    f: impl FnMut(&Path<'_>, &Tensor) -> Result<Tensor, InputError>,
) -> Result<B, InputError> {
    batch.try_map_leaves(f).map_err(|e| not_a_tensor(e, doing))
}

/// `e`, as [`InputError::NotATensor`] with `origin` when it is a leaf of another type.
fn not_a_tensor(e: InputError, origin: &str) -> InputError {
    match e {
        InputError::Values(ValuesError::UnexpectedLeaf { path, found, .. }) => {
            InputError::NotATensor {
                origin: origin.to_owned(),
                path,
                found,
            }
        }
        other => other,
    }
}

/// Why `batch`'s leaves have no common row count: the first rank-0 leaf, else every leaf's
/// rows.
fn rows_error<B: Batch>(batch: &B, origin: &str) -> InputError {
    let mut leaves: Vec<(String, Option<usize>)> = Vec::new();
    let walked = batch.for_each_leaf(|path, t: &Tensor| {
        leaves.push((path.to_string(), t.shape().first().copied()));
        Ok::<_, InputError>(())
    });
    if let Err(e) = walked {
        return not_a_tensor(e, origin);
    }
    if let Some((path, _)) = leaves.iter().find(|(_, rows)| rows.is_none()) {
        return InputError::NoBatchDimension {
            origin: origin.to_owned(),
            path: path.clone(),
        };
    }
    let rows = leaves
        .iter()
        .map(|(path, rows)| format!("{path}: {}", rows.unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(", ");
    InputError::RaggedBatch {
        origin: origin.to_owned(),
        rows,
    }
}

/// The rows of `t`, or the error naming `path` for a rank-0 leaf met while `doing`.
fn leading(path: &Path<'_>, t: &Tensor, doing: &str) -> Result<usize, InputError> {
    t.shape()
        .first()
        .copied()
        .ok_or_else(|| InputError::NoBatchDimension {
            origin: doing.to_owned(),
            path: path.to_string(),
        })
}

fn slice_onto(
    path: &Path<'_>,
    t: &Tensor,
    range: Range<usize>,
    device: &str,
) -> Result<Tensor, InputError> {
    let rows = leading(path, t, "slicing rows")?;
    if range.start > range.end || range.end > rows {
        return Err(InputError::Mismatch {
            origin: "slicing rows".into(),
            detail: format!("rows {range:?} of {path} are out of range for a batch of {rows} rows"),
        });
    }
    if device == t.device() {
        // Keeps the tensor's shared device name: no allocation per slice.
        return Ok(t.slice_rows(range)?);
    }
    with_dtype!(t.dtype(), T => {
        let array = t.array::<T>()?.clone().slice_axis_move(Axis(0), Slice::from(range));
        Ok(Tensor::from_shared(device, array))
    })
}

fn stride_tensor(
    path: &Path<'_>,
    t: &Tensor,
    start: usize,
    step: usize,
) -> Result<Tensor, InputError> {
    let rows = leading(path, t, "striding rows")?;
    let start = start.min(rows);
    let slice = Slice::new(start as isize, None, step as isize);
    with_dtype!(t.dtype(), T => {
        let array = t.array::<T>()?.clone().slice_axis_move(Axis(0), slice);
        Ok(Tensor::from_shared(t.device(), array))
    })
}

fn select_tensor(path: &Path<'_>, t: &Tensor, indices: &[usize]) -> Result<Tensor, InputError> {
    let rows = leading(path, t, "selecting rows")?;
    if let Some(bad) = indices.iter().find(|&&i| i >= rows) {
        return Err(InputError::Mismatch {
            origin: "selecting rows".into(),
            detail: format!("row {bad} of {path} is out of range for a batch of {rows} rows"),
        });
    }
    if let Some(gathered) = rows::gather(t, indices) {
        return Ok(gathered);
    }
    with_dtype!(t.dtype(), T => {
        let array = t.array::<T>()?.select(Axis(0), indices);
        Ok(Tensor::from_array(t.device(), array))
    })
}

fn pad_tensor(path: &Path<'_>, t: &Tensor, rows: usize) -> Result<Tensor, InputError> {
    let have = leading(path, t, "padding rows")?;
    if have == rows {
        return Ok(t.clone());
    }
    if have > rows {
        return Err(InputError::Mismatch {
            origin: "padding rows".into(),
            detail: format!("cannot pad {path}, a batch of {have} rows, down to {rows}"),
        });
    }
    if let Some(padded) = rows::pad(t, rows) {
        return Ok(padded);
    }
    let mut shape = t.shape().to_vec();
    shape[0] = rows - have;
    let zeros = Tensor::zeros(t.device(), t.dtype(), &shape)?;
    Ok(Tensor::concat_rows(t.device(), &[t.clone(), zeros])?)
}

/// A batch padded to a fixed number of rows, with a mask that tells real rows (1.0) from
/// padding (0.0): what `PartialBatch::PadWithMask` hands each replica. Its leaves are the
/// batch's, then the mask. Derived like a user's struct, a step of them regroups (to
/// [`MaskedRegrouped`]) into a strategy's per-replica inputs.
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_input::{Batch, Masked};
///
/// let x = Tensor::from_vec("/cpu:0", &[2], vec![7i64, 8])?;
/// let m = Masked::pad(&x, 2, 4)?;
/// assert_eq!(m.batch.to_vec::<i64>()?, [7, 8, 0, 0]);
/// assert_eq!(m.mask.to_vec::<f32>()?, [1.0, 1.0, 0.0, 0.0]);
/// assert_eq!(m.real_rows()?, 2);
/// assert_eq!(m.rows("a masked batch")?, 4);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Nest)]
pub struct Masked<B> {
    /// The batch, padded with rows of zeros.
    pub batch: B,
    /// `float32 [rows]`: 1.0 for a real row, 0.0 for padding.
    pub mask: Tensor,
}

impl<B: Batch> Masked<B> {
    /// `batch` (the first `real_rows` rows real) padded to `rows` rows, with its mask on the
    /// device of the batch's first leaf.
    pub fn pad(batch: &B, real_rows: usize, rows: usize) -> Result<Self, InputError> {
        let mut device = None;
        batch
            .for_each_leaf(|_, t: &Tensor| {
                device.get_or_insert_with(|| t.device().to_owned());
                Ok::<_, InputError>(())
            })
            .map_err(|e| not_a_tensor(e, "padding rows"))?;
        let mask: Vec<f32> = (0..rows)
            .map(|r| if r < real_rows { 1.0 } else { 0.0 })
            .collect();
        Ok(Masked {
            batch: batch.pad_rows(rows)?,
            mask: Tensor::from_vec(&device.unwrap_or_default(), &[rows], mask)?,
        })
    }

    /// How many rows are real (not padding).
    pub fn real_rows(&self) -> Result<usize, InputError> {
        Ok(self
            .mask
            .to_vec::<f32>()?
            .iter()
            .filter(|m| **m != 0.0)
            .count())
    }
}
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn t(shape: &[usize], data: Vec<i64>) -> Tensor {
        Tensor::from_vec("/cpu:0", shape, data).unwrap()
    }

    #[test]
    fn ragged_leaves_are_named() {
        let err = (t(&[3], vec![1, 2, 3]), t(&[2], vec![1, 2]))
            .rows("x.npy")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "x.npy: ragged batch, the leaves have different numbers of rows (.0: 3, .1: 2); \
             every tensor of a batch needs the same leading dimension"
        );
    }

    #[test]
    fn rank_zero_leaf_is_named() {
        let err = vec![t(&[1], vec![1]), Tensor::scalar("/cpu:0", 3i64)]
            .rows("data")
            .unwrap_err();
        assert!(
            matches!(err, InputError::NoBatchDimension { ref path, .. } if path == "[1]"),
            "{err}"
        );
    }

    #[test]
    fn stride_shares_the_buffer_and_picks_every_nth_row() {
        let x = t(&[7, 1], (0..7).collect());
        let s = x.stride_rows(1, 3).unwrap();
        assert_eq!(s.to_vec::<i64>().unwrap(), [1, 4]);
        assert_eq!(x.stride_rows(9, 2).unwrap().shape(), [0, 1]);
    }

    #[test]
    fn padding_cannot_shrink() {
        assert!(t(&[3], vec![1, 2, 3]).pad_rows(2).is_err());
        assert_eq!(
            t(&[0], vec![])
                .pad_rows(2)
                .unwrap()
                .to_vec::<i64>()
                .unwrap(),
            [0, 0]
        );
    }

    #[test]
    fn maps_with_different_keys_do_not_join() {
        let a = BTreeMap::from([("x".to_owned(), t(&[1], vec![1]))]);
        let b = BTreeMap::from([("y".to_owned(), t(&[1], vec![1]))]);
        let err = BTreeMap::concat_rows(&[&a, &b]).unwrap_err();
        assert!(matches!(err, InputError::Mismatch { .. }), "{err:?}");
        assert_eq!(BTreeMap::concat_rows(&[&a, &a]).unwrap()["x"].shape(), [2]);
    }

    #[test]
    fn structures_that_differ_do_not_join_and_the_error_says_where() {
        let a = (
            t(&[1], vec![1]),
            vec![t(&[1], vec![2])],
            Some(t(&[1], vec![3])),
        );
        let b = (t(&[1], vec![1]), vec![t(&[1], vec![2])], None);
        let err = <(Tensor, Vec<Tensor>, Option<Tensor>)>::concat_rows(&[&a, &b]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "joining batches: at .2, part 0 is Some, part 1 is None: every batch of a dataset \
             needs the same structure"
        );
        let c = (t(&[1], vec![1]), vec![], Some(t(&[1], vec![3])));
        let err = <(Tensor, Vec<Tensor>, Option<Tensor>)>::concat_rows(&[&a, &c]).unwrap_err();
        assert!(
            err.to_string().contains("at .1, part 0 has a list of 1"),
            "{err}"
        );
        let joined = <(Tensor, Vec<Tensor>, Option<Tensor>)>::concat_rows(&[&a, &a]).unwrap();
        assert_eq!(joined.2.unwrap().to_vec::<i64>().unwrap(), [3, 3]);
    }

    #[test]
    fn a_leaf_that_is_not_a_tensor_is_named_by_every_operation() {
        let batch = (
            t(&[2], vec![1, 2]),
            vec![t(&[2], vec![3, 4])],
            ("label".to_owned(),),
        );
        let err = batch.rows("data").unwrap_err();
        assert_eq!(
            err.to_string(),
            "data: element .2.0 is a alloc::string::String, not a tensor; every leaf of a \
             dataset element must be a Tensor"
        );
        let origin = |e: InputError| match e {
            InputError::NotATensor { origin, path, .. } => (origin, path),
            other => panic!("{other:?}"),
        };
        let at = (String::from("slicing rows"), String::from(".2.0"));
        assert_eq!(origin(batch.slice_rows(0..1).unwrap_err()), at);
        assert_eq!(origin(batch.pad_rows(3).unwrap_err()).1, ".2.0");
        assert_eq!(origin(batch.select_rows(&[0]).unwrap_err()).1, ".2.0");
        assert_eq!(origin(batch.to_device("/cpu:1").unwrap_err()).1, ".2.0");
        assert_eq!(origin(Masked::pad(&batch, 1, 2).unwrap_err()).1, ".2.0");
    }

    #[test]
    fn a_rank_zero_leaf_is_named_by_the_operation_that_meets_it() {
        let batch = vec![t(&[1], vec![1]), Tensor::scalar("/cpu:0", 3i64)];
        let err = batch.slice_rows(0..1).unwrap_err();
        assert!(
            matches!(&err, InputError::NoBatchDimension { origin, path } if origin == "slicing rows" && path == "[1]"),
            "{err}"
        );
        let err = t(&[2], vec![1, 2]).select_rows(&[2]).unwrap_err();
        assert!(
            err.to_string()
                .contains("row 2 of the top level is out of range"),
            "{err}"
        );
    }

    #[test]
    fn masked_leaves_are_the_batch_then_the_mask() {
        let m = Masked::pad(&(t(&[1], vec![5]), t(&[1], vec![6])), 1, 2).unwrap();
        let mut paths = Vec::new();
        m.for_each_leaf(|path, _: &Tensor| {
            paths.push(path.to_string());
            Ok::<_, InputError>(())
        })
        .unwrap();
        assert_eq!(paths, [".batch.0", ".batch.1", ".mask"]);
        let placed = m.to_device("/cpu:1").unwrap();
        assert_eq!(placed.mask.device(), "/cpu:1");
        assert_eq!(placed.rows("masked").unwrap(), 2);
    }
}
