//! [`StepBuilder`]: what a compiled step writes against, the StableHLO builder plus TF's
//! replica-context operations (`all_reduce`, `broadcast_to`) traced into the program.

use std::ops::{Deref, DerefMut};

use distribute_pjrt::ElementType;
use distribute_pjrt::stablehlo::{AllReduceOp, Builder, ReplicaGroups, Value};
use distribute_values::ReduceOp;

use crate::TpuError;

/// What a compiled step sees: the program builder (through `Deref`) plus the replica-level
/// operations of TF's replica context, traced into the program.
pub struct StepBuilder<'b> {
    pub(crate) builder: &'b mut Builder,
    pub(crate) num_replicas: usize,
}

impl Deref for StepBuilder<'_> {
    type Target = Builder;
    fn deref(&self) -> &Builder {
        self.builder
    }
}

impl DerefMut for StepBuilder<'_> {
    fn deref_mut(&mut self) -> &mut Builder {
        self.builder
    }
}

impl StepBuilder<'_> {
    /// The number of replicas running the step together.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.num_replicas
    }

    /// TF's replica-context `all_reduce` inside the replicated computation (TPU-19): `Sum` is a
    /// cross-replica sum; `Mean` scales by 1/num_replicas, then sums. Other ops are refused, as
    /// on TPU. On one replica both are the value itself, and the program gets no collective:
    /// XLA keeps an all-reduce over a group of one, which costs a step its own copy of the
    /// operands (of every all-reduce the combiner merged into it).
    pub fn all_reduce(&mut self, op: ReduceOp, value: &Value) -> Result<Value, TpuError> {
        let groups = ReplicaGroups::all(self.num_replicas as u32);
        match op {
            ReduceOp::Sum if self.num_replicas == 1 => Ok(value.clone()),
            ReduceOp::Mean if self.num_replicas == 1 => {
                // Refused for the types several replicas refuse, so a step that cannot run on
                // two does not pass on one.
                self.scale(value, 1.0)?;
                Ok(value.clone())
            }
            ReduceOp::Sum => Ok(self.builder.all_reduce(value, AllReduceOp::Sum, &groups)?),
            ReduceOp::Mean => {
                let scale = self.scale(value, 1.0 / self.num_replicas as f64)?;
                let scaled = self.builder.multiply(value, &scale)?;
                Ok(self
                    .builder
                    .all_reduce(&scaled, AllReduceOp::Sum, &groups)?)
            }
            other => Err(TpuError::Unimplemented(format!(
                "all_reduce with {other} inside a TPU step: only Sum and Mean are supported"
            ))),
        }
    }

    /// TF's `broadcast_to` inside the replicated computation: every replica gets replica 0's
    /// `value` (replica 0 keeps its value, the others contribute zeros to a cross-replica sum).
    /// Outside a step there is nothing to broadcast: see [`TpuStrategy::broadcast_to`](crate::TpuStrategy::broadcast_to).
    pub fn broadcast_from_first(&mut self, value: &Value) -> Result<Value, TpuError> {
        if self.num_replicas == 1 {
            return Ok(value.clone());
        }
        let groups = ReplicaGroups::all(self.num_replicas as u32);
        let id = self.builder.replica_id();
        let zero_id = self.builder.scalar(0u32);
        let is_first =
            self.builder
                .compare(distribute_pjrt::stablehlo::Comparison::Eq, &id, &zero_id)?;
        let dims = value.ty().dims.clone();
        let is_first = self.builder.broadcast_in_dim(&is_first, &dims, &[])?;
        let zeros = match value.ty().element {
            ElementType::F32 => self.builder.splat(0.0f32, &dims),
            ElementType::F64 => self.builder.splat(0.0f64, &dims),
            ElementType::S32 => self.builder.splat(0i32, &dims),
            ElementType::S64 => self.builder.splat(0i64, &dims),
            other => {
                return Err(TpuError::Unimplemented(format!(
                    "broadcasting {other} values inside a TPU step"
                )));
            }
        };
        let mine = self.builder.select(&is_first, value, &zeros)?;
        Ok(self.builder.all_reduce(&mine, AllReduceOp::Sum, &groups)?)
    }

    /// A constant `factor` with `value`'s type (floating-point types only).
    fn scale(&mut self, value: &Value, factor: f64) -> Result<Value, TpuError> {
        let dims = value.ty().dims.clone();
        match value.ty().element {
            ElementType::F32 => Ok(self.builder.splat(factor as f32, &dims)),
            ElementType::F64 => Ok(self.builder.splat(factor, &dims)),
            other => Err(TpuError::Type(format!(
                "a Mean all-reduce needs f32 or f64 values, got {other}"
            ))),
        }
    }
}
