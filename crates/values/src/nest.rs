//! [`Nest`]: the one way to walk a nested structure (tuples, `Vec`, arrays, maps, `Option`,
//! `Box`, users' `#[derive(Nest)]` structs) leaf by leaf, with the [`Path`] of every leaf.
//!
//! Three operations cover what the layers above need, each monomorphised for its visitor:
//! [`Nest::visit_leaves`] reads every leaf, [`Nest::map_leaves`] rebuilds the structure with
//! every leaf replaced by one of the same type, and [`Nest::zip_leaves`] builds one structure
//! from several of the same shape, leaf by leaf. Leaf types stay open: a visitor's `leaf`
//! method is generic, and the typed adapters ([`Nest::for_each_leaf`],
//! [`Nest::try_map_leaves`], [`Nest::try_zip_leaves`], [`Nest::leaves`],
//! [`Nest::with_leaves`]) let a caller say "every leaf is a `T`" without this crate knowing
//! `T` (the strategy layer's fused all-reduce and the input layer's batches use them with
//! tensors).

use std::any::{Any, type_name};
use std::fmt;
use std::marker::PhantomData;

use crate::ValuesError;

/// Where a value sits inside a nested structure, for error messages: `.1[2]["c"]`. Built on the
/// stack while descending and printed only when something fails.
///
/// ```
/// use distribute_values::Path;
///
/// let root = Path::ROOT;
/// let field = root.field("loss");
/// let key = "c";
/// assert_eq!(field.index(2).key(&key).to_string(), r#".loss[2]["c"]"#);
/// assert_eq!(root.to_string(), "the top level");
/// ```
#[derive(Clone, Copy)]
pub struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    segment: Segment<'a>,
}

#[derive(Clone, Copy)]
enum Segment<'a> {
    Root,
    Index(usize),
    Field(&'static str),
    Key(&'a dyn fmt::Debug),
}

impl<'a> Path<'a> {
    /// The whole value.
    pub const ROOT: Path<'static> = Path {
        parent: None,
        segment: Segment::Root,
    };

    /// Element `index` of a sequence.
    pub fn index(&'a self, index: usize) -> Path<'a> {
        self.child(Segment::Index(index))
    }

    /// A named or positional field of a struct or tuple.
    pub fn field(&'a self, name: &'static str) -> Path<'a> {
        self.child(Segment::Field(name))
    }

    /// The entry of a map under `key`.
    pub fn key(&'a self, key: &'a dyn fmt::Debug) -> Path<'a> {
        self.child(Segment::Key(key))
    }

    /// Whether this is the whole value.
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }

    fn child(&'a self, segment: Segment<'a>) -> Path<'a> {
        Path {
            parent: Some(self),
            segment,
        }
    }

    /// A structure-mismatch error at this path.
    pub fn mismatch(&self, detail: impl Into<String>) -> ValuesError {
        ValuesError::StructureMismatch {
            path: self.to_string(),
            detail: detail.into(),
        }
    }

    fn write_segments(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.write_segments(f)?;
        }
        match self.segment {
            Segment::Root => Ok(()),
            Segment::Index(i) => write!(f, "[{i}]"),
            Segment::Field(name) => write!(f, ".{name}"),
            Segment::Key(key) => write!(f, "[{key:?}]"),
        }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parent.is_none() {
            return f.write_str("the top level");
        }
        self.write_segments(f)
    }
}

impl fmt::Debug for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Path({self})")
    }
}

/// Reads every leaf of a structure ([`Nest::visit_leaves`]).
pub trait LeafVisitor {
    /// What a visit can fail with; structure errors are [`ValuesError`]s.
    type Error: From<ValuesError>;

    /// Called with each leaf and its path, in the structure's fixed order.
    fn leaf<L: 'static>(&mut self, path: &Path<'_>, leaf: &L) -> Result<(), Self::Error>;
}

/// Replaces every leaf of a structure with a new leaf of the same type ([`Nest::map_leaves`]).
pub trait LeafMapper {
    /// What a mapping can fail with; structure errors are [`ValuesError`]s.
    type Error: From<ValuesError>;

    /// The new leaf at `path`.
    fn leaf<L: 'static>(&mut self, path: &Path<'_>, leaf: &L) -> Result<L, Self::Error>;
}

/// Builds one leaf from the leaves at the same path of several structures
/// ([`Nest::zip_leaves`]).
pub trait LeafZipper {
    /// What zipping can fail with; structure mismatches are [`ValuesError`]s.
    type Error: From<ValuesError>;

    /// The leaf at `path` of the zipped structure, from every part's leaf there, in part order.
    fn leaf<L: 'static>(&mut self, path: &Path<'_>, leaves: &[&L]) -> Result<L, Self::Error>;
}

/// A nested structure whose leaves can be visited, mapped and zipped in a fixed order.
///
/// Implemented for leaves (numbers, `bool`, `char`, `String`, `&'static str`, distributed
/// variables and their components; tensors in distribute-collectives), for `()` (no leaves),
/// for containers of `Nest` types (tuples up to 8, `Vec`, arrays, `BTreeMap`, `HashMap`,
/// `Option`, `Box`), and by `#[derive(Nest)]` for users' structs. A leaf passes itself to
/// the visitor; a container passes each part with a child of its path. `HashMap` entries are
/// visited in key order, so that every replica walks equal maps alike.
///
/// ```
/// use distribute_values::{Nest, Path};
///
/// #[derive(Debug, Clone, PartialEq, Nest)]
/// struct Metrics {
///     loss: f32,
///     per_class: Vec<f32>,
///     best: Option<f32>,
/// }
///
/// let m = Metrics { loss: 0.5, per_class: vec![0.25, 0.75], best: None };
/// assert_eq!(m.leaves::<f32>()?, [0.5, 0.25, 0.75]);
/// let doubled = m.try_map_leaves(|_, x: &f32| Ok::<_, distribute_values::ValuesError>(x * 2.0))?;
/// assert_eq!(doubled.per_class, [0.5, 1.5]);
/// let mut paths = Vec::new();
/// m.for_each_leaf(|path, _: &f32| {
///     paths.push(path.to_string());
///     Ok::<_, distribute_values::ValuesError>(())
/// })?;
/// assert_eq!(paths, [".loss", ".per_class[0]", ".per_class[1]"]);
/// let sum = Metrics::try_zip_leaves(&[&m, &doubled], |_, xs: &[&f32]| {
///     Ok::<_, distribute_values::ValuesError>(xs.iter().copied().sum())
/// })?;
/// assert_eq!(sum.loss, 1.5);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub trait Nest: Sized {
    /// Calls `visitor.leaf` with every leaf, each with its path below `path`.
    fn visit_leaves<V: LeafVisitor>(
        &self,
        path: &Path<'_>,
        visitor: &mut V,
    ) -> Result<(), V::Error>;

    /// The same structure with every leaf replaced by `mapper.leaf` of it.
    fn map_leaves<M: LeafMapper>(&self, path: &Path<'_>, mapper: &mut M) -> Result<Self, M::Error>;

    /// One structure from `parts` of the same shape, leaf `i` being `zipper.leaf` of every
    /// part's leaf `i`. Parts whose shapes differ (`Vec` lengths, map keys, `Some` and `None`)
    /// are a [`ValuesError::StructureMismatch`] naming the path.
    fn zip_leaves<Z: LeafZipper>(
        parts: &[&Self],
        path: &Path<'_>,
        zipper: &mut Z,
    ) -> Result<Self, Z::Error>;

    /// Calls `f` with every leaf, all of which must be `T`s; a leaf of another type is a
    /// [`ValuesError::UnexpectedLeaf`] naming its path and type.
    fn for_each_leaf<T, E>(&self, f: impl FnMut(&Path<'_>, &T) -> Result<(), E>) -> Result<(), E>
    where
        T: 'static,
        E: From<ValuesError>,
    {
        self.visit_leaves(&Path::ROOT, &mut TypedVisitor::new(f))
    }

    /// The same structure with every leaf, all of which must be `T`s, replaced by `f` of it.
    fn try_map_leaves<T, E>(&self, f: impl FnMut(&Path<'_>, &T) -> Result<T, E>) -> Result<Self, E>
    where
        T: 'static,
        E: From<ValuesError>,
    {
        self.map_leaves(&Path::ROOT, &mut TypedMapper::new(f))
    }

    /// One structure from `parts` of the same shape, each leaf (all `T`s) being `f` of every
    /// part's leaf at that path.
    fn try_zip_leaves<T, E>(
        parts: &[&Self],
        f: impl FnMut(&Path<'_>, &[&T]) -> Result<T, E>,
    ) -> Result<Self, E>
    where
        T: 'static,
        E: From<ValuesError>,
    {
        Self::zip_leaves(parts, &Path::ROOT, &mut TypedZipper::new(f))
    }

    /// Every leaf, all of which must be `T`s, in order (TF's `nest.flatten`).
    fn leaves<T: Clone + 'static>(&self) -> Result<Vec<T>, ValuesError> {
        let mut out = Vec::new();
        self.for_each_leaf(|_, leaf: &T| {
            out.push(leaf.clone());
            Ok::<_, ValuesError>(())
        })?;
        Ok(out)
    }

    /// The same structure with its leaves (all `T`s) taken in order from `leaves` (TF's
    /// `nest.pack_sequence_as`). Too few or too many leaves is a
    /// [`ValuesError::StructureMismatch`].
    fn with_leaves<T: 'static>(
        &self,
        leaves: impl IntoIterator<Item = T>,
    ) -> Result<Self, ValuesError> {
        let mut leaves = leaves.into_iter();
        let mut used = 0usize;
        let rebuilt = self.try_map_leaves(|path, _: &T| {
            used += 1;
            leaves.next().ok_or_else(|| {
                path.mismatch(format!(
                    "the structure has more leaves than the {} given",
                    used - 1
                ))
            })
        })?;
        let extra = leaves.count();
        if extra > 0 {
            return Err(Path::ROOT.mismatch(format!(
                "the structure has {used} leaves but {} were given",
                used + extra
            )));
        }
        Ok(rebuilt)
    }
}

/// `leaf` as a `T`, or the error naming its path and its type: the check the typed adapters
/// make, for hand-written visitors that expect one leaf type.
pub fn leaf_as<'l, T: 'static, L: 'static>(
    path: &Path<'_>,
    leaf: &'l L,
) -> Result<&'l T, ValuesError> {
    (leaf as &dyn Any)
        .downcast_ref::<T>()
        .ok_or_else(|| unexpected_leaf::<T, L>(path))
}

fn unexpected_leaf<T, L>(path: &Path<'_>) -> ValuesError {
    ValuesError::UnexpectedLeaf {
        path: path.to_string(),
        expected: type_name::<T>(),
        found: type_name::<L>(),
    }
}

/// A `T` as the leaf type `L` it is known to be.
fn into_leaf<T: 'static, L: 'static>(path: &Path<'_>, value: T) -> Result<L, ValuesError> {
    let mut value = Some(value);
    (&mut value as &mut dyn Any)
        .downcast_mut::<Option<L>>()
        .and_then(Option::take)
        .ok_or_else(|| unexpected_leaf::<T, L>(path))
}

/// [`Nest::for_each_leaf`]'s visitor.
struct TypedVisitor<T, E, F> {
    f: F,
    leaf: PhantomData<fn(&T) -> E>,
}

impl<T, E, F> TypedVisitor<T, E, F> {
    fn new(f: F) -> Self {
        TypedVisitor {
            f,
            leaf: PhantomData,
        }
    }
}

impl<T, E, F> LeafVisitor for TypedVisitor<T, E, F>
where
    T: 'static,
    E: From<ValuesError>,
    F: FnMut(&Path<'_>, &T) -> Result<(), E>,
{
    type Error = E;

    fn leaf<L: 'static>(&mut self, path: &Path<'_>, leaf: &L) -> Result<(), E> {
        (self.f)(path, leaf_as::<T, L>(path, leaf)?)
    }
}

/// [`Nest::try_map_leaves`]' mapper.
struct TypedMapper<T, E, F> {
    f: F,
    leaf: PhantomData<fn(&T) -> E>,
}

impl<T, E, F> TypedMapper<T, E, F> {
    fn new(f: F) -> Self {
        TypedMapper {
            f,
            leaf: PhantomData,
        }
    }
}

impl<T, E, F> LeafMapper for TypedMapper<T, E, F>
where
    T: 'static,
    E: From<ValuesError>,
    F: FnMut(&Path<'_>, &T) -> Result<T, E>,
{
    type Error = E;

    fn leaf<L: 'static>(&mut self, path: &Path<'_>, leaf: &L) -> Result<L, E> {
        let mapped = (self.f)(path, leaf_as::<T, L>(path, leaf)?)?;
        Ok(into_leaf(path, mapped)?)
    }
}

/// [`Nest::try_zip_leaves`]' zipper.
struct TypedZipper<T, E, F> {
    f: F,
    leaf: PhantomData<fn(&T) -> E>,
}

impl<T, E, F> TypedZipper<T, E, F> {
    fn new(f: F) -> Self {
        TypedZipper {
            f,
            leaf: PhantomData,
        }
    }
}

impl<T, E, F> LeafZipper for TypedZipper<T, E, F>
where
    T: 'static,
    E: From<ValuesError>,
    F: FnMut(&Path<'_>, &[&T]) -> Result<T, E>,
{
    type Error = E;

    fn leaf<L: 'static>(&mut self, path: &Path<'_>, leaves: &[&L]) -> Result<L, E> {
        let typed = leaves
            .iter()
            .map(|leaf| leaf_as::<T, L>(path, *leaf))
            .collect::<Result<Vec<&T>, _>>()?;
        let zipped = (self.f)(path, &typed)?;
        Ok(into_leaf(path, zipped)?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    #[test]
    fn paths_print_every_segment() {
        let root = Path::ROOT;
        let a = root.field("0");
        let b = a.index(3);
        let k = 7;
        assert_eq!(b.key(&k).to_string(), ".0[3][7]");
        assert!(root.is_root() && !a.is_root());
    }

    #[test]
    fn leaves_come_in_a_fixed_order_with_their_paths() {
        let value = (
            1i32,
            vec![2i32, 3],
            BTreeMap::from([("b", 5i32), ("a", 4)]),
            Some(Box::new([6i32, 7])),
            (),
        );
        assert_eq!(value.leaves::<i32>().unwrap(), [1, 2, 3, 4, 5, 6, 7]);
        let mut paths = Vec::new();
        value
            .for_each_leaf(|path, _: &i32| {
                paths.push(path.to_string());
                Ok::<_, ValuesError>(())
            })
            .unwrap();
        assert_eq!(
            paths,
            [
                ".0",
                ".1[0]",
                ".1[1]",
                r#".2["a"]"#,
                r#".2["b"]"#,
                ".3[0]",
                ".3[1]"
            ]
        );
    }

    #[test]
    fn hash_maps_are_walked_in_key_order() {
        let map: HashMap<u32, f64> = (0..32).map(|k| (k, f64::from(k))).collect();
        let expected: Vec<f64> = (0..32).map(f64::from).collect();
        assert_eq!(map.leaves::<f64>().unwrap(), expected);
    }

    #[test]
    fn a_leaf_of_another_type_is_named_with_its_path() {
        let value = (1.0f32, vec![2.0f32], ("x".to_owned(),));
        let err = value.leaves::<f32>().unwrap_err();
        assert_eq!(
            err,
            ValuesError::UnexpectedLeaf {
                path: ".2.0".into(),
                expected: "f32",
                found: "alloc::string::String",
            }
        );
        assert_eq!(err.kind(), crate::ErrorKind::TypeError);
    }

    #[test]
    fn map_keeps_the_shape_and_replaces_leaves() {
        let value = (vec![1i64, 2], Some(3i64), None::<i64>);
        let mapped = value
            .try_map_leaves(|_, x: &i64| Ok::<_, ValuesError>(x * 10))
            .unwrap();
        assert_eq!(mapped, (vec![10, 20], Some(30), None));
    }

    #[test]
    fn with_leaves_rebuilds_and_counts() {
        let value = (0u8, vec![0u8, 0]);
        assert_eq!(value.with_leaves([1u8, 2, 3]).unwrap(), (1, vec![2, 3]));
        let short = value.with_leaves([1u8, 2]).unwrap_err();
        assert!(short.to_string().contains("at .1[1]"), "{short}");
        let long = value.with_leaves([1u8, 2, 3, 4]).unwrap_err();
        assert!(long.to_string().contains("3 leaves but 4"), "{long}");
    }

    #[test]
    fn zip_combines_leaf_by_leaf() {
        let a = (1i32, vec![2i32], BTreeMap::from([("k", 3i32)]));
        let b = (10i32, vec![20i32], BTreeMap::from([("k", 30i32)]));
        let sum =
            <(i32, Vec<i32>, BTreeMap<&str, i32>)>::try_zip_leaves(&[&a, &b], |_, xs: &[&i32]| {
                Ok::<_, ValuesError>(xs.iter().copied().sum())
            })
            .unwrap();
        assert_eq!(sum, (11, vec![22], BTreeMap::from([("k", 33)])));
    }

    fn zip_error<S: Nest + fmt::Debug>(parts: &[&S]) -> ValuesError {
        S::try_zip_leaves(parts, |_, xs: &[&i32]| Ok::<_, ValuesError>(*xs[0])).unwrap_err()
    }

    #[test]
    fn zip_mismatches_name_the_path() {
        let err = zip_error(&[&(0, vec![1, 2]), &(0, vec![1])]);
        assert_eq!(
            err,
            ValuesError::StructureMismatch {
                path: ".1".into(),
                detail: "part 0 has a list of 2 elements, part 1 a list of 1".into()
            }
        );
        let err = zip_error(&[&vec![Some(1)], &vec![None]]);
        assert_eq!(
            err,
            ValuesError::StructureMismatch {
                path: "[0]".into(),
                detail: "part 0 is Some, part 1 is None".into()
            }
        );
        let a = HashMap::from([("x", 1)]);
        let b = HashMap::from([("y", 1)]);
        let err = zip_error(&[&a, &b]);
        assert!(
            err.to_string()
                .contains(r#"key "x" is in part 0's map but not in part 1's"#),
            "{err}"
        );
    }
}
