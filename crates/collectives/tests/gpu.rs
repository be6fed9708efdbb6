//! GPU tensors and reductions on a real GPU (feature `cuda`; `cargo xtask test-gpu` runs this
//! suite): probing, host/GPU round trips of every dtype and layout, pinned uploads, moves and
//! comparisons of GPU tensors, and GPU reductions, which must give the same bits as the host
//! kernel through both the cross-replica path (`CrossDeviceOps::reduce`, `batch_reduce`) and the
//! in-replica path (`Member::all_reduce` from replica threads).
//!
//! Without a GPU, or without NVRTC (which compiles the reduction kernels), every test prints
//! `skipped: <why>` and passes; with `DISTRIBUTE_REQUIRE_GPU=1` they fail instead, so a GPU
//! machine whose driver or NVRTC is missing cannot pass by skipping. The suite needs one GPU:
//! several replicas' tensors share GPU 0. Cases for two GPUs run where the driver reports two.

use std::time::Duration;

use distribute_collectives::backend::{CollectiveGroup, Member};
use distribute_collectives::{
    CollectiveError, CrossDeviceOps, Destinations, GroupConfig, ReductionToOneDevice,
    SharedMemoryAllReduce,
};
use distribute_tensor::cuda::{
    Gpu, PinnedUploader, compile_reduction_kernels, gpu_count, nvrtc_available, require_nvrtc,
};
use distribute_tensor::{
    AnyTensor, DType, Element, Fnv, GpuError, Placement, Tensor, TensorError, with_dtype,
};
use distribute_values::{Leaf, ReduceOp};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn, ShapeBuilder, s};

const REQUIRE_GPU: &str = "DISTRIBUTE_REQUIRE_GPU";
const GPU0: &str = "/job:localhost/replica:0/task:0/device:GPU:0";
const GPU1: &str = "/job:localhost/replica:0/task:0/device:GPU:1";
const CPU0: &str = "/job:localhost/replica:0/task:0/device:CPU:0";

const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max];
const DTYPES: [DType; 6] = DType::ALL;
const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

// ---------------------------------------------------------------------------------------------
// Skipping

fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU).is_ok_and(|v| v == "1")
}

/// GPU 0 (its shared handle), or `None` after printing why this test is skipped: no driver, no
/// GPU, or no NVRTC to compile the kernels. Panics instead when `DISTRIBUTE_REQUIRE_GPU=1`.
fn gpu_or_skip() -> Option<Gpu> {
    let why = match gpu_count() {
        Err(e) => format!("no GPU: {e}"),
        Ok(0) => "no GPU: the NVIDIA driver reports 0 GPUs".to_owned(),
        Ok(_) if !nvrtc_available() => format!(
            "the GPU reduction kernels cannot be compiled: {}",
            require_nvrtc().expect_err("NVRTC is not available")
        ),
        Ok(_) => return Some(Gpu::open(0).expect("GPU 0 opens when the driver counts it")),
    };
    assert!(!gpu_required(), "{REQUIRE_GPU}=1 but {why}");
    eprintln!("skipped: {why}");
    None
}

/// GPU 1 when the driver reports two GPUs or more; else `None` after printing why (a one-GPU
/// machine passes these cases even when a GPU is required).
fn second_gpu(case: &str) -> Option<Gpu> {
    match gpu_count() {
        Ok(n) if n >= 2 => Some(Gpu::open(1).expect("GPU 1 opens when the driver counts 2")),
        Ok(n) => {
            eprintln!("skipped: {case} needs 2 GPUs, this machine has {n}");
            None
        }
        Err(e) => {
            eprintln!("skipped: {case} needs 2 GPUs: {e}");
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Deterministic data

/// xorshift64*: small, fast and the same everywhere.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A seed made of a test case's parameters.
fn seed(parts: &[u64]) -> u64 {
    let mut hash = Fnv::new();
    for part in parts {
        hash.bytes(&part.to_le_bytes());
    }
    hash.0
}

/// The floating-point element types, for the data generator.
trait Float: Element + std::ops::Neg<Output = Self> {
    const INF: Self;
    const MAX: Self;
    /// The smallest subnormal.
    const TINY: Self;
    /// A large value `b` for which `(b + -b) + 1 = 1` but `b + (-b + 1) = 0` in the accumulator
    /// (for f16, whose accumulator is f32, just a large value).
    const BIG: f64;
    /// Half the spacing of the values just above 1: `1 + HALF_ULP` is a rounding tie.
    const HALF_ULP: f64;
    /// The binary exponents of the rare extreme values (subnormal to near the largest).
    const WIDE: (i32, i32);
    fn from_f64(x: f64) -> Self;
    fn is_nan(self) -> bool;
    /// NaNs with different signs and payloads (quiet and signalling).
    fn nans() -> Vec<Self>;
}

impl Float for f16 {
    const INF: f16 = f16::INFINITY;
    const MAX: f16 = f16::MAX;
    const TINY: f16 = f16::from_bits(1);
    const BIG: f64 = 32768.0;
    const HALF_ULP: f64 = 1.0 / 2048.0;
    const WIDE: (i32, i32) = (-24, 14);
    fn from_f64(x: f64) -> f16 {
        f16::from_f64(x)
    }
    fn is_nan(self) -> bool {
        f16::is_nan(self)
    }
    fn nans() -> Vec<f16> {
        vec![f16::NAN, f16::from_bits(0xFE01), f16::from_bits(0x7C01)]
    }
}

impl Float for bf16 {
    const INF: bf16 = bf16::INFINITY;
    const MAX: bf16 = bf16::MAX;
    const TINY: bf16 = bf16::from_bits(1);
    const BIG: f64 = 1.0e8;
    const HALF_ULP: f64 = 1.0 / 256.0;
    const WIDE: (i32, i32) = (-133, 126);
    fn from_f64(x: f64) -> bf16 {
        bf16::from_f64(x)
    }
    fn is_nan(self) -> bool {
        bf16::is_nan(self)
    }
    fn nans() -> Vec<bf16> {
        vec![bf16::NAN, bf16::from_bits(0xFFC1), bf16::from_bits(0x7F81)]
    }
}

impl Float for f32 {
    const INF: f32 = f32::INFINITY;
    const MAX: f32 = f32::MAX;
    const TINY: f32 = f32::from_bits(1);
    const BIG: f64 = 1.0e8;
    const HALF_ULP: f64 = 1.0 / 16_777_216.0;
    const WIDE: (i32, i32) = (-149, 126);
    fn from_f64(x: f64) -> f32 {
        x as f32
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn nans() -> Vec<f32> {
        vec![
            f32::NAN,
            f32::from_bits(0xFFC0_0001),
            f32::from_bits(0x7F80_0001),
        ]
    }
}

impl Float for f64 {
    const INF: f64 = f64::INFINITY;
    const MAX: f64 = f64::MAX;
    const TINY: f64 = f64::from_bits(1);
    const BIG: f64 = 1.0e17;
    const HALF_ULP: f64 = 1.0 / 9_007_199_254_740_992.0;
    const WIDE: (i32, i32) = (-1074, 1022);
    fn from_f64(x: f64) -> f64 {
        x
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn nans() -> Vec<f64> {
        vec![
            f64::NAN,
            f64::from_bits(0xFFF8_0000_0000_0001),
            f64::from_bits(0x7FF0_0000_0000_0001),
        ]
    }
}

/// Element types the tests can make data of.
trait Sample: Element {
    /// Values where rounding, order, signs, infinities or wrapping matter: element `i < len` of
    /// replica `r` is `columns()[i][r % 5]`. No column mixes `+inf` and `-inf` (that is NaN,
    /// tested apart).
    fn columns() -> Vec<Vec<Self>>;
    /// A value for the elements past the columns.
    fn random(rng: &mut Rng) -> Self;
    /// NaNs of this type (none for integers).
    fn nans() -> Vec<Self>;
    fn is_nan(self) -> bool;
}

fn float_columns<T: Float>() -> Vec<Vec<T>> {
    let f = T::from_f64;
    let (big, h) = (T::BIG, T::HALF_ULP);
    let (inf, max, tiny) = (T::INF, T::MAX, T::TINY);
    vec![
        // Step by step in f16, 2048 + 1 + 1 stays 2048 (spacing 2); the f32 accumulator gives
        // 2050, and so must the GPU.
        vec![f(2048.0), f(1.0), f(1.0), f(1.0), f(1.0)],
        // Replica order: ((big + -big) + 1) + 1 keeps the ones, big + (-big + 1) would not.
        vec![f(big), f(-big), f(1.0), f(1.0), f(-3.0)],
        vec![f(-big), f(1.0), f(big), f(-1.0), f(big)],
        // Ties when rounding to the element type: 1 + h is halfway, 1 + 2h is not.
        vec![f(1.0), f(h), f(h), f(h), f(h)],
        vec![f(-1.0), f(-h), f(h), f(-h), f(-h)],
        // Overflow (in the f32 accumulator of f16, only on the final rounding).
        vec![max, max, -max, max, -max],
        vec![-max, -max, f(1.0), -max, max],
        // Signed zeros.
        vec![f(0.0), f(-0.0), f(0.0), f(-0.0), f(-0.0)],
        vec![f(-0.0), f(-0.0), f(-0.0), f(-0.0), f(-0.0)],
        vec![f(-0.0), f(0.0), f(-0.0), f(0.0), f(0.0)],
        // Infinities, one sign per column.
        vec![inf, f(1.0), f(-5.0), max, f(3.0)],
        vec![f(-3.0), -inf, f(7.0), f(1.0), -max],
        // Subnormals, never flushed to zero (bf16's are f32 subnormals in the accumulator).
        vec![tiny, tiny, tiny, -tiny, tiny],
        vec![-tiny, tiny, f(0.0), -tiny, -tiny],
        // MEAN rounds its quotient.
        vec![f(1.0), f(2.0), f(2.0), f(2.0), f(1.0)],
        vec![f(0.1), f(0.2), f(0.3), f(0.4), f(0.7)],
    ]
}

/// Mostly moderate magnitudes (so sums round), some small integers and zeros, and 10% of the
/// whole range from subnormal to near the largest.
fn float_random<T: Float>(rng: &mut Rng) -> T {
    let roll = rng.below(100);
    if roll < 5 {
        return T::from_f64(rng.below(17) as f64 - 8.0);
    }
    let (lo, hi) = if roll < 15 { T::WIDE } else { (-6, 6) };
    let e = lo + rng.below((hi - lo + 1) as u64) as i32;
    let sign = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
    // Two steps, so that 2^e never overflows or underflows on its own.
    let x = sign * (1.0 + rng.unit()) * 2f64.powi(e / 2) * 2f64.powi(e - e / 2);
    T::from_f64(x)
}

macro_rules! float_sample {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn columns() -> Vec<Vec<Self>> {
                float_columns::<$t>()
            }
            fn random(rng: &mut Rng) -> Self {
                float_random::<$t>(rng)
            }
            fn nans() -> Vec<Self> {
                <$t as Float>::nans()
            }
            fn is_nan(self) -> bool {
                <$t as Float>::is_nan(self)
            }
        }
    )*};
}

float_sample!(f16, bf16, f32, f64);

macro_rules! int_sample {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn columns() -> Vec<Vec<Self>> {
                let (max, min) = (<$t>::MAX, <$t>::MIN);
                vec![
                    // Wraps: MAX + 1 = MIN.
                    vec![max, 1, 1, 1, 1],
                    vec![min, -1, min, -1, min],
                    vec![max, max, max, max, max],
                    vec![0, -1, 1, min, max],
                    vec![max - 2, 3, -7, 5, -1],
                    vec![-5, -5, 7, -5, 0],
                ]
            }
            fn random(rng: &mut Rng) -> Self {
                match rng.below(4) {
                    // Any value: sums wrap all the time.
                    0 | 1 => rng.next() as $t,
                    // Near the ends.
                    2 if rng.next() & 1 == 0 => <$t>::MAX - rng.below(1000) as $t,
                    2 => <$t>::MIN + rng.below(1000) as $t,
                    _ => rng.below(2001) as $t - 1000,
                }
            }
            fn nans() -> Vec<Self> {
                Vec::new()
            }
            fn is_nan(self) -> bool {
                false
            }
        }
    )*};
}

int_sample!(i32, i64);

/// Replica `replica`'s `len` elements: the columns first, then pseudo-random values.
fn values<T: Sample>(replica: usize, len: usize, seed: u64) -> Vec<T> {
    let columns = T::columns();
    let mut rng = Rng::new(seed ^ (replica as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    (0..len)
        .map(|i| match columns.get(i) {
            Some(column) => column[replica % column.len()],
            None => T::random(&mut rng),
        })
        .collect()
}

/// A host tensor of replica `replica`'s data.
fn host_tensor(dtype: DType, shape: &[usize], replica: usize, seed: u64, device: &str) -> Tensor {
    let len = shape.iter().product();
    with_dtype!(dtype, T => Tensor::from_vec(device, shape, values::<T>(replica, len, seed)))
        .expect("the element count matches the shape")
}

/// The host inputs of `n` replicas, replica r's labelled `/cpu:{r + 1}`.
fn host_inputs(dtype: DType, shape: &[usize], n: usize, seed: u64) -> Vec<Tensor> {
    (0..n)
        .map(|r| host_tensor(dtype, shape, r, seed, &format!("/cpu:{}", r + 1)))
        .collect()
}

/// The shape a test gives `len` elements: `[0]`, a scalar, a matrix for 1000, else a vector.
fn shape_for(len: usize) -> Vec<usize> {
    match len {
        1 => vec![],
        1000 => vec![8, 125],
        _ => vec![len],
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn group_config() -> GroupConfig {
    GroupConfig {
        deadline: Duration::from_secs(60),
        ..GroupConfig::default()
    }
}

/// The reference: the reduction of host `inputs` by the host kernel, to `/cpu:0`.
fn host_reduce(op: ReduceOp, inputs: &[Tensor]) -> Result<Tensor, CollectiveError> {
    assert!(inputs.iter().all(|t| t.placement() == Placement::Host));
    let values: Vec<AnyTensor> = inputs
        .iter()
        .enumerate()
        // Devices other than the destination: the reduction always runs, even for one value.
        .map(|(r, t)| t.to_device(&format!("/cpu:{}", r + 1)).into())
        .collect();
    let ops = ReductionToOneDevice::new(inputs.len(), GroupConfig::default())?;
    let mut delivered = delivered(ops.reduce(op, &values, &Destinations::device("/cpu:0")?)?);
    let reduced = delivered.remove(0);
    assert_eq!(
        reduced.placement(),
        Placement::Host,
        "the reference is a host reduction"
    );
    Ok(reduced)
}

/// The tensors a reduction delivered, in destination order.
fn delivered(result: Leaf<AnyTensor>) -> Vec<Tensor> {
    let dense = |v: AnyTensor| match v {
        AnyTensor::Dense(t) => t,
        AnyTensor::Sparse(_) => panic!("a dense reduction gave IndexedSlices"),
    };
    match result {
        Leaf::Same(v) => vec![dense(v)],
        Leaf::Mirrored(m) => m.into_iter().map(dense).collect(),
        Leaf::PerReplica(_) => panic!("a reduction gave a PerReplica value"),
    }
}

/// Where a result delivered to `device` lives.
fn placement_of(device: &str) -> Placement {
    match Gpu::index_of(device).expect("a valid device name") {
        Some(ordinal) => Placement::Cuda { ordinal },
        None => Placement::Host,
    }
}

/// Where a reduction of host or GPU values (`on_gpu`) to `dests` delivers to `dest`: host values
/// reduce in host memory and are never uploaded; GPU values reduce on a GPU (a GPU destination's
/// when there is one) and each destination gets its own placement — GPU memory for a GPU, host
/// memory for a CPU.
fn expected_placement(on_gpu: bool, _dests: &[&str], dest: &str) -> Option<Placement> {
    Some(if on_gpu {
        placement_of(dest)
    } else {
        Placement::Host
    })
}

/// The elements' bit patterns and printed values, in row-major order.
fn elements(t: &Tensor) -> Vec<(u64, String)> {
    let host = t.to_host().expect("the tensor downloads");
    with_dtype!(host.dtype(), T => host
        .to_vec::<T>()
        .expect("the dtype matches")
        .into_iter()
        .map(|x| (Element::to_bits(x), x.to_string()))
        .collect())
}

/// Why `got` is not bitwise `want`: the first element that differs and the inputs there.
fn first_difference(got: &Tensor, want: &Tensor, inputs: &[Tensor]) -> String {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return format!(
            "got a {} {:?} tensor, expected {} {:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        );
    }
    let (g, w) = (elements(got), elements(want));
    let Some(i) = g.iter().zip(&w).position(|(a, b)| a.0 != b.0) else {
        return "no element differs".to_owned();
    };
    let ins: Vec<String> = inputs
        .iter()
        .map(|t| elements(t).swap_remove(i).1)
        .collect();
    format!(
        "element {i} of {}: got {} (bits {:#x}), expected {} (bits {:#x}); inputs there: [{}]",
        g.len(),
        g[i].1,
        g[i].0,
        w[i].1,
        w[i].0,
        ins.join(", ")
    )
}

fn assert_bitwise(got: &Tensor, want: &Tensor, inputs: &[Tensor], what: &str) {
    assert!(
        got.bitwise_eq(want),
        "{what}: {}",
        first_difference(got, want, inputs)
    );
}

/// Runs `step` on one thread per replica of a fresh group of `n`, each thread with a stream of
/// its own on GPU 0 (as a strategy's replica threads have), and returns every replica's result.
fn run_replicas<R: Send>(n: usize, step: impl Fn(&Member, &Gpu) -> R + Sync) -> Vec<R> {
    let group = CollectiveGroup::new(n, group_config()).expect("a valid group");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let member = group.member(r).expect("replica id in range");
                let step = &step;
                s.spawn(move || {
                    // A panic here drops `member` while panicking, which aborts the group, so the
                    // other replicas fail at once instead of waiting for the deadline.
                    let gpu = Gpu::open(0)
                        .and_then(|g| g.with_new_stream())
                        .expect("a replica stream on GPU 0");
                    step(&member, &gpu)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a replica thread panicked"))
            .collect()
    })
}

/// GPU copies of host tensors, labelled `/gpu:0`.
fn upload_all(host: &[Tensor], gpu: &Gpu) -> Vec<Tensor> {
    host.iter()
        .map(|t| t.to_device("/gpu:0").to_gpu(gpu).expect("upload"))
        .collect()
}

/// The cross-replica path: `ReductionToOneDevice::reduce` of the GPU copies of `host` to
/// `/gpu:0`, `/cpu:0` and both; every delivered tensor must be bitwise `expected`, in the memory
/// its destination names.
fn check_cross_replica(gpu: &Gpu, op: ReduceOp, host: &[Tensor], expected: &Tensor, what: &str) {
    let values: Vec<AnyTensor> = upload_all(host, gpu).into_iter().map(Into::into).collect();
    let ops = ReductionToOneDevice::new(host.len(), GroupConfig::default()).expect("backend");
    for dests in [&["/gpu:0"][..], &["/cpu:0"], &["/gpu:0", "/cpu:0"]] {
        let destinations = Destinations::devices(dests).expect("valid destinations");
        let result = ops
            .reduce(op, &values, &destinations)
            .unwrap_or_else(|e| panic!("{what} to {dests:?}: {e}"));
        let tensors = delivered(result);
        assert_eq!(tensors.len(), dests.len(), "{what} to {dests:?}");
        for ((t, dest), canonical) in tensors.iter().zip(dests).zip(destinations.as_slice()) {
            let what = format!("{what}, cross-replica to {dest} (of {dests:?})");
            assert_eq!(t.placement(), placement_of(dest), "{what}");
            assert_eq!(t.device(), canonical, "{what}");
            assert_bitwise(t, expected, host, &what);
        }
    }
}

/// The in-replica path: every replica thread uploads its input on its own stream and calls
/// `Member::all_reduce`; each gets `expected`, bitwise, on its own GPU.
fn check_in_replica(op: ReduceOp, host: &[Tensor], expected: &Tensor, what: &str) {
    let results = run_replicas(host.len(), |member, gpu| {
        let mine = host[member.replica()]
            .to_device("/gpu:0")
            .to_gpu(gpu)
            .expect("upload");
        (member.all_reduce(op, &mine), mine)
    });
    for (r, (result, mine)) in results.into_iter().enumerate() {
        let what = format!("{what}, in-replica, replica {r}");
        let result = result.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(result.device(), mine.device(), "{what}");
        assert_eq!(result.placement(), Placement::Cuda { ordinal: 0 }, "{what}");
        assert_bitwise(&result, expected, host, &what);
    }
}

/// The host inputs of one case of the bitwise comparisons.
fn case_inputs(op: ReduceOp, dtype: DType, n: usize, len: usize) -> Vec<Tensor> {
    let case = seed(&[op as u64, dtype as u64, n as u64, len as u64]);
    host_inputs(dtype, &shape_for(len), n, case)
}

/// Both paths for one case.
fn check_case(gpu: &Gpu, op: ReduceOp, dtype: DType, n: usize, len: usize) {
    let what = format!("{op} of {n} x {dtype} [{len}]");
    let host = case_inputs(op, dtype, n, len);
    let expected = host_reduce(op, &host).unwrap_or_else(|e| panic!("{what}: host: {e}"));
    check_cross_replica(gpu, op, &host, &expected, &what);
    check_in_replica(op, &host, &expected, &what);
}

// ---------------------------------------------------------------------------------------------
// 1. Probe

#[test]
fn probe_sees_the_gpu_and_its_properties() {
    let Some(gpu) = gpu_or_skip() else { return };
    let count = gpu_count().expect("the driver answers");
    assert!(count >= 1);
    assert_eq!(
        Gpu::open(count).unwrap_err(),
        GpuError::NoSuchGpu {
            ordinal: count,
            count
        }
    );
    let name = gpu.name().expect("the product name");
    assert!(!name.trim().is_empty());
    let (major, minor) = gpu.compute_capability().expect("the compute capability");
    assert!(
        major >= 1 && minor >= 0,
        "compute capability {major}.{minor}"
    );
    eprintln!("GPU 0 of {count}: {name}, compute capability {major}.{minor}");
    assert_eq!(gpu.ordinal(), 0);
    assert_eq!(gpu.device_name(), GPU0);
    // `open` gives the process-wide handle; `with_new_stream` the same device with a new stream.
    assert_eq!(Gpu::open(0).unwrap(), gpu);
    let own = gpu.with_new_stream().expect("a new stream");
    assert_ne!(own, gpu);
    assert_eq!(own.ordinal(), 0);
    own.synchronize().expect("an idle stream synchronizes");
    gpu.synchronize().expect("the shared stream synchronizes");
    assert_eq!(Gpu::index_of("/gpu:1"), Ok(Some(1)));
    assert_eq!(Gpu::index_of(GPU0), Ok(Some(0)));
    assert_eq!(Gpu::index_of("/cpu:0"), Ok(None));
    // The kernels compile for this very GPU.
    let ptx = compile_reduction_kernels(&format!("sm_{major}{minor}"))
        .unwrap_or_else(|e| panic!("kernels for sm_{major}{minor}: {e}"));
    assert!(ptx.contains(".entry reduce_sum_f32("));
}

// ---------------------------------------------------------------------------------------------
// 2. Round trips

const SHAPES: [&[usize]; 7] = [&[], &[0], &[7], &[3, 5], &[2, 0, 3], &[2, 3, 4], &[1000]];

#[test]
fn every_dtype_and_shape_round_trips_bitwise() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut uploader = PinnedUploader::new(&gpu);
    for dtype in DTYPES {
        for shape in SHAPES {
            let what = format!("{dtype} {shape:?}");
            let host = host_tensor(
                dtype,
                shape,
                0,
                seed(&[dtype as u64, shape.len() as u64]),
                "/cpu:0",
            );
            let g = host
                .to_gpu(&gpu)
                .unwrap_or_else(|e| panic!("{what}: upload: {e}"));
            assert_eq!(g.placement(), Placement::Cuda { ordinal: 0 }, "{what}");
            assert_eq!((g.dtype(), g.shape()), (dtype, shape), "{what}");
            assert_eq!(
                g.device(),
                GPU0,
                "{what}: /cpu:0 names no GPU, so the copy takes GPU 0's name"
            );
            let back = g
                .to_host()
                .unwrap_or_else(|e| panic!("{what}: download: {e}"));
            assert_eq!(back.placement(), Placement::Host, "{what}");
            assert_eq!((back.dtype(), back.shape()), (dtype, shape), "{what}");
            assert_bitwise(&back, &host, &[], &format!("{what}: to_gpu, to_host"));
            let down = g.copy_to("/cpu:0").unwrap();
            assert_eq!(down.placement(), Placement::Host, "{what}");
            assert_bitwise(&down, &host, &[], &format!("{what}: copy_to /cpu:0"));
            let pinned = uploader
                .upload(&host)
                .unwrap_or_else(|e| panic!("{what}: pinned: {e}"));
            assert_eq!(pinned.placement(), Placement::Cuda { ordinal: 0 }, "{what}");
            assert_eq!(pinned.device(), GPU0, "{what}");
            assert_bitwise(&pinned, &host, &[], &format!("{what}: pinned upload"));
        }
    }
}

/// Transposed, permuted and strided host views upload in logical (row-major) order.
/// A matrix, and host arrays in layouts other than row-major: transposed, column-major,
/// permuted and strided (every 2nd row, columns 1..).
fn layout_views<T: Sample>() -> (ArrayD<T>, Vec<(&'static str, ArrayD<T>)>) {
    let dtype = T::DTYPE;
    let matrix = ArrayD::from_shape_vec(
        IxDyn(&[3, 5]),
        values::<T>(0, 15, seed(&[dtype as u64, 15])),
    )
    .expect("15 elements");
    let cube = ArrayD::from_shape_vec(
        IxDyn(&[2, 3, 4]),
        values::<T>(1, 24, seed(&[dtype as u64, 24])),
    )
    .expect("24 elements");
    let column_major =
        ArrayD::from_shape_vec(IxDyn(&[3, 5]).f(), values::<T>(2, 15, 3)).expect("15 elements");
    let views = vec![
        ("transposed", matrix.clone().reversed_axes()),
        ("column-major", column_major),
        ("permuted", cube.clone().permuted_axes(IxDyn(&[2, 0, 1]))),
        ("strided", cube.slice_move(s![.., ..;2, 1..]).into_dyn()),
    ];
    (matrix, views)
}

/// Transposed, permuted and strided host views upload in logical (row-major) order.
fn layouts<T: Sample>(gpu: &Gpu, uploader: &mut PinnedUploader) {
    let dtype = T::DTYPE;
    let (matrix, views) = layout_views::<T>();
    for (name, view) in views {
        let what = format!("{dtype} {name} {:?}", view.shape());
        let logical: Vec<T> = view.iter().copied().collect();
        let standard = Tensor::from_vec("/cpu:0", view.shape(), logical.clone()).unwrap();
        let host = Tensor::from_array("/cpu:0", view);
        for (how, g) in [
            ("to_gpu", host.to_gpu(gpu).unwrap()),
            ("pinned", uploader.upload(&host).unwrap()),
        ] {
            let back = g.to_host().unwrap();
            assert_eq!(back.to_vec::<T>().unwrap(), logical, "{what} {how}");
            assert_bitwise(&back, &standard, &[], &format!("{what} {how}"));
            assert_bitwise(&g, &host, &[], &format!("{what} {how}"));
        }
    }
    // A non-standard layout in host memory: `a.t()` shares `a`'s buffer with reversed strides.
    let a = Tensor::from_array("/cpu:0", matrix.clone());
    let t = Tensor::from_shared("/cpu:0", a.array::<T>().unwrap().clone().reversed_axes());
    assert!(!t.array::<T>().unwrap().is_standard_layout());
    let back = t.to_gpu(gpu).unwrap().to_host().unwrap();
    assert_eq!(
        back.to_vec::<T>().unwrap(),
        matrix.t().iter().copied().collect::<Vec<_>>(),
        "{dtype} a.t()"
    );
    // A strided host input in a reduction with a GPU input reduces in logical order too.
    let other = Tensor::from_vec("/cpu:1", &[5, 3], values::<T>(3, 15, 4)).unwrap();
    let mixed: Vec<AnyTensor> = vec![
        t.to_gpu(gpu).unwrap().into(),
        t.to_device("/cpu:2").into(),
        other.clone().into(),
    ];
    let ops = ReductionToOneDevice::new(3, GroupConfig::default()).unwrap();
    let reduced = delivered(
        ops.reduce(
            ReduceOp::Max,
            &mixed,
            &Destinations::device("/cpu:0").unwrap(),
        )
        .unwrap(),
    )
    .remove(0);
    let expected = host_reduce(ReduceOp::Max, &[t.clone(), t.clone(), other]).unwrap();
    assert_bitwise(
        &reduced,
        &expected,
        &[],
        &format!("{dtype}: MAX of transposed inputs"),
    );
}

#[test]
fn transposed_and_strided_views_upload_in_logical_order() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut uploader = PinnedUploader::new(&gpu);
    for dtype in DTYPES {
        with_dtype!(dtype, T => layouts::<T>(&gpu, &mut uploader));
    }
}

#[test]
fn pinned_uploads_reuse_the_staging_buffer_safely() {
    let Some(gpu) = gpu_or_skip() else { return };
    let mut uploader = PinnedUploader::new(&gpu);
    let filled =
        |device: &str, len: usize, x: f32| Tensor::from_vec(device, &[len], vec![x; len]).unwrap();
    // 64 MiB: the copy out of the staging buffer takes long enough (about a millisecond) that
    // refilling the buffer before it finished would show in the first result.
    const LEN: usize = 16 << 20;
    let mut a = filled("/cpu:0", LEN, 1.0);
    let ga = uploader.upload(&a).unwrap();
    // The source may change or go away as soon as `upload` returns.
    a.array_mut::<f32>().unwrap().fill(-1.0);
    drop(a);
    // Same size: the staging buffer is reused.
    let gb = uploader.upload(&filled("/cpu:0", LEN, 2.0)).unwrap();
    // Another size (a new staging buffer), then the same byte count in another dtype.
    let c = Tensor::from_vec("/gpu:0", &[LEN / 4], vec![3.0f64; LEN / 4]).unwrap();
    let gc = uploader.upload(&c).unwrap();
    let d = Tensor::from_vec("/cpu:0", &[LEN / 2], vec![-4i32; LEN / 2]).unwrap();
    let gd = uploader.upload(&d).unwrap();
    // Many small uploads back to back through one buffer.
    let small: Vec<Tensor> = (0..8)
        .map(|k| {
            uploader
                .upload(&filled("/cpu:0", 1 << 18, k as f32))
                .unwrap()
        })
        .collect();
    // Empty, and already on the GPU (shared, as `to_gpu` does).
    let empty = uploader.upload(&filled("/cpu:0", 0, 0.0)).unwrap();
    let again = uploader.upload(&gb).unwrap();

    assert_bitwise(
        &ga,
        &filled("/cpu:0", LEN, 1.0),
        &[],
        "the first upload (a later one reused its staging buffer)",
    );
    assert_bitwise(&gb, &filled("/cpu:0", LEN, 2.0), &[], "the second upload");
    assert_bitwise(&gc, &c, &[], "an upload of another size");
    assert_bitwise(
        &gd,
        &d,
        &[],
        "an upload of the same byte count in another dtype",
    );
    for (k, t) in small.iter().enumerate() {
        assert_bitwise(
            t,
            &filled("/cpu:0", 1 << 18, k as f32),
            &[],
            &format!("small upload {k}"),
        );
    }
    assert_eq!(
        (gc.device(), gc.dtype()),
        ("/gpu:0", DType::F64),
        "a label naming the GPU is kept"
    );
    assert_eq!(
        (gd.device(), gd.placement()),
        (GPU0, Placement::Cuda { ordinal: 0 })
    );
    assert_eq!(
        (empty.placement(), empty.shape()),
        (Placement::Cuda { ordinal: 0 }, &[0][..])
    );
    assert!(again.shares_buffer_with(&gb));
}

// ---------------------------------------------------------------------------------------------
// 3. GPU reductions give the host kernel's bits

#[test]
fn gpu_reductions_match_the_host_kernel_bitwise() {
    let Some(gpu) = gpu_or_skip() else { return };
    for dtype in DTYPES {
        for op in OPS {
            if op == ReduceOp::Mean && !dtype.is_floating() {
                continue; // exact on the host: `integer_mean_of_gpu_tensors_is_the_host_float64_mean`
            }
            for n in 1..=5 {
                for len in [0, 1, 1000] {
                    check_case(&gpu, op, dtype, n, len);
                }
            }
        }
    }
}

/// More elements than one pass of the kernel's grid covers, and not a multiple of its block size.
const LARGE: usize = (1 << 20) + 3;

/// The few (op, dtype, replicas) reduced at [`LARGE`] size.
const LARGE_CASES: [(ReduceOp, DType, usize); 7] = [
    (ReduceOp::Sum, DType::F32, 5),
    (ReduceOp::Mean, DType::F16, 3),
    (ReduceOp::Mean, DType::BF16, 4),
    (ReduceOp::Max, DType::BF16, 2),
    (ReduceOp::Min, DType::F64, 4),
    (ReduceOp::Sum, DType::I32, 5),
    (ReduceOp::Max, DType::I64, 3),
];

#[test]
fn large_gpu_reductions_match_the_host_kernel_bitwise() {
    let Some(gpu) = gpu_or_skip() else { return };
    for (op, dtype, n) in LARGE_CASES {
        check_case(&gpu, op, dtype, n, LARGE);
    }
}

/// The kernels take their first 16 input pointers in the launch's parameters and the rest from a
/// table in device memory: replica counts on both sides of that line, at a length that leaves a
/// tail after the 16-byte packs of every dtype.
#[test]
fn more_inputs_than_the_launch_carries_inline_match_the_host_bitwise() {
    let Some(gpu) = gpu_or_skip() else { return };
    for dtype in DTYPES {
        let ops = if dtype.is_floating() {
            [ReduceOp::Sum, ReduceOp::Mean]
        } else {
            [ReduceOp::Sum, ReduceOp::Max]
        };
        for op in ops {
            for n in [16, 17, 33] {
                check_case(&gpu, op, dtype, n, 1027);
            }
        }
    }
}

/// The reduction of scalars on the GPU (to `/gpu:0`, then downloaded), checked against the host.
fn gpu_fold<T: Sample>(gpu: &Gpu, op: ReduceOp, inputs: &[T]) -> T {
    let host: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(r, &x)| Tensor::scalar(&format!("/cpu:{}", r + 1), x))
        .collect();
    let values: Vec<AnyTensor> = upload_all(&host, gpu).into_iter().map(Into::into).collect();
    let ops = ReductionToOneDevice::new(inputs.len(), GroupConfig::default()).unwrap();
    let reduced = delivered(
        ops.reduce(op, &values, &Destinations::device("/gpu:0").unwrap())
            .unwrap(),
    )
    .remove(0);
    assert_eq!(reduced.placement(), Placement::Cuda { ordinal: 0 });
    assert_bitwise(
        &reduced,
        &host_reduce(op, &host).unwrap(),
        &host,
        &format!("{op} of {inputs:?}"),
    );
    reduced.to_host().unwrap().to_vec::<T>().unwrap()[0]
}

#[test]
fn known_answers() {
    let Some(gpu) = gpu_or_skip() else { return };
    let h = f16::from_f32;
    // f16 accumulates in f32: 2048 + 1 + 1 = 2050 (step by step in f16 it would stay 2048).
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[h(2048.0), h(1.0), h(1.0)]),
        h(2050.0)
    );
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Mean, &[h(2048.0), h(1.0), h(1.0)]),
        h(2050.0 / 3.0)
    );
    // f16 and bf16 round once, ties to even: 1 + 2^-11 is 1 in f16, 1 + 2^-8 is 1 in bf16.
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[h(1.0), h(1.0 / 2048.0)]).to_bits(),
        h(1.0).to_bits()
    );
    let b = bf16::from_f32;
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[b(1.0), b(1.0 / 256.0)]).to_bits(),
        b(1.0).to_bits()
    );
    assert_eq!(
        gpu_fold(
            &gpu,
            ReduceOp::Sum,
            &[b(1.0), b(1.0 / 256.0), b(1.0 / 256.0)]
        ),
        b(1.0 + 1.0 / 128.0)
    );
    // In replica order: ((1e8 + -1e8) + 1) = 1, where 1e8 + (-1e8 + 1) would be 0.
    assert_eq!(gpu_fold(&gpu, ReduceOp::Sum, &[1.0e8f32, -1.0e8, 1.0]), 1.0);
    assert_eq!(gpu_fold(&gpu, ReduceOp::Sum, &[1.0f32, 1.0e8, -1.0e8]), 0.0);
    // MEAN is the sum divided (exactly rounded) by the replica count.
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Mean, &[1.0f32, 2.0, 2.0]),
        5.0f32 / 3.0
    );
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Mean, &[0.1f64, 0.2, 0.4]),
        (0.1 + 0.2 + 0.4) / 3.0
    );
    // Subnormals are not flushed to zero.
    let tiny = f32::from_bits(1);
    assert_eq!(gpu_fold(&gpu, ReduceOp::Sum, &[tiny, tiny]).to_bits(), 2);
    assert_eq!(gpu_fold(&gpu, ReduceOp::Max, &[-tiny, tiny]).to_bits(), 1);
    assert_eq!(
        gpu_fold(
            &gpu,
            ReduceOp::Sum,
            &[bf16::from_bits(1), bf16::from_bits(1)]
        )
        .to_bits(),
        2
    );
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[f64::from_bits(1); 3]).to_bits(),
        3
    );
    // Integers wrap.
    assert_eq!(gpu_fold(&gpu, ReduceOp::Sum, &[i32::MAX, 1]), i32::MIN);
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[i32::MIN, -1, 5]),
        i32::MIN + 4
    );
    assert_eq!(gpu_fold(&gpu, ReduceOp::Sum, &[i64::MAX, i64::MAX]), -2);
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Min, &[7i64, i64::MIN, 3]),
        i64::MIN
    );
    assert_eq!(gpu_fold(&gpu, ReduceOp::Max, &[i32::MIN, -3, i32::MIN]), -3);
    // Infinities.
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[f32::INFINITY, -3.0]),
        f32::INFINITY
    );
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[h(65504.0), h(65504.0)]),
        f16::INFINITY
    );
    assert_eq!(
        gpu_fold(&gpu, ReduceOp::Sum, &[h(65504.0), h(65504.0), h(-65504.0)]),
        h(65504.0)
    );
}

/// TF's true division: an integer MEAN of GPU tensors is the host kernel's exact float64 mean,
/// bit for bit, and stays in GPU memory when its destination is a GPU.
#[test]
fn integer_mean_of_gpu_tensors_is_the_host_float64_mean() {
    let Some(gpu) = gpu_or_skip() else { return };
    for dtype in [DType::I32, DType::I64] {
        for n in 1..=3 {
            let host = host_inputs(dtype, &[10], n, 5);
            let expected = host_reduce(ReduceOp::Mean, &host).unwrap();
            assert_eq!(expected.dtype(), DType::F64);
            let values: Vec<AnyTensor> = upload_all(&host, &gpu)
                .into_iter()
                .map(Into::into)
                .collect();
            let ops = ReductionToOneDevice::new(n, GroupConfig::default()).unwrap();
            for (dest, placement) in [
                ("/gpu:0", Placement::Cuda { ordinal: 0 }),
                ("/cpu:0", Placement::Host),
            ] {
                let result = ops
                    .reduce(
                        ReduceOp::Mean,
                        &values,
                        &Destinations::device(dest).unwrap(),
                    )
                    .unwrap();
                let reduced = delivered(result).remove(0);
                assert_eq!(
                    reduced.placement(),
                    placement,
                    "MEAN of {n} x {dtype} to {dest}"
                );
                assert!(
                    reduced
                        .to_host()
                        .unwrap()
                        .to_device(expected.device())
                        .bitwise_eq(&expected),
                    "MEAN of {n} x {dtype} to {dest}"
                );
            }
            let results = run_replicas(n, |member, gpu| {
                let mine = host[member.replica()].to_gpu(gpu).unwrap();
                member.all_reduce(ReduceOp::Mean, &mine)
            });
            for (r, result) in results.into_iter().enumerate() {
                let reduced = result.unwrap();
                assert_eq!(reduced.placement(), Placement::Cuda { ordinal: 0 });
                assert!(
                    reduced
                        .to_host()
                        .unwrap()
                        .to_device(expected.device())
                        .bitwise_eq(&expected),
                    "replica {r} of {n}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Mixed host and GPU inputs

#[test]
fn mixed_host_and_gpu_inputs_reduce_on_the_gpu_bitwise() {
    let Some(gpu) = gpu_or_skip() else { return };
    for dtype in DTYPES {
        for op in OPS {
            if op == ReduceOp::Mean && !dtype.is_floating() {
                continue;
            }
            for n in [2, 3, 5] {
                let what = format!("{op} of {n} x {dtype}, mixed");
                let host = host_inputs(
                    dtype,
                    &[1000],
                    n,
                    seed(&[op as u64, dtype as u64, n as u64, 77]),
                );
                let expected = host_reduce(op, &host).unwrap();
                let gpu_copies = upload_all(&host, &gpu);
                // Host first (so a CPU destination reduces on the first GPU input's GPU), and
                // GPU first.
                for gpu_first in [false, true] {
                    let on_gpu = |r: usize| r.is_multiple_of(2) == gpu_first;
                    let values: Vec<AnyTensor> = (0..n)
                        .map(|r| {
                            AnyTensor::from(if on_gpu(r) {
                                gpu_copies[r].clone()
                            } else {
                                host[r].clone()
                            })
                        })
                        .collect();
                    let ops = ReductionToOneDevice::new(n, GroupConfig::default()).unwrap();
                    for dest in ["/gpu:0", "/cpu:0"] {
                        let what =
                            format!("{what}, GPU first: {gpu_first}, cross-replica to {dest}");
                        let result = ops
                            .reduce(op, &values, &Destinations::device(dest).unwrap())
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        let t = delivered(result).remove(0);
                        assert_eq!(t.placement(), placement_of(dest), "{what}");
                        assert_bitwise(&t, &expected, &host, &what);
                    }
                    // In-replica: every replica gets the result on its own device.
                    let results = run_replicas(n, |member, gpu| {
                        let r = member.replica();
                        let mine = if on_gpu(r) {
                            host[r].to_device("/gpu:0").to_gpu(gpu).unwrap()
                        } else {
                            host[r].clone()
                        };
                        (member.all_reduce(op, &mine), mine)
                    });
                    for (r, (result, mine)) in results.into_iter().enumerate() {
                        let what =
                            format!("{what}, GPU first: {gpu_first}, in-replica, replica {r}");
                        let result = result.unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert_eq!(result.device(), mine.device(), "{what}");
                        // The reduction runs on a GPU input's device; each replica gets it
                        // where its own device says (GPU memory for a GPU, host for a CPU).
                        assert_eq!(result.placement(), placement_of(mine.device()), "{what}");
                        assert_bitwise(&result, &expected, &host, &what);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Batches

#[test]
fn batch_reduce_of_gpu_tensors_equals_one_by_one() {
    let Some(gpu) = gpu_or_skip() else { return };
    let n = 3;
    // (dtype, shape, on the GPU, destinations)
    let specs: [(DType, &[usize], bool, &[&str]); 10] = [
        (DType::F32, &[1000], true, &["/gpu:0"]),
        (DType::F16, &[7, 11], true, &["/cpu:0"]),
        (DType::I64, &[5], true, &["/gpu:0", "/cpu:0"]),
        (DType::BF16, &[4096], true, &["/gpu:0"]),
        (DType::F64, &[], true, &["/cpu:0"]),
        (DType::I32, &[0], true, &["/gpu:0"]),
        (DType::F32, &[3, 1000], true, &["/gpu:0"]),
        // Host pairs, fused into one reduction in host memory, between the GPU ones.
        (DType::F32, &[100], false, &["/cpu:0"]),
        (DType::F32, &[33], false, &["/cpu:0"]),
        (DType::I32, &[64], true, &["/cpu:0", "/gpu:0"]),
    ];
    let host: Vec<Vec<Tensor>> = specs
        .iter()
        .enumerate()
        .map(|(i, (dtype, shape, _, _))| host_inputs(*dtype, shape, n, seed(&[i as u64, 55])))
        .collect();
    let values: Vec<Vec<AnyTensor>> = specs
        .iter()
        .zip(&host)
        .map(|((_, _, on_gpu, _), h)| {
            if *on_gpu {
                upload_all(h, &gpu).into_iter().map(Into::into).collect()
            } else {
                h.iter().cloned().map(Into::into).collect()
            }
        })
        .collect();
    let destinations: Vec<Destinations> = specs
        .iter()
        .map(|s| Destinations::devices(s.3).unwrap())
        .collect();
    let backends: [Box<dyn CrossDeviceOps>; 2] = [
        Box::new(ReductionToOneDevice::new(n, GroupConfig::default()).unwrap()),
        Box::new(SharedMemoryAllReduce::new(n, GroupConfig::default()).unwrap()),
    ];
    for backend in &backends {
        for op in OPS {
            // MEAN only of the floating-point pairs.
            let chosen: Vec<usize> = (0..specs.len())
                .filter(|&i| op != ReduceOp::Mean || specs[i].0.is_floating())
                .collect();
            let pairs: Vec<(&[AnyTensor], &Destinations)> = chosen
                .iter()
                .map(|&i| (&values[i][..], &destinations[i]))
                .collect();
            let batch = backend
                .batch_reduce(op, &pairs)
                .unwrap_or_else(|e| panic!("{} batch {op}: {e}", backend.name()));
            assert_eq!(batch.len(), pairs.len());
            for ((&i, result), (vals, dests)) in chosen.iter().zip(batch).zip(&pairs) {
                let what = format!(
                    "{} batch {op}, pair {i} ({} {:?})",
                    backend.name(),
                    specs[i].0,
                    specs[i].1
                );
                let one = delivered(
                    backend
                        .reduce(op, vals, dests)
                        .unwrap_or_else(|e| panic!("{what}: one by one: {e}")),
                );
                let expected = host_reduce(op, &host[i]).unwrap();
                let got = delivered(result);
                assert_eq!(got.len(), one.len(), "{what}");
                for ((g, o), dest) in got.iter().zip(&one).zip(specs[i].3) {
                    assert_eq!(
                        (g.device(), g.placement()),
                        (o.device(), o.placement()),
                        "{what} to {dest}"
                    );
                    if let Some(placement) = expected_placement(specs[i].2, specs[i].3, dest) {
                        assert_eq!(g.placement(), placement, "{what} to {dest}");
                    }
                    assert_bitwise(
                        g,
                        o,
                        &host[i],
                        &format!("{what} to {dest}: batch vs one by one"),
                    );
                    assert_bitwise(
                        g,
                        &expected,
                        &host[i],
                        &format!("{what} to {dest}: vs host"),
                    );
                }
            }
        }
    }
}

#[test]
fn batch_all_reduce_of_gpu_tensors_equals_the_host() {
    let Some(_gpu) = gpu_or_skip() else { return };
    let n = 3;
    let specs: [(DType, &[usize]); 6] = [
        (DType::F32, &[1000]),
        (DType::F16, &[77]),
        (DType::I64, &[10]),
        (DType::BF16, &[]),
        (DType::F64, &[0]),
        (DType::I32, &[3, 4]),
    ];
    let host: Vec<Vec<Tensor>> = specs
        .iter()
        .enumerate()
        .map(|(i, (dtype, shape))| host_inputs(*dtype, shape, n, seed(&[i as u64, 66])))
        .collect();
    for op in OPS {
        // MEAN only of the floating-point tensors.
        let chosen: Vec<usize> = (0..specs.len())
            .filter(|&i| op != ReduceOp::Mean || specs[i].0.is_floating())
            .collect();
        let results = run_replicas(n, |member, gpu| {
            let mine: Vec<Tensor> = chosen
                .iter()
                .map(|&i| {
                    host[i][member.replica()]
                        .to_device("/gpu:0")
                        .to_gpu(gpu)
                        .unwrap()
                })
                .collect();
            member.batch_all_reduce(op, &mine)
        });
        for (r, result) in results.into_iter().enumerate() {
            let result =
                result.unwrap_or_else(|e| panic!("batch_all_reduce {op}, replica {r}: {e}"));
            assert_eq!(result.len(), chosen.len());
            for (&i, t) in chosen.iter().zip(&result) {
                let what = format!(
                    "batch_all_reduce {op}, replica {r}, tensor {i} ({} {:?})",
                    specs[i].0, specs[i].1
                );
                assert_eq!(
                    (t.device(), t.placement()),
                    ("/gpu:0", Placement::Cuda { ordinal: 0 }),
                    "{what}"
                );
                assert_bitwise(t, &host_reduce(op, &host[i]).unwrap(), &host[i], &what);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 6. NaN

/// Host inputs of `n` replicas with NaNs (of several signs and payloads) planted at a few places
/// of a few replicas, and where the reduction must be NaN: exactly there, and where `+inf` meets
/// `-inf` in a sum (element 45). `None` for integers.
fn nan_inputs<T: Sample>(op: ReduceOp, n: usize) -> Option<(Vec<Tensor>, Vec<bool>)> {
    let nans = T::nans();
    if nans.is_empty() {
        return None;
    }
    let len = 64;
    let mut data: Vec<Vec<T>> = (0..n)
        .map(|r| values::<T>(r, len, seed(&[op as u64, n as u64, 99])))
        .collect();
    // (element, replica, which NaN); element 10 holds +inf in replica 0.
    let places = [
        (40, 0, 0),
        (41, n - 1, 1),
        (43, n / 2, 2),
        (44, 0, 1),
        (44, n - 1, 2),
        (10, n - 1, 0),
    ];
    for &(i, r, k) in &places {
        data[r][i] = nans[k];
    }
    for replica in &mut data {
        replica[42] = nans[0]; // every replica
    }
    // +inf meets -inf at element 45 (from the columns that hold them): NaN for SUM and MEAN.
    data[0][45] = T::columns()[10][0];
    if n >= 2 {
        data[n - 1][45] = T::columns()[11][1];
    }
    let mut nan_at: Vec<bool> = (0..len)
        .map(|i| data.iter().any(|d| d[i].is_nan()))
        .collect();
    nan_at[45] = n >= 2 && matches!(op, ReduceOp::Sum | ReduceOp::Mean);
    let host = data
        .into_iter()
        .enumerate()
        .map(|(r, d)| Tensor::from_vec(&format!("/cpu:{}", r + 1), &[len], d).unwrap())
        .collect();
    Some((host, nan_at))
}

/// `got` is NaN exactly where `nan_at` says, and bitwise `want` everywhere else.
fn check_nans<T: Sample>(got: &Tensor, want: &Tensor, nan_at: &[bool], what: &str) {
    let got = got.to_host().unwrap().to_vec::<T>().unwrap();
    let want = want.to_host().unwrap().to_vec::<T>().unwrap();
    assert_eq!(
        (got.len(), want.len()),
        (nan_at.len(), nan_at.len()),
        "{what}"
    );
    for (i, ((&nan, &want), &got)) in nan_at.iter().zip(&want).zip(&got).enumerate() {
        if nan {
            assert!(got.is_nan(), "{what}, element {i}: {got} is not NaN");
        } else {
            assert_eq!(
                Element::to_bits(got),
                Element::to_bits(want),
                "{what}, element {i}: {got} vs {want}"
            );
        }
    }
}

fn nan_case<T: Sample>(gpu: &Gpu, op: ReduceOp, n: usize) {
    let Some((host, nan_at)) = nan_inputs::<T>(op, n) else {
        return;
    };
    let expected = host_reduce(op, &host).unwrap();
    let what = format!("{op} of {n} x {} with NaNs", T::DTYPE);
    let values: Vec<AnyTensor> = upload_all(&host, gpu).into_iter().map(Into::into).collect();
    let ops = ReductionToOneDevice::new(n, GroupConfig::default()).unwrap();
    for dest in ["/gpu:0", "/cpu:0"] {
        let t = delivered(
            ops.reduce(op, &values, &Destinations::device(dest).unwrap())
                .unwrap(),
        )
        .remove(0);
        check_nans::<T>(&t, &expected, &nan_at, &format!("{what} to {dest}"));
    }
    let results = run_replicas(n, |member, gpu| {
        member.all_reduce(op, &host[member.replica()].to_gpu(gpu).unwrap())
    });
    for (r, result) in results.into_iter().enumerate() {
        check_nans::<T>(
            &result.unwrap(),
            &expected,
            &nan_at,
            &format!("{what}, in-replica, replica {r}"),
        );
    }
}

#[test]
fn nan_inputs_give_nan_results() {
    let Some(gpu) = gpu_or_skip() else { return };
    for dtype in FLOATS {
        for op in OPS {
            for n in [1, 2, 3, 5] {
                with_dtype!(dtype, T => nan_case::<T>(&gpu, op, n));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Moving, comparing and printing GPU tensors

#[test]
fn gpu_tensors_move_compare_and_print() {
    let Some(gpu) = gpu_or_skip() else { return };
    let count = gpu_count().unwrap();
    let host =
        Tensor::from_vec("/cpu:0", &[2, 3], vec![1.0f32, -2.0, 3.5, 0.25, 0.0, -0.0]).unwrap();
    let g = host.to_gpu(&gpu).unwrap();
    assert_eq!(g.placement(), Placement::Cuda { ordinal: 0 });
    assert_eq!(host.placement(), Placement::Host);
    assert_eq!(g.device(), GPU0);
    assert_eq!(
        host.to_device("/gpu:0").to_gpu(&gpu).unwrap().device(),
        "/gpu:0",
        "a label naming the GPU is kept"
    );
    assert_eq!(
        (
            g.dtype(),
            g.shape(),
            g.rank(),
            g.num_elements(),
            g.size_in_bytes()
        ),
        (DType::F32, &[2, 3][..], 2, 6, 24)
    );

    // Host accessors refuse, naming the device.
    assert_eq!(
        g.array::<f32>().unwrap_err(),
        TensorError::OnGpu {
            device: GPU0.to_owned()
        }
    );
    assert!(matches!(g.to_vec::<f32>(), Err(TensorError::OnGpu { .. })));
    let mut writable = g.clone();
    assert!(matches!(
        writable.array_mut::<f32>(),
        Err(TensorError::OnGpu { .. })
    ));
    let error = g.array::<f32>().unwrap_err().to_string();
    assert!(
        error.contains("GPU memory") && error.contains("to_host"),
        "{error}"
    );

    // Display says where the elements are instead of printing them.
    let shown = g.to_string();
    assert!(
        shown.contains("float32") && shown.contains("[2, 3]") && shown.contains(GPU0),
        "{shown}"
    );
    assert!(shown.contains("memory of GPU 0"), "{shown}");
    assert_eq!(format!("{g:?}"), shown);

    // Comparisons copy to the host.
    assert!(g.bitwise_eq(&host) && host.bitwise_eq(&g) && g.bitwise_eq(&g));
    assert_eq!(g, g.clone());
    assert_eq!(
        g,
        host.to_device(GPU0),
        "a GPU tensor equals a host tensor of the same device"
    );
    assert_ne!(g, host, "different devices");
    let other =
        Tensor::from_vec("/cpu:0", &[2, 3], vec![1.0f32, -2.0, 3.5, 0.25, 0.0, 1.0]).unwrap();
    assert!(!g.bitwise_eq(&other.to_gpu(&gpu).unwrap()));
    assert_ne!(g, other.to_gpu(&gpu).unwrap());
    // `==` has NaN != NaN and 0 == -0; `bitwise_eq` the opposite.
    let nan = Tensor::from_vec("/cpu:0", &[2], vec![f32::NAN, 1.0])
        .unwrap()
        .to_gpu(&gpu)
        .unwrap();
    assert_ne!(nan, nan.clone());
    assert!(nan.bitwise_eq(&nan.clone()));
    let zero = Tensor::scalar("/cpu:0", 0.0f32).to_gpu(&gpu).unwrap();
    let negative_zero = Tensor::scalar("/cpu:0", -0.0f32).to_gpu(&gpu).unwrap();
    assert_eq!(zero, negative_zero);
    assert!(!zero.bitwise_eq(&negative_zero));
    assert!(
        !g.bitwise_eq(&Tensor::from_vec("/cpu:0", &[6], vec![0.0f32; 6]).unwrap()),
        "shapes differ"
    );
    assert!(
        !g.bitwise_eq(&Tensor::zeros("/cpu:0", DType::F64, &[2, 3]).unwrap()),
        "dtypes differ"
    );

    // copy_to: shared on the same GPU, downloaded for a CPU device.
    for label in ["/gpu:0", GPU0, "/device:GPU:0"] {
        let same = g.copy_to(label).unwrap();
        assert_eq!(
            (same.device(), same.placement()),
            (label, Placement::Cuda { ordinal: 0 })
        );
        assert!(same.shares_buffer_with(&g), "{label}: nothing copied");
    }
    let down = g.copy_to("/cpu:0").unwrap();
    assert_eq!(
        (down.device(), down.placement()),
        ("/cpu:0", Placement::Host)
    );
    assert!(down.bitwise_eq(&host) && !down.shares_buffer_with(&g));
    assert_eq!(down, host);
    let home = g.to_host().unwrap();
    assert_eq!((home.device(), home.placement()), (GPU0, Placement::Host));
    // A host tensor is only relabelled: host data is never uploaded behind the caller's back.
    let relabelled = host.copy_to("/gpu:0").unwrap();
    assert_eq!(
        (relabelled.device(), relabelled.placement()),
        ("/gpu:0", Placement::Host)
    );
    assert!(relabelled.shares_buffer_with(&host));
    // Already on the GPU: `to_gpu` shares, whatever the stream.
    assert!(g.to_gpu(&gpu).unwrap().shares_buffer_with(&g));
    assert!(
        g.to_gpu(&gpu.with_new_stream().unwrap())
            .unwrap()
            .shares_buffer_with(&g)
    );
    // A GPU past the last one, and a bad name.
    assert_eq!(
        g.copy_to("/gpu:99").unwrap_err(),
        TensorError::Gpu(GpuError::NoSuchGpu { ordinal: 99, count })
    );
    assert!(matches!(g.copy_to("/bogus:1"), Err(TensorError::Device(_))));

    // A broadcast to a GPU and a CPU: the GPU copy shares, the CPU copy is downloaded.
    let ops = ReductionToOneDevice::new(2, GroupConfig::default()).unwrap();
    let copies: Vec<Tensor> = match ops
        .broadcast(&g, &Destinations::devices(["/gpu:0", "/cpu:0"]).unwrap())
        .unwrap()
    {
        Leaf::Mirrored(m) => m.into_iter().collect(),
        _ => panic!("two destinations give a Mirrored value"),
    };
    assert_eq!(
        (copies[0].device(), copies[0].placement()),
        (GPU0, Placement::Cuda { ordinal: 0 })
    );
    assert!(copies[0].shares_buffer_with(&g));
    assert_eq!(
        (copies[1].device(), copies[1].placement()),
        (CPU0, Placement::Host)
    );
    assert!(copies[1].bitwise_eq(&host));
}

#[test]
fn in_replica_broadcast_gather_and_scatter_of_gpu_tensors() {
    let Some(_gpu) = gpu_or_skip() else { return };
    let host = host_inputs(DType::F32, &[4, 3], 2, 21);
    let results = run_replicas(2, |member, gpu| {
        let mine = host[member.replica()]
            .to_device("/gpu:0")
            .to_gpu(gpu)
            .unwrap();
        let root = (member.replica() == 1).then_some(&mine);
        (
            member.broadcast(1, root),
            member.all_gather(&mine),
            member.reduce_scatter(ReduceOp::Sum, &mine),
            // The group still works after the refusals.
            member.all_reduce(ReduceOp::Sum, &mine),
        )
    });
    let expected = host_reduce(ReduceOp::Sum, &host).unwrap();
    for (r, (broadcast, gather, scatter, sum)) in results.into_iter().enumerate() {
        assert_bitwise(
            &broadcast.unwrap(),
            &host[1],
            &host,
            &format!("broadcast, replica {r}"),
        );
        assert!(
            matches!(gather, Err(CollectiveError::Unimplemented(_))),
            "all_gather, replica {r}: {gather:?}"
        );
        assert!(
            matches!(scatter, Err(CollectiveError::Unimplemented(_))),
            "reduce_scatter, replica {r}: {scatter:?}"
        );
        assert_bitwise(
            &sum.unwrap(),
            &expected,
            &host,
            &format!("all_reduce after the refusals, replica {r}"),
        );
    }
}

#[test]
fn two_gpus_peer_copy_and_reduce() {
    let Some(gpu0) = gpu_or_skip() else { return };
    let Some(gpu1) = second_gpu("peer copies between GPUs") else {
        return;
    };
    assert_eq!((gpu1.ordinal(), gpu1.device_name()), (1, GPU1.to_owned()));
    let host = host_inputs(DType::F32, &[1000], 2, 31);
    let g0 = host[0].to_device("/gpu:0").to_gpu(&gpu0).unwrap();
    let g1 = g0.copy_to("/gpu:1").unwrap();
    assert_eq!(
        (g1.device(), g1.placement()),
        ("/gpu:1", Placement::Cuda { ordinal: 1 })
    );
    assert!(!g1.shares_buffer_with(&g0));
    assert_bitwise(&g1, &host[0], &[], "peer copy GPU 0 -> GPU 1");
    let back = g1.copy_to("/gpu:0").unwrap();
    assert_eq!(back.placement(), Placement::Cuda { ordinal: 0 });
    assert_bitwise(&back, &host[0], &[], "peer copy GPU 1 -> GPU 0");
    let moved = g0.to_gpu(&gpu1).unwrap();
    assert_eq!(
        (moved.device(), moved.placement()),
        (GPU1, Placement::Cuda { ordinal: 1 })
    );
    assert_bitwise(&moved, &host[0], &[], "to_gpu GPU 0 -> GPU 1");

    // Cross-replica: one value per GPU, reduced on the GPU the first destination names.
    for op in OPS {
        let expected = host_reduce(op, &host).unwrap();
        let values: Vec<AnyTensor> = vec![
            host[0].to_device("/gpu:0").to_gpu(&gpu0).unwrap().into(),
            host[1].to_device("/gpu:1").to_gpu(&gpu1).unwrap().into(),
        ];
        let ops = ReductionToOneDevice::new(2, GroupConfig::default()).unwrap();
        for dests in [
            &["/gpu:1"][..],
            &["/gpu:0", "/gpu:1"],
            &["/gpu:1", "/cpu:0"],
        ] {
            let tensors = delivered(
                ops.reduce(op, &values, &Destinations::devices(dests).unwrap())
                    .unwrap(),
            );
            for (t, dest) in tensors.iter().zip(dests) {
                let what = format!("{op} over 2 GPUs to {dest} (of {dests:?})");
                assert_eq!(t.placement(), placement_of(dest), "{what}");
                assert_bitwise(t, &expected, &host, &what);
            }
        }
        // In-replica: replica r on GPU r gets the result on GPU r.
        let group = CollectiveGroup::new(2, group_config()).unwrap();
        let results: Vec<Tensor> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|r| {
                    let member = group.member(r).unwrap();
                    let host = &host;
                    s.spawn(move || {
                        let gpu = Gpu::open(r).unwrap().with_new_stream().unwrap();
                        let mine = host[r]
                            .to_device(&format!("/gpu:{r}"))
                            .to_gpu(&gpu)
                            .unwrap();
                        member.all_reduce(op, &mine).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, t) in results.iter().enumerate() {
            let what = format!("{op} over 2 GPUs, in-replica, replica {r}");
            assert_eq!(
                (t.device(), t.placement()),
                (format!("/gpu:{r}").as_str(), Placement::Cuda { ordinal: r }),
                "{what}"
            );
            assert_bitwise(t, &expected, &host, &what);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Without a GPU

#[test]
fn without_a_gpu_errors_are_typed_and_host_work_still_runs() {
    let expected = match gpu_count() {
        Ok(n) if n > 0 => {
            eprintln!("skipped: this machine has {n} GPU(s); the other tests cover it");
            return;
        }
        Ok(_) => GpuError::NoSuchGpu {
            ordinal: 0,
            count: 0,
        },
        Err(e) => {
            assert!(matches!(e, GpuError::NoDriver | GpuError::NoGpu(_)), "{e}");
            e
        }
    };
    assert_eq!(Gpu::open(0).unwrap_err(), expected);
    // Host tensors need no GPU, even bound for one: they are relabelled, and reduced on the host.
    let a = Tensor::from_vec("/cpu:1", &[3], vec![1.0f32, 2.0, 3.0]).unwrap();
    assert_eq!(a.copy_to("/gpu:0").unwrap().placement(), Placement::Host);
    let ops = ReductionToOneDevice::new(2, GroupConfig::default()).unwrap();
    let values: Vec<AnyTensor> = vec![a.clone().into(), a.to_device("/cpu:2").into()];
    let t = delivered(
        ops.reduce(
            ReduceOp::Sum,
            &values,
            &Destinations::device("/gpu:0").unwrap(),
        )
        .unwrap(),
    )
    .remove(0);
    assert_eq!((t.device(), t.placement()), (GPU0, Placement::Host));
    assert_eq!(t.to_vec::<f32>().unwrap(), [2.0, 4.0, 6.0]);
}

// ---------------------------------------------------------------------------------------------
// The test data itself, checked on the host (no GPU needed, so these run everywhere)

/// True when any element of a host tensor is NaN.
fn has_nan(t: &Tensor) -> bool {
    with_dtype!(t.dtype(), T => t.to_vec::<T>().unwrap().into_iter().any(Sample::is_nan))
}

#[test]
fn test_data_has_no_nan_result_and_hits_the_rounding_cases() {
    // A NaN result would compare its payload, which the GPU may set differently: the bitwise
    // comparisons must have none (NaN gets its own test).
    let mut cases: Vec<(ReduceOp, DType, usize, usize)> = LARGE_CASES
        .iter()
        .map(|&(op, dtype, n)| (op, dtype, n, LARGE))
        .collect();
    for dtype in DTYPES {
        for op in OPS {
            for n in 1..=5 {
                for len in [0, 1, 1000] {
                    cases.push((op, dtype, n, len));
                }
            }
        }
    }
    for (op, dtype, n, len) in cases {
        let host = case_inputs(op, dtype, n, len);
        assert_eq!(host.len(), n);
        assert!(
            host.iter()
                .all(|t| t.num_elements() == len && t.dtype() == dtype)
        );
        match host_reduce(op, &host) {
            Ok(reference) => assert!(
                !has_nan(&reference),
                "{op} of {n} x {dtype} [{len}] has a NaN"
            ),
            Err(e) => assert!(
                op == ReduceOp::Mean && !dtype.is_floating(),
                "{op} of {n} x {dtype}: {e}"
            ),
        }
    }
    // The mixed and batch tests' data too.
    for dtype in DTYPES {
        for n in [2, 3, 5] {
            for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
                let host = host_inputs(
                    dtype,
                    &[1000],
                    n,
                    seed(&[op as u64, dtype as u64, n as u64, 77]),
                );
                assert!(!has_nan(&host_reduce(op, &host).unwrap()));
            }
        }
    }
    // Element 0 is the f16 rounding case: 2048 + 1 + 1 = 2050 in the f32 accumulator.
    let f16_sum = host_reduce(ReduceOp::Sum, &host_inputs(DType::F16, &[1000], 3, 1)).unwrap();
    assert_eq!(f16_sum.to_vec::<f16>().unwrap()[0], f16::from_f32(2050.0));
    // And the i32 wrapping case: MAX + 1 = MIN.
    let i32_sum = host_reduce(ReduceOp::Sum, &host_inputs(DType::I32, &[1000], 2, 1)).unwrap();
    assert_eq!(i32_sum.to_vec::<i32>().unwrap()[0], i32::MIN);
    // The data is the same every time, and differs between replicas and seeds.
    let a = host_tensor(DType::F32, &[1000], 2, 9, "/cpu:0");
    assert!(a.bitwise_eq(&host_tensor(DType::F32, &[1000], 2, 9, "/cpu:0")));
    assert!(!a.bitwise_eq(&host_tensor(DType::F32, &[1000], 3, 9, "/cpu:0")));
    assert!(!a.bitwise_eq(&host_tensor(DType::F32, &[1000], 2, 10, "/cpu:0")));
    // Failures name the first differing element and the inputs there.
    let mut b = a.clone();
    b.array_mut::<f32>().unwrap()[[700]] = 0.5;
    let why = first_difference(&b, &a, &[a.clone(), b.clone()]);
    assert!(
        why.starts_with("element 700 of 1000: got 0.5 (bits 0x3f000000), expected "),
        "{why}"
    );
    assert!(why.ends_with(", 0.5]"), "{why}");
    assert_eq!(first_difference(&a, &a, &[]), "no element differs");
}

#[test]
fn nan_test_data_makes_nan_exactly_where_planted() {
    for dtype in FLOATS {
        for op in OPS {
            for n in [1, 2, 3, 5] {
                with_dtype!(dtype, T => {
                    let (host, nan_at) = nan_inputs::<T>(op, n).expect("a floating type");
                    let reference = host_reduce(op, &host).unwrap();
                    let got: Vec<bool> = reference.to_vec::<T>().unwrap().into_iter().map(Sample::is_nan).collect();
                    assert_eq!(got, nan_at, "{op} of {n} x {dtype}");
                    assert!(nan_at.iter().filter(|&&x| x).count() >= 5);
                });
            }
        }
    }
}

#[test]
fn layout_test_data_is_not_row_major() {
    fn check<T: Sample>() {
        let (matrix, views) = layout_views::<T>();
        assert!(matrix.is_standard_layout());
        for (name, view) in views {
            assert!(!view.is_standard_layout(), "{} {name}", T::DTYPE);
            // A tensor keeps the layout, so the upload really gets a strided host array.
            let t = Tensor::from_array("/cpu:0", view.clone());
            assert!(
                !t.array::<T>().unwrap().is_standard_layout(),
                "{} {name}",
                T::DTYPE
            );
            assert_eq!(
                t.to_vec::<T>().unwrap(),
                view.iter().copied().collect::<Vec<_>>()
            );
        }
        let a = Tensor::from_array("/cpu:0", matrix);
        let t = a.array::<T>().unwrap().clone().reversed_axes();
        assert!(!t.is_standard_layout());
    }
    for dtype in DTYPES {
        with_dtype!(dtype, T => check::<T>());
    }
}
