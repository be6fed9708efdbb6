//! The reduction kernels: CUDA C compiled at run time with NVRTC, loaded once per GPU.
//!
//! Each output element is `((in[0] ⊕ in[1]) ⊕ in[2]) ⊕ …` in replica order, as in the host
//! kernel (`crate::kernel`): `f16`/`bf16` accumulate in `f32` and round once to nearest even,
//! `Mean` divides the `f32`/`f64` sum by the replica count (IEEE division: no fast math, no fused
//! operations), min/max let NaN win, integers wrap. So a GPU reduction gives the same bits as the
//! CPU backend for every non-NaN result (a NaN stays NaN; its payload may differ).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaModule, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use distribute_values::{Lock, ReduceOp};

use super::device::{Gpu, driver_error};
use super::memory::GpuArray;
use super::nvrtc::Program;
use crate::{DType, GpuError, Placement, Tensor, TensorError};

/// Threads per block of the reduction kernels.
const THREADS: u32 = 256;

/// Input pointers passed in the launch's parameters (`INLINE` in the source); more go in a table
/// in device memory.
const INLINE_INPUTS: usize = 16;

/// The bytes of one vector load or store (`Pack` in the source).
const PACK_BYTES: u64 = 16;

/// The kernels' first parameter: the first [`INLINE_INPUTS`] input pointers (`Inputs` in the
/// source), unused ones zero.
#[repr(C)]
struct InlineInputs([u64; INLINE_INPUTS]);

// SAFETY: plain data with the layout of the kernels' `struct Inputs { const void* p[16]; }`.
unsafe impl DeviceRepr for InlineInputs {}

/// The CUDA C source of every reduction kernel: `reduce_<op>_<dtype>` for op in sum, mean, min,
/// max and dtype in f16, bf16, f32, f64, i32, i64 (mean only for the floating types).
///
/// Kernel signature: `(Inputs inline, const T* const* more, unsigned n, T* out,
/// unsigned long long len, unsigned long long divisor, unsigned packed)`: the first 16 input
/// pointers by value, the rest in a device table; `packed` (every pointer 16-byte aligned) lets
/// the kernel read and write 16 bytes at a time. The source includes no header, so NVRTC needs
/// nothing but itself.
pub fn kernel_source() -> &'static str {
    SOURCE
}

const SOURCE: &str = r#"
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

struct f16_t { u16 bits; };
struct bf16_t { u16 bits; };

// Loads widen to the accumulator type; stores round once, to nearest even.
__device__ __forceinline__ float load(f16_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ f16_t store_f16(float f) {
    f16_t x;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x.bits) : "f"(f));
    return x;
}
__device__ __forceinline__ float load(bf16_t x) {
    return __uint_as_float(((u32)x.bits) << 16);
}
// The rounding of the `half` crate's bf16::from_f32, so both sides give the same bits.
__device__ __forceinline__ bf16_t store_bf16(float f) {
    u32 u = __float_as_uint(f);
    bf16_t x;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        x.bits = (u16)((u >> 16) | 0x40u);
    } else {
        x.bits = (u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return x;
}
__device__ __forceinline__ float load(float x) { return x; }
__device__ __forceinline__ double load(double x) { return x; }
__device__ __forceinline__ int load(int x) { return x; }
__device__ __forceinline__ long long load(long long x) { return x; }

template <typename T, typename A> struct Store;
template <> struct Store<f16_t, float> { __device__ static f16_t to(float a) { return store_f16(a); } };
template <> struct Store<bf16_t, float> { __device__ static bf16_t to(float a) { return store_bf16(a); } };
template <> struct Store<float, float> { __device__ static float to(float a) { return a; } };
template <> struct Store<double, double> { __device__ static double to(double a) { return a; } };
template <> struct Store<int, int> { __device__ static int to(int a) { return a; } };
template <> struct Store<long long, long long> { __device__ static long long to(long long a) { return a; } };

enum { SUM = 0, MEAN = 1, MIN = 2, MAX = 3 };

__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
// Integers wrap, as the host kernel's wrapping_add does (signed overflow is undefined in C++).
__device__ __forceinline__ int add(int a, int b) { return (int)((u32)a + (u32)b); }
__device__ __forceinline__ long long add(long long a, long long b) {
    return (long long)((u64)a + (u64)b);
}

template <int OP, typename A>
__device__ __forceinline__ A combine(A a, A b) {
    if (OP == MIN) return (a != a || a < b) ? a : b;   // NaN wins, as in tf.minimum
    if (OP == MAX) return (a != a || a > b) ? a : b;
    return add(a, b);
}

// The first INLINE input pointers travel in the launch's parameters; more (rare: one input per
// replica of one process) in a table in device memory.
// `__grid_constant__` lets the kernel index them where they are, instead of copying all of them
// to each thread's local memory first.
enum { INLINE = 16 };
struct Inputs { const void* p[INLINE]; };
#if __CUDA_ARCH__ >= 700
#define GRID_CONSTANT __grid_constant__
#else
#define GRID_CONSTANT
#endif

template <typename T>
__device__ __forceinline__ const T* input(const Inputs& in, const T* const* more, u32 k) {
    return k < INLINE ? (const T*)in.p[k] : more[k - INLINE];
}

// 16 bytes: one vector load or store (`ld.global.v4`), 16 / sizeof(T) elements.
struct alignas(16) Pack { u32 w[4]; };
template <typename T> union Lanes { Pack pack; T e[16 / sizeof(T)]; };

template <int OP, typename A>
__device__ __forceinline__ A finish(A acc, u64 divisor) {
    if (OP == MEAN) acc = acc / (A)divisor;
    return acc;
}

// Element i of the output is the same expression in both loops; the packed loop only reads and
// writes 16 bytes at a time (when every pointer is 16-byte aligned, which the host checks), and
// the element loop does the rest.
template <int OP, typename T, typename A>
__device__ __forceinline__ void reduce(const Inputs& in, const T* const* more, u32 n, T* out, u64 len,
                                       u64 divisor, u32 packed) {
    enum { W = 16 / sizeof(T) };
    u64 stride = (u64)gridDim.x * blockDim.x;
    u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 done = 0;
    if (packed) {
        u64 packs = len / W;
        for (u64 p = first; p < packs; p += stride) {
            Lanes<T> x;
            x.pack = ((const Pack*)input<T>(in, more, 0))[p];
            A acc[W];
#pragma unroll
            for (int j = 0; j < W; ++j) acc[j] = load(x.e[j]);
#pragma unroll 4
            for (u32 k = 1; k < n; ++k) {
                x.pack = ((const Pack*)input<T>(in, more, k))[p];
#pragma unroll
                for (int j = 0; j < W; ++j) acc[j] = combine<OP, A>(acc[j], load(x.e[j]));
            }
#pragma unroll
            for (int j = 0; j < W; ++j) x.e[j] = Store<T, A>::to(finish<OP, A>(acc[j], divisor));
            ((Pack*)out)[p] = x.pack;
        }
        done = packs * W;
    }
    for (u64 i = done + first; i < len; i += stride) {
        A acc = load(input<T>(in, more, 0)[i]);
        for (u32 k = 1; k < n; ++k) {
            acc = combine<OP, A>(acc, load(input<T>(in, more, k)[i]));
        }
        out[i] = Store<T, A>::to(finish<OP, A>(acc, divisor));
    }
}

// 256 threads (THREADS on the host), 8 blocks resident per multiprocessor (the host launches
// that many per multiprocessor, so every block of the grid-stride loop runs at once).
#define KERNEL(name, OP, T, A) \
    extern "C" __global__ void __launch_bounds__(256, 8) name(GRID_CONSTANT const Inputs in, const T* const* more, u32 n, \
                                    T* out, u64 len, \
                                    u64 divisor, u32 packed) { \
        reduce<OP, T, A>(in, more, n, out, len, divisor, packed); \
    }

#define FLOAT_KERNELS(suffix, T, A) \
    KERNEL(reduce_sum_##suffix, SUM, T, A) \
    KERNEL(reduce_mean_##suffix, MEAN, T, A) \
    KERNEL(reduce_min_##suffix, MIN, T, A) \
    KERNEL(reduce_max_##suffix, MAX, T, A)

#define INT_KERNELS(suffix, T) \
    KERNEL(reduce_sum_##suffix, SUM, T, T) \
    KERNEL(reduce_min_##suffix, MIN, T, T) \
    KERNEL(reduce_max_##suffix, MAX, T, T)

FLOAT_KERNELS(f16, f16_t, float)
FLOAT_KERNELS(bf16, bf16_t, float)
FLOAT_KERNELS(f32, float, float)
FLOAT_KERNELS(f64, double, double)
INT_KERNELS(i32, int)
INT_KERNELS(i64, long long)
"#;

/// The name of the kernel for `op` on `dtype`.
fn kernel_name(op: ReduceOp, dtype: DType) -> String {
    let op = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Mean => "mean",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
    };
    let dtype = match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I32 => "i32",
        DType::I64 => "i64",
    };
    format!("reduce_{op}_{dtype}")
}

/// Compiles every reduction kernel to PTX for `arch` (a virtual architecture such as
/// `compute_90`, or a real one such as `sm_90`, which is compiled for its virtual one). Needs
/// NVRTC only, no GPU: CI checks the kernels this way.
pub fn compile_reduction_kernels(arch: &str) -> Result<String, GpuError> {
    let virtual_arch = match arch.strip_prefix("sm_") {
        Some(number) => format!("compute_{number}"),
        None => arch.to_owned(),
    };
    compile(&virtual_arch)?.ptx()
}

/// Compiles every reduction kernel to a CUBIN (machine code) for the real architecture `arch`
/// (`sm_90`): what a GPU loads. Needs NVRTC only, no GPU. A driver older than NVRTC (within one
/// CUDA major version) loads it, where it would refuse PTX of NVRTC's newer ISA.
pub fn compile_reduction_cubin(arch: &str) -> Result<Vec<u8>, GpuError> {
    if !arch.starts_with("sm_") {
        return Err(GpuError::Compile(format!(
            "a CUBIN is for a real architecture such as sm_90, not {arch}"
        )));
    }
    compile(arch)?.cubin()
}

/// The kernels compiled for `arch` with IEEE results, as on the host: no flush to zero, exact
/// division, no fused multiply-add, no fast math.
fn compile(arch: &str) -> Result<Program, GpuError> {
    let options = [
        format!("--gpu-architecture={arch}"),
        "--ftz=false".to_owned(),
        "--prec-div=true".to_owned(),
        "--fmad=false".to_owned(),
    ];
    Program::compile(SOURCE, "distribute_reduce.cu", &options)
}

/// The kernels loaded on one GPU.
struct Loaded {
    module: Arc<CudaModule>,
    /// Blocks that keep every multiprocessor busy; more only add scheduling.
    max_blocks: u32,
}

/// The loaded kernels of `gpu`, compiled to a CUBIN for its architecture (once per architecture;
/// see [`compile_reduction_cubin`]) and loaded (once per device) on first use.
fn loaded(gpu: &Gpu) -> Result<Arc<Loaded>, GpuError> {
    // Entries go in whole, once made: a panic while making one leaves the caches as they were.
    static CUBINS: OnceLock<Lock<HashMap<String, Vec<u8>>>> = OnceLock::new();
    static MODULES: OnceLock<Lock<HashMap<usize, Arc<Loaded>>>> = OnceLock::new();
    let mut modules = MODULES.get_or_init(Default::default).lock();
    if let Some(loaded) = modules.get(&gpu.ordinal()) {
        return Ok(loaded.clone());
    }
    let (major, minor) = gpu.compute_capability()?;
    let arch = format!("sm_{major}{minor}");
    let cubin = {
        let mut cache = CUBINS.get_or_init(Default::default).lock();
        match cache.get(&arch) {
            Some(cubin) => cubin.clone(),
            None => {
                let cubin = compile_reduction_cubin(&arch)?;
                cache.insert(arch, cubin.clone());
                cubin
            }
        }
    };
    let module = gpu
        .context()
        .load_module(Ptx::from_binary(cubin))
        .map_err(driver_error)?;
    let sms = gpu
        .context()
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(driver_error)?;
    let loaded = Arc::new(Loaded {
        module,
        max_blocks: u32::try_from(sms.max(1)).unwrap_or(1) * 8,
    });
    modules.insert(gpu.ordinal(), loaded.clone());
    Ok(loaded)
}

/// Reduces `inputs` (same dtype and shape, checked by the caller) element-wise on `gpu`, in input
/// order; host inputs are uploaded and inputs on other GPUs copied first.
pub(crate) fn reduce_on_gpu(
    op: ReduceOp,
    inputs: &[&Tensor],
    gpu: &Gpu,
    divisor: usize,
) -> Result<GpuArray, TensorError> {
    let first = inputs[0];
    let (dtype, shape) = (first.dtype(), first.shape().to_vec());
    let on_gpu = inputs
        .iter()
        .map(|t| t.gpu_array_on(gpu))
        .collect::<Result<Vec<_>, _>>()?;
    let len = shape.iter().product::<usize>();
    let mut out = GpuArray::alloc(gpu, dtype, &shape)?;
    if len > 0 {
        launch(op, dtype, &on_gpu, &mut out, len, divisor, gpu)?;
    }
    Ok(GpuArray::new(gpu, dtype, &shape, out))
}

fn launch(
    op: ReduceOp,
    dtype: DType,
    inputs: &[GpuArray],
    out: &mut cudarc::driver::CudaSlice<u8>,
    len: usize,
    divisor: usize,
    gpu: &Gpu,
) -> Result<(), GpuError> {
    let loaded = loaded(gpu)?;
    let function = loaded
        .module
        .load_function(&kernel_name(op, dtype))
        .map_err(driver_error)?;
    let stream = gpu.stream();
    // The guards make later users of each input wait for this kernel (cudarc's event tracking).
    let (pointers, _guards): (Vec<u64>, Vec<_>) =
        inputs.iter().map(|a| a.bytes.device_ptr(stream)).unzip();
    let (out_pointer, _out_guard) = out.device_ptr_mut(stream);
    let mut inline = InlineInputs([0; INLINE_INPUTS]);
    let head = pointers.len().min(INLINE_INPUTS);
    inline.0[..head].copy_from_slice(&pointers[..head]);
    // Inputs past the inline ones go in a table in device memory (freed in stream order).
    let more = if pointers.len() > INLINE_INPUTS {
        Some(
            stream
                .clone_htod(&pointers[INLINE_INPUTS..])
                .map_err(driver_error)?,
        )
    } else {
        None
    };
    let (more_pointer, _more_guard) = match &more {
        Some(table) => {
            let (pointer, guard) = table.device_ptr(stream);
            (pointer, Some(guard))
        }
        None => (0, None),
    };
    let n = u32::try_from(inputs.len())
        .map_err(|_| GpuError::Driver("more than u32::MAX inputs".into()))?;
    let packed = pointers
        .iter()
        .chain([&out_pointer])
        .all(|&p| p % PACK_BYTES == 0);
    let work = if packed {
        // One thread per 16-byte pack; the tail is a few elements.
        len.div_ceil(PACK_BYTES as usize / dtype.size_in_bytes())
    } else {
        len
    };
    let (len, divisor, packed) = (len as u64, divisor as u64, u32::from(packed));
    let blocks = (work as u64)
        .div_ceil(u64::from(THREADS))
        .min(u64::from(loaded.max_blocks)) as u32;
    let config = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut builder = stream.launch_builder(&function);
    builder
        .arg(&inline)
        .arg(&more_pointer)
        .arg(&n)
        .arg(&out_pointer)
        .arg(&len)
        .arg(&divisor)
        .arg(&packed);
    // SAFETY: the argument list matches the kernel's signature (inline pointers, the table of
    // the rest, count, output, element count, divisor, packed); every input pointer and the
    // output hold `len` elements of `dtype`; `packed` is set only when every pointer is 16-byte
    // aligned; the guards keep the buffers' stream order until the launch is queued.
    unsafe { builder.launch(config) }.map_err(driver_error)?;
    Ok(())
}

/// The reduction of `inputs` when one of them is in GPU memory, on a GPU (placed on `device`, or
/// in host memory when `device` names no GPU); `None` when every input is in host memory.
pub(crate) fn reduce_if_on_gpu(
    op: ReduceOp,
    inputs: &[&Tensor],
    device: &str,
    divisor: usize,
) -> Result<Option<Tensor>, TensorError> {
    let Some(gpu) = gpu_for_reduction(inputs, device)? else {
        return Ok(None);
    };
    let array = reduce_on_gpu(op, inputs, &gpu, divisor)?;
    let reduced = Tensor::from_gpu_array(device.into(), array);
    // The reduction ran on a GPU because an input lives there; a destination that names no
    // GPU gets the result in host memory.
    match Gpu::index_of(device)? {
        Some(_) => Ok(Some(reduced)),
        None => reduced.to_host().map(Some),
    }
}

/// The GPU a reduction runs on: none when every input is in host memory (host data is never
/// uploaded implicitly); else the GPU `device` names, or the first GPU input's.
fn gpu_for_reduction(inputs: &[&Tensor], device: &str) -> Result<Option<Gpu>, TensorError> {
    let first_gpu = inputs.iter().find_map(|t| match t.placement() {
        Placement::Cuda { ordinal } => Some(ordinal),
        _ => None,
    });
    let Some(first_gpu) = first_gpu else {
        return Ok(None);
    };
    let ordinal = Gpu::index_of(device)?.unwrap_or(first_gpu);
    Ok(Some(Gpu::open(ordinal)?))
}
