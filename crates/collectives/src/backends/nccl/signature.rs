//! What a rank passes to an NCCL call, gathered from every rank before the call so that a rank
//! making a different call (or none) fails every rank alike instead of hanging them.

use distribute_values::ReduceOp;

use super::fnv::Fnv;
use crate::Tensor;

/// What a rank passes to a call, gathered from every rank before the call itself.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Signature {
    /// The collective and its reduce op: `kind * 16 + op`.
    pub(super) call: i64,
    /// The dtypes, hashed (broadcast: the root).
    pub(super) dtype: i64,
    /// The first dimension (all-gather lets it differ); for a batch, the element count.
    pub(super) rows: i64,
    /// The rest of the shapes, hashed.
    pub(super) rest: i64,
    /// 1 when this rank refused its own arguments: every rank then fails the call alike.
    pub(super) refused: i64,
}

impl Signature {
    pub(super) const WORDS: usize = 5;

    pub(super) fn of(kind: i64, op: Option<ReduceOp>, tensors: &[&Tensor]) -> Signature {
        let (mut dtype, mut rest) = (Fnv::new(), Fnv::new());
        let batch = tensors.len() > 1;
        for t in tensors {
            dtype.bytes(&(t.dtype() as u64).to_le_bytes());
            rest.bytes(&(t.rank() as u64).to_le_bytes());
            // A single all-gather input may differ in its first dimension; nothing else may.
            let skip = usize::from(!batch);
            t.shape().iter().skip(skip).for_each(|&d| {
                rest.bytes(&(d as u64).to_le_bytes());
            });
        }
        let rows = match tensors {
            [one] => one.shape().first().copied().unwrap_or(0) as i64,
            many => many.iter().map(|t| t.num_elements() as i64).sum(),
        };
        Signature {
            call: kind * 16 + op.map_or(0, |op| op as i64 + 1),
            dtype: dtype.0 as i64,
            rows,
            rest: rest.0 as i64,
            refused: 0,
        }
    }

    pub(super) fn words(&self) -> [i64; Signature::WORDS] {
        [self.call, self.dtype, self.rows, self.rest, self.refused]
    }

    pub(super) fn from_words(w: &[i64]) -> Signature {
        Signature {
            call: w[0],
            dtype: w[1],
            rows: w[2],
            rest: w[3],
            refused: w[4],
        }
    }

    pub(super) fn kind(&self) -> i64 {
        self.call / 16
    }
}
