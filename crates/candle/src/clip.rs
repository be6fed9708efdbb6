//! Clipping by the global gradient norm: one norm over the reduced gradients of every variable,
//! accumulated in f64 in a fixed order (the variables' name order, each tensor's elements in
//! row-major order), so every replica and worker, holding bit-identical reduced gradients,
//! computes the same norm and applies the same factor.

use candle_core::{DType, Tensor};
use half::{bf16, f16};

use crate::Error;

/// What PyTorch's `clip_grad_norm_` adds to the norm before dividing (no division by zero).
const EPSILON: f64 = 1e-6;

/// The Euclidean norm of all of `grads` together (a missing gradient counts as zeros).
pub(crate) fn global_norm(grads: &[Option<Tensor>]) -> Result<f64, Error> {
    let mut squares = 0f64;
    for grad in grads.iter().flatten() {
        squares += sum_of_squares(grad)?;
    }
    Ok(squares.sqrt())
}

/// The factor `min(1, max_norm / (norm + 1e-6))` that clipping multiplies every gradient by.
pub(crate) fn factor(max_norm: f64, norm: f64) -> f64 {
    (max_norm / (norm + EPSILON)).min(1.0)
}

/// Every gradient scaled by `factor` (left as it is when `factor` is 1).
pub(crate) fn scale(grads: Vec<Option<Tensor>>, factor: f64) -> Result<Vec<Option<Tensor>>, Error> {
    if factor >= 1.0 {
        return Ok(grads);
    }
    grads
        .into_iter()
        .map(|grad| grad.map(|g| (g * factor).map_err(Error::from)).transpose())
        .collect()
}

/// The sum of the squares of `grad`'s elements in f64, in row-major order: straight from
/// candle's host buffer when the tensor is contiguous there; on a GPU, the squares are summed
/// there in f64 and only the sum comes to the host.
fn sum_of_squares(grad: &Tensor) -> Result<f64, Error> {
    fn host<T: candle_core::WithDType>(grad: &Tensor) -> Result<Option<f64>, Error> {
        let (storage, layout) = grad.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            let sum = cpu.as_slice::<T>()?[start..end]
                .iter()
                .map(|x| {
                    let x = x.to_f64();
                    x * x
                })
                .sum();
            return Ok(Some(sum));
        }
        Ok(None)
    }
    let on_host = match grad.dtype() {
        DType::F32 => host::<f32>(grad)?,
        DType::F64 => host::<f64>(grad)?,
        DType::BF16 => host::<bf16>(grad)?,
        DType::F16 => host::<f16>(grad)?,
        _ => None,
    };
    match on_host {
        Some(sum) => Ok(sum),
        None => Ok(grad
            .to_dtype(DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()?),
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn the_norm_covers_every_gradient_and_skips_missing_ones() {
        let a = Tensor::new(&[3f32, 0.0], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[0f64], [4.0]], &Device::Cpu).unwrap();
        let norm = global_norm(&[Some(a.clone()), None, Some(b.clone())]).unwrap();
        assert_eq!(norm, 5.0);
        // A view that is not contiguous takes the other path, to the same sum.
        let t = Tensor::new(&[[3f32, 1.0], [4.0, 1.0]], &Device::Cpu).unwrap();
        let column = t.narrow(1, 0, 1).unwrap();
        assert_eq!(global_norm(&[Some(column)]).unwrap(), 5.0);
    }

    #[test]
    fn clipping_scales_only_above_the_limit() {
        assert_eq!(factor(10.0, 5.0), 1.0);
        assert_eq!(factor(1.0, 4.0), 1.0 / (4.0 + 1e-6));
        let g = Tensor::new(&[3f32, 4.0], &Device::Cpu).unwrap();
        let kept = scale(vec![Some(g.clone())], 1.0).unwrap();
        assert_eq!(
            kept[0].as_ref().unwrap().to_vec1::<f32>().unwrap(),
            [3.0, 4.0]
        );
        let halved = scale(vec![Some(g), None], 0.5).unwrap();
        assert_eq!(
            halved[0].as_ref().unwrap().to_vec1::<f32>().unwrap(),
            [1.5, 2.0]
        );
        assert!(halved[1].is_none());
    }
}
