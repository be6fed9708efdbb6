//! How a batch is cut across replicas: [`split_sizes`] (TF's legacy rebatch, chunks of
//! ⌈b/n⌉) and [`batch_sizes_for_worker`] (TF's even rebatch across workers).

use crate::InputError;

/// The sizes of `pieces` consecutive chunks of a batch of `rows` rows: ⌈rows/pieces⌉ each
/// while rows remain, then the short remainder, then empty chunks (IN-13, IN-48).
///
/// ```
/// use distribute_input::split_sizes;
///
/// assert_eq!(split_sizes(10, 2), [5, 5]);
/// assert_eq!(split_sizes(4, 3), [2, 2, 0]);
/// assert_eq!(split_sizes(1, 2), [1, 0]);
/// assert_eq!(split_sizes(0, 2), [0, 0]);
/// ```
pub fn split_sizes(rows: usize, pieces: usize) -> Vec<usize> {
    split_sizes_iter(rows, pieces).collect()
}

/// [`split_sizes`] without the vector, for the per-batch path.
pub(crate) fn split_sizes_iter(rows: usize, pieces: usize) -> impl Iterator<Item = usize> {
    let chunk = rows.div_ceil(pieces.max(1));
    let mut left = rows;
    (0..pieces).map(move |_| {
        let size = chunk.min(left);
        left -= size;
        size
    })
}

/// The sub-batch sizes worker `worker` of `num_workers` (each with `replicas_per_worker`
/// replicas) cuts each global batch of `global_batch_size` into, so that every global step
/// consumes the global batch and any two sizes differ by at most one (IN-45).
///
/// Worker 0's list is ⌈G/N⌉ repeated `G mod N` times then ⌊G/N⌋, with N = W·R; worker `w`'s
/// is worker 0's rotated left by `w·R`.
///
/// ```
/// use distribute_input::batch_sizes_for_worker;
///
/// assert_eq!(batch_sizes_for_worker(7, 2, 2, 0)?, [2, 2, 2, 1]);
/// assert_eq!(batch_sizes_for_worker(7, 2, 2, 1)?, [2, 1, 2, 2]);
/// # Ok::<(), distribute_input::InputError>(())
/// ```
pub fn batch_sizes_for_worker(
    global_batch_size: usize,
    num_workers: usize,
    replicas_per_worker: usize,
    worker: usize,
) -> Result<Vec<usize>, InputError> {
    if num_workers == 0 || replicas_per_worker == 0 || worker >= num_workers {
        return Err(InputError::InvalidOption(format!(
            "batch_sizes_for_worker: need at least one worker and one replica per worker, and \
             worker {worker} in 0..{num_workers} (got {replicas_per_worker} replicas per worker)"
        )));
    }
    let n = num_workers * replicas_per_worker;
    let (floor, extra) = (global_batch_size / n, global_batch_size % n);
    let mut sizes: Vec<usize> = (0..n).map(|i| floor + usize::from(i < extra)).collect();
    sizes.rotate_left(worker * replicas_per_worker);
    Ok(sizes)
}
