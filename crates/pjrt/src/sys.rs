//! Raw layer: the PJRT C API's `#[repr(C)]` argument structs and function-table indices, written
//! from `xla/pjrt/c/pjrt_c_api.h` (openxla/xla).
//!
//! Only the structs this crate calls are defined. Layouts follow the header at API 0.94 and were
//! checked against the 0.115 CPU plugin, which reports the size it expects for every struct the
//! crate passes ("expected 88, got …"); the `size_of` assertions at the bottom pin those sizes.
//! Plugins accept structs at least as large as their own, and the function table and every struct
//! only grow at their ends, so these definitions serve older 0.x plugins too.
//!
//! Nothing here is safe to call: [`crate::api`] wraps each call and checks its error.

#![allow(missing_docs)] // field-for-field mirrors of the C header, documented there

use std::ffi::{c_char, c_int, c_void};

/// The major version this crate speaks; a plugin with another major is refused.
pub(crate) const API_MAJOR: c_int = 0;
/// The version whose layouts were checked (see the module doc).
pub(crate) const API_MINOR_CHECKED: c_int = 115;

/// Opaque handles.
#[repr(C)]
pub(crate) struct Error {
    _private: [u8; 0],
}
#[repr(C)]
pub(crate) struct Client {
    _private: [u8; 0],
}
#[repr(C)]
pub(crate) struct Device {
    _private: [u8; 0],
}
#[repr(C)]
pub(crate) struct DeviceDescription {
    _private: [u8; 0],
}
#[repr(C)]
pub(crate) struct Event {
    _private: [u8; 0],
}
#[repr(C)]
pub(crate) struct Executable {
    _private: [u8; 0],
}
#[repr(C)]
pub(crate) struct LoadedExecutable {
    _private: [u8; 0],
}
#[repr(C)]
pub(crate) struct Buffer {
    _private: [u8; 0],
}

/// `PJRT_Api_Version`, embedded in the API table's header.
#[repr(C)]
pub(crate) struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub major_version: c_int,
    pub minor_version: c_int,
}

/// The start of `PJRT_Api`: its size and version, followed by 8-byte function pointers.
#[repr(C)]
pub(crate) struct ApiHeader {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub version: ApiVersion,
}

/// Byte offset of the first function pointer in `PJRT_Api`.
pub(crate) const FUNCTIONS_OFFSET: usize = size_of::<ApiHeader>();

/// Positions in `PJRT_Api`'s function table (header order, counted from 0).
pub(crate) mod index {
    pub(crate) const ERROR_DESTROY: usize = 0;
    pub(crate) const ERROR_MESSAGE: usize = 1;
    pub(crate) const ERROR_GET_CODE: usize = 2;
    pub(crate) const PLUGIN_INITIALIZE: usize = 3;
    pub(crate) const EVENT_DESTROY: usize = 5;
    pub(crate) const EVENT_IS_READY: usize = 6;
    pub(crate) const EVENT_AWAIT: usize = 8;
    pub(crate) const CLIENT_CREATE: usize = 10;
    pub(crate) const CLIENT_DESTROY: usize = 11;
    pub(crate) const CLIENT_PLATFORM_NAME: usize = 12;
    pub(crate) const CLIENT_ADDRESSABLE_DEVICES: usize = 16;
    pub(crate) const CLIENT_COMPILE: usize = 20;
    pub(crate) const CLIENT_BUFFER_FROM_HOST_BUFFER: usize = 22;
    pub(crate) const DEVICE_DESCRIPTION_ID: usize = 23;
    pub(crate) const DEVICE_DESCRIPTION_KIND: usize = 26;
    pub(crate) const DEVICE_GET_DESCRIPTION: usize = 29;
    pub(crate) const EXECUTABLE_DESTROY: usize = 40;
    pub(crate) const EXECUTABLE_NUM_REPLICAS: usize = 42;
    pub(crate) const EXECUTABLE_NUM_OUTPUTS: usize = 44;
    pub(crate) const LOADED_EXECUTABLE_DESTROY: usize = 50;
    pub(crate) const LOADED_EXECUTABLE_GET_EXECUTABLE: usize = 51;
    pub(crate) const LOADED_EXECUTABLE_ADDRESSABLE_DEVICES: usize = 52;
    pub(crate) const LOADED_EXECUTABLE_EXECUTE: usize = 55;
    pub(crate) const BUFFER_DESTROY: usize = 58;
    pub(crate) const BUFFER_ELEMENT_TYPE: usize = 59;
    pub(crate) const BUFFER_DIMENSIONS: usize = 60;
    pub(crate) const BUFFER_GET_MEMORY_LAYOUT: usize = 63;
    pub(crate) const BUFFER_ON_DEVICE_SIZE_IN_BYTES: usize = 64;
    pub(crate) const BUFFER_DEVICE: usize = 65;
    pub(crate) const BUFFER_TO_HOST_BUFFER: usize = 70;
    pub(crate) const BUFFER_IS_ON_CPU: usize = 71;
    pub(crate) const BUFFER_READY_EVENT: usize = 72;
    pub(crate) const BUFFER_INCREASE_EXTERNAL_REFERENCE_COUNT: usize = 74;
    pub(crate) const BUFFER_DECREASE_EXTERNAL_REFERENCE_COUNT: usize = 75;
    pub(crate) const BUFFER_OPAQUE_DEVICE_MEMORY_DATA_POINTER: usize = 76;
    /// The highest index above: a plugin's table must reach it.
    pub(crate) const HIGHEST_USED: usize = BUFFER_TO_HOST_BUFFER;
}

/// Every checked PJRT function: `PJRT_Error* f(Args*)`; null means success.
pub(crate) type CheckedFn<A> = unsafe extern "C" fn(args: *mut A) -> *mut Error;
/// `PJRT_Error_Destroy` and `PJRT_Error_Message` return nothing.
pub(crate) type VoidFn<A> = unsafe extern "C" fn(args: *mut A);

#[repr(C)]
pub(crate) struct ErrorDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *mut Error,
}

#[repr(C)]
pub(crate) struct ErrorMessageArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *const Error,
    pub message: *const c_char,
    pub message_size: usize,
}

#[repr(C)]
pub(crate) struct ErrorGetCodeArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub error: *const Error,
    pub code: c_int,
}

#[repr(C)]
pub(crate) struct PluginInitializeArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
}

/// `PJRT_Event_Destroy_Args` and `PJRT_Event_Await_Args` share this layout.
#[repr(C)]
pub(crate) struct EventArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub event: *mut Event,
}

/// `PJRT_NamedValue_Type`: `kString`, `kInt64`, `kInt64List`, `kFloat`, `kBool`.
pub(crate) const NAMED_VALUE_STRING: c_int = 0;
pub(crate) const NAMED_VALUE_INT64: c_int = 1;
pub(crate) const NAMED_VALUE_INT64_LIST: c_int = 2;
pub(crate) const NAMED_VALUE_FLOAT: c_int = 3;
pub(crate) const NAMED_VALUE_BOOL: c_int = 4;

/// The header's anonymous union in `PJRT_NamedValue`, as `kind` says.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union NamedValueUnion {
    pub string: *const c_char,
    pub int64: i64,
    pub int64_array: *const i64,
    pub float: f32,
    pub boolean: bool,
}

#[repr(C)]
pub(crate) struct NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub name: *const c_char,
    pub name_size: usize,
    pub kind: c_int,
    pub value: NamedValueUnion,
    /// The string's bytes or the list's elements; 1 for the other kinds.
    pub value_size: usize,
}

#[repr(C)]
pub(crate) struct ClientCreateArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub create_options: *const NamedValue,
    pub num_options: usize,
    pub kv_get_callback: *mut c_void,
    pub kv_get_user_arg: *mut c_void,
    pub kv_put_callback: *mut c_void,
    pub kv_put_user_arg: *mut c_void,
    pub client: *mut Client,
    pub kv_try_get_callback: *mut c_void,
    pub kv_try_get_user_arg: *mut c_void,
}

#[repr(C)]
pub(crate) struct ClientDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut Client,
}

#[repr(C)]
pub(crate) struct ClientPlatformNameArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut Client,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
}

#[repr(C)]
pub(crate) struct ClientAddressableDevicesArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut Client,
    pub addressable_devices: *const *mut Device,
    pub num_addressable_devices: usize,
}

#[repr(C)]
pub(crate) struct Program {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub code: *mut c_char,
    pub code_size: usize,
    pub format: *const c_char,
    pub format_size: usize,
}

#[repr(C)]
pub(crate) struct ClientCompileArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut Client,
    pub program: *const Program,
    pub compile_options: *const c_char,
    pub compile_options_size: usize,
    pub executable: *mut LoadedExecutable,
}

/// `PJRT_HostBufferSemantics_kImmutableOnlyDuringCall`: the plugin copies during the call.
pub(crate) const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: c_int = 0;

#[repr(C)]
pub(crate) struct ClientBufferFromHostBufferArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub client: *mut Client,
    pub data: *const c_void,
    pub element_type: c_int,
    pub dims: *const i64,
    pub num_dims: usize,
    pub byte_strides: *const i64,
    pub num_byte_strides: usize,
    pub host_buffer_semantics: c_int,
    pub device: *mut Device,
    pub memory: *mut c_void,
    pub device_layout: *mut c_void,
    pub done_with_host_buffer: *mut Event,
    pub buffer: *mut Buffer,
}

#[repr(C)]
pub(crate) struct DeviceGetDescriptionArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device: *mut Device,
    pub device_description: *mut DeviceDescription,
}

#[repr(C)]
pub(crate) struct DeviceDescriptionIdArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device_description: *mut DeviceDescription,
    pub id: c_int,
}

#[repr(C)]
pub(crate) struct DeviceDescriptionKindArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub device_description: *mut DeviceDescription,
    pub device_kind: *const c_char,
    pub device_kind_size: usize,
}

#[repr(C)]
pub(crate) struct ExecutableDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut Executable,
}

/// `PJRT_Executable_NumReplicas_Args` and `PJRT_Executable_NumOutputs_Args` share this layout.
#[repr(C)]
pub(crate) struct ExecutableCountArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut Executable,
    pub count: usize,
}

#[repr(C)]
pub(crate) struct LoadedExecutableDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut LoadedExecutable,
}

#[repr(C)]
pub(crate) struct LoadedExecutableGetExecutableArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub loaded_executable: *mut LoadedExecutable,
    pub executable: *mut Executable,
}

#[repr(C)]
pub(crate) struct ExecuteOptions {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub send_callbacks: *mut c_void,
    pub recv_callbacks: *mut c_void,
    pub num_send_ops: usize,
    pub num_recv_ops: usize,
    pub launch_id: c_int,
    pub non_donatable_input_indices: *const i64,
    pub num_non_donatable_input_indices: usize,
    pub context: *mut c_void,
    pub call_location: *const c_char,
    pub num_tasks: usize,
    pub task_ids: *mut c_int,
    pub incarnation_ids: *mut i64,
}

#[repr(C)]
pub(crate) struct LoadedExecutableExecuteArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut LoadedExecutable,
    pub options: *mut ExecuteOptions,
    pub argument_lists: *const *const *mut Buffer,
    pub num_devices: usize,
    pub num_args: usize,
    pub output_lists: *const *mut *mut Buffer,
    pub device_complete_events: *mut *mut Event,
    pub execute_device: *mut Device,
}

#[repr(C)]
pub(crate) struct BufferDestroyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
}

#[repr(C)]
pub(crate) struct BufferElementTypeArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    pub element_type: c_int,
}

#[repr(C)]
pub(crate) struct BufferDimensionsArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    pub dims: *const i64,
    pub num_dims: usize,
}

#[repr(C)]
pub(crate) struct LoadedExecutableAddressableDevicesArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub executable: *mut LoadedExecutable,
    pub addressable_devices: *const *mut Device,
    pub num_addressable_devices: usize,
}

#[repr(C)]
pub(crate) struct BufferDeviceArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    pub device: *mut Device,
}

/// `PJRT_Event_IsReady_Args`.
#[repr(C)]
pub(crate) struct EventIsReadyArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub event: *mut Event,
    /// A C `bool`: 0 or 1.
    pub is_ready: u8,
}

/// `PJRT_Buffer_IsOnCpu_Args`.
#[repr(C)]
pub(crate) struct BufferIsOnCpuArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    /// A C `bool`: 0 or 1.
    pub is_on_cpu: u8,
}

/// `PJRT_Buffer_ReadyEvent_Args`.
#[repr(C)]
pub(crate) struct BufferReadyEventArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    pub event: *mut Event,
}

/// `PJRT_Buffer_IncreaseExternalReferenceCount_Args` and
/// `PJRT_Buffer_DecreaseExternalReferenceCount_Args` share this layout.
#[repr(C)]
pub(crate) struct BufferExternalReferenceArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
}

/// `PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args`.
#[repr(C)]
pub(crate) struct BufferOpaqueDeviceMemoryDataPointerArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    pub device_memory_ptr: *mut c_void,
}

/// `PJRT_Buffer_OnDeviceSizeInBytes_Args`.
#[repr(C)]
pub(crate) struct BufferOnDeviceSizeArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    pub on_device_size_in_bytes: usize,
}

/// `PJRT_Buffer_MemoryLayout_Type_Tiled`.
pub(crate) const MEMORY_LAYOUT_TILED: c_int = 0;

/// `PJRT_Buffer_MemoryLayout`: its union holds `PJRT_Buffer_MemoryLayout_Tiled` (the larger
/// member, spelled out here) or `PJRT_Buffer_MemoryLayout_Strides`, as `kind` says.
#[repr(C)]
pub(crate) struct MemoryLayout {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub tiled_struct_size: usize,
    pub tiled_extension_start: *mut c_void,
    pub minor_to_major: *const i64,
    pub minor_to_major_size: usize,
    pub tile_dims: *const i64,
    pub tile_dim_sizes: *const usize,
    pub num_tiles: usize,
    pub kind: c_int,
}

/// `PJRT_Buffer_GetMemoryLayout_Args`.
#[repr(C)]
pub(crate) struct BufferGetMemoryLayoutArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub buffer: *mut Buffer,
    pub layout: MemoryLayout,
}

#[repr(C)]
pub(crate) struct BufferToHostBufferArgs {
    pub struct_size: usize,
    pub extension_start: *mut c_void,
    pub src: *mut Buffer,
    pub host_layout: *mut c_void,
    pub dst: *mut c_void,
    pub dst_size: usize,
    pub event: *mut Event,
}

/// The sizes the 0.115 CPU plugin reported for each struct (its "expected N" messages), and the
/// header's for the two it does not check. A layout edit that changes one fails the build.
const _: () = {
    assert!(size_of::<ApiHeader>() == 40);
    assert!(size_of::<ErrorDestroyArgs>() == 24);
    assert!(size_of::<ErrorMessageArgs>() == 40);
    assert!(size_of::<ErrorGetCodeArgs>() == 32); // 28 + tail padding
    assert!(size_of::<PluginInitializeArgs>() == 16);
    assert!(size_of::<EventArgs>() == 24);
    assert!(size_of::<NamedValueUnion>() == 8);
    assert!(size_of::<NamedValue>() == 56);
    assert!(size_of::<ClientCreateArgs>() == 88);
    assert!(size_of::<ClientDestroyArgs>() == 24);
    assert!(size_of::<ClientPlatformNameArgs>() == 40);
    assert!(size_of::<ClientAddressableDevicesArgs>() == 40);
    assert!(size_of::<Program>() == 48);
    assert!(size_of::<ClientCompileArgs>() == 56);
    assert!(size_of::<ClientBufferFromHostBufferArgs>() == 120);
    assert!(size_of::<DeviceGetDescriptionArgs>() == 32);
    assert!(size_of::<DeviceDescriptionIdArgs>() == 32); // 28 + tail padding
    assert!(size_of::<DeviceDescriptionKindArgs>() == 40);
    assert!(size_of::<ExecutableDestroyArgs>() == 24);
    assert!(size_of::<ExecutableCountArgs>() == 32);
    assert!(size_of::<LoadedExecutableDestroyArgs>() == 24);
    assert!(size_of::<LoadedExecutableGetExecutableArgs>() == 32);
    assert!(size_of::<ExecuteOptions>() == 112);
    assert!(size_of::<LoadedExecutableExecuteArgs>() == 80);
    assert!(size_of::<BufferDestroyArgs>() == 24);
    assert!(size_of::<BufferElementTypeArgs>() == 32); // 28 + tail padding
    assert!(size_of::<BufferDimensionsArgs>() == 40);
    assert!(size_of::<BufferToHostBufferArgs>() == 56);
    assert!(size_of::<LoadedExecutableAddressableDevicesArgs>() == 40);
    assert!(size_of::<BufferDeviceArgs>() == 32);
    assert!(size_of::<EventIsReadyArgs>() == 32); // 25 + tail padding
    assert!(size_of::<BufferIsOnCpuArgs>() == 32); // 25 + tail padding
    assert!(size_of::<BufferReadyEventArgs>() == 32);
    assert!(size_of::<BufferExternalReferenceArgs>() == 24);
    assert!(size_of::<BufferOpaqueDeviceMemoryDataPointerArgs>() == 32);
    assert!(size_of::<BufferOnDeviceSizeArgs>() == 32);
    assert!(size_of::<MemoryLayout>() == 80); // 76 + tail padding
    assert!(size_of::<BufferGetMemoryLayoutArgs>() == 104);
};

/// Argument structs: plain C data whose first field is `struct_size`.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, start with a `usize` `struct_size`, and consist only of
/// integers, raw pointers and unions of those, floats and bools, so that the all-zero bit
/// pattern is a valid value.
pub(crate) unsafe trait Args: Sized {
    /// A zeroed struct with `struct_size` set: every optional input null, every count 0.
    fn new() -> Self {
        // SAFETY: the trait's contract makes all-zero a valid value of Self.
        let mut args: Self = unsafe { std::mem::zeroed() };
        // SAFETY: the contract puts a `usize` struct_size at offset 0 of the repr(C) struct.
        unsafe { (&raw mut args).cast::<usize>().write(size_of::<Self>()) };
        args
    }
}

macro_rules! args_structs {
    ($($name:ident),* $(,)?) => {
        // SAFETY: each listed struct is repr(C), starts with `struct_size: usize`, and holds only
        // integers, raw pointers and `NamedValueUnion` (checked by reading the definitions above).
        $(unsafe impl Args for $name {})*
    };
}

args_structs!(
    ErrorDestroyArgs,
    ErrorMessageArgs,
    ErrorGetCodeArgs,
    PluginInitializeArgs,
    EventArgs,
    NamedValue,
    ClientCreateArgs,
    ClientDestroyArgs,
    ClientPlatformNameArgs,
    ClientAddressableDevicesArgs,
    Program,
    ClientCompileArgs,
    ClientBufferFromHostBufferArgs,
    DeviceGetDescriptionArgs,
    DeviceDescriptionIdArgs,
    DeviceDescriptionKindArgs,
    ExecutableDestroyArgs,
    ExecutableCountArgs,
    LoadedExecutableDestroyArgs,
    LoadedExecutableGetExecutableArgs,
    ExecuteOptions,
    LoadedExecutableExecuteArgs,
    BufferDestroyArgs,
    BufferElementTypeArgs,
    BufferDimensionsArgs,
    BufferToHostBufferArgs,
    LoadedExecutableAddressableDevicesArgs,
    BufferDeviceArgs,
    EventIsReadyArgs,
    BufferIsOnCpuArgs,
    BufferReadyEventArgs,
    BufferExternalReferenceArgs,
    BufferOpaqueDeviceMemoryDataPointerArgs,
    BufferOnDeviceSizeArgs,
    BufferGetMemoryLayoutArgs,
);
