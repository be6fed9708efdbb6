//! The shapes of nested structures, once for every trait that walks them: the leaf types, `()`,
//! the tuple ladder (up to 8), `Vec`, arrays, `Option`, `Box` and the maps each implement
//! [`Regroup`], [`Distributed`] and [`Nest`] here, side by side, so that the three agree on
//! what a structure is.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use crate::{
    Distributed, DistributedValues, Leaf, LeafMapper, LeafVisitor, LeafZipper, Nest, Path,
    PerReplica, Regroup, RegroupContext, Selection, ValuesError, Wrap,
};

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

        impl Nest for $ty {
            fn visit_leaves<V: LeafVisitor>(
                &self,
                path: &Path<'_>,
                visitor: &mut V,
            ) -> Result<(), V::Error> {
                visitor.leaf(path, self)
            }

            fn map_leaves<M: LeafMapper>(
                &self,
                path: &Path<'_>,
                mapper: &mut M,
            ) -> Result<Self, M::Error> {
                mapper.leaf(path, self)
            }

            fn zip_leaves<Z: LeafZipper>(
                parts: &[&Self],
                path: &Path<'_>,
                zipper: &mut Z,
            ) -> Result<Self, Z::Error> {
                zipper.leaf(path, parts)
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

impl Distributed for () {
    type Local = ();
}

/// `()` has no leaves.
impl Nest for () {
    fn visit_leaves<V: LeafVisitor>(&self, _: &Path<'_>, _: &mut V) -> Result<(), V::Error> {
        Ok(())
    }

    fn map_leaves<M: LeafMapper>(&self, _: &Path<'_>, _: &mut M) -> Result<(), M::Error> {
        Ok(())
    }

    fn zip_leaves<Z: LeafZipper>(_: &[&()], _: &Path<'_>, _: &mut Z) -> Result<(), Z::Error> {
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

        impl<$($name: Distributed),+> Distributed for ($($name,)+) {
            type Local = ($($name::Local,)+);
        }

        impl<$($name: Nest),+> Nest for ($($name,)+) {
            fn visit_leaves<V: LeafVisitor>(
                &self,
                path: &Path<'_>,
                visitor: &mut V,
            ) -> Result<(), V::Error> {
                $(self.$index.visit_leaves(&path.field(stringify!($index)), visitor)?;)+
                Ok(())
            }

            fn map_leaves<M: LeafMapper>(
                &self,
                path: &Path<'_>,
                mapper: &mut M,
            ) -> Result<Self, M::Error> {
                Ok(($(self.$index.map_leaves(&path.field(stringify!($index)), mapper)?,)+))
            }

            fn zip_leaves<Z: LeafZipper>(
                parts: &[&Self],
                path: &Path<'_>,
                zipper: &mut Z,
            ) -> Result<Self, Z::Error> {
                $(let $column: Vec<&$name> = parts.iter().map(|p| &p.$index).collect();)+
                Ok(($($name::zip_leaves(&$column, &path.field(stringify!($index)), zipper)?,)+))
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

/// Who holds the structures being combined, for mismatch messages: `regroup` combines one per
/// replica, `zip_leaves` any parts.
#[derive(Clone, Copy)]
enum Holder {
    Replica,
    Part,
}

impl Holder {
    fn name(self) -> &'static str {
        match self {
            Holder::Replica => "replica",
            Holder::Part => "part",
        }
    }
}

/// Splits equal-length sequences (one per replica) into one column per position.
fn transpose<S>(
    sequences: Vec<Vec<S>>,
    what: &str,
    path: &Path<'_>,
) -> Result<Vec<Vec<S>>, ValuesError> {
    let len = sequences.first().map_or(0, Vec::len);
    if let Some((replica, other)) = sequences.iter().enumerate().find(|(_, r)| r.len() != len) {
        return Err(path.mismatch(format!(
            "replica 0 returned a {what} of {len} elements, replica {replica} a {what} of {}",
            other.len()
        )));
    }
    let mut columns: Vec<Vec<S>> = (0..len)
        .map(|_| Vec::with_capacity(sequences.len()))
        .collect();
    for sequence in sequences {
        for (column, value) in columns.iter_mut().zip(sequence) {
            column.push(value);
        }
    }
    Ok(columns)
}

/// The columns of equal-length slices, borrowed: column `i` holds every part's element `i`.
fn columns<'p, S>(parts: &[&'p [S]], path: &Path<'_>) -> Result<Vec<Vec<&'p S>>, ValuesError> {
    let len = parts.first().map_or(0, |p| p.len());
    if let Some((part, other)) = parts.iter().enumerate().find(|(_, p)| p.len() != len) {
        return Err(path.mismatch(format!(
            "part 0 has a list of {len} elements, part {part} a list of {}",
            other.len()
        )));
    }
    Ok((0..len)
        .map(|i| parts.iter().map(|p| &p[i]).collect())
        .collect())
}

fn visit_sequence<S: Nest, V: LeafVisitor>(
    items: &[S],
    path: &Path<'_>,
    visitor: &mut V,
) -> Result<(), V::Error> {
    for (i, item) in items.iter().enumerate() {
        item.visit_leaves(&path.index(i), visitor)?;
    }
    Ok(())
}

fn map_sequence<S: Nest, M: LeafMapper>(
    items: &[S],
    path: &Path<'_>,
    mapper: &mut M,
) -> Result<Vec<S>, M::Error> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| item.map_leaves(&path.index(i), mapper))
        .collect()
}

fn zip_sequences<S: Nest, Z: LeafZipper>(
    parts: &[&[S]],
    path: &Path<'_>,
    zipper: &mut Z,
) -> Result<Vec<S>, Z::Error> {
    columns(parts, path)?
        .iter()
        .enumerate()
        .map(|(i, column)| S::zip_leaves(column, &path.index(i), zipper))
        .collect()
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

impl<D: Distributed> Distributed for Vec<D> {
    type Local = Vec<D::Local>;
}

impl<S: Nest> Nest for Vec<S> {
    fn visit_leaves<V: LeafVisitor>(
        &self,
        path: &Path<'_>,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        visit_sequence(self, path, visitor)
    }

    fn map_leaves<M: LeafMapper>(&self, path: &Path<'_>, mapper: &mut M) -> Result<Self, M::Error> {
        map_sequence(self, path, mapper)
    }

    fn zip_leaves<Z: LeafZipper>(
        parts: &[&Self],
        path: &Path<'_>,
        zipper: &mut Z,
    ) -> Result<Self, Z::Error> {
        let slices: Vec<&[S]> = parts.iter().map(|p| p.as_slice()).collect();
        zip_sequences(&slices, path, zipper)
    }
}

/// A sequence of `N` elements as an array; `what` says where it came from.
fn array<S, const N: usize>(
    items: Vec<S>,
    what: &str,
    path: &Path<'_>,
) -> Result<[S; N], ValuesError> {
    <[S; N]>::try_from(items)
        .map_err(|v| path.mismatch(format!("expected {N} elements, {what} {}", v.len())))
}

impl<S: Regroup, const N: usize> Regroup for [S; N] {
    type Regrouped = [S::Regrouped; N];

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        let vecs = replicas.into_iter().map(Vec::from).collect();
        array(
            <Vec<S>>::regroup_replicas(vecs, cx, path)?,
            "regrouped",
            path,
        )
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
        array(selected, "selected", path)
    }
}

impl<D: Distributed, const N: usize> Distributed for [D; N] {
    type Local = [D::Local; N];
}

impl<S: Nest, const N: usize> Nest for [S; N] {
    fn visit_leaves<V: LeafVisitor>(
        &self,
        path: &Path<'_>,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        visit_sequence(self, path, visitor)
    }

    fn map_leaves<M: LeafMapper>(&self, path: &Path<'_>, mapper: &mut M) -> Result<Self, M::Error> {
        Ok(array(map_sequence(self, path, mapper)?, "mapped", path)?)
    }

    fn zip_leaves<Z: LeafZipper>(
        parts: &[&Self],
        path: &Path<'_>,
        zipper: &mut Z,
    ) -> Result<Self, Z::Error> {
        let slices: Vec<&[S]> = parts.iter().map(|p| p.as_slice()).collect();
        Ok(array(
            zip_sequences(&slices, path, zipper)?,
            "zipped",
            path,
        )?)
    }
}

/// The first holder whose `Option` differs from holder 0's, as an error.
fn option_mismatch<S>(
    options: &[&Option<S>],
    holder: Holder,
    path: &Path<'_>,
) -> Result<bool, ValuesError> {
    let first_is_some = options.first().is_some_and(|o| o.is_some());
    if let Some(other) = options.iter().position(|o| o.is_some() != first_is_some) {
        let (first, second) = if first_is_some {
            ("Some", "None")
        } else {
            ("None", "Some")
        };
        let name = holder.name();
        let detail = match holder {
            Holder::Replica => {
                format!("{name} 0 returned {first}, {name} {other} returned {second}")
            }
            Holder::Part => format!("{name} 0 is {first}, {name} {other} is {second}"),
        };
        return Err(path.mismatch(detail));
    }
    Ok(first_is_some)
}

/// The regrouped form of an `Option`: `Some` contents regrouped when every replica returned
/// `Some`, and each replica's own `Option` when they differ (TF's `PerReplica` holding `None`
/// beside values, as when a replica's batch was empty).
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{
///     regroup, select_replica, DistributedValues, Leaf, RegroupedOption, ReplicaDeviceMap,
/// };
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let both: RegroupedOption<f32> = regroup(&map, vec![Some(1.0), Some(1.0)])?;
/// assert_eq!(both.as_some(), Some(&Leaf::Same(1.0)));
///
/// let mixed: RegroupedOption<f32> = regroup(&map, vec![None, Some(2.0)])?;
/// assert_eq!(mixed.per_replica().unwrap().values(), [None, Some(2.0)]);
/// assert_eq!(select_replica::<Option<f32>>(0, &mixed)?, None);
/// assert_eq!(select_replica::<Option<f32>>(1, &mixed)?, Some(2.0));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub enum RegroupedOption<S: Regroup> {
    /// Every replica returned `None`.
    None,
    /// Every replica returned `Some`: the contents, regrouped.
    Some(S::Regrouped),
    /// Some replicas returned `None` and others `Some`: each replica's own `Option`.
    PerReplica(PerReplica<Option<S>>),
}

impl<S: Regroup> RegroupedOption<S> {
    /// The regrouped contents when every replica returned `Some`.
    pub fn as_some(&self) -> Option<&S::Regrouped> {
        match self {
            RegroupedOption::Some(r) => Some(r),
            _ => None,
        }
    }

    /// Each replica's own `Option`, when replicas differ.
    pub fn per_replica(&self) -> Option<&PerReplica<Option<S>>> {
        match self {
            RegroupedOption::PerReplica(p) => Some(p),
            _ => None,
        }
    }

    /// Whether every replica returned `None`.
    pub fn is_none(&self) -> bool {
        matches!(self, RegroupedOption::None)
    }
}

impl<S> Clone for RegroupedOption<S>
where
    S: Regroup + Clone,
    S::Regrouped: Clone,
{
    fn clone(&self) -> Self {
        match self {
            RegroupedOption::None => RegroupedOption::None,
            RegroupedOption::Some(r) => RegroupedOption::Some(r.clone()),
            RegroupedOption::PerReplica(p) => RegroupedOption::PerReplica(p.clone()),
        }
    }
}

impl<S> PartialEq for RegroupedOption<S>
where
    S: Regroup + PartialEq,
    S::Regrouped: PartialEq,
{
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (RegroupedOption::None, RegroupedOption::None) => true,
            (RegroupedOption::Some(a), RegroupedOption::Some(b)) => a == b,
            (RegroupedOption::PerReplica(a), RegroupedOption::PerReplica(b)) => a == b,
            _ => false,
        }
    }
}

impl<S> fmt::Debug for RegroupedOption<S>
where
    S: Regroup + fmt::Debug,
    S::Regrouped: fmt::Debug,
{
    /// `None` and `Some(..)` print as an `Option` would; differing replicas as their
    /// `PerReplica`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegroupedOption::None => f.write_str("None"),
            RegroupedOption::Some(r) => f.debug_tuple("Some").field(r).finish(),
            RegroupedOption::PerReplica(p) => p.fmt(f),
        }
    }
}

/// Replicas may disagree on `Some` and `None` (TF regroups them into a `PerReplica`); the
/// contents must be `Clone` so that each replica can get its own `Option` back.
impl<S: Regroup + Clone> Regroup for Option<S> {
    type Regrouped = RegroupedOption<S>;

    fn regroup_replicas(
        replicas: Vec<Self>,
        cx: &RegroupContext<'_>,
        path: &Path<'_>,
    ) -> Result<Self::Regrouped, ValuesError> {
        let some = replicas.iter().filter(|o| o.is_some()).count();
        if some == 0 {
            return Ok(RegroupedOption::None);
        }
        if some == replicas.len() {
            let values = replicas.into_iter().flatten().collect();
            return S::regroup_replicas(values, cx, path).map(RegroupedOption::Some);
        }
        if cx.options().wrap == Wrap::Mirrored {
            // Copies of one value cannot be absent on some devices.
            let refs: Vec<&Option<S>> = replicas.iter().collect();
            option_mismatch(&refs, Holder::Replica, path)?;
        }
        Ok(RegroupedOption::PerReplica(PerReplica::new(
            Arc::clone(cx.devices()),
            replicas,
        )?))
    }

    fn select(
        regrouped: &Self::Regrouped,
        selection: Selection<'_>,
        path: &Path<'_>,
    ) -> Result<Self, ValuesError> {
        match (regrouped, selection) {
            (RegroupedOption::None, _) => Ok(None),
            (RegroupedOption::Some(r), _) => S::select(r, selection, path).map(Some),
            (RegroupedOption::PerReplica(p), Selection::Replica(i)) => p.get(i).cloned(),
            (RegroupedOption::PerReplica(_), _) => Err(ValuesError::NotMirrored {
                path: path.to_string(),
                found: "an Option that is None on some replicas",
            }),
        }
    }
}

impl<S: Regroup + Clone> Distributed for RegroupedOption<S> {
    type Local = Option<S>;
}

impl<S: Nest> Nest for Option<S> {
    fn visit_leaves<V: LeafVisitor>(
        &self,
        path: &Path<'_>,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        match self {
            Some(s) => s.visit_leaves(path, visitor),
            None => Ok(()),
        }
    }

    fn map_leaves<M: LeafMapper>(&self, path: &Path<'_>, mapper: &mut M) -> Result<Self, M::Error> {
        self.as_ref()
            .map(|s| s.map_leaves(path, mapper))
            .transpose()
    }

    fn zip_leaves<Z: LeafZipper>(
        parts: &[&Self],
        path: &Path<'_>,
        zipper: &mut Z,
    ) -> Result<Self, Z::Error> {
        if !option_mismatch(parts, Holder::Part, path)? {
            return Ok(None);
        }
        let values: Vec<&S> = parts.iter().filter_map(|p| p.as_ref()).collect();
        S::zip_leaves(&values, path, zipper).map(Some)
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

impl<D: Distributed> Distributed for Box<D> {
    type Local = Box<D::Local>;
}

impl<S: Nest> Nest for Box<S> {
    fn visit_leaves<V: LeafVisitor>(
        &self,
        path: &Path<'_>,
        visitor: &mut V,
    ) -> Result<(), V::Error> {
        (**self).visit_leaves(path, visitor)
    }

    fn map_leaves<M: LeafMapper>(&self, path: &Path<'_>, mapper: &mut M) -> Result<Self, M::Error> {
        (**self).map_leaves(path, mapper).map(Box::new)
    }

    fn zip_leaves<Z: LeafZipper>(
        parts: &[&Self],
        path: &Path<'_>,
        zipper: &mut Z,
    ) -> Result<Self, Z::Error> {
        let values: Vec<&S> = parts.iter().map(|p| &***p).collect();
        S::zip_leaves(&values, path, zipper).map(Box::new)
    }
}

/// The first key present in one holder's map and missing in another's, as an error.
fn key_mismatch<K: fmt::Debug>(
    path: &Path<'_>,
    key: &K,
    holder: Holder,
    has: usize,
    lacks: usize,
) -> ValuesError {
    let name = holder.name();
    path.mismatch(format!(
        "key {key:?} is in {name} {has}'s map but not in {name} {lacks}'s"
    ))
}

/// A map's entries in key order: every walk over a map visits its leaves in that order, so that
/// equal maps (a `HashMap` on each replica) are walked alike.
fn sorted<'m, K: Ord, V>(entries: impl Iterator<Item = (&'m K, &'m V)>) -> Vec<(&'m K, &'m V)> {
    let mut entries: Vec<(&K, &V)> = entries.collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
}

/// `BTreeMap` and `HashMap`, with one body for each operation. `[...]` holds the key (and
/// hasher) bounds regrouping needs; `Nest` adds `Ord` for `HashMap` keys, to walk them in order.
macro_rules! map_impls {
    ($($map:ident<K, V $(, $hasher:ident)?> [$($bounds:tt)*] nest [$($nest_bounds:tt)*];)+) => {$(
        impl<K, V: Regroup $(, $hasher)?> Regroup for $map<K, V $(, $hasher)?>
        where
            $($bounds)*
        {
            type Regrouped = $map<K, V::Regrouped $(, $hasher)?>;

            fn regroup_replicas(
                replicas: Vec<Self>,
                cx: &RegroupContext<'_>,
                path: &Path<'_>,
            ) -> Result<Self::Regrouped, ValuesError> {
                let mut columns: $map<K, Vec<V> $(, $hasher)?> = match replicas.first() {
                    Some(first) => first.keys().map(|k| (k.clone(), Vec::new())).collect(),
                    None => Default::default(),
                };
                for (replica, map) in replicas.into_iter().enumerate() {
                    if let Some(k) = columns.keys().find(|k| !map.contains_key(*k)) {
                        return Err(key_mismatch(path, k, Holder::Replica, 0, replica));
                    }
                    for (k, v) in map {
                        match columns.get_mut(&k) {
                            Some(column) => column.push(v),
                            None => return Err(key_mismatch(path, &k, Holder::Replica, replica, 0)),
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

        impl<K, D: Distributed $(, $hasher)?> Distributed for $map<K, D $(, $hasher)?>
        where
            $($bounds)*
        {
            type Local = $map<K, D::Local $(, $hasher)?>;
        }

        impl<K, V: Nest $(, $hasher)?> Nest for $map<K, V $(, $hasher)?>
        where
            $($bounds)*
            $($nest_bounds)*
        {
            fn visit_leaves<Vis: LeafVisitor>(
                &self,
                path: &Path<'_>,
                visitor: &mut Vis,
            ) -> Result<(), Vis::Error> {
                for (k, v) in sorted(self.iter()) {
                    v.visit_leaves(&path.key(k), visitor)?;
                }
                Ok(())
            }

            fn map_leaves<M: LeafMapper>(
                &self,
                path: &Path<'_>,
                mapper: &mut M,
            ) -> Result<Self, M::Error> {
                sorted(self.iter())
                    .into_iter()
                    .map(|(k, v)| Ok((k.clone(), v.map_leaves(&path.key(k), mapper)?)))
                    .collect()
            }

            fn zip_leaves<Z: LeafZipper>(
                parts: &[&Self],
                path: &Path<'_>,
                zipper: &mut Z,
            ) -> Result<Self, Z::Error> {
                let Some(first) = parts.first() else {
                    return Ok(Default::default());
                };
                for (part, map) in parts.iter().enumerate() {
                    if let Some(k) = first.keys().find(|k| !map.contains_key(*k)) {
                        return Err(key_mismatch(path, k, Holder::Part, 0, part).into());
                    }
                    if let Some(k) = map.keys().find(|k| !first.contains_key(*k)) {
                        return Err(key_mismatch(path, k, Holder::Part, part, 0).into());
                    }
                }
                sorted(first.iter())
                    .into_iter()
                    .map(|(k, _)| {
                        let values: Vec<&V> = parts.iter().filter_map(|p| p.get(k)).collect();
                        Ok((k.clone(), V::zip_leaves(&values, &path.key(k), zipper)?))
                    })
                    .collect()
            }
        }
    )+};
}

map_impls! {
    BTreeMap<K, V> [K: Ord + Clone + fmt::Debug,] nest [];
    HashMap<K, V, H> [K: Eq + Hash + Clone + fmt::Debug, H: BuildHasher + Default,] nest [K: Ord,];
}
