//! [`Batch`]: a tensor, or a nested structure of tensors, whose leaves share a leading batch
//! dimension, with the row operations input pipelines need (slice, stride, join, pad, place).
//!
//! The row operations are built on `Tensor`'s public API; strided rows share the buffer, so a
//! sharded in-memory dataset copies nothing until batches are joined or padded.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use distribute_collectives::{DType, Tensor};
use ndarray::{Axis, Slice};

use crate::InputError;

/// Calls the rows operation with the Rust element type of `dtype` bound to `$t`.
macro_rules! typed {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            DType::F16 => {
                type $t = half::f16;
                $body
            }
            DType::BF16 => {
                type $t = half::bf16;
                $body
            }
            DType::F32 => {
                type $t = f32;
                $body
            }
            DType::F64 => {
                type $t = f64;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
        }
    };
}

/// A batch of examples: every leaf tensor has the same size along axis 0, the rows.
///
/// Implemented for [`Tensor`], tuples of up to 4 batches, `Vec` and `BTreeMap<String, _>` of
/// batches, and [`Masked`]. A user's struct implements the three required methods by visiting,
/// mapping and zipping its fields in a fixed order; everything else is provided.
///
/// ```
/// use distribute_collectives::Tensor;
/// use distribute_input::Batch;
///
/// let features = Tensor::from_vec("/cpu:0", &[4, 2], (0..8).map(|x| x as f32).collect())?;
/// let labels = Tensor::from_vec("/cpu:0", &[4], vec![0i64, 1, 0, 1])?;
/// let batch = (features, labels);
/// assert_eq!(batch.rows("example")?, 4);
/// let half = batch.slice_rows(2..4)?;
/// assert_eq!(half.1.to_vec::<i64>()?, [0, 1]);
/// let padded = half.pad_rows(3)?;
/// assert_eq!(padded.0.shape(), [3, 2]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub trait Batch: Clone + Send + Sync + 'static {
    /// Calls `f` with each leaf and its path (`.0`, `[2]`, `["x"]`, empty for the top level),
    /// in a fixed order. A container passes each part a child of `path`
    /// ([`LeafPath::field`], [`index`](LeafPath::index), [`key`](LeafPath::key),
    /// [`name`](LeafPath::name)); building one costs nothing until it is printed.
    fn for_each_leaf(&self, path: &LeafPath<'_>, f: &mut dyn FnMut(&LeafPath<'_>, &Tensor));

    /// The same structure with `f` applied to every leaf.
    fn try_map_leaves(
        &self,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError>;

    /// One structure from several of the same shape, leaf `i` being `f` of every part's leaf
    /// `i`. Parts whose structures differ (vector lengths, map keys) are an error.
    fn try_zip_leaves(
        parts: &[&Self],
        f: &mut dyn FnMut(&[&Tensor]) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError>;

    /// The number of rows. `origin` names where the batch came from, for the errors: a rank-0
    /// leaf, leaves with different row counts, or no leaf at all.
    fn rows(&self, origin: &str) -> Result<usize, InputError> {
        // Every step calls this, so the paths are only printed when something is wrong.
        let mut first: Option<Option<usize>> = None;
        let mut wrong = false;
        self.for_each_leaf(&LeafPath::ROOT, &mut |_, t| {
            let rows = t.shape().first().copied();
            wrong |= rows.is_none() || first.is_some_and(|first| first != rows);
            first.get_or_insert(rows);
        });
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
        self.try_map_leaves(&mut |t| Ok(t.slice_rows(range.clone())?))
    }

    /// Rows `range` of every leaf placed on `device`, sharing the buffers: `slice_rows` then
    /// `to_device` without the intermediate batch.
    fn slice_rows_onto(&self, range: Range<usize>, device: &str) -> Result<Self, InputError> {
        self.try_map_leaves(&mut |t| slice_onto(t, range.clone(), device))
    }

    /// Rows `start`, `start + step`, `start + 2·step`, … of every leaf, sharing the buffers.
    fn stride_rows(&self, start: usize, step: usize) -> Result<Self, InputError> {
        if step == 0 {
            return Err(InputError::InvalidOption(
                "a row stride must be at least 1".into(),
            ));
        }
        self.try_map_leaves(&mut |t| stride_tensor(t, start, step))
    }

    /// Rows `indices` of every leaf, in that order (a copy).
    fn select_rows(&self, indices: &[usize]) -> Result<Self, InputError> {
        self.try_map_leaves(&mut |t| select_tensor(t, indices))
    }

    /// The parts joined along the rows, on the first part's devices.
    fn concat_rows(parts: &[&Self]) -> Result<Self, InputError> {
        if parts.len() == 1 {
            return Ok(parts[0].clone());
        }
        Self::try_zip_leaves(parts, &mut |leaves| {
            let device = leaves.first().map_or("", |t| t.device());
            let owned: Vec<Tensor> = leaves.iter().map(|t| (*t).clone()).collect();
            Ok(Tensor::concat_rows(device, &owned)?)
        })
    }

    /// Every leaf extended with rows of zeros to `rows` rows; a batch already that long is
    /// returned as it is, a longer one is an error.
    fn pad_rows(&self, rows: usize) -> Result<Self, InputError> {
        self.try_map_leaves(&mut |t| pad_tensor(t, rows))
    }

    /// Every leaf placed on `device`; host tensors share their buffers.
    fn to_device(&self, device: &str) -> Self {
        self.try_map_leaves(&mut |t| Ok(t.to_device(device)))
            .expect("placing a tensor cannot fail")
    }
}

/// Why `batch`'s leaves have no common row count: the first rank-0 leaf, else every leaf's
/// rows.
fn rows_error<B: Batch>(batch: &B, origin: &str) -> InputError {
    let mut leaves: Vec<(String, Option<usize>)> = Vec::new();
    batch.for_each_leaf(&LeafPath::ROOT, &mut |path, t| {
        leaves.push((path.describe(), t.shape().first().copied()))
    });
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

/// Where a leaf sits inside a [`Batch`]: a chain of steps from the top level, printed only
/// when an error names the leaf.
///
/// ```
/// use distribute_input::LeafPath;
///
/// let root = LeafPath::ROOT;
/// let features = root.field(0);
/// let column = features.key("age");
/// assert_eq!(column.index(3).to_string(), ".0[\"age\"][3]");
/// assert_eq!(root.name("mask").to_string(), ".mask");
/// assert_eq!(root.describe(), "the top level");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct LeafPath<'a> {
    parent: Option<&'a LeafPath<'a>>,
    step: Step<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Step<'a> {
    Root,
    Field(usize),
    Index(usize),
    Key(&'a str),
    Name(&'a str),
}

impl LeafPath<'static> {
    /// The top level: a batch that is a single tensor.
    pub const ROOT: LeafPath<'static> = LeafPath {
        parent: None,
        step: Step::Root,
    };
}

impl<'a> LeafPath<'a> {
    /// Tuple field `i`, printed `.i`.
    pub fn field(&'a self, i: usize) -> LeafPath<'a> {
        self.child(Step::Field(i))
    }

    /// List element `i`, printed `[i]`.
    pub fn index(&'a self, i: usize) -> LeafPath<'a> {
        self.child(Step::Index(i))
    }

    /// Map entry `key`, printed `["key"]`.
    pub fn key(&'a self, key: &'a str) -> LeafPath<'a> {
        self.child(Step::Key(key))
    }

    /// Struct field `name`, printed `.name`.
    pub fn name(&'a self, name: &'a str) -> LeafPath<'a> {
        self.child(Step::Name(name))
    }

    fn child(&'a self, step: Step<'a>) -> LeafPath<'a> {
        LeafPath {
            parent: Some(self),
            step,
        }
    }

    /// The path as errors print it: `the top level` for the top level, else as displayed.
    pub fn describe(&self) -> String {
        match (self.parent, self.step) {
            (None, Step::Root) => "the top level".to_owned(),
            _ => self.to_string(),
        }
    }
}

impl fmt::Display for LeafPath<'_> {
    /// The steps from the top level, e.g. `.0["x"][2]`; empty for the top level.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.fmt(f)?;
        }
        match self.step {
            Step::Root => Ok(()),
            Step::Field(i) => write!(f, ".{i}"),
            Step::Index(i) => write!(f, "[{i}]"),
            Step::Key(key) => write!(f, "[{key:?}]"),
            Step::Name(name) => write!(f, ".{name}"),
        }
    }
}

fn slice_onto(t: &Tensor, range: Range<usize>, device: &str) -> Result<Tensor, InputError> {
    let rows = *t
        .shape()
        .first()
        .ok_or_else(|| InputError::NoBatchDimension {
            origin: "slicing rows".into(),
            path: "the top level".into(),
        })?;
    if range.start > range.end || range.end > rows {
        return Err(InputError::Mismatch {
            origin: "slicing rows".into(),
            detail: format!("rows {range:?} are out of range for a batch of {rows} rows"),
        });
    }
    typed!(t.dtype(), T => {
        let array = t.array::<T>()?.clone().slice_axis_move(Axis(0), Slice::from(range));
        Ok(Tensor::from_shared(device, array))
    })
}

fn stride_tensor(t: &Tensor, start: usize, step: usize) -> Result<Tensor, InputError> {
    let rows = *t
        .shape()
        .first()
        .ok_or_else(|| InputError::NoBatchDimension {
            origin: "striding rows".into(),
            path: "the top level".into(),
        })?;
    let start = start.min(rows);
    let slice = Slice::new(start as isize, None, step as isize);
    typed!(t.dtype(), T => {
        let array = t.array::<T>()?.clone().slice_axis_move(Axis(0), slice);
        Ok(Tensor::from_shared(t.device(), array))
    })
}

fn select_tensor(t: &Tensor, indices: &[usize]) -> Result<Tensor, InputError> {
    let rows = *t
        .shape()
        .first()
        .ok_or_else(|| InputError::NoBatchDimension {
            origin: "selecting rows".into(),
            path: "the top level".into(),
        })?;
    if let Some(bad) = indices.iter().find(|&&i| i >= rows) {
        return Err(InputError::Mismatch {
            origin: "selecting rows".into(),
            detail: format!("row {bad} is out of range for a batch of {rows} rows"),
        });
    }
    typed!(t.dtype(), T => {
        let array = t.array::<T>()?.select(Axis(0), indices);
        Ok(Tensor::from_array(t.device(), array))
    })
}

fn pad_tensor(t: &Tensor, rows: usize) -> Result<Tensor, InputError> {
    let have = *t
        .shape()
        .first()
        .ok_or_else(|| InputError::NoBatchDimension {
            origin: "padding rows".into(),
            path: "the top level".into(),
        })?;
    if have == rows {
        return Ok(t.clone());
    }
    if have > rows {
        return Err(InputError::Mismatch {
            origin: "padding rows".into(),
            detail: format!("cannot pad a batch of {have} rows down to {rows}"),
        });
    }
    let mut shape = t.shape().to_vec();
    shape[0] = rows - have;
    let zeros = Tensor::zeros(t.device(), t.dtype(), &shape);
    Ok(Tensor::concat_rows(t.device(), &[t.clone(), zeros])?)
}

impl Batch for Tensor {
    /// Without the structure walk: a tensor is its own only leaf.
    fn rows(&self, origin: &str) -> Result<usize, InputError> {
        self.shape()
            .first()
            .copied()
            .ok_or_else(|| InputError::NoBatchDimension {
                origin: origin.to_owned(),
                path: LeafPath::ROOT.describe(),
            })
    }

    fn for_each_leaf(&self, path: &LeafPath<'_>, f: &mut dyn FnMut(&LeafPath<'_>, &Tensor)) {
        f(path, self)
    }

    fn try_map_leaves(
        &self,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        f(self)
    }

    fn try_zip_leaves(
        parts: &[&Self],
        f: &mut dyn FnMut(&[&Tensor]) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        f(parts)
    }
}

macro_rules! tuple_batch {
    ($($name:ident $index:tt),+) => {
        impl<$($name: Batch),+> Batch for ($($name,)+) {
            fn for_each_leaf(
                &self,
                path: &LeafPath<'_>,
                f: &mut dyn FnMut(&LeafPath<'_>, &Tensor),
            ) {
                $(self.$index.for_each_leaf(&path.field($index), f);)+
            }

            fn try_map_leaves(
                &self,
                f: &mut dyn FnMut(&Tensor) -> Result<Tensor, InputError>,
            ) -> Result<Self, InputError> {
                Ok(($(self.$index.try_map_leaves(f)?,)+))
            }

            fn try_zip_leaves(
                parts: &[&Self],
                f: &mut dyn FnMut(&[&Tensor]) -> Result<Tensor, InputError>,
            ) -> Result<Self, InputError> {
                Ok(($(
                    $name::try_zip_leaves(
                        &parts.iter().map(|p| &p.$index).collect::<Vec<_>>(),
                        f,
                    )?,
                )+))
            }
        }
    };
}

tuple_batch!(A 0);
tuple_batch!(A 0, B 1);
tuple_batch!(A 0, B 1, C 2);
tuple_batch!(A 0, B 1, C 2, D 3);

impl<B: Batch> Batch for Vec<B> {
    fn for_each_leaf(&self, path: &LeafPath<'_>, f: &mut dyn FnMut(&LeafPath<'_>, &Tensor)) {
        for (i, b) in self.iter().enumerate() {
            b.for_each_leaf(&path.index(i), f);
        }
    }

    fn try_map_leaves(
        &self,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        self.iter().map(|b| b.try_map_leaves(f)).collect()
    }

    fn try_zip_leaves(
        parts: &[&Self],
        f: &mut dyn FnMut(&[&Tensor]) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        let len = parts.first().map_or(0, |p| p.len());
        if let Some(other) = parts.iter().find(|p| p.len() != len) {
            return Err(InputError::Mismatch {
                origin: "joining batches".into(),
                detail: format!(
                    "lists of {len} and {} tensors cannot be joined: every batch of a dataset \
                     needs the same structure",
                    other.len()
                ),
            });
        }
        (0..len)
            .map(|i| B::try_zip_leaves(&parts.iter().map(|p| &p[i]).collect::<Vec<_>>(), f))
            .collect()
    }
}

impl<B: Batch> Batch for BTreeMap<String, B> {
    fn for_each_leaf(&self, path: &LeafPath<'_>, f: &mut dyn FnMut(&LeafPath<'_>, &Tensor)) {
        for (key, b) in self {
            b.for_each_leaf(&path.key(key), f);
        }
    }

    fn try_map_leaves(
        &self,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        self.iter()
            .map(|(k, b)| Ok((k.clone(), b.try_map_leaves(f)?)))
            .collect()
    }

    fn try_zip_leaves(
        parts: &[&Self],
        f: &mut dyn FnMut(&[&Tensor]) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        let Some(first) = parts.first() else {
            return Ok(BTreeMap::new());
        };
        if let Some(other) = parts.iter().find(|p| !p.keys().eq(first.keys())) {
            return Err(InputError::Mismatch {
                origin: "joining batches".into(),
                detail: format!(
                    "maps with keys {:?} and {:?} cannot be joined: every batch of a dataset \
                     needs the same keys",
                    first.keys().collect::<Vec<_>>(),
                    other.keys().collect::<Vec<_>>()
                ),
            });
        }
        first
            .keys()
            .map(|k| {
                let leaves: Vec<&B> = parts.iter().map(|p| &p[k]).collect();
                Ok((k.clone(), B::try_zip_leaves(&leaves, f)?))
            })
            .collect()
    }
}

/// A batch padded to a fixed number of rows, with a mask that tells real rows (1.0) from
/// padding (0.0): what `PartialBatch::PadWithMask` hands each replica.
///
/// ```
/// use distribute_collectives::Tensor;
/// use distribute_input::{Batch, Masked};
///
/// let x = Tensor::from_vec("/cpu:0", &[2], vec![7i64, 8])?;
/// let m = Masked::pad(&x, 2, 4)?;
/// assert_eq!(m.batch.to_vec::<i64>()?, [7, 8, 0, 0]);
/// assert_eq!(m.mask.to_vec::<f32>()?, [1.0, 1.0, 0.0, 0.0]);
/// assert_eq!(m.real_rows()?, 2);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
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
        let mut device = String::new();
        batch.for_each_leaf(&LeafPath::ROOT, &mut |_, t| {
            if device.is_empty() {
                device = t.device().to_owned();
            }
        });
        let mask: Vec<f32> = (0..rows)
            .map(|r| if r < real_rows { 1.0 } else { 0.0 })
            .collect();
        Ok(Masked {
            batch: batch.pad_rows(rows)?,
            mask: Tensor::from_vec(&device, &[rows], mask)?,
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

impl<B: Batch> Batch for Masked<B> {
    fn for_each_leaf(&self, path: &LeafPath<'_>, f: &mut dyn FnMut(&LeafPath<'_>, &Tensor)) {
        self.batch.for_each_leaf(&path.name("batch"), f);
        f(&path.name("mask"), &self.mask);
    }

    fn try_map_leaves(
        &self,
        f: &mut dyn FnMut(&Tensor) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        Ok(Masked {
            batch: self.batch.try_map_leaves(f)?,
            mask: f(&self.mask)?,
        })
    }

    fn try_zip_leaves(
        parts: &[&Self],
        f: &mut dyn FnMut(&[&Tensor]) -> Result<Tensor, InputError>,
    ) -> Result<Self, InputError> {
        Ok(Masked {
            batch: B::try_zip_leaves(&parts.iter().map(|p| &p.batch).collect::<Vec<_>>(), f)?,
            mask: f(&parts.iter().map(|p| &p.mask).collect::<Vec<_>>())?,
        })
    }
}

#[cfg(test)]
mod tests {
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
        assert!(BTreeMap::concat_rows(&[&a, &b]).is_err());
        assert_eq!(BTreeMap::concat_rows(&[&a, &a]).unwrap()["x"].shape(), [2]);
    }
}
