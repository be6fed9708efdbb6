//! Helpers shared by the behaviour tests: worker layouts and readable step contents.

use distribute_input::{
    BatchSplit, Dataset, DistributedDataset, InputError, InputOptions, InputWorkers,
};
use distribute_tensor::Tensor;
use distribute_values::DistributedValues;

/// The elements of an int64 tensor.
pub(crate) fn ints(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().expect("an int64 tensor")
}

/// Every step as one list of int64 values per replica.
pub(crate) fn steps(dist: &DistributedDataset<Tensor>) -> Vec<Vec<Vec<i64>>> {
    dist.iter_per_replica()
        .map(|step| step.expect("a step").values().iter().map(ints).collect())
        .collect()
}

/// `n` local replicas on one worker.
pub(crate) fn local(n: usize) -> InputWorkers {
    InputWorkers::local((0..n).map(|i| format!("/gpu:{i}"))).unwrap()
}

fn worker_devices(task: usize, per_worker: usize) -> Vec<String> {
    (0..per_worker)
        .map(|d| format!("/job:worker/task:{task}/device:GPU:{d}"))
        .collect()
}

/// `workers` workers fed by this process (in-graph), each with `per_worker` replicas.
pub(crate) fn in_graph(workers: usize, per_worker: usize) -> InputWorkers {
    InputWorkers::new((0..workers).map(|w| {
        (
            format!("/job:worker/task:{w}"),
            worker_devices(w, per_worker),
        )
    }))
    .unwrap()
}

/// Worker `index` of `workers` in a between-graph cluster, with `per_worker` replicas.
pub(crate) fn between(workers: usize, index: usize, per_worker: usize) -> InputWorkers {
    InputWorkers::worker_of_cluster(
        workers,
        index,
        &format!("/job:worker/task:{index}"),
        worker_devices(index, per_worker),
    )
    .unwrap()
}

/// Options with whole batches per replica (TF's raw, unsplit input).
pub(crate) fn whole() -> InputOptions {
    InputOptions {
        split: BatchSplit::WholeBatches,
        ..InputOptions::default()
    }
}

/// `range(n).batch(b, drop)` distributed with `options` over `workers`.
pub(crate) fn distribute(
    n: usize,
    b: usize,
    drop: bool,
    workers: &InputWorkers,
    options: InputOptions,
) -> Result<DistributedDataset<Tensor>, InputError> {
    DistributedDataset::new(Dataset::range(n).batch(b, drop)?, workers, options)
}

/// `0..n` as a list of lists, for expected values.
pub(crate) fn r(range: std::ops::Range<i64>) -> Vec<i64> {
    range.collect()
}
