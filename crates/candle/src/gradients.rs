//! Gradients across replicas: every variable's gradient in one fused bucket per dtype, in the
//! order of the variables' names, all-reduced in one rendezvous.

use candle_core::{DType, Device, Tensor, Var};
use distribute_strategy::ReplicaContext;
use distribute_values::ReduceOp;
use half::{bf16, f16};

use crate::Error;
use crate::variables::VarInfo;

/// A replica's gradient buckets between steps: the last step's host buckets (written over by
/// the next step's when nothing else holds them: a step then allocates no bucket of its own, as
/// a large buffer allocated and freed every step makes the allocator hand memory back to the
/// system and fault it in again), whether they stay in GPU memory, and what went through the
/// host.
#[derive(Default)]
pub(crate) struct Buckets {
    /// The last step's buckets, one per dtype (host buckets only).
    pub(crate) spares: Vec<Option<distribute_tensor::Tensor>>,
    /// Whether a GPU replica's buckets stay in its GPU's memory and its strategy's collectives
    /// reduce them there (every local replica is on a GPU); else they travel through the host.
    pub(crate) on_gpu: bool,
    /// Bytes of buckets copied between the host and a GPU so far (to the host and back): zero
    /// on a CPU replica and on the GPU path.
    pub(crate) host_bytes: u64,
}

impl Buckets {
    /// The bytes the kept buckets take.
    pub(crate) fn kept_bytes(&self) -> usize {
        self.spares
            .iter()
            .flatten()
            .map(distribute_tensor::Tensor::size_in_bytes)
            .sum()
    }
}

/// The all-reduction of one gradient per variable (`grads[i]` for `manifest[i]`, `None` for a
/// variable without a gradient on this replica, which contributes zeros), as candle tensors on
/// `device`; `None` for a variable that had a gradient on no replica, which an optimizer then
/// leaves alone (no weight decay, no moments), as candle's own step does. Variables of one
/// dtype share a bucket; all buckets, and one flag per variable saying whether this replica
/// had its gradient, travel in one `all_reduce`. `kept` holds the last step's host buckets,
/// which this one writes over where nothing else holds them, says whether a GPU replica's
/// buckets stay in GPU memory, and counts the bytes that crossed to the host and back.
pub(crate) fn all_reduce(
    ctx: &ReplicaContext<'_>,
    op: ReduceOp,
    manifest: &[VarInfo],
    grads: &[Option<Tensor>],
    device: &Device,
    kept: &mut Buckets,
) -> Result<Vec<Option<Tensor>>, Error> {
    if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
        return Err(Error::InvalidArgument(format!(
            "gradients are reduced with Sum or Mean, not {op}"
        )));
    }
    // Dtypes in order of first appearance: the same on every replica, since manifests agree.
    let mut dtypes: Vec<DType> = Vec::new();
    for var in manifest {
        if !dtypes.contains(&var.dtype) {
            dtypes.push(var.dtype);
        }
    }
    let label = ctx.device();
    if ctx.num_replicas_in_sync() == 1 {
        // The sum or mean of one replica's gradients is those gradients, bit for bit (a mean
        // divides by 1; f16 and bf16 round-trip through f32): checked as a bucket would be, and
        // kept where they are instead of travelling to the host and back.
        for dtype in &dtypes {
            supported(*dtype, manifest)?;
        }
        for (var, grad) in manifest.iter().zip(grads) {
            if let Some(grad) = grad {
                check_gradient(var, grad)?;
            }
        }
        return Ok(grads.to_vec());
    }
    let buckets = dtypes
        .iter()
        .enumerate()
        .map(|(i, &dtype)| {
            let len = manifest
                .iter()
                .filter(|v| v.dtype == dtype)
                .map(VarInfo::elem_count)
                .sum();
            if kept.on_gpu {
                let parts = of_dtype(manifest, grads, dtype)
                    .map(|(var, grad)| (var.elem_count(), grad.as_ref()));
                checked(dtype, manifest, grads)?;
                if let Some(bucket) = crate::gpu::pack_on_gpu(dtype, parts, len, label, device)? {
                    return Ok(bucket);
                }
            }
            pack(dtype, manifest, grads, label, device, kept, i, len)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let present: Vec<f32> = grads
        .iter()
        .map(|g| f32::from(u8::from(g.is_some())))
        .collect();
    let present = distribute_tensor::Tensor::from_vec(label, &[present.len()], present)?;
    let (reduced, present) = ctx.all_reduce(op, &(buckets, present))?;
    // Sum or mean of 0s and 1s: above 0 where some replica had the gradient.
    let present = present.to_vec::<f32>()?;
    let mut out: Vec<Option<Tensor>> = vec![None; manifest.len()];
    for (dtype, bucket) in dtypes.iter().zip(reduced) {
        unpack(
            *dtype,
            manifest,
            bucket,
            device,
            &mut out,
            &mut kept.host_bytes,
        )?;
    }
    Ok(out
        .into_iter()
        .zip(present)
        .map(|(grad, present)| grad.filter(|_| present > 0.0))
        .collect())
}

/// Fails unless candle gradients of `dtype` can be reduced (floating point), naming a variable.
pub(crate) fn supported(dtype: DType, manifest: &[VarInfo]) -> Result<(), Error> {
    match dtype {
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 => Ok(()),
        other => {
            let var = manifest
                .iter()
                .find(|v| v.dtype == other)
                .map_or_else(String::new, |v| v.to_string());
            Err(Error::UnsupportedDType {
                what: format!("the gradient of variable {var}"),
                dtype: other,
                integers: false,
            })
        }
    }
}

/// Fails unless `grad` has `var`'s shape and dtype.
fn check_gradient(var: &VarInfo, grad: &Tensor) -> Result<(), Error> {
    if grad.dims() != var.shape.as_slice() || grad.dtype() != var.dtype {
        return Err(Error::InvalidArgument(format!(
            "the gradient of variable {var} is {} {:?}",
            grad.dtype().as_str(),
            grad.dims()
        )));
    }
    Ok(())
}

/// The variables of `dtype` in `manifest` with their gradients in `grads`, manifest order.
fn of_dtype<'m>(
    manifest: &'m [VarInfo],
    grads: &'m [Option<Tensor>],
    dtype: DType,
) -> impl Iterator<Item = (&'m VarInfo, &'m Option<Tensor>)> {
    manifest
        .iter()
        .zip(grads)
        .filter(move |(var, _)| var.dtype == dtype)
}

/// Fails unless gradients of `dtype` can be reduced and each of them in `grads` has its
/// variable's shape and dtype.
fn checked(dtype: DType, manifest: &[VarInfo], grads: &[Option<Tensor>]) -> Result<(), Error> {
    supported(dtype, manifest)?;
    for (var, grad) in of_dtype(manifest, grads, dtype) {
        if let Some(grad) = grad {
            check_gradient(var, grad)?;
        }
    }
    Ok(())
}

/// The gradients of variables of `dtype` flattened into one host tensor, manifest order, then
/// zeros up to `padded` elements (a ZeRO bucket is a whole number of shards): the `slot`-th
/// bucket, written into `kept`'s spare of the last step where it fits and nothing else holds
/// it, else a new one (kept for the next step). A GPU replica's gradients are first joined on
/// the GPU, so the bucket comes to the host in one copy rather than one per variable.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack(
    dtype: DType,
    manifest: &[VarInfo],
    grads: &[Option<Tensor>],
    label: &str,
    device: &Device,
    kept: &mut Buckets,
    slot: usize,
    padded: usize,
) -> Result<distribute_tensor::Tensor, Error> {
    checked(dtype, manifest, grads)?;
    let of_dtype = || of_dtype(manifest, grads, dtype);
    let len: usize = of_dtype().map(|(var, _)| var.elem_count()).sum();
    debug_assert!(padded >= len);
    if kept.spares.len() <= slot {
        kept.spares.resize(slot + 1, None);
    }
    let spare = kept.spares[slot].take();
    let bucket = pack_on_host(dtype, of_dtype, label, device, spare, len, padded)?;
    if !device.is_cpu() {
        kept.host_bytes += bucket.size_in_bytes() as u64;
    }
    kept.spares[slot] = Some(bucket.clone());
    Ok(bucket)
}

/// [`pack`]'s host bucket: the gradients `of_dtype` gives (`len` elements) and zeros up to
/// `padded`, in `spare` where it fits and nothing else holds it.
fn pack_on_host<'m, I>(
    dtype: DType,
    of_dtype: impl Fn() -> I,
    label: &str,
    device: &Device,
    spare: Option<distribute_tensor::Tensor>,
    len: usize,
    padded: usize,
) -> Result<distribute_tensor::Tensor, Error>
where
    I: Iterator<Item = (&'m VarInfo, &'m Option<Tensor>)>,
{
    let joined = if device.is_cpu() {
        None
    } else {
        let parts = of_dtype()
            .map(|(var, grad)| match grad {
                Some(grad) => grad.flatten_all(),
                None => Tensor::zeros(var.elem_count(), dtype, device),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let joined = Tensor::cat(&parts, 0)?;
        Some(match padded > len {
            true => joined.pad_with_zeros(0, 0, padded - len)?,
            false => joined,
        })
    };
    let reusable = spare.filter(|s| {
        joined.is_none()
            && s.is_sole_holder()
            && s.is_contiguous()
            && s.shape() == [padded]
            && s.device() == label
    });
    macro_rules! pack_as {
        ($ty:ty) => {{
            if let Some(mut bucket) = reusable {
                let flat = bucket
                    .array_mut::<$ty>()?
                    .as_slice_mut()
                    .expect("a contiguous bucket is a slice");
                let mut at = 0;
                for (var, grad) in of_dtype() {
                    let n = var.elem_count();
                    match grad {
                        Some(grad) => write_into(&mut flat[at..at + n], grad)?,
                        None => flat[at..at + n].fill(<$ty>::default()),
                    }
                    at += n;
                }
                flat[at..].fill(<$ty>::default());
                return Ok(bucket);
            }
            let flat: Vec<$ty> = match &joined {
                Some(joined) => joined.to_vec1::<$ty>()?,
                None => {
                    let mut flat: Vec<$ty> = Vec::with_capacity(padded);
                    for (var, grad) in of_dtype() {
                        match grad {
                            Some(grad) => extend_from(&mut flat, grad)?,
                            None => flat.resize(flat.len() + var.elem_count(), <$ty>::default()),
                        }
                    }
                    flat.resize(padded, <$ty>::default());
                    flat
                }
            };
            distribute_tensor::Tensor::from_vec(label, &[padded], flat)?
        }};
    }
    Ok(match dtype {
        DType::F32 => pack_as!(f32),
        DType::F64 => pack_as!(f64),
        DType::BF16 => pack_as!(bf16),
        DType::F16 => pack_as!(f16),
        _ => unreachable!("supported() refused the dtype"),
    })
}

/// Cuts `bucket` (the reduced gradients of variables of `dtype`) back into candle tensors: one
/// candle tensor over the whole bucket (taking the bucket's buffer when nobody else holds it, so
/// no copy), and a view of it per variable.
fn unpack(
    dtype: DType,
    manifest: &[VarInfo],
    bucket: distribute_tensor::Tensor,
    device: &Device,
    out: &mut [Option<Tensor>],
    host_bytes: &mut u64,
) -> Result<(), Error> {
    let mut bucket = Some(bucket);
    let whole = match crate::gpu::unpack_from_gpu(&mut bucket, dtype, device)? {
        Some(whole) => whole,
        None => {
            let bucket = bucket.expect("left when not taken to the GPU");
            if !device.is_cpu() {
                *host_bytes += bucket.size_in_bytes() as u64;
            }
            whole_on_host(dtype, bucket, device)?
        }
    };
    let mut offset = 0;
    for (var, slot) in manifest.iter().zip(out.iter_mut()) {
        if var.dtype != dtype {
            continue;
        }
        let n = var.elem_count();
        *slot = Some(whole.narrow(0, offset, n)?.reshape(var.shape.as_slice())?);
        offset += n;
    }
    Ok(())
}

/// A reduced host `bucket` as one candle tensor on `device` (taking the bucket's buffer when
/// nobody else holds it, so no copy on a CPU device).
fn whole_on_host(
    dtype: DType,
    bucket: distribute_tensor::Tensor,
    device: &Device,
) -> Result<Tensor, Error> {
    macro_rules! whole_as {
        ($ty:ty) => {{
            let host = bucket.to_host()?;
            let array = host.array::<$ty>()?.clone();
            drop(host);
            drop(bucket);
            let len = array.len();
            let (values, offset) = array.into_owned().into_raw_vec_and_offset();
            if offset.unwrap_or(0) == 0 && values.len() == len {
                Tensor::from_vec(values, len, device)?
            } else {
                let start = offset.unwrap_or(0);
                Tensor::from_slice(&values[start..start + len], len, device)?
            }
        }};
    }
    Ok(match dtype {
        DType::F32 => whole_as!(f32),
        DType::F64 => whole_as!(f64),
        DType::BF16 => whole_as!(bf16),
        DType::F16 => whole_as!(f16),
        _ => unreachable!("pack refused the dtype"),
    })
}

/// Appends `grad`'s elements (row-major) to `flat`: straight from candle's host buffer when the
/// tensor is contiguous there (one copy), else through `to_vec1`.
fn extend_from<T: candle_core::WithDType>(flat: &mut Vec<T>, grad: &Tensor) -> Result<(), Error> {
    {
        let (storage, layout) = grad.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            flat.extend_from_slice(&cpu.as_slice::<T>()?[start..end]);
            return Ok(());
        }
    }
    flat.extend(grad.flatten_all()?.to_vec1::<T>()?);
    Ok(())
}

/// Writes `grad`'s elements (row-major) into `out`, which has room for exactly them: straight
/// from candle's host buffer when the tensor is contiguous there, else through `to_vec1`.
fn write_into<T: candle_core::WithDType>(out: &mut [T], grad: &Tensor) -> Result<(), Error> {
    {
        let (storage, layout) = grad.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            out.copy_from_slice(&cpu.as_slice::<T>()?[start..end]);
            return Ok(());
        }
    }
    out.copy_from_slice(&grad.flatten_all()?.to_vec1::<T>()?);
    Ok(())
}

/// `grads` of `vars` (manifest order) as a candle `GradStore`, what optimizers take; a variable
/// without a gradient has no entry.
pub(crate) fn into_store(
    vars: &[Var],
    grads: Vec<Option<Tensor>>,
) -> candle_core::backprop::GradStore {
    let mut store = candle_core::backprop::GradStore::default();
    for (var, grad) in vars.iter().zip(grads) {
        if let Some(grad) = grad {
            store.insert(var.as_tensor(), grad);
        }
    }
    store
}
