//! Behaviour tests of the host all-reduce algorithms (COL-42..COL-56), named after their cases
//! in tf_behaviors.md.

use std::sync::Mutex;

use distribute_collectives::algorithms::{
    UnaryOp, flatten_tensors, hierarchical_copy_all_reduce, nccl_all_reduce,
    nccl_then_recursive_hd, nccl_then_ring, nccl_then_shuffle, padded_split, ragged_split,
    recursive_hd_all_reduce, reduce_non_singleton, ring_all_reduce, ring_gather, ring_permutations,
    shuffle_all_reduce, shuffle_then_ring, shuffle_then_shuffle, split_by_task, strip_padding,
};
use distribute_collectives::{CollectiveError, Tensor};
use distribute_values::ReduceOp;

fn f32s(device: &str, shape: &[usize], data: Vec<f32>) -> Tensor {
    Tensor::from_vec(device, shape, data).unwrap()
}

fn iota(device: &str, len: usize) -> Tensor {
    f32s(device, &[len], (0..len).map(|i| i as f32).collect())
}

fn device(worker: usize, gpu: usize) -> String {
    format!("/job:worker/replica:0/task:{worker}/device:GPU:{gpu}")
}

fn is_invalid(r: Result<impl std::fmt::Debug, CollectiveError>) -> bool {
    matches!(r, Err(CollectiveError::InvalidArgument(_)))
}

#[test]
fn col43_ring_permutations() {
    let iota = |n: usize| (0..n).collect::<Vec<_>>();
    #[allow(clippy::type_complexity)]
    let table: Vec<(usize, usize, Vec<usize>, Vec<Vec<usize>>, Vec<Vec<usize>>)> = vec![
        (1, 0, vec![], vec![], vec![]),
        (1, 1, vec![0], vec![vec![0]], vec![vec![0]]),
        (
            1,
            1,
            vec![0, 1, 2],
            vec![vec![2, 0, 1]],
            vec![vec![0, 1, 2]],
        ),
        (
            2,
            1,
            vec![0, 1, 2],
            vec![vec![5, 0, 1, 2, 3, 4]],
            vec![iota(6)],
        ),
        (
            3,
            1,
            vec![0, 1, 2],
            vec![vec![8, 0, 1, 2, 3, 4, 5, 6, 7]],
            vec![iota(9)],
        ),
        (
            2,
            1,
            vec![2, 1, 0],
            vec![vec![1, 2, 3, 4, 5, 0]],
            vec![vec![2, 1, 0, 5, 4, 3]],
        ),
        (
            1,
            2,
            vec![0, 1, 2, 3],
            vec![vec![3, 0, 1, 2], vec![3, 0, 1, 2]],
            vec![vec![0, 1, 2, 3], vec![2, 3, 0, 1]],
        ),
        (
            1,
            4,
            vec![0, 1, 2, 3],
            vec![vec![3, 0, 1, 2]; 4],
            vec![
                vec![0, 1, 2, 3],
                vec![3, 0, 1, 2],
                vec![2, 3, 0, 1],
                vec![1, 2, 3, 0],
            ],
        ),
        (
            2,
            2,
            vec![0, 1, 2, 3],
            vec![vec![7, 0, 1, 2, 3, 4, 5, 6], vec![3, 0, 5, 2, 7, 4, 1, 6]],
            vec![iota(8), vec![2, 3, 0, 1, 6, 7, 4, 5]],
        ),
        (
            2,
            2,
            vec![0, 3, 2, 1],
            vec![vec![5, 2, 3, 0, 1, 6, 7, 4], vec![1, 2, 7, 0, 5, 6, 3, 4]],
            vec![vec![0, 3, 2, 1, 4, 7, 6, 5], vec![2, 1, 0, 3, 6, 5, 4, 7]],
        ),
    ];
    for (workers, subchunks, perm, pred, rank) in table {
        let perms = ring_permutations(workers, subchunks, &perm).unwrap();
        let case = format!("workers {workers}, subchunks {subchunks}, gpu_perm {perm:?}");
        assert_eq!(perms.pred(), pred, "{case}");
        assert_eq!(perms.rank(), rank, "{case}");
    }
}

#[test]
fn col44_more_subchunks_than_gpus_is_refused() {
    assert!(is_invalid(ring_permutations(1, 3, &[0, 1])));
    let inputs = [iota("/gpu:0", 6), iota("/gpu:1", 6)];
    assert!(is_invalid(ring_all_reduce(
        &inputs,
        1,
        3,
        &[0, 1],
        ReduceOp::Sum,
        None
    )));
}

#[test]
fn col45_ring_gather_structure() {
    let one = iota("/gpu:0", 5);
    let perms = ring_permutations(1, 1, &[0]).unwrap();
    let gather = ring_gather(std::slice::from_ref(&one), 1, &perms, ReduceOp::Sum).unwrap();
    assert_eq!(gather.pad_len, 0);
    assert_eq!(gather.chunks_by_dev.len(), 1);
    assert!(
        gather.chunks_by_dev[0][0].shares_buffer_with(&one),
        "one device: input unchanged"
    );

    let inputs: Vec<Tensor> = (0..4)
        .map(|d| {
            f32s(
                &format!("/gpu:{d}"),
                &[16],
                (0..16).map(|i| (i * 10 + d) as f32).collect(),
            )
        })
        .collect();
    let perms = ring_permutations(1, 2, &[0, 1, 2, 3]).unwrap();
    let gather = ring_gather(&inputs, 2, &perms, ReduceOp::Sum).unwrap();
    assert_eq!(gather.pad_len, 0);
    assert_eq!(gather.chunks_by_dev.len(), 4);
    for (d, chunks) in gather.chunks_by_dev.iter().enumerate() {
        assert_eq!(chunks.len(), 8);
        assert!(chunks.iter().all(|c| c.shape() == [2]));
        // After the gather pass, device d holds the full sum of chunk (rank · subchunks + s).
        for s in 0..2 {
            let c = perms.rank()[s][d] * 2 + s;
            let full: Vec<f32> = (2 * c..2 * c + 2).map(|i| (i * 40 + 6) as f32).collect();
            assert_eq!(
                chunks[c].to_vec::<f32>().unwrap(),
                full,
                "device {d}, chunk {c}"
            );
        }
    }
}

#[test]
fn col45_ring_gather_refuses_permutations_that_do_not_fit() {
    let inputs: Vec<Tensor> = (0..4).map(|d| iota(&format!("/gpu:{d}"), 8)).collect();
    let cases = [
        (
            "3 devices for 4 inputs",
            ring_permutations(1, 1, &[0, 1, 2]),
            1,
        ),
        (
            "1 subchunk, 2 asked",
            ring_permutations(1, 1, &[0, 1, 2, 3]),
            2,
        ),
        ("no rings", ring_permutations(0, 1, &[0, 1, 2, 3]), 1),
    ];
    for (case, perms, subchunks) in cases {
        let result = ring_gather(&inputs, subchunks, &perms.unwrap(), ReduceOp::Sum);
        assert!(is_invalid(result), "{case}");
    }
}

/// An all-reduce under test: inputs and the unary op in, one output per input out.
type AllReduceFn<'a> = dyn Fn(&[Tensor], UnaryOp<'_>) -> Result<Vec<Tensor>, CollectiveError> + 'a;

/// COL-46's check over `workers × gpus` devices listed worker-major.
fn check_mean(
    case: &str,
    workers: usize,
    gpus: usize,
    shape: &[usize],
    all_reduce: &AllReduceFn<'_>,
) {
    let devices: Vec<String> = (0..workers * gpus)
        .map(|d| device(d / gpus, d % gpus))
        .collect();
    check_mean_on(case, &devices, shape, all_reduce);
}

/// COL-46's check: input d, on `devices[d]`, holds element i = i + 0.01·d, the unary op divides
/// by N, and every output must be the element-wise mean, with the input shape, on its input's
/// device: one output per input, in input order.
fn check_mean_on(case: &str, devices: &[String], shape: &[usize], all_reduce: &AllReduceFn<'_>) {
    let n = devices.len();
    let len: usize = shape.iter().product();
    let inputs: Vec<Tensor> = devices
        .iter()
        .enumerate()
        .map(|(d, device)| {
            let data = (0..len).map(|i| i as f32 + 0.01 * d as f32).collect();
            f32s(device, shape, data)
        })
        .collect();
    let divide = |t: &Tensor| t.divided_by(n);
    let outputs = all_reduce(&inputs, &divide).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(outputs.len(), n, "{case}");
    for (d, (out, input)) in outputs.iter().zip(&inputs).enumerate() {
        assert_eq!(out.shape(), shape, "{case}: output {d} shape");
        assert_eq!(out.device(), input.device(), "{case}: output {d} device");
        assert!(
            out.bitwise_eq(&outputs[0]),
            "{case}: output {d} differs from output 0; every device must end with the same bits"
        );
        for (i, &x) in out.to_vec::<f32>().unwrap().iter().enumerate() {
            let mean = i as f64 + 0.01 * (n as f64 - 1.0) / 2.0;
            assert!(
                (f64::from(x) - mean).abs() <= 1e-4 * mean.abs().max(1.0),
                "{case}: output {d} element {i} is {x}, the mean is {mean}"
            );
        }
    }
}

#[test]
fn col46_ring_all_reduce_is_the_mean() {
    let cases: [(usize, usize, &[usize], usize); 9] = [
        (1, 2, &[], 1),
        (1, 2, &[8], 1),
        (1, 2, &[4, 4], 1),
        (6, 1, &[8], 1),
        (1, 8, &[32], 1),
        (1, 8, &[120], 1),
        (2, 8, &[7, 13], 1),
        (2, 8, &[8, 8], 2),
        (2, 8, &[8, 8], 4),
    ];
    for (workers, gpus, shape, subdiv) in cases {
        let perm: Vec<usize> = (0..gpus).collect();
        check_mean(
            &format!("ring {workers}x{gpus} {shape:?} subdiv {subdiv}"),
            workers,
            gpus,
            shape,
            &|inputs, un_op| {
                ring_all_reduce(inputs, workers, subdiv, &perm, ReduceOp::Sum, Some(un_op))
            },
        );
    }
}

#[test]
fn col46_shuffle_all_reduce_is_the_mean() {
    let cases: [(usize, usize, &[usize], usize); 9] = [
        (1, 2, &[], 1),
        (1, 2, &[8], 1),
        (1, 2, &[4, 4], 1),
        (1, 8, &[32], 1),
        (1, 8, &[120], 1),
        (2, 8, &[7, 13], 3),
        (2, 8, &[8, 8], 2),
        (2, 8, &[8, 8], 4),
        (4, 8, &[8, 8, 2], 4),
    ];
    for (workers, gpus, shape, shards) in cases {
        let gather: Vec<String> = (0..shards)
            .map(|s| format!("/job:worker/replica:0/task:{}/device:CPU:0", s % workers))
            .collect();
        let gather: Vec<&str> = gather.iter().map(String::as_str).collect();
        check_mean(
            &format!("shuffle {workers}x{gpus} {shape:?} shards {shards}"),
            workers,
            gpus,
            shape,
            &|inputs, un_op| shuffle_all_reduce(inputs, &gather, ReduceOp::Sum, Some(un_op)),
        );
    }
}

#[test]
fn col46_recursive_hd_all_reduce_is_the_mean() {
    let cases: [(usize, usize, &[usize]); 6] = [
        (1, 2, &[8]),
        (1, 2, &[4, 4]),
        (1, 8, &[32]),
        (1, 8, &[120]),
        (2, 8, &[8, 8]),
        (4, 8, &[8, 8, 2]),
    ];
    for (workers, gpus, shape) in cases {
        check_mean(
            &format!("recursive hd {workers}x{gpus} {shape:?}"),
            workers,
            gpus,
            shape,
            &|inputs, un_op| recursive_hd_all_reduce(inputs, ReduceOp::Sum, Some(un_op)),
        );
    }
}

#[test]
fn col46_min_and_max_combine_too() {
    let inputs = [
        f32s("/gpu:0", &[3], vec![1.0, 5.0, -2.0]),
        f32s("/gpu:1", &[3], vec![4.0, 0.0, 3.0]),
    ];
    let max = ring_all_reduce(&inputs, 1, 1, &[0, 1], ReduceOp::Max, None).unwrap();
    let min = shuffle_all_reduce(&inputs, &["/cpu:0"], ReduceOp::Min, None).unwrap();
    for out in &max {
        assert_eq!(out.to_vec::<f32>().unwrap(), [4.0, 5.0, 3.0]);
    }
    for out in &min {
        assert_eq!(out.to_vec::<f32>().unwrap(), [1.0, 0.0, -2.0]);
    }
    assert!(is_invalid(ring_all_reduce(
        &inputs,
        1,
        1,
        &[0, 1],
        ReduceOp::Mean,
        None
    )));
}

#[test]
fn col47_flatten_tensors() {
    assert!(is_invalid(flatten_tensors(&[])));
    let a = f32s("/gpu:0", &[2, 3], (0..6).map(|i| i as f32).collect());
    let b = f32s("/gpu:1", &[3, 2], (0..6).map(|i| i as f32).collect());
    assert!(
        is_invalid(flatten_tensors(&[a.clone(), b])),
        "shapes that cannot be merged"
    );
    let (flat, shape) = flatten_tensors(&[a.clone(), a.to_device("/gpu:1")]).unwrap();
    assert_eq!(shape, [2, 3]);
    assert_eq!(flat[1].shape(), [6]);
    assert_eq!(flat[1].device(), "/gpu:1");
    assert_eq!(flat[0].to_vec::<f32>().unwrap(), a.to_vec::<f32>().unwrap());
}

#[test]
fn col48_ring_needs_two_inputs() {
    assert!(is_invalid(ring_all_reduce(
        &[iota("/gpu:0", 4)],
        1,
        1,
        &[0],
        ReduceOp::Sum,
        None
    )));
}

#[test]
fn col49_padded_split() {
    for (len, pieces, piece_len, pad) in [(8, 4, 2, 0), (10, 4, 3, 2), (3, 5, 1, 2), (5, 4, 2, 3)] {
        let split = padded_split(&iota("/gpu:0", len), pieces).unwrap();
        assert_eq!(split.pieces.len(), pieces, "{len} into {pieces}");
        assert!(
            split.pieces.iter().all(|p| p.shape() == [piece_len]),
            "{len} into {pieces}"
        );
        assert_eq!(split.pad_len, pad, "{len} into {pieces}");
        let joined: Vec<f32> = split
            .pieces
            .iter()
            .flat_map(|p| p.to_vec::<f32>().unwrap())
            .collect();
        let mut expected: Vec<f32> = (0..len).map(|i| i as f32).collect();
        expected.resize(len + pad, 0.0);
        assert_eq!(joined, expected, "{len} into {pieces}: data then zeros");
    }
    assert!(is_invalid(padded_split(
        &f32s("/gpu:0", &[2, 2], vec![0.0; 4]),
        2
    )));
}

#[test]
fn col50_strip_padding() {
    assert!(is_invalid(strip_padding(&[], 1)));
    assert!(is_invalid(strip_padding(
        &[f32s("/gpu:0", &[2, 2], vec![0.0; 4])],
        1
    )));
    assert!(is_invalid(strip_padding(&[iota("/gpu:0", 3)], 4)));
    let stripped = strip_padding(&[iota("/gpu:0", 5), iota("/gpu:1", 5)], 2).unwrap();
    for t in &stripped {
        assert_eq!(t.to_vec::<f32>().unwrap(), [0.0, 1.0, 2.0]);
    }
}

#[test]
fn col51_ragged_split() {
    for (len, pieces, lengths) in [(10, 4, vec![2, 2, 2, 4]), (8, 4, vec![2, 2, 2, 2])] {
        let split = ragged_split(&iota("/gpu:0", len), pieces).unwrap();
        let got: Vec<usize> = split.iter().map(Tensor::num_elements).collect();
        assert_eq!(got, lengths, "{len} into {pieces}");
    }
    // A shuffle of 91 elements over 3 gather shards reduces shards of 30, 30 and 31: observe the
    // shard lengths through the unary op, which runs once per reduced shard.
    let seen = Mutex::new(Vec::new());
    let record = |t: &Tensor| {
        seen.lock().unwrap().push(t.num_elements());
        Ok(t.clone())
    };
    let inputs = [iota("/gpu:0", 91), iota("/gpu:1", 91)];
    let out = shuffle_all_reduce(
        &inputs,
        &["/cpu:0", "/cpu:1", "/cpu:2"],
        ReduceOp::Sum,
        Some(&record),
    )
    .unwrap();
    assert_eq!(*seen.lock().unwrap(), [30, 30, 31]);
    assert_eq!(
        out[1].to_vec::<f32>().unwrap(),
        (0..91).map(|i| 2.0 * i as f32).collect::<Vec<_>>()
    );
}

#[test]
fn col52_recursive_hd_needs_a_power_of_two() {
    let inputs: Vec<Tensor> = (0..3).map(|d| iota(&format!("/gpu:{d}"), 6)).collect();
    assert!(is_invalid(recursive_hd_all_reduce(
        &inputs,
        ReduceOp::Sum,
        None
    )));
}

#[test]
fn col53_nccl_only_sums() {
    let inputs = [
        f32s(&device(0, 0), &[2], vec![1.0, 2.0]),
        f32s(&device(0, 1), &[2], vec![3.0, 4.0]),
    ];
    for op in [ReduceOp::Max, ReduceOp::Min, ReduceOp::Mean] {
        assert!(is_invalid(nccl_all_reduce(&inputs, op, None)), "{op:?}");
        assert!(is_invalid(nccl_then_ring(&inputs, 1, op, None)), "{op:?}");
    }
    for out in nccl_all_reduce(&inputs, ReduceOp::Sum, None).unwrap() {
        assert_eq!(out.to_vec::<f32>().unwrap(), [4.0, 6.0]);
    }
}

#[test]
fn col54_split_by_task_and_shuffle_hybrid_gather_count() {
    let devices = [
        "/task:1/device:GPU:0",
        "/job:localhost/replica:0/task:0/device:GPU:0",
        "/job:localhost/task:1/device:GPU:1",
        "/job:worker/task:0/device:GPU:0",
    ];
    let groups = split_by_task(&devices, &[10, 11, 12, 13]).unwrap();
    assert_eq!(
        groups.values,
        [vec![10, 12], vec![11], vec![13]],
        "job defaults to localhost"
    );
    assert_eq!(groups.devices[0], [devices[0], devices[2]]);
    assert!(is_invalid(split_by_task(&devices, &[1, 2])));
    assert!(matches!(
        split_by_task(&["/device:GPU:0"], &[1]),
        Err(CollectiveError::Invariant(_))
    ));

    let inputs: Vec<Tensor> = (0..4).map(|d| iota(&device(d / 2, d % 2), 4)).collect();
    assert!(is_invalid(shuffle_then_ring(
        &inputs,
        &["/cpu:0"],
        1,
        ReduceOp::Sum,
        None
    )));
    assert!(is_invalid(shuffle_then_shuffle(
        &inputs,
        &["/cpu:0"; 3],
        &["/cpu:0"],
        ReduceOp::Sum,
        None
    )));
}

#[test]
fn col55_reduce_non_singleton() {
    let one = [iota("/gpu:0", 3)];
    let unused = |_: &[Tensor]| -> Result<Vec<Tensor>, CollectiveError> {
        panic!("no reduction of one input")
    };
    let same = reduce_non_singleton(&one, unused, None).unwrap();
    assert!(
        same[0].shares_buffer_with(&one[0]),
        "1 input, no op: unchanged"
    );
    let halve = |t: &Tensor| t.divided_by(2);
    let halved = reduce_non_singleton(&one, unused, Some(&halve)).unwrap();
    assert_eq!(halved[0].to_vec::<f32>().unwrap(), [0.0, 0.5, 1.0]);
    let two = [iota("/gpu:0", 3), iota("/gpu:1", 3)];
    let reduced =
        reduce_non_singleton(&two, |x| nccl_all_reduce(x, ReduceOp::Sum, None), None).unwrap();
    assert_eq!(reduced[1].to_vec::<f32>().unwrap(), [0.0, 2.0, 4.0]);
}

#[test]
fn col56_hybrids_flatten_and_restore_the_shape() {
    let gathers = [
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:0",
    ];
    let four = ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"];
    type Hybrid<'a> = Box<AllReduceFn<'a>>;
    let cases: Vec<(&str, usize, Hybrid<'_>)> = vec![
        (
            "nccl then ring",
            2,
            Box::new(|x, u| nccl_then_ring(x, 1, ReduceOp::Sum, Some(u))),
        ),
        (
            "nccl then ring, 1 worker",
            1,
            Box::new(|x, u| nccl_then_ring(x, 1, ReduceOp::Sum, Some(u))),
        ),
        (
            "nccl then recursive hd",
            2,
            Box::new(|x, u| nccl_then_recursive_hd(x, ReduceOp::Sum, Some(u))),
        ),
        (
            "nccl then shuffle",
            2,
            Box::new(|x, u| nccl_then_shuffle(x, &four, ReduceOp::Sum, Some(u))),
        ),
        (
            "shuffle then ring",
            2,
            Box::new(|x, u| shuffle_then_ring(x, &gathers, 1, ReduceOp::Sum, Some(u))),
        ),
        (
            "shuffle then shuffle",
            2,
            Box::new(|x, u| shuffle_then_shuffle(x, &gathers, &four, ReduceOp::Sum, Some(u))),
        ),
    ];
    for (name, workers, hybrid) in &cases {
        check_mean(name, *workers, 4, &[4, 5], hybrid.as_ref());
    }
}

#[test]
fn col56_hybrids_answer_in_input_order_for_devices_interleaved_by_task() {
    // [t0/g0, t1/g0, t0/g1, t1/g1]: task order would put both task-0 results first.
    let interleaved: Vec<String> = (0..4).map(|d| device(d % 2, d / 2)).collect();
    let gathers = [
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:0",
    ];
    let four = ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"];
    type Hybrid<'a> = Box<AllReduceFn<'a>>;
    let cases: Vec<(&str, Hybrid<'_>)> = vec![
        (
            "nccl then ring",
            Box::new(|x, u| nccl_then_ring(x, 1, ReduceOp::Sum, Some(u))),
        ),
        (
            "nccl then recursive hd",
            Box::new(|x, u| nccl_then_recursive_hd(x, ReduceOp::Sum, Some(u))),
        ),
        (
            "nccl then shuffle",
            Box::new(|x, u| nccl_then_shuffle(x, &four, ReduceOp::Sum, Some(u))),
        ),
        (
            "shuffle then ring",
            Box::new(|x, u| shuffle_then_ring(x, &gathers, 1, ReduceOp::Sum, Some(u))),
        ),
        (
            "shuffle then shuffle",
            Box::new(|x, u| shuffle_then_shuffle(x, &gathers, &four, ReduceOp::Sum, Some(u))),
        ),
    ];
    for (name, hybrid) in &cases {
        check_mean_on(name, &interleaved, &[4, 5], hybrid.as_ref());
    }
    let groups = split_by_task(&interleaved, &[10, 11, 12, 13]).unwrap();
    assert_eq!(groups.values, [[10, 12], [11, 13]]);
    assert_eq!(groups.indices, [[0, 2], [1, 3]]);
}

#[test]
fn col42_hierarchical_copy_gives_every_device_the_full_sum() {
    let devices: Vec<String> = (0..8).map(|d| format!("/gpu:{d}")).collect();
    let grads: Vec<Vec<Tensor>> = (0..8)
        .map(|d| {
            (0..10)
                .map(|i| {
                    f32s(
                        &devices[d],
                        &[2],
                        vec![(d * 100 + i) as f32, (d as f32).powi(2)],
                    )
                })
                .collect()
        })
        .collect();
    let out = hierarchical_copy_all_reduce(&devices, &grads).unwrap();
    for (d, tensors) in out.iter().enumerate() {
        for (i, t) in tensors.iter().enumerate() {
            assert_eq!(t.device(), devices[d]);
            let sum0: f32 = (0..8).map(|k| (k * 100 + i) as f32).sum();
            assert_eq!(
                t.to_vec::<f32>().unwrap(),
                [sum0, 140.0],
                "device {d}, tensor {i}"
            );
        }
    }
    assert!(is_invalid(hierarchical_copy_all_reduce(
        &devices[..3],
        &grads[..3]
    )));
    assert!(is_invalid(hierarchical_copy_all_reduce(
        &devices[..2],
        &grads[..1]
    )));
}
