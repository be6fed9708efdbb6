//! Compiled steps: [`TpuFunction`] traces a step written against [`StepBuilder`] into one
//! replicated StableHLO program per input signature, compiles it once (cached), and launches it
//! on every replica's device. Values stay on the devices between steps as [`DeviceValue`]s.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use distribute_collectives::{DType, Tensor};
use distribute_pjrt::stablehlo::{AllReduceOp, Builder, ReplicaGroups, TensorType, Value};
use distribute_pjrt::{Buffer, CompileOptions, ElementType, LoadedExecutable, PjrtError};
use distribute_values::{DistributedValues, Mirrored, PerReplica, ReduceOp};

use crate::TpuError;
use crate::strategy::TpuStrategy;
use crate::variable::TpuVariable;

/// What a compiled step sees: the program builder (through `Deref`) plus the replica-level
/// operations of TF's replica context, traced into the program.
pub struct StepBuilder<'b> {
    builder: &'b mut Builder,
    num_replicas: usize,
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
    /// on TPU.
    pub fn all_reduce(&mut self, op: ReduceOp, value: &Value) -> Result<Value, TpuError> {
        let groups = ReplicaGroups::all(self.num_replicas as u32);
        match op {
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
    /// Outside a step there is nothing to broadcast: see [`TpuStrategy::broadcast_to`].
    pub fn broadcast_from_first(&mut self, value: &Value) -> Result<Value, TpuError> {
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

/// One input of a compiled step.
#[derive(Clone, Copy, Debug)]
pub enum StepInput<'a> {
    /// The same tensor for every replica (copied to each device).
    Same(&'a Tensor),
    /// One tensor per replica; all must have the same shape and dtype.
    PerReplica(&'a PerReplica<Tensor>),
    /// Values already on the devices, such as a previous step's outputs (no copy).
    Device(&'a DeviceValue),
}

/// A value held on every replica's device, one buffer each (weights between steps, outputs).
pub struct DeviceValue {
    pub(crate) buffers: Vec<Buffer>,
    pub(crate) ty: TensorType,
    pub(crate) devices: Vec<String>,
}

impl std::fmt::Debug for DeviceValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceValue({} on {:?})", self.ty, self.devices)
    }
}

impl DeviceValue {
    /// The per-replica type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// Replica `r`'s value, copied to the host (waits for the step that computes it).
    pub fn replica(&self, r: usize) -> Result<Tensor, TpuError> {
        let buffer = self.buffers.get(r).ok_or_else(|| {
            TpuError::InvalidArgument(format!(
                "replica {r} out of range: {} replicas",
                self.buffers.len()
            ))
        })?;
        let shape: Vec<usize> = self.ty.dims.iter().map(|&d| d as usize).collect();
        let device = &self.devices[r];
        Ok(match self.ty.element {
            ElementType::F32 => Tensor::from_vec(device, &shape, buffer.to_vec::<f32>()?)?,
            ElementType::F64 => Tensor::from_vec(device, &shape, buffer.to_vec::<f64>()?)?,
            ElementType::S32 => Tensor::from_vec(device, &shape, buffer.to_vec::<i32>()?)?,
            ElementType::S64 => Tensor::from_vec(device, &shape, buffer.to_vec::<i64>()?)?,
            other => {
                return Err(TpuError::Unimplemented(format!(
                    "reading {other} values back as tensors"
                )));
            }
        })
    }

    /// Every replica's value, on the host.
    pub fn to_per_replica(&self, strategy: &TpuStrategy) -> Result<PerReplica<Tensor>, TpuError> {
        let values = (0..self.buffers.len())
            .map(|r| self.replica(r))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PerReplica::new(Arc::clone(strategy.device_map()), values)?)
    }

    /// Every replica's value as a `Mirrored` (for values an all-reduce made equal); fails if
    /// the replicas' copies differ in any bit.
    pub fn to_mirrored(&self, strategy: &TpuStrategy) -> Result<Mirrored<Tensor>, TpuError> {
        let (values, map) = self.to_per_replica(strategy)?.into_parts();
        if let Some(r) = values.iter().position(|v| !v.bitwise_eq(&values[0])) {
            return Err(TpuError::InvalidArgument(format!(
                "replica {r}'s value differs from replica 0's, so it is not mirrored; read it \
                 with to_per_replica"
            )));
        }
        Ok(Mirrored::new(map, values)?)
    }
}

/// Which program a cache entry holds: one step, or `k` steps in a device-side loop.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ProgramKind {
    Step,
    Steps { k: usize, carried: usize },
}

/// A compiled step function of a [`TpuStrategy`] (TF's `tf.function` given to
/// `strategy.run`): traced and compiled once per input signature, then launched without
/// waiting, so consecutive runs overlap with the caller.
pub struct TpuFunction<'s, F> {
    strategy: &'s TpuStrategy,
    step: F,
    cache: Mutex<ProgramCache>,
    compilations: AtomicUsize,
}

type StepResult = Result<Vec<Value>, TpuError>;

/// Compiled programs by kind and per-replica input types.
type ProgramCache = HashMap<(ProgramKind, Vec<TensorType>), Arc<LoadedExecutable>>;

impl<'s, F> TpuFunction<'s, F>
where
    F: Fn(&mut StepBuilder<'_>, &[Value]) -> StepResult,
{
    pub(crate) fn new(strategy: &'s TpuStrategy, step: F) -> Self {
        TpuFunction {
            strategy,
            step,
            cache: Mutex::new(HashMap::new()),
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
        let n = self.strategy.replica_devices().len();
        let executable = self.compiled(ProgramKind::Step, &types, |b, params| {
            let mut sb = StepBuilder {
                builder: b,
                num_replicas: n,
            };
            (self.step)(&mut sb, params)
        })?;
        self.launch(&executable, inputs)
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
        let n = self.strategy.replica_devices().len();
        let carried = state.len();
        let kind = ProgramKind::Steps { k, carried };
        let executable = self.compiled(kind, &types, |b, params| {
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
        self.launch(&executable, &inputs)
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
    fn signature(&self, inputs: &[StepInput<'_>]) -> Result<Vec<TensorType>, TpuError> {
        let n = self.strategy.replica_devices().len();
        inputs
            .iter()
            .enumerate()
            .map(|(i, input)| match input {
                StepInput::Same(t) => tensor_type(t),
                StepInput::Device(v) => {
                    if v.buffers.len() != n {
                        return Err(TpuError::InvalidArgument(format!(
                            "input {i} lives on {} replicas, the strategy has {n}",
                            v.buffers.len()
                        )));
                    }
                    Ok(v.ty.clone())
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
                    Ok(first)
                }
            })
            .collect()
    }

    /// The cached program for `(kind, types)`, traced with `trace` and compiled on a miss.
    fn compiled(
        &self,
        kind: ProgramKind,
        types: &[TensorType],
        trace: impl FnOnce(&mut Builder, &[Value]) -> StepResult,
    ) -> Result<Arc<LoadedExecutable>, TpuError> {
        let key = (kind, types.to_vec());
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(executable) = cache.get(&key) {
            return Ok(Arc::clone(executable));
        }
        let mut builder = Builder::new();
        let params: Vec<Value> = types.iter().map(|t| builder.parameter(t.clone())).collect();
        let outputs = trace(&mut builder, &params)?;
        let n = self.strategy.replica_devices().len() as u32;
        let module = builder.build("tpu_step", &outputs, n)?;
        let mut options = CompileOptions::replicated(n);
        if !self.strategy.uses_default_assignment() {
            options.device_assignment = Some(
                self.strategy
                    .replica_devices()
                    .iter()
                    .map(|d| i64::from(d.id()))
                    .collect(),
            );
        }
        let executable = Arc::new(self.strategy.client().compile(module.text(), &options)?);
        self.compilations.fetch_add(1, Ordering::Relaxed);
        cache.insert(key, Arc::clone(&executable));
        Ok(executable)
    }

    /// Puts every input on every replica's device and launches the program without waiting.
    fn launch(
        &self,
        executable: &LoadedExecutable,
        inputs: &[StepInput<'_>],
    ) -> Result<Vec<DeviceValue>, TpuError> {
        let client = self.strategy.client();
        let devices = self.strategy.replica_devices();
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
        let names = self.strategy.worker_devices();
        // Outputs are read back (and so waited for) only when asked, so consecutive steps queue
        // on the devices while the caller goes on.
        let mut outputs: Vec<Vec<Buffer>> =
            (0..executable.num_outputs()).map(|_| Vec::new()).collect();
        for replica in execution.into_outputs() {
            for (o, buffer) in replica.into_iter().enumerate() {
                outputs[o].push(buffer);
            }
        }
        outputs
            .into_iter()
            .map(|buffers| {
                let ty = buffer_type(&buffers[0])?;
                Ok(DeviceValue {
                    buffers,
                    ty,
                    devices: names.clone(),
                })
            })
            .collect()
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

/// Copies `input` to every replica's device.
pub(crate) fn to_device(
    strategy: &TpuStrategy,
    input: StepInput<'_>,
) -> Result<DeviceValue, TpuError> {
    let devices = strategy.replica_devices();
    let (buffers, ty) = match input {
        StepInput::Device(v) => {
            return Err(TpuError::InvalidArgument(format!(
                "{v:?} is already on the devices; pass it to steps as StepInput::Device"
            )));
        }
        StepInput::Same(t) => {
            let buffers = devices
                .iter()
                .map(|d| upload(strategy.client(), t, d))
                .collect::<Result<Vec<_>, _>>()?;
            (buffers, tensor_type(t)?)
        }
        StepInput::PerReplica(p) => {
            let values = p.values();
            if values.len() != devices.len() {
                return Err(TpuError::InvalidArgument(format!(
                    "{} replicas' values for a strategy of {} replicas",
                    values.len(),
                    devices.len()
                )));
            }
            let ty = tensor_type(&values[0])?;
            if let Some(r) = values
                .iter()
                .position(|v| tensor_type(v).ok().as_ref() != Some(&ty))
            {
                return Err(TpuError::InvalidArgument(format!(
                    "replica {r}'s value differs in shape or dtype from replica 0's ({ty})"
                )));
            }
            let buffers = values
                .iter()
                .zip(devices)
                .map(|(t, d)| upload(strategy.client(), t, d))
                .collect::<Result<Vec<_>, _>>()?;
            (buffers, ty)
        }
    };
    Ok(DeviceValue {
        buffers,
        ty,
        devices: strategy.worker_devices(),
    })
}

pub(crate) fn buffer_type(buffer: &Buffer) -> Result<TensorType, TpuError> {
    Ok(TensorType::new(buffer.element_type()?, &buffer.dims()?))
}

fn element_type(dtype: DType) -> Result<ElementType, TpuError> {
    match dtype {
        DType::F32 => Ok(ElementType::F32),
        DType::F64 => Ok(ElementType::F64),
        DType::I32 => Ok(ElementType::S32),
        DType::I64 => Ok(ElementType::S64),
        other => Err(TpuError::Unimplemented(format!(
            "{} tensors as step inputs",
            other.name()
        ))),
    }
}

pub(crate) fn tensor_type(t: &Tensor) -> Result<TensorType, TpuError> {
    let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    Ok(TensorType::new(element_type(t.dtype())?, &dims))
}

pub(crate) fn upload(
    client: &distribute_pjrt::Client,
    t: &Tensor,
    device: &distribute_pjrt::Device,
) -> Result<Buffer, TpuError> {
    let dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    Ok(match t.dtype() {
        DType::F32 => client.buffer_from_host(&t.to_vec::<f32>()?, &dims, device)?,
        DType::F64 => client.buffer_from_host(&t.to_vec::<f64>()?, &dims, device)?,
        DType::I32 => client.buffer_from_host(&t.to_vec::<i32>()?, &dims, device)?,
        DType::I64 => client.buffer_from_host(&t.to_vec::<i64>()?, &dims, device)?,
        other => {
            return Err(element_type(other).err().unwrap_or_else(|| {
                TpuError::Unimplemented(format!("{} step inputs", other.name()))
            }));
        }
    })
}
