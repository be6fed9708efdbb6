//! AdamW with its state as data: candle-nn's update, bit for bit, with PyTorch's slot names.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{Optimizer, ParamsAdamW};

use super::{OptimizerState, PieceSlot, ShardOptimizer, StateTensor};

/// One variable AdamW updates, with its moments.
#[derive(Debug)]
struct VarAdamW {
    /// Its position in the list the optimizer was built from.
    index: usize,
    var: Var,
    /// The first moment (PyTorch's `exp_avg`). A plain tensor that no one writes into: each step
    /// replaces it with a new one, so a clone handed out by `state` stays a snapshot.
    exp_avg: Tensor,
    /// The second moment (PyTorch's `exp_avg_sq`), replaced like `exp_avg`.
    exp_avg_sq: Tensor,
}

/// AdamW (Loshchilov & Hutter, decoupled weight decay), the update of candle-nn's
/// [`candle_nn::AdamW`] bit for bit (the same operations in the same order, on the same
/// [`ParamsAdamW`], whose default is PyTorch's: lr 0.001, betas 0.9 and 0.999, eps 1e-8, weight
/// decay 0.01), whose moments and step count are data: [`OptimizerState`] reads and sets them,
/// so a checkpoint holds them and a resumed run goes on as an uninterrupted one would.
///
/// Like candle-nn's, it leaves variables of a non-float dtype alone, and a variable without a
/// gradient in a step keeps its value and moments (no weight decay either), while the step count,
/// shared by all variables, goes up with every [`step`](Optimizer::step).
///
/// Its state ([`state`](OptimizerState::state)), in this order: for each float variable, in the
/// order of the list it was built from, `exp_avg` then `exp_avg_sq` (the first and second
/// moments, of the variable's dtype, shape and device; zeros before the variable's first
/// gradient), whose [`StateTensor::var`] is the variable's position in that list (non-float
/// variables count: they hold a position but no slot); then `step` (`var: None`), the number of
/// steps taken, a 0-dimensional `I64` tensor on the CPU.
#[derive(Debug)]
pub struct AdamW {
    vars: Vec<VarAdamW>,
    step_t: usize,
    /// `step_t` as `state` hands it out: a 0-dimensional `I64` tensor on the CPU.
    step_tensor: Tensor,
    params: ParamsAdamW,
}

impl Optimizer for AdamW {
    type Config = ParamsAdamW;

    fn new(vars: Vec<Var>, params: ParamsAdamW) -> Result<Self> {
        let vars = vars
            .into_iter()
            .enumerate()
            .filter(|(_, var)| var.dtype().is_float())
            .map(|(index, var)| {
                let exp_avg = Tensor::zeros(var.shape(), var.dtype(), var.device())?;
                let exp_avg_sq = Tensor::zeros(var.shape(), var.dtype(), var.device())?;
                Ok(VarAdamW {
                    index,
                    var,
                    exp_avg,
                    exp_avg_sq,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            vars,
            step_t: 0,
            step_tensor: step_tensor(0)?,
            params,
        })
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        // candle-nn 0.11.1's `AdamW::step`, operation for operation: only where the moments live
        // differs (new tensors each step instead of `Var`s written in place).
        self.step_t += 1;
        for var in self.vars.iter_mut() {
            let theta = &var.var;
            let m = &var.exp_avg;
            let v = &var.exp_avg_sq;
            if let Some(g) = grads.get(theta) {
                let (next_theta, next_m, next_v) =
                    update(&self.params, self.step_t, theta.as_tensor(), g, m, v)?;
                theta.set(&next_theta)?;
                var.exp_avg = next_m;
                var.exp_avg_sq = next_v;
            }
        }
        self.step_tensor = step_tensor(self.step_t)?;
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr
    }
}

impl AdamW {
    /// An optimizer over `vars` with [`ParamsAdamW`]'s defaults but the learning rate
    /// `learning_rate` (candle-nn's `AdamW::new_lr`).
    pub fn new_lr(vars: Vec<Var>, learning_rate: f64) -> Result<Self> {
        let params = ParamsAdamW {
            lr: learning_rate,
            ..ParamsAdamW::default()
        };
        Self::new(vars, params)
    }

    /// Its hyperparameters.
    pub fn params(&self) -> &ParamsAdamW {
        &self.params
    }

    /// Replaces its hyperparameters (the moments and the step count stay).
    pub fn set_params(&mut self, params: ParamsAdamW) {
        self.params = params;
    }
}

impl OptimizerState for AdamW {
    /// `exp_avg` and `exp_avg_sq` of each float variable, then `step` (see [`AdamW`]). The values
    /// are cheap clones of tensors the optimizer never writes into (a step replaces them), so
    /// they stay a snapshot of this moment, whatever steps come later.
    fn state(&self) -> Vec<StateTensor> {
        let mut state = Vec::with_capacity(2 * self.vars.len() + 1);
        for var in &self.vars {
            state.push(StateTensor {
                var: Some(var.index),
                slot: "exp_avg",
                value: var.exp_avg.clone(),
            });
            state.push(StateTensor {
                var: Some(var.index),
                slot: "exp_avg_sq",
                value: var.exp_avg_sq.clone(),
            });
        }
        state.push(StateTensor {
            var: None,
            slot: "step",
            value: self.step_tensor.clone(),
        });
        state
    }

    /// Sets the moments (copied, onto each variable's device) and the step count (any
    /// 0-dimensional tensor holding a non-negative integer). Fails, changing nothing, when
    /// `values` does not have one tensor per slot of [`state`](OptimizerState::state), or one
    /// differs from its slot in shape or dtype.
    fn set_state(&mut self, values: &[Tensor]) -> Result<()> {
        let expected = 2 * self.vars.len() + 1;
        if values.len() != expected {
            return Err(candle_core::Error::Msg(format!(
                "AdamW::set_state: expected {expected} tensors (exp_avg and exp_avg_sq of {} \
                 variables, then step), got {}",
                self.vars.len(),
                values.len()
            )));
        }
        let moments = self
            .vars
            .iter()
            .zip(values.chunks_exact(2))
            .map(|(var, pair)| {
                let m = owned_like(&pair[0], &var.var, "AdamW", "exp_avg", var.index)?;
                let v = owned_like(&pair[1], &var.var, "AdamW", "exp_avg_sq", var.index)?;
                Ok((m, v))
            })
            .collect::<Result<Vec<_>>>()?;
        let step_t = step_count(&values[expected - 1], "AdamW", "step")?;
        let step_tensor = step_tensor(step_t)?;
        for (var, (m, v)) in self.vars.iter_mut().zip(moments) {
            var.exp_avg = m;
            var.exp_avg_sq = v;
        }
        self.step_t = step_t;
        self.step_tensor = step_tensor;
        Ok(())
    }
}

/// candle-nn 0.11.1's `AdamW` update of one variable (or any piece of one: every operation is
/// elementwise) at step `step_t` (1-based): its next value and moments.
fn update(
    params: &ParamsAdamW,
    step_t: usize,
    theta: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let lr = params.lr;
    let lr_lambda = lr * params.weight_decay;
    let (beta1, beta2) = (params.beta1, params.beta2);
    let scale_m = 1f64 / (1f64 - beta1.powi(step_t as i32));
    let scale_v = 1f64 / (1f64 - beta2.powi(step_t as i32));
    let next_m = ((m * beta1)? + (g * (1.0 - beta1))?)?;
    let next_v = ((v * beta2)? + (g.sqr()? * (1.0 - beta2))?)?;
    let m_hat = (&next_m * scale_m)?;
    let v_hat = (&next_v * scale_v)?;
    let next_theta = (theta * (1f64 - lr_lambda))?;
    let adjusted_grad = (m_hat / (v_hat.sqrt()? + params.eps)?)?;
    let next_theta = (next_theta - (adjusted_grad * lr)?)?;
    Ok((next_theta, next_m.detach(), next_v.detach()))
}

/// ZeRO: AdamW on pieces of variables, the same update as [`Optimizer::step`]'s.
impl ShardOptimizer for AdamW {
    /// `exp_avg` and `exp_avg_sq`, zeros of the piece's length.
    fn piece_state(&self, len: usize, dtype: DType, device: &Device) -> Result<Vec<PieceSlot>> {
        Ok(vec![
            PieceSlot::new("exp_avg", Tensor::zeros(len, dtype, device)?),
            PieceSlot::new("exp_avg_sq", Tensor::zeros(len, dtype, device)?),
        ])
    }

    fn begin_update(&mut self) -> Result<()> {
        self.step_t += 1;
        self.step_tensor = step_tensor(self.step_t)?;
        Ok(())
    }

    fn update_piece(&self, value: &Tensor, grad: &Tensor, state: &mut [Tensor]) -> Result<Tensor> {
        let [m, v] = state else {
            return Err(candle_core::Error::Msg(format!(
                "AdamW::update_piece: expected exp_avg and exp_avg_sq, got {} tensors",
                state.len()
            )));
        };
        let (next, next_m, next_v) = update(&self.params, self.step_t, value, grad, m, v)?;
        *m = next_m;
        *v = next_v;
        Ok(next)
    }
}

/// A step count as a state slot holds it: a 0-dimensional `I64` tensor on the CPU.
pub(super) fn step_tensor(step: usize) -> Result<Tensor> {
    let step = i64::try_from(step)
        .map_err(|_| candle_core::Error::Msg(format!("step count {step} overflows i64")))?;
    Tensor::new(step, &Device::Cpu)
}

/// The step count in `value` (a 0-dimensional tensor of any dtype holding a non-negative integer
/// that fits an `i32`, as the bias corrections' `powi` takes), for the error messages of
/// `optimizer`'s slot `slot`.
pub(super) fn step_count(value: &Tensor, optimizer: &str, slot: &str) -> Result<usize> {
    let step = if value.dtype() == DType::I64 {
        value.to_scalar::<i64>()
    } else {
        let step = value.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        if step.fract() != 0.0 || !step.is_finite() {
            return Err(candle_core::Error::Msg(format!(
                "{optimizer}::set_state: {slot} must hold an integer, got {step}"
            )));
        }
        Ok(step as i64)
    }
    .map_err(|e| {
        candle_core::Error::Msg(format!(
            "{optimizer}::set_state: {slot} must be a 0-dimensional tensor: {e}"
        ))
    })?;
    if !(0..=i64::from(i32::MAX)).contains(&step) {
        return Err(candle_core::Error::Msg(format!(
            "{optimizer}::set_state: {slot} must be in 0..={}, got {step}",
            i32::MAX
        )));
    }
    Ok(step as usize)
}

/// A copy of `value`, the state slot `slot` of variable `index` of `optimizer`, as the optimizer
/// keeps it: contiguous, detached, on `var`'s device, and sharing storage with nothing the
/// caller holds (so writing into the caller's tensor later leaves the optimizer alone). Fails
/// when its shape or dtype is not `var`'s.
pub(super) fn owned_like(
    value: &Tensor,
    var: &Var,
    optimizer: &str,
    slot: &str,
    index: usize,
) -> Result<Tensor> {
    if value.shape() != var.shape() || value.dtype() != var.dtype() {
        return Err(candle_core::Error::Msg(format!(
            "{optimizer}::set_state: {slot} of variable {index} must be {:?} {:?} like the \
             variable, got {:?} {:?}",
            var.dtype(),
            var.shape(),
            value.dtype(),
            value.shape()
        )));
    }
    let owned = if !value.device().same_device(var.device()) {
        value.to_device(var.device())?.contiguous()?
    } else if value.is_contiguous() {
        value.copy()?
    } else {
        value.contiguous()?
    };
    Ok(owned.detach())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) (a 64-bit LCG), different for each `seed`.
    pub(crate) fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The bits of every element of `t` (f32 or f64).
    pub(crate) fn bits(t: &Tensor) -> Vec<u64> {
        let t = t.flatten_all().unwrap();
        match t.dtype() {
            DType::F32 => t
                .to_vec1::<f32>()
                .unwrap()
                .into_iter()
                .map(|x| u64::from(x.to_bits()))
                .collect(),
            DType::F64 => t
                .to_vec1::<f64>()
                .unwrap()
                .into_iter()
                .map(f64::to_bits)
                .collect(),
            dtype => panic!("bits of {dtype:?}"),
        }
    }

    /// Fresh variables: three f32 of different shapes, a u32 one (which optimizers skip) and an
    /// f64 one.
    pub(crate) fn make_vars() -> Vec<Var> {
        let cpu = &Device::Cpu;
        let f32_var = |seed, shape: &[usize]| {
            let n = shape.iter().product();
            Var::from_tensor(&Tensor::from_vec(noise(seed, n), shape, cpu).unwrap()).unwrap()
        };
        let f64_values: Vec<f64> = noise(9, 5).into_iter().map(f64::from).collect();
        vec![
            f32_var(1, &[4]),
            f32_var(2, &[2, 3]),
            Var::from_tensor(&Tensor::new(&[1u32, 2, 3], cpu).unwrap()).unwrap(),
            f32_var(3, &[3, 1, 2]),
            Var::from_tensor(&Tensor::from_vec(f64_values, 5, cpu).unwrap()).unwrap(),
        ]
    }

    /// Copies of `vars`' current values, as new variables.
    pub(crate) fn clone_vars(vars: &[Var]) -> Vec<Var> {
        vars.iter()
            .map(|v| Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap())
            .collect()
    }

    /// Gradients for step `step` of the float variables in `vars`; variable 1 gets none on
    /// step 2, variable 3 none on step 0.
    pub(crate) fn grads(vars: &[Var], step: u64) -> GradStore {
        let mut store = GradStore::default();
        for (i, var) in vars.iter().enumerate() {
            if !var.dtype().is_float() || (i == 1 && step == 2) || (i == 3 && step == 0) {
                continue;
            }
            let values = noise(100 * step + i as u64, var.elem_count());
            let g = Tensor::from_vec(values, var.shape(), var.device())
                .unwrap()
                .to_dtype(var.dtype())
                .unwrap();
            store.insert(var.as_tensor(), g);
        }
        store
    }

    fn params() -> ParamsAdamW {
        ParamsAdamW {
            lr: 0.01,
            weight_decay: 0.1,
            ..ParamsAdamW::default()
        }
    }

    fn all_bits(vars: &[Var]) -> Vec<Vec<u64>> {
        vars.iter()
            .filter(|v| v.dtype().is_float())
            .map(|v| bits(v.as_tensor()))
            .collect()
    }

    #[test]
    fn adamw_matches_candle_nn_bit_for_bit() {
        let ours_vars = make_vars();
        let theirs_vars = clone_vars(&ours_vars);
        let mut ours = AdamW::new(ours_vars.clone(), params()).unwrap();
        let mut theirs = candle_nn::AdamW::new(theirs_vars.clone(), params()).unwrap();
        for step in 0..6 {
            ours.step(&grads(&ours_vars, step)).unwrap();
            theirs.step(&grads(&theirs_vars, step)).unwrap();
            assert_eq!(all_bits(&ours_vars), all_bits(&theirs_vars), "step {step}");
        }
        // The defaults too, and a learning rate set between steps.
        let mut ours = AdamW::new_lr(ours_vars.clone(), 0.003).unwrap();
        let mut theirs = candle_nn::AdamW::new_lr(theirs_vars.clone(), 0.003).unwrap();
        for step in 0..3 {
            ours.step(&grads(&ours_vars, step)).unwrap();
            theirs.step(&grads(&theirs_vars, step)).unwrap();
            ours.set_learning_rate(0.002);
            theirs.set_learning_rate(0.002);
            assert_eq!(all_bits(&ours_vars), all_bits(&theirs_vars), "step {step}");
        }
        // The u32 variable is left alone.
        assert_eq!(ours_vars[2].to_vec1::<u32>().unwrap(), [1, 2, 3]);
    }

    #[test]
    fn adamw_state_slots() {
        let vars = make_vars();
        let opt = AdamW::new(vars.clone(), params()).unwrap();
        let state = opt.state();
        let slots: Vec<_> = state.iter().map(|s| (s.var, s.slot)).collect();
        assert_eq!(
            slots,
            [
                (Some(0), "exp_avg"),
                (Some(0), "exp_avg_sq"),
                (Some(1), "exp_avg"),
                (Some(1), "exp_avg_sq"),
                (Some(3), "exp_avg"),
                (Some(3), "exp_avg_sq"),
                (Some(4), "exp_avg"),
                (Some(4), "exp_avg_sq"),
                (None, "step"),
            ]
        );
        for s in &state[..8] {
            let var = &vars[s.var.unwrap()];
            assert_eq!(s.value.dtype(), var.dtype());
            assert_eq!(s.value.shape(), var.shape());
        }
        let step = &state[8].value;
        assert_eq!(step.dtype(), DType::I64);
        assert_eq!(step.rank(), 0);
        assert_eq!(step.to_scalar::<i64>().unwrap(), 0);
    }

    #[test]
    fn adamw_state_round_trip_is_bit_identical() {
        let vars = make_vars();
        let mut opt = AdamW::new(vars.clone(), params()).unwrap();
        for step in 0..3 {
            opt.step(&grads(&vars, step)).unwrap();
        }
        let saved_vars = clone_vars(&vars);
        let saved_state: Vec<Tensor> = opt.state().into_iter().map(|s| s.value).collect();
        assert_eq!(saved_state.last().unwrap().to_scalar::<i64>().unwrap(), 3);
        for step in 3..5 {
            opt.step(&grads(&vars, step)).unwrap();
        }

        let resumed_vars = clone_vars(&saved_vars);
        let mut resumed = AdamW::new(resumed_vars.clone(), params()).unwrap();
        resumed.set_state(&saved_state).unwrap();
        for step in 3..5 {
            resumed.step(&grads(&resumed_vars, step)).unwrap();
        }
        assert_eq!(all_bits(&resumed_vars), all_bits(&vars));
        let state_bits = |o: &AdamW| -> Vec<Vec<u64>> {
            let state = o.state();
            let (moments, step) = state.split_at(state.len() - 1);
            assert_eq!(step[0].value.to_scalar::<i64>().unwrap(), 5);
            moments.iter().map(|s| bits(&s.value)).collect()
        };
        assert_eq!(state_bits(&resumed), state_bits(&opt));

        // A step count in F64 (holding an integer) is taken too.
        let mut f64_step = saved_state.clone();
        *f64_step.last_mut().unwrap() = Tensor::new(3f64, &Device::Cpu).unwrap();
        resumed.set_state(&f64_step).unwrap();
        assert_eq!(resumed.state().last().unwrap().value.dtype(), DType::I64);
    }

    #[test]
    fn adamw_snapshot_is_not_changed_by_later_steps() {
        let vars = make_vars();
        let mut opt = AdamW::new(vars.clone(), params()).unwrap();
        opt.step(&grads(&vars, 0)).unwrap();
        let snapshot = opt.state();
        let before: Vec<_> = snapshot.iter().map(|s| s.value.copy().unwrap()).collect();
        for step in 1..3 {
            opt.step(&grads(&vars, step)).unwrap();
        }
        let now = opt.state();
        for ((s, b), n) in snapshot.iter().zip(&before).zip(&now) {
            if s.slot == "step" {
                assert_eq!(s.value.to_scalar::<i64>().unwrap(), 1);
                assert_eq!(n.value.to_scalar::<i64>().unwrap(), 3);
            } else {
                assert_eq!(bits(&s.value), bits(b), "{:?} {}", s.var, s.slot);
                assert_ne!(bits(&s.value), bits(&n.value), "{:?} {}", s.var, s.slot);
            }
        }
        // Nor does writing into a tensor given to `set_state` change the optimizer.
        let values: Vec<Tensor> = snapshot.iter().map(|s| s.value.clone()).collect();
        let held = Var::from_tensor(&values[0]).unwrap();
        let values: Vec<Tensor> = std::iter::once(held.as_tensor().clone())
            .chain(values[1..].iter().cloned())
            .collect();
        opt.set_state(&values).unwrap();
        held.set(&held.as_tensor().ones_like().unwrap()).unwrap();
        assert_eq!(bits(&opt.state()[0].value), bits(&before[0]));
    }

    #[test]
    fn adamw_set_state_checks_its_input() {
        let vars = make_vars();
        let mut opt = AdamW::new(vars.clone(), params()).unwrap();
        opt.step(&grads(&vars, 0)).unwrap();
        let values: Vec<Tensor> = opt.state().into_iter().map(|s| s.value).collect();
        let err = opt.set_state(&values[1..]).unwrap_err().to_string();
        assert!(err.contains("expected 9 tensors"), "{err}");
        let mut wrong = values.clone();
        wrong[2] = Tensor::zeros(7, DType::F32, &Device::Cpu).unwrap();
        let err = opt.set_state(&wrong).unwrap_err().to_string();
        assert!(err.contains("exp_avg of variable 1"), "{err}");
        let mut wrong = values.clone();
        *wrong.last_mut().unwrap() = Tensor::new(-1i64, &Device::Cpu).unwrap();
        let err = opt.set_state(&wrong).unwrap_err().to_string();
        assert!(err.contains("step must be in"), "{err}");
        // Nothing changed.
        let now: Vec<_> = opt.state().iter().map(|s| s.value.clone()).collect();
        assert_eq!(now.last().unwrap().to_scalar::<i64>().unwrap(), 1);
        for (a, b) in now[..8].iter().zip(&values) {
            assert_eq!(bits(a), bits(b));
        }
    }
}
