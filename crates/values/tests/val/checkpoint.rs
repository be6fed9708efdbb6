//! VAL-38..VAL-40: checkpoints save the logical value and restore it across replica counts.

use distribute_values::{MirroredVariable, SavedValue, SyncOnReadVariable, VariableAggregation};
use proptest::prelude::*;

use crate::cpus;

fn set<T: distribute_values::VariableValue>(v: &SyncOnReadVariable<T>, values: &[T]) {
    for (i, x) in values.iter().enumerate() {
        v.component(i).unwrap().assign(x.clone());
    }
}

/// Serialises like a checkpoint writer would and reads it back.
fn through_json(saved: &SavedValue<f64>) -> SavedValue<f64> {
    serde_json::from_str(&serde_json::to_string(saved).unwrap()).unwrap()
}

#[test]
fn val_38_mirrored_save_and_restore() {
    let v = MirroredVariable::new("v", cpus(2), 0.0, VariableAggregation::None).unwrap();
    v.component(0).unwrap().assign(3.0);
    v.component(1).unwrap().assign(4.0);
    let saved = through_json(&v.save());
    assert_eq!(saved.value(), &3.0);
    v.component(0).unwrap().assign(5.0);
    v.component(1).unwrap().assign(6.0);
    v.restore(&saved).unwrap();
    assert_eq!(v.values(), [3.0, 3.0]);
    // Into a plain variable, and from a plain value.
    assert_eq!(serde_json::to_string(&saved).unwrap(), "3.0");
    let plain: SavedValue<f64> = serde_json::from_str("3.0").unwrap();
    v.component(0).unwrap().assign(9.0);
    v.restore(&plain).unwrap();
    assert_eq!(v.values(), [3.0, 3.0]);
}

#[test]
fn val_39_sum_save_and_restore() {
    let v = SyncOnReadVariable::new("v", cpus(2), 0.0, VariableAggregation::Sum).unwrap();
    set(&v, &[3.0, 4.0]);
    let saved = through_json(&v.save().unwrap());
    assert_eq!(saved.value(), &7.0);
    set(&v, &[5.0, 6.0]);
    v.restore(&saved).unwrap();
    assert_eq!(v.values(), [3.5, 3.5]);

    set(&v, &[1.5, 2.0]);
    let saved = v.save().unwrap();
    assert_eq!(saved.value(), &3.5);
    let other = SyncOnReadVariable::new("w", cpus(2), 0.0, VariableAggregation::Sum).unwrap();
    other.restore(&saved).unwrap();
    assert_eq!(other.values(), [1.75, 1.75]);
    assert_eq!(saved.clone().into_value(), 3.5); // into a plain variable
    other.restore(&SavedValue::new(3.5)).unwrap(); // from a plain variable
    assert_eq!(other.values(), [1.75, 1.75]);
}

#[test]
fn val_40_mean_save_and_restore() {
    let v = SyncOnReadVariable::new("v", cpus(2), 0.0, VariableAggregation::Mean).unwrap();
    set(&v, &[3.0, 4.0]);
    let saved = through_json(&v.save().unwrap());
    assert_eq!(saved.value(), &3.5);
    v.restore(&saved).unwrap();
    assert_eq!(v.values(), [3.5, 3.5]);
    v.restore(&SavedValue::new(3.5)).unwrap();
    assert_eq!(v.values(), [3.5, 3.5]);
}

#[test]
fn sync_on_read_without_aggregation_has_nothing_to_save() {
    let v = SyncOnReadVariable::new("v", cpus(2), 0.0, VariableAggregation::None).unwrap();
    assert!(v.save().is_err());
}

/// A checkpoint written with N replicas restores with M, N ≠ M, both ways, for every kind of
/// variable: the logical value survives.
#[test]
fn checkpoints_restore_across_replica_counts() {
    let counts = [1, 2, 3, 4, 8];
    for &n in &counts {
        for &m in &counts {
            let components: Vec<f64> = (0..n).map(|i| 1.0 + i as f64).collect();
            let case = format!("{n} -> {m} replicas");

            let mirrored =
                MirroredVariable::new("w", cpus(n), 2.5, VariableAggregation::Mean).unwrap();
            let saved = through_json(&mirrored.save());
            let restored =
                MirroredVariable::new("w", cpus(m), 0.0, VariableAggregation::Mean).unwrap();
            restored.restore(&saved).unwrap();
            assert_eq!(restored.values(), vec![2.5; m], "mirrored {case}");

            for aggregation in [
                VariableAggregation::Sum,
                VariableAggregation::Mean,
                VariableAggregation::OnlyFirstReplica,
            ] {
                let source = SyncOnReadVariable::new("s", cpus(n), 0.0, aggregation).unwrap();
                set(&source, &components);
                let logical = source.read_cross_replica().unwrap();
                let saved = through_json(&source.save().unwrap());
                assert_eq!(saved.value(), &logical, "{aggregation} {case}");
                let target = SyncOnReadVariable::new("s", cpus(m), 0.0, aggregation).unwrap();
                target.restore(&saved).unwrap();
                let back = target.read_cross_replica().unwrap();
                assert!(
                    (back - logical).abs() < 1e-12,
                    "{aggregation} {case}: {back} vs {logical}"
                );
                let share = if aggregation == VariableAggregation::Sum {
                    logical / m as f64
                } else {
                    logical
                };
                assert_eq!(target.values(), vec![share; m], "{aggregation} {case}");
            }
        }
    }
}

proptest! {
    /// Random components, replica counts 1..=8 on both sides: the cross-replica read after
    /// save and restore equals the one before.
    #[test]
    fn sync_on_read_logical_value_survives_any_replica_count(
        components in proptest::collection::vec(-1e6f64..1e6, 1..=8),
        target_replicas in 1usize..=8,
        aggregation in prop_oneof![
            Just(VariableAggregation::Sum),
            Just(VariableAggregation::Mean),
            Just(VariableAggregation::OnlyFirstReplica),
        ],
    ) {
        let source = SyncOnReadVariable::new("s", cpus(components.len()), 0.0, aggregation).unwrap();
        set(&source, &components);
        let logical = source.read_cross_replica().unwrap();
        let target = SyncOnReadVariable::new("s", cpus(target_replicas), 0.0, aggregation).unwrap();
        target.restore(&through_json(&source.save().unwrap())).unwrap();
        let back = target.read_cross_replica().unwrap();
        prop_assert!((back - logical).abs() <= 1e-9 * logical.abs().max(1.0), "{} vs {}", back, logical);
    }
}
