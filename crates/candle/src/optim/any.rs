//! [`AnyOptimizer`]: SGD or AdamW chosen at run time (a program's `--optimizer` flag), as the one
//! optimizer type a [`DataParallel`](crate::DataParallel) model holds.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use super::{AdamW, OptimizerState, ParamsSgd, PieceSlot, Sgd, ShardOptimizer, StateTensor};

/// Which optimizer [`AnyOptimizer`] is, with its parameters.
#[derive(Debug, Clone)]
pub enum OptimizerConfig {
    /// [`Sgd`] (PyTorch's SGD).
    Sgd(ParamsSgd),
    /// [`AdamW`] (candle-nn's update, PyTorch's defaults).
    AdamW(ParamsAdamW),
}

impl OptimizerConfig {
    /// The learning rate it starts with.
    pub fn lr(&self) -> f64 {
        match self {
            OptimizerConfig::Sgd(p) => p.lr,
            OptimizerConfig::AdamW(p) => p.lr,
        }
    }
}

/// SGD or AdamW, chosen when the program runs, with their state as data: delegates every call
/// to the optimizer its [`OptimizerConfig`] chose.
///
/// ```
/// use candle_nn::{Optimizer, ParamsAdamW};
/// use distribute_candle::{AnyOptimizer, OptimizerConfig, ParamsSgd};
///
/// let adamw = std::env::args().any(|a| a == "--adamw");
/// let config = match adamw {
///     true => OptimizerConfig::AdamW(ParamsAdamW::default()),
///     false => OptimizerConfig::Sgd(ParamsSgd { lr: 0.05, ..ParamsSgd::default() }),
/// };
/// let optimizer = AnyOptimizer::new(Vec::new(), config)?;
/// assert_eq!(optimizer.learning_rate(), if adamw { 0.001 } else { 0.05 });
/// # Ok::<(), candle_core::Error>(())
/// ```
#[derive(Debug)]
pub enum AnyOptimizer {
    /// [`OptimizerConfig::Sgd`]'s.
    Sgd(Sgd),
    /// [`OptimizerConfig::AdamW`]'s.
    AdamW(AdamW),
}

impl Optimizer for AnyOptimizer {
    type Config = OptimizerConfig;

    fn new(vars: Vec<Var>, config: OptimizerConfig) -> Result<Self> {
        Ok(match config {
            OptimizerConfig::Sgd(params) => AnyOptimizer::Sgd(Sgd::new(vars, params)?),
            OptimizerConfig::AdamW(params) => AnyOptimizer::AdamW(AdamW::new(vars, params)?),
        })
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        match self {
            AnyOptimizer::Sgd(o) => o.step(grads),
            AnyOptimizer::AdamW(o) => o.step(grads),
        }
    }

    fn learning_rate(&self) -> f64 {
        match self {
            AnyOptimizer::Sgd(o) => o.learning_rate(),
            AnyOptimizer::AdamW(o) => o.learning_rate(),
        }
    }

    fn set_learning_rate(&mut self, lr: f64) {
        match self {
            AnyOptimizer::Sgd(o) => o.set_learning_rate(lr),
            AnyOptimizer::AdamW(o) => o.set_learning_rate(lr),
        }
    }
}

impl OptimizerState for AnyOptimizer {
    fn state(&self) -> Vec<StateTensor> {
        match self {
            AnyOptimizer::Sgd(o) => o.state(),
            AnyOptimizer::AdamW(o) => o.state(),
        }
    }

    fn set_state(&mut self, values: &[Tensor]) -> Result<()> {
        match self {
            AnyOptimizer::Sgd(o) => o.set_state(values),
            AnyOptimizer::AdamW(o) => o.set_state(values),
        }
    }
}

impl ShardOptimizer for AnyOptimizer {
    fn piece_state(&self, len: usize, dtype: DType, device: &Device) -> Result<Vec<PieceSlot>> {
        match self {
            AnyOptimizer::Sgd(o) => o.piece_state(len, dtype, device),
            AnyOptimizer::AdamW(o) => o.piece_state(len, dtype, device),
        }
    }

    fn begin_update(&mut self) -> Result<()> {
        match self {
            AnyOptimizer::Sgd(o) => o.begin_update(),
            AnyOptimizer::AdamW(o) => o.begin_update(),
        }
    }

    fn update_piece(&self, value: &Tensor, grad: &Tensor, state: &mut [Tensor]) -> Result<Tensor> {
        match self {
            AnyOptimizer::Sgd(o) => o.update_piece(value, grad, state),
            AnyOptimizer::AdamW(o) => o.update_piece(value, grad, state),
        }
    }
}
