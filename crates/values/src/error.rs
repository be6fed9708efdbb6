//! The crate's one error type, [`ValuesError`], and the TensorFlow error kind each variant maps to.

use std::fmt;

/// The TensorFlow error kinds that `distribute-values` can raise (see the project's reference
/// behaviours, "Conventions"). Tests assert the kind first and the message second.
///
/// ```
/// use distribute_values::{ErrorKind, ReduceOp, VariableAggregation};
///
/// let err = ReduceOp::from_aggregation(VariableAggregation::None).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Python `ValueError`: a bad argument.
    InvalidArgument,
    /// Python `TypeError`: the wrong kind of value.
    TypeError,
    /// Python `RuntimeError`: protocol or state misuse.
    Runtime,
    /// Python `NotImplementedError`.
    Unimplemented,
    /// Python `assert`: replicas disagree on something they must agree on.
    Invariant,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::InvalidArgument => "InvalidArgument",
            ErrorKind::TypeError => "TypeError",
            ErrorKind::Runtime => "Runtime",
            ErrorKind::Unimplemented => "Unimplemented",
            ErrorKind::Invariant => "Invariant",
        })
    }
}

/// Everything that can go wrong in `distribute-values`. Each message says what was wrong and
/// what to do; [`ValuesError::kind`] gives the TensorFlow error kind.
///
/// ```
/// use distribute_values::{ErrorKind, ReplicaDeviceMap};
///
/// let err = ReplicaDeviceMap::new(["/device:CPU:0", "/device:CPU:0"]).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidArgument);
/// assert!(err.to_string().contains("more than once"));
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ValuesError {
    /// A device map was built from no devices.
    #[error("a replica device map needs at least one replica with at least one device")]
    EmptyDeviceMap,
    /// A device name was the empty string.
    #[error(
        "replica {replica}: device name is empty; canonicalise it first (for example with \
         distribute-device-spec) so that every device has a full name"
    )]
    EmptyDeviceName {
        /// The replica whose device list held the empty name.
        replica: usize,
    },
    /// The same device appears twice in a device map.
    #[error(
        "device '{device}' appears more than once in the device map; each device may serve only \
         one replica (canonicalise the names first so equal devices compare equal)"
    )]
    DuplicateDevice {
        /// The repeated device name.
        device: String,
    },
    /// Replicas span different numbers of logical devices.
    #[error(
        "replica {replica} has {found} logical devices but replica 0 has {expected}; every \
         replica must span the same number of devices"
    )]
    RaggedLogicalDevices {
        /// The first replica that differs from replica 0.
        replica: usize,
        /// Replica 0's device count.
        expected: usize,
        /// This replica's device count.
        found: usize,
    },
    /// A lookup named a device that is not in the map.
    #[error("device '{device}' is not in the device map {devices}; pass one of those devices")]
    UnknownDevice {
        /// The device that was asked for.
        device: String,
        /// The map's devices, printed.
        devices: String,
    },
    /// A replica index was past the end.
    #[error(
        "replica {replica} does not exist: there are {num_replicas} replicas (0..{num_replicas})"
    )]
    ReplicaOutOfRange {
        /// The index that was asked for.
        replica: usize,
        /// How many replicas there are.
        num_replicas: usize,
    },
    /// A logical device index was past the end.
    #[error(
        "logical device {index} does not exist: each replica spans {num_logical_devices} devices"
    )]
    LogicalDeviceOutOfRange {
        /// The index that was asked for.
        index: usize,
        /// How many devices each replica spans.
        num_logical_devices: usize,
    },
    /// A per-replica list had the wrong length for the device map.
    #[error(
        "{what}: got {found} values for {expected} replicas; pass exactly one value per replica"
    )]
    ReplicaCountMismatch {
        /// What was being built.
        what: &'static str,
        /// The device map's replica count.
        expected: usize,
        /// How many values were passed.
        found: usize,
    },
    /// Replicas returned structures of different shapes.
    #[error(
        "replicas returned different structures at {path}: {detail}; every replica must return \
         the same nesting (same lengths, keys and variants)"
    )]
    StructureMismatch {
        /// Where in the structure they differ (`root` is the whole value).
        path: String,
        /// How they differ.
        detail: String,
    },
    /// Replicas returned components of different distributed variables, or different variables.
    #[error(
        "replicas returned parts of different distributed variables at {path}: {detail}; \
         return the same variable (or its own components) on every replica"
    )]
    DifferentVariables {
        /// Where in the structure they differ.
        path: String,
        /// Which variables were seen.
        detail: String,
    },
    /// A typed walk over a nested structure met a leaf of another type.
    #[error(
        "expected a leaf of type {expected} at {path}, found a {found}; every leaf of this \
         structure must be a {expected}"
    )]
    UnexpectedLeaf {
        /// Where the leaf is.
        path: String,
        /// The type every leaf must have.
        expected: &'static str,
        /// The leaf's type.
        found: &'static str,
    },
    /// `select_replica_mirrored` met a value that is not mirrored.
    #[error(
        "expected a value mirrored across replicas at {path}, found {found}; use select_replica \
         for per-replica values"
    )]
    NotMirrored {
        /// Where the offending value is.
        path: String,
        /// What kind of value was found there.
        found: &'static str,
    },
    /// The operation exists in TensorFlow's interface but not for this kind of value.
    #[error("{what} is not supported; {hint}")]
    Unimplemented {
        /// The operation.
        what: &'static str,
        /// What to do instead.
        hint: &'static str,
    },
    /// A string did not name a known enum member.
    #[error("'{input}' is not a valid {what}; expected one of {expected}")]
    UnknownName {
        /// The enum being parsed.
        what: &'static str,
        /// The rejected input.
        input: String,
        /// The accepted names.
        expected: &'static str,
    },
    /// An aggregation that has no reduce op (`None`, `OnlyFirstReplica`) was asked for one.
    #[error(
        "aggregation {aggregation} cannot be converted to a reduce op; only Sum and Mean can \
         (OnlyFirstReplica is applied by taking replica 0's value)"
    )]
    NotReducible {
        /// The aggregation.
        aggregation: crate::VariableAggregation,
    },
    /// `VariableSynchronization::None` was used for a distributed variable.
    #[error(
        "variable '{name}': synchronization None is not supported for distributed variables; \
         use Auto, OnWrite or OnRead"
    )]
    SynchronizationNone {
        /// The variable's name.
        name: String,
    },
    /// Mean aggregation on a variable whose element type is not floating point.
    #[error(
        "variable '{name}': aggregation Mean needs a floating-point value (integer division \
         would silently lose precision); use a float type or another aggregation"
    )]
    MeanOnNonFloat {
        /// The variable's name.
        name: String,
    },
    /// An update that a sync-on-read Sum variable cannot apply across replicas.
    #[error(
        "variable '{name}': {op} in cross-replica context is not supported with aggregation \
         {aggregation}; assign the new total instead, or update in replica context"
    )]
    CrossReplicaUpdateUnsupported {
        /// The variable's name.
        name: String,
        /// The update.
        op: crate::UpdateOp,
        /// The variable's aggregation.
        aggregation: crate::VariableAggregation,
    },
    /// Summing a value that is not distributed would multiply it by the replica count.
    #[error(
        "cannot Sum the non-distributed value {value} over {num_replicas} replicas (it would be \
         counted {num_replicas} times); pass a per-replica value or use Mean"
    )]
    SumOfNonDistributed {
        /// The value, printed.
        value: String,
        /// The replica count.
        num_replicas: usize,
    },
    /// An aggregated update was asked for one replica alone.
    #[error(
        "variable '{name}' has aggregation {aggregation}: a replica-context update needs every \
         replica's value; gather them (merge_call) and call update_aggregated"
    )]
    NeedsAllReplicas {
        /// The variable's name.
        name: String,
        /// The variable's aggregation.
        aggregation: crate::VariableAggregation,
    },
    /// Element arithmetic failed (overflow, shape mismatch, …).
    #[error("{0}")]
    Arithmetic(String),
}

impl ValuesError {
    /// The TensorFlow error kind of this error.
    pub fn kind(&self) -> ErrorKind {
        use ValuesError::*;
        match self {
            EmptyDeviceMap
            | EmptyDeviceName { .. }
            | DuplicateDevice { .. }
            | RaggedLogicalDevices { .. }
            | UnknownDevice { .. }
            | ReplicaOutOfRange { .. }
            | LogicalDeviceOutOfRange { .. }
            | ReplicaCountMismatch { .. }
            | UnknownName { .. }
            | NotReducible { .. }
            | SynchronizationNone { .. }
            | MeanOnNonFloat { .. }
            | CrossReplicaUpdateUnsupported { .. }
            | SumOfNonDistributed { .. }
            | Arithmetic(_) => ErrorKind::InvalidArgument,
            StructureMismatch { .. } | DifferentVariables { .. } => ErrorKind::Invariant,
            NotMirrored { .. } | UnexpectedLeaf { .. } => ErrorKind::TypeError,
            NeedsAllReplicas { .. } => ErrorKind::Runtime,
            Unimplemented { .. } => ErrorKind::Unimplemented,
        }
    }
}
