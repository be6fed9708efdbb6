//! Safe layer: [`Client`], [`Device`], [`Buffer`], [`LoadedExecutable`] and [`Execution`], each
//! owning its PJRT handle and freeing it on drop. Buffers and executables keep their client alive
//! (an `Arc`), so no handle outlives the client that made it.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api::OptionValue;
use crate::error::{PjrtError, Result};
use crate::offer::Shortfall;
use crate::options::CompileOptions;
use crate::plugin::Plugin;
use crate::sys;
use crate::types::{ElementType, NativeType};

/// The value of one of a plugin's own client create options ([`ClientOptions::plugin_options`]).
#[derive(Clone, Debug, PartialEq)]
pub enum PluginOption {
    /// A string (`PJRT_NamedValue_kString`).
    String(String),
    /// An integer (`kInt64`).
    Int64(i64),
    /// A list of integers (`kInt64List`).
    Int64List(Vec<i64>),
    /// A float (`kFloat`).
    Float(f32),
    /// A boolean (`kBool`).
    Bool(bool),
}

impl PluginOption {
    fn borrowed(&self) -> OptionValue<'_> {
        match self {
            PluginOption::String(text) => OptionValue::Str(text),
            PluginOption::Int64(n) => OptionValue::Int64(*n),
            PluginOption::Int64List(list) => OptionValue::Int64List(list),
            PluginOption::Float(x) => OptionValue::Float(*x),
            PluginOption::Bool(b) => OptionValue::Bool(*b),
        }
    }
}

/// Options for [`Client::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct ClientOptions {
    /// For the CPU plugin: how many CPU devices to expose (`cpu_device_count`). Leave `None` for
    /// other plugins, which reject options they do not know.
    pub cpu_device_count: Option<usize>,
    /// Create options of the plugin at hand, passed to it as given: for JAX's CUDA plugin, for
    /// instance, `("preallocate", PluginOption::Bool(false))` (allocate GPU memory as needed
    /// instead of 75 % of it at once) or `("memory_fraction", PluginOption::Float(0.5))`.
    /// Plugins refuse options they do not know, with their own message; a name given twice,
    /// or `cpu_device_count` (set it above), is refused before the plugin is asked.
    pub plugin_options: Vec<(String, PluginOption)>,
    /// How many executions may run or wait to run at once; launching one more first waits for
    /// the oldest. XLA's CPU runtime deadlocks (a collective's rendezvous times out and the
    /// process aborts) somewhere past 32 queued executions that contain collectives, as JAX's
    /// pmap does, so callers may launch back to back and this bound keeps the queue short.
    ///
    /// From 1 to [`MAX_IN_FLIGHT`]; [`Client::new`] refuses other values rather than clamping
    /// them, so a setting never silently means something else.
    pub max_in_flight: usize,
    /// How long a thread waiting for the plugin (a result read to the host, an execution's
    /// completion) polls before it sleeps. A step that ends within this time is noticed at
    /// once instead of after a futex wake-up, which costs 10–20 µs on a busy 2-core machine;
    /// a longer wait burns at most this much of a core before sleeping. `Duration::ZERO`
    /// sleeps at once.
    pub await_spin: Duration,
}

/// The default [`ClientOptions::await_spin`].
pub const DEFAULT_AWAIT_SPIN: Duration = Duration::from_micros(50);

/// The CPU plugin's create option for its device count ([`ClientOptions::cpu_device_count`]).
const CPU_DEVICE_COUNT: &str = "cpu_device_count";

/// The default [`ClientOptions::max_in_flight`]: deep enough to overlap dispatch with work,
/// well below the depth where XLA's CPU collectives deadlock.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 16;

/// The largest [`ClientOptions::max_in_flight`] a client accepts. With 64 or 1000 executions
/// containing collectives in flight, XLA's CPU plugin aborted the whole process after its 40 s
/// all-reduce rendezvous timeout in 8 of 10 runs; with 16 and 32 it never did.
pub const MAX_IN_FLIGHT: usize = 32;

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            cpu_device_count: None,
            plugin_options: Vec::new(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            await_spin: DEFAULT_AWAIT_SPIN,
        }
    }
}

impl ClientOptions {
    /// Options for a CPU client with `devices` devices.
    pub fn cpu(devices: usize) -> ClientOptions {
        ClientOptions {
            cpu_device_count: Some(devices),
            ..ClientOptions::default()
        }
    }

    /// Refuses settings the plugin cannot run safely, before it is asked for anything.
    fn check(&self) -> Result<()> {
        if !(1..=MAX_IN_FLIGHT).contains(&self.max_in_flight) {
            return Err(PjrtError::InvalidArgument(format!(
                "max_in_flight is {}, outside 1..={MAX_IN_FLIGHT}: deeper queues of executions \
                 with collectives make XLA's CPU runtime time out in a collective and abort the \
                 process",
                self.max_in_flight
            )));
        }
        let mut names: Vec<&str> = vec![CPU_DEVICE_COUNT];
        for (name, _) in &self.plugin_options {
            if names.contains(&name.as_str()) {
                return Err(PjrtError::InvalidArgument(if name == CPU_DEVICE_COUNT {
                    format!(
                        "plugin option {CPU_DEVICE_COUNT}: set ClientOptions::cpu_device_count \
                         instead"
                    )
                } else {
                    format!("plugin option {name} is given twice")
                }));
            }
            names.push(name);
        }
        Ok(())
    }
}

struct ClientInner {
    plugin: &'static Plugin,
    raw: *mut sys::Client,
    max_in_flight: usize,
    await_spin: Duration,
    /// Completions of the most recent executions, oldest first (at most `max_in_flight`).
    in_flight: Mutex<VecDeque<Arc<Completion>>>,
}

// SAFETY: a PJRT client is safe to use from several threads at once (PjRtClient's contract; JAX
// dispatches from many threads), and `raw` is only freed in Drop, when no reference remains.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // SAFETY: every buffer, executable and device holds an Arc to this, so none remains.
        // An error while tearing down cannot be acted on; the client is gone either way.
        let _ = unsafe { self.plugin.api.client_destroy(self.raw) };
    }
}

/// A PJRT client: the devices of one plugin, and the compiler and allocator for them.
/// Cheap to clone (shared).
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin.path())
            .finish()
    }
}

impl Client {
    /// Creates a client of `plugin`.
    pub fn new(plugin: &'static Plugin, options: &ClientOptions) -> Result<Client> {
        options.check()?;
        let mut named = Vec::new();
        if let Some(count) = options.cpu_device_count {
            let count = i64::try_from(count).map_err(|_| {
                PjrtError::InvalidArgument(format!("cpu_device_count {count} is too large"))
            })?;
            named.push((CPU_DEVICE_COUNT, OptionValue::Int64(count)));
        }
        for (name, value) in &options.plugin_options {
            named.push((name.as_str(), value.borrowed()));
        }
        // SAFETY: the plugin is loaded and initialized; the options are valid for the call.
        let raw = unsafe { plugin.api.client_create(&named) }?;
        Ok(Client {
            inner: Arc::new(ClientInner {
                plugin,
                raw,
                max_in_flight: options.max_in_flight,
                await_spin: options.await_spin,
                in_flight: Mutex::new(VecDeque::new()),
            }),
        })
    }

    /// A client of `plugin` and the devices a caller runs on: all the devices the plugin offers
    /// (`wanted` `None`; [`Plugin::offer`], under `DISTRIBUTE_PJRT_DEVICES`), or its first
    /// `wanted`. Asking for more than it offers is refused before a client is created, with an
    /// error that names both numbers. The CPU plugin, whose device count is a client option, is
    /// created with exactly the count wanted ([`CPU_PLATFORM`](crate::CPU_PLATFORM);
    /// `cpu_device_count`); any other plugin gets no CPU-only option, since plugins reject
    /// options they do not know. An explicit `options.cpu_device_count` is passed as given.
    pub fn with_devices(
        plugin: &'static Plugin,
        options: &ClientOptions,
        wanted: Option<usize>,
    ) -> Result<(Client, Vec<Device>)> {
        if wanted == Some(0) {
            return Err(PjrtError::InvalidArgument(
                "asked for 0 devices; ask for at least one, or for all".to_owned(),
            ));
        }
        let offer = plugin.offer()?;
        let short = |shortfall| PjrtError::NotEnoughDevices {
            path: plugin.path().to_owned(),
            shortfall,
        };
        let wanted = match wanted {
            Some(n) => {
                offer.check(n).map_err(short)?;
                Some(n)
            }
            None => offer.most_devices(),
        };
        let mut options = options.clone();
        if offer.is_cpu() && options.cpu_device_count.is_none() {
            options.cpu_device_count = wanted;
        }
        let client = Client::new(plugin, &options)?;
        let mut devices = client.devices()?;
        if let Some(n) = wanted {
            if devices.len() < n {
                return Err(short(Shortfall {
                    needed: n,
                    platform: offer.platform().to_owned(),
                    has: devices.len(),
                    capped: false,
                }));
            }
            devices.truncate(n);
        }
        Ok((client, devices))
    }

    /// The plugin this client belongs to.
    pub fn plugin(&self) -> &'static Plugin {
        self.inner.plugin
    }

    /// The platform's name, e.g. `cpu`, `cuda`, `tpu`.
    pub fn platform_name(&self) -> Result<String> {
        // SAFETY: the client is live.
        unsafe { self.inner.plugin.api.client_platform_name(self.inner.raw) }
    }

    /// The devices this process can use, in the plugin's order (replica `r` of a compiled
    /// program runs on `devices()[r]` under the default assignment).
    pub fn devices(&self) -> Result<Vec<Device>> {
        let api = &self.inner.plugin.api;
        // SAFETY: the client is live.
        let raw = unsafe { api.client_addressable_devices(self.inner.raw) }?;
        raw.into_iter()
            .map(|raw| {
                // SAFETY: the device belongs to the live client.
                let (id, kind) = unsafe { api.device_id_and_kind(raw) }?;
                Ok(Device {
                    client: self.inner.clone(),
                    raw,
                    id,
                    kind,
                })
            })
            .collect()
    }

    /// Copies `data`, a dense row-major array of shape `dims`, to `device`.
    pub fn buffer_from_host<T: NativeType>(
        &self,
        data: &[T],
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        if !Arc::ptr_eq(&device.client, &self.inner) {
            return Err(PjrtError::InvalidArgument(format!(
                "device {} belongs to another client",
                device.id
            )));
        }
        let elements = element_count(dims)?;
        if elements != data.len() {
            return Err(PjrtError::InvalidArgument(format!(
                "shape {dims:?} holds {elements} elements, the host slice {}",
                data.len()
            )));
        }
        // SAFETY: data holds exactly product(dims) elements of T::TYPE and is only read during
        // the call; device belongs to this live client (checked above).
        let raw = unsafe {
            self.inner.plugin.api.client_buffer_from_host(
                self.inner.raw,
                data.as_ptr().cast::<c_void>(),
                T::TYPE as i32,
                dims,
                device.raw,
            )
        }?;
        Ok(Buffer::own(self.inner.clone(), raw))
    }

    /// Compiles a StableHLO module (MLIR text, e.g. from [`crate::stablehlo::Module`]). A
    /// program the compiler rejects comes back as [`PjrtError::Api`] with the compiler's
    /// message.
    pub fn compile(&self, stablehlo: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        let bytes = options.to_proto_bytes();
        // SAFETY: the client is live; text and options outlive the call.
        let raw = unsafe {
            self.inner
                .plugin
                .api
                .client_compile(self.inner.raw, stablehlo, "mlir", &bytes)
        }?;
        let mut executable = LoadedExecutable {
            client: self.inner.clone(),
            raw,
            num_replicas: 0,
            num_outputs: 0,
            devices: Vec::new(),
        };
        // SAFETY: the executable is live (and freed by `executable`'s Drop on error).
        let (num_replicas, num_outputs) =
            unsafe { self.inner.plugin.api.loaded_executable_counts(raw) }?;
        executable.num_replicas = num_replicas;
        executable.num_outputs = num_outputs;
        // SAFETY: as above.
        executable.devices = unsafe { self.inner.plugin.api.loaded_executable_devices(raw) }?;
        Ok(executable)
    }
}

/// One device of a client. Cheap to clone; valid as long as any handle of its client lives.
#[derive(Clone)]
pub struct Device {
    client: Arc<ClientInner>,
    raw: *mut sys::Device,
    id: i32,
    kind: String,
}

// SAFETY: a device handle is an immutable description owned by the thread-safe client.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    /// The device's id (unique among the platform's devices).
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The plugin's name for the kind of device, e.g. `cpu`.
    pub fn kind(&self) -> &str {
        &self.kind
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({} {})", self.kind, self.id)
    }
}

/// An array on a device. Reading it waits for the computation that produces it.
pub struct Buffer {
    client: Arc<ClientInner>,
    raw: *mut sys::Buffer,
    /// Held while the buffer is read in place: the C API adds and drops the reader's external
    /// reference in a per-buffer list without a lock, so two threads reading one buffer at once
    /// would race there.
    in_place_read: Mutex<()>,
}

// SAFETY: PJRT buffers are reference-counted, thread-safe runtime objects; this handle is their
// only owner on our side and frees them once in Drop.
unsafe impl Send for Buffer {}
// SAFETY: shared access only reads (type, shape, copy to host), which PJRT allows concurrently.
unsafe impl Sync for Buffer {}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the buffer is live and owned by this handle alone. Dropping it while an
        // execution still uses it is allowed: PJRT keeps the memory until that execution ends.
        let _ = unsafe { self.client.plugin.api.buffer_destroy(self.raw) };
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Buffer");
        if let Ok(t) = self.element_type() {
            s.field("type", &t);
        }
        if let Ok(dims) = self.dims() {
            s.field("dims", &dims);
        }
        s.finish()
    }
}

impl Buffer {
    /// Takes ownership of `raw`, a live buffer of `client`.
    fn own(client: Arc<ClientInner>, raw: *mut sys::Buffer) -> Buffer {
        Buffer {
            client,
            raw,
            in_place_read: Mutex::new(()),
        }
    }

    /// The element type.
    pub fn element_type(&self) -> Result<ElementType> {
        // SAFETY: the buffer is live.
        let raw = unsafe { self.client.plugin.api.buffer_element_type(self.raw) }?;
        ElementType::from_raw(raw).ok_or_else(|| {
            PjrtError::InvalidArgument(format!(
                "the buffer's element type (PJRT_Buffer_Type {raw}) has no Rust counterpart here"
            ))
        })
    }

    /// The shape.
    pub fn dims(&self) -> Result<Vec<i64>> {
        // SAFETY: the buffer is live.
        unsafe { self.client.plugin.api.buffer_dimensions(self.raw) }
    }

    /// Copies the array to the host (row-major), waiting for it to be computed. An execution
    /// that failed reports its error here.
    ///
    /// A dense row-major buffer in host memory (every buffer of the CPU plugin) is copied
    /// straight from that memory, pinned by an external reference while it is read; any other
    /// goes through the plugin's own copy (`PJRT_Buffer_ToHostBuffer`). Either way the wait
    /// polls for the client's [`ClientOptions::await_spin`] before it sleeps.
    pub fn to_vec<T: NativeType>(&self) -> Result<Vec<T>> {
        let found = self.element_type()?;
        if found != T::TYPE {
            return Err(PjrtError::ElementType {
                expected: T::TYPE,
                found,
            });
        }
        let dims = self.dims()?;
        let elements = element_count(&dims)?;
        let mut out = vec![T::default(); elements];
        // SAFETY: T is plain data without padding (NativeType's sealed contract), so viewing the
        // vector as bytes, and writing any bytes into it, is sound.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), elements * size_of::<T>())
        };
        let api = &self.client.plugin.api;
        let spin = self.client.await_spin;
        // A buffer in host memory is read where it lies; any other goes through the plugin's
        // copy to the host.
        let read_in_place = {
            let _only_reader = self
                .in_place_read
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // SAFETY: the buffer is live, and the lock keeps other readers of it out.
            unsafe { api.buffer_read_in_place(self.raw, bytes, dims.len(), spin) }?
        };
        if !read_in_place {
            // SAFETY: the buffer is live; `bytes` is exactly its size (checked again by the call).
            unsafe { api.buffer_to_host(self.raw, bytes, spin) }?;
        }
        Ok(out)
    }
}

/// A compiled program, loaded on its devices.
pub struct LoadedExecutable {
    client: Arc<ClientInner>,
    raw: *mut sys::LoadedExecutable,
    num_replicas: usize,
    num_outputs: usize,
    /// The device of each replica, to check arguments before a launch.
    devices: Vec<*mut sys::Device>,
}

// SAFETY: PJRT executables may be executed from several threads at once; the handle is freed
// once, in Drop.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        // SAFETY: live and owned by this handle; PJRT keeps it alive for running executions.
        let _ = unsafe { self.client.plugin.api.loaded_executable_destroy(self.raw) };
    }
}

impl fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("num_replicas", &self.num_replicas)
            .field("devices", &self.devices.len())
            .field("num_outputs", &self.num_outputs)
            .finish()
    }
}

impl LoadedExecutable {
    /// Replicas the program was compiled for (devices one execution uses).
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// Outputs per replica.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// Launches the program on every replica without waiting: `arguments[r]` are replica `r`'s
    /// inputs, on its device. The outputs can be fed to further executions at once; PJRT orders
    /// the work.
    pub fn execute(&self, arguments: &[Vec<&Buffer>]) -> Result<Execution> {
        if arguments.len() != self.num_replicas {
            return Err(PjrtError::InvalidArgument(format!(
                "the program runs on {} replicas but got {} argument lists; pass one list per \
                 replica",
                self.num_replicas,
                arguments.len()
            )));
        }
        let arity = arguments.first().map_or(0, Vec::len);
        if let Some((r, list)) = arguments.iter().enumerate().find(|(_, l)| l.len() != arity) {
            return Err(PjrtError::InvalidArgument(format!(
                "replica {r} got {} arguments, replica 0 got {arity}; every replica takes the \
                 same parameters",
                list.len()
            )));
        }
        let api = &self.client.plugin.api;
        let mut raw_arguments = Vec::with_capacity(arguments.len());
        for (replica, list) in arguments.iter().enumerate() {
            let mut raw = Vec::with_capacity(list.len());
            for (i, buffer) in list.iter().enumerate() {
                if !Arc::ptr_eq(&buffer.client, &self.client) {
                    return Err(PjrtError::InvalidArgument(
                        "an argument buffer belongs to another client".to_owned(),
                    ));
                }
                // A misplaced argument fails that replica's launch while the others start and
                // then wait forever at their first collective (XLA aborts the process), so every
                // placement is checked before anything starts.
                // SAFETY: the buffer is live and of this client.
                let device = unsafe { api.buffer_device(buffer.raw) }?;
                if self.devices.get(replica).is_some_and(|&d| d != device) {
                    return Err(PjrtError::InvalidArgument(format!(
                        "argument {i} of replica {replica} is on another device than the one the \
                         program assigns to replica {replica}; copy it there first"
                    )));
                }
                raw.push(buffer.raw);
            }
            raw_arguments.push(raw);
        }
        // Hold the queue while launching, so that concurrent launches respect the bound too.
        let mut in_flight = self
            .client
            .in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while in_flight.len() >= self.client.max_in_flight {
            let oldest = in_flight.pop_front().expect("the queue is not empty");
            // Its owner sees any failure on its own wait; here only the completion matters.
            let _ = oldest.wait();
        }
        // SAFETY: the executable and every argument buffer are live and of this client; the
        // lists are rectangular (checked above); the borrows of `arguments` outlive the call,
        // and PJRT holds its own references to inputs for the running computation.
        let (outputs, events) =
            unsafe { api.loaded_executable_execute(self.raw, &raw_arguments, self.num_outputs) }?;
        let completion = Arc::new(Completion {
            plugin: self.client.plugin,
            spin: self.client.await_spin,
            events,
        });
        in_flight.push_back(completion.clone());
        drop(in_flight);
        let outputs = outputs
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .map(|raw| Buffer::own(self.client.clone(), raw))
                    .collect()
            })
            .collect();
        Ok(Execution {
            outputs,
            completion,
        })
    }
}

/// The completion events of one execution, one per replica; shared by its [`Execution`] and
/// the client's in-flight queue, freed when both let go.
struct Completion {
    plugin: &'static Plugin,
    /// The client's [`ClientOptions::await_spin`].
    spin: Duration,
    events: Vec<*mut sys::Event>,
}

// SAFETY: PJRT events may be awaited from any thread, repeatedly (each await returns its own
// error copy); they are freed once, in Drop, when no reference remains.
unsafe impl Send for Completion {}
// SAFETY: as above.
unsafe impl Sync for Completion {}

impl Completion {
    /// Waits for every replica; the first failure is the error.
    fn wait(&self) -> Result<()> {
        let mut first_error = None;
        for &event in &self.events {
            // SAFETY: the event is live until Drop.
            if let Err(err) = unsafe { self.plugin.api.event_await(event, self.spin) } {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        for &event in &self.events {
            // SAFETY: each event is ours and unused after this. Freeing an event does not cancel
            // the computation.
            let _ = unsafe { self.plugin.api.event_destroy(event) };
        }
    }
}

/// A launched execution: its outputs (usable at once as inputs of later executions) and its
/// completion.
pub struct Execution {
    outputs: Vec<Vec<Buffer>>,
    completion: Arc<Completion>,
}

impl fmt::Debug for Execution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("replicas", &self.outputs.len())
            .finish()
    }
}

impl Execution {
    /// Each replica's outputs, before the computation has finished.
    pub fn outputs(&self) -> &[Vec<Buffer>] {
        &self.outputs
    }

    /// The outputs without waiting: reading one waits for it, and a failed execution reports
    /// its error there.
    pub fn into_outputs(self) -> Vec<Vec<Buffer>> {
        self.outputs
    }

    /// Waits for every replica to finish and returns their outputs; the first failure is the
    /// error.
    pub fn wait(self) -> Result<Vec<Vec<Buffer>>> {
        self.completion.wait()?;
        Ok(self.outputs)
    }
}

fn element_count(dims: &[i64]) -> Result<usize> {
    dims.iter().try_fold(1usize, |count, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| count.checked_mul(d))
            .ok_or_else(|| PjrtError::InvalidArgument(format!("invalid shape {dims:?}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Depths of 64 and 1000 were accepted and made XLA abort the process 40 s later.
    #[test]
    fn max_in_flight_outside_the_safe_range_is_refused() {
        for bad in [0, MAX_IN_FLIGHT + 1, 64, 1000, usize::MAX] {
            let options = ClientOptions {
                max_in_flight: bad,
                ..ClientOptions::cpu(2)
            };
            let err = options.check().unwrap_err();
            assert!(
                matches!(&err, PjrtError::InvalidArgument(m) if m.contains("outside 1..=32")),
                "{bad}: {err:?}"
            );
        }
        for good in [1, DEFAULT_MAX_IN_FLIGHT, MAX_IN_FLIGHT] {
            let options = ClientOptions {
                max_in_flight: good,
                ..ClientOptions::default()
            };
            options.check().unwrap();
        }
    }

    /// A client of the plugin `cargo xtask test` installs (or `PJRT_PLUGIN` names).
    fn cpu_client(spin: Duration) -> Client {
        let plugin = Plugin::discover().unwrap_or_else(|err| panic!("{err}"));
        let options = ClientOptions {
            await_spin: spin,
            ..ClientOptions::default()
        };
        Client::with_devices(plugin, &options, Some(1))
            .unwrap_or_else(|err| panic!("{err}"))
            .0
    }

    /// The bytes of `buffer` read by the plugin's own copy (`PJRT_Buffer_ToHostBuffer`).
    fn copied_by_the_plugin(buffer: &Buffer, bytes: usize) -> Vec<u8> {
        let mut out = vec![0u8; bytes];
        // SAFETY: the buffer is live and holds exactly `bytes` bytes.
        unsafe {
            buffer
                .client
                .plugin
                .api
                .buffer_to_host(buffer.raw, &mut out, Duration::ZERO)
        }
        .unwrap();
        out
    }

    /// The CPU plugin's buffers of every rank take the in-place read, and it returns the bytes
    /// the plugin's own copy returns: uploaded arrays, and outputs of an execution (a transpose
    /// and a product, laid out by the compiler), whether the reader spins or sleeps.
    #[test]
    fn in_place_reads_give_the_plugins_bytes_for_every_rank() {
        use crate::stablehlo::{Builder, TensorType};
        for spin in [Duration::ZERO, DEFAULT_AWAIT_SPIN] {
            let client = cpu_client(spin);
            let device = &client.devices().unwrap()[0];
            let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut buffers = Vec::new();
            for dims in [&[][..], &[24], &[4, 6], &[2, 3, 4]] {
                let n = dims.iter().product::<i64>() as usize;
                buffers.push(client.buffer_from_host(&data[..n], dims, device).unwrap());
            }
            let mut b = Builder::new();
            let x = b.parameter(TensorType::new(ElementType::F32, &[4, 6]));
            let xt = b.transpose(&x, &[1, 0]).unwrap();
            let gram = b.matmul(&xt, &x).unwrap();
            let module = b.build("read_back", &[xt, gram], 1).unwrap();
            let executable = client
                .compile(module.text(), &module.compile_options())
                .unwrap();
            let outputs = executable.execute(&[vec![&buffers[2]]]).unwrap();
            buffers.extend(outputs.into_outputs().remove(0));
            for buffer in &buffers {
                let dims = buffer.dims().unwrap();
                let bytes = element_count(&dims).unwrap() * size_of::<f32>();
                let mut in_place = vec![0u8; bytes];
                // SAFETY: the buffer is live, and only this thread reads it.
                let read = unsafe {
                    client.inner.plugin.api.buffer_read_in_place(
                        buffer.raw,
                        &mut in_place,
                        dims.len(),
                        spin,
                    )
                }
                .unwrap();
                assert!(
                    read,
                    "{dims:?}: the CPU plugin's buffer was not read in place"
                );
                assert_eq!(in_place, copied_by_the_plugin(buffer, bytes), "{dims:?}");
                let values = buffer.to_vec::<f32>().unwrap();
                assert_eq!(values.len() * size_of::<f32>(), bytes);
            }
            let n = data.len();
            assert_eq!(buffers[3].to_vec::<f32>().unwrap(), data[..n]);
        }
    }
}
