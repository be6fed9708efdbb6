//! Ring all-reduce with subchunks (TF's `build_ring_all_reduce`, COL-43..COL-46, COL-48).
//!
//! Each input is padded and cut into `devices × subchunks` chunks. Subchunk `s` travels its own
//! ring, whose order is the worker-major device order with the GPU order `gpu_perm` rotated by
//! `s · (gpus / subchunks)`: rotating the rings spreads the traffic over different links. In
//! `devices − 1` ticks each device adds its predecessor's partial sum of one chunk to its own
//! (the gather pass); in `devices − 1` more ticks the finished chunks are passed round so every
//! device holds them all (the scatter pass).

use distribute_values::ReduceOp;

use super::shape::{flatten_tensors, join, padded_split, restore_shape, strip_padding};
use super::{UnaryOp, apply_unary, check_red_op, combine};
use crate::{CollectiveError, Tensor};

/// For each subchunk `s`, `pred[s][d]` is the device that sends to device `d` on ring `s`, and
/// `rank[s][d]` is `d`'s position on that ring.
///
/// Only [`ring_permutations`] builds one, so every ring is a permutation of the same devices
/// and [`ring_gather`] only has to check that it fits its inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingPermutations {
    pred: Vec<Vec<usize>>,
    rank: Vec<Vec<usize>>,
}

impl RingPermutations {
    /// Predecessor of each device, per subchunk: `pred()[s][d]` sends to `d` on ring `s`.
    pub fn pred(&self) -> &[Vec<usize>] {
        &self.pred
    }

    /// Position of each device on the ring, per subchunk: `rank()[s][d]`.
    pub fn rank(&self) -> &[Vec<usize>] {
        &self.rank
    }

    /// How many rings (subchunks) there are.
    pub fn num_subchunks(&self) -> usize {
        self.pred.len()
    }

    /// How many devices each ring passes through; 0 when there are no rings.
    pub fn num_devices(&self) -> usize {
        self.pred.first().map_or(0, Vec::len)
    }
}

/// The rings of `num_workers` workers with `gpu_perm.len()` GPUs each, one per subchunk (TF's
/// `_ring_permutations`).
///
/// Fails when there are more subchunks than GPUs per worker, when there are devices but no
/// subchunks, or when `gpu_perm` is not a permutation of `0..gpus`.
pub fn ring_permutations(
    num_workers: usize,
    num_subchunks: usize,
    gpu_perm: &[usize],
) -> Result<RingPermutations, CollectiveError> {
    let num_gpus = gpu_perm.len();
    let devices = num_workers * num_gpus;
    if devices == 0 {
        return Ok(RingPermutations {
            pred: Vec::new(),
            rank: Vec::new(),
        });
    }
    if num_subchunks > num_gpus || num_subchunks == 0 {
        return Err(CollectiveError::InvalidArgument(format!(
            "num_subchunks {num_subchunks} must be between 1 and num_gpus {num_gpus}"
        )));
    }
    let mut seen = vec![false; num_gpus];
    for &g in gpu_perm {
        if g >= num_gpus || std::mem::replace(&mut seen[g], true) {
            return Err(CollectiveError::InvalidArgument(format!(
                "gpu_perm {gpu_perm:?} must be a permutation of 0..{num_gpus}"
            )));
        }
    }
    let rotation = (num_gpus / num_subchunks).max(1);
    let mut pred = Vec::with_capacity(num_subchunks);
    let mut rank = Vec::with_capacity(num_subchunks);
    for s in 0..num_subchunks {
        let offset = s * rotation;
        let order: Vec<usize> = (0..num_workers)
            .flat_map(|w| {
                (0..num_gpus).map(move |i| w * num_gpus + gpu_perm[(i + offset) % num_gpus])
            })
            .collect();
        let mut pred_s = vec![0; devices];
        let mut rank_s = vec![0; devices];
        for (position, &d) in order.iter().enumerate() {
            pred_s[order[(position + 1) % devices]] = d;
            rank_s[d] = position;
        }
        pred.push(pred_s);
        rank.push(rank_s);
    }
    Ok(RingPermutations { pred, rank })
}

/// The state after the gather pass: `chunks_by_dev[d]` is device `d`'s list of chunks, each
/// fully reduced on exactly one device; `pad_len` zeros were appended before chunking.
#[derive(Debug, Clone)]
pub struct RingGather {
    /// Per device, its `devices × subchunks` chunks.
    pub chunks_by_dev: Vec<Vec<Tensor>>,
    /// Zeros appended to each input so that it splits evenly.
    pub pad_len: usize,
}

/// The chunk that device `d` works on for subchunk `s` when the ring is `back` steps behind.
fn chunk_index(
    perms: &RingPermutations,
    s: usize,
    d: usize,
    back: usize,
    subchunks: usize,
) -> usize {
    let devices = perms.rank[s].len();
    let segment = (perms.rank[s][d] + devices - back % devices) % devices;
    segment * subchunks + s
}

/// The gather (reduce) pass over 1-D inputs, one per device (TF's `_build_ring_gather`).
///
/// With one input, that input comes back as its only chunk, unpadded.
pub fn ring_gather(
    inputs: &[Tensor],
    num_subchunks: usize,
    perms: &RingPermutations,
    red_op: ReduceOp,
) -> Result<RingGather, CollectiveError> {
    check_red_op(red_op)?;
    let devices = inputs.len();
    if devices <= 1 {
        return Ok(RingGather {
            chunks_by_dev: inputs.iter().map(|t| vec![t.clone()]).collect(),
            pad_len: 0,
        });
    }
    if perms.num_subchunks() != num_subchunks || perms.num_devices() != devices {
        return Err(CollectiveError::InvalidArgument(format!(
            "ring permutations for {} subchunks of {} devices do not fit {devices} inputs in \
             {num_subchunks} subchunks; build them with ring_permutations for these inputs",
            perms.num_subchunks(),
            perms.num_devices()
        )));
    }
    let num_chunks = devices * num_subchunks;
    let mut chunks_by_dev = Vec::with_capacity(devices);
    let mut pad_len = 0;
    for input in inputs {
        let split = padded_split(input, num_chunks)?;
        pad_len = split.pad_len;
        chunks_by_dev.push(split.pieces);
    }
    for tick in 0..devices - 1 {
        // All reads of a tick see the previous tick's values, as in TF's graph.
        let mut updates = Vec::with_capacity(num_chunks);
        for d in 0..devices {
            for s in 0..num_subchunks {
                let c = chunk_index(perms, s, d, tick + 2, num_subchunks);
                let pred = perms.pred[s][d];
                let sum = combine(
                    red_op,
                    &[&chunks_by_dev[pred][c], &chunks_by_dev[d][c]],
                    inputs[d].device(),
                )?;
                updates.push((d, c, sum));
            }
        }
        for (d, c, sum) in updates {
            chunks_by_dev[d][c] = sum;
        }
    }
    Ok(RingGather {
        chunks_by_dev,
        pad_len,
    })
}

/// The scatter pass: every finished chunk is passed round the ring until all devices hold
/// every chunk; returns each device's chunks joined (TF's `_build_ring_scatter`).
fn ring_scatter(
    perms: &RingPermutations,
    mut chunks_by_dev: Vec<Vec<Tensor>>,
    devices_of: &[&str],
) -> Result<Vec<Tensor>, CollectiveError> {
    let devices = chunks_by_dev.len();
    let num_chunks = chunks_by_dev[0].len();
    if !num_chunks.is_multiple_of(devices) {
        return Err(CollectiveError::Invariant(format!(
            "ring scatter: {num_chunks} chunks do not divide among {devices} devices"
        )));
    }
    let num_subchunks = num_chunks / devices;
    for tick in 0..devices - 1 {
        let mut passed = Vec::with_capacity(num_chunks);
        for (d, device) in devices_of.iter().enumerate() {
            for s in 0..num_subchunks {
                let c = chunk_index(perms, s, d, tick + 1, num_subchunks);
                let pred = perms.pred[s][d];
                passed.push((d, c, chunks_by_dev[pred][c].to_device(device)));
            }
        }
        for (d, c, chunk) in passed {
            chunks_by_dev[d][c] = chunk;
        }
    }
    chunks_by_dev
        .iter()
        .zip(devices_of)
        .map(|(chunks, device)| join(device, chunks))
        .collect()
}

/// Ring all-reduce of one tensor per device: `num_workers` workers of `gpu_perm.len()` devices
/// each, in worker-major order (TF's `build_ring_all_reduce`).
///
/// Fails with fewer than 2 inputs, with an input count other than `num_workers ×
/// gpu_perm.len()`, or with the errors of [`ring_permutations`]. Outputs keep the input shape.
pub fn ring_all_reduce(
    inputs: &[Tensor],
    num_workers: usize,
    num_subchunks: usize,
    gpu_perm: &[usize],
    red_op: ReduceOp,
    un_op: Option<UnaryOp<'_>>,
) -> Result<Vec<Tensor>, CollectiveError> {
    if inputs.len() < 2 {
        return Err(CollectiveError::InvalidArgument(format!(
            "a ring all-reduce needs 2 or more input tensors, got {}",
            inputs.len()
        )));
    }
    if inputs.len() != num_workers * gpu_perm.len() {
        return Err(CollectiveError::InvalidArgument(format!(
            "a ring over {num_workers} workers of {} GPUs needs {} input tensors, got {}",
            gpu_perm.len(),
            num_workers * gpu_perm.len(),
            inputs.len()
        )));
    }
    check_red_op(red_op)?;
    let (flat, shape) = flatten_tensors(inputs)?;
    let devices: Vec<&str> = flat.iter().map(Tensor::device).collect();
    let perms = ring_permutations(num_workers, num_subchunks, gpu_perm)?;
    let RingGather {
        mut chunks_by_dev,
        pad_len,
    } = ring_gather(&flat, num_subchunks, &perms, red_op)?;
    if let Some(op) = un_op {
        // Each chunk is complete on exactly one device after the gather pass; TF applies the op
        // to every chunk everywhere, and the scatter pass then keeps only the complete ones.
        for chunks in &mut chunks_by_dev {
            for chunk in chunks.iter_mut() {
                *chunk = apply_unary(Some(op), chunk.clone())?;
            }
        }
    }
    let mut outputs = ring_scatter(&perms, chunks_by_dev, &devices)?;
    if pad_len > 0 {
        outputs = strip_padding(&outputs, pad_len)?;
    }
    restore_shape(outputs, &shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ring_is_a_single_cycle_through_all_devices() {
        for (workers, subchunks, perm) in [(2, 2, vec![0, 3, 2, 1]), (3, 3, vec![2, 0, 1])] {
            let perms = ring_permutations(workers, subchunks, &perm).unwrap();
            for pred in &perms.pred {
                let mut d = 0;
                for _ in 0..pred.len() {
                    d = pred[d];
                }
                assert_eq!(d, 0);
                let mut visited: Vec<usize> = (0..pred.len())
                    .scan(0, |d, _| {
                        *d = pred[*d];
                        Some(*d)
                    })
                    .collect();
                visited.sort_unstable();
                assert_eq!(visited, (0..pred.len()).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn a_bad_gpu_perm_is_refused() {
        assert!(ring_permutations(1, 1, &[0, 0]).is_err());
        assert!(ring_permutations(1, 1, &[1, 2]).is_err());
        assert!(ring_permutations(1, 0, &[0]).is_err());
    }
}
