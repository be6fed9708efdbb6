//! Creating distributed variables: [`VariableOptions`] (synchronization, aggregation, trainable),
//! validation as TF's variable creators do it, and the canonical names replicas' variables are
//! matched by.

use std::sync::Arc;

use distribute_values::{
    DistributedVariable, ReplicaDeviceMap, SyncKind, VariableAggregation, VariableSynchronization,
    VariableValue,
};

use crate::StrategyError;

/// How a distributed variable is kept in sync, aggregated and trained.
///
/// ```
/// use distribute_strategy::VariableOptions;
/// use distribute_values::{VariableAggregation, VariableSynchronization};
///
/// let metric = VariableOptions {
///     synchronization: VariableSynchronization::OnRead,
///     aggregation: VariableAggregation::Sum,
///     ..VariableOptions::default()
/// };
/// assert_eq!(metric.trainable, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VariableOptions {
    /// When copies are synchronised: on write (mirrored, the default) or on read.
    pub synchronization: VariableSynchronization,
    /// How replicas' updates (on write) or copies (on read) combine.
    pub aggregation: VariableAggregation,
    /// Whether an optimizer trains it; `None` means yes, except for on-read variables.
    pub trainable: Option<bool>,
}

/// A variable built for `devices` as `options` say: a mirrored variable for on-write (or auto)
/// synchronization, a sync-on-read one for on-read. `VariableSynchronization::None` and invalid
/// combinations are refused with a message naming the variable.
pub fn create_distributed_variable<T: VariableValue>(
    name: &str,
    devices: &Arc<ReplicaDeviceMap>,
    initial: T,
    options: VariableOptions,
) -> Result<DistributedVariable<T>, StrategyError> {
    let (kind, _trainable) = options.synchronization.resolve(name, options.trainable)?;
    let devices = Arc::clone(devices);
    Ok(match kind {
        SyncKind::OnWrite => {
            DistributedVariable::new_on_write(name, devices, initial, options.aggregation)?
        }
        SyncKind::OnRead => {
            DistributedVariable::new_on_read(name, devices, initial, options.aggregation)?
        }
    })
}

/// Creates distributed variables on a fixed set of devices: the strategy's, or another
/// variable's (see `CrossReplicaContext::colocate_vars_with`).
#[derive(Debug, Clone)]
pub struct VariableCreator {
    devices: Arc<ReplicaDeviceMap>,
}

impl VariableCreator {
    /// A creator of variables with one component per replica of `devices`.
    pub fn new(devices: Arc<ReplicaDeviceMap>) -> Self {
        VariableCreator { devices }
    }

    /// The devices the variables are created on.
    pub fn devices(&self) -> &Arc<ReplicaDeviceMap> {
        &self.devices
    }

    /// A variable named `name` on these devices, as [`create_distributed_variable`] builds it.
    pub fn create_variable<T: VariableValue>(
        &self,
        name: &str,
        initial: T,
        options: VariableOptions,
    ) -> Result<DistributedVariable<T>, StrategyError> {
        create_distributed_variable(name, &self.devices, initial, options)
    }
}

/// The name TF gives replica `replica`'s copy of a distributed variable named `name`: `name`
/// itself for replica 0, `name/replica_<i>` for the others (so the copies' names stay unique in
/// one checkpoint namespace).
///
/// ```
/// use distribute_strategy::replica_variable_name;
///
/// assert_eq!(replica_variable_name("foo", 0), "foo");
/// assert_eq!(replica_variable_name("foo", 1), "foo/replica_1");
/// ```
pub fn replica_variable_name(name: &str, replica: usize) -> String {
    if replica == 0 {
        name.to_owned()
    } else {
        format!("{name}/replica_{replica}")
    }
}

/// The name replicas' variables are matched by (TF's shared variable creator): `None` is
/// `Variable`, and a `_<one digit>` suffix of a path component is dropped, so replica 1's
/// `foo_1/bar_1/baz` matches replica 0's `foo/bar/baz`.
///
/// ```
/// use distribute_strategy::canonicalize_variable_name;
///
/// assert_eq!(canonicalize_variable_name(None), "Variable");
/// assert_eq!(canonicalize_variable_name(Some("foo_1/bar_1/baz")), "foo/bar/baz");
/// assert_eq!(canonicalize_variable_name(Some("foo_12")), "foo_12");
/// assert_eq!(canonicalize_variable_name(Some("foo_1:0")), "foo_1:0");
/// ```
pub fn canonicalize_variable_name(name: Option<&str>) -> String {
    let Some(name) = name else {
        return "Variable".to_owned();
    };
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < chars.len() {
        // `_<digit>` followed by `/` or the end of the name.
        let suffix = chars[i] == '_'
            && chars.get(i + 1).is_some_and(char::is_ascii_digit)
            && matches!(chars.get(i + 2), None | Some('/'));
        if suffix {
            i += 2;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}
