//! SGD with momentum and Nesterov momentum, PyTorch's `torch.optim.SGD`, with its state as data.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::Optimizer;

use super::adamw::{owned_like, step_count, step_tensor};
use super::{OptimizerState, PieceSlot, ShardOptimizer, StateTensor};

/// The hyperparameters of [`Sgd`], PyTorch's `torch.optim.SGD`'s (without `maximize`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamsSgd {
    /// The learning rate (default 0.01); not negative.
    pub lr: f64,
    /// The momentum factor (default 0: plain SGD, with no state); not negative.
    pub momentum: f64,
    /// The dampening of the gradient in the momentum buffer (default 0).
    pub dampening: f64,
    /// The L2 penalty added to the gradient, `weight_decay * theta` (default 0); not negative.
    pub weight_decay: f64,
    /// Nesterov momentum (default off); needs a momentum above 0 and no dampening.
    pub nesterov: bool,
}

impl Default for ParamsSgd {
    fn default() -> Self {
        Self {
            lr: 0.01,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

impl ParamsSgd {
    /// PyTorch's checks: no negative learning rate, momentum or weight decay, and Nesterov
    /// momentum only with a momentum and without dampening.
    fn check(&self) -> Result<()> {
        for (name, value) in [
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("weight_decay", self.weight_decay),
        ] {
            if value.is_nan() || value < 0.0 {
                return Err(candle_core::Error::Msg(format!(
                    "Sgd: invalid {name} {value}: it must not be negative"
                )));
            }
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(candle_core::Error::Msg(format!(
                "Sgd: nesterov momentum requires momentum > 0 and dampening = 0, got momentum \
                 {} and dampening {}",
                self.momentum, self.dampening
            )));
        }
        Ok(())
    }
}

/// The momentum state of one variable.
#[derive(Debug)]
struct Momentum {
    /// PyTorch's `momentum_buffer`: zeros until the variable's first gradient. A plain tensor no
    /// one writes into (each step replaces it), so a clone handed out by `state` stays a snapshot.
    buffer: Tensor,
    /// The number of steps in which the variable had a gradient: 0 is PyTorch's "no buffer yet"
    /// (the next gradient becomes the buffer as it is).
    steps: usize,
    /// `steps` as `state` hands it out: a 0-dimensional `I64` tensor on the CPU.
    steps_tensor: Tensor,
}

/// One variable [`Sgd`] updates.
#[derive(Debug)]
struct VarSgd {
    /// Its position in the list the optimizer was built from.
    index: usize,
    var: Var,
    /// `None` without momentum.
    momentum: Option<Momentum>,
}

/// Stochastic gradient descent with momentum, dampening, weight decay and Nesterov momentum,
/// following PyTorch's `torch.optim.SGD` step for step, with its momentum buffers as data:
/// [`OptimizerState`] reads and sets them, so a checkpoint holds them.
///
/// For each variable with a gradient `g` in a step (others are left alone), with `theta` its
/// value:
///
/// ```text
/// g = g + weight_decay * theta                       (if weight_decay != 0)
/// if momentum != 0:
///     buf = g                                        (the first step the variable has a gradient)
///     buf = momentum * buf + (1 - dampening) * g     (later ones)
///     g = nesterov ? g + momentum * buf : buf
/// theta = theta - lr * g
/// ```
///
/// With a momentum of 0 it is candle-nn's [`candle_nn::SGD`] bit for bit (with a weight decay
/// of 0 too), with no state. Like candle-nn's optimizers it leaves variables of a non-float dtype
/// alone.
///
/// Its state ([`state`](OptimizerState::state)), with a momentum (none without one), in this
/// order: for each float variable, in the order of the list it was built from,
/// `momentum_buffer` (of the variable's dtype, shape and device; zeros until its first gradient)
/// then `step` (a 0-dimensional `I64` tensor on the CPU: the number of steps in which the
/// variable had a gradient, so that a restored optimizer knows whether a buffer is still to be
/// started, as PyTorch's buffer of `None` says), whose [`StateTensor::var`] is the variable's
/// position in that list (non-float variables count: they hold a position but no slot).
#[derive(Debug)]
pub struct Sgd {
    vars: Vec<VarSgd>,
    params: ParamsSgd,
}

impl Optimizer for Sgd {
    type Config = ParamsSgd;

    /// Fails on the hyperparameters PyTorch refuses (see [`ParamsSgd`]), such as Nesterov
    /// momentum with dampening.
    fn new(vars: Vec<Var>, params: ParamsSgd) -> Result<Self> {
        params.check()?;
        let vars = vars
            .into_iter()
            .enumerate()
            .filter(|(_, var)| var.dtype().is_float())
            .map(|(index, var)| {
                let momentum = if params.momentum != 0.0 {
                    Some(Momentum {
                        buffer: Tensor::zeros(var.shape(), var.dtype(), var.device())?,
                        steps: 0,
                        steps_tensor: step_tensor(0)?,
                    })
                } else {
                    None
                };
                Ok(VarSgd {
                    index,
                    var,
                    momentum,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { vars, params })
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        for var in self.vars.iter_mut() {
            let Some(grad) = grads.get(&var.var) else {
                continue;
            };
            let momentum = var.momentum.as_ref().map(|m| (&m.buffer, m.steps));
            let (next, buf) = update(&self.params, var.var.as_tensor(), grad, momentum)?;
            var.var.set(&next)?;
            if let (Some(buf), Some(state)) = (buf, &var.momentum) {
                let steps = state.steps + 1;
                var.momentum = Some(Momentum {
                    buffer: buf,
                    steps,
                    steps_tensor: step_tensor(steps)?,
                });
            }
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr
    }
}

/// PyTorch's SGD update of one variable (or any piece of one: every operation is elementwise)
/// with gradient `grad`, given its momentum buffer and the steps it had a gradient in (`None`
/// without a momentum): its next value, and its next buffer with a momentum.
fn update(
    params: &ParamsSgd,
    theta: &Tensor,
    grad: &Tensor,
    momentum_state: Option<(&Tensor, usize)>,
) -> Result<(Tensor, Option<Tensor>)> {
    let ParamsSgd {
        lr,
        momentum,
        dampening,
        weight_decay,
        nesterov,
    } = *params;
    let mut g = if weight_decay != 0.0 {
        (grad + (theta * weight_decay)?)?
    } else {
        grad.clone()
    };
    let mut next_buffer = None;
    if let Some((buffer, steps)) = momentum_state {
        // The first buffer is a copy: the gradient's storage may be reused later.
        let buf = if steps == 0 {
            g.copy()?
        } else {
            ((buffer * momentum)? + (&g * (1.0 - dampening))?)?
        }
        .detach();
        g = if nesterov {
            (&g + (&buf * momentum)?)?
        } else {
            buf.clone()
        };
        next_buffer = Some(buf);
    }
    // candle-nn's `SGD::step`: `theta - g * lr`.
    Ok((theta.sub(&(g * lr)?)?, next_buffer))
}

/// ZeRO: SGD on pieces of variables, the same update as [`Optimizer::step`]'s.
impl ShardOptimizer for Sgd {
    /// With a momentum, `momentum_buffer` (zeros of the piece's length) and the variable's
    /// `step` (0-dimensional); nothing without one.
    fn piece_state(&self, len: usize, dtype: DType, device: &Device) -> Result<Vec<PieceSlot>> {
        if self.params.momentum == 0.0 {
            return Ok(Vec::new());
        }
        Ok(vec![
            PieceSlot::new("momentum_buffer", Tensor::zeros(len, dtype, device)?),
            PieceSlot::new("step", step_tensor(0)?),
        ])
    }

    fn begin_update(&mut self) -> Result<()> {
        Ok(())
    }

    fn update_piece(&self, value: &Tensor, grad: &Tensor, state: &mut [Tensor]) -> Result<Tensor> {
        let momentum = match state {
            [] if self.params.momentum == 0.0 => None,
            [buffer, steps] if self.params.momentum != 0.0 => {
                Some((buffer.clone(), step_count(steps, "Sgd", "step")?))
            }
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "Sgd::update_piece: {} state tensors do not fit a momentum of {}",
                    state.len(),
                    self.params.momentum
                )));
            }
        };
        let (next, buffer) = update(
            &self.params,
            value,
            grad,
            momentum.as_ref().map(|(b, s)| (b, *s)),
        )?;
        if let (Some(buffer), Some((_, steps))) = (buffer, momentum) {
            state[0] = buffer;
            state[1] = step_tensor(steps + 1)?;
        }
        Ok(next)
    }
}

/// ZeRO: candle-nn's plain SGD on pieces of variables (no state).
impl ShardOptimizer for candle_nn::SGD {
    fn piece_state(&self, _len: usize, _dtype: DType, _device: &Device) -> Result<Vec<PieceSlot>> {
        Ok(Vec::new())
    }

    fn begin_update(&mut self) -> Result<()> {
        Ok(())
    }

    /// candle-nn's `SGD::step`: `theta - grad * lr`.
    fn update_piece(&self, value: &Tensor, grad: &Tensor, _state: &mut [Tensor]) -> Result<Tensor> {
        value.sub(&(grad * self.learning_rate())?)
    }
}

impl Sgd {
    /// Its hyperparameters.
    pub fn params(&self) -> &ParamsSgd {
        &self.params
    }

    /// Replaces its hyperparameters (the momentum buffers stay). Fails, changing nothing, on
    /// those [`new`](Optimizer::new) refuses, and when the momentum goes from 0 to another value
    /// or back, which would change what its state holds.
    pub fn set_params(&mut self, params: ParamsSgd) -> Result<()> {
        params.check()?;
        if (params.momentum != 0.0) != (self.params.momentum != 0.0) {
            return Err(candle_core::Error::Msg(format!(
                "Sgd::set_params: the momentum cannot change from {} to {} (an optimizer with a \
                 momentum keeps buffers, one without keeps none): build a new one",
                self.params.momentum, params.momentum
            )));
        }
        self.params = params;
        Ok(())
    }
}

impl OptimizerState for Sgd {
    /// `momentum_buffer` and `step` of each float variable, nothing without a momentum (see
    /// [`Sgd`]). The values are cheap clones of tensors the optimizer never writes into (a step
    /// replaces them), so they stay a snapshot of this moment, whatever steps come later.
    fn state(&self) -> Vec<StateTensor> {
        let mut state = Vec::new();
        for var in &self.vars {
            if let Some(momentum) = &var.momentum {
                state.push(StateTensor {
                    var: Some(var.index),
                    slot: "momentum_buffer",
                    value: momentum.buffer.clone(),
                });
                state.push(StateTensor {
                    var: Some(var.index),
                    slot: "step",
                    value: momentum.steps_tensor.clone(),
                });
            }
        }
        state
    }

    /// Sets the momentum buffers (copied, onto each variable's device) and the step counts (any
    /// 0-dimensional tensor holding a non-negative integer). Fails, changing nothing, when
    /// `values` does not have one tensor per slot of [`state`](OptimizerState::state), or a
    /// buffer differs from its variable in shape or dtype.
    fn set_state(&mut self, values: &[Tensor]) -> Result<()> {
        let with_momentum = self.params.momentum != 0.0;
        let expected = if with_momentum {
            2 * self.vars.len()
        } else {
            0
        };
        if values.len() != expected {
            return Err(candle_core::Error::Msg(format!(
                "Sgd::set_state: expected {expected} tensors ({}), got {}",
                if with_momentum {
                    format!("momentum_buffer and step of {} variables", self.vars.len())
                } else {
                    "no state without a momentum".to_string()
                },
                values.len()
            )));
        }
        if !with_momentum {
            return Ok(());
        }
        let states = self
            .vars
            .iter()
            .zip(values.chunks_exact(2))
            .map(|(var, pair)| {
                let buffer = owned_like(&pair[0], &var.var, "Sgd", "momentum_buffer", var.index)?;
                let steps = step_count(&pair[1], "Sgd", "step")?;
                Ok(Momentum {
                    buffer,
                    steps,
                    steps_tensor: step_tensor(steps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        for (var, state) in self.vars.iter_mut().zip(states) {
            var.momentum = Some(state);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;
    use crate::optim::adamw::tests::{bits, clone_vars, grads, make_vars};

    fn all_bits(vars: &[Var]) -> Vec<Vec<u64>> {
        vars.iter()
            .filter(|v| v.dtype().is_float())
            .map(|v| bits(v.as_tensor()))
            .collect()
    }

    /// PyTorch's documented update, in f64, for one variable starting at `theta` with the
    /// gradients `grads` (`None`: no gradient in that step).
    fn reference(p: ParamsSgd, theta: &[f32], grads: &[Option<Vec<f32>>]) -> Vec<f64> {
        let mut theta: Vec<f64> = theta.iter().map(|&x| f64::from(x)).collect();
        let mut buf: Option<Vec<f64>> = None;
        for g in grads {
            let Some(g) = g else { continue };
            let mut g: Vec<f64> = g
                .iter()
                .zip(&theta)
                .map(|(&g, &t)| f64::from(g) + p.weight_decay * t)
                .collect();
            if p.momentum != 0.0 {
                let b: Vec<f64> = match &buf {
                    None => g.clone(),
                    Some(b) => b
                        .iter()
                        .zip(&g)
                        .map(|(b, g)| p.momentum * b + (1.0 - p.dampening) * g)
                        .collect(),
                };
                g = if p.nesterov {
                    g.iter().zip(&b).map(|(g, b)| g + p.momentum * b).collect()
                } else {
                    b.clone()
                };
                buf = Some(b);
            }
            for (t, g) in theta.iter_mut().zip(&g) {
                *t -= p.lr * g;
            }
        }
        theta
    }

    #[test]
    fn sgd_momentum_and_nesterov_follow_pytorch() {
        let cpu = &Device::Cpu;
        let theta0 = [0.5f32, -1.0, 2.0];
        let g = [
            vec![0.1f32, -0.2, 0.3],
            vec![-0.4, 0.5, 0.25],
            vec![0.3, 0.1, -0.6],
        ];
        // Variable `a` has a gradient in every step, `b` none in the first (its buffer starts
        // in the second).
        let grads_a: Vec<_> = g.iter().cloned().map(Some).collect();
        let grads_b = vec![None, Some(g[0].clone()), Some(g[1].clone())];
        let cases = [
            ParamsSgd {
                lr: 0.1,
                momentum: 0.9,
                dampening: 0.1,
                weight_decay: 0.01,
                nesterov: false,
            },
            ParamsSgd {
                lr: 0.1,
                momentum: 0.9,
                dampening: 0.0,
                weight_decay: 0.01,
                nesterov: true,
            },
            ParamsSgd {
                lr: 0.05,
                momentum: 0.5,
                ..ParamsSgd::default()
            },
        ];
        for p in cases {
            let a = Var::new(&theta0, cpu).unwrap();
            let b = Var::new(&theta0, cpu).unwrap();
            let mut opt = Sgd::new(vec![a.clone(), b.clone()], p).unwrap();
            for step in 0..3 {
                let mut store = GradStore::default();
                for (var, grads) in [(&a, &grads_a), (&b, &grads_b)] {
                    if let Some(g) = &grads[step] {
                        store.insert(var.as_tensor(), Tensor::new(g.as_slice(), cpu).unwrap());
                    }
                }
                opt.step(&store).unwrap();
                for (var, grads) in [(&a, &grads_a), (&b, &grads_b)] {
                    let expected = reference(p, &theta0, &grads[..=step]);
                    let got = var.to_vec1::<f32>().unwrap();
                    for (got, expected) in got.iter().zip(&expected) {
                        assert!(
                            (f64::from(*got) - expected).abs() < 1e-6,
                            "{p:?} step {step}: {got} vs {expected}"
                        );
                    }
                }
            }
            let steps: Vec<i64> = opt
                .state()
                .iter()
                .filter(|s| s.slot == "step")
                .map(|s| s.value.to_scalar::<i64>().unwrap())
                .collect();
            assert_eq!(steps, [3, 2]);
        }
    }

    #[test]
    fn sgd_without_momentum_matches_candle_nn_bit_for_bit() {
        let ours_vars = make_vars();
        let theirs_vars = clone_vars(&ours_vars);
        let params = ParamsSgd {
            lr: 0.05,
            ..ParamsSgd::default()
        };
        let mut ours = Sgd::new(ours_vars.clone(), params).unwrap();
        let mut theirs = candle_nn::SGD::new(theirs_vars.clone(), 0.05).unwrap();
        for step in 0..5 {
            ours.step(&grads(&ours_vars, step)).unwrap();
            theirs.step(&grads(&theirs_vars, step)).unwrap();
            assert_eq!(all_bits(&ours_vars), all_bits(&theirs_vars), "step {step}");
        }
        assert!(ours.state().is_empty());
        ours.set_state(&[]).unwrap();
        let err = ours
            .set_state(&[Tensor::new(1i64, &Device::Cpu).unwrap()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected 0 tensors"), "{err}");
    }

    #[test]
    fn sgd_state_round_trip_is_bit_identical() {
        let params = ParamsSgd {
            lr: 0.05,
            momentum: 0.9,
            dampening: 0.25,
            weight_decay: 0.01,
            nesterov: false,
        };
        // After one step variable 3 has had no gradient (its buffer is still to start), after
        // three it has.
        for saved_at in [1, 3] {
            let vars = make_vars();
            let mut opt = Sgd::new(vars.clone(), params).unwrap();
            for step in 0..saved_at {
                opt.step(&grads(&vars, step)).unwrap();
            }
            let saved_vars = clone_vars(&vars);
            let saved_state: Vec<Tensor> = opt.state().into_iter().map(|s| s.value).collect();
            for step in saved_at..5 {
                opt.step(&grads(&vars, step)).unwrap();
            }

            let resumed_vars = clone_vars(&saved_vars);
            let mut resumed = Sgd::new(resumed_vars.clone(), params).unwrap();
            resumed.set_state(&saved_state).unwrap();
            for step in saved_at..5 {
                resumed.step(&grads(&resumed_vars, step)).unwrap();
            }
            assert_eq!(
                all_bits(&resumed_vars),
                all_bits(&vars),
                "saved at {saved_at}"
            );
            let state_bits = |o: &Sgd| -> Vec<Vec<u64>> {
                o.state()
                    .iter()
                    .map(|s| match s.slot {
                        "step" => vec![s.value.to_scalar::<i64>().unwrap() as u64],
                        _ => bits(&s.value),
                    })
                    .collect()
            };
            assert_eq!(state_bits(&resumed), state_bits(&opt));
        }
    }

    #[test]
    fn sgd_state_slots_and_snapshot() {
        let params = ParamsSgd {
            lr: 0.05,
            momentum: 0.9,
            nesterov: true,
            ..ParamsSgd::default()
        };
        let vars = make_vars();
        let mut opt = Sgd::new(vars.clone(), params).unwrap();
        let slots: Vec<_> = opt.state().iter().map(|s| (s.var, s.slot)).collect();
        assert_eq!(
            slots,
            [
                (Some(0), "momentum_buffer"),
                (Some(0), "step"),
                (Some(1), "momentum_buffer"),
                (Some(1), "step"),
                (Some(3), "momentum_buffer"),
                (Some(3), "step"),
                (Some(4), "momentum_buffer"),
                (Some(4), "step"),
            ]
        );
        for s in opt.state() {
            let var = &vars[s.var.unwrap()];
            if s.slot == "step" {
                assert_eq!((s.value.dtype(), s.value.rank()), (DType::I64, 0));
            } else {
                assert_eq!(
                    (s.value.dtype(), s.value.shape()),
                    (var.dtype(), var.shape())
                );
                assert!(bits(&s.value).iter().all(|&b| b == 0));
            }
        }
        opt.step(&grads(&vars, 1)).unwrap();
        let snapshot = opt.state();
        let before: Vec<_> = snapshot.iter().map(|s| s.value.copy().unwrap()).collect();
        for step in 2..4 {
            opt.step(&grads(&vars, step)).unwrap();
        }
        for ((s, b), n) in snapshot.iter().zip(&before).zip(opt.state()) {
            if s.slot == "step" {
                assert_eq!(s.value.to_scalar::<i64>().unwrap(), 1);
                assert!(n.value.to_scalar::<i64>().unwrap() > 1);
            } else {
                assert_eq!(bits(&s.value), bits(b));
                assert_ne!(bits(&s.value), bits(&n.value));
            }
        }
        let err = opt.set_state(&before[1..]).unwrap_err().to_string();
        assert!(err.contains("expected 8 tensors"), "{err}");
    }

    #[test]
    fn sgd_refuses_what_pytorch_refuses() {
        let var = Var::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        let nesterov_damped = ParamsSgd {
            momentum: 0.9,
            dampening: 0.1,
            nesterov: true,
            ..ParamsSgd::default()
        };
        let err = Sgd::new(vec![var.clone()], nesterov_damped)
            .unwrap_err()
            .to_string();
        for word in ["nesterov", "momentum", "dampening", "0.9", "0.1"] {
            assert!(err.contains(word), "{word} in {err}");
        }
        let nesterov_without_momentum = ParamsSgd {
            nesterov: true,
            ..ParamsSgd::default()
        };
        let err = Sgd::new(vec![var.clone()], nesterov_without_momentum)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nesterov") && err.contains("momentum"),
            "{err}"
        );
        let negative_lr = ParamsSgd {
            lr: -1.0,
            ..ParamsSgd::default()
        };
        let err = Sgd::new(vec![var.clone()], negative_lr)
            .unwrap_err()
            .to_string();
        assert!(err.contains("lr"), "{err}");

        let mut opt = Sgd::new(vec![var], ParamsSgd::default()).unwrap();
        assert!(opt.set_params(nesterov_damped).is_err());
        let with_momentum = ParamsSgd {
            momentum: 0.9,
            ..ParamsSgd::default()
        };
        let err = opt.set_params(with_momentum).unwrap_err().to_string();
        assert!(err.contains("momentum cannot change"), "{err}");
        assert_eq!(opt.params(), &ParamsSgd::default());
        opt.set_params(ParamsSgd {
            lr: 0.5,
            ..ParamsSgd::default()
        })
        .unwrap();
        assert_eq!(opt.learning_rate(), 0.5);
    }
}
