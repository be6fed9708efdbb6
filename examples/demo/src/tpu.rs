//! Training with `TpuStrategy`: the whole step (forward, backward, the gradient all-reduce and
//! the momentum update) as one program written with `StepBuilder` and compiled once, the
//! weights as `TpuVariable` device buffers, and batches fed through the strategy's
//! `distribute_dataset` and `device_batches`.
//!
//! The step sums over rows and replicas in f64, so the weights come out the same bits on any
//! number of replicas ([`StepArithmetic::F64Sums`], the default); `--tpu-arithmetic f32` runs
//! the program `jax.jit` emits for the same model instead ([`StepArithmetic::F32`]): faster,
//! but its last bits depend on how the batch was cut across replicas.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use distribute::pjrt::ElementType;
use distribute::pjrt::stablehlo::{DotDims, Reduction, UnaryOp, Value};
use distribute::prelude::*;
use distribute::tensor::{DType, Tensor};
use distribute::tpu::{
    DeviceValue, StepBuilder, StepInput, TpuConfig, TpuError, TpuStrategy, TpuVariable,
};

use crate::Config;
use crate::data::WineData;
use crate::mirrored::training_batches;
use crate::model::{Params, evaluate, max_weight_difference};
use crate::progress::progress_bar;

/// Mean time per step of a TPU run, over all steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TpuStepTimes {
    /// Waiting for the next per-replica batch: the input pipeline, padding to the compiled
    /// shape, and the copy into device buffers.
    pub input: Duration,
    /// Launching the compiled step on every replica and waiting for its loss. Forward,
    /// backward, the gradient all-reduce and the momentum update all run inside the one
    /// program, so they cannot be timed apart from the host.
    pub step: Duration,
}

impl TpuStepTimes {
    /// All of a step's time.
    pub fn total(&self) -> Duration {
        self.input + self.step
    }
}

/// What a TPU training run ends with.
#[derive(Debug, Clone)]
pub struct TpuTrained {
    /// The final parameters (replica 0's device copy).
    pub params: Params,
    /// The largest difference between replica 0's device copy of the parameters and another
    /// replica's: 0 when the in-program all-reduce gave every replica the same update.
    pub copy_difference: f32,
    /// The mean squared error of each step's global batch, before its update.
    pub losses: Vec<f32>,
    /// `(step, validation MSE)` before training, every `eval_every` steps and after the last.
    pub validation: Vec<(usize, f32)>,
    /// Time per step, by phase.
    pub times: TpuStepTimes,
    /// Tracing and compiling the step (and one run of it, to wait for), before the timed steps.
    pub compile: Duration,
    /// Steps per second of the training loop (compilation and validation excluded).
    pub steps_per_s: f64,
    /// The PJRT platform the replicas run on (`cpu` for the pinned plugin).
    pub platform: String,
    /// The replicas' device names.
    pub devices: Vec<String>,
}

/// The model's variables in the order the compiled step takes and returns them: the four
/// parameters, then their four momentum slots.
const VARIABLES: usize = 8;

/// A `TpuStrategy` with one replica per device of the PJRT plugin (`cargo xtask fetch-pjrt`
/// installs the pinned CPU plugin; `PJRT_PLUGIN` names another).
fn tpu_strategy(replicas: usize) -> Result<TpuStrategy> {
    // The plugin's own error already says how to install it; the context says who needed it.
    TpuStrategy::new(TpuConfig::cpu(replicas)).with_context(|| {
        format!("--strategy tpu: could not start TpuStrategy on {replicas} PJRT CPU devices")
    })
}

pub use crate::config::StepArithmetic;

/// One training step of the MLP as a replicated XLA program: the arithmetic of
/// [`ParamSlices::gradient_sums`](crate::model::ParamSlices::gradient_sums) and the mirrored `merge_call`, written with symbolic values, in
/// `arithmetic`.
///
/// Takes `[w1, b1, w2, b2, v_w1, v_b1, v_w2, v_b2, x, y, mask]` and returns the 8 new variables
/// followed by the global batch's squared-error sum and row count (f64 scalars, the same on
/// every replica).
fn tpu_step(
    b: &mut StepBuilder<'_>,
    args: &[Value],
    learning_rate: f32,
    momentum: f32,
    arithmetic: StepArithmetic,
) -> Result<Vec<Value>, TpuError> {
    let [w1, b1, w2, b2, v_w1, v_b1, v_w2, v_b2, x, y, mask] = args else {
        return Err(TpuError::InvalidArgument(format!(
            "the MLP step takes {VARIABLES} variables then x, y and the mask; got {} inputs",
            args.len()
        )));
    };
    // Sums over rows and across replicas, and the arrays they read, in this type.
    let wide = match arithmetic {
        StepArithmetic::F32 => ElementType::F32,
        StepArithmetic::F64Sums => ElementType::F64,
    };
    let rows = x.ty().dims[0];
    let units = w1.ty().dims[1];
    let over_rows = DotDims {
        lhs_contracting: vec![0],
        rhs_contracting: vec![0],
        ..DotDims::default()
    };

    // Forward and backward per row with f32 values, as the mirrored replicas compute them.
    let z = matmul_in(b, x, w1, wide)?;
    let bias = b.broadcast_in_dim(b1, &[rows, units], &[1])?;
    let z = b.add(&z, &bias)?;
    let hidden = tanh_in(b, &z, wide);
    let predicted = matmul_in(b, &hidden, w2, wide)?;
    let bias = b.broadcast_in_dim(b2, &[rows], &[0])?;
    let predicted = b.add(&predicted, &bias)?;
    let error = b.subtract(&predicted, y)?;
    // Padding rows (a global batch that does not divide by the replicas) get zero error, so
    // they add nothing to the loss or the gradients; real rows are multiplied by exactly 1.
    let error = b.multiply(&error, mask)?;
    let two = b.splat(2.0f32, &[rows]);
    let d_out = b.multiply(&error, &two)?;
    let d_out_wide = b.broadcast_in_dim(&d_out, &[rows, units], &[0])?;
    let w2_wide = b.broadcast_in_dim(w2, &[rows, units], &[1])?;
    let d_hidden = b.multiply(&d_out_wide, &w2_wide)?;
    let squared = b.multiply(&hidden, &hidden)?;
    let one = b.splat(1.0f32, &[rows, units]);
    let d_tanh = b.subtract(&one, &squared)?;
    let d_hidden = b.multiply(&d_hidden, &d_tanh)?;

    // Sums over rows, then across replicas, in `wide`.
    let [x, hidden, d_hidden, d_out, error, mask] =
        [x, &hidden, &d_hidden, &d_out, &error, mask].map(|v| convert_to(b, v, wide));
    let zero = match wide {
        ElementType::F64 => b.scalar(0.0f64),
        _ => b.scalar(0.0f32),
    };
    // As d_hiddenᵀ·x, transposed: the same sums in another orientation, whose f64 code XLA
    // (jaxlib 0.10.2, timed alone) ran in half the time of xᵀ·d_hidden's, 0.6 against 1.2 ms
    // with 1024 rows and 256 units.
    let g_w1 = b.dot_general(&d_hidden, &x, &over_rows)?;
    let g_w1 = b.transpose(&g_w1, &[1, 0])?;
    let g_b1 = b.reduce(&d_hidden, &zero, &[0], Reduction::Sum)?;
    let g_w2 = b.dot_general(&hidden, &d_out, &over_rows)?;
    let g_b2 = b.reduce(&d_out, &zero, &[0], Reduction::Sum)?;
    let g_b2 = b.reshape(&g_b2, &[1])?;
    let squared_error = b.dot_general(&error, &error, &over_rows)?;
    let real_rows = b.reduce(&mask, &zero, &[0], Reduction::Sum)?;
    let squared_error = b.all_reduce(ReduceOp::Sum, &squared_error)?;
    let total_rows = b.all_reduce(ReduceOp::Sum, &real_rows)?;

    // SGD with momentum on the mean gradient of the global batch: v ← μ·v + g, w ← w − lr·v,
    // in the mirrored update's order of operations.
    let mut velocities = Vec::with_capacity(4);
    for (sum, velocity) in [g_w1, g_b1, g_w2, g_b2]
        .iter()
        .zip([v_w1, v_b1, v_w2, v_b2])
    {
        let sum = b.all_reduce(ReduceOp::Sum, sum)?;
        let dims = sum.ty().dims.clone();
        let rows = b.broadcast_in_dim(&total_rows, &dims, &[])?;
        let mean = b.divide(&sum, &rows)?;
        let gradient = convert_to(b, &mean, ElementType::F32);
        let mu = b.splat(momentum, &dims);
        let decayed = b.multiply(velocity, &mu)?;
        velocities.push(b.add(&decayed, &gradient)?);
    }
    let mut outputs = Vec::with_capacity(VARIABLES + 2);
    for (weight, velocity) in [w1, b1, w2, b2].into_iter().zip(&velocities) {
        let lr = b.splat(learning_rate, &velocity.ty().dims);
        let step = b.multiply(velocity, &lr)?;
        outputs.push(b.subtract(weight, &step)?);
    }
    outputs.extend(velocities);
    outputs.push(convert_to(b, &squared_error, ElementType::F64));
    outputs.push(convert_to(b, &total_rows, ElementType::F64));
    Ok(outputs)
}

/// `value` in `element`: itself when it already is (a no-op convert would still be traced).
fn convert_to(b: &mut StepBuilder<'_>, value: &Value, element: ElementType) -> Value {
    if value.ty().element == element {
        value.clone()
    } else {
        b.convert(value, element)
    }
}

/// `lhs · rhs` of f32 values with the products and their sum in `wide`, rounded once to f32.
///
/// In f64: a product of two f32 values is exact, and a sum of 11 or 32 of them, in any order,
/// is within a few f64 ulps of the exact sum, so it rounds to the same f32 whatever rows XLA
/// blocks together. In f32, XLA generates dot code per shape, and the per-replica program of
/// 43 rows and the 1-replica program of 128 can round a row differently.
fn matmul_in(
    b: &mut StepBuilder<'_>,
    lhs: &Value,
    rhs: &Value,
    wide: ElementType,
) -> Result<Value, TpuError> {
    let lhs = convert_to(b, lhs, wide);
    let rhs = convert_to(b, rhs, wide);
    let product = b.matmul(&lhs, &rhs)?;
    Ok(convert_to(b, &product, ElementType::F32))
}

/// tanh of f32 values computed in `wide`, rounded to f32.
fn tanh_in(b: &mut StepBuilder<'_>, z: &Value, wide: ElementType) -> Value {
    let z = convert_to(b, z, wide);
    let hidden = b.unary(UnaryOp::Tanh, &z);
    convert_to(b, &hidden, ElementType::F32)
}

/// Trains the MLP on `data.train` with `TpuStrategy`, one replica per PJRT device
/// (`config.devices.len()` of them), from the same global batches, initial weights and
/// hyperparameters as [`crate::mirrored::train`], the step computed in
/// `config.tpu_arithmetic`.
pub fn train_tpu(config: &Config, data: &WineData) -> Result<TpuTrained> {
    ensure!(
        config.steps > 0 && config.global_batch > 0 && config.hidden > 0 && config.eval_every > 0,
        "steps, batch, hidden units and the validation interval must be positive"
    );
    let strategy = tpu_strategy(config.devices.len())?;
    let host = strategy.extended().host_device().to_owned();
    let mean_score = data.train.y.iter().sum::<f32>() / data.train.rows() as f32;
    let init = Params::init(config.hidden, mean_score, config.seed);
    let names = ["dense/kernel", "dense/bias", "output/kernel", "output/bias"];
    let mut weights = Vec::with_capacity(4);
    let mut slots = Vec::with_capacity(4);
    // The host tensors are the initial values; each is copied to every replica's device.
    for (name, value) in names.iter().zip(init.to_tensors(&host)) {
        let zeros = Tensor::zeros(&host, DType::F32, value.shape())?;
        weights.push(
            strategy.create_device_variable(name, VariableOptions::default(), |_| Ok(value))?,
        );
        slots.push(strategy.create_device_variable(
            &format!("{name}/momentum"),
            VariableOptions {
                trainable: Some(false),
                ..VariableOptions::default()
            },
            |_| Ok(zeros),
        )?);
    }
    let variables: Vec<TpuVariable> = weights.into_iter().chain(slots).collect();
    let variable_refs: Vec<&TpuVariable> = variables.iter().collect();

    // The same global batches, cut the same way; TpuStrategy turns KeepUneven into
    // PadWithMask, so a batch that does not divide by the replicas keeps the compiled shape.
    let distributed = strategy.distribute_dataset(
        training_batches(config, &data.train, &host)?,
        InputOptions {
            partial_batch: PartialBatch::KeepUneven,
            ..InputOptions::default()
        },
    )?;
    // Two steps' batches in device buffers ahead of the step that uses them.
    let mut batches = strategy.device_batches(distributed.iter_masked(), 2);
    let mut next_batch = |step: usize| -> Result<(Vec<DeviceValue>, Duration)> {
        let waiting = Instant::now();
        let batch = batches
            .next()
            .ok_or_else(|| anyhow!("the input ended after {step} steps"))??;
        ensure!(
            batch.len() == 3,
            "a step's input has {} parts; expected x, y and the mask",
            batch.len()
        );
        Ok((batch, waiting.elapsed()))
    };

    let (learning_rate, momentum, arithmetic) =
        (config.learning_rate, config.momentum, config.tpu_arithmetic);
    let step_fn =
        strategy.function(move |b, args| tpu_step(b, args, learning_rate, momentum, arithmetic));

    // Trace and compile before the timed steps: `run` with the variables' current buffers has
    // the signature `run_updating` will use, so the program lands in the function's cache.
    // Its outputs are dropped, so the variables do not change.
    let mut pending = Some(next_batch(0)?);
    let compiling = Instant::now();
    {
        let (first, _) = pending.as_ref().expect("just set");
        let current: Vec<_> = variables.iter().map(TpuVariable::device_value).collect();
        let mut inputs: Vec<StepInput<'_>> = current.iter().map(|v| StepInput::Device(v)).collect();
        inputs.extend(first.iter().map(StepInput::Device));
        let outputs = step_fn.run(&inputs)?;
        outputs[VARIABLES].replica(0)?;
    }
    let compile = compiling.elapsed();

    let bar = progress_bar(config);
    let mut losses = Vec::with_capacity(config.steps);
    let mut validation = vec![(0, evaluate(&init, &data.validation)?.mse)];
    let mut times = TpuStepTimes::default();
    for step in 0..config.steps {
        let (batch, input) = match pending.take() {
            Some(first) => first,
            None => next_batch(step)?,
        };
        let launching = Instant::now();
        let totals = step_fn.run_updating(
            &variable_refs,
            &[
                StepInput::Device(&batch[0]),
                StepInput::Device(&batch[1]),
                StepInput::Device(&batch[2]),
            ],
        )?;
        // Reading the loss waits for the step: the launch returns before the devices finish.
        let read = |i: usize| -> Result<f64> { Ok(totals[i].replica(0)?.to_vec::<f64>()?[0]) };
        let (squared_error, rows) = (read(0)?, read(1)?);
        times.step += launching.elapsed();
        times.input += input;
        // As in the mirrored step: replicas that together saw another number of real rows were
        // fed wrongly (a mask that lost or invented rows), whatever the weights look like.
        ensure!(
            rows == config.global_batch as f64,
            "step {step}: the replicas' real rows add up to {rows}, not the global batch of {}",
            config.global_batch
        );
        let loss = (squared_error / rows) as f32;
        losses.push(loss);

        if (step + 1) % config.eval_every == 0 || step + 1 == config.steps {
            let params = tpu_params(&variables, 0)?;
            validation.push((step + 1, evaluate(&params, &data.validation)?.mse));
        }
        if step % 20 == 0 || step + 1 == config.steps {
            let seconds = times.total().as_secs_f64();
            bar.set_position(step as u64 + 1);
            bar.set_message(format!(
                "loss {loss:.4} · {:.0} samples/s",
                (step + 1) as f64 * config.global_batch as f64 / seconds
            ));
        }
    }
    bar.finish_and_clear();
    let params = tpu_params(&variables, 0)?;
    let mut copy_difference = 0.0f32;
    for r in 1..config.devices.len() {
        let difference = max_weight_difference(&params, &tpu_params(&variables, r)?);
        if difference > copy_difference || difference.is_nan() {
            copy_difference = difference;
        }
    }
    let per_step = |d: Duration| d / config.steps as u32;
    let total = times.total();
    Ok(TpuTrained {
        params,
        copy_difference,
        losses,
        validation,
        times: TpuStepTimes {
            input: per_step(times.input),
            step: per_step(times.step),
        },
        compile,
        steps_per_s: config.steps as f64 / total.as_secs_f64(),
        platform: strategy.client().platform_name()?,
        devices: strategy.worker_devices(),
    })
}

/// Replica `r`'s device copy of the parameters (the first 4 variables), on the host.
fn tpu_params(variables: &[TpuVariable], r: usize) -> Result<Params> {
    let tensors = variables[..4]
        .iter()
        .map(|v| v.read_replica(r))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Params::from_tensors(&tensors)?)
}
