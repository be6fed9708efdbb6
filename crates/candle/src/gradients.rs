//! Gradients across replicas: every variable's gradient in one fused bucket per dtype, in the
//! order of the variables' names, all-reduced in one rendezvous.

use candle_core::{DType, Device, Tensor, Var};
use distribute_strategy::ReplicaContext;
use distribute_values::ReduceOp;
use half::{bf16, f16};

use crate::Error;
use crate::variables::VarInfo;

/// The all-reduction of one gradient per variable (`grads[i]` for `manifest[i]`, `None` for a
/// variable without a gradient on this replica, which contributes zeros), as candle tensors on
/// `device`. Variables of one dtype share a bucket; all buckets travel in one `all_reduce`.
pub(crate) fn all_reduce(
    ctx: &ReplicaContext<'_>,
    op: ReduceOp,
    manifest: &[VarInfo],
    grads: &[Option<Tensor>],
    device: &Device,
) -> Result<Vec<Tensor>, Error> {
    // Dtypes in order of first appearance: the same on every replica, since manifests agree.
    let mut dtypes: Vec<DType> = Vec::new();
    for var in manifest {
        if !dtypes.contains(&var.dtype) {
            dtypes.push(var.dtype);
        }
    }
    let label = ctx.device();
    let buckets = dtypes
        .iter()
        .map(|&dtype| pack(dtype, manifest, grads, label))
        .collect::<Result<Vec<_>, Error>>()?;
    let reduced = ctx.all_reduce(op, &buckets)?;
    let mut out: Vec<Option<Tensor>> = vec![None; manifest.len()];
    for (dtype, bucket) in dtypes.iter().zip(&reduced) {
        unpack(*dtype, manifest, bucket, device, &mut out)?;
    }
    Ok(out
        .into_iter()
        .map(|t| t.expect("every variable has a bucket"))
        .collect())
}

/// The gradients of variables of `dtype` flattened into one host tensor, manifest order.
fn pack(
    dtype: DType,
    manifest: &[VarInfo],
    grads: &[Option<Tensor>],
    label: &str,
) -> Result<distribute_collectives::Tensor, Error> {
    macro_rules! pack_as {
        ($ty:ty) => {{
            let len: usize = manifest
                .iter()
                .filter(|v| v.dtype == dtype)
                .map(VarInfo::elem_count)
                .sum();
            let mut flat: Vec<$ty> = Vec::with_capacity(len);
            for (var, grad) in manifest.iter().zip(grads) {
                if var.dtype != dtype {
                    continue;
                }
                match grad {
                    Some(grad) => {
                        if grad.dims() != var.shape.as_slice() || grad.dtype() != dtype {
                            return Err(Error::InvalidArgument(format!(
                                "the gradient of variable {var} is {} {:?}",
                                grad.dtype().as_str(),
                                grad.dims()
                            )));
                        }
                        flat.extend(grad.flatten_all()?.to_vec1::<$ty>()?);
                    }
                    None => flat.resize(flat.len() + var.elem_count(), <$ty>::default()),
                }
            }
            distribute_collectives::Tensor::from_vec(label, &[len], flat)?
        }};
    }
    Ok(match dtype {
        DType::F32 => pack_as!(f32),
        DType::F64 => pack_as!(f64),
        DType::BF16 => pack_as!(bf16),
        DType::F16 => pack_as!(f16),
        other => {
            let var = manifest
                .iter()
                .find(|v| v.dtype == other)
                .map_or_else(String::new, |v| v.to_string());
            return Err(Error::UnsupportedDType {
                what: format!("the gradient of variable {var}"),
                dtype: other,
                integers: false,
            });
        }
    })
}

/// Cuts `bucket` (the reduced gradients of variables of `dtype`) back into candle tensors.
fn unpack(
    dtype: DType,
    manifest: &[VarInfo],
    bucket: &distribute_collectives::Tensor,
    device: &Device,
    out: &mut [Option<Tensor>],
) -> Result<(), Error> {
    macro_rules! unpack_as {
        ($ty:ty) => {{
            let host = bucket.to_host()?;
            let array = host.array::<$ty>()?;
            let flat = array.as_slice().ok_or_else(|| {
                Error::InvalidArgument("a reduced gradient bucket is not contiguous".into())
            })?;
            let mut offset = 0;
            for (var, slot) in manifest.iter().zip(out.iter_mut()) {
                if var.dtype != dtype {
                    continue;
                }
                let n = var.elem_count();
                *slot = Some(Tensor::from_slice(
                    &flat[offset..offset + n],
                    var.shape.as_slice(),
                    device,
                )?);
                offset += n;
            }
        }};
    }
    match dtype {
        DType::F32 => unpack_as!(f32),
        DType::F64 => unpack_as!(f64),
        DType::BF16 => unpack_as!(bf16),
        DType::F16 => unpack_as!(f16),
        _ => unreachable!("pack refused the dtype"),
    }
    Ok(())
}

/// `grads` of `vars` (manifest order) as a candle `GradStore`, what optimizers take.
pub(crate) fn into_store(vars: &[Var], grads: Vec<Tensor>) -> candle_core::backprop::GradStore {
    let mut store = candle_core::backprop::GradStore::default();
    for (var, grad) in vars.iter().zip(grads) {
        store.insert(var.as_tensor(), grad);
    }
    store
}
