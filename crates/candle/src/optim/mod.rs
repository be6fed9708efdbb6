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

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::Optimizer;

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
    fn set_state(&mut self, values: &[Tensor]) -> Result<()>;
}

/// One slot of the state of a piece of a variable ([`ShardOptimizer::piece_state`]): named as
/// [`OptimizerState::state`] names the variable's slot.
#[derive(Debug, Clone)]
pub struct PieceSlot {
    /// The slot's name (`"exp_avg"`).
    pub slot: &'static str,
    /// Its value: 1-dimensional, of the piece's length, for a slot with one value per element
    /// (a moment); 0-dimensional for a value of the whole variable (Sgd's `step`).
    pub value: Tensor,
}

impl PieceSlot {
    /// Slot `slot` holding `value`.
    pub fn new(slot: &'static str, value: Tensor) -> Self {
        PieceSlot { slot, value }
    }
}

/// An optimizer whose update of each element of a variable depends only on that element's
/// value, gradient and state, and on values of the whole optimizer (its rate, its step count):
/// so ZeRO ([`Sharding`](crate::Sharding)) can give each replica a contiguous piece of the
/// flattened variables and run the update there, to the bits the whole variable would get.
/// [`AdamW`], [`Sgd`], [`AnyOptimizer`] and candle-nn's `SGD` are; an optimizer that takes a
/// norm of a whole variable (LAMB, LARS) is not, and must not implement it.
///
/// A sharded model builds its optimizers over no variables (`build_optimizer(vec![])`): the
/// pieces' state lives beside them, and the optimizer's own [`OptimizerState`] holds only the
/// values of the whole optimizer (AdamW's `step`).
pub trait ShardOptimizer: Optimizer + OptimizerState {
    /// The state of a new piece of `len` elements of a float variable of `dtype` on `device`:
    /// the slots [`state`](OptimizerState::state) lists for one variable, in that order and
    /// under those names, each 1-dimensional of `len` elements or 0-dimensional (see
    /// [`PieceSlot::value`]).
    fn piece_state(&self, len: usize, dtype: DType, device: &Device) -> Result<Vec<PieceSlot>>;

    /// Starts an update: the values of the whole optimizer move on (AdamW's step count), as
    /// [`step`](Optimizer::step) moves them, before [`update_piece`](Self::update_piece) runs
    /// on each piece that has a gradient.
    fn begin_update(&mut self) -> Result<()>;

    /// The update of one piece: its next value from its `value`, its reduced `grad` (both
    /// 1-dimensional) and its `state` ([`piece_state`](Self::piece_state)'s values, replaced
    /// with their next ones), by the same operations as [`step`](Optimizer::step)'s.
    fn update_piece(&self, value: &Tensor, grad: &Tensor, state: &mut [Tensor]) -> Result<Tensor>;
}

/// candle-nn's SGD keeps no state: a checkpoint holds nothing of it.
impl OptimizerState for candle_nn::SGD {
    fn state(&self) -> Vec<StateTensor> {
        Vec::new()
    }

    fn set_state(&mut self, _values: &[Tensor]) -> Result<()> {
        Ok(())
    }
}
