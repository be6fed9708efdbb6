//! Optimizers whose state is data: [`OptimizerState`] (what a checkpoint saves and restores of
//! an optimizer), implemented for candle-nn's stateless `SGD` and for this crate's [`AdamW`] and
//! [`Sgd`] (momentum, Nesterov), whose moments and step count candle-nn's own optimizers keep
//! private.

mod adamw;
mod any;
mod sgd;

pub use adamw::AdamW;
pub use any::{AnyOptimizer, OptimizerConfig};
pub use sgd::{ParamsSgd, Sgd};

use candle_core::Tensor;

/// One tensor of an optimizer's state: a slot of one of its variables (AdamW's `exp_avg` of
/// variable 3), or a value of the whole optimizer (its step count).
#[derive(Debug, Clone)]
pub struct StateTensor {
    /// The variable's position in the list the optimizer was built from (`Optimizer::new`'s
    /// `vars`; [`DataParallel`](crate::DataParallel) passes them in name order and stores the
    /// slot under the variable's name); `None` for a value of the whole optimizer.
    pub var: Option<usize>,
    /// The slot's name, unique per variable (`"exp_avg"`, `"momentum_buffer"`, `"step"`).
    pub slot: &'static str,
    /// Its value (a copy or a cheap clone; the optimizer keeps its own).
    pub value: Tensor,
}

/// An optimizer whose state can be read and set as tensors, so a checkpoint holds it and a
/// resumed run continues on the bits of an uninterrupted one.
///
/// [`state`](Self::state) lists the same slots, with the same dtypes and shapes, for the whole
/// life of the optimizer (a slot not yet used holds zeros), in a fixed order;
/// [`set_state`](Self::set_state) takes values for exactly those slots in that order, already
/// checked by the caller against [`state`](Self::state)'s dtypes and shapes. Implement it for an
/// optimizer of your own to checkpoint it with a [`DataParallel`](crate::DataParallel) model.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say what its state is, so a checkpoint cannot hold it",
    note = "candle-nn's `AdamW` keeps its moments and step count private: use \
            `distribute_candle::AdamW` (the same update, bit for bit), or implement \
            `distribute_candle::OptimizerState` for your optimizer"
)]
pub trait OptimizerState {
    /// The optimizer's state, slot by slot, in a fixed order.
    fn state(&self) -> Vec<StateTensor>;

    /// Sets every slot from `values`, in [`state`](Self::state)'s order, dtypes and shapes.
    fn set_state(&mut self, values: &[Tensor]) -> candle_core::Result<()>;
}

/// candle-nn's SGD keeps no state: a checkpoint holds nothing of it.
impl OptimizerState for candle_nn::SGD {
    fn state(&self) -> Vec<StateTensor> {
        Vec::new()
    }

    fn set_state(&mut self, _values: &[Tensor]) -> candle_core::Result<()> {
        Ok(())
    }
}
