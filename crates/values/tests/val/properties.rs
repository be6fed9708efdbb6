//! Property tests: `select_replica(i, regroup(xs)) == xs[i]` for random nested structures and
//! 1..=8 replicas (VAL-02), collapse of equal leaves (VAL-08), and mismatched structures giving
//! an `Invariant` error rather than a panic (VAL-13).

use std::collections::{BTreeMap, HashMap};

use distribute_values::{ErrorKind, Leaf, Nest, regroup, select_replica};
use proptest::collection::{btree_map, hash_map, vec};
use proptest::prelude::*;

use crate::cpus;

/// A recursive user structure that touches every container kind.
#[derive(Debug, Clone, PartialEq, Nest)]
struct Node {
    value: i32,
    label: Option<String>,
    pair: (u8, [bool; 2]),
    attrs: BTreeMap<String, i64>,
    tags: HashMap<u8, String>,
    children: Vec<Node>,
}

fn flat_node() -> impl Strategy<Value = Node> {
    (
        any::<i32>(),
        proptest::option::of("[a-z]{0,3}"),
        (any::<u8>(), any::<[bool; 2]>()),
        btree_map("[a-c]", any::<i64>(), 0..3),
        hash_map(0u8..4, "[x-z]{1,2}", 0..3),
    )
        .prop_map(|(value, label, pair, attrs, tags)| Node {
            value,
            label,
            pair,
            attrs,
            tags,
            children: Vec::new(),
        })
}

fn node() -> impl Strategy<Value = Node> {
    flat_node().prop_recursive(3, 24, 4, |inner| {
        (flat_node(), vec(inner, 0..4)).prop_map(|(mut node, children)| {
            node.children = children;
            node
        })
    })
}

/// Replica `r`'s version of `base`: the same shape, and leaf `k` (in visiting order) differs
/// from replica 0's when `vary[k % len]` is set.
fn for_replica(base: &Node, r: usize, vary: &[bool], counter: &mut usize) -> Node {
    let mut next = || {
        *counter += 1;
        vary[*counter % vary.len()]
    };
    let shift = r as i64;
    let mut node = base.clone();
    if next() {
        node.value = node.value.wrapping_add(shift as i32);
    }
    if let Some(label) = &mut node.label
        && next()
    {
        label.push_str(&r.to_string());
    }
    if next() {
        node.pair.0 = node.pair.0.wrapping_add(r as u8);
    }
    if next() {
        node.pair.1[1] ^= r % 2 == 1;
    }
    for v in node.attrs.values_mut() {
        if next() {
            *v = v.wrapping_add(shift);
        }
    }
    let mut keys: Vec<u8> = node.tags.keys().copied().collect();
    keys.sort_unstable();
    for k in keys {
        if next() {
            node.tags.get_mut(&k).unwrap().push_str(&r.to_string());
        }
    }
    node.children = base
        .children
        .iter()
        .map(|c| for_replica(c, r, vary, counter))
        .collect();
    node
}

/// Everything about a node that regroup requires to match across replicas.
fn shape(node: &Node) -> String {
    let mut tags: Vec<u8> = node.tags.keys().copied().collect();
    tags.sort_unstable();
    let children: Vec<String> = node.children.iter().map(shape).collect();
    // An `Option` that is `Some` on some replicas and `None` on others regroups per replica
    // (as TF's PerReplica of None and values), so whether `label` is set is not part of the shape.
    format!(
        "{:?}{:?}[{}]",
        node.attrs.keys().collect::<Vec<_>>(),
        tags,
        children.join(",")
    )
}

proptest! {
    #[test]
    fn select_replica_inverts_regroup(
        base in node(),
        replicas in 1usize..=8,
        vary in vec(any::<bool>(), 1..8),
    ) {
        let xs: Vec<Node> = (0..replicas).map(|r| for_replica(&base, r, &vary, &mut 0)).collect();
        let grouped = regroup(&cpus(replicas), xs.clone()).unwrap();
        for (i, x) in xs.iter().enumerate() {
            prop_assert_eq!(&select_replica::<Node>(i, &grouped).unwrap(), x);
        }
        let all_equal = xs.iter().all(|x| x.value == xs[0].value);
        prop_assert_eq!(matches!(grouped.value, Leaf::Same(_)), all_equal);
    }

    #[test]
    fn differently_shaped_replicas_are_an_invariant_error(
        xs in vec(node(), 1..=4),
    ) {
        let same_shape = xs.iter().all(|x| shape(x) == shape(&xs[0]));
        match regroup(&cpus(xs.len()), xs.clone()) {
            Ok(grouped) => {
                prop_assert!(same_shape);
                for (i, x) in xs.iter().enumerate() {
                    prop_assert_eq!(&select_replica::<Node>(i, &grouped).unwrap(), x);
                }
            }
            Err(err) => {
                prop_assert!(!same_shape, "{}", err);
                prop_assert_eq!(err.kind(), ErrorKind::Invariant);
            }
        }
    }
}
