//! Snapshots of the printed per-replica batches of small datasets, one per policy, so a change
//! in splitting or placement shows up as a readable diff.

use std::fmt::Write;

use distribute_input::{
    AutoShardPolicy, BatchSplit, DistributedDataset, InputOptions, PartialBatch,
};
use distribute_tensor::Tensor;

use crate::common::{distribute, in_graph, local};

fn render(dist: &DistributedDataset<Tensor>) -> String {
    let mut out = String::new();
    for (i, step) in dist.iter_per_replica().enumerate() {
        writeln!(out, "step {i}: {}", step.unwrap()).unwrap();
    }
    out
}

#[test]
fn snapshot_keep_uneven_two_replicas() {
    let dist = distribute(9, 4, false, &local(2), InputOptions::default()).unwrap();
    insta::assert_snapshot!(render(&dist));
}

#[test]
fn snapshot_in_graph_whole_batches_data_sharded() {
    let options = InputOptions {
        split: BatchSplit::WholeBatches,
        auto_shard: AutoShardPolicy::Data,
        fetch_to_device: false,
        ..InputOptions::default()
    };
    let dist = distribute(9, 2, false, &in_graph(2, 2), options).unwrap();
    insta::assert_snapshot!(render(&dist));
}

#[test]
fn snapshot_pad_with_mask_three_replicas() {
    let options = InputOptions {
        partial_batch: PartialBatch::PadWithMask,
        ..InputOptions::default()
    };
    let dist = distribute(7, 5, false, &local(3), options).unwrap();
    let mut out = String::new();
    for (i, step) in dist.iter_masked().into_per_replica().enumerate() {
        writeln!(out, "step {i}:").unwrap();
        for (r, device, m) in step.unwrap().iter() {
            writeln!(
                out,
                "  {r} {device}: batch {:?} mask {:?}",
                m.batch.to_vec::<i64>().unwrap(),
                m.mask.to_vec::<f32>().unwrap()
            )
            .unwrap();
        }
    }
    insta::assert_snapshot!(out);
}
