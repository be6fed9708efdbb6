//! Tensors inside distributed values: regrouping by identity and tensor-valued variables.

use std::sync::Arc;

use distribute_tensor::Tensor;
use distribute_values::{Leaf, ReplicaDeviceMap, VariableValue, regroup, select_replica};

fn map() -> Arc<ReplicaDeviceMap> {
    Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1"]).unwrap())
}

#[test]
fn the_same_tensor_collapses_equal_values_do_not() {
    let shared = Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0]).unwrap();
    let same: Leaf<Tensor> = regroup(&map(), vec![shared.clone(), shared.clone()]).unwrap();
    assert!(matches!(&same, Leaf::Same(t) if t.shares_buffer_with(&shared)));

    let copy = Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0]).unwrap();
    let per_replica: Leaf<Tensor> = regroup(&map(), vec![shared.clone(), copy.clone()]).unwrap();
    assert!(
        matches!(per_replica, Leaf::PerReplica(_)),
        "equal values on two buffers stay per replica"
    );
    assert_eq!(select_replica::<Tensor>(1, &per_replica).unwrap(), copy);

    // Nested: (loss, step) with a shared step.
    let grouped = regroup(&map(), vec![(shared.clone(), 3), (copy, 3)]).unwrap();
    assert_eq!(grouped.1, Leaf::Same(3));
}

#[test]
fn tensors_do_variable_arithmetic() {
    let a = Tensor::from_vec("/cpu:0", &[3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let b = Tensor::from_vec("/cpu:0", &[3], vec![0.5f32, 0.5, 0.5]).unwrap();
    assert_eq!(
        a.try_add(&b).unwrap().to_vec::<f32>().unwrap(),
        [1.5, 2.5, 3.5]
    );
    assert_eq!(
        a.try_sub(&b).unwrap().to_vec::<f32>().unwrap(),
        [0.5, 1.5, 2.5]
    );
    assert_eq!(
        a.divide_by_count(2).unwrap().to_vec::<f32>().unwrap(),
        [0.5, 1.0, 1.5]
    );
    assert!(a.is_floating());
    assert!(
        Tensor::zeros("/cpu:0", distribute_tensor::DType::F32, &[3])
            .unwrap()
            .is_zero()
    );
    let ints = Tensor::from_vec("/cpu:0", &[2], vec![7i64, -7]).unwrap();
    assert_eq!(
        ints.divide_by_count(2).unwrap().to_vec::<i64>().unwrap(),
        [3, -3]
    );
    assert!(!ints.is_floating());
    let wrong = Tensor::from_vec("/cpu:0", &[2], vec![1.0f32, 2.0]).unwrap();
    assert!(
        a.try_add(&wrong)
            .unwrap_err()
            .to_string()
            .contains("shapes must match")
    );
    assert!(a.try_sub(&wrong).is_err());
}

#[test]
fn a_shape_whose_size_overflows_is_an_error_not_a_panic() {
    let err = Tensor::from_vec("/cpu:0", &[usize::MAX, 2], vec![1.0f32]).unwrap_err();
    assert!(
        err.to_string().contains("more than usize::MAX elements"),
        "{err}"
    );
    let err = Tensor::from_vec("/cpu:0", &[3], vec![1.0f32]).unwrap_err();
    assert!(
        err.to_string()
            .contains("1 elements cannot fill a tensor of shape [3] (3 elements)"),
        "{err}"
    );
}

#[test]
fn a_transposed_view_is_not_the_same_tensor() {
    let square = Tensor::from_vec("/cpu:0", &[2, 2], vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let array = square.array::<f32>().unwrap().clone().reversed_axes();
    let transposed = Tensor::from_shared("/cpu:0", array);
    assert!(!square.shares_buffer_with(&transposed));
    // So regrouping keeps them apart instead of collapsing different values into one.
    let grouped: Leaf<Tensor> = regroup(&map(), vec![square.clone(), transposed]).unwrap();
    assert!(matches!(grouped, Leaf::PerReplica(_)));
}

#[test]
fn sparse_duplicates_add_like_the_reduction_kernel() {
    use distribute_tensor::IndexedSlices;
    // Integers wrap instead of panicking on overflow.
    let values = Tensor::from_vec("/cpu:0", &[2, 1], vec![i32::MAX, 1]).unwrap();
    let slices = IndexedSlices::new(values, vec![0, 0], vec![1, 1]).unwrap();
    assert_eq!(
        slices.to_dense().unwrap().to_vec::<i32>().unwrap(),
        [i32::MIN]
    );
    // f16 duplicates accumulate in f32 and round once: 2048 + 1 + 1 = 2050, not 2048.
    let halves = [2048.0f32, 1.0, 1.0].map(half::f16::from_f32).to_vec();
    let values = Tensor::from_vec("/cpu:0", &[3, 1], halves).unwrap();
    let slices = IndexedSlices::new(values, vec![0, 0, 0], vec![1, 1]).unwrap();
    assert_eq!(
        slices.to_dense().unwrap().to_vec::<half::f16>().unwrap(),
        [half::f16::from_f32(2050.0)]
    );
}

#[test]
fn variable_aggregation_rounds_like_the_all_reduce() {
    use distribute_values::{SyncOnReadVariable, UpdateOp, VariableAggregation};
    // f16 2048 + 1 + 1: the all-reduce accumulates in f32 and gives 2050; a pairwise f16 fold
    // would give 2048.
    let devices = Arc::new(ReplicaDeviceMap::new(["/cpu:0", "/cpu:1", "/cpu:2"]).unwrap());
    let half = |x: f32| Tensor::from_vec("/cpu:0", &[1], vec![half::f16::from_f32(x)]).unwrap();
    for (aggregation, expected) in [
        (VariableAggregation::Sum, 2050.0),
        (VariableAggregation::Mean, 2050.0 / 3.0),
    ] {
        let v = SyncOnReadVariable::new("h", Arc::clone(&devices), half(0.0), aggregation).unwrap();
        for (r, x) in [2048.0, 1.0, 1.0].into_iter().enumerate() {
            v.update_local(r, UpdateOp::Assign, &half(x)).unwrap();
        }
        let read = v
            .read_cross_replica()
            .unwrap()
            .to_vec::<half::f16>()
            .unwrap();
        assert_eq!(read, [half::f16::from_f32(expected)], "{aggregation:?}");
    }
}
