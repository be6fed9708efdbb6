//! The row copies by memory copy (gathering for shuffles, joining, padding) against ndarray's
//! general operations, bit for bit, for every dtype, in standard layout and strided; and the
//! per-replica pieces cut from placed source blocks against slicing each global batch.

use distribute_input::{
    Batch, BoxIter, Dataset, DistributedDataset, InputOptions, PartialBatch, Source, split_sizes,
};
use distribute_tensor::{DType, Element, Tensor, with_dtype};
use distribute_values::DistributedValues;
use ndarray::{ArcArray, Axis, IxDyn};
use proptest::prelude::*;

use crate::common::local;

const DTYPES: [DType; 6] = DType::ALL;

/// A tensor of `dtype` and `shape` whose elements take their bits from `bits` (NaNs, negative
/// zeros and all).
fn tensor(dtype: DType, shape: &[usize], bits: &[u64]) -> Tensor {
    fn of<T: Element>(shape: &[usize], values: impl Iterator<Item = T>) -> Tensor {
        Tensor::from_vec("/cpu:0", shape, values.collect()).unwrap()
    }
    let n: usize = shape.iter().product();
    let bits = bits.iter().cycle().take(n);
    match dtype {
        DType::F16 => of(shape, bits.map(|b| half::f16::from_bits(*b as u16))),
        DType::BF16 => of(shape, bits.map(|b| half::bf16::from_bits(*b as u16))),
        DType::F32 => of(shape, bits.map(|b| f32::from_bits(*b as u32))),
        DType::F64 => of(shape, bits.map(|b| f64::from_bits(*b))),
        DType::I32 => of(shape, bits.map(|b| *b as i32)),
        DType::I64 => of(shape, bits.map(|b| *b as i64)),
    }
}

/// ndarray's `select`: the simple gather the fast one must match.
fn select<T: Element>(t: &Tensor, indices: &[usize]) -> Tensor {
    Tensor::from_array("/cpu:0", t.array::<T>().unwrap().select(Axis(0), indices))
}

/// A tensor with the same rows as `t` but not in standard layout: every other row of a
/// tensor twice as long.
fn strided(t: &Tensor, bits: &[u64]) -> Tensor {
    let mut shape = t.shape().to_vec();
    shape[0] *= 2;
    let doubled = tensor(t.dtype(), &shape, bits);
    let rows = Tensor::concat_rows("/cpu:0", &[t.clone(), doubled.clone()]).unwrap();
    // Rows of `t` at even positions, filler at odd ones.
    let n = t.shape()[0];
    let interleaved: Vec<usize> = (0..2 * n)
        .map(|i| if i % 2 == 0 { i / 2 } else { n + i })
        .collect();
    let interleaved = with_dtype!(t.dtype(), T => select::<T>(&rows, &interleaved));
    let s = interleaved.stride_rows(0, 2).unwrap();
    assert_eq!(s.shape(), t.shape());
    s
}

fn shapes() -> impl Strategy<Value = Vec<usize>> {
    (0usize..9, prop::collection::vec(0usize..4, 0..3)).prop_map(|(rows, tail)| {
        let mut shape = vec![rows];
        shape.extend(tail);
        shape
    })
}

/// Whether a tensor's elements lie in one standard-layout run.
fn is_standard<T: Element>(t: &Tensor) -> bool {
    t.array::<T>().unwrap().is_standard_layout()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn gathering_rows_matches_ndarray_select(
        dtype in prop::sample::select(&DTYPES[..]),
        shape in shapes(),
        bits in prop::collection::vec(any::<u64>(), 1..64),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
        layout_strided in any::<bool>(),
    ) {
        let t = tensor(dtype, &shape, &bits);
        let t = if layout_strided { strided(&t, &bits) } else { t };
        let indices: Vec<usize> = if shape[0] == 0 {
            Vec::new()
        } else {
            picks.iter().map(|p| p.index(shape[0])).collect()
        };
        let got = t.select_rows(&indices).unwrap();
        let want = with_dtype!(dtype, T => select::<T>(&t, &indices));
        prop_assert!(got.bitwise_eq(&want), "{got:?} != {want:?}");
        prop_assert_eq!(got.device(), t.device());
        prop_assert!(with_dtype!(dtype, T => is_standard::<T>(&got)));
    }

    #[test]
    fn joining_rows_matches_ndarray_concatenate(
        dtype in prop::sample::select(&DTYPES[..]),
        shape in shapes(),
        rows in prop::collection::vec(0usize..5, 1..4),
        strided_parts in prop::collection::vec(any::<bool>(), 4),
        bits in prop::collection::vec(any::<u64>(), 1..64),
    ) {
        let parts: Vec<Tensor> = rows.iter().zip(&strided_parts).enumerate().map(|(i, (r, s))| {
            let mut part_shape = shape.clone();
            part_shape[0] = *r;
            let part = tensor(dtype, &part_shape, &bits[i % bits.len()..]);
            if *s { strided(&part, &bits) } else { part }
        }).collect();
        let refs: Vec<&Tensor> = parts.iter().collect();
        let got = <Tensor as Batch>::concat_rows(&refs).unwrap();
        let want = Tensor::concat_rows("/cpu:0", &parts).unwrap();
        prop_assert!(got.bitwise_eq(&want), "{got:?} != {want:?}");
    }

    #[test]
    fn padding_rows_matches_joining_zeros(
        dtype in prop::sample::select(&DTYPES[..]),
        shape in shapes(),
        extra in 0usize..4,
        layout_strided in any::<bool>(),
        bits in prop::collection::vec(any::<u64>(), 1..64),
    ) {
        let t = tensor(dtype, &shape, &bits);
        let t = if layout_strided { strided(&t, &bits) } else { t };
        let got = t.pad_rows(shape[0] + extra).unwrap();
        let mut zeros_shape = shape.clone();
        zeros_shape[0] = extra;
        let zeros = Tensor::zeros("/cpu:0", dtype, &zeros_shape).unwrap();
        let want = Tensor::concat_rows("/cpu:0", &[t.clone(), zeros]).unwrap();
        prop_assert!(got.bitwise_eq(&want), "{got:?} != {want:?}");
    }

    /// Pieces come from each source block placed once per replica; they must be exactly the
    /// global batch cut by `split_sizes`, on each replica's device, whether batches lie inside
    /// one block or straddle several, shuffled or not, over several epochs.
    #[test]
    fn pieces_cut_from_placed_blocks_are_the_global_batches_split(
        blocks in prop::collection::vec(0usize..13, 1..5),
        batch in 1usize..9,
        replicas in 1usize..5,
        epochs in 1usize..3,
        shuffle in prop::option::of(any::<u64>()),
        row_shard in prop::option::of((1usize..3, 0usize..3)),
        prefetch in 0usize..3,
        padded in any::<bool>(),
    ) {
        let mut ds = Dataset::from_source(Blocks(blocks)).repeat(epochs).unwrap();
        if let Some(seed) = shuffle {
            ds = ds.shuffle(seed, false).unwrap();
        }
        if let Some((num, index)) = row_shard {
            ds = ds.shard(num, index % num).unwrap();
        }
        let ds = ds.batch(batch, false).unwrap();
        let partial_batch = if padded { PartialBatch::PadWithMask } else { PartialBatch::KeepUneven };
        let options = InputOptions { prefetch, partial_batch, ..InputOptions::default() };
        let workers = local(replicas);
        let dist = DistributedDataset::new(ds.clone(), &workers, options).unwrap();
        let steps: Vec<_> = dist.iter_per_replica().collect::<Result<_, _>>().unwrap();
        let globals: Vec<(Tensor, Tensor)> = ds.iter().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(steps.len(), globals.len());
        for (step, global) in steps.iter().zip(&globals) {
            let rows = global.0.shape()[0];
            let mut start = 0;
            for (r, (piece, size)) in step.values().iter().zip(split_sizes(rows, replicas)).enumerate() {
                let want = global.slice_rows(start..start + size).unwrap();
                let want = if padded { want.pad_rows(batch.div_ceil(replicas)).unwrap() } else { want };
                prop_assert!(piece.0.bitwise_eq(&want.0) && piece.1.bitwise_eq(&want.1));
                let device = workers.device_map().primary_device(r).unwrap();
                prop_assert_eq!(piece.0.device(), device);
                prop_assert_eq!(piece.1.device(), device);
                start += size;
            }
        }
    }
}

/// Blocks of the given row counts: features `[rows, 3]` and labels `[rows]` counting on
/// across blocks.
struct Blocks(Vec<usize>);

impl Source for Blocks {
    type Item = (Tensor, Tensor);

    fn blocks(&self) -> BoxIter<(Tensor, Tensor)> {
        let mut first = 0i64;
        let blocks: Vec<_> = self
            .0
            .iter()
            .map(|&rows| {
                let labels: Vec<i64> = (first..first + rows as i64).collect();
                first += rows as i64;
                let features: Vec<f32> = labels
                    .iter()
                    .flat_map(|&l| [l as f32, -(l as f32), 0.5])
                    .collect();
                Ok((
                    Tensor::from_vec("/cpu:0", &[rows, 3], features)?,
                    Tensor::from_vec("/cpu:0", &[rows], labels)?,
                ))
            })
            .collect();
        Box::new(blocks.into_iter())
    }

    fn describe(&self) -> String {
        "uneven blocks".into()
    }
}

#[test]
fn a_gathered_batch_owns_a_standard_buffer() {
    let t = tensor(DType::F32, &[4, 2], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let picked = t.select_rows(&[3, 3, 0]).unwrap();
    let a: &ArcArray<f32, IxDyn> = picked.array::<f32>().unwrap();
    assert!(a.is_standard_layout());
    assert!(!picked.shares_buffer_with(&t));
}
