//! Nested structures across replicas: [`regroup`] turns "one structure per replica" into "one
//! structure of distributed values", and [`select_replica`] / [`select_replica_mirrored`] /
//! [`select_device_mirrored`] go back.
//!
//! The [`Regroup`] trait maps a structure type to its regrouped type: a leaf `T` becomes a
//! [`Leaf<T>`], and containers (tuples, `Vec`, arrays, maps, `Option`, `Box`) keep their shape
//! with regrouped contents. Users' own structs get it from `#[derive(Regroup)]`, which also
//! declares the regrouped companion struct; `#[regroup(leaf)]` makes a type a leaf instead.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use crate::{DistributedValues, Mirrored, PerReplica, ReplicaDeviceMap, ValuesError};

/// Which distributed type wraps leaves that differ between replicas.
///
/// ```
/// use distribute_values::{RegroupOptions, Wrap};
///
/// let options = RegroupOptions { wrap: Wrap::Mirrored, ..RegroupOptions::default() };
/// assert!(!options.always_wrap);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wrap {
    /// Wrap in [`PerReplica`] (TF's default `wrap_class`).
    #[default]
    PerReplica,
    /// Wrap in [`Mirrored`]: the values are copies of one logical value (VAL-04).
    Mirrored,
}

/// How [`regroup_with`] wraps leaves.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup_with, Leaf, RegroupOptions, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let options = RegroupOptions { always_wrap: true, ..RegroupOptions::default() };
/// // Equal leaves are wrapped too, not collapsed (VAL-09).
/// let leaf = regroup_with(&map, vec![7, 7], options)?;
/// assert!(matches!(leaf, Leaf::PerReplica(_)));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegroupOptions {
    /// The wrapper for leaves that are not collapsed.
    pub wrap: Wrap,
    /// Wrap even leaves that are equal on every replica (VAL-09). Distributed variables are
    /// returned as they are regardless.
    pub always_wrap: bool,
}

/// What [`Regroup::regroup_replicas`] needs besides the values: the devices and the options.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{RegroupContext, RegroupOptions, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0"])?);
/// let cx = RegroupContext::new(&map, RegroupOptions::default());
/// assert_eq!(cx.devices().num_replicas(), 1);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RegroupContext<'a> {
    devices: &'a Arc<ReplicaDeviceMap>,
    options: RegroupOptions,
}

impl<'a> RegroupContext<'a> {
    /// A context for regrouping values from the replicas of `devices`.
    pub fn new(devices: &'a Arc<ReplicaDeviceMap>, options: RegroupOptions) -> Self {
        RegroupContext { devices, options }
    }

    /// The replicas' devices.
    pub fn devices(&self) -> &'a Arc<ReplicaDeviceMap> {
        self.devices
    }

    /// The options.
    pub fn options(&self) -> RegroupOptions {
        self.options
    }
}

/// Which value of each distributed leaf [`Regroup::select`] picks.
///
/// ```
/// use distribute_values::Selection;
///
/// assert_eq!(Selection::Replica(1).to_string(), "replica 1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection<'a> {
    /// Replica `i`'s value of every leaf ([`select_replica`]).
    Replica(usize),
    /// Replica `i`'s value, where every distributed leaf must be mirrored
    /// ([`select_replica_mirrored`]).
    MirroredReplica(usize),
    /// The value on a device, where every distributed leaf must be mirrored
    /// ([`select_device_mirrored`]).
    MirroredDevice(&'a str),
}

impl Selection<'_> {
    /// Whether per-replica leaves are refused.
    pub fn mirrored_only(&self) -> bool {
        !matches!(self, Selection::Replica(_))
    }
}

impl fmt::Display for Selection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selection::Replica(i) => write!(f, "replica {i}"),
            Selection::MirroredReplica(i) => write!(f, "mirrored replica {i}"),
            Selection::MirroredDevice(d) => write!(f, "device {d}"),
        }
    }
}

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

/// A structure that can be regrouped across replicas and selected back.
///
/// Implemented for leaves (numbers, `bool`, `char`, `String`, `&'static str`, `()`), for
/// containers of `Regroup` types (tuples up to 8, `Vec`, arrays, `BTreeMap`, `HashMap`,
/// `Option`, `Box`), for distributed variables and their components, and by
/// `#[derive(Regroup)]` for users' structs. Hand-written impls follow the container impls:
/// split the replicas' values field by field, regroup each field with its own path, and select
/// field by field.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup, select_replica, Leaf, Regroup, ReplicaDeviceMap};
///
/// #[derive(Debug, Clone, PartialEq, Regroup)]
/// struct Step {
///     mode: String,
///     loss: f32,
/// }
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let steps = vec![
///     Step { mode: "train".into(), loss: 0.5 },
///     Step { mode: "train".into(), loss: 0.25 },
/// ];
/// let grouped: StepRegrouped = regroup(&map, steps.clone())?;
/// assert_eq!(grouped.mode, Leaf::Same("train".to_owned()));
/// assert!(matches!(grouped.loss, Leaf::PerReplica(_)));
/// assert_eq!(select_replica::<Step>(1, &grouped)?, steps[1]);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub trait Regroup: Sized {
    /// The structure with distributed leaves.
    type Regrouped;

    /// Combines one value per replica (in replica order) into one regrouped value. `path` is
    /// where `replicas` sit in the outermost structure, for error messages.
    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError>;

    /// Picks one replica's structure out of a regrouped one.
    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError>;
}

/// A regrouped leaf: the value itself when it is the same on every replica, otherwise a
/// distributed value.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup, DistributedValues, Leaf, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let same: Leaf<i32> = regroup(&map, vec![4, 4])?;
/// assert_eq!(same, Leaf::Same(4));
/// let differ: Leaf<i32> = regroup(&map, vec![4, 5])?;
/// assert_eq!(differ.local_results(), [&4, &5]);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Clone, PartialEq)]
pub enum Leaf<T> {
    /// Equal on every replica, so not wrapped (VAL-08, VAL-10).
    Same(T),
    /// Differs between replicas.
    PerReplica(PerReplica<T>),
    /// Copies of one value (regrouped with [`Wrap::Mirrored`]).
    Mirrored(Mirrored<T>),
}

impl<T: Clone + PartialEq> Leaf<T> {
    /// Regroups one leaf value per replica: equal values collapse to [`Leaf::Same`] unless
    /// `always_wrap`; otherwise they are wrapped as the options say. This is the whole
    /// [`Regroup`] impl of a leaf type.
    pub fn regroup_leaf(
        values: Vec<T>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Leaf<T>, ValuesError> {
        let Some(first) = values.first() else {
            return Err(path.mismatch("no replica returned a value"));
        };
        if !cx.options.always_wrap && values[1..].iter().all(|v| v == first) {
            let mut values = values;
            return Ok(Leaf::Same(values.swap_remove(0)));
        }
        let devices = Arc::clone(cx.devices);
        Ok(match cx.options.wrap {
            Wrap::PerReplica => Leaf::PerReplica(PerReplica::new(devices, values)?),
            Wrap::Mirrored => Leaf::Mirrored(Mirrored::new(devices, values)?),
        })
    }

    /// Picks the selected replica's value: a `Same` value is every replica's value; a
    /// per-replica value under a mirrored-only selection is a `TypeError` (VAL-03).
    pub fn select_leaf(&self, selection: Selection<'_>, path: &Path<'_>) -> Result<T, ValuesError> {
        match (self, selection) {
            (Leaf::Same(v), _) => Ok(v.clone()),
            (Leaf::PerReplica(v), Selection::Replica(i)) => v.get(i).cloned(),
            (Leaf::PerReplica(_), _) => Err(ValuesError::NotMirrored {
                path: path.to_string(),
                found: "a PerReplica value",
            }),
            (Leaf::Mirrored(v), Selection::Replica(i) | Selection::MirroredReplica(i)) => {
                v.get(i).cloned()
            }
            (Leaf::Mirrored(v), Selection::MirroredDevice(d)) => v.get_on_device(d).cloned(),
        }
    }
}

impl<T> Leaf<T> {
    /// The value on each replica (TF's `experimental_local_results`): one entry for a `Same`
    /// value, one per replica otherwise.
    pub fn local_results(&self) -> Vec<&T> {
        match self {
            Leaf::Same(v) => vec![v],
            Leaf::PerReplica(v) => v.values().iter().collect(),
            Leaf::Mirrored(v) => v.values().iter().collect(),
        }
    }

    /// TF's `is_mirrored`: true only for a [`Mirrored`] value (VAL-37). A plain value is not
    /// mirrored, even when it was equal on every replica.
    pub fn is_mirrored(&self) -> bool {
        matches!(self, Leaf::Mirrored(_))
    }

    /// TF's `is_sync_on_read` helper: true for anything that is not mirrored, plain values and
    /// [`PerReplica`] included (VAL-37).
    pub fn is_sync_on_read(&self) -> bool {
        !self.is_mirrored()
    }
}

impl<T: fmt::Debug> fmt::Debug for Leaf<T> {
    /// A `Same` value prints as the value itself, since that is what TF's regroup returns.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Leaf::Same(v) => v.fmt(f),
            Leaf::PerReplica(v) => v.fmt(f),
            Leaf::Mirrored(v) => v.fmt(f),
        }
    }
}

impl<T: fmt::Display> fmt::Display for Leaf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Leaf::Same(v) => v.fmt(f),
            Leaf::PerReplica(v) => v.fmt(f),
            Leaf::Mirrored(v) => v.fmt(f),
        }
    }
}

/// Regroups one structure per replica of `devices` into one structure of distributed values,
/// wrapping differing leaves in [`PerReplica`] (VAL-01). The outer `Vec` is the replica axis
/// (VAL-07) and must have one entry per replica.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup, Leaf, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let (a, foo): (Leaf<&str>, Leaf<&str>) = regroup(&map, vec![("a", "foo"), ("b", "foo")])?;
/// assert_eq!(a.local_results(), [&"a", &"b"]);
/// assert_eq!(foo, Leaf::Same("foo"));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub fn regroup<S: Regroup>(
    devices: &Arc<ReplicaDeviceMap>,
    replicas: Vec<S>,
) -> Result<S::Regrouped, ValuesError> {
    regroup_with(devices, replicas, RegroupOptions::default())
}

/// [`regroup`] with a choice of wrapper and of whether equal leaves are wrapped too.
pub fn regroup_with<S: Regroup>(
    devices: &Arc<ReplicaDeviceMap>,
    replicas: Vec<S>,
    options: RegroupOptions,
) -> Result<S::Regrouped, ValuesError> {
    devices.check_count("regroup", replicas.len())?;
    S::regroup_replicas(
        replicas,
        &RegroupContext::new(devices, options),
        &Path::ROOT,
    )
}

/// Replica `replica`'s structure out of a regrouped one: the inverse of [`regroup`] (VAL-02).
/// Distributed variables are returned whole (VAL-16).
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup, select_replica, ReplicaDeviceMap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let grouped = regroup(&map, vec![vec![1, 2], vec![3, 4]])?;
/// assert_eq!(select_replica::<Vec<i32>>(1, &grouped)?, [3, 4]);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub fn select_replica<S: Regroup>(
    replica: usize,
    regrouped: &S::Regrouped,
) -> Result<S, ValuesError> {
    S::select(regrouped, Selection::Replica(replica), &Path::ROOT)
}

/// Like [`select_replica`], but every distributed value must be mirrored; a [`PerReplica`]
/// anywhere in the structure is a `TypeError` naming its path (VAL-03, VAL-04).
pub fn select_replica_mirrored<S: Regroup>(
    replica: usize,
    regrouped: &S::Regrouped,
) -> Result<S, ValuesError> {
    S::select(regrouped, Selection::MirroredReplica(replica), &Path::ROOT)
}

/// The structure as seen on `device`, where every distributed value must be mirrored; a device
/// outside a value's device map is `InvalidArgument`.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup_with, select_device_mirrored, RegroupOptions, ReplicaDeviceMap, Wrap};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/gpu:0"])?);
/// let options = RegroupOptions { wrap: Wrap::Mirrored, ..RegroupOptions::default() };
/// let grouped = regroup_with(&map, vec![(1.0, 2), (1.5, 2)], options)?;
/// assert_eq!(select_device_mirrored::<(f64, i32)>("/gpu:0", &grouped)?, (1.5, 2));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub fn select_device_mirrored<S: Regroup>(
    device: &str,
    regrouped: &S::Regrouped,
) -> Result<S, ValuesError> {
    S::select(regrouped, Selection::MirroredDevice(device), &Path::ROOT)
}

/// Whether an update's per-replica results are grouped (see [`update_regroup`]).
///
/// ```
/// use distribute_values::UpdateGrouping;
///
/// assert_ne!(UpdateGrouping::Grouped, UpdateGrouping::PerReplica);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateGrouping {
    /// TF's `group=True`: one result standing for every replica's update.
    Grouped,
    /// TF's `group=False`: the per-replica results, kept apart.
    PerReplica,
}

/// Regroups the per-replica results of an update (TF's `update_regroup`, VAL-18).
///
/// Components of a distributed variable become the variable. Every other leaf is a
/// [`Mirrored`] of the replicas' results (the update ran on every replica) even where they are
/// equal, except with a single replica, where the result itself is returned.
///
/// Both groupings therefore give the same values: TF's `group=True` differs only by grouped ops
/// and control dependencies, which have no counterpart here, and its `group=False` returns every
/// replica's result, which [`Leaf::local_results`] reads off the `Mirrored` (one entry per
/// replica, never collapsed).
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{update_regroup, Leaf, ReplicaDeviceMap, UpdateGrouping};
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let grouped: Leaf<f32> = update_regroup(&map, vec![1.0_f32, 1.0], UpdateGrouping::Grouped)?;
/// assert!(matches!(grouped, Leaf::Mirrored(_)));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub fn update_regroup<S: Regroup>(
    devices: &Arc<ReplicaDeviceMap>,
    updates: Vec<S>,
    grouping: UpdateGrouping,
) -> Result<S::Regrouped, ValuesError> {
    let always_wrap = match grouping {
        // TF regroups both ways with Mirrored, and per-replica results are distinct objects
        // even when equal, so they are never collapsed; only a single replica unwraps.
        UpdateGrouping::Grouped | UpdateGrouping::PerReplica => devices.num_replicas() > 1,
    };
    let options = RegroupOptions {
        wrap: Wrap::Mirrored,
        always_wrap,
    };
    regroup_with(devices, updates, options)
}

macro_rules! leaf_impls {
    ($($ty:ty),* $(,)?) => {$(
        impl Regroup for $ty {
            type Regrouped = Leaf<$ty>;

            fn regroup_replicas(
                replicas: Vec<Self>,
                cx: &RegroupContext<'_>,
                path: &Path<'_>,
            ) -> Result<Leaf<$ty>, ValuesError> {
                Leaf::regroup_leaf(replicas, cx, path)
            }

            fn select(
                regrouped: &Leaf<$ty>,
                selection: Selection<'_>,
                path: &Path<'_>,
            ) -> Result<Self, ValuesError> {
                regrouped.select_leaf(selection, path)
            }
        }
    )*};
}

leaf_impls!(
    bool,
    char,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    f32,
    f64,
    String,
    &'static str,
);

impl Regroup for () {
    type Regrouped = ();

    fn regroup_replicas(
        _: Vec<()>,
        _: &RegroupContext<'_>,
        _: &Path<'_>,
    ) -> Result<(), ValuesError> {
        Ok(())
    }

    fn select(_: &(), _: Selection<'_>, _: &Path<'_>) -> Result<(), ValuesError> {
        Ok(())
    }
}

macro_rules! tuple_impls {
    ($(($($name:ident $column:ident $index:tt),+))+) => {$(
        impl<$($name: Regroup),+> Regroup for ($($name,)+) {
            type Regrouped = ($($name::Regrouped,)+);

            fn regroup_replicas(
                replicas: Vec<Self>,
                cx: &RegroupContext<'_>,
                path: &Path<'_>,
            ) -> Result<Self::Regrouped, ValuesError> {
                $(let mut $column = Vec::with_capacity(replicas.len());)+
                for replica in replicas {
                    $($column.push(replica.$index);)+
                }
                Ok(($($name::regroup_replicas($column, cx, &path.field(stringify!($index)))?,)+))
            }

            fn select(
                regrouped: &Self::Regrouped,
                selection: Selection<'_>,
                path: &Path<'_>,
            ) -> Result<Self, ValuesError> {
                Ok(($($name::select(&regrouped.$index, selection, &path.field(stringify!($index)))?,)+))
            }
        }
    )+};
}

tuple_impls! {
    (A a 0)
    (A a 0, B b 1)
    (A a 0, B b 1, C c 2)
    (A a 0, B b 1, C c 2, D d 3)
    (A a 0, B b 1, C c 2, D d 3, E e 4)
    (A a 0, B b 1, C c 2, D d 3, E e 4, F f 5)
    (A a 0, B b 1, C c 2, D d 3, E e 4, F f 5, G g 6)
    (A a 0, B b 1, C c 2, D d 3, E e 4, F f 5, G g 6, H h 7)
}

/// Splits equal-length sequences (one per replica) into one column per position.
fn transpose<S>(
    replicas: Vec<Vec<S>>,
    what: &str,
    path: &Path<'_>,
) -> Result<Vec<Vec<S>>, ValuesError> {
    let len = replicas.first().map_or(0, Vec::len);
    if let Some((replica, other)) = replicas.iter().enumerate().find(|(_, r)| r.len() != len) {
        return Err(path.mismatch(format!(
            "replica 0 returned a {what} of {len} elements, replica {replica} a {what} of {}",
            other.len()
        )));
    }
    let mut columns: Vec<Vec<S>> = (0..len)
        .map(|_| Vec::with_capacity(replicas.len()))
        .collect();
    for replica in replicas {
        for (column, value) in columns.iter_mut().zip(replica) {
            column.push(value);
        }
    }
    Ok(columns)
}

impl<S: Regroup> Regroup for Vec<S> {
    type Regrouped = Vec<S::Regrouped>;

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        transpose(replicas, "list", path)?
            .into_iter()
            .enumerate()
            .map(|(i, column)| S::regroup_replicas(column, cx, &path.index(i)))
            .collect()
    }

    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        regrouped
            .iter()
            .enumerate()
            .map(|(i, r)| S::select(r, selection, &path.index(i)))
            .collect()
    }
}

impl<S: Regroup, const N: usize> Regroup for [S; N] {
    type Regrouped = [S::Regrouped; N];

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        let vecs = replicas.into_iter().map(Vec::from).collect();
        let regrouped = <Vec<S>>::regroup_replicas(vecs, cx, path)?;
        <[S::Regrouped; N]>::try_from(regrouped)
            .map_err(|v| path.mismatch(format!("expected {N} elements, regrouped {}", v.len())))
    }

    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        let selected = regrouped
            .iter()
            .enumerate()
            .map(|(i, r)| S::select(r, selection, &path.index(i)))
            .collect::<Result<Vec<S>, _>>()?;
        <[S; N]>::try_from(selected)
            .map_err(|v| path.mismatch(format!("expected {N} elements, selected {}", v.len())))
    }
}

impl<S: Regroup> Regroup for Option<S> {
    type Regrouped = Option<S::Regrouped>;

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        let first_is_some = replicas.first().is_some_and(Option::is_some);
        if let Some(replica) = replicas.iter().position(|r| r.is_some() != first_is_some) {
            let (first, other) = if first_is_some {
                ("Some", "None")
            } else {
                ("None", "Some")
            };
            return Err(path.mismatch(format!(
                "replica 0 returned {first}, replica {replica} returned {other}"
            )));
        }
        if !first_is_some {
            return Ok(None);
        }
        let values = replicas.into_iter().flatten().collect();
        S::regroup_replicas(values, cx, path).map(Some)
    }

    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        regrouped
            .as_ref()
            .map(|r| S::select(r, selection, path))
            .transpose()
    }
}

impl<S: Regroup> Regroup for Box<S> {
    type Regrouped = Box<S::Regrouped>;

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        let values = replicas.into_iter().map(|b| *b).collect();
        S::regroup_replicas(values, cx, path).map(Box::new)
    }

    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        S::select(regrouped, selection, path).map(Box::new)
    }
}

/// The first key present on one replica and missing on another, as an error.
fn key_mismatch<K: fmt::Debug>(path: &Path<'_>, key: &K, has: usize, lacks: usize) -> ValuesError {
    path.mismatch(format!(
        "key {key:?} is in replica {has}'s map but not in replica {lacks}'s"
    ))
}

impl<K, V> Regroup for BTreeMap<K, V>
where
    K: Ord + Clone + fmt::Debug,
    V: Regroup,
{
    type Regrouped = BTreeMap<K, V::Regrouped>;

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        let mut columns: BTreeMap<K, Vec<V>> = match replicas.first() {
            Some(first) => first.keys().map(|k| (k.clone(), Vec::new())).collect(),
            None => BTreeMap::new(),
        };
        for (replica, map) in replicas.into_iter().enumerate() {
            if let Some(k) = columns.keys().find(|k| !map.contains_key(*k)) {
                return Err(key_mismatch(path, k, 0, replica));
            }
            for (k, v) in map {
                match columns.get_mut(&k) {
                    Some(column) => column.push(v),
                    None => return Err(key_mismatch(path, &k, replica, 0)),
                }
            }
        }
        columns
            .into_iter()
            .map(|(k, column)| {
                let regrouped = V::regroup_replicas(column, cx, &path.key(&k))?;
                Ok((k, regrouped))
            })
            .collect()
    }

    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        regrouped
            .iter()
            .map(|(k, r)| Ok((k.clone(), V::select(r, selection, &path.key(k))?)))
            .collect()
    }
}

impl<K, V, H> Regroup for HashMap<K, V, H>
where
    K: Eq + Hash + Clone + fmt::Debug,
    V: Regroup,
    H: BuildHasher + Default,
{
    type Regrouped = HashMap<K, V::Regrouped, H>;

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        let mut columns: HashMap<K, Vec<V>, H> = match replicas.first() {
            Some(first) => first.keys().map(|k| (k.clone(), Vec::new())).collect(),
            None => HashMap::default(),
        };
        for (replica, map) in replicas.into_iter().enumerate() {
            if let Some(k) = columns.keys().find(|k| !map.contains_key(*k)) {
                return Err(key_mismatch(path, k, 0, replica));
            }
            for (k, v) in map {
                match columns.get_mut(&k) {
                    Some(column) => column.push(v),
                    None => return Err(key_mismatch(path, &k, replica, 0)),
                }
            }
        }
        columns
            .into_iter()
            .map(|(k, column)| {
                let regrouped = V::regroup_replicas(column, cx, &path.key(&k))?;
                Ok((k, regrouped))
            })
            .collect()
    }

    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        regrouped
            .iter()
            .map(|(k, r)| Ok((k.clone(), V::select(r, selection, &path.key(k))?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(n: usize) -> Arc<ReplicaDeviceMap> {
        Arc::new(ReplicaDeviceMap::new((0..n).map(|i| format!("/cpu:{i}"))).unwrap())
    }

    #[test]
    fn paths_print_every_segment() {
        let root = Path::ROOT;
        let a = root.field("0");
        let b = a.index(3);
        let k = 7;
        assert_eq!(b.key(&k).to_string(), ".0[3][7]");
    }

    #[test]
    fn regroup_needs_one_value_per_replica() {
        let err = regroup(&map(2), vec![1]).unwrap_err();
        assert!(matches!(
            err,
            ValuesError::ReplicaCountMismatch {
                expected: 2,
                found: 1,
                ..
            }
        ));
    }

    #[test]
    fn option_mismatch_names_the_path() {
        let err = regroup(&map(2), vec![(1, Some(2)), (1, None)]).unwrap_err();
        assert_eq!(
            err,
            ValuesError::StructureMismatch {
                path: ".1".into(),
                detail: "replica 0 returned Some, replica 1 returned None".into()
            }
        );
    }

    #[test]
    fn map_key_mismatch_names_the_key_both_ways() {
        let a = BTreeMap::from([("x", 1)]);
        let b = BTreeMap::from([("x", 1), ("y", 2)]);
        let err = regroup(&map(2), vec![a.clone(), b.clone()]).unwrap_err();
        assert!(
            err.to_string()
                .contains(r#"key "y" is in replica 1's map but not in replica 0's"#),
            "{err}"
        );
        let err = regroup(&map(2), vec![b, a]).unwrap_err();
        assert!(
            err.to_string()
                .contains(r#"key "y" is in replica 0's map but not in replica 1's"#),
            "{err}"
        );
    }

    #[test]
    fn arrays_round_trip() {
        let xs = vec![[1, 2, 3], [1, 5, 6]];
        let grouped = regroup(&map(2), xs.clone()).unwrap();
        assert_eq!(grouped[0], Leaf::Same(1));
        for (i, x) in xs.iter().enumerate() {
            assert_eq!(&select_replica::<[i32; 3]>(i, &grouped).unwrap(), x);
        }
    }
}
