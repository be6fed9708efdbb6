//! Compiled steps: [`TpuFunction`] traces a step written against [`StepBuilder`] into one
//! replicated StableHLO program per input signature, compiles it once (cached), and launches it
//! on every replica's device. Values stay on the devices between steps as [`DeviceValue`]s.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use distribute_pjrt::stablehlo::{Builder, TensorType, Value};
use distribute_pjrt::{Buffer, CompileOptions, LoadedExecutable, PjrtError};
use distribute_values::{DistributedValues, Lock};

use crate::TpuError;
use crate::device_value::{DeviceValue, StepInput, tensor_type, upload};
use crate::replicas::Replicas;
use crate::step_builder::StepBuilder;
use crate::variable::TpuVariable;

/// Which program a cache entry holds: one step, or `k` steps in a device-side loop.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ProgramKind {
    Step,
    Steps { k: usize, carried: usize },
}

/// A compiled step function of a [`TpuStrategy`](crate::TpuStrategy) (TF's `tf.function` given to
/// `strategy.run`): traced and compiled once per input signature, then launched without
/// waiting, so consecutive runs overlap with the caller.
pub struct TpuFunction<'s, F> {
    replicas: &'s Replicas,
    step: F,
    /// Held while a program is traced and compiled; a panicking trace leaves at most an empty
    /// list of signatures behind, since a program goes in only once compiled.
    cache: Lock<ProgramCache>,
    compilations: AtomicUsize,
}

type StepResult = Result<Vec<Value>, TpuError>;

/// A compiled program and the per-replica types of its outputs (known from the trace, so a
/// launch asks the plugin nothing about them).
struct Program {
    executable: LoadedExecutable,
    outputs: Vec<TensorType>,
}

/// Compiled programs by kind, each with the per-replica input types it was traced for. A kind
/// has few signatures (usually one), so a run finds its program by comparing types in place
/// instead of building a key.
type ProgramCache = HashMap<ProgramKind, Vec<(Vec<TensorType>, Arc<Program>)>>;

impl<'s, F> TpuFunction<'s, F>
where
    F: Fn(&mut StepBuilder<'_>, &[Value]) -> StepResult,
{
    pub(crate) fn new(replicas: &'s Replicas, step: F) -> Self {
        TpuFunction {
            replicas,
            step,
            cache: Lock::new(HashMap::new()),
            compilations: AtomicUsize::new(0),
        }
    }

    /// How many programs have been compiled (one per input signature and kind).
    pub fn compilations(&self) -> usize {
        self.compilations.load(Ordering::Relaxed)
    }

    /// Runs the step once on every replica: replica `r` gets its part of every input. Returns
    /// the step's outputs, on the devices.
    pub fn run(&self, inputs: &[StepInput<'_>]) -> Result<Vec<DeviceValue>, TpuError> {
        let types = self.signature(inputs)?;
        let n = self.replicas.devices.len();
        let program = self.compiled(ProgramKind::Step, &types, |b, params| {
            let mut sb = StepBuilder {
                builder: b,
                num_replicas: n,
            };
            (self.step)(&mut sb, params)
        })?;
        self.launch(&program, inputs)
    }

    /// Runs `k` steps in one device-side loop. The step gets `state` followed by one slice of
    /// each `data` input (data inputs have a leading dimension `k`; step `i` gets row `i`) and
    /// must return the next state, of the state's types. Returns the final state.
    pub fn run_steps(
        &self,
        k: usize,
        state: &[StepInput<'_>],
        data: &[StepInput<'_>],
    ) -> Result<Vec<DeviceValue>, TpuError> {
        let mut inputs = state.to_vec();
        inputs.extend_from_slice(data);
        let types = self.signature(&inputs)?;
        let k_i32 = i32::try_from(k).map_err(|_| {
            TpuError::InvalidArgument(format!("{k} steps do not fit a 32-bit loop counter"))
        })?;
        for (i, ty) in types[state.len()..].iter().enumerate() {
            if ty.dims.first() != Some(&(k as i64)) {
                return Err(TpuError::InvalidArgument(format!(
                    "data input {i} has per-replica shape {:?}; run_steps({k}) needs a leading \
                     dimension of {k} (one row per step)",
                    ty.dims
                )));
            }
        }
        let n = self.replicas.devices.len();
        let carried = state.len();
        let kind = ProgramKind::Steps { k, carried };
        let program = self.compiled(kind, &types, |b, params| {
            let counter = b.scalar(0i32);
            let mut init: Vec<&Value> = vec![&counter];
            init.extend(params.iter());
            // The step's own error, kept aside: regions report builder errors only.
            let mut step_error = None;
            let finals = b.while_loop(
                &init,
                |b, args| {
                    let limit = b.scalar(k_i32);
                    b.compare(distribute_pjrt::stablehlo::Comparison::Lt, &args[0], &limit)
                },
                |b, args| {
                    let i = &args[0];
                    let zero = b.scalar(0i32);
                    let mut step_args: Vec<Value> = args[1..=carried].to_vec();
                    for x in &args[1 + carried..] {
                        let mut start = vec![i];
                        start.extend(std::iter::repeat_n(&zero, x.ty().dims.len() - 1));
                        let mut sizes = x.ty().dims.clone();
                        sizes[0] = 1;
                        let row = b.dynamic_slice(x, &start, &sizes)?;
                        step_args.push(b.reshape(&row, &x.ty().dims[1..])?);
                    }
                    let mut sb = StepBuilder {
                        builder: b,
                        num_replicas: n,
                    };
                    let next_state = match (self.step)(&mut sb, &step_args) {
                        Ok(values) => values,
                        Err(err) => {
                            step_error = Some(err);
                            return Err(PjrtError::InvalidArgument("the step failed".into()));
                        }
                    };
                    let one = b.scalar(1i32);
                    let mut next = vec![b.add(i, &one)?];
                    next.extend(next_state);
                    next.extend(args[1 + carried..].iter().cloned());
                    Ok(next)
                },
            );
            match (finals, step_error) {
                (_, Some(err)) => Err(err),
                (Ok(finals), None) => Ok(finals[1..=carried].to_vec()),
                (Err(PjrtError::InvalidArgument(m)), None)
                    if m.contains("the body must return") =>
                {
                    Err(TpuError::InvalidArgument(format!(
                        "run_steps: the step must return the next state with the state's types: {m}"
                    )))
                }
                (Err(err), None) => Err(err.into()),
            }
        })?;
        self.launch(&program, &inputs)
    }

    /// Runs the step once with `variables` as its first inputs: the step gets the variables'
    /// values followed by `inputs`, and returns the variables' new values (same types, same
    /// order) followed by its other outputs. The new values replace the variables' device
    /// buffers without going through the host; the other outputs are returned.
    ///
    /// Steps that update the same variable should be issued from one thread: each run reads
    /// the buffers current when it starts and replaces them when it has launched.
    pub fn run_updating(
        &self,
        variables: &[&TpuVariable],
        inputs: &[StepInput<'_>],
    ) -> Result<Vec<DeviceValue>, TpuError> {
        let current = current_values(variables)?;
        let mut all: Vec<StepInput<'_>> = current.iter().map(|v| StepInput::Device(v)).collect();
        all.extend_from_slice(inputs);
        let mut outputs = self.run(&all)?;
        if outputs.len() < variables.len() {
            return Err(TpuError::InvalidArgument(format!(
                "run_updating: the step returned {} values, fewer than the {} variables it                  must update",
                outputs.len(),
                variables.len()
            )));
        }
        let rest = outputs.split_off(variables.len());
        replace_all(variables, outputs)?;
        Ok(rest)
    }

    /// [`run_steps`](Self::run_steps) with `variables` carried through the device loop ahead of
    /// `state`: the step gets the variables, then `state`, then one row of each `data` input,
    /// and returns the next variables and state. After `k` steps the variables hold their
    /// final values (their buffers are replaced, on the devices); the final `state` is
    /// returned.
    pub fn run_steps_updating(
        &self,
        k: usize,
        variables: &[&TpuVariable],
        state: &[StepInput<'_>],
        data: &[StepInput<'_>],
    ) -> Result<Vec<DeviceValue>, TpuError> {
        let current = current_values(variables)?;
        let mut carried: Vec<StepInput<'_>> =
            current.iter().map(|v| StepInput::Device(v)).collect();
        carried.extend_from_slice(state);
        let mut finals = self.run_steps(k, &carried, data)?;
        let rest = finals.split_off(variables.len());
        replace_all(variables, finals)?;
        Ok(rest)
    }

    /// Every input's per-replica type; per-replica tensors must agree across replicas.
    fn signature<'a>(
        &self,
        inputs: &[StepInput<'a>],
    ) -> Result<Vec<Cow<'a, TensorType>>, TpuError> {
        let n = self.replicas.devices.len();
        inputs
            .iter()
            .enumerate()
            .map(|(i, input)| match input {
                StepInput::Same(t) => Ok(Cow::Owned(tensor_type(t)?)),
                StepInput::Device(v) => {
                    if v.buffers.len() != n {
                        return Err(TpuError::InvalidArgument(format!(
                            "input {i} lives on {} replicas, the strategy has {n}",
                            v.buffers.len()
                        )));
                    }
                    Ok(Cow::Borrowed(&v.ty))
                }
                StepInput::PerReplica(p) => {
                    let values = p.values();
                    if values.len() != n {
                        return Err(TpuError::InvalidArgument(format!(
                            "input {i} has {} replicas' values, the strategy has {n}",
                            values.len()
                        )));
                    }
                    let first = tensor_type(&values[0])?;
                    for (r, v) in values.iter().enumerate().skip(1) {
                        let ty = tensor_type(v)?;
                        if ty != first {
                            return Err(TpuError::InvalidArgument(format!(
                                "input {i}: replica {r} has {ty}, replica 0 has {first}; every \
                                 replica's value must have the same shape and dtype (pad a short \
                                 batch to the compiled shape)"
                            )));
                        }
                    }
                    Ok(Cow::Owned(first))
                }
            })
            .collect()
    }

    /// The cached program for `(kind, types)`, traced with `trace` and compiled on a miss.
    fn compiled(
        &self,
        kind: ProgramKind,
        types: &[Cow<'_, TensorType>],
        trace: impl FnOnce(&mut Builder, &[Value]) -> StepResult,
    ) -> Result<Arc<Program>, TpuError> {
        let mut cache = self.cache.lock();
        let signatures = cache.entry(kind).or_default();
        let same = |traced: &[TensorType]| {
            traced.len() == types.len() && traced.iter().zip(types).all(|(a, b)| a == b.as_ref())
        };
        if let Some((_, program)) = signatures.iter().find(|(traced, _)| same(traced)) {
            return Ok(Arc::clone(program));
        }
        let types: Vec<TensorType> = types.iter().map(|t| t.as_ref().clone()).collect();
        let mut builder = Builder::new();
        let params: Vec<Value> = types.iter().map(|t| builder.parameter(t.clone())).collect();
        let outputs = trace(&mut builder, &params)?;
        let output_types = outputs.iter().map(|v| v.ty().clone()).collect();
        let n = self.replicas.devices.len() as u32;
        let module = builder.build("tpu_step", &outputs, n)?;
        let mut options = CompileOptions::replicated(n);
        if !self.replicas.uses_default_assignment() {
            options.device_assignment = Some(
                self.replicas
                    .devices
                    .iter()
                    .map(|d| i64::from(d.id()))
                    .collect(),
            );
        }
        let executable = self.replicas.client.compile(module.text(), &options)?;
        self.compilations.fetch_add(1, Ordering::Relaxed);
        let program = Arc::new(Program {
            executable,
            outputs: output_types,
        });
        signatures.push((types, Arc::clone(&program)));
        Ok(program)
    }

    /// Puts every input on every replica's device and launches the program without waiting.
    fn launch(
        &self,
        program: &Program,
        inputs: &[StepInput<'_>],
    ) -> Result<Vec<DeviceValue>, TpuError> {
        let executable = &program.executable;
        let client = &self.replicas.client;
        let devices = &self.replicas.devices;
        // Uploaded buffers live here until the launch has taken its own references.
        let mut uploaded: Vec<Vec<Buffer>> = (0..devices.len()).map(|_| Vec::new()).collect();
        for input in inputs {
            for (r, device) in devices.iter().enumerate() {
                let tensor = match input {
                    StepInput::Same(t) => *t,
                    StepInput::PerReplica(p) => &p.values()[r],
                    StepInput::Device(_) => continue,
                };
                uploaded[r].push(upload(client, tensor, device)?);
            }
        }
        let mut arguments: Vec<Vec<&Buffer>> = Vec::with_capacity(devices.len());
        for (r, mine) in uploaded.iter().enumerate() {
            let mut next_upload = mine.iter();
            let list = inputs
                .iter()
                .map(|input| match input {
                    StepInput::Device(v) => &v.buffers[r],
                    _ => next_upload.next().expect("one upload per host input"),
                })
                .collect();
            arguments.push(list);
        }
        let execution = executable.execute(&arguments)?;
        drop(arguments);
        // Outputs are read back (and so waited for) only when asked, so consecutive steps queue
        // on the devices while the caller goes on.
        let mut outputs: Vec<Vec<Buffer>> =
            (0..executable.num_outputs()).map(|_| Vec::new()).collect();
        for replica in execution.into_outputs() {
            for (o, buffer) in replica.into_iter().enumerate() {
                outputs[o].push(buffer);
            }
        }
        Ok(outputs
            .into_iter()
            .zip(&program.outputs)
            .map(|(buffers, ty)| DeviceValue::on(self.replicas, buffers, ty.clone()))
            .collect())
    }
}

/// The variables' current buffers; a variable listed twice is refused (its two new values
/// would race).
fn current_values(variables: &[&TpuVariable]) -> Result<Vec<Arc<DeviceValue>>, TpuError> {
    for (i, v) in variables.iter().enumerate() {
        if variables[..i].iter().any(|w| std::ptr::eq(*v, *w)) {
            return Err(TpuError::InvalidArgument(format!(
                "variable '{}' is passed twice; a step updates each variable once",
                v.name()
            )));
        }
    }
    Ok(variables.iter().map(|v| v.device_value()).collect())
}

/// Replaces every variable's buffers with its new value, after checking all of them, so a
/// step that returns a wrong type changes no variable.
fn replace_all(variables: &[&TpuVariable], values: Vec<DeviceValue>) -> Result<(), TpuError> {
    for (v, new) in variables.iter().zip(&values) {
        v.check_update_type(new.ty())?;
    }
    for (v, new) in variables.iter().zip(values) {
        v.replace(new);
    }
    Ok(())
}
