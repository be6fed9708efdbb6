//! A user's `#[derive(Nest)]` struct as a dataset element (issue 13): a struct mixing a
//! tensor, a `Vec` of tensors and an `Option` of a tensor is batched, unbatched, distributed
//! over two replicas and split per replica like a tensor, and a leaf that is not a tensor is an
//! error naming its path.

use distribute_input::{
    Batch, Dataset, DistributedDataset, GeneratorSource, InputError, InputOptions, InputWorkers,
    PartialBatch, split_sizes,
};
use distribute_tensor::Tensor;
use distribute_values::{DistributedValues, Nest};

/// One example per row: two features, two token columns, and an optional weight.
#[derive(Debug, Clone, Nest)]
struct Example {
    features: Tensor,
    tokens: Vec<Tensor>,
    weight: Option<Tensor>,
}

/// Rows `0..n`: features `[i, -i]`, tokens `10·i` and `100·i`, weight `i / 2`.
fn examples(n: usize, weighted: bool) -> Example {
    let ids: Vec<i64> = (0..n as i64).collect();
    let column = |scale: i64| {
        Tensor::from_vec("/cpu:0", &[n], ids.iter().map(|i| i * scale).collect()).unwrap()
    };
    Example {
        features: Tensor::from_vec(
            "/cpu:0",
            &[n, 2],
            ids.iter().flat_map(|&i| [i as f32, -i as f32]).collect(),
        )
        .unwrap(),
        tokens: vec![column(10), column(100)],
        weight: weighted.then(|| {
            Tensor::from_vec(
                "/cpu:0",
                &[n],
                ids.iter().map(|&i| i as f32 / 2.0).collect(),
            )
            .unwrap()
        }),
    }
}

/// The row ids an example holds, read from each of its leaves (which must agree).
fn ids(e: &Example) -> Vec<i64> {
    let features = e.features.to_vec::<f32>().unwrap();
    let from_features: Vec<i64> = features.chunks(2).map(|r| r[0] as i64).collect();
    assert_eq!(e.tokens.len(), 2);
    let tokens: Vec<i64> = e.tokens[0]
        .to_vec::<i64>()
        .unwrap()
        .iter()
        .map(|t| t / 10)
        .collect();
    let hundreds: Vec<i64> = e.tokens[1]
        .to_vec::<i64>()
        .unwrap()
        .iter()
        .map(|t| t / 100)
        .collect();
    let weight = e.weight.as_ref().expect("a weight");
    let weights: Vec<i64> = weight
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|w| (w * 2.0) as i64)
        .collect();
    assert_eq!(from_features, tokens);
    assert_eq!(tokens, hundreds);
    assert_eq!(tokens, weights);
    tokens
}

#[test]
fn a_derived_struct_batches_and_unbatches() {
    let ds = Dataset::from_tensors(examples(10, true)).unwrap();
    let batched = ds.clone().batch(4, false).unwrap();
    let batches: Vec<Example> = batched.iter().collect::<Result<_, _>>().unwrap();
    let rows: Vec<Vec<i64>> = batches.iter().map(ids).collect();
    assert_eq!(rows, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    assert_eq!(batches[0].features.shape(), [4, 2]);

    // Unbatching cuts the batches back into one-row elements, the rows of the unbatched data.
    let unbatched = batched.rebatch([1], false).unwrap();
    let elements: Vec<Example> = unbatched.iter().collect::<Result<_, _>>().unwrap();
    let singles: Vec<Vec<i64>> = elements.iter().map(ids).collect();
    let expected: Vec<Vec<i64>> = (0..10).map(|i| vec![i]).collect();
    assert_eq!(singles, expected);
    assert_eq!(
        ds.iter().map(|e| ids(&e.unwrap())).collect::<Vec<_>>(),
        expected
    );
}

#[test]
fn a_derived_struct_is_distributed_and_split_per_replica() {
    let workers = InputWorkers::local(["/cpu:0", "/cpu:1"]).unwrap();
    let ds = Dataset::from_tensors(examples(10, true))
        .unwrap()
        .batch(4, false)
        .unwrap();
    let dist = DistributedDataset::new(ds.clone(), &workers, InputOptions::default()).unwrap();
    let steps: Vec<_> = dist.iter_per_replica().collect::<Result<_, _>>().unwrap();
    let globals: Vec<Example> = ds.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(steps.len(), 3);
    let mut per_replica = Vec::new();
    for (step, global) in steps.iter().zip(&globals) {
        for (r, part) in step.values().iter().enumerate() {
            let device = format!("/job:localhost/replica:0/task:0/device:CPU:{r}");
            assert_eq!(part.features.device(), device);
            assert!(part.tokens.iter().all(|t| t.device() == device));
            assert_eq!(part.weight.as_ref().unwrap().device(), device);
        }
        // The per-replica split: contiguous chunks of ⌈b/2⌉ rows that join into the global batch.
        let sizes: Vec<usize> = step
            .values()
            .iter()
            .map(|e| e.rows("step").unwrap())
            .collect();
        assert_eq!(sizes, split_sizes(global.rows("global").unwrap(), 2));
        let parts: Vec<&Example> = step.values().iter().collect();
        let joined = Example::concat_rows(&parts).unwrap();
        assert_eq!(ids(&joined), ids(global));
        per_replica.push(step.values().iter().map(ids).collect::<Vec<_>>());
    }
    assert_eq!(
        per_replica,
        [
            [vec![0, 1], vec![2, 3]],
            [vec![4, 5], vec![6, 7]],
            [vec![8], vec![9]],
        ]
    );
}

#[test]
fn a_derived_struct_is_padded_with_a_mask() {
    let workers = InputWorkers::local(["/cpu:0", "/cpu:1"]).unwrap();
    let ds = Dataset::from_tensors(examples(5, false))
        .unwrap()
        .batch(4, false)
        .unwrap();
    let options = InputOptions {
        partial_batch: PartialBatch::PadWithMask,
        ..InputOptions::default()
    };
    let dist = DistributedDataset::new(ds, &workers, options).unwrap();
    let last = dist
        .iter_masked()
        .into_per_replica()
        .last()
        .unwrap()
        .unwrap();
    let [first, second] = last.values() else {
        panic!("two replicas")
    };
    assert_eq!(first.real_rows().unwrap(), 1);
    assert_eq!(first.batch.tokens[1].to_vec::<i64>().unwrap(), [400, 0]);
    assert_eq!(second.real_rows().unwrap(), 0);
    assert_eq!(second.batch.features.shape(), [2, 2]);
    assert!(second.batch.weight.is_none());
}

#[derive(Debug, Clone, Nest)]
struct Scaled {
    x: Tensor,
    scale: f32,
}

#[test]
fn a_leaf_that_is_not_a_tensor_is_named() {
    let data = Scaled {
        x: Tensor::from_vec("/cpu:0", &[2], vec![1i64, 2]).unwrap(),
        scale: 0.5,
    };
    let err = Dataset::from_tensors(data).unwrap_err();
    assert!(
        matches!(&err, InputError::NotATensor { path, found, .. } if path == ".scale" && *found == "f32"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "in-memory data: element .scale is a f32, not a tensor; every leaf of a dataset \
         element must be a Tensor"
    );
}

#[test]
fn blocks_of_different_structures_do_not_join() {
    // The second block has no weight, so a batch straddling both blocks cannot be formed.
    let source =
        GeneratorSource::new(|| [examples(3, true), examples(3, false)].into_iter().map(Ok));
    let ds = Dataset::from_source(source).batch(4, false).unwrap();
    let err = ds.iter().find_map(Result::err).expect("an error");
    assert!(matches!(err, InputError::Mismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("at .weight"), "{err}");
}
