//! Checkpoint values: a distributed variable saves its *logical* value and restores by spreading
//! it back over its components, so a checkpoint written with N replicas restores with M.
//!
//! [`SavedValue`] serialises exactly like the plain value (serde `transparent`): a checkpoint of
//! a distributed variable and one of an ordinary variable are interchangeable (VAL-38, VAL-39).

use serde::{Deserialize, Serialize};

use crate::{
    DistributedVariable, MirroredVariable, SyncOnReadVariable, UpdateOp, ValuesError, VariableValue,
};

/// The logical value of a variable as stored in a checkpoint.
///
/// ```
/// use std::sync::Arc;
/// use distribute_values::{ReplicaDeviceMap, SavedValue, SyncOnReadVariable, VariableAggregation};
///
/// let two = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"])?);
/// let v = SyncOnReadVariable::new("total", two, 0.0, VariableAggregation::Sum)?;
/// v.component(0)?.assign(3.0);
/// v.component(1)?.assign(4.0);
/// let json = serde_json::to_string(&v.save()?).unwrap();
/// assert_eq!(json, "7.0"); // the sum, as a plain value
///
/// let three = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1", "/cpu:2"])?);
/// let w = SyncOnReadVariable::new("total", three, 0.0, VariableAggregation::Sum)?;
/// w.restore(&serde_json::from_str::<SavedValue<f64>>(&json).unwrap())?;
/// assert_eq!(w.read_cross_replica()?, 7.0);
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SavedValue<T> {
    value: T,
}

impl<T> SavedValue<T> {
    /// A saved plain value (what an ordinary variable writes).
    pub fn new(value: T) -> Self {
        SavedValue { value }
    }

    /// The value, as restored into an ordinary variable.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, taken out.
    pub fn into_value(self) -> T {
        self.value
    }
}

impl<T: VariableValue> MirroredVariable<T> {
    /// The value to checkpoint: the primary component (VAL-38).
    pub fn save(&self) -> SavedValue<T> {
        SavedValue::new(self.primary())
    }

    /// Restores every component to the saved value (VAL-38).
    pub fn restore(&self, saved: &SavedValue<T>) -> Result<(), ValuesError> {
        self.assign_cross_replica(UpdateOp::Assign, &saved.value)
    }
}

impl<T: VariableValue> SyncOnReadVariable<T> {
    /// The value to checkpoint: the cross-replica read, i.e. the sum, the mean or replica 0's
    /// value (VAL-39, VAL-40). Aggregation `None` has no logical value and is an error.
    pub fn save(&self) -> Result<SavedValue<T>, ValuesError> {
        self.read_cross_replica().map(SavedValue::new)
    }

    /// Spreads the saved value over the components so that a cross-replica read gives it back:
    /// `Sum` divides it by the replica count, the others copy it (VAL-39, VAL-40).
    pub fn restore(&self, saved: &SavedValue<T>) -> Result<(), ValuesError> {
        self.assign_cross_replica(UpdateOp::Assign, &saved.value)
    }
}

impl<T: VariableValue> DistributedVariable<T> {
    /// The value to checkpoint, whichever the kind of variable.
    pub fn save(&self) -> Result<SavedValue<T>, ValuesError> {
        match self {
            DistributedVariable::Mirrored(v) => Ok(v.save()),
            DistributedVariable::SyncOnRead(v) => v.save(),
        }
    }

    /// Restores a saved value, whichever the kind of variable.
    pub fn restore(&self, saved: &SavedValue<T>) -> Result<(), ValuesError> {
        match self {
            DistributedVariable::Mirrored(v) => v.restore(saved),
            DistributedVariable::SyncOnRead(v) => v.restore(saved),
        }
    }
}
