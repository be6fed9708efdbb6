//! [`Tensor`]: a dense array of one of the supported element types ([`DType`]), placed on a
//! device.
//!
//! Host tensors keep their elements in an `ndarray::ArcArray`, so cloning a tensor, moving it to
//! another host device, or handing every replica the same all-reduce result shares one buffer;
//! writing through [`Tensor::array_mut`] copies first if the buffer is shared (copy on write).
//!
//! With the `cuda` feature a tensor may instead live in GPU memory ([`Placement::Cuda`]); such a
//! tensor moves with [`Tensor::to_gpu`], [`Tensor::to_host`] and [`Tensor::copy_to`], and its
//! host accessors ([`Tensor::array`]) fail with [`TensorError::OnGpu`].

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use ndarray::{ArcArray, Array, ArrayD, Axis, Dimension, IxDyn, Slice};

use crate::host::{Element, HostArray};
use crate::{DType, TensorError, with_dtype};

/// Where a tensor's elements live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Placement {
    /// Host memory, readable from every thread.
    Host,
    /// The memory of CUDA device `ordinal` (feature `cuda`).
    Cuda {
        /// The GPU's index.
        ordinal: usize,
    },
}

/// A tensor's elements: host memory, or (feature `cuda`) one GPU's memory. Without `cuda` the
/// GPU buffer type has no values, so no tensor is on a GPU and the arms below need no `cfg`.
#[derive(Clone)]
pub(crate) enum Storage {
    Host(HostArray),
    #[allow(
        dead_code,
        reason = "built only by the `cuda` module; without it the buffer type has no values"
    )]
    Gpu(crate::gpu::GpuArray),
}

/// A dense array of [`Element`]s with a shape, placed on a device.
///
/// ```
/// use distribute_tensor::{DType, Tensor};
///
/// let t = Tensor::from_vec("/cpu:0", &[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?;
/// assert_eq!((t.dtype(), t.shape(), t.device()), (DType::F32, &[2, 2][..], "/cpu:0"));
/// let moved = t.to_device("/cpu:1");
/// assert!(moved.shares_buffer_with(&t), "host tensors move without copying");
/// assert_eq!(moved.to_vec::<f32>()?, [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), distribute_tensor::TensorError>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    pub(crate) storage: Storage,
    pub(crate) device: Arc<str>,
}

impl Tensor {
    /// A tensor holding `array` on `device`.
    pub fn from_array<T: Element, D: Dimension>(device: &str, array: Array<T, D>) -> Tensor {
        Tensor::from_shared(device, array.into_dyn().into_shared())
    }

    /// A tensor that shares `array`'s buffer.
    pub fn from_shared<T: Element>(device: &str, array: ArcArray<T, IxDyn>) -> Tensor {
        Tensor {
            storage: Storage::Host(T::wrap(array)),
            device: device.into(),
        }
    }

    /// A host tensor holding `array`, labelled with `like`'s device. The label is shared, not
    /// copied: collectives label every result this way, and a fresh label is an allocation.
    pub fn from_shared_like<T: Element>(array: ArcArray<T, IxDyn>, like: &Tensor) -> Tensor {
        Tensor {
            storage: Storage::Host(T::wrap(array)),
            device: Arc::clone(&like.device),
        }
    }

    /// [`Tensor::copy_to`] `like`'s device, sharing `like`'s label where nothing moves (a host
    /// tensor keeps its buffer: how a backend reuses a buffer for a result on another replica).
    pub fn copy_to_device_of(&self, like: &Tensor) -> Result<Tensor, TensorError> {
        match &self.storage {
            Storage::Host(_) => Ok(Tensor {
                storage: self.storage.clone(),
                device: Arc::clone(&like.device),
            }),
            Storage::Gpu(_) => self.copy_to(like.device()),
        }
    }

    /// Whether this is a host tensor whose elements lie contiguously in row-major order.
    pub fn is_contiguous(&self) -> bool {
        match &self.storage {
            Storage::Host(host) => with_host!(host, a => a.is_standard_layout()),
            Storage::Gpu(_) => false,
        }
    }

    /// Whether this is a host tensor whose buffer no other tensor or view shares.
    pub fn is_sole_holder(&self) -> bool {
        match &self.storage {
            Storage::Host(host) => with_host!(host, a => a.is_unique()),
            Storage::Gpu(_) => false,
        }
    }

    /// A tensor of `shape` from elements in row-major order; fails if the counts differ.
    pub fn from_vec<T: Element>(
        device: &str,
        shape: &[usize],
        data: Vec<T>,
    ) -> Result<Tensor, TensorError> {
        let len = data.len();
        let array = ArrayD::from_shape_vec(shape, data).map_err(|_| {
            // The shape may be absurd (its product overflowing), so count it carefully.
            let wanted = checked_num_elements(shape)
                .map_or_else(|| "more than usize::MAX".to_owned(), |n| n.to_string());
            TensorError::InvalidArgument(format!(
                "{len} elements cannot fill a tensor of shape {shape:?} ({wanted} elements)"
            ))
        })?;
        Ok(Tensor::from_array(device, array))
    }

    /// A rank-0 tensor.
    pub fn scalar<T: Element>(device: &str, value: T) -> Tensor {
        Tensor::from_array(device, ndarray::arr0(value))
    }

    /// A tensor of zeros. Fails, without allocating, when the shape holds more elements than
    /// memory can (its size overflowing `isize`, or the allocation refused).
    ///
    /// ```
    /// use distribute_tensor::{DType, Tensor};
    ///
    /// assert_eq!(Tensor::zeros("/cpu:0", DType::I32, &[2])?.to_vec::<i32>()?, [0, 0]);
    /// assert!(Tensor::zeros("/cpu:0", DType::F32, &[1 << 40, 1 << 40]).is_err());
    /// # Ok::<(), distribute_tensor::TensorError>(())
    /// ```
    pub fn zeros(device: &str, dtype: DType, shape: &[usize]) -> Result<Tensor, TensorError> {
        fn zeros_of<T: Element>(shape: &[usize]) -> Result<HostArray, TensorError> {
            let data = try_filled(shape, T::zero())?;
            let array = ArcArray::from_shape_vec(IxDyn(shape), data)
                .map_err(|e| TensorError::InvalidArgument(format!("shape {shape:?}: {e}")))?;
            Ok(T::wrap(array))
        }
        Ok(Tensor {
            storage: Storage::Host(with_dtype!(dtype, T => zeros_of::<T>(shape))?),
            device: device.into(),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match &self.storage {
            Storage::Host(host) => host.dtype(),
            Storage::Gpu(gpu) => gpu.dtype(),
        }
    }

    /// The size of each dimension.
    pub fn shape(&self) -> &[usize] {
        match &self.storage {
            Storage::Host(host) => host.shape(),
            Storage::Gpu(gpu) => gpu.shape(),
        }
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    /// The number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape().iter().product()
    }

    /// The number of bytes of the elements.
    pub fn size_in_bytes(&self) -> usize {
        self.num_elements() * self.dtype().size_in_bytes()
    }

    /// The device the tensor is placed on.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Where the elements live.
    pub fn placement(&self) -> Placement {
        match &self.storage {
            Storage::Host(_) => Placement::Host,
            Storage::Gpu(gpu) => Placement::Cuda {
                ordinal: gpu.ordinal(),
            },
        }
    }

    /// The same tensor labelled `device`, sharing its memory: nothing is copied. Host memory is
    /// readable by every host device, so this is how host tensors move; a GPU tensor's elements
    /// stay on their GPU (use [`Tensor::copy_to`] to move them).
    pub fn to_device(&self, device: &str) -> Tensor {
        Tensor {
            storage: self.storage.clone(),
            device: device.into(),
        }
    }

    /// The tensor on `device`, moving memory only where it must: a host tensor is relabelled
    /// (host memory serves every device of a build without GPU storage, and host data is never
    /// uploaded behind the caller's back — use `Tensor::to_gpu` (feature `cuda`) for that); a GPU tensor is
    /// shared when `device` names its GPU, copied to the GPU `device` names, or copied to host
    /// memory for any other device.
    pub fn copy_to(&self, device: &str) -> Result<Tensor, TensorError> {
        match &self.storage {
            Storage::Host(_) => Ok(self.to_device(device)),
            Storage::Gpu(array) => match array.for_device(device)? {
                Some(array) => Ok(Tensor {
                    storage: Storage::Gpu(array),
                    device: device.into(),
                }),
                None => Ok(self.to_host()?.to_device(device)),
            },
        }
    }

    /// The tensor in host memory, same label: a copy from the GPU for GPU tensors, a shared clone
    /// for host tensors.
    pub fn to_host(&self) -> Result<Tensor, TensorError> {
        match &self.storage {
            Storage::Host(_) => Ok(self.clone()),
            Storage::Gpu(array) => Ok(Tensor {
                storage: Storage::Host(array.download()?),
                device: self.device.clone(),
            }),
        }
    }

    /// The host storage, `None` for a GPU tensor.
    pub(crate) fn host_storage(&self) -> Option<&HostArray> {
        match &self.storage {
            Storage::Host(host) => Some(host),
            Storage::Gpu(_) => None,
        }
    }

    fn host(&self) -> Result<&HostArray, TensorError> {
        self.host_storage().ok_or_else(|| TensorError::OnGpu {
            device: self.device.to_string(),
        })
    }

    /// The typed elements; fails when `T` is not the tensor's dtype, or the tensor is on a GPU.
    pub fn array<T: Element>(&self) -> Result<&ArcArray<T, IxDyn>, TensorError> {
        T::unwrap(self.host()?).ok_or(TensorError::DTypeMismatch {
            expected: T::DTYPE,
            actual: self.dtype(),
        })
    }

    /// The typed elements for writing; a buffer shared with other tensors is copied first.
    pub fn array_mut<T: Element>(&mut self) -> Result<&mut ArcArray<T, IxDyn>, TensorError> {
        let actual = self.dtype();
        let host = match &mut self.storage {
            Storage::Host(host) => host,
            Storage::Gpu(_) => {
                return Err(TensorError::OnGpu {
                    device: self.device.to_string(),
                });
            }
        };
        T::unwrap_mut(host).ok_or(TensorError::DTypeMismatch {
            expected: T::DTYPE,
            actual,
        })
    }

    /// The elements as an ndarray view of a fixed rank, `D` being `Ix1`, `Ix2`, …: the way
    /// to compute on a tensor with ndarray (`x.view::<f32, Ix2>()?.dot(&w)`). Fails when `T`
    /// is not the tensor's dtype, the tensor is on a GPU, or its rank is not `D`'s.
    pub fn view<T: Element, D: Dimension>(
        &self,
    ) -> Result<ndarray::ArrayView<'_, T, D>, TensorError> {
        let array = self.array::<T>()?;
        array.view().into_dimensionality::<D>().map_err(|_| {
            TensorError::InvalidArgument(format!(
                "a tensor of shape {:?} (rank {}) is not a rank-{} array",
                array.shape(),
                array.ndim(),
                D::NDIM.map_or_else(|| "any".to_owned(), |n| n.to_string())
            ))
        })
    }

    /// The elements in row-major order.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, TensorError> {
        Ok(self.array::<T>()?.iter().copied().collect())
    }

    /// True when both tensors read the same elements from the same memory (a clone or a host move
    /// of each other).
    pub fn shares_buffer_with(&self, other: &Tensor) -> bool {
        match (&self.storage, &other.storage) {
            // Strides too: a square tensor and its transpose share the buffer but not the values.
            (Storage::Host(a), Storage::Host(b)) => {
                self.dtype() == other.dtype()
                    && self.shape() == other.shape()
                    && with_host!(a, a => a.strides()) == with_host!(b, b => b.strides())
                    && with_host!(a, a => a.as_ptr() as *const u8)
                        == with_host!(b, b => b.as_ptr() as *const u8)
            }
            (Storage::Gpu(a), Storage::Gpu(b)) => a.shares_buffer_with(b),
            _ => false,
        }
    }

    /// Same dtype, shape and bit pattern of every element (device ignored): the test of the
    /// deterministic mode, stricter than `==` (which has `NaN != NaN` and `0.0 == -0.0`).
    ///
    /// GPU tensors are compared after a copy to the host (a test helper, not a fast path).
    pub fn bitwise_eq(&self, other: &Tensor) -> bool {
        fn bits<T: Element>(a: &ArcArray<T, IxDyn>, b: &HostArray) -> bool {
            let Some(b) = T::unwrap(b) else { return false };
            a.shape() == b.shape()
                && a.iter()
                    .zip(b.iter())
                    .all(|(x, y)| x.to_bits() == y.to_bits())
        }
        let (Ok(a), Ok(b)) = (self.host_view(), other.host_view()) else {
            return false;
        };
        with_host!(&*a, a => bits(a, &b))
    }

    /// The host elements, copied from the GPU for GPU tensors.
    fn host_view(&self) -> Result<Cow<'_, HostArray>, TensorError> {
        match &self.storage {
            Storage::Host(host) => Ok(Cow::Borrowed(host)),
            Storage::Gpu(array) => Ok(Cow::Owned(array.download()?)),
        }
    }

    /// Rows `range` of the first axis, sharing the buffer. Fails on a rank-0 tensor or a range
    /// past the end.
    pub fn slice_rows(&self, range: Range<usize>) -> Result<Tensor, TensorError> {
        let rows = self.shape().first().copied().ok_or_else(|| {
            TensorError::InvalidArgument(
                "cannot take rows of a rank-0 tensor; a batch needs a leading dimension".into(),
            )
        })?;
        if range.start > range.end || range.end > rows {
            return Err(TensorError::InvalidArgument(format!(
                "rows {range:?} are out of range for a tensor with {rows} rows"
            )));
        }
        let slice = Slice::from(range);
        let host =
            with_host!(self.host()?, a => wrap_like(a.clone().slice_axis_move(Axis(0), slice)));
        Ok(Tensor {
            storage: Storage::Host(host),
            device: self.device.clone(),
        })
    }

    /// The tensors joined along the first axis, placed on `device`. They must share dtype and
    /// every dimension but the first.
    pub fn concat_rows(device: &str, tensors: &[Tensor]) -> Result<Tensor, TensorError> {
        Tensor::concat(device, tensors, 0)
    }

    /// The tensors joined along `axis`, placed on `device`. They must share dtype, rank (above
    /// `axis`) and every dimension but `axis`, which may differ.
    ///
    /// ```
    /// use distribute_tensor::Tensor;
    ///
    /// let a = Tensor::from_vec("/cpu:0", &[2, 1], vec![1i32, 2])?;
    /// let b = Tensor::from_vec("/cpu:0", &[2, 2], vec![3i32, 4, 5, 6])?;
    /// let joined = Tensor::concat("/cpu:0", &[a, b], 1)?;
    /// assert_eq!(joined.shape(), [2, 3]);
    /// assert_eq!(joined.to_vec::<i32>()?, [1, 3, 4, 2, 5, 6]);
    /// # Ok::<(), distribute_tensor::TensorError>(())
    /// ```
    pub fn concat(device: &str, tensors: &[Tensor], axis: usize) -> Result<Tensor, TensorError> {
        let first = tensors.first().ok_or_else(|| {
            TensorError::InvalidArgument("cannot concatenate an empty list of tensors".into())
        })?;
        if let Some(other) = tensors.iter().find(|t| t.dtype() != first.dtype()) {
            return Err(TensorError::DTypeMismatch {
                expected: first.dtype(),
                actual: other.dtype(),
            });
        }
        let shapes = || tensors.iter().map(Tensor::shape).collect::<Vec<_>>();
        if tensors.iter().any(|t| axis >= t.rank()) {
            return Err(TensorError::InvalidArgument(format!(
                "cannot concatenate shapes {:?} along axis {axis}: every tensor needs a rank \
                 above the axis",
                shapes()
            )));
        }
        fn concat<T: Element>(
            _first: &ArcArray<T, IxDyn>,
            tensors: &[Tensor],
            axis: usize,
            shapes: Vec<&[usize]>,
        ) -> Result<HostArray, TensorError> {
            let views = tensors
                .iter()
                .map(|t| t.array::<T>().map(|a| a.view()))
                .collect::<Result<Vec<_>, _>>()?;
            let joined = ndarray::concatenate(Axis(axis), &views).map_err(|_| {
                TensorError::InvalidArgument(format!(
                    "cannot concatenate shapes {shapes:?} along axis {axis}: the ranks and all \
                     but that dimension must agree"
                ))
            })?;
            Ok(T::wrap(joined.into_shared()))
        }
        let host = with_host!(first.host()?, a => concat(a, tensors, axis, shapes())?);
        Ok(Tensor {
            storage: Storage::Host(host),
            device: device.into(),
        })
    }
}

/// The number of elements of `shape`, `None` when it overflows `usize`.
pub(crate) fn checked_num_elements(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// A buffer of `shape`'s element count, every element `value`; a typed error, never a panic or
/// an aborting allocation, when the count or byte size overflows or the allocator refuses.
pub(crate) fn try_filled<T: Clone>(shape: &[usize], value: T) -> Result<Vec<T>, TensorError> {
    let too_large = |why: &str| {
        TensorError::InvalidArgument(format!(
            "a tensor of shape {shape:?} is too large: {why}; check the shape"
        ))
    };
    let elements = checked_num_elements(shape)
        .ok_or_else(|| too_large("its element count overflows usize"))?;
    // ndarray also requires the product of the non-zero dimensions to fit `isize`, so that every
    // stride does, even when a zero dimension leaves the tensor empty.
    let strides_fit = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .is_some_and(|n| isize::try_from(n).is_ok());
    if !strides_fit {
        return Err(too_large("its dimensions' product overflows isize"));
    }
    let bytes = elements
        .checked_mul(std::mem::size_of::<T>())
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or_else(|| too_large("its size in bytes overflows isize"))?;
    let mut data = Vec::new();
    data.try_reserve_exact(elements)
        .map_err(|_| too_large(&format!("{bytes} bytes could not be allocated")))?;
    data.resize(elements, value);
    Ok(data)
}

fn wrap_like<T: Element>(array: ArcArray<T, IxDyn>) -> HostArray {
    T::wrap(array)
}

/// Equal dtype, shape, device and elements (`NaN != NaN`, as for the numbers themselves). GPU
/// tensors are compared after a copy to the host; one that cannot be copied equals nothing.
impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        fn same<T: Element>(a: &ArcArray<T, IxDyn>, b: &HostArray) -> bool {
            T::unwrap(b).is_some_and(|b| a == b)
        }
        if self.device != other.device {
            return false;
        }
        let (Ok(a), Ok(b)) = (self.host_view(), other.host_view()) else {
            return false;
        };
        with_host!(&*a, a => same(a, &b))
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// `Tensor<float32 [2, 2] on /cpu:0>` followed by the elements, as ndarray prints them.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor<{} {:?} on {}> ",
            self.dtype(),
            self.shape(),
            self.device
        )?;
        match &self.storage {
            Storage::Host(host) => with_host!(host, a => fmt::Display::fmt(a, f)),
            Storage::Gpu(array) => write!(f, "(in the memory of GPU {})", array.ordinal()),
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{Ix1, Ix2, IxDyn, array};

    use super::*;

    #[test]
    fn a_view_has_the_tensors_elements_at_a_fixed_rank() {
        let t = Tensor::from_array("/cpu:0", array![[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]]);
        let matrix = t.view::<f32, Ix2>().unwrap();
        assert_eq!(matrix.dim(), (2, 3));
        assert_eq!(matrix.row(1).to_vec(), [4.0, 5.0, 6.0]);
        // Shares the tensor's buffer rather than copying it.
        assert_eq!(matrix.as_ptr(), t.array::<f32>().unwrap().as_ptr());
        assert_eq!(t.view::<f32, IxDyn>().unwrap().shape(), [2, 3]);
        // Round trip: an ndarray result becomes a tensor again with `from_array`.
        let doubled = Tensor::from_array("/cpu:0", &matrix * 2.0);
        assert_eq!(
            doubled.to_vec::<f32>().unwrap(),
            [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
        );
    }

    /// `Tensor::zeros` once panicked (ndarray's "shape too large") or aborted the process in the
    /// allocator on shapes like these; each is now a typed error and nothing is allocated.
    #[test]
    fn zeros_of_an_absurd_shape_is_an_error_not_an_abort() {
        for (dtype, shape) in [
            (DType::F32, vec![1 << 40, 1 << 40]),
            (DType::F64, vec![usize::MAX]),
            (DType::I32, vec![usize::MAX / 2]),
            // Fits `isize`, but no address space holds 4 EiB: the allocation is refused.
            (DType::F32, vec![1 << 60]),
            (DType::F16, vec![0, usize::MAX, 2]),
        ] {
            let err = Tensor::zeros("/cpu:0", dtype, &shape).unwrap_err();
            assert!(
                matches!(&err, TensorError::InvalidArgument(m) if m.contains("too large")),
                "{shape:?}: {err:?}"
            );
        }
        // A zero dimension holds nothing.
        let empty = Tensor::zeros("/cpu:0", DType::F32, &[0, 1 << 40]).unwrap();
        assert_eq!(empty.num_elements(), 0);
    }

    #[test]
    fn a_view_of_the_wrong_rank_or_dtype_fails() {
        let t = Tensor::from_vec("/cpu:0", &[2, 3], vec![0.0f32; 6]).unwrap();
        let err = t.view::<f32, Ix1>().unwrap_err().to_string();
        assert!(
            err.contains("shape [2, 3] (rank 2) is not a rank-1 array"),
            "{err}"
        );
        assert!(matches!(
            t.view::<f64, Ix2>(),
            Err(TensorError::DTypeMismatch { .. })
        ));
    }
}
