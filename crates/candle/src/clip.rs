//! Clipping by the global gradient norm: one norm over the reduced gradients of every variable,
//! accumulated in f64 in a fixed order (per dtype, the variables' name order and each tensor's
//! elements in row-major order, summed in blocks of [`BLOCK`] elements), so every replica and
//! worker, holding bit-identical reduced gradients, computes the same norm and applies the same
//! factor, and a ZeRO shard, a whole number of blocks, sums the same blocks.

use candle_core::{DType, Tensor};
use half::{bf16, f16};

use crate::Error;
use crate::variables::VarInfo;

/// What PyTorch's `clip_grad_norm_` adds to the norm before dividing (no division by zero).
const EPSILON: f64 = 1e-6;

/// The elements of one block of the norm's sum: each dtype's gradients, flattened in the
/// variables' name order, are summed in blocks of this many elements; the blocks' sums are then
/// added in order. A ZeRO shard ([`Sharding`](crate::Sharding)) is a whole number of blocks, so
/// a sharded run sums the same blocks, to the same bits.
pub(crate) const BLOCK: usize = 1024;

/// The Euclidean norm of all of `grads` together (`grads[i]` is `manifest[i]`'s; a missing
/// gradient counts as zeros): for each dtype in order of first appearance, its gradients'
/// elements in name order and row-major order are squared in f64 and summed in blocks of
/// [`BLOCK`], each block in order; the blocks' sums are added in order.
pub(crate) fn global_norm(manifest: &[VarInfo], grads: &[Option<Tensor>]) -> Result<f64, Error> {
    let mut dtypes: Vec<DType> = Vec::new();
    for var in manifest {
        if !dtypes.contains(&var.dtype) {
            dtypes.push(var.dtype);
        }
    }
    let mut squares = 0f64;
    for dtype in dtypes {
        let of_dtype = || {
            manifest
                .iter()
                .zip(grads)
                .filter(move |(var, _)| var.dtype == dtype)
        };
        let on_host = of_dtype().all(|(_, g)| g.as_ref().is_none_or(|g| g.device().is_cpu()));
        let partials = if on_host {
            let mut blocks = Blocks::default();
            for (var, grad) in of_dtype() {
                match grad {
                    Some(grad) => blocks.add(grad)?,
                    None => blocks.skip(var.elem_count()),
                }
            }
            blocks.finish()
        } else {
            let device = of_dtype()
                .find_map(|(_, g)| g.as_ref().map(|g| g.device().clone()))
                .expect("a gradient off the host");
            let parts = of_dtype()
                .map(|(var, grad)| match grad {
                    Some(grad) => grad.flatten_all(),
                    None => Tensor::zeros(var.elem_count(), dtype, &device),
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            block_sums(&Tensor::cat(&parts, 0)?)?
        };
        for partial in partials {
            squares += partial;
        }
    }
    Ok(squares.sqrt())
}

/// The sums of squares (f64) of the blocks of [`BLOCK`] elements of the 1-dimensional `flat`,
/// in order, the last one short when its length is not a multiple: summed in order on the
/// host; on a GPU in one reduction there, only the sums coming to the host.
pub(crate) fn block_sums(flat: &Tensor) -> Result<Vec<f64>, Error> {
    if flat.device().is_cpu() {
        let mut blocks = Blocks::default();
        blocks.add(flat)?;
        return Ok(blocks.finish());
    }
    let len = flat.elem_count();
    let padded = len.div_ceil(BLOCK) * BLOCK;
    let flat = match padded > len {
        true => flat.pad_with_zeros(0, 0, padded - len)?,
        false => flat.clone(),
    };
    Ok(flat
        .reshape((padded / BLOCK, BLOCK))?
        .to_dtype(DType::F64)?
        .sqr()?
        .sum(1)?
        .to_vec1::<f64>()?)
}

/// Sums of squares in blocks of [`BLOCK`] elements over a sequence of host tensors.
#[derive(Default)]
struct Blocks {
    done: Vec<f64>,
    sum: f64,
    filled: usize,
}

impl Blocks {
    /// Adds `grad`'s elements, row-major.
    fn add(&mut self, grad: &Tensor) -> Result<(), Error> {
        fn each<T: candle_core::WithDType>(
            blocks: &mut Blocks,
            grad: &Tensor,
        ) -> Result<(), Error> {
            {
                let (storage, layout) = grad.storage_and_layout();
                if let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
                    (&*storage, layout.contiguous_offsets())
                {
                    blocks.extend(&cpu.as_slice::<T>()?[start..end]);
                    return Ok(());
                }
            }
            blocks.extend(&grad.flatten_all()?.to_vec1::<T>()?);
            Ok(())
        }
        match grad.dtype() {
            DType::F32 => each::<f32>(self, grad),
            DType::F64 => each::<f64>(self, grad),
            DType::BF16 => each::<bf16>(self, grad),
            DType::F16 => each::<f16>(self, grad),
            other => Err(Error::UnsupportedDType {
                what: "a gradient's norm".into(),
                dtype: other,
                integers: false,
            }),
        }
    }

    /// Adds the squares of `xs`, each block's in order, a block's run at a time (no test per
    /// element on the hot path).
    fn extend<T: candle_core::WithDType>(&mut self, mut xs: &[T]) {
        while !xs.is_empty() {
            let take = xs.len().min(BLOCK - self.filled);
            let (run, rest) = xs.split_at(take);
            self.sum = run.iter().fold(self.sum, |sum, x| {
                let x = x.to_f64();
                sum + x * x
            });
            self.filled += take;
            xs = rest;
            if self.filled == BLOCK {
                self.done.push(self.sum);
                self.sum = 0.0;
                self.filled = 0;
            }
        }
    }

    /// Adds `n` zeros (a variable without a gradient): they only move the block boundaries.
    fn skip(&mut self, mut n: usize) {
        while n > 0 {
            let take = n.min(BLOCK - self.filled);
            self.filled += take;
            n -= take;
            if self.filled == BLOCK {
                self.done.push(self.sum);
                self.sum = 0.0;
                self.filled = 0;
            }
        }
    }

    /// The blocks' sums, the last one short.
    fn finish(mut self) -> Vec<f64> {
        if self.filled > 0 {
            self.done.push(self.sum);
        }
        self.done
    }
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

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn the_norm_covers_every_gradient_and_skips_missing_ones() {
        let a = Tensor::new(&[3f32, 0.0], &Device::Cpu).unwrap();
        let b = Tensor::new(&[[0f64], [4.0]], &Device::Cpu).unwrap();
        let manifest = [
            VarInfo::new("a", DType::F32, &[2]),
            VarInfo::new("m", DType::F32, &[7]),
            VarInfo::new("b", DType::F64, &[2, 1]),
        ];
        let norm = global_norm(&manifest, &[Some(a.clone()), None, Some(b.clone())]).unwrap();
        assert_eq!(norm, 5.0);
        // A view that is not contiguous takes the other path, to the same sum.
        let t = Tensor::new(&[[3f32, 1.0], [4.0, 1.0]], &Device::Cpu).unwrap();
        let column = t.narrow(1, 0, 1).unwrap();
        let manifest = [VarInfo::new("c", DType::F32, &[2, 1])];
        assert_eq!(global_norm(&manifest, &[Some(column)]).unwrap(), 5.0);
    }

    #[test]
    fn the_blocks_run_across_variables_and_missing_gradients_as_in_one_flat_bucket() {
        // 700 elements, 1500 missing, 2000: blocks cut through all three.
        let a: Vec<f32> = (0..700).map(|i| (i as f32 * 0.37).sin()).collect();
        let c: Vec<f32> = (0..2000).map(|i| (i as f32 * 0.11).cos() * 3.1).collect();
        let manifest = [
            VarInfo::new("a", DType::F32, &[700]),
            VarInfo::new("b", DType::F32, &[30, 50]),
            VarInfo::new("c", DType::F32, &[2000]),
        ];
        let grads = [
            Some(Tensor::new(a.as_slice(), &Device::Cpu).unwrap()),
            None,
            Some(Tensor::new(c.as_slice(), &Device::Cpu).unwrap()),
        ];
        let mut flat = a.clone();
        flat.resize(2200, 0.0);
        flat.extend(&c);
        // The flat bucket, padded to whole blocks as a shard is: the same block sums, and zeros
        // that add nothing.
        flat.resize(5 * BLOCK, 0.0);
        let flat = Tensor::new(flat.as_slice(), &Device::Cpu).unwrap();
        let partials = block_sums(&flat).unwrap();
        assert_eq!(partials.len(), 5);
        let mut squares = 0f64;
        for p in partials {
            squares += p;
        }
        let norm = global_norm(&manifest, &grads).unwrap();
        assert_eq!(norm.to_bits(), squares.sqrt().to_bits());
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
