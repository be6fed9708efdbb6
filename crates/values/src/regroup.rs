//! Nested structures across replicas: [`regroup`] turns "one structure per replica" into "one
//! structure of distributed values", and [`select_replica`] / [`select_replica_mirrored`] /
//! [`select_device_mirrored`] go back.
//!
//! The [`Regroup`] trait maps a structure type to its regrouped type: a leaf `T` becomes a
//! [`Leaf<T>`], and containers (tuples, `Vec`, arrays, maps, `Option`, `Box`) keep their shape
//! with regrouped contents; an `Option` that is `None` on some replicas only becomes a
//! [`RegroupedOption::PerReplica`](crate::RegroupedOption) of each replica's own `Option`. Users' own structs get it from `#[derive(Nest)]`, which also
//! declares the regrouped companion struct; `#[nest(leaf)]` makes a type a leaf instead.
//! [`Distributed`] goes the other way, from a regrouped type to its per-replica structure, so
//! that a strategy's `run` infers what each replica gets from the inputs it is given.
//!
//! The container impls of [`Regroup`], [`Distributed`] and [`Nest`](crate::Nest) live together
//! in `containers.rs`.

use std::fmt;
use std::sync::Arc;

use crate::{DistributedValues, Mirrored, Path, PerReplica, ReplicaDeviceMap, ValuesError};

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

/// A structure that can be regrouped across replicas and selected back.
///
/// Implemented for leaves (numbers, `bool`, `char`, `String`, `&'static str`, `()`), for
/// containers of `Regroup` types (tuples up to 8, `Vec`, arrays, `BTreeMap`, `HashMap`,
/// `Option`, `Box`), for distributed variables and their components, and by
/// `#[derive(Nest)]` for users' structs. Hand-written impls follow the container impls
/// (`containers.rs`): split the replicas' values field by field, regroup each field with its
/// own path, and select field by field; implement [`Nest`](crate::Nest) and [`Distributed`]
/// beside it.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{regroup, select_replica, Leaf, Nest, ReplicaDeviceMap};
///
/// #[derive(Debug, Clone, PartialEq, Nest)]
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

/// A structure of distributed values that names its per-replica structure: the inverse of
/// [`Regroup::Regrouped`]. Implemented for [`Leaf<T>`], `()`, distributed variables (whose
/// replicas get their components), the containers (tuples up to 8, `Vec`, arrays, `BTreeMap`,
/// `HashMap`, `Option`, `Box`) and the companion structs `#[derive(Nest)]` declares.
///
/// A strategy's `run` takes its inputs as a `Distributed` value and hands replica `r` the
/// [`Distributed::Local`] it selects, so the step's input type is inferred from the inputs.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{Distributed, Leaf, PerReplica, ReplicaDeviceMap, select_replica};
///
/// fn replica_input<D: Distributed>(inputs: &D, replica: usize) -> D::Local {
///     select_replica::<D::Local>(replica, inputs).unwrap()
/// }
///
/// let map = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let inputs = (Leaf::PerReplica(PerReplica::new(map, vec![1, 2])?), Leaf::Same("x"));
/// assert_eq!(replica_input(&inputs, 1), (2, "x"));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
pub trait Distributed {
    /// The structure one replica holds.
    type Local: Regroup<Regrouped = Self>;
}

impl<T: Regroup<Regrouped = Leaf<T>>> Distributed for Leaf<T> {
    type Local = T;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn map(n: usize) -> Arc<ReplicaDeviceMap> {
        Arc::new(ReplicaDeviceMap::new((0..n).map(|i| format!("/cpu:{i}"))).unwrap())
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
    fn options_that_differ_regroup_per_replica() {
        let replicas = vec![(1, Some(2)), (1, None)];
        let grouped = regroup(&map(2), replicas.clone()).unwrap();
        assert_eq!(grouped.0, Leaf::Same(1));
        assert_eq!(grouped.1.per_replica().unwrap().values(), [Some(2), None]);
        for (i, replica) in replicas.iter().enumerate() {
            assert_eq!(
                &select_replica::<(i32, Option<i32>)>(i, &grouped).unwrap(),
                replica
            );
        }
    }

    #[test]
    fn mirrored_options_that_differ_name_the_path() {
        let options = RegroupOptions {
            wrap: Wrap::Mirrored,
            ..RegroupOptions::default()
        };
        let err = regroup_with(&map(2), vec![(1, Some(2)), (1, None)], options).unwrap_err();
        assert_eq!(
            err,
            ValuesError::StructureMismatch {
                path: ".1".into(),
                detail: "replica 0 returned Some, replica 1 returned None".into()
            }
        );
        let grouped = regroup(&map(2), vec![(1, Some(2)), (1, None)]).unwrap();
        let err = select_replica_mirrored::<(i32, Option<i32>)>(0, &grouped).unwrap_err();
        assert!(matches!(err, ValuesError::NotMirrored { .. }), "{err}");
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
