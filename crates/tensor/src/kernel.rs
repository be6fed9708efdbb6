//! Element-wise reduction kernels on host memory, in a fixed order.
//!
//! Every output element is `((in[0] ⊕ in[1]) ⊕ in[2]) ⊕ …` in input (replica) order, whatever
//! thread computes it and however the work is split: that is what makes the results of the
//! deterministic mode bitwise identical across runs, replicas and backends. `f16` and `bf16`
//! accumulate in `f32` and round once; integers add with wrapping (no panic, same bits
//! everywhere). `Mean` divides the sum by the input count; for integers it is TF's true division,
//! the exact mean as float64: the inputs are summed exactly in `i128` (no wrapping, and in any
//! order the same bits), the sum converted to `f64` once and divided.
//!
//! The work is done in tiles of a few cache lines whose accumulators stay in registers while
//! every input is folded in, so each input element is read once and each output element written
//! once: the memory traffic is the minimum, `N·S` read and `S` written. Outputs too large for the
//! caches are written with non-temporal (streaming) stores, which skip reading each output line
//! before overwriting it; the arithmetic, hence every bit, is the same either way.

use distribute_values::ReduceOp;
use half::{bf16, f16};
use ndarray::{ArcArray, IxDyn};

use crate::{DType, Tensor, TensorError};
use crate::{Element, with_dtype};

/// Elements per tile: the accumulators of one tile (at most 256 bytes) stay in registers while
/// every input is folded in, and the inputs are read as sequential streams the prefetcher
/// follows. (Folding whole 16 KiB blocks input by input instead ran at half the memory
/// bandwidth: every block went through L1 three times.)
const TILE: usize = 32;

/// Outputs of at least this many bytes are written with streaming stores. They would not stay
/// in the caches anyway (they are a quarter of the last-level cache with inputs twice their size
/// or more), and a normal store first reads the line it overwrites: for two inputs that is a
/// quarter of the memory traffic. Smaller outputs are stored normally, so the reader finds them
/// in cache.
pub const STREAM_MIN_BYTES: usize = 8 << 20;

/// Arithmetic of one element type, with its accumulator type.
///
/// Implemented for every [`Element`] type; a backend names it as the bound of code generic over
/// the dtype (inside [`with_dtype!`](crate::with_dtype)).
pub trait Arith: Element {
    /// The type sums are kept in.
    type Acc: Copy + Default + Send + Sync;
    /// The element widened to its accumulator.
    fn load(self) -> Self::Acc;
    /// The accumulator rounded back to the element type.
    fn store(acc: Self::Acc) -> Self;
    /// `a + b`.
    fn add(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `a - b`.
    fn sub(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The smaller of `a` and `b`.
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// The larger of `a` and `b`.
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    /// `a / n`, or `None` where division has no exact meaning (integers).
    fn div(a: Self::Acc, n: usize) -> Option<Self::Acc>;
}

macro_rules! float_arith {
    ($ty:ty, $acc:ty, $load:expr, $store:expr) => {
        impl Arith for $ty {
            type Acc = $acc;
            #[inline(always)]
            fn load(self) -> $acc {
                ($load)(self)
            }
            #[inline(always)]
            fn store(acc: $acc) -> Self {
                ($store)(acc)
            }
            #[inline(always)]
            fn add(a: $acc, b: $acc) -> $acc {
                a + b
            }
            #[inline(always)]
            fn sub(a: $acc, b: $acc) -> $acc {
                a - b
            }
            // NaN wins in both, as in tf.minimum / tf.maximum.
            #[inline(always)]
            fn min(a: $acc, b: $acc) -> $acc {
                if a.is_nan() || a < b { a } else { b }
            }
            #[inline(always)]
            fn max(a: $acc, b: $acc) -> $acc {
                if a.is_nan() || a > b { a } else { b }
            }
            #[inline(always)]
            fn div(a: $acc, n: usize) -> Option<$acc> {
                Some(a / n as $acc)
            }
        }
    };
}

float_arith!(f32, f32, |x| x, |x| x);
float_arith!(f64, f64, |x| x, |x| x);
float_arith!(f16, f32, f16::to_f32, f16::from_f32);
float_arith!(bf16, f32, bf16::to_f32, bf16::from_f32);

macro_rules! int_arith {
    ($ty:ty) => {
        impl Arith for $ty {
            type Acc = $ty;
            #[inline(always)]
            fn load(self) -> $ty {
                self
            }
            #[inline(always)]
            fn store(acc: $ty) -> Self {
                acc
            }
            #[inline(always)]
            fn add(a: $ty, b: $ty) -> $ty {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn sub(a: $ty, b: $ty) -> $ty {
                a.wrapping_sub(b)
            }
            #[inline(always)]
            fn min(a: $ty, b: $ty) -> $ty {
                Ord::min(a, b)
            }
            #[inline(always)]
            fn max(a: $ty, b: $ty) -> $ty {
                Ord::max(a, b)
            }
            fn div(_: $ty, _: usize) -> Option<$ty> {
                None
            }
        }
    };
}

int_arith!(i32);
int_arith!(i64);

/// An integer element type whose `Mean` is computed exactly, through `i128`.
pub trait ExactInt: Element {
    /// The element, widened without loss.
    fn wide(self) -> i128;
}

impl ExactInt for i32 {
    #[inline(always)]
    fn wide(self) -> i128 {
        i128::from(self)
    }
}

impl ExactInt for i64 {
    #[inline(always)]
    fn wide(self) -> i128 {
        i128::from(self)
    }
}

/// Whether `op` over `dtype` is an integer `Mean`, which gives float64 (TF's true division).
pub fn is_integer_mean(op: ReduceOp, dtype: DType) -> bool {
    op == ReduceOp::Mean && !dtype.is_floating()
}

/// The dtype of the reduction of `dtype` tensors with `op`: float64 for an integer `Mean`, else
/// `dtype` itself.
pub fn reduced_dtype(op: ReduceOp, dtype: DType) -> DType {
    if is_integer_mean(op, dtype) {
        DType::F64
    } else {
        dtype
    }
}

/// The exact mean of element `i` of every input into `out[i]`: the sum in `i128` (it cannot
/// overflow: 2^64 inputs of 2^63 would be needed), converted to `f64` once and divided by
/// `divisor`, so the result is TF's `sum / n` without its wrap-around.
pub fn integer_mean_slices<T: ExactInt>(inputs: &[&[T]], out: &mut [f64], divisor: usize) {
    const WIDE_BLOCK: usize = 1024;
    let mut acc = [0i128; WIDE_BLOCK];
    let mut start = 0;
    while start < out.len() {
        let end = (start + WIDE_BLOCK).min(out.len());
        let acc = &mut acc[..end - start];
        acc.fill(0);
        for input in inputs {
            for (a, &x) in acc.iter_mut().zip(&input[start..end]) {
                *a += x.wide();
            }
        }
        for (o, &a) in out[start..end].iter_mut().zip(acc.iter()) {
            *o = a as f64 / divisor as f64;
        }
        start = end;
    }
}

/// The float64 mean of integer tensors of one shape, on the host, placed on `device`.
fn integer_mean_tensors(
    inputs: &[&Tensor],
    device: &str,
    divisor: usize,
) -> Result<Tensor, TensorError> {
    fn typed<T: ExactInt>(
        inputs: &[&Tensor],
        device: &str,
        divisor: usize,
    ) -> Result<Tensor, TensorError> {
        // A GPU input is read from host memory: the exact sum has no GPU kernel.
        let host = inputs
            .iter()
            .map(|t| t.to_host())
            .collect::<Result<Vec<_>, _>>()?;
        let owned = host
            .iter()
            .map(|t| Ok(t.array::<T>()?.iter().copied().collect::<Vec<T>>()))
            .collect::<Result<Vec<_>, TensorError>>()?;
        let slices: Vec<&[T]> = owned.iter().map(Vec::as_slice).collect();
        let mut out = vec![0.0f64; slices[0].len()];
        integer_mean_slices(&slices, &mut out, divisor);
        place_like_a_gpu_reduction(Tensor::from_vec(device, inputs[0].shape(), out)?, inputs)
    }
    match inputs[0].dtype() {
        DType::I32 => typed::<i32>(inputs, device, divisor),
        DType::I64 => typed::<i64>(inputs, device, divisor),
        other => Err(TensorError::Invariant(format!(
            "{other} is not an integer type"
        ))),
    }
}

/// A host result where a GPU reduction of `inputs` would have left it: in the memory of the GPU
/// its device names when an input lives on a GPU (host data is otherwise never uploaded).
fn place_like_a_gpu_reduction(result: Tensor, inputs: &[&Tensor]) -> Result<Tensor, TensorError> {
    #[cfg(feature = "cuda")]
    if inputs
        .iter()
        .any(|t| t.placement() != crate::Placement::Host)
        && let Some(ordinal) = crate::cuda::Gpu::index_of(result.device())?
    {
        return result.to_gpu(&crate::cuda::Gpu::open(ordinal)?);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = inputs;
    Ok(result)
}

/// Fails for `Mean` of an integer dtype where the caller has no exact path for it (reductions
/// along an axis, NCCL), before any work is done.
pub fn check_op(op: ReduceOp, dtype: DType) -> Result<(), TensorError> {
    if op == ReduceOp::Mean && !dtype.is_floating() {
        return Err(TensorError::IntegerMean(dtype));
    }
    Ok(())
}

/// Reduces element `i` of every input into `out[i]`, for `i` in `0..out.len()`.
///
/// `divisor` is what `Mean` divides by (the replica count, which may differ from `inputs.len()`
/// when several workers contribute). Inputs must be at least as long as `out`.
pub fn reduce_slices<T: Arith>(op: ReduceOp, inputs: &[&[T]], out: &mut [T], divisor: usize) {
    reduce_slices_with(op, inputs, out, divisor, Stores::Cached);
}

/// How a reduction writes its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stores {
    /// Normal stores: the output stays in cache for its reader.
    Cached,
    /// Streaming stores, for outputs larger than the caches ([`STREAM_MIN_BYTES`]). They are
    /// weakly ordered: the reduction ends with a store fence, so a barrier that follows
    /// publishes them like any other store.
    Streaming,
}

impl Stores {
    /// The stores for an output of `bytes` bytes.
    pub fn for_output(bytes: usize) -> Stores {
        if bytes >= STREAM_MIN_BYTES {
            Stores::Streaming
        } else {
            Stores::Cached
        }
    }
}

/// [`reduce_slices`], writing the output with `stores`.
pub fn reduce_slices_with<T: Arith>(
    op: ReduceOp,
    inputs: &[&[T]],
    out: &mut [T],
    divisor: usize,
    stores: Stores,
) {
    match op {
        ReduceOp::Sum => fold(inputs, out, T::add, |a| a, stores),
        ReduceOp::Mean => fold(
            inputs,
            out,
            T::add,
            |a| T::div(a, divisor).expect("check_op refuses MEAN of integers"),
            stores,
        ),
        ReduceOp::Min => fold(inputs, out, T::min, |a| a, stores),
        ReduceOp::Max => fold(inputs, out, T::max, |a| a, stores),
    }
}

#[inline(always)]
fn fold<T: Arith>(
    inputs: &[&[T]],
    out: &mut [T],
    combine: impl Fn(T::Acc, T::Acc) -> T::Acc + Copy,
    finish: impl Fn(T::Acc) -> T::Acc + Copy,
    stores: Stores,
) {
    let (first, rest) = inputs.split_first().expect("at least one input");
    let len = out.len();
    let one = |i: usize| {
        let mut a = first[i].load();
        for input in rest {
            a = combine(a, input[i].load());
        }
        T::store(finish(a))
    };
    // Streaming stores write whole aligned tiles: the elements before the first cache-line
    // boundary are stored normally.
    let head = match stores {
        Stores::Streaming => out.as_ptr().align_offset(64).min(len),
        Stores::Cached => 0,
    };
    let streaming = stores == Stores::Streaming
        && (out.as_ptr().wrapping_add(head) as usize).is_multiple_of(64);
    for (i, o) in out[..head].iter_mut().enumerate() {
        *o = one(i);
    }
    let mut start = head;
    while start + TILE <= len {
        let end = start + TILE;
        let mut acc = [T::Acc::default(); TILE];
        for (a, &x) in acc.iter_mut().zip(&first[start..end]) {
            *a = x.load();
        }
        for input in rest {
            for (a, &x) in acc.iter_mut().zip(&input[start..end]) {
                *a = combine(*a, x.load());
            }
        }
        let tile: [T; TILE] = std::array::from_fn(|k| T::store(finish(acc[k])));
        let out = &mut out[start..end];
        if streaming {
            stream_tile(&tile, out);
        } else {
            out.copy_from_slice(&tile);
        }
        start = end;
    }
    for (i, o) in out.iter_mut().enumerate().skip(start) {
        *o = one(i);
    }
    if streaming {
        store_fence();
    }
}

/// Writes `tile` to `out` (of the same length, starting on a cache-line boundary) with
/// streaming stores.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stream_tile<T: Copy>(tile: &[T; TILE], out: &mut [T]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    assert_eq!(out.len(), TILE, "a whole tile");
    debug_assert_eq!(out.as_ptr() as usize % 64, 0, "tiles start on a cache line");
    // Every element type is 2, 4 or 8 bytes, so a tile is a whole number of 16-byte vectors.
    let vectors = std::mem::size_of_val(tile) / 16;
    let source = tile.as_ptr().cast::<__m128i>();
    let target = out.as_mut_ptr().cast::<__m128i>();
    for k in 0..vectors {
        // SAFETY: `tile` and `out` both span `vectors` 16-byte vectors (asserted above); the
        // loads are unaligned loads, and the stores are 16-byte aligned since `out` starts on a
        // cache line and each tile is a multiple of 64 bytes long.
        unsafe { _mm_stream_si128(target.add(k), _mm_loadu_si128(source.add(k))) };
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn stream_tile<T: Copy>(tile: &[T; TILE], out: &mut [T]) {
    out.copy_from_slice(tile);
}

/// Orders the streaming stores before everything that follows (a barrier's release).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions; SSE is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

/// The contiguous elements of a host array, or `None` for a non-standard layout (a transposed
/// or strided view), which callers copy first.
pub fn contiguous<T: Element>(array: &ArcArray<T, IxDyn>) -> Option<&[T]> {
    array.as_slice()
}

/// Reduces whole tensors element-wise on the calling thread; the result is placed on `device`.
///
/// All inputs must share dtype and shape. `divisor` is what `Mean` divides by; an integer `Mean`
/// gives float64.
pub fn reduce_tensors(
    op: ReduceOp,
    inputs: &[&Tensor],
    device: &str,
    divisor: usize,
) -> Result<Tensor, TensorError> {
    let first = inputs.first().ok_or_else(|| {
        TensorError::InvalidArgument("cannot reduce an empty list of values".into())
    })?;
    if let Some(other) = inputs
        .iter()
        .find(|t| t.dtype() != first.dtype() || t.shape() != first.shape())
    {
        return Err(TensorError::InvalidArgument(format!(
            "cannot reduce a {} {:?} tensor with a {} {:?} tensor: dtypes and shapes must match",
            first.dtype(),
            first.shape(),
            other.dtype(),
            other.shape()
        )));
    }
    fn typed<T: Arith>(
        op: ReduceOp,
        inputs: &[&Tensor],
        device: &str,
        divisor: usize,
    ) -> Result<Tensor, TensorError> {
        // Standard-layout copies only where an input is strided; the common case borrows.
        let owned: Vec<std::borrow::Cow<'_, [T]>> = inputs
            .iter()
            .map(|t| {
                let a = t.array::<T>()?;
                Ok(match contiguous(a) {
                    Some(slice) => std::borrow::Cow::Borrowed(slice),
                    None => std::borrow::Cow::Owned(a.iter().copied().collect()),
                })
            })
            .collect::<Result<_, TensorError>>()?;
        let slices: Vec<&[T]> = owned.iter().map(|c| &c[..]).collect();
        let shape = inputs[0].shape().to_vec();
        let mut out = vec![T::zero(); slices[0].len()];
        let stores = Stores::for_output(std::mem::size_of_val(&out[..]));
        reduce_slices_with(op, &slices, &mut out, divisor, stores);
        Tensor::from_vec(device, &shape, out)
    }
    if is_integer_mean(op, first.dtype()) {
        return integer_mean_tensors(inputs, device, divisor);
    }
    // An input in GPU memory makes the reduction run on a GPU.
    if let Some(reduced) = crate::reduce_if_on_gpu(op, inputs, device, divisor)? {
        return Ok(reduced);
    }
    with_dtype!(first.dtype(), T => typed::<T>(op, inputs, device, divisor))
}

/// `a - b` element-wise; dtypes and shapes must match.
pub fn subtract(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return Err(TensorError::InvalidArgument(format!(
            "cannot subtract a {} {:?} tensor from a {} {:?} tensor",
            b.dtype(),
            b.shape(),
            a.dtype(),
            a.shape()
        )));
    }
    fn typed<T: Arith>(a: &Tensor, b: &Tensor) -> Result<Tensor, TensorError> {
        let mut out = a.array::<T>()?.to_owned();
        out.zip_mut_with(b.array::<T>()?, |x, &y| {
            *x = T::store(T::sub(x.load(), y.load()))
        });
        Ok(Tensor::from_shared(a.device(), out.into_shared()))
    }
    with_dtype!(a.dtype(), T => typed::<T>(a, b))
}

/// Divides every element by `n` (TF's `divide_by_n_tensors_or_indexed_slices` for dense values):
/// integers by true division, giving float64.
pub fn divide(tensor: &Tensor, n: usize) -> Result<Tensor, TensorError> {
    if n == 0 {
        return Err(TensorError::InvalidArgument("cannot divide by 0".into()));
    }
    if !tensor.dtype().is_floating() {
        let host = tensor.to_host()?;
        return integer_mean_tensors(&[&host], tensor.device(), n);
    }
    fn typed<T: Arith>(tensor: &Tensor, n: usize) -> Result<Tensor, TensorError> {
        let a = tensor.array::<T>()?;
        let out = a.mapv(|x| T::store(T::div(x.load(), n).expect("checked floating")));
        Ok(Tensor::from_shared(tensor.device(), out.into_shared()))
    }
    with_dtype!(tensor.dtype(), T => typed::<T>(tensor, n))
}

impl Tensor {
    /// The reduction along `axis` (removing it), in index order: `Sum`, `Mean` (over the axis
    /// length), `Min` or `Max`. The result stays on this tensor's device.
    ///
    /// ```
    /// use distribute_tensor::Tensor;
    /// use distribute_values::ReduceOp;
    ///
    /// let t = Tensor::from_vec("/cpu:0", &[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
    /// assert_eq!(t.reduce_axis(ReduceOp::Sum, 0)?.to_vec::<f32>()?, [5.0, 7.0, 9.0]);
    /// assert_eq!(t.reduce_axis(ReduceOp::Mean, 1)?.to_vec::<f32>()?, [2.0, 5.0]);
    /// # Ok::<(), distribute_tensor::TensorError>(())
    /// ```
    pub fn reduce_axis(&self, op: ReduceOp, axis: usize) -> Result<Tensor, TensorError> {
        check_op(op, self.dtype())?;
        if axis >= self.rank() {
            return Err(TensorError::InvalidArgument(format!(
                "axis {axis} is out of range for a tensor of rank {}",
                self.rank()
            )));
        }
        let length = self.shape()[axis];
        if length == 0 && matches!(op, ReduceOp::Min | ReduceOp::Max | ReduceOp::Mean) {
            return Err(TensorError::InvalidArgument(format!(
                "{op} over an empty axis {axis} has no value"
            )));
        }
        fn typed<T: Arith>(
            tensor: &Tensor,
            op: ReduceOp,
            axis: usize,
            length: usize,
        ) -> Result<Tensor, TensorError> {
            let array = tensor.array::<T>()?;
            let lanes: Vec<Vec<T>> = array
                .axis_iter(ndarray::Axis(axis))
                .map(|lane| lane.iter().copied().collect())
                .collect();
            let mut shape = tensor.shape().to_vec();
            shape.remove(axis);
            let len: usize = shape.iter().product();
            let mut out = vec![T::zero(); len];
            if length > 0 {
                let slices: Vec<&[T]> = lanes.iter().map(Vec::as_slice).collect();
                reduce_slices(op, &slices, &mut out, length);
            }
            Tensor::from_vec(tensor.device(), &shape, out)
        }
        with_dtype!(self.dtype(), T => typed::<T>(self, op, axis, length))
    }

    /// Every element divided by `n`; integers give float64 (true division, as TF's `/`).
    pub fn divided_by(&self, n: usize) -> Result<Tensor, TensorError> {
        divide(self, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_cover_lengths_and_offsets_around_the_tile_size_with_either_stores() {
        for stores in [Stores::Cached, Stores::Streaming] {
            for len in [0, 1, TILE - 1, TILE, TILE + 1, 3 * TILE + 7, 4096 + 5] {
                // Offsets move the output off the cache-line boundary, so the streaming path's
                // head and tail are exercised too.
                for offset in [0, 1, 3, 15] {
                    let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
                    let b: Vec<f32> = (0..len).map(|i| 2.0 * i as f32).collect();
                    let c: Vec<f32> = (0..len).map(|i| -(i as f32)).collect();
                    let mut buffer = vec![-1.0; len + offset + 1];
                    let out = &mut buffer[offset..offset + len];
                    reduce_slices_with(ReduceOp::Sum, &[&a, &b, &c], out, 3, stores);
                    assert!(
                        out.iter().enumerate().all(|(i, &x)| x == 2.0 * i as f32),
                        "{stores:?} len {len} offset {offset}"
                    );
                    // Nothing outside the output was written.
                    assert!(buffer[..offset].iter().all(|&x| x == -1.0));
                    assert_eq!(buffer[offset + len], -1.0);
                }
            }
        }
    }

    #[test]
    fn streaming_stores_give_the_same_bits_for_every_dtype_and_op() {
        fn check<T: Arith>(make: impl Fn(usize) -> T) {
            let len = 3 * TILE + 11;
            let inputs: Vec<Vec<T>> = (0..3)
                .map(|r| (0..len).map(|i| make(i * 7 + r * 13)).collect())
                .collect();
            let slices: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
            for op in [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max] {
                let mut cached = vec![T::zero(); len];
                let mut streamed = vec![T::zero(); len];
                reduce_slices_with(op, &slices, &mut cached, 3, Stores::Cached);
                reduce_slices_with(op, &slices, &mut streamed, 3, Stores::Streaming);
                assert!(
                    cached
                        .iter()
                        .zip(&streamed)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} {op}",
                    T::DTYPE
                );
            }
        }
        check(|i| (i as f32).sin());
        check(|i| (i as f64).cos());
        check(|i| f16::from_f32((i % 97) as f32 * 0.37));
        check(|i| bf16::from_f32((i % 89) as f32 * 1.3));
        check(|i| i as i32 * 1_000_003);
        check(|i| i as i64 * 1_000_000_007);
    }

    #[test]
    fn order_is_fixed_left_to_right() {
        // (1e8 + 1) - 1e8 = 0 in f32, but 1e8 + (1 - 1e8) = 0 too; pick values where grouping
        // matters: ((a + b) + c) with a = 1e8, b = -1e8, c = 1 gives 1; (a + (b + c)) gives 0.
        let (a, b, c) = ([1e8f32], [-1e8f32], [1.0f32]);
        let mut out = [0.0];
        reduce_slices(ReduceOp::Sum, &[&a, &b, &c], &mut out, 3);
        assert_eq!(out, [1.0]);
    }

    #[test]
    fn half_precision_accumulates_in_f32() {
        // 2048 + 1 + 1 in f16 step by step stays 2048 (spacing 2); in f32 it is 2050.
        let big = [f16::from_f32(2048.0)];
        let one = [f16::from_f32(1.0)];
        let mut out = [f16::ZERO];
        reduce_slices(ReduceOp::Sum, &[&big, &one, &one], &mut out, 3);
        assert_eq!(out[0].to_f32(), 2050.0);
    }

    #[test]
    fn min_max_propagate_nan_and_integers_wrap() {
        let (a, b) = ([1.0f32, f32::NAN], [f32::NAN, 2.0]);
        let mut out = [0.0; 2];
        reduce_slices(ReduceOp::Min, &[&a, &b], &mut out, 2);
        assert!(out[0].is_nan() && out[1].is_nan());
        let (x, y) = ([i32::MAX], [1]);
        let mut sum = [0];
        reduce_slices(ReduceOp::Sum, &[&x, &y], &mut sum, 2);
        assert_eq!(sum, [i32::MIN]);
    }

    #[test]
    fn integer_mean_is_the_exact_mean_as_float64() {
        let a = Tensor::from_vec("/cpu:0", &[2], vec![1i32, i32::MAX]).unwrap();
        let b = Tensor::from_vec("/cpu:0", &[2], vec![2i32, i32::MAX]).unwrap();
        let mean = reduce_tensors(ReduceOp::Mean, &[&a, &b], "/cpu:1", 2).unwrap();
        assert_eq!(mean.dtype(), DType::F64);
        assert_eq!(mean.device(), "/cpu:1");
        // No wrap-around: the sum 2^32 - 2 is kept exactly before the division.
        assert_eq!(mean.to_vec::<f64>().unwrap(), [1.5, f64::from(i32::MAX)]);
        let big = Tensor::from_vec("/cpu:0", &[1], vec![i64::MAX]).unwrap();
        let mean = reduce_tensors(ReduceOp::Mean, &[&big, &big, &big], "/cpu:0", 3).unwrap();
        assert_eq!(mean.to_vec::<f64>().unwrap(), [i64::MAX as f64]);
    }

    #[test]
    fn integer_division_is_true_division() {
        let t = Tensor::from_vec("/cpu:0", &[2], vec![3i64, -1]).unwrap();
        assert_eq!(
            t.divided_by(2).unwrap().to_vec::<f64>().unwrap(),
            [1.5, -0.5]
        );
    }
}
