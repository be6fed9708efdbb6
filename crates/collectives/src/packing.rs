//! Packing many tensors into few (TF's `cross_device_utils` and `cross_device_ops` packers):
//! splitting a batch by sparsity and stitching it back (COL-19, COL-20), the concat-and-split
//! packer and its `num_packs` setting (COL-22, COL-23), grouping by byte size and the fusion
//! buckets built on it (COL-36), and packing runs of small float32 tensors (COL-39).
//!
//! Every packer returns a record of what it did, and unpacking with that record restores the
//! original tensors' order and shapes. Packing only moves elements, never combines them, so an
//! element-wise reduction of packed tensors equals the reduction of the originals bit for bit.

use std::num::NonZeroUsize;
use std::ops::Range;

use crate::flat::{concat, flatten, reshape, split_lengths};
use crate::keys::extract_ranges;
use crate::{AnyTensor, CollectiveError, DType, Tensor};

// ---------------------------------------------------------------------------------------------
// Sparsity (COL-19, COL-20)

/// True when every component is sparse (TF's `is_indexed_slices` on a per-replica value; a
/// single value is a one-component slice).
pub fn is_indexed_slices(components: &[AnyTensor]) -> bool {
    components.iter().all(AnyTensor::is_sparse)
}

/// True when any value is sparse; false for an empty list (TF's `contains_indexed_slices`).
pub fn contains_indexed_slices(values: &[AnyTensor]) -> bool {
    values.iter().any(AnyTensor::is_sparse)
}

/// A batch split into its dense and its sparse values, each with its original positions.
#[derive(Debug, Clone, PartialEq)]
pub struct SparsitySplit<V> {
    /// The dense values, in order.
    pub dense: Vec<V>,
    /// The position of each dense value in the batch.
    pub dense_positions: Vec<usize>,
    /// The sparse values, in order.
    pub sparse: Vec<V>,
    /// The position of each sparse value in the batch.
    pub sparse_positions: Vec<usize>,
}

/// Splits a batch of per-replica values (each given by its components) into dense and sparse
/// ones, remembering positions (TF's `split_by_sparsity`); a value is sparse when all its
/// components are.
pub fn split_by_sparsity<V: AsRef<[AnyTensor]> + Clone>(values: &[V]) -> SparsitySplit<V> {
    let mut split = SparsitySplit {
        dense: Vec::new(),
        dense_positions: Vec::new(),
        sparse: Vec::new(),
        sparse_positions: Vec::new(),
    };
    for (i, value) in values.iter().enumerate() {
        if is_indexed_slices(value.as_ref()) {
            split.sparse.push(value.clone());
            split.sparse_positions.push(i);
        } else {
            split.dense.push(value.clone());
            split.dense_positions.push(i);
        }
    }
    split
}

/// Rebuilds a batch from groups of (values, positions) (TF's `stitch_values`).
///
/// Fails with `Invariant` when a position is filled twice, lies outside the batch, or a group's
/// values and positions differ in count.
pub fn stitch_values<V>(groups: Vec<(Vec<V>, Vec<usize>)>) -> Result<Vec<V>, CollectiveError> {
    let len: usize = groups.iter().map(|(v, _)| v.len()).sum();
    let mut slots: Vec<Option<V>> = (0..len).map(|_| None).collect();
    for (values, positions) in groups {
        if values.len() != positions.len() {
            return Err(CollectiveError::Invariant(format!(
                "stitch_values: {} values but {} positions",
                values.len(),
                positions.len()
            )));
        }
        for (value, i) in values.into_iter().zip(positions) {
            let slot = slots.get_mut(i).ok_or_else(|| {
                CollectiveError::Invariant(format!(
                    "stitch_values: position {i} is outside a batch of {len}"
                ))
            })?;
            if slot.replace(value).is_some() {
                return Err(CollectiveError::Invariant(format!(
                    "stitch_values: position {i} is filled twice"
                )));
            }
        }
    }
    // Every slot is filled: there are `len` distinct in-range positions.
    Ok(slots.into_iter().map(|v| v.expect("filled")).collect())
}

// ---------------------------------------------------------------------------------------------
// Concat-and-split packing (COL-22, COL-23)

/// How many packs the all-reduce backends cut each device's gradients into (TF's
/// `num_packs`): 0 turns packing off, a negative count is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumPacks(Option<NonZeroUsize>);

impl NumPacks {
    /// Validates a configured count: `n > 0` packs into `n`, 0 means no packing, `n < 0` fails.
    pub fn new(num_packs: i64) -> Result<NumPacks, CollectiveError> {
        if num_packs < 0 {
            return Err(CollectiveError::InvalidArgument(format!(
                "num_packs must be greater than or equal to zero (0 turns packing off), got \
                 {num_packs}"
            )));
        }
        Ok(NumPacks(NonZeroUsize::new(num_packs as usize)))
    }

    /// The count, 0 when packing is off.
    pub fn get(self) -> usize {
        self.0.map_or(0, NonZeroUsize::get)
    }

    /// The packer to use, if packing is on.
    pub fn packer(self) -> Option<ConcatAndSplitPacker> {
        self.0.map(|num_packs| ConcatAndSplitPacker { num_packs })
    }
}

/// The lengths of `num_packs` packs of `total` elements: all `total / num_packs` but the last,
/// which takes the rest (10 in 3 → [3, 3, 4]; 2 in 3 → [0, 0, 2]).
pub fn pack_split_sizes(total: usize, num_packs: NonZeroUsize) -> Vec<usize> {
    let n = num_packs.get();
    let size = total / n;
    let mut sizes = vec![size; n];
    sizes[n - 1] = total - size * (n - 1);
    sizes
}

/// Concatenates each device's tensors into one flat run and cuts it into `num_packs` packs
/// (TF's `_ConcatAndSplitPacker`), so an all-reduce moves a few large buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConcatAndSplitPacker {
    num_packs: NonZeroUsize,
}

/// What [`ConcatAndSplitPacker::pack`] did, to undo it on the reduced packs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcatAndSplitPacking {
    /// The shape of each tensor of each device.
    shapes: Vec<Vec<Vec<usize>>>,
}

impl ConcatAndSplitPacker {
    /// A packer into `num_packs` packs; fails unless `num_packs > 0`.
    pub fn new(num_packs: i64) -> Result<ConcatAndSplitPacker, CollectiveError> {
        NumPacks::new(num_packs)?.packer().ok_or_else(|| {
            CollectiveError::InvalidArgument(
                "num_packs must be greater than zero for the concat-and-split packer".into(),
            )
        })
    }

    /// The number of packs per device.
    pub fn num_packs(&self) -> usize {
        self.num_packs.get()
    }

    /// Packs `device_grads[d]` (device `d`'s tensors, all of one dtype) into
    /// [`num_packs`](Self::num_packs) 1-D tensors on the device of its first tensor.
    pub fn pack(
        &self,
        device_grads: &[Vec<Tensor>],
    ) -> Result<(Vec<Vec<Tensor>>, ConcatAndSplitPacking), CollectiveError> {
        let mut packs = Vec::with_capacity(device_grads.len());
        let mut shapes = Vec::with_capacity(device_grads.len());
        for (d, grads) in device_grads.iter().enumerate() {
            let first = grads.first().ok_or_else(|| {
                CollectiveError::InvalidArgument(format!(
                    "device {d} has no tensors to pack; every device needs at least one"
                ))
            })?;
            let flat = flatten_all(grads)?;
            let joined = concat(first.device(), &flat)?;
            packs.push(split_lengths(
                &joined,
                &pack_split_sizes(joined.num_elements(), self.num_packs),
            )?);
            shapes.push(grads.iter().map(|g| g.shape().to_vec()).collect());
        }
        Ok((packs, ConcatAndSplitPacking { shapes }))
    }
}

impl ConcatAndSplitPacking {
    /// The original tensors of every device, cut out of its (reduced) packs and reshaped, on
    /// the device of its first pack.
    pub fn unpack(&self, packs: &[Vec<Tensor>]) -> Result<Vec<Vec<Tensor>>, CollectiveError> {
        if packs.len() != self.shapes.len() {
            return Err(CollectiveError::InvalidArgument(format!(
                "packed {} devices but asked to unpack {}",
                self.shapes.len(),
                packs.len()
            )));
        }
        packs
            .iter()
            .zip(&self.shapes)
            .map(|(device_packs, shapes)| {
                let first = device_packs.first().ok_or_else(|| {
                    CollectiveError::InvalidArgument("a device has no packs to unpack".into())
                })?;
                let joined = concat(first.device(), device_packs)?;
                cut(&joined, shapes)
            })
            .collect()
    }
}

/// Packs each device's tensors into `num_packs` packs when packing is on (TF's
/// `_pack_tensors`); with packing off the tensors come back as they are and the record is
/// `None`.
pub fn pack_tensors(
    device_grads: &[Vec<Tensor>],
    num_packs: NumPacks,
) -> Result<(Vec<Vec<Tensor>>, Option<ConcatAndSplitPacking>), CollectiveError> {
    match num_packs.packer() {
        Some(packer) => {
            let (packs, record) = packer.pack(device_grads)?;
            Ok((packs, Some(record)))
        }
        None => Ok((device_grads.to_vec(), None)),
    }
}

/// Undoes [`pack_tensors`]; the identity when the record is `None`.
pub fn unpack_tensors(
    device_grads: &[Vec<Tensor>],
    packing: Option<&ConcatAndSplitPacking>,
) -> Result<Vec<Vec<Tensor>>, CollectiveError> {
    match packing {
        Some(record) => record.unpack(device_grads),
        None => Ok(device_grads.to_vec()),
    }
}

fn flatten_all(tensors: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
    tensors.iter().map(flatten).collect()
}

/// Cuts a 1-D tensor into consecutive pieces of the given shapes.
fn cut(joined: &Tensor, shapes: &[Vec<usize>]) -> Result<Vec<Tensor>, CollectiveError> {
    let lengths: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
    split_lengths(joined, &lengths)?
        .iter()
        .zip(shapes)
        .map(|(piece, shape)| reshape(piece, shape))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Grouping by size and fusion buckets (COL-36)

/// Groups consecutive values into packs of about `bytes_per_pack` bytes (TF's `group_by_size`),
/// returned as index ranges.
///
/// A new pack starts once the running total of the current one exceeds `bytes_per_pack`, so
/// every pack but the last holds more than `bytes_per_pack` bytes (few, large packs).
/// `bytes_per_pack == 0` gives one pack holding everything. Host tensors always have a known
/// size, so TF's "unknown shape → one pack" case cannot arise.
pub fn group_by_size(values: &[Tensor], bytes_per_pack: usize) -> Vec<Range<usize>> {
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
/// Buckets follow [`group_by_size`], further split where the dtype changes, since a bucket is
/// one buffer of one element type. Plan from one replica's tensors, [`pack`](Self::pack) every
/// replica's tensors with the same plan, reduce bucket `b` across replicas, and
/// [`unpack`](Self::unpack) the results: each comes back in its original position and shape,
/// bitwise equal to reducing the tensors one by one, because the reduction is element-wise.
///
/// ```
/// use distribute_collectives::{FusionPlan, Tensor};
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
                concat(members[0].device(), &flatten_all(members)?)
            })
            .collect()
    }

    /// The tensors cut back out of (reduced) buckets, in their original order and shapes, each
    /// on its bucket's device.
    pub fn unpack(&self, buckets: &[Tensor]) -> Result<Vec<Tensor>, CollectiveError> {
        if buckets.len() != self.buckets.len() {
            return Err(CollectiveError::InvalidArgument(format!(
                "the fusion plan has {} buckets, got {}",
                self.buckets.len(),
                buckets.len()
            )));
        }
        let mut out = Vec::with_capacity(self.count);
        for (tensor, bucket) in buckets.iter().zip(&self.buckets) {
            if tensor.dtype() != bucket.dtype {
                return Err(CollectiveError::DTypeMismatch {
                    expected: bucket.dtype,
                    actual: tensor.dtype(),
                });
            }
            out.extend(cut(tensor, &bucket.shapes)?);
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Packing small tensors (COL-39)

/// What [`pack_small_tensors`] packed, to undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallTensorPacking {
    /// Inclusive index ranges packed into one tensor each, in the order the packs come first.
    ranges: Vec<[usize; 2]>,
    /// The positions of the tensors left alone, in the order they follow the packs.
    others: Vec<usize>,
    /// Per device, per range, the shapes of the packed tensors.
    shapes: Vec<Vec<Vec<Vec<usize>>>>,
}

/// Packs runs of consecutive small float32 tensors into one tensor per run (TF's 2019
/// `pack_small_tensors`).
///
/// A tensor is a candidate when it is float32 and `4 · elements ≤ max_bytes`; runs are found by
/// [`extract_ranges`] with limit `max_group`. On every device the packed runs come first, then
/// the other tensors in order; lone candidates are left as they are. With nothing to pack, the
/// tensors come back unchanged with no record.
///
/// Every device must hold tensors of the same dtypes and shapes, position by position, as for
/// [`FusionPlan::pack`]: the candidates are chosen once for all devices. Fails with `Invariant`
/// when the devices hold different numbers of tensors and with `InvalidArgument` when a
/// tensor's dtype or shape differs from device 0's.
pub fn pack_small_tensors(
    replica_grads: &[Vec<Tensor>],
    max_bytes: usize,
    max_group: usize,
) -> Result<(Vec<Vec<Tensor>>, Option<SmallTensorPacking>), CollectiveError> {
    let Some(first) = replica_grads.first() else {
        return Ok((Vec::new(), None));
    };
    for (d, grads) in replica_grads.iter().enumerate().skip(1) {
        if grads.len() != first.len() {
            return Err(CollectiveError::Invariant(format!(
                "device {d} has {} tensors but device 0 has {}",
                grads.len(),
                first.len()
            )));
        }
        for (i, (t, t0)) in grads.iter().zip(first).enumerate() {
            if t.dtype() != t0.dtype() || t.shape() != t0.shape() {
                return Err(CollectiveError::InvalidArgument(format!(
                    "device {d}'s tensor {i} is a {} {:?} tensor but device 0's is {} {:?}; \
                     every device must pass the same dtypes and shapes",
                    t.dtype(),
                    t.shape(),
                    t0.dtype(),
                    t0.shape()
                )));
            }
        }
    }
    let (small, mut others): (Vec<usize>, Vec<usize>) = (0..first.len())
        .partition(|&i| first[i].dtype() == DType::F32 && 4 * first[i].num_elements() <= max_bytes);
    let (ranges, singles) = extract_ranges(&small, max_group);
    if ranges.is_empty() {
        return Ok((replica_grads.to_vec(), None));
    }
    others.extend(singles);
    others.sort_unstable();
    let mut packed = Vec::with_capacity(replica_grads.len());
    let mut shapes = Vec::with_capacity(replica_grads.len());
    for grads in replica_grads {
        let mut list = Vec::with_capacity(ranges.len() + others.len());
        let mut device_shapes = Vec::with_capacity(ranges.len());
        for &[lo, hi] in &ranges {
            let members = &grads[lo..=hi];
            list.push(concat(members[0].device(), &flatten_all(members)?)?);
            device_shapes.push(members.iter().map(|t| t.shape().to_vec()).collect());
        }
        list.extend(others.iter().map(|&i| grads[i].clone()));
        packed.push(list);
        shapes.push(device_shapes);
    }
    Ok((
        packed,
        Some(SmallTensorPacking {
            ranges,
            others,
            shapes,
        }),
    ))
}

impl SmallTensorPacking {
    /// Each device's tensors in their original order and shapes, the packs cut apart on their
    /// own devices.
    pub fn unpack(
        &self,
        replica_grads: &[Vec<Tensor>],
    ) -> Result<Vec<Vec<Tensor>>, CollectiveError> {
        if replica_grads.len() != self.shapes.len() {
            return Err(CollectiveError::InvalidArgument(format!(
                "packed {} devices but asked to unpack {}",
                self.shapes.len(),
                replica_grads.len()
            )));
        }
        let count = self.others.len()
            + self
                .ranges
                .iter()
                .map(|[lo, hi]| hi - lo + 1)
                .sum::<usize>();
        replica_grads
            .iter()
            .zip(&self.shapes)
            .map(|(grads, shapes)| {
                if grads.len() != self.ranges.len() + self.others.len() {
                    return Err(CollectiveError::InvalidArgument(format!(
                        "expected {} packed tensors per device, got {}",
                        self.ranges.len() + self.others.len(),
                        grads.len()
                    )));
                }
                let mut slots: Vec<Option<Tensor>> = vec![None; count];
                for ((pack, &[lo, _]), range_shapes) in grads.iter().zip(&self.ranges).zip(shapes) {
                    for (k, t) in cut(pack, range_shapes)?.into_iter().enumerate() {
                        slots[lo + k] = Some(t);
                    }
                }
                for (t, &i) in grads[self.ranges.len()..].iter().zip(&self.others) {
                    slots[i] = Some(t.clone());
                }
                Ok(slots
                    .into_iter()
                    .map(|t| t.expect("every position is packed or kept"))
                    .collect())
            })
            .collect()
    }
}

/// Undoes [`pack_small_tensors`]; the identity when nothing was packed.
pub fn unpack_small_tensors(
    replica_grads: &[Vec<Tensor>],
    packing: Option<&SmallTensorPacking>,
) -> Result<Vec<Vec<Tensor>>, CollectiveError> {
    match packing {
        Some(record) => record.unpack(replica_grads),
        None => Ok(replica_grads.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn stitching_nothing_gives_nothing() {
        assert!(stitch_values::<u8>(vec![]).unwrap().is_empty());
        assert!(
            stitch_values::<u8>(vec![(vec![], vec![])])
                .unwrap()
                .is_empty()
        );
    }
}
