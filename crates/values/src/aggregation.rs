//! How values combine across replicas: [`ReduceOp`], [`VariableAggregation`] and
//! [`VariableSynchronization`], with TensorFlow's rules for which combinations are valid
//! (`rules`: their names parsed, an aggregation's reduce op, a variable's synchronization).
//!
//! This file holds the policies themselves and their names, and names no error: the rules
//! refuse with a [`ValuesError`](crate::ValuesError), whose messages name the policies.

mod rules;

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a reduction combines one value per replica into one value.
///
/// ```
/// use distribute_values::ReduceOp;
///
/// let op: ReduceOp = "mean".parse()?;
/// assert_eq!(op, ReduceOp::Mean);
/// assert_eq!(op.to_string(), "MEAN");
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    /// Add the values.
    Sum,
    /// Add the values and divide by the replica count.
    Mean,
    /// The smallest value.
    Min,
    /// The largest value.
    Max,
}

impl ReduceOp {
    fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "SUM",
            ReduceOp::Mean => "MEAN",
            ReduceOp::Min => "MIN",
            ReduceOp::Max => "MAX",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the copies of a distributed variable are combined when it is updated (mirrored variables)
/// or read across replicas (sync-on-read variables).
///
/// ```
/// use distribute_values::VariableAggregation;
///
/// let aggregation: VariableAggregation = "only_first_replica".parse()?;
/// assert_eq!(aggregation, VariableAggregation::OnlyFirstReplica);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum VariableAggregation {
    /// No aggregation: replica-context updates change only the local copy.
    #[default]
    None,
    /// Add the replicas' values.
    Sum,
    /// Average the replicas' values; floating-point variables only.
    Mean,
    /// Use replica 0's value and ignore the others.
    OnlyFirstReplica,
}

impl VariableAggregation {
    fn name(self) -> &'static str {
        match self {
            VariableAggregation::None => "NONE",
            VariableAggregation::Sum => "SUM",
            VariableAggregation::Mean => "MEAN",
            VariableAggregation::OnlyFirstReplica => "ONLY_FIRST_REPLICA",
        }
    }
}

impl fmt::Display for VariableAggregation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// When the copies of a distributed variable are kept in step.
///
/// ```
/// use distribute_values::{SyncKind, VariableSynchronization};
///
/// // Auto means "sync on write"; on-read variables default to non-trainable.
/// assert_eq!(VariableSynchronization::Auto.resolve("w", None)?, (SyncKind::OnWrite, true));
/// assert_eq!(VariableSynchronization::OnRead.resolve("m", None)?, (SyncKind::OnRead, false));
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum VariableSynchronization {
    /// Let the strategy choose: sync on write.
    #[default]
    Auto,
    /// Never synchronised; not allowed for distributed variables.
    None,
    /// Every update is applied to every copy (a [`MirroredVariable`](crate::MirroredVariable)).
    OnWrite,
    /// Copies diverge and are aggregated when read across replicas
    /// (a [`SyncOnReadVariable`](crate::SyncOnReadVariable)).
    OnRead,
}

/// The two kinds of distributed variable that a [`VariableSynchronization`] resolves to.
///
/// ```
/// use distribute_values::{SyncKind, VariableSynchronization};
///
/// let (kind, _) = VariableSynchronization::OnWrite.resolve("w", Some(true))?;
/// assert_eq!(kind, SyncKind::OnWrite);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SyncKind {
    /// A [`MirroredVariable`](crate::MirroredVariable).
    OnWrite,
    /// A [`SyncOnReadVariable`](crate::SyncOnReadVariable).
    OnRead,
}

impl VariableSynchronization {
    fn name(self) -> &'static str {
        match self {
            VariableSynchronization::Auto => "AUTO",
            VariableSynchronization::None => "NONE",
            VariableSynchronization::OnWrite => "ON_WRITE",
            VariableSynchronization::OnRead => "ON_READ",
        }
    }
}

impl fmt::Display for VariableSynchronization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
