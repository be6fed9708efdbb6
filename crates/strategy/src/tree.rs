//! [`TensorTree`]: nested structures of tensors that `ReplicaContext::all_reduce` reduces in one
//! fused call (a gradient list, a tuple of loss and metrics, a map of named gradients).

use std::collections::BTreeMap;

use distribute_collectives::Tensor;

use crate::StrategyError;

/// A structure whose leaves are tensors: it can list them in a fixed order and be rebuilt from
/// the same number of tensors in that order.
///
/// ```
/// use distribute_collectives::Tensor;
/// use distribute_strategy::TensorTree;
///
/// let grads = (Tensor::scalar("/cpu:0", 1.0f32), vec![Tensor::scalar("/cpu:0", 2.0f32)]);
/// let mut flat = Vec::new();
/// grads.flatten_into(&mut flat);
/// assert_eq!(flat.len(), 2);
/// let rebuilt = grads.rebuild(&mut flat.into_iter())?;
/// assert_eq!(rebuilt.1[0].to_vec::<f32>()?, [2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait TensorTree: Sized {
    /// Appends the leaves, in order.
    fn flatten_into(&self, out: &mut Vec<Tensor>);

    /// The same structure with its leaves taken, in order, from `leaves`.
    fn rebuild(&self, leaves: &mut dyn Iterator<Item = Tensor>) -> Result<Self, StrategyError>;
}

impl TensorTree for Tensor {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        out.push(self.clone());
    }

    fn rebuild(&self, leaves: &mut dyn Iterator<Item = Tensor>) -> Result<Self, StrategyError> {
        leaves.next().ok_or_else(|| {
            StrategyError::Invariant("fewer tensors came back than were sent".into())
        })
    }
}

impl<T: TensorTree> TensorTree for Vec<T> {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        self.iter().for_each(|t| t.flatten_into(out));
    }

    fn rebuild(&self, leaves: &mut dyn Iterator<Item = Tensor>) -> Result<Self, StrategyError> {
        self.iter().map(|t| t.rebuild(leaves)).collect()
    }
}

impl<T: TensorTree, const N: usize> TensorTree for [T; N] {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        self.iter().for_each(|t| t.flatten_into(out));
    }

    fn rebuild(&self, leaves: &mut dyn Iterator<Item = Tensor>) -> Result<Self, StrategyError> {
        let items = self
            .iter()
            .map(|t| t.rebuild(leaves))
            .collect::<Result<Vec<T>, _>>()?;
        Ok(items
            .try_into()
            .unwrap_or_else(|_| unreachable!("N items rebuilt from N")))
    }
}

impl<T: TensorTree> TensorTree for Option<T> {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        if let Some(t) = self {
            t.flatten_into(out);
        }
    }

    fn rebuild(&self, leaves: &mut dyn Iterator<Item = Tensor>) -> Result<Self, StrategyError> {
        self.as_ref().map(|t| t.rebuild(leaves)).transpose()
    }
}

impl<K: Ord + Clone, T: TensorTree> TensorTree for BTreeMap<K, T> {
    fn flatten_into(&self, out: &mut Vec<Tensor>) {
        self.values().for_each(|t| t.flatten_into(out));
    }

    fn rebuild(&self, leaves: &mut dyn Iterator<Item = Tensor>) -> Result<Self, StrategyError> {
        self.iter()
            .map(|(k, t)| Ok((k.clone(), t.rebuild(leaves)?)))
            .collect()
    }
}

macro_rules! tuple_tree {
    ($($name:ident $index:tt),+) => {
        impl<$($name: TensorTree),+> TensorTree for ($($name,)+) {
            fn flatten_into(&self, out: &mut Vec<Tensor>) {
                $(self.$index.flatten_into(out);)+
            }

            fn rebuild(
                &self,
                leaves: &mut dyn Iterator<Item = Tensor>,
            ) -> Result<Self, StrategyError> {
                Ok(($(self.$index.rebuild(leaves)?,)+))
            }
        }
    };
}

tuple_tree!(A 0);
tuple_tree!(A 0, B 1);
tuple_tree!(A 0, B 1, C 2);
tuple_tree!(A 0, B 1, C 2, D 3);
tuple_tree!(A 0, B 1, C 2, D 3, E 4);
tuple_tree!(A 0, B 1, C 2, D 3, E 4, F 5);
