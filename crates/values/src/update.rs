//! [`UpdateOp`], the three updates TensorFlow variables support, and their names. How one
//! applies to a value is the element's arithmetic (`element`), which can fail with a
//! [`ValuesError`](crate::ValuesError); the error names the update, so this file names no error.

use std::fmt;

/// An update of a variable's value: TF's `assign`, `assign_add` and `assign_sub`.
///
/// ```
/// use distribute_values::UpdateOp;
///
/// assert_eq!(UpdateOp::AssignSub.apply(&5, &2)?, 3);
/// assert_eq!(UpdateOp::AssignSub.to_string(), "assign_sub");
/// # Ok::<(), distribute_values::ValuesError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpdateOp {
    /// Replace the value.
    Assign,
    /// Add to the value.
    AssignAdd,
    /// Subtract from the value.
    AssignSub,
}

impl fmt::Display for UpdateOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpdateOp::Assign => "assign",
            UpdateOp::AssignAdd => "assign_add",
            UpdateOp::AssignSub => "assign_sub",
        })
    }
}
