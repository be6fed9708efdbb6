//! Several steps in one call: the [`MultiStepContext`] that
//! [`Strategy::run_steps_on_iterator`](crate::Strategy::run_steps_on_iterator) hands each step
//! (TF 2018's `run_steps_on_iterator`). It keeps the outputs the last step set, with the reduce op
//! each is to be reduced with once the loop ends, so a training loop can report its final loss
//! without one reduction per step.

use std::collections::BTreeMap;

use distribute_tensor::Tensor;
use distribute_values::{Leaf, ReduceOp};

/// One output of the last step, and how it is combined across replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct LastStepOutput {
    value: Leaf<Tensor>,
    reduce_op: Option<ReduceOp>,
}

impl LastStepOutput {
    /// The value: while the steps run, what the last step set (usually per replica); after
    /// `run_steps_on_iterator` returns, reduced to one host tensor ([`Leaf::Same`]) when there
    /// is a reduce op, else as it was set.
    pub fn value(&self) -> &Leaf<Tensor> {
        &self.value
    }

    /// How the value is reduced across replicas at the end; `None` keeps it per replica.
    pub fn reduce_op(&self) -> Option<ReduceOp> {
        self.reduce_op
    }
}

/// What the steps of one `run_steps_on_iterator` call share: the outputs of the last step, by
/// name, with their reduce ops, and how many steps ran.
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_strategy::MultiStepContext;
/// use distribute_values::{Leaf, ReduceOp};
///
/// let mut ctx = MultiStepContext::new();
/// ctx.set_last_step_output("loss", Leaf::Same(Tensor::scalar("/cpu:0", 0.5f32)), Some(ReduceOp::Mean));
/// assert_eq!(ctx.last_step_output("loss").unwrap().reduce_op(), Some(ReduceOp::Mean));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MultiStepContext {
    outputs: BTreeMap<String, LastStepOutput>,
    steps_run: usize,
}

impl MultiStepContext {
    /// An empty context: no outputs, no steps run.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `output` under `name`, replacing what an earlier step set, to be reduced with
    /// `reduce_op` (or kept per replica with `None`) when the loop ends.
    pub fn set_last_step_output(
        &mut self,
        name: impl Into<String>,
        output: Leaf<Tensor>,
        reduce_op: Option<ReduceOp>,
    ) {
        self.outputs.insert(
            name.into(),
            LastStepOutput {
                value: output,
                reduce_op,
            },
        );
    }

    /// The output recorded under `name`.
    pub fn last_step_output(&self, name: &str) -> Option<&LastStepOutput> {
        self.outputs.get(name)
    }

    /// Every recorded output, by name.
    pub fn last_step_outputs(&self) -> &BTreeMap<String, LastStepOutput> {
        &self.outputs
    }

    /// How many steps have run; fewer than asked for when the input ran out.
    pub fn steps_run(&self) -> usize {
        self.steps_run
    }

    pub(crate) fn step_done(&mut self) {
        self.steps_run += 1;
    }

    /// The outputs, for the strategy to replace each with its reduction.
    pub(crate) fn outputs_mut(
        &mut self,
    ) -> impl Iterator<Item = (&mut Leaf<Tensor>, Option<ReduceOp>)> {
        self.outputs
            .values_mut()
            .map(|out| (&mut out.value, out.reduce_op))
    }
}
