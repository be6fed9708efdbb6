//! `Nest` on derived structs: the leaves of users' structs are visited, mapped and zipped field
//! by field with their paths, and a derived struct's regrouped companion names it back
//! (`Distributed`), as a strategy's `run` needs.

use std::collections::HashMap;

use distribute_values::{
    Distributed, ErrorKind, Leaf, LeafVisitor, MirroredVariable, Nest, Path, PerReplica,
    ValuesError, VariableAggregation, VariableComponent, regroup, select_replica,
};

use crate::cpus;

#[derive(Debug, Clone, PartialEq, Nest)]
#[nest(leaf)]
struct Token(u32);

#[derive(Debug, Clone, PartialEq, Nest)]
struct Example {
    weights: f32,
    history: Vec<f32>,
    best: Option<f32>,
    scale: Box<f32>,
    named: HashMap<String, f32>,
}

#[derive(Debug, Clone, PartialEq, Nest)]
struct Pair<T>(T, (T, T));

#[derive(Debug, Clone, PartialEq, Nest)]
struct Nothing;

fn example(x: f32, best: Option<f32>) -> Example {
    Example {
        weights: x,
        history: vec![x + 1.0, x + 2.0],
        best,
        scale: Box::new(x + 3.0),
        named: HashMap::from([("b".to_owned(), x + 5.0), ("a".to_owned(), x + 4.0)]),
    }
}

#[test]
fn derived_structs_walk_their_fields_in_declaration_order() {
    let mut seen = Vec::new();
    example(0.0, Some(9.0))
        .for_each_leaf(|path, x: &f32| {
            seen.push(format!("{path}={x}"));
            Ok::<_, ValuesError>(())
        })
        .unwrap();
    assert_eq!(
        seen,
        [
            ".weights=0",
            ".history[0]=1",
            ".history[1]=2",
            ".best=9",
            ".scale=3",
            r#".named["a"]=4"#,
            r#".named["b"]=5"#,
        ]
    );
}

#[test]
fn derived_structs_map_and_rebuild() {
    let e = example(1.0, None);
    let mapped = e
        .try_map_leaves(|_, x: &f32| Ok::<_, ValuesError>(-x))
        .unwrap();
    assert_eq!(mapped.weights, -1.0);
    assert_eq!(mapped.history, [-2.0, -3.0]);
    assert_eq!(*mapped.scale, -4.0);
    let leaves = e.leaves::<f32>().unwrap();
    assert_eq!(leaves, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let rebuilt = e.with_leaves(leaves.iter().map(|x| x * 10.0)).unwrap();
    assert_eq!(rebuilt.named["b"], 60.0);
}

#[test]
fn derived_structs_zip_and_report_mismatches_by_path() {
    let sum = Example::try_zip_leaves(
        &[&example(1.0, Some(1.0)), &example(2.0, Some(2.0))],
        |_, xs: &[&f32]| Ok::<_, ValuesError>(xs.iter().copied().sum()),
    )
    .unwrap();
    assert_eq!(sum.history, [5.0, 7.0]);
    assert_eq!(sum.best, Some(3.0));

    let err = Example::try_zip_leaves(
        &[&example(1.0, Some(1.0)), &example(2.0, None)],
        |_, xs: &[&f32]| Ok::<_, ValuesError>(*xs[0]),
    )
    .unwrap_err();
    assert_eq!(
        err,
        ValuesError::StructureMismatch {
            path: ".best".into(),
            detail: "part 0 is Some, part 1 is None".into()
        }
    );
    assert_eq!(err.kind(), ErrorKind::Invariant);
}

#[test]
fn generic_tuple_unit_and_leaf_structs() {
    let pair = Pair(Token(1), (Token(2), Token(3)));
    let mut paths = Vec::new();
    pair.for_each_leaf(|path, Token(t): &Token| {
        paths.push(format!("{path}:{t}"));
        Ok::<_, ValuesError>(())
    })
    .unwrap();
    assert_eq!(paths, [".0:1", ".1.0:2", ".1.1:3"]);
    assert!(Nothing.leaves::<f32>().unwrap().is_empty());
    let err = pair.leaves::<u32>().unwrap_err();
    assert!(
        err.to_string()
            .contains("expected a leaf of type u32 at .0"),
        "{err}"
    );
}

/// A visitor over leaves of any type: counts them by type name.
struct TypeNames(Vec<&'static str>);

impl LeafVisitor for TypeNames {
    type Error = ValuesError;

    fn leaf<L: 'static>(&mut self, _: &Path<'_>, _: &L) -> Result<(), ValuesError> {
        self.0.push(std::any::type_name::<L>());
        Ok(())
    }
}

#[test]
fn visitors_see_leaves_of_every_type() {
    let variable = MirroredVariable::new("v", cpus(1), 1.0f32, VariableAggregation::Sum).unwrap();
    let value = (1u8, "s", variable, Pair(2i64, (3i64, 4i64)));
    let mut names = TypeNames(Vec::new());
    value.visit_leaves(&Path::ROOT, &mut names).unwrap();
    assert_eq!(
        names.0,
        [
            "u8",
            "&str",
            "distribute_values::variable::MirroredVariable<f32>",
            "i64",
            "i64",
            "i64"
        ]
    );
}

/// What replica `r` gets out of inputs, with the per-replica type inferred from them.
fn local<D: Distributed>(inputs: &D, replica: usize) -> D::Local {
    select_replica::<D::Local>(replica, inputs).unwrap()
}

#[test]
fn regrouped_structures_name_their_per_replica_type() {
    let map = cpus(2);
    let grouped: ExampleRegrouped =
        regroup(&map, vec![example(1.0, None), example(2.0, None)]).unwrap();
    let replica_one: Example = local(&grouped, 1);
    assert_eq!(replica_one, example(2.0, None));

    let pair = Pair(
        Leaf::PerReplica(PerReplica::new(map.clone(), vec![1, 2]).unwrap()),
        (Leaf::Same(3), Leaf::Same(4)),
    );
    let grouped: PairRegrouped<i32> =
        regroup(&map, vec![Pair(1, (3, 4)), Pair(2, (3, 4))]).unwrap();
    assert_eq!(grouped.0, pair.0);
    assert_eq!(local(&grouped, 1), Pair(2, (3, 4)));
    assert_eq!(
        local(&(Leaf::Same("x"), vec![Leaf::Same(1u8)]), 0),
        ("x", vec![1u8])
    );

    let variable: distribute_values::DistributedVariable<f32> =
        MirroredVariable::new("v", map.clone(), 1.0f32, VariableAggregation::Sum)
            .unwrap()
            .into();
    let component: VariableComponent<f32> = local(&variable, 1);
    assert_eq!(component.replica(), 1);
}
