//! [`FusionPlan`]: fusing a list of dense tensors into few contiguous 1-D buckets and cutting
//! reduced buckets back apart (TF's `group_by_size` and the fused `batch_reduce`, COL-36).
//!
//! Packing only moves elements, never combines them, so an element-wise reduction of the buckets
//! equals the reduction of the original tensors bit for bit.

use std::ops::Range;

use crate::CollectiveError;
use distribute_tensor::flat::{concat, flatten, reshape, split_lengths};
use distribute_tensor::{DType, Tensor};

fn flatten_all(tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
    tensors.iter().map(|t| Ok(flatten(t)?)).collect()
}

/// Cuts a 1-D tensor into consecutive pieces of the given shapes.
fn cut(joined: &Tensor, shapes: &[Vec<usize>]) -> Result<Vec<Tensor>, CollectiveError> {
    let lengths: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    split_lengths(joined, &lengths)?
        .iter()
        .zip(shapes)
        .map(|(piece, shape)| Ok(reshape(piece, shape)?))
        .collect()
}

/// Groups consecutive values into packs of about `bytes_per_pack` bytes (TF's `group_by_size`),
/// returned as index ranges.
///
/// A new pack starts once the running total of the current one exceeds `bytes_per_pack`, so
/// every pack but the last holds more than `bytes_per_pack` bytes (few, large packs).
/// `bytes_per_pack == 0` gives one pack holding everything. Host tensors always have a known
/// size, so TF's "unknown shape → one pack" case cannot arise.
pub(crate) fn group_by_size(values: &[Tensor], bytes_per_pack: usize) -> Vec<Range<usize>> {
    if bytes_per_pack == 0 {
        return std::iter::once(0..values.len()).collect();
    }
    let mut packs: Vec<Range<usize>> = Vec::new();
    let mut last_pack_size = 0;
    for (i, value) in values.iter().enumerate() {
        match packs.last_mut() {
            Some(pack) if last_pack_size <= bytes_per_pack => pack.end = i + 1,
            _ => {
                packs.push(i..i + 1);
                last_pack_size = 0;
            }
        }
        last_pack_size += value.size_in_bytes();
    }
    packs
}

/// The members of one fusion bucket: consecutive tensors of one dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Bucket {
    dtype: DType,
    members: Range<usize>,
    shapes: Vec<Vec<usize>>,
}

/// A plan for fusing a list of dense tensors into few contiguous 1-D buckets (what
/// `batch_reduce` reduces), and for cutting reduced buckets back into tensors.
///
/// Buckets follow TF's `group_by_size`, further split where the dtype changes, since a bucket is
/// one buffer of one element type. Plan from one replica's tensors, [`pack`](Self::pack) every
/// replica's tensors with the same plan, reduce bucket `b` across replicas, and
/// [`unpack`](Self::unpack) the results: each comes back in its original position and shape,
/// bitwise equal to reducing the tensors one by one, because the reduction is element-wise.
///
/// ```
/// use distribute_collectives::FusionPlan;
/// use distribute_tensor::Tensor;
///
/// let a = Tensor::from_vec("/cpu:0", &[2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?;
/// let b = Tensor::from_vec("/cpu:0", &[3], vec![5.0f32, 6.0, 7.0])?;
/// let plan = FusionPlan::new(&[a.clone(), b.clone()], 1 << 20);
/// let buckets = plan.pack(&[a.clone(), b.clone()])?;
/// assert_eq!(buckets.len(), 1);
/// assert_eq!(buckets[0].shape(), [7]);
/// assert_eq!(plan.unpack(&buckets)?, [a, b]);
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusionPlan {
    buckets: Vec<Bucket>,
    count: usize,
}

impl FusionPlan {
    /// Plans buckets of about `bytes_per_pack` bytes for tensors like `tensors` (0: one bucket
    /// per dtype run).
    pub fn new(tensors: &[Tensor], bytes_per_pack: usize) -> FusionPlan {
        let mut buckets: Vec<Bucket> = Vec::new();
        for group in group_by_size(tensors, bytes_per_pack) {
            for i in group.clone() {
                let t = &tensors[i];
                match buckets.last_mut() {
                    Some(b) if b.dtype == t.dtype() && b.members.end == i && i != group.start => {
                        b.members.end = i + 1;
                        b.shapes.push(t.shape().to_vec());
                    }
                    _ => buckets.push(Bucket {
                        dtype: t.dtype(),
                        members: i..i + 1,
                        shapes: vec![t.shape().to_vec()],
                    }),
                }
            }
        }
        FusionPlan {
            buckets,
            count: tensors.len(),
        }
    }

    /// The dtypes and shapes of the tensors the plan is for, as messages name them:
    /// `float32 [3], float32 [4]`.
    pub(crate) fn describe(&self) -> String {
        let parts: Vec<String> = self
            .buckets
            .iter()
            .flat_map(|b| {
                b.shapes
                    .iter()
                    .map(move |shape| format!("{} {shape:?}", b.dtype))
            })
            .collect();
        parts.join(", ")
    }

    /// The number of buckets.
    pub fn num_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The positions of the tensors in bucket `bucket`, or `None` past the last bucket.
    pub fn members(&self, bucket: usize) -> Option<Range<usize>> {
        self.buckets.get(bucket).map(|b| b.members.clone())
    }

    /// One replica's tensors, which must match the plan's dtypes and shapes, joined into
    /// bucket tensors; each bucket is placed on its first member's device. A bucket of one
    /// tensor shares that tensor's buffer.
    pub fn pack(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        if tensors.len() != self.count {
            return Err(CollectiveError::InvalidArgument(format!(
                "the fusion plan is for {} tensors, got {}",
                self.count,
                tensors.len()
            )));
        }
        self.buckets
            .iter()
            .map(|bucket| {
                let members = &tensors[bucket.members.clone()];
                for (offset, (t, shape)) in members.iter().zip(&bucket.shapes).enumerate() {
                    if t.dtype() != bucket.dtype || t.shape() != &shape[..] {
                        return Err(CollectiveError::InvalidArgument(format!(
                            "tensor {} is a {} {:?} tensor but the fusion plan expects {} {:?}; \
                             every replica must pass the same dtypes and shapes",
                            bucket.members.start + offset,
                            t.dtype(),
                            t.shape(),
                            bucket.dtype,
                            shape
                        )));
                    }
                }
                Ok(concat(members[0].device(), &flatten_all(members)?)?)
            })
            .collect()
    }

    /// The tensors cut back out of (reduced) buckets, in their original order and shapes, each
    /// on its bucket's device.
    pub fn unpack(&self, buckets: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        self.unpack_as(buckets, |dtype| dtype)
    }

    /// [`unpack`](Self::unpack) of buckets reduced with `op`, whose dtype may have changed (an
    /// integer `Mean` gives float64).
    pub(crate) fn unpack_reduced(
        &self,
        op: distribute_values::ReduceOp,
        buckets: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        self.unpack_as(buckets, |dtype| {
            distribute_tensor::kernel::reduced_dtype(op, dtype)
        })
    }

    fn unpack_as(
        &self,
        buckets: &[Tensor],
        reduced: impl Fn(DType) -> DType,
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if buckets.len() != self.buckets.len() {
            return Err(CollectiveError::InvalidArgument(format!(
                "the fusion plan has {} buckets, got {}",
                self.buckets.len(),
                buckets.len()
            )));
        }
        let mut out = Vec::with_capacity(self.count);
        for (tensor, bucket) in buckets.iter().zip(&self.buckets) {
            if tensor.dtype() != reduced(bucket.dtype) {
                return Err(CollectiveError::DTypeMismatch {
                    expected: reduced(bucket.dtype),
                    actual: tensor.dtype(),
                });
            }
            out.extend(cut(tensor, &bucket.shapes)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use distribute_values::ReduceOp;

    use super::*;

    /// The sum of `parts` on the first part's device, in replica order.
    fn sum(parts: &[&Tensor]) -> Tensor {
        distribute_tensor::kernel::reduce_tensors(
            ReduceOp::Sum,
            parts,
            parts[0].device(),
            parts.len(),
        )
        .unwrap()
    }

    fn ramp(device: &str, shape: &[usize], start: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec(device, shape, (0..n).map(|i| start + i as f32).collect()).unwrap()
    }

    #[test]
    fn a_bucket_of_one_tensor_shares_its_buffer() {
        let big = Tensor::from_vec("/cpu:0", &[64], vec![1.0f32; 64]).unwrap();
        let small = Tensor::from_vec("/cpu:0", &[2], vec![2.0f32; 2]).unwrap();
        let tensors = [big.clone(), small];
        let plan = FusionPlan::new(&tensors, 16);
        assert_eq!(
            plan.num_buckets(),
            2,
            "256 bytes exceed 16: the next tensor starts a bucket"
        );
        let buckets = plan.pack(&tensors).unwrap();
        assert!(buckets[0].shares_buffer_with(&big));
        assert!(
            plan.unpack(&buckets[..1]).is_err(),
            "every bucket must come back"
        );
    }

    #[test]
    // A single pack is a one-element list of index ranges, not a mistaken range of indices.
    #[allow(clippy::single_range_in_vec_init)]
    fn col36_group_by_size() {
        let values = [
            Tensor::zeros("/cpu:0", DType::F32, &[2, 4, 4]).unwrap(),
            Tensor::zeros("/cpu:0", DType::I32, &[8]).unwrap(),
            Tensor::zeros("/cpu:0", DType::I64, &[10, 10]).unwrap(),
            Tensor::zeros("/cpu:0", DType::I32, &[1]).unwrap(),
        ];
        assert_eq!(
            values.iter().map(Tensor::size_in_bytes).collect::<Vec<_>>(),
            [128, 32, 800, 4]
        );
        assert_eq!(group_by_size(&values, 200), [0..3, 3..4]);
        assert_eq!(
            group_by_size(&values, 160),
            [0..3, 3..4],
            "a pack exactly at the threshold stays open: TF closes a pack only once it exceeds it"
        );
        assert_eq!(group_by_size(&values, 0), [0..4]);
        assert_eq!(group_by_size(&values, 100_000), [0..4]);
        assert_eq!(
            group_by_size(&values, 100),
            [0..1, 1..3, 3..4],
            "128 > 100 closes at once"
        );
        assert!(group_by_size(&[], 200).is_empty());
    }

    /// Fusion: pack every replica's tensors into buckets, reduce the buckets, unpack: bitwise the
    /// same as reducing tensor by tensor, in order and shape, across dtypes and bucket sizes.
    #[test]
    fn col36_fusion_buckets_reduce_like_one_by_one() {
        let replicas = 3;
        let make = |r: usize| -> Vec<Tensor> {
            let dev = format!("/cpu:{r}");
            let wobble = |i: usize| ((i * 7919 + r * 104_729) % 1000) as f32 / 7.0 - 60.0;
            let f = |shape: &[usize], seed: usize| {
                let n: usize = shape.iter().product();
                Tensor::from_vec(
                    &dev,
                    shape,
                    (0..n).map(|i| wobble(i + seed) * 1e-3).collect(),
                )
                .unwrap()
            };
            vec![
                f(&[3, 5], 0),
                f(&[], 1),
                Tensor::from_vec(&dev, &[4], vec![r as i64, 2, 3, -(r as i64)]).unwrap(),
                f(&[2, 2, 2], 3),
                f(&[40], 4),
                Tensor::from_vec(&dev, &[3], vec![half::f16::from_f32(0.1 * r as f32); 3]).unwrap(),
                f(&[7], 5),
            ]
        };
        let per_replica: Vec<Vec<Tensor>> = (0..replicas).map(make).collect();
        let one_by_one: Vec<Tensor> = (0..per_replica[0].len())
            .map(|i| {
                let parts: Vec<&Tensor> = per_replica.iter().map(|r| &r[i]).collect();
                sum(&parts)
            })
            .collect();
        for bytes_per_pack in [0, 1, 16, 64, 100, 1 << 20] {
            let plan = FusionPlan::new(&per_replica[0], bytes_per_pack);
            let packed: Vec<Vec<Tensor>> =
                per_replica.iter().map(|r| plan.pack(r).unwrap()).collect();
            let reduced: Vec<Tensor> = (0..plan.num_buckets())
                .map(|b| {
                    let parts: Vec<&Tensor> = packed.iter().map(|p| &p[b]).collect();
                    sum(&parts)
                })
                .collect();
            let unpacked = plan.unpack(&reduced).unwrap();
            assert_eq!(unpacked.len(), one_by_one.len());
            for (i, (got, want)) in unpacked.iter().zip(&one_by_one).enumerate() {
                assert!(
                    got.bitwise_eq(want),
                    "bytes_per_pack {bytes_per_pack}, tensor {i}: {got} vs {want}"
                );
            }
            let covered: Vec<usize> = (0..plan.num_buckets())
                .flat_map(|b| plan.members(b).unwrap())
                .collect();
            assert_eq!(covered, (0..one_by_one.len()).collect::<Vec<_>>());
            assert_eq!(
                plan.members(plan.num_buckets()),
                None,
                "past the last bucket"
            );
        }
        // Dtype runs split buckets even when the size would allow one.
        assert_eq!(FusionPlan::new(&per_replica[0], 0).num_buckets(), 5);
        let mut wrong = per_replica[1].clone();
        wrong[4] = ramp("/cpu:1", &[41], 0.0);
        assert!(matches!(
            FusionPlan::new(&per_replica[0], 64).pack(&wrong),
            Err(CollectiveError::InvalidArgument(_))
        ));
    }
}
