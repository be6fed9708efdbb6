//! How values combine across replicas: [`ReduceOp`], [`VariableAggregation`] and
//! [`VariableSynchronization`], with TensorFlow's rules for which combinations are valid.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ValuesError;

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
    /// The reduce op that implements a variable aggregation: `Sum` → `Sum`, `Mean` → `Mean`
    /// (VAL-44). `None` and `OnlyFirstReplica` have none: the first means "do not aggregate",
    /// the second is applied by broadcasting replica 0's value.
    ///
    /// ```
    /// use distribute_values::{ReduceOp, VariableAggregation};
    ///
    /// assert_eq!(ReduceOp::from_aggregation(VariableAggregation::Sum)?, ReduceOp::Sum);
    /// assert!(ReduceOp::from_aggregation(VariableAggregation::OnlyFirstReplica).is_err());
    /// # Ok::<(), distribute_values::ValuesError>(())
    /// ```
    pub fn from_aggregation(aggregation: VariableAggregation) -> Result<ReduceOp, ValuesError> {
        match aggregation {
            VariableAggregation::Sum => Ok(ReduceOp::Sum),
            VariableAggregation::Mean => Ok(ReduceOp::Mean),
            VariableAggregation::None | VariableAggregation::OnlyFirstReplica => {
                Err(ValuesError::NotReducible { aggregation })
            }
        }
    }

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

impl FromStr for ReduceOp {
    type Err = ValuesError;

    /// Parses TensorFlow's names (`"SUM"`, `"MEAN"`, …), in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max]
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ValuesError::UnknownName {
                what: "reduce op",
                input: s.to_owned(),
                expected: "SUM, MEAN, MIN, MAX",
            })
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

impl FromStr for VariableAggregation {
    type Err = ValuesError;

    /// Parses TensorFlow's names (`"NONE"`, `"SUM"`, `"MEAN"`, `"ONLY_FIRST_REPLICA"`), in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        use VariableAggregation::*;
        [None, Sum, Mean, OnlyFirstReplica]
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ValuesError::UnknownName {
                what: "variable aggregation",
                input: s.to_owned(),
                expected: "NONE, SUM, MEAN, ONLY_FIRST_REPLICA",
            })
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
    /// Validates a distributed variable's policy as TensorFlow's variable creators do and says
    /// which kind of variable to build and whether it is trainable.
    ///
    /// `trainable = None` defaults to `true`, except for `OnRead` variables (metrics, batch-norm
    /// statistics) which default to `false`; an explicit value is kept. `None` synchronization is
    /// an error.
    pub fn resolve(
        self,
        name: &str,
        trainable: Option<bool>,
    ) -> Result<(SyncKind, bool), ValuesError> {
        match self {
            VariableSynchronization::None => Err(ValuesError::SynchronizationNone {
                name: name.to_owned(),
            }),
            VariableSynchronization::Auto | VariableSynchronization::OnWrite => {
                Ok((SyncKind::OnWrite, trainable.unwrap_or(true)))
            }
            // Current TF lets an explicitly trainable on-read variable be (SM-32); only the
            // 2019 releases refused it.
            VariableSynchronization::OnRead => Ok((SyncKind::OnRead, trainable.unwrap_or(false))),
        }
    }

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

impl FromStr for VariableSynchronization {
    type Err = ValuesError;

    /// Parses TensorFlow's names (`"AUTO"`, `"NONE"`, `"ON_WRITE"`, `"ON_READ"`), in any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        use VariableSynchronization::*;
        [Auto, None, OnWrite, OnRead]
            .into_iter()
            .find(|v| v.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| ValuesError::UnknownName {
                what: "variable synchronization",
                input: s.to_owned(),
                expected: "AUTO, NONE, ON_WRITE, ON_READ",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_display_and_parse() {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max] {
            assert_eq!(op.to_string().parse::<ReduceOp>().unwrap(), op);
        }
        use VariableAggregation as A;
        for a in [A::None, A::Sum, A::Mean, A::OnlyFirstReplica] {
            assert_eq!(a.to_string().parse::<A>().unwrap(), a);
        }
        use VariableSynchronization as S;
        for s in [S::Auto, S::None, S::OnWrite, S::OnRead] {
            assert_eq!(s.to_string().parse::<S>().unwrap(), s);
        }
    }

    #[test]
    fn unknown_names_are_rejected_with_the_accepted_list() {
        let err = "PROD".parse::<ReduceOp>().unwrap_err();
        assert!(err.to_string().contains("SUM, MEAN, MIN, MAX"), "{err}");
        assert!("first".parse::<VariableAggregation>().is_err());
        assert!("".parse::<VariableSynchronization>().is_err());
    }
}
