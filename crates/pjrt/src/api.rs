//! Checked layer: one `unsafe fn` per PJRT function this crate uses, each returning a
//! [`Result`] whose error carries the plugin's message (read with `PJRT_Error_Message`, then
//! freed with `PJRT_Error_Destroy`). Pointers in and out stay raw; ownership is
//! [`crate::runtime`]'s business.
//!
//! Every function here is `unsafe` for the same reason: the handles passed in must be live
//! handles of this plugin, and pointer arguments must be valid for the call.

use std::ffi::{c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{ErrorCode, PjrtError, Result};
use crate::sys::{self, Args, index};

/// One value of a client create option, borrowed for the call (`PJRT_NamedValue`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum OptionValue<'a> {
    Str(&'a str),
    Int64(i64),
    Int64List(&'a [i64]),
    Float(f32),
    Bool(bool),
}

/// A loaded plugin's function table. The library stays loaded for as long as this lives.
pub(crate) struct Api {
    // Never read: holding it keeps the plugin mapped while `table` points into it.
    _library: libloading::Library,
    table: *const sys::ApiHeader,
    functions: usize,
    pub(crate) major: i32,
    pub(crate) minor: i32,
    pub(crate) path: PathBuf,
}

// SAFETY: the table is immutable after GetPjrtApi returns, and PJRT functions may be called from
// any thread (the C API makes no thread-affinity demands; JAX calls it from many threads).
unsafe impl Send for Api {}
// SAFETY: as above; `&Api` only reads the immutable table.
unsafe impl Sync for Api {}

/// The plugin's three error functions, which read and free a `PJRT_Error`.
///
/// Reading an error must not go through [`Api::call`]: when `PJRT_Error_GetCode` itself fails,
/// handling its error would read that error's code with `PJRT_Error_GetCode` again, and so on
/// until the stack overflows. Here a failing `GetCode` costs only the code.
struct ErrorFunctions {
    destroy: Option<sys::VoidFn<sys::ErrorDestroyArgs>>,
    message: Option<sys::VoidFn<sys::ErrorMessageArgs>>,
    get_code: Option<sys::CheckedFn<sys::ErrorGetCodeArgs>>,
}

/// `PJRT_Error_Code` `UNKNOWN`: the code of an error whose own code cannot be read.
const UNKNOWN: ErrorCode = ErrorCode(2);

/// Polls of an event between two checks of the clock (and yields of the core) while
/// [`Api::event_await`] spins.
const SPIN_POLLS_PER_YIELD: u32 = 64;

impl ErrorFunctions {
    /// Reads `error`'s message and code, then frees it (and any error `GetCode` returned,
    /// unread).
    ///
    /// # Safety
    /// `error` must be a live `PJRT_Error*` of the plugin these functions belong to.
    unsafe fn take(&self, error: *mut sys::Error, call: &'static str) -> PjrtError {
        let mut message = sys::ErrorMessageArgs::new();
        message.error = error;
        let text = match self.message {
            Some(f) => {
                // SAFETY: message.error is live; the plugin fills message/message_size.
                unsafe { f(&mut message) };
                // SAFETY: the message lives as long as `error`, which is freed only below.
                unsafe { string(message.message, message.message_size) }
            }
            None => String::from("(the plugin gives no message)"),
        };
        let mut get_code = sys::ErrorGetCodeArgs::new();
        get_code.error = error;
        let code = match self.get_code {
            Some(f) => {
                // SAFETY: GetCode reads the live error.
                let failed = unsafe { f(&mut get_code) };
                if failed.is_null() {
                    ErrorCode(get_code.code)
                } else {
                    if failed != error {
                        // SAFETY: a fresh error owned by us, freed without reading it.
                        unsafe { self.destroy(failed) };
                    }
                    UNKNOWN
                }
            }
            None => UNKNOWN,
        };
        // SAFETY: the error is not used after.
        unsafe { self.destroy(error) };
        PjrtError::Api {
            call,
            code,
            message: text,
        }
    }

    /// Frees `error`.
    ///
    /// # Safety
    /// `error` must be a live `PJRT_Error*` of this plugin, not used after.
    unsafe fn destroy(&self, error: *mut sys::Error) {
        if let Some(f) = self.destroy {
            let mut destroy = sys::ErrorDestroyArgs::new();
            destroy.error = error;
            // SAFETY: destroy.error is live (the caller's contract).
            unsafe { f(&mut destroy) };
        }
    }
}

impl Api {
    /// Loads the plugin at `path`, checks its API version and table length, and initializes it.
    ///
    /// # Safety
    /// Loading runs the library's initializers: `path` must be a PJRT plugin, and it must be
    /// loaded (and initialized) only once per process; [`crate::Plugin::load`] caches for that.
    pub(crate) unsafe fn load(path: &Path) -> Result<Api> {
        // SAFETY: the caller vouches that `path` is a PJRT plugin whose initializers are sound.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|source| PjrtError::Load {
                path: path.to_owned(),
                source,
            })?;
        type GetPjrtApi = unsafe extern "C" fn() -> *const sys::ApiHeader;
        // SAFETY: the symbol, where present, has the C signature `const PJRT_Api* GetPjrtApi()`.
        let get_api = unsafe { library.get::<GetPjrtApi>(b"GetPjrtApi\0") }.map_err(|_| {
            PjrtError::NotAPlugin {
                path: path.to_owned(),
            }
        })?;
        // SAFETY: GetPjrtApi takes nothing and returns a pointer to a static table.
        let table = unsafe { get_api() };
        if table.is_null() {
            return Err(PjrtError::NotAPlugin {
                path: path.to_owned(),
            });
        }
        // SAFETY: a non-null table starts with the header (size, extension, version).
        let header = unsafe { &*table };
        let functions = header.struct_size.saturating_sub(sys::FUNCTIONS_OFFSET) / 8;
        let (major, minor) = (header.version.major_version, header.version.minor_version);
        if major != sys::API_MAJOR {
            return Err(PjrtError::VersionMismatch {
                path: path.to_owned(),
                major,
                minor,
                expected_major: sys::API_MAJOR,
                checked_minor: sys::API_MINOR_CHECKED,
            });
        }
        if functions <= index::HIGHEST_USED {
            return Err(PjrtError::TableTooShort {
                path: path.to_owned(),
                major,
                minor,
                functions,
                needed: index::HIGHEST_USED,
            });
        }
        let api = Api {
            _library: library,
            table,
            functions,
            major,
            minor,
            path: path.to_owned(),
        };
        let mut args = sys::PluginInitializeArgs::new();
        // SAFETY: the table was checked to hold the function; args is a valid initialized struct.
        unsafe {
            api.call(
                index::PLUGIN_INITIALIZE,
                "PJRT_Plugin_Initialize",
                &mut args,
            )
        }?;
        Ok(api)
    }

    /// The function pointer at `index`, or `None` where the plugin leaves it null.
    fn function(&self, index: usize) -> Option<*const c_void> {
        if index >= self.functions {
            return None;
        }
        // SAFETY: `index < functions`, so the slot lies inside the table the plugin sized.
        let slot = unsafe {
            self.table
                .cast::<u8>()
                .add(sys::FUNCTIONS_OFFSET + 8 * index)
                .cast::<*const c_void>()
        };
        // SAFETY: the slot is in bounds and pointer-aligned (the table is an array of pointers).
        let f = unsafe { slot.read() };
        (!f.is_null()).then_some(f)
    }

    /// Calls the checked function at `index` with `args`; a returned error becomes `Err`.
    ///
    /// # Safety
    /// `A` must be the argument struct of the function at `index`, with valid inputs set.
    pub(crate) unsafe fn call<A: Args>(
        &self,
        index: usize,
        name: &'static str,
        args: &mut A,
    ) -> Result<()> {
        let Some(f) = self.function(index) else {
            return Err(PjrtError::Api {
                call: name,
                code: ErrorCode(12),
                message: format!(
                    "plugin {} (C API {}.{}) does not implement it",
                    self.path.display(),
                    self.major,
                    self.minor
                ),
            });
        };
        // SAFETY: the slot holds a function of type `PJRT_Error* (A*)` (caller's contract).
        let f: sys::CheckedFn<A> = unsafe { std::mem::transmute::<*const c_void, _>(f) };
        // SAFETY: `args` is a live, initialized argument struct of the function's type.
        let error = unsafe { f(args) };
        if error.is_null() {
            Ok(())
        } else {
            // SAFETY: a non-null return is a fresh PJRT_Error owned by us.
            Err(unsafe { self.take_error(error, name) })
        }
    }

    /// Reads an error's code and message, then frees it.
    ///
    /// # Safety
    /// `error` must be a live `PJRT_Error*` of this plugin; it is freed here.
    pub(crate) unsafe fn take_error(
        &self,
        error: *mut sys::Error,
        call: &'static str,
    ) -> PjrtError {
        // SAFETY: slots 0, 1 and 2 hold PJRT_Error_Destroy, PJRT_Error_Message and
        // PJRT_Error_GetCode, of these types.
        let functions = unsafe {
            ErrorFunctions {
                destroy: self
                    .function(index::ERROR_DESTROY)
                    .map(|f| std::mem::transmute(f)),
                message: self
                    .function(index::ERROR_MESSAGE)
                    .map(|f| std::mem::transmute(f)),
                get_code: self
                    .function(index::ERROR_GET_CODE)
                    .map(|f| std::mem::transmute(f)),
            }
        };
        // SAFETY: the caller's contract.
        unsafe { functions.take(error, call) }
    }

    // ---- events ------------------------------------------------------------------------------

    /// Blocks until `event` is ready and returns its status. Does not free it.
    ///
    /// For up to `spin` it polls the event (`PJRT_Event_IsReady`) instead of sleeping: a short
    /// computation on the plugin's threads ends within microseconds, and a sleeping caller would
    /// pay a futex wake-up (10–20 µs on a busy 2-core machine) on top. After `spin`, or where the
    /// plugin cannot be polled, it blocks in `PJRT_Event_Await`.
    pub(crate) unsafe fn event_await(&self, event: *mut sys::Event, spin: Duration) -> Result<()> {
        if !spin.is_zero() && self.function(index::EVENT_IS_READY).is_some() {
            let start = Instant::now();
            let mut polls = 0u32;
            loop {
                let mut ready = sys::EventIsReadyArgs::new();
                ready.event = event;
                // SAFETY: caller passes a live event.
                unsafe { self.call(index::EVENT_IS_READY, "PJRT_Event_IsReady", &mut ready) }?;
                if ready.is_ready != 0 {
                    break;
                }
                polls = polls.wrapping_add(1);
                // Give the core away now and then: on a machine with fewer cores than busy
                // threads, the thread that would make the event ready may be waiting for it.
                if polls.is_multiple_of(SPIN_POLLS_PER_YIELD) {
                    if start.elapsed() >= spin {
                        break;
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        let mut args = sys::EventArgs::new();
        args.event = event;
        // SAFETY: caller passes a live event. On a ready event this returns its status at once.
        unsafe { self.call(index::EVENT_AWAIT, "PJRT_Event_Await", &mut args) }
    }

    /// Waits for `event` as [`Api::event_await`] does, then frees it; the wait's error wins.
    ///
    /// # Safety
    /// `event` must be a live event that the caller owns and uses for nothing else.
    pub(crate) unsafe fn event_await_and_destroy(
        &self,
        event: *mut sys::Event,
        spin: Duration,
    ) -> Result<()> {
        // SAFETY: caller's contract.
        let awaited = unsafe { self.event_await(event, spin) };
        // SAFETY: caller's contract; the event is not used after this.
        let destroyed = unsafe { self.event_destroy(event) };
        awaited.and(destroyed)
    }

    /// Frees `event` (null is allowed).
    pub(crate) unsafe fn event_destroy(&self, event: *mut sys::Event) -> Result<()> {
        let mut args = sys::EventArgs::new();
        args.event = event;
        // SAFETY: caller passes a live event that it no longer uses, or null.
        unsafe { self.call(index::EVENT_DESTROY, "PJRT_Event_Destroy", &mut args) }
    }

    // ---- client ------------------------------------------------------------------------------

    /// Creates a client with the given `(name, int64)` options.
    pub(crate) unsafe fn client_create(
        &self,
        options: &[(&str, OptionValue<'_>)],
    ) -> Result<*mut sys::Client> {
        let values: Vec<sys::NamedValue> = options
            .iter()
            .map(|(name, value)| {
                let mut v = sys::NamedValue::new();
                v.name = name.as_ptr().cast::<c_char>();
                v.name_size = name.len();
                v.value_size = 1;
                match *value {
                    OptionValue::Str(text) => {
                        v.kind = sys::NAMED_VALUE_STRING;
                        v.value.string = text.as_ptr().cast::<c_char>();
                        v.value_size = text.len();
                    }
                    OptionValue::Int64(n) => {
                        v.kind = sys::NAMED_VALUE_INT64;
                        v.value.int64 = n;
                    }
                    OptionValue::Int64List(list) => {
                        v.kind = sys::NAMED_VALUE_INT64_LIST;
                        v.value.int64_array = list.as_ptr();
                        v.value_size = list.len();
                    }
                    OptionValue::Float(x) => {
                        v.kind = sys::NAMED_VALUE_FLOAT;
                        v.value.float = x;
                    }
                    OptionValue::Bool(b) => {
                        v.kind = sys::NAMED_VALUE_BOOL;
                        v.value.boolean = b;
                    }
                }
                v
            })
            .collect();
        let mut args = sys::ClientCreateArgs::new();
        args.create_options = values.as_ptr();
        args.num_options = values.len();
        // SAFETY: `values` and the names, strings and lists it points to outlive the call.
        unsafe { self.call(index::CLIENT_CREATE, "PJRT_Client_Create", &mut args) }?;
        Ok(args.client)
    }

    pub(crate) unsafe fn client_destroy(&self, client: *mut sys::Client) -> Result<()> {
        let mut args = sys::ClientDestroyArgs::new();
        args.client = client;
        // SAFETY: caller passes a live client nothing else uses any more.
        unsafe { self.call(index::CLIENT_DESTROY, "PJRT_Client_Destroy", &mut args) }
    }

    pub(crate) unsafe fn client_platform_name(&self, client: *mut sys::Client) -> Result<String> {
        let mut args = sys::ClientPlatformNameArgs::new();
        args.client = client;
        // SAFETY: caller passes a live client.
        unsafe {
            self.call(
                index::CLIENT_PLATFORM_NAME,
                "PJRT_Client_PlatformName",
                &mut args,
            )
        }?;
        // SAFETY: the name is owned by the live client.
        Ok(unsafe { string(args.platform_name, args.platform_name_size) })
    }

    /// The client's addressable devices (owned by the client).
    pub(crate) unsafe fn client_addressable_devices(
        &self,
        client: *mut sys::Client,
    ) -> Result<Vec<*mut sys::Device>> {
        let mut args = sys::ClientAddressableDevicesArgs::new();
        args.client = client;
        // SAFETY: caller passes a live client.
        unsafe {
            self.call(
                index::CLIENT_ADDRESSABLE_DEVICES,
                "PJRT_Client_AddressableDevices",
                &mut args,
            )
        }?;
        if args.num_addressable_devices == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned an array of that many device pointers, owned by the client.
        let devices = unsafe {
            std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices)
        };
        Ok(devices.to_vec())
    }

    /// Compiles `code` in `format` with serialized `CompileOptionsProto` bytes.
    pub(crate) unsafe fn client_compile(
        &self,
        client: *mut sys::Client,
        code: &str,
        format: &str,
        options: &[u8],
    ) -> Result<*mut sys::LoadedExecutable> {
        let mut program = sys::Program::new();
        // The plugin only reads `code` when compiling; the field is mutable because other calls
        // write into it.
        program.code = code.as_ptr().cast::<c_char>().cast_mut();
        program.code_size = code.len();
        program.format = format.as_ptr().cast::<c_char>();
        program.format_size = format.len();
        let mut args = sys::ClientCompileArgs::new();
        args.client = client;
        args.program = &program;
        args.compile_options = options.as_ptr().cast::<c_char>();
        args.compile_options_size = options.len();
        // SAFETY: program, code, format and options outlive the call; the client is live.
        unsafe { self.call(index::CLIENT_COMPILE, "PJRT_Client_Compile", &mut args) }?;
        Ok(args.executable)
    }

    /// Copies `data` (dense, row-major, `dims`) to `device` during the call.
    pub(crate) unsafe fn client_buffer_from_host(
        &self,
        client: *mut sys::Client,
        data: *const c_void,
        element_type: c_int,
        dims: &[i64],
        device: *mut sys::Device,
    ) -> Result<*mut sys::Buffer> {
        let mut args = sys::ClientBufferFromHostBufferArgs::new();
        args.client = client;
        args.data = data;
        args.element_type = element_type;
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = sys::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
        args.device = device;
        // SAFETY: data holds product(dims) elements (caller's contract) and, with these
        // semantics, is only read during the call.
        unsafe {
            self.call(
                index::CLIENT_BUFFER_FROM_HOST_BUFFER,
                "PJRT_Client_BufferFromHostBuffer",
                &mut args,
            )
        }?;
        // The copy is done when the call returns, so the "done with host buffer" event only
        // needs freeing.
        // SAFETY: the event, if any, is ours and unused.
        unsafe { self.event_destroy(args.done_with_host_buffer) }?;
        Ok(args.buffer)
    }

    // ---- devices -----------------------------------------------------------------------------

    /// A device's id and kind, from its description.
    pub(crate) unsafe fn device_id_and_kind(
        &self,
        device: *mut sys::Device,
    ) -> Result<(i32, String)> {
        let mut description = sys::DeviceGetDescriptionArgs::new();
        description.device = device;
        // SAFETY: caller passes a live device.
        unsafe {
            self.call(
                index::DEVICE_GET_DESCRIPTION,
                "PJRT_Device_GetDescription",
                &mut description,
            )
        }?;
        let mut id = sys::DeviceDescriptionIdArgs::new();
        id.device_description = description.device_description;
        // SAFETY: the description is owned by the live device.
        unsafe {
            self.call(
                index::DEVICE_DESCRIPTION_ID,
                "PJRT_DeviceDescription_Id",
                &mut id,
            )
        }?;
        let mut kind = sys::DeviceDescriptionKindArgs::new();
        kind.device_description = description.device_description;
        // SAFETY: as above.
        unsafe {
            self.call(
                index::DEVICE_DESCRIPTION_KIND,
                "PJRT_DeviceDescription_Kind",
                &mut kind,
            )
        }?;
        // SAFETY: the kind string is owned by the live device.
        Ok((id.id, unsafe {
            string(kind.device_kind, kind.device_kind_size)
        }))
    }

    // ---- executables -------------------------------------------------------------------------

    /// `(num_replicas, num_outputs)` of a loaded executable.
    pub(crate) unsafe fn loaded_executable_counts(
        &self,
        loaded: *mut sys::LoadedExecutable,
    ) -> Result<(usize, usize)> {
        let mut get = sys::LoadedExecutableGetExecutableArgs::new();
        get.loaded_executable = loaded;
        // SAFETY: caller passes a live loaded executable.
        unsafe {
            self.call(
                index::LOADED_EXECUTABLE_GET_EXECUTABLE,
                "PJRT_LoadedExecutable_GetExecutable",
                &mut get,
            )
        }?;
        let executable = get.executable;
        let mut replicas = sys::ExecutableCountArgs::new();
        replicas.executable = executable;
        let mut outputs = sys::ExecutableCountArgs::new();
        outputs.executable = executable;
        // SAFETY: `executable` is live until destroyed below.
        let counted = unsafe {
            self.call(
                index::EXECUTABLE_NUM_REPLICAS,
                "PJRT_Executable_NumReplicas",
                &mut replicas,
            )
        }
        .and_then(|()| {
            // SAFETY: as above.
            unsafe {
                self.call(
                    index::EXECUTABLE_NUM_OUTPUTS,
                    "PJRT_Executable_NumOutputs",
                    &mut outputs,
                )
            }
        });
        let mut destroy = sys::ExecutableDestroyArgs::new();
        destroy.executable = executable;
        // SAFETY: GetExecutable handed us this executable to free; it is not used after.
        let destroyed = unsafe {
            self.call(
                index::EXECUTABLE_DESTROY,
                "PJRT_Executable_Destroy",
                &mut destroy,
            )
        };
        counted?;
        destroyed?;
        Ok((replicas.count, outputs.count))
    }

    /// The devices a loaded executable runs on, replica by replica (owned by the client).
    pub(crate) unsafe fn loaded_executable_devices(
        &self,
        loaded: *mut sys::LoadedExecutable,
    ) -> Result<Vec<*mut sys::Device>> {
        let mut args = sys::LoadedExecutableAddressableDevicesArgs::new();
        args.executable = loaded;
        // SAFETY: caller passes a live loaded executable.
        unsafe {
            self.call(
                index::LOADED_EXECUTABLE_ADDRESSABLE_DEVICES,
                "PJRT_LoadedExecutable_AddressableDevices",
                &mut args,
            )
        }?;
        if args.num_addressable_devices == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned that many device pointers, owned by the client.
        let devices = unsafe {
            std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices)
        };
        Ok(devices.to_vec())
    }

    pub(crate) unsafe fn loaded_executable_destroy(
        &self,
        loaded: *mut sys::LoadedExecutable,
    ) -> Result<()> {
        let mut args = sys::LoadedExecutableDestroyArgs::new();
        args.executable = loaded;
        // SAFETY: caller passes a live executable that nothing uses any more.
        unsafe {
            self.call(
                index::LOADED_EXECUTABLE_DESTROY,
                "PJRT_LoadedExecutable_Destroy",
                &mut args,
            )
        }
    }

    /// Launches `loaded` on every device: `arguments[d]` are device `d`'s inputs; returns each
    /// device's outputs (`num_outputs` each) and completion event, without waiting.
    pub(crate) unsafe fn loaded_executable_execute(
        &self,
        loaded: *mut sys::LoadedExecutable,
        arguments: &[Vec<*mut sys::Buffer>],
        num_outputs: usize,
    ) -> Result<(Vec<Vec<*mut sys::Buffer>>, Vec<*mut sys::Event>)> {
        let num_args = arguments.first().map_or(0, Vec::len);
        let argument_lists: Vec<*const *mut sys::Buffer> =
            arguments.iter().map(|list| list.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut sys::Buffer>> =
            vec![vec![std::ptr::null_mut(); num_outputs]; arguments.len()];
        let output_lists: Vec<*mut *mut sys::Buffer> =
            outputs.iter_mut().map(|list| list.as_mut_ptr()).collect();
        let mut events: Vec<*mut sys::Event> = vec![std::ptr::null_mut(); arguments.len()];
        let mut options = sys::ExecuteOptions::new();
        let mut args = sys::LoadedExecutableExecuteArgs::new();
        args.executable = loaded;
        args.options = &mut options;
        args.argument_lists = argument_lists.as_ptr();
        args.num_devices = arguments.len();
        args.num_args = num_args;
        args.output_lists = output_lists.as_ptr();
        args.device_complete_events = events.as_mut_ptr();
        // SAFETY: every list has num_devices rows of num_args live buffers (caller's contract,
        // rows checked equal by the caller); the output rows have room for num_outputs buffers;
        // all vectors outlive the call and are not moved while the plugin writes.
        unsafe {
            self.call(
                index::LOADED_EXECUTABLE_EXECUTE,
                "PJRT_LoadedExecutable_Execute",
                &mut args,
            )
        }?;
        Ok((outputs, events))
    }

    // ---- buffers -----------------------------------------------------------------------------

    pub(crate) unsafe fn buffer_destroy(&self, buffer: *mut sys::Buffer) -> Result<()> {
        let mut args = sys::BufferDestroyArgs::new();
        args.buffer = buffer;
        // SAFETY: caller passes a live buffer that nothing uses any more.
        unsafe { self.call(index::BUFFER_DESTROY, "PJRT_Buffer_Destroy", &mut args) }
    }

    /// The device a buffer lives on (owned by the client).
    pub(crate) unsafe fn buffer_device(
        &self,
        buffer: *mut sys::Buffer,
    ) -> Result<*mut sys::Device> {
        let mut args = sys::BufferDeviceArgs::new();
        args.buffer = buffer;
        // SAFETY: caller passes a live buffer.
        unsafe { self.call(index::BUFFER_DEVICE, "PJRT_Buffer_Device", &mut args) }?;
        Ok(args.device)
    }

    pub(crate) unsafe fn buffer_element_type(&self, buffer: *mut sys::Buffer) -> Result<c_int> {
        let mut args = sys::BufferElementTypeArgs::new();
        args.buffer = buffer;
        // SAFETY: caller passes a live buffer.
        unsafe {
            self.call(
                index::BUFFER_ELEMENT_TYPE,
                "PJRT_Buffer_ElementType",
                &mut args,
            )
        }?;
        Ok(args.element_type)
    }

    pub(crate) unsafe fn buffer_dimensions(&self, buffer: *mut sys::Buffer) -> Result<Vec<i64>> {
        let mut args = sys::BufferDimensionsArgs::new();
        args.buffer = buffer;
        // SAFETY: caller passes a live buffer.
        unsafe {
            self.call(
                index::BUFFER_DIMENSIONS,
                "PJRT_Buffer_Dimensions",
                &mut args,
            )
        }?;
        if args.num_dims == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned `num_dims` dimensions owned by the live buffer.
        Ok(unsafe { std::slice::from_raw_parts(args.dims, args.num_dims) }.to_vec())
    }

    /// Copies a buffer that lives in host memory (the CPU plugin's buffers) straight from that
    /// memory into `dst`, after waiting for the computation that produces it: no copy is queued
    /// on the plugin's threads and waited for, which costs tens of microseconds per read on a
    /// busy 2-core machine. JAX hands CPU arrays to NumPy the same way.
    ///
    /// Returns `Ok(false)`, having copied nothing, when the in-place read does not apply: the
    /// buffer is not in host memory, the plugin lacks one of the calls it needs or answers one
    /// with an error, or the bytes are not a dense row-major array of `dst.len()` bytes (`rank`
    /// dimensions). The caller then copies with [`Api::buffer_to_host`]. An execution that
    /// failed is reported as `Err`.
    ///
    /// # Safety
    /// `buffer` must be a live buffer of this plugin, and no other thread may call this for the
    /// same buffer at the same time: the C API keeps a buffer's external references in a list
    /// it does not lock.
    pub(crate) unsafe fn buffer_read_in_place(
        &self,
        buffer: *mut sys::Buffer,
        dst: &mut [u8],
        rank: usize,
        spin: Duration,
    ) -> Result<bool> {
        let needed = [
            index::BUFFER_IS_ON_CPU,
            index::BUFFER_READY_EVENT,
            index::BUFFER_ON_DEVICE_SIZE_IN_BYTES,
            index::BUFFER_INCREASE_EXTERNAL_REFERENCE_COUNT,
            index::BUFFER_DECREASE_EXTERNAL_REFERENCE_COUNT,
            index::BUFFER_OPAQUE_DEVICE_MEMORY_DATA_POINTER,
        ];
        if needed.iter().any(|&i| self.function(i).is_none()) {
            return Ok(false);
        }
        let mut on_cpu = sys::BufferIsOnCpuArgs::new();
        on_cpu.buffer = buffer;
        // A call that fails here only means this read is not for this plugin: the plugin's own
        // copy still works, and reports any real problem.
        // SAFETY: caller passes a live buffer.
        let asked =
            unsafe { self.call(index::BUFFER_IS_ON_CPU, "PJRT_Buffer_IsOnCpu", &mut on_cpu) };
        if asked.is_err() || on_cpu.is_on_cpu == 0 {
            return Ok(false);
        }
        // The external reference keeps the memory where it is (not freed, donated or moved)
        // until it is dropped below, whatever other threads do with the buffer meanwhile.
        let mut reference = sys::BufferExternalReferenceArgs::new();
        reference.buffer = buffer;
        // SAFETY: as above; no other thread changes this buffer's references (caller's contract).
        let referenced = unsafe {
            self.call(
                index::BUFFER_INCREASE_EXTERNAL_REFERENCE_COUNT,
                "PJRT_Buffer_IncreaseExternalReferenceCount",
                &mut reference,
            )
        };
        if referenced.is_err() {
            return Ok(false);
        }
        // SAFETY: the buffer is live and referenced.
        let copied = unsafe { self.copy_referenced_host_buffer(buffer, dst, rank, spin) };
        let mut release = sys::BufferExternalReferenceArgs::new();
        release.buffer = buffer;
        // SAFETY: the reference taken above is dropped once.
        let released = unsafe {
            self.call(
                index::BUFFER_DECREASE_EXTERNAL_REFERENCE_COUNT,
                "PJRT_Buffer_DecreaseExternalReferenceCount",
                &mut release,
            )
        };
        let copied = copied?;
        released?;
        Ok(copied)
    }

    /// [`Api::buffer_read_in_place`]'s work while it holds an external reference.
    ///
    /// # Safety
    /// `buffer` must be a live host-memory buffer of this plugin with an external reference.
    unsafe fn copy_referenced_host_buffer(
        &self,
        buffer: *mut sys::Buffer,
        dst: &mut [u8],
        rank: usize,
        spin: Duration,
    ) -> Result<bool> {
        let mut ready = sys::BufferReadyEventArgs::new();
        ready.buffer = buffer;
        // SAFETY: caller passes a live buffer.
        let asked = unsafe {
            self.call(
                index::BUFFER_READY_EVENT,
                "PJRT_Buffer_ReadyEvent",
                &mut ready,
            )
        };
        if asked.is_err() {
            return Ok(false);
        }
        // SAFETY: the event is ours and used for nothing else.
        unsafe { self.event_await_and_destroy(ready.event, spin) }?;

        let mut size = sys::BufferOnDeviceSizeArgs::new();
        size.buffer = buffer;
        // SAFETY: as above.
        let asked = unsafe {
            self.call(
                index::BUFFER_ON_DEVICE_SIZE_IN_BYTES,
                "PJRT_Buffer_OnDeviceSizeInBytes",
                &mut size,
            )
        };
        // Padding or a tiled layout changes the size; only a dense array is read in place.
        if asked.is_err() || size.on_device_size_in_bytes != dst.len() {
            return Ok(false);
        }
        // Up to one dimension, every layout is row-major; beyond, the layout must say so.
        // SAFETY: as above.
        if rank > 1 && !unsafe { self.buffer_is_row_major(buffer, rank) } {
            return Ok(false);
        }
        let mut data = sys::BufferOpaqueDeviceMemoryDataPointerArgs::new();
        data.buffer = buffer;
        // SAFETY: as above.
        let asked = unsafe {
            self.call(
                index::BUFFER_OPAQUE_DEVICE_MEMORY_DATA_POINTER,
                "PJRT_Buffer_OpaqueDeviceMemoryDataPointer",
                &mut data,
            )
        };
        if asked.is_err() {
            return Ok(false);
        }
        if dst.is_empty() {
            return Ok(true);
        }
        if data.device_memory_ptr.is_null() {
            return Ok(false);
        }
        // SAFETY: the buffer is in host memory (IsOnCpu), computed (its ready event fired),
        // `dst.len()` bytes long (its on-device size), and pinned there by the caller's external
        // reference; nothing writes a computed buffer, so reading it races with nothing.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.device_memory_ptr.cast::<u8>(),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        Ok(true)
    }

    /// Whether the buffer's layout is dense row-major (`minor_to_major` = rank-1, …, 0, no
    /// tiles). A plugin that cannot say is taken to say no.
    ///
    /// # Safety
    /// `buffer` must be a live buffer of this plugin.
    unsafe fn buffer_is_row_major(&self, buffer: *mut sys::Buffer, rank: usize) -> bool {
        let mut args = sys::BufferGetMemoryLayoutArgs::new();
        args.buffer = buffer;
        args.layout.struct_size = size_of::<sys::MemoryLayout>();
        // SAFETY: caller passes a live buffer.
        let asked = unsafe {
            self.call(
                index::BUFFER_GET_MEMORY_LAYOUT,
                "PJRT_Buffer_GetMemoryLayout",
                &mut args,
            )
        };
        let layout = &args.layout;
        if asked.is_err()
            || layout.kind != sys::MEMORY_LAYOUT_TILED
            || layout.num_tiles != 0
            || layout.minor_to_major_size != rank
            || layout.minor_to_major.is_null()
        {
            return false;
        }
        // SAFETY: the plugin returned `minor_to_major_size` entries owned by the live buffer.
        let minor_to_major = unsafe {
            std::slice::from_raw_parts(layout.minor_to_major, layout.minor_to_major_size)
        };
        minor_to_major
            .iter()
            .zip((0..rank).rev())
            .all(|(&dim, expected)| dim == expected as i64)
    }

    /// Copies a buffer to host memory: `dst` must hold exactly the buffer's bytes. Waits for the
    /// copy (and so for the computation producing the buffer).
    pub(crate) unsafe fn buffer_to_host(
        &self,
        buffer: *mut sys::Buffer,
        dst: &mut [u8],
        spin: Duration,
    ) -> Result<()> {
        let mut size = sys::BufferToHostBufferArgs::new();
        size.src = buffer;
        // SAFETY: a null dst only asks for the size.
        unsafe {
            self.call(
                index::BUFFER_TO_HOST_BUFFER,
                "PJRT_Buffer_ToHostBuffer",
                &mut size,
            )
        }?;
        // SAFETY: a size query should return no event; one that does is ours to free.
        unsafe { self.event_destroy(size.event) }?;
        if size.dst_size != dst.len() {
            return Err(PjrtError::InvalidArgument(format!(
                "the buffer holds {} bytes, the host slice {}",
                size.dst_size,
                dst.len()
            )));
        }
        let mut args = sys::BufferToHostBufferArgs::new();
        args.src = buffer;
        args.dst = dst.as_mut_ptr().cast::<c_void>();
        args.dst_size = dst.len();
        // SAFETY: dst has room for the buffer's bytes and stays borrowed until the event is
        // awaited below.
        unsafe {
            self.call(
                index::BUFFER_TO_HOST_BUFFER,
                "PJRT_Buffer_ToHostBuffer",
                &mut args,
            )
        }?;
        // SAFETY: the event is ours and used for nothing else.
        unsafe { self.event_await_and_destroy(args.event, spin) }
    }
}

/// Copies a `(pointer, length)` string the plugin owns.
///
/// # Safety
/// `ptr` must point to `len` readable bytes (or be null with any `len`).
unsafe fn string(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: caller's contract.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// What the fake error functions saw: GetCode calls and destroyed errors, by address.
    static SEEN: Mutex<(usize, Vec<usize>)> = Mutex::new((0, Vec::new()));

    /// Two distinct addresses standing for PJRT errors; never dereferenced.
    static ERRORS: [u8; 2] = [0, 0];

    fn error(i: usize) -> *mut sys::Error {
        (&ERRORS[i] as *const u8).cast_mut().cast()
    }

    unsafe extern "C" fn message(args: *mut sys::ErrorMessageArgs) {
        const TEXT: &str = "the step failed";
        // SAFETY: `take` passes its live argument struct.
        let args = unsafe { &mut *args };
        args.message = TEXT.as_ptr().cast();
        args.message_size = TEXT.len();
    }

    /// A `PJRT_Error_GetCode` that fails every time, returning the second error.
    unsafe extern "C" fn failing_get_code(_: *mut sys::ErrorGetCodeArgs) -> *mut sys::Error {
        SEEN.lock().unwrap().0 += 1;
        error(1)
    }

    unsafe extern "C" fn destroy(args: *mut sys::ErrorDestroyArgs) {
        // SAFETY: as above.
        let freed = unsafe { (*args).error } as usize;
        SEEN.lock().unwrap().1.push(freed);
    }

    /// Reading an error once went through the checked call path, so a failing `GetCode` read its
    /// own error with `GetCode` again, without end, until the stack overflowed.
    #[test]
    fn a_failing_get_code_gives_code_unknown_without_recursing() {
        let functions = ErrorFunctions {
            destroy: Some(destroy),
            message: Some(message),
            get_code: Some(failing_get_code),
        };
        // SAFETY: the fake functions accept these stand-in errors.
        let err = unsafe { functions.take(error(0), "PJRT_Client_Compile") };
        assert!(
            matches!(
                &err,
                PjrtError::Api { call: "PJRT_Client_Compile", code: UNKNOWN, message }
                    if message == "the step failed"
            ),
            "{err:?}"
        );
        let (get_code_calls, destroyed) = SEEN.lock().unwrap().clone();
        assert_eq!(get_code_calls, 1);
        // GetCode's own error and the original, each freed once.
        assert_eq!(destroyed, [error(1) as usize, error(0) as usize]);
    }
}
