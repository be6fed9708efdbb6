//! Behaviour tests of packing, aggregation and the all-reduce spec (COL-19..COL-25, COL-33,
//! COL-34, COL-36, COL-39, COL-40), named after their cases in tf_behaviors.md.

use std::num::NonZeroUsize;

use distribute_collectives::{
    AllReduceSpec, AnyTensor, CollectiveError, ConcatAndSplitPacker, DType, FusionPlan,
    IndexedSlices, NumPacks, SpecLimit, Tensor, aggregate_single_gradient_using_copy,
    aggregate_tensors_or_indexed_slices, assign_grads_to_specs, contains_indexed_slices,
    divide_by_n, group_by_size, is_indexed_slices, pack_small_tensors, pack_split_sizes,
    pack_tensors, split_by_sparsity, split_grads_by_size, stitch_values, unpack_small_tensors,
    unpack_tensors,
};

fn f32s(shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::from_vec("/cpu:0", shape, data).unwrap()
}

fn ramp(device: &str, shape: &[usize], start: f32) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(device, shape, (0..n).map(|i| start + i as f32).collect()).unwrap()
}

fn sparse(values: Vec<f32>, indices: Vec<usize>) -> IndexedSlices {
    let rows = indices.len();
    IndexedSlices::new(f32s(&[rows, 2], values), indices, vec![5, 2]).unwrap()
}

fn is_invalid<T: std::fmt::Debug>(r: Result<T, CollectiveError>) -> bool {
    matches!(r, Err(CollectiveError::InvalidArgument(_)))
}

#[test]
fn col19_split_by_sparsity_and_stitch() {
    let a = AnyTensor::from(f32s(&[1], vec![1.0]));
    let b = AnyTensor::from(sparse(vec![1.0, 2.0], vec![1]));
    let c = AnyTensor::from(f32s(&[1], vec![3.0]));
    let batch = vec![vec![a.clone()], vec![b.clone()], vec![c.clone()]];
    let split = split_by_sparsity(&batch);
    assert_eq!(split.dense, [vec![a.clone()], vec![c.clone()]]);
    assert_eq!(split.dense_positions, [0, 2]);
    assert_eq!(split.sparse, [vec![b.clone()]]);
    assert_eq!(split.sparse_positions, [1]);
    let stitched = stitch_values(vec![
        (split.dense, split.dense_positions),
        (split.sparse, split.sparse_positions),
    ])
    .unwrap();
    assert_eq!(stitched, batch);
    assert!(matches!(
        stitch_values(vec![(vec![1, 2], vec![0, 0])]),
        Err(CollectiveError::Invariant(_))
    ));
    assert!(matches!(
        stitch_values(vec![(vec![1], vec![3])]),
        Err(CollectiveError::Invariant(_))
    ));
}

#[test]
fn col20_sparsity_checks() {
    let dense = AnyTensor::from(f32s(&[2], vec![1.0, 2.0]));
    let slices = AnyTensor::from(sparse(vec![1.0, 2.0], vec![1]));
    assert!(is_indexed_slices(std::slice::from_ref(&slices)));
    assert!(
        is_indexed_slices(&[slices.clone(), slices.clone()]),
        "all components sparse"
    );
    assert!(
        !is_indexed_slices(&[slices.clone(), dense.clone()]),
        "a mix"
    );
    assert!(contains_indexed_slices(&[dense.clone(), slices.clone()]));
    assert!(!contains_indexed_slices(&[dense]));
    assert!(!contains_indexed_slices(&[]));
}

#[test]
fn col22_concat_and_split_packer() {
    assert!(is_invalid(ConcatAndSplitPacker::new(0)));
    assert!(is_invalid(ConcatAndSplitPacker::new(-1)));
    let n = |k| NonZeroUsize::new(k).unwrap();
    assert_eq!(pack_split_sizes(10, n(3)), [3, 3, 4]);
    assert_eq!(pack_split_sizes(2, n(3)), [0, 0, 2]);
    assert_eq!(pack_split_sizes(9, n(1)), [9]);

    // Two devices of tensors with 2·3 + 4 = 10 elements, cut into 3 packs.
    let device_grads: Vec<Vec<Tensor>> = (0..2)
        .map(|d| {
            let dev = format!("/gpu:{d}");
            vec![
                ramp(&dev, &[2, 3], 10.0 * d as f32),
                ramp(&dev, &[4], 100.0 + d as f32),
            ]
        })
        .collect();
    let packer = ConcatAndSplitPacker::new(3).unwrap();
    let (packs, record) = packer.pack(&device_grads).unwrap();
    for (d, device_packs) in packs.iter().enumerate() {
        let lens: Vec<usize> = device_packs.iter().map(Tensor::num_elements).collect();
        assert_eq!(lens, [3, 3, 4]);
        assert!(
            device_packs
                .iter()
                .all(|p| p.device() == format!("/gpu:{d}"))
        );
    }
    // Reduce pack k across devices, unpack: the per-tensor sums, in order and shape.
    let summed: Vec<Tensor> = (0..3)
        .map(|k| {
            let parts = [packs[0][k].clone().into(), packs[1][k].clone().into()];
            aggregate_tensors_or_indexed_slices(&parts)
                .unwrap()
                .to_dense()
                .unwrap()
        })
        .collect();
    let unpacked = record.unpack(&[summed.clone(), summed]).unwrap();
    for (i, t) in unpacked[1].iter().enumerate() {
        let parts = [
            device_grads[0][i].clone().into(),
            device_grads[1][i].clone().into(),
        ];
        let expected = aggregate_tensors_or_indexed_slices(&parts)
            .unwrap()
            .to_dense()
            .unwrap();
        assert_eq!(t.shape(), device_grads[0][i].shape());
        assert!(t.bitwise_eq(&expected), "tensor {i}");
    }
}

#[test]
fn col23_num_packs_rules() {
    assert!(is_invalid(NumPacks::new(-1)));
    assert!(
        NumPacks::new(0).unwrap().packer().is_none(),
        "0 means no packing"
    );
    assert_eq!(NumPacks::new(1).unwrap().packer().unwrap().num_packs(), 1);
    assert_eq!(NumPacks::new(8).unwrap().get(), 8);
    let grads = vec![vec![ramp("/gpu:0", &[3], 0.0), ramp("/gpu:0", &[2], 5.0)]];
    let (same, record) = pack_tensors(&grads, NumPacks::new(0).unwrap()).unwrap();
    assert!(record.is_none());
    assert_eq!(same, grads);
    assert_eq!(unpack_tensors(&same, None).unwrap(), grads);
    let (packed, record) = pack_tensors(&grads, NumPacks::new(1).unwrap()).unwrap();
    assert_eq!(packed[0].len(), 1);
    assert_eq!(unpack_tensors(&packed, record.as_ref()).unwrap(), grads);
}

#[test]
fn col24_all_reduce_spec_normalisation() {
    let spec = |alg: &str, shards, limit| AllReduceSpec {
        alg: alg.into(),
        shards,
        limit,
    };
    let ok = [
        ("\"nccl\"", vec![spec("nccl", 1, SpecLimit::All)]),
        ("nccl", vec![spec("nccl", 1, SpecLimit::All)]),
        (
            "(\"pscpu/pscpu\", 2)",
            vec![spec("pscpu/pscpu", 2, SpecLimit::All)],
        ),
        ("('xring',)", vec![spec("xring", 1, SpecLimit::All)]),
        (
            "[(\"pscpu/pscpu\", 2, 100), (\"xring\", 2, -1)]",
            vec![
                spec("pscpu/pscpu", 2, SpecLimit::AtMost(100)),
                spec("xring", 2, SpecLimit::All),
            ],
        ),
    ];
    for (text, expected) in ok {
        assert_eq!(AllReduceSpec::parse(text).unwrap(), expected, "{text}");
    }
    for bad in [
        "()",
        "(\"nccl\", 1, -1, 4)",
        "[\"nccl\"]",
        "[(\"nccl\", 1), \"xring\"]",
        "[]",
        "(\"nccl\", 0)",
        "(\"nccl\", 1, -2)",
        "(\"nccl\"",
        "3",
        "(2, 1)",
    ] {
        assert!(is_invalid(AllReduceSpec::parse(bad)), "{bad}");
    }
}

#[test]
fn col25_split_grads_by_size_and_spec_dispatch() {
    let g2 = ramp("/gpu:0", &[2], 0.0);
    let g8 = ramp("/gpu:0", &[8], 0.0);
    let (small, large) = split_grads_by_size(4, &[vec![g2.clone()], vec![g8.clone()]]);
    assert_eq!(
        small,
        [vec![g2.clone()]],
        "the device with no small grads is left out"
    );
    assert_eq!(large, [vec![g8.clone()]]);

    let grads = vec![vec![g2.clone(), g8.clone()], vec![g2.clone(), g8.clone()]];
    let specs = AllReduceSpec::parse("[(\"pscpu\", 1, 4), (\"xring\", 2, -1)]").unwrap();
    let assigned = assign_grads_to_specs(&specs, &grads).unwrap();
    assert_eq!(assigned[0], [vec![g2.clone()], vec![g2.clone()]]);
    assert_eq!(assigned[1], [vec![g8.clone()], vec![g8.clone()]]);
    let limited_only = AllReduceSpec::parse("[(\"pscpu\", 1, 4)]").unwrap();
    assert!(matches!(
        assign_grads_to_specs(&limited_only, &grads),
        Err(CollectiveError::Invariant(_))
    ));
    // Devices whose gradients differ in size would each send a different gradient to the same
    // algorithm: refused up front rather than misaligned.
    for misaligned in [
        vec![vec![g2.clone(), g8.clone()], vec![g8.clone(), g2.clone()]],
        vec![vec![g2.clone(), g8.clone()], vec![g2.clone()]],
    ] {
        let err = assign_grads_to_specs(&specs, &misaligned).unwrap_err();
        assert!(
            matches!(&err, CollectiveError::InvalidArgument(m) if m.contains("device 1")),
            "{err}"
        );
    }
}

#[test]
fn col33_dense_and_sparse_aggregation() {
    let a = f32s(&[3, 2], vec![1., 2., 0., 0., 3., 4.]);
    let b = f32s(&[3, 2], vec![0., 0., 5., 6., 7., 8.]);
    let expected = [1., 2., 5., 6., 10., 12.];
    let sum = aggregate_tensors_or_indexed_slices(&[a.clone().into(), b.clone().into()]).unwrap();
    assert_eq!(sum.to_dense().unwrap().to_vec::<f32>().unwrap(), expected);
    let as_slices = |t: &Tensor| {
        AnyTensor::from(IndexedSlices::new(t.clone(), vec![0, 1, 2], vec![3, 2]).unwrap())
    };
    let sparse_sum = aggregate_tensors_or_indexed_slices(&[as_slices(&a), as_slices(&b)]).unwrap();
    assert!(sparse_sum.is_sparse());
    assert_eq!(
        sparse_sum.to_dense().unwrap().to_vec::<f32>().unwrap(),
        expected
    );
    let mixed = aggregate_tensors_or_indexed_slices(&[as_slices(&a), b.into()]).unwrap();
    assert!(!mixed.is_sparse());
    assert_eq!(mixed.to_dense().unwrap().to_vec::<f32>().unwrap(), expected);
}

#[test]
fn col34_divide_by_n_keeps_the_kind() {
    let a = f32s(&[3, 2], vec![1., 2., 0., 0., 3., 4.]);
    let expected = [0.5, 1., 0., 0., 1.5, 2.];
    let dense = divide_by_n(&a.clone().into(), 2).unwrap();
    assert_eq!(dense.to_dense().unwrap().to_vec::<f32>().unwrap(), expected);
    let slices = IndexedSlices::new(a, vec![0, 1, 2], vec![3, 2]).unwrap();
    let halved = divide_by_n(&slices.into(), 2).unwrap();
    assert!(halved.is_sparse());
    assert_eq!(
        halved.to_dense().unwrap().to_vec::<f32>().unwrap(),
        expected
    );
}

#[test]
// A single pack is a one-element list of index ranges, not a mistaken range of indices.
#[allow(clippy::single_range_in_vec_init)]
fn col36_group_by_size() {
    let values = [
        Tensor::zeros("/cpu:0", DType::F32, &[2, 4, 4]),
        Tensor::zeros("/cpu:0", DType::I32, &[8]),
        Tensor::zeros("/cpu:0", DType::I64, &[10, 10]),
        Tensor::zeros("/cpu:0", DType::I32, &[1]),
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
            let parts: Vec<AnyTensor> = per_replica.iter().map(|r| r[i].clone().into()).collect();
            aggregate_tensors_or_indexed_slices(&parts)
                .unwrap()
                .to_dense()
                .unwrap()
        })
        .collect();
    for bytes_per_pack in [0, 1, 16, 64, 100, 1 << 20] {
        let plan = FusionPlan::new(&per_replica[0], bytes_per_pack);
        let packed: Vec<Vec<Tensor>> = per_replica.iter().map(|r| plan.pack(r).unwrap()).collect();
        let reduced: Vec<Tensor> = (0..plan.num_buckets())
            .map(|b| {
                let parts: Vec<AnyTensor> = packed.iter().map(|p| p[b].clone().into()).collect();
                aggregate_tensors_or_indexed_slices(&parts)
                    .unwrap()
                    .to_dense()
                    .unwrap()
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
    assert!(is_invalid(
        FusionPlan::new(&per_replica[0], 64).pack(&wrong)
    ));
}

#[test]
fn col39_pack_small_tensors() {
    let device_grads: Vec<Vec<Tensor>> = (0..2)
        .map(|d| {
            let dev = format!("/gpu:{d}");
            vec![
                ramp(&dev, &[1], 1.0 + d as f32),
                ramp(&dev, &[1], 2.0),
                ramp(&dev, &[10, 10], 0.0),
                ramp(&dev, &[1], 4.0),
            ]
        })
        .collect();
    let (packed, record) = pack_small_tensors(&device_grads, 8, 0).unwrap();
    let record = record.expect("g0 and g1 form a run");
    for (d, list) in packed.iter().enumerate() {
        assert_eq!(list.len(), 3);
        assert_eq!(
            list[0].to_vec::<f32>().unwrap(),
            [1.0 + d as f32, 2.0],
            "pack(g0, g1) first"
        );
        assert!(list[1].shares_buffer_with(&device_grads[d][2]));
        assert!(
            list[2].shares_buffer_with(&device_grads[d][3]),
            "a lone candidate stays"
        );
    }
    assert_eq!(record.unpack(&packed).unwrap(), device_grads);

    // Candidates are chosen once, so every device must match device 0 tensor by tensor.
    let mut other_shape = device_grads.clone();
    other_shape[1][1] = ramp("/gpu:1", &[3], 2.0);
    let mut other_dtype = device_grads.clone();
    other_dtype[1][0] = Tensor::from_vec("/gpu:1", &[1], vec![1.0f64]).unwrap();
    let mut too_big = device_grads.clone();
    too_big[1][3] = ramp("/gpu:1", &[10, 10], 0.0);
    for (case, grads) in [
        ("shape", other_shape),
        ("dtype", other_dtype),
        ("a candidate only on device 0", too_big),
    ] {
        let err = pack_small_tensors(&grads, 8, 0).unwrap_err();
        assert!(
            matches!(&err, CollectiveError::InvalidArgument(m) if m.contains("device 1's tensor")),
            "{case}: {err}"
        );
    }
    let mut short = device_grads.clone();
    short[1].pop();
    assert!(matches!(
        pack_small_tensors(&short, 8, 0),
        Err(CollectiveError::Invariant(_))
    ));

    // Only float32 counts, and nothing to pack gives no record and an identity unpack.
    let ints = vec![vec![
        Tensor::from_vec("/gpu:0", &[1], vec![1i32]).unwrap(),
        Tensor::from_vec("/gpu:0", &[1], vec![2i32]).unwrap(),
    ]];
    let (same, none) = pack_small_tensors(&ints, 8, 0).unwrap();
    assert!(none.is_none());
    assert_eq!(unpack_small_tensors(&same, None).unwrap(), ints);
    // max_group bounds the run: with limit 0 runs hold at most 2 tensors.
    let five = vec![
        (0..5)
            .map(|i| ramp("/gpu:0", &[1], i as f32))
            .collect::<Vec<_>>(),
    ];
    let (packed, record) = pack_small_tensors(&five, 4, 0).unwrap();
    let lens: Vec<usize> = packed[0].iter().map(Tensor::num_elements).collect();
    assert_eq!(lens, [2, 2, 1]);
    assert_eq!(
        unpack_small_tensors(&packed, record.as_ref()).unwrap(),
        five
    );
}

#[test]
fn col40_aggregate_single_gradient_using_copy() {
    let g1 = ramp("/gpu:0", &[2], 1.0);
    let g2 = ramp("/gpu:1", &[2], 3.0);
    let mean = aggregate_single_gradient_using_copy(
        &[(g1.clone(), "v0"), (g2.clone(), "v1")],
        true,
        false,
    )
    .unwrap();
    assert_eq!(mean.grad.to_vec::<f32>().unwrap(), [2.0, 3.0]);
    assert_eq!(mean.var, "v0", "the variable of the first pair");
    assert_eq!(mean.has_inf_or_nan, None);
    let single = aggregate_single_gradient_using_copy(&[(g2.clone(), ())], true, true).unwrap();
    assert!(
        single.grad.bitwise_eq(&g2),
        "one grad with MEAN is unchanged"
    );
    assert_eq!(single.has_inf_or_nan, Some(false));
    let bad = f32s(&[2], vec![1.0, f32::INFINITY]);
    let flagged =
        aggregate_single_gradient_using_copy(&[(g1, ()), (bad, ())], false, true).unwrap();
    assert_eq!(flagged.has_inf_or_nan, Some(true));
    let nan = f32s(&[2], vec![f32::NAN, 0.0]);
    assert_eq!(
        aggregate_single_gradient_using_copy(&[(nan, ())], false, true)
            .unwrap()
            .has_inf_or_nan,
        Some(true)
    );
}
