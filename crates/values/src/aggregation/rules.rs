//! TensorFlow's rules for the policies of `aggregation`: their names parsed (`FromStr`, in any
//! case), the reduce op of a variable aggregation, and which synchronization a distributed
//! variable may have. Each refusal is a [`ValuesError`], which names the policies: the rules
//! live apart from the policies so that the error can name them without a cycle.

use std::str::FromStr;

use super::{ReduceOp, SyncKind, VariableAggregation, VariableSynchronization};
use crate::ValuesError;

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
