//! Property tests: splitting then joining gives back every global batch, for any batch size,
//! dataset size and replica count.

use distribute_input::{
    Batch, Dataset, DistributedDataset, InputOptions, PartialBatch, split_sizes,
};
use distribute_tensor::Tensor;
use distribute_values::DistributedValues;
use proptest::prelude::*;

use crate::common::local;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn split_then_concat_is_the_global_batch(rows in 0usize..60, batch in 1usize..17, replicas in 1usize..9, prefetch in 0usize..3) {
        let data: Vec<i64> = (0..rows as i64).collect();
        let features = Tensor::from_vec("/cpu:0", &[rows, 2], data.iter().flat_map(|x| [*x, -x]).collect()).unwrap();
        let labels = Tensor::from_vec("/cpu:0", &[rows], data.clone()).unwrap();
        let ds = Dataset::from_tensors((features, labels)).unwrap().batch(batch, false).unwrap();
        let dist = DistributedDataset::new(ds.clone(), &local(replicas), InputOptions { prefetch, ..InputOptions::default() }).unwrap();
        // Collected first, so that a step too many on either side is counted, not zipped away.
        let steps: Vec<_> = dist.iter_per_replica().collect::<Result<_, _>>().unwrap();
        let globals: Vec<_> = ds.iter().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(steps.len(), rows.div_ceil(batch));
        prop_assert_eq!(globals.len(), rows.div_ceil(batch));
        for (step, global) in steps.iter().zip(&globals) {
            prop_assert_eq!(step.num_replicas(), replicas);
            let parts: Vec<&(Tensor, Tensor)> = step.values().iter().collect();
            let joined = Batch::concat_rows(&parts).unwrap();
            prop_assert!(joined.0.bitwise_eq(&global.0) && joined.1.bitwise_eq(&global.1));
            let sizes: Vec<usize> = step.values().iter().map(|b| b.rows("step").unwrap()).collect();
            prop_assert_eq!(sizes, split_sizes(global.1.shape()[0], replicas));
        }
    }

    #[test]
    fn padding_keeps_the_real_rows_and_masks_the_rest(rows in 0usize..40, batch in 1usize..9, replicas in 1usize..5) {
        let options = InputOptions { partial_batch: PartialBatch::PadWithMask, ..InputOptions::default() };
        let ds = Dataset::range(rows).batch(batch, false).unwrap();
        let dist = DistributedDataset::new(ds, &local(replicas), options).unwrap();
        let mut real = Vec::new();
        for step in dist.iter_masked().into_per_replica() {
            for m in step.unwrap().values() {
                prop_assert_eq!(m.batch.shape()[0], batch.div_ceil(replicas));
                let values = m.batch.to_vec::<i64>().unwrap();
                let mask = m.mask.to_vec::<f32>().unwrap();
                real.extend(values.iter().zip(&mask).filter(|(_, m)| **m == 1.0).map(|(v, _)| *v));
            }
        }
        prop_assert_eq!(real, (0..rows as i64).collect::<Vec<_>>());
    }
}
