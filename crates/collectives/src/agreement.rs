//! What each worker is about to do, gathered from every worker before any cross-process
//! collective moves data: the call, its reduce op, dtype and shape, and the worker's status. A
//! worker whose step failed, or that finished its step, sends the same fixed-size record, so its
//! peers learn it in the very collective they were about to start and fail alike instead of
//! waiting for data that will never come.
//!
//! Pure data and judgement: nothing here moves bytes, so it is tested without any transport.
//! The one agreement record of every cross-rank backend: MPI gathers it before each call across
//! workers, NCCL before each call across ranks; both hash through the one [`Fnv`].

use std::fmt;

use distribute_values::ReduceOp;

use distribute_tensor::Fnv;
use distribute_tensor::{DType, Tensor};

/// Dimensions a record carries in clear (the broadcast receivers need the root's shape); a
/// tensor of higher rank is refused with an error naming this limit.
pub const MAX_DIMS: usize = 7;

/// The `dims` of a tensor of rank above [`MAX_DIMS`].
const RANK_TOO_HIGH: i64 = -2;

/// The cross-worker calls.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Call {
    /// A replica-context all-reduce (one tensor or a fused batch).
    AllReduce = 1,
    /// A replica-context all-gather; rows may differ per worker.
    AllGather = 2,
    /// A broadcast from one global replica (or worker 0's variable values).
    Broadcast = 3,
    /// A cross-replica-context reduction (`reduce_to`, `batch_reduce`).
    Reduce = 4,
    /// The end of a step: every worker passes through one, so a worker that failed early and
    /// one that finished meet.
    EndStep = 5,
    /// Bytes exchanged by a caller outside the collectives (e.g. an input pipeline's
    /// end-of-data flag).
    Exchange = 6,
    /// Worker 0's values of tensors every worker has alike (variables' initial values).
    ChiefValues = 7,
    /// A replica-context reduce-scatter: every rank passes the same shape and gets its slice of
    /// the first dimension.
    ReduceScatter = 8,
}

impl Call {
    fn from_word(word: i64) -> Option<Call> {
        Some(match word {
            1 => Call::AllReduce,
            2 => Call::AllGather,
            3 => Call::Broadcast,
            4 => Call::Reduce,
            5 => Call::EndStep,
            6 => Call::Exchange,
            7 => Call::ChiefValues,
            8 => Call::ReduceScatter,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Call::AllReduce => "all_reduce",
            Call::AllGather => "all_gather",
            Call::Broadcast => "broadcast",
            Call::Reduce => "reduce",
            Call::EndStep => "the end of its step",
            Call::Exchange => "exchange",
            Call::ChiefValues => "broadcast of the chief's values",
            Call::ReduceScatter => "reduce_scatter",
        }
    }
}

/// How a worker stands when it sends a record.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Status {
    /// Healthy: making the call, or ending a step that succeeded.
    Ok = 0,
    /// Its step failed on its own (an error or a panic in one of its replicas).
    Failed = 1,
    /// Its step failed because another worker's did.
    FailedAsConsequence = 2,
}

/// One worker's record: fixed size, so every worker's fits one gather whatever it is doing.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Record {
    /// The call.
    pub call: Call,
    /// The reduce op (`ReduceOp as i64 + 1`), 0 for none.
    pub op: i64,
    /// The dtype (`DType as i64 + 1`), 0 for none; for a fused batch, a hash of every dtype.
    pub dtype: i64,
    /// The first dimension (all-gather: may differ per worker); for a batch, the element count.
    pub rows: i64,
    /// The dimensions after the first, hashed with the rank (and a batch's dtypes and shapes).
    pub rest: i64,
    /// A broadcast's root (global replica), a reduction's replica count, else 0.
    pub extra: i64,
    /// How the worker stands.
    pub status: Status,
    /// The shape in clear, for broadcast receivers; `-1` past the rank.
    pub dims: [i64; MAX_DIMS],
}

impl Record {
    /// Words on the wire.
    pub const WORDS: usize = 7 + MAX_DIMS;

    /// The record of a call on `tensors` (one tensor, or a fused batch).
    pub fn of(call: Call, op: Option<ReduceOp>, tensors: &[&Tensor]) -> Record {
        let mut record = Record::bare(call, Status::Ok);
        record.op = op.map_or(0, |op| op as i64 + 1);
        match tensors {
            [] => {}
            [one] => {
                record.dtype = one.dtype() as i64 + 1;
                record.rows = one.shape().first().map_or(0, |&d| d as i64);
                let mut rest = Fnv::new();
                rest.bytes(&(one.rank() as u64).to_le_bytes());
                one.shape().iter().skip(1).for_each(|&d| {
                    rest.bytes(&(d as u64).to_le_bytes());
                });
                record.rest = rest.0 as i64;
                if one.rank() > MAX_DIMS {
                    record.dims = [RANK_TOO_HIGH; MAX_DIMS];
                } else {
                    for (slot, &d) in record.dims.iter_mut().zip(one.shape()) {
                        *slot = d as i64;
                    }
                }
            }
            many => {
                let (mut dtype, mut rest) = (Fnv::new(), Fnv::new());
                for t in many {
                    dtype.bytes(&(t.dtype() as u64).to_le_bytes());
                    rest.bytes(&(t.rank() as u64).to_le_bytes());
                    t.shape().iter().for_each(|&d| {
                        rest.bytes(&(d as u64).to_le_bytes());
                    });
                }
                record.dtype = dtype.0 as i64;
                record.rows = many.iter().map(|t| t.num_elements() as i64).sum();
                record.rest = rest.0 as i64;
            }
        }
        record
    }

    /// The record of a worker-level all-gather of `tensor` along `axis`: `rows` is the length of
    /// the axis (which may differ per worker); the rank, the axis and every other dimension must
    /// agree.
    pub fn gather_along(tensor: &Tensor, axis: usize) -> Record {
        let mut record = Record::bare(Call::AllGather, Status::Ok);
        record.dtype = tensor.dtype() as i64 + 1;
        record.rows = tensor.shape().get(axis).map_or(0, |&d| d as i64);
        let mut rest = Fnv::new();
        rest.bytes(&(tensor.rank() as u64).to_le_bytes());
        rest.bytes(&(axis as u64).to_le_bytes());
        tensor
            .shape()
            .iter()
            .enumerate()
            .filter(|&(d, _)| d != axis)
            .for_each(|(_, &d)| {
                rest.bytes(&(d as u64).to_le_bytes());
            });
        record.rest = rest.0 as i64;
        record
    }

    /// A record that carries no tensor: the end of a step, or a receiver of a broadcast.
    pub fn bare(call: Call, status: Status) -> Record {
        Record {
            call,
            op: 0,
            dtype: 0,
            rows: 0,
            rest: 0,
            extra: 0,
            status,
            dims: [-1; MAX_DIMS],
        }
    }

    /// The record with `extra` set (a root, a replica count, a byte length).
    pub fn with_extra(mut self, extra: i64) -> Record {
        self.extra = extra;
        self
    }

    /// The record as words on the wire ([`Record::WORDS`] of them).
    pub fn words(&self) -> [i64; Record::WORDS] {
        let mut w = [0i64; Record::WORDS];
        w[..7].copy_from_slice(&[
            self.call as i64,
            self.op,
            self.dtype,
            self.rows,
            self.rest,
            self.extra,
            self.status as i64,
        ]);
        w[7..].copy_from_slice(&self.dims);
        w
    }

    /// A record from the wire; `None` for words no worker of this build sends.
    pub fn from_words(w: &[i64]) -> Option<Record> {
        if w.len() != Record::WORDS {
            return None;
        }
        let status = match w[6] {
            0 => Status::Ok,
            1 => Status::Failed,
            2 => Status::FailedAsConsequence,
            _ => return None,
        };
        let mut dims = [0; MAX_DIMS];
        dims.copy_from_slice(&w[7..]);
        Some(Record {
            call: Call::from_word(w[0])?,
            op: w[1],
            dtype: w[2],
            rows: w[3],
            rest: w[4],
            extra: w[5],
            status,
            dims,
        })
    }

    /// The shape carried in clear; `None` for a rank above [`MAX_DIMS`].
    pub fn shape(&self) -> Option<Vec<usize>> {
        if self.dims[0] == RANK_TOO_HIGH {
            return None;
        }
        Some(
            self.dims
                .iter()
                .take_while(|&&d| d >= 0)
                .map(|&d| d as usize)
                .collect(),
        )
    }

    /// The dtype of a single-tensor record.
    pub fn single_dtype(&self) -> Option<DType> {
        DType::ALL.into_iter().find(|&d| d as i64 + 1 == self.dtype)
    }

    /// Whether two workers' records describe the same call. All-gather rows may differ, and a
    /// broadcast's receivers know only the root.
    pub fn agrees_with(&self, other: &Record) -> bool {
        let same_call = self.call == other.call && self.op == other.op;
        match self.call {
            Call::Broadcast => same_call && self.extra == other.extra,
            Call::AllGather => same_call && self.dtype == other.dtype && self.rest == other.rest,
            _ => {
                same_call
                    && self.dtype == other.dtype
                    && self.rows == other.rows
                    && self.rest == other.rest
                    && self.extra == other.extra
            }
        }
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.call.name())?;
        if self.op > 0 {
            let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max]
                .into_iter()
                .find(|&op| op as i64 + 1 == self.op);
            match op {
                Some(op) => write!(f, "({op})")?,
                None => write!(f, "(op #{})", self.op)?,
            }
        }
        match (self.single_dtype(), self.call) {
            (_, Call::EndStep) => {}
            (Some(dtype), _) => match self.shape() {
                Some(shape) => write!(f, " of a {dtype} {shape:?} tensor")?,
                None => write!(f, " of a {dtype} tensor of rank above {MAX_DIMS}")?,
            },
            (None, _) if self.dtype != 0 => write!(
                f,
                " of a batch of {} elements (dtypes and shapes #{:x})",
                self.rows, self.rest
            )?,
            (None, _) => {}
        }
        // Receivers of a broadcast know only the root, so it is what they can disagree on.
        if self.call == Call::Broadcast {
            write!(f, " from root {}", self.extra)?;
        }
        Ok(())
    }
}

/// What the gathered records say.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Every worker makes the same call: go on.
    Agreed,
    /// Every worker is at the end of its step, and none failed.
    AllEnded,
    /// Some worker's step failed; `worker` is the first that failed on its own (else the first
    /// that failed at all). `all_ended` says whether every worker is at the end of its step.
    WorkerFailed {
        /// The worker to name.
        worker: usize,
        /// Whether every worker is at the end of its step.
        all_ended: bool,
    },
    /// The workers make different calls (or some finished their step while others call):
    /// every worker fails the call with this description.
    Disagree(String),
}

/// Judges every worker's record (in worker order).
pub fn judge(records: &[Record]) -> Verdict {
    let all_ended = records.iter().all(|r| r.call == Call::EndStep);
    let failed = |status| records.iter().position(|r| r.status == status);
    if let Some(worker) = failed(Status::Failed).or_else(|| failed(Status::FailedAsConsequence)) {
        return Verdict::WorkerFailed { worker, all_ended };
    }
    if all_ended {
        return Verdict::AllEnded;
    }
    let first = &records[0];
    if records.iter().all(|r| r.agrees_with(first)) {
        return Verdict::Agreed;
    }
    let calls: Vec<String> = records
        .iter()
        .enumerate()
        .map(|(w, r)| format!("worker {w}: {r}"))
        .collect();
    Verdict::Disagree(format!(
        "the workers made different cross-worker calls ({}); every replica of every worker must \
         make the same collective calls with the same dtypes and shapes",
        calls.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize]) -> Tensor {
        Tensor::zeros("/cpu:0", DType::F32, shape).unwrap()
    }

    #[test]
    fn records_round_trip_through_words() {
        let r = Record::of(Call::AllReduce, Some(ReduceOp::Mean), &[&t(&[3, 4])]).with_extra(5);
        assert_eq!(Record::from_words(&r.words()), Some(r));
        assert_eq!(r.shape(), Some(vec![3, 4]));
        let high = Record::of(Call::Broadcast, None, &[&t(&[1; 8])]);
        assert_eq!(high.shape(), None);
        assert_eq!(r.single_dtype(), Some(DType::F32));
        assert_eq!(Record::from_words(&[9; Record::WORDS]), None);
        assert_eq!(Record::from_words(&[1; 3]), None);
    }

    #[test]
    fn same_calls_agree_and_all_gather_rows_may_differ() {
        let a = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[4])]);
        assert_eq!(judge(&[a, a, a]), Verdict::Agreed);
        let g1 = Record::of(Call::AllGather, None, &[&t(&[1, 3])]);
        let g2 = Record::of(Call::AllGather, None, &[&t(&[5, 3])]);
        assert_eq!(judge(&[g1, g2]), Verdict::Agreed);
        let g3 = Record::of(Call::AllGather, None, &[&t(&[5, 2])]);
        assert!(matches!(judge(&[g1, g3]), Verdict::Disagree(_)));
    }

    #[test]
    fn a_gather_along_an_axis_lets_only_that_axis_differ() {
        let a = Record::gather_along(&t(&[2, 1, 3]), 1);
        let b = Record::gather_along(&t(&[2, 4, 3]), 1);
        assert_eq!(judge(&[a, b]), Verdict::Agreed);
        assert_eq!((a.rows, b.rows), (1, 4));
        let other_dim = Record::gather_along(&t(&[3, 4, 3]), 1);
        assert!(matches!(judge(&[a, other_dim]), Verdict::Disagree(_)));
        let other_axis = Record::gather_along(&t(&[2, 3, 3]), 2);
        assert!(matches!(judge(&[a, other_axis]), Verdict::Disagree(_)));
    }

    #[test]
    fn a_different_shape_dtype_or_op_is_a_disagreement_naming_each_worker() {
        let a = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[4])]);
        let shape = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[5])]);
        let op = Record::of(Call::AllReduce, Some(ReduceOp::Max), &[&t(&[4])]);
        let dtype = Record::of(
            Call::AllReduce,
            Some(ReduceOp::Sum),
            &[&Tensor::zeros("/cpu:0", DType::F64, &[4]).unwrap()],
        );
        for other in [shape, op, dtype] {
            let Verdict::Disagree(text) = judge(&[a, other]) else {
                panic!("{other} should disagree with {a}");
            };
            assert!(
                text.contains("worker 0: all_reduce(SUM) of a float32 [4] tensor"),
                "{text}"
            );
            assert!(text.contains("worker 1: "), "{text}");
        }
    }

    #[test]
    fn a_failed_worker_is_named_before_anything_else() {
        let a = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[4])]);
        let consequence = Record::bare(Call::EndStep, Status::FailedAsConsequence);
        let failed = Record::bare(Call::EndStep, Status::Failed);
        assert_eq!(
            judge(&[a, consequence, failed]),
            Verdict::WorkerFailed {
                worker: 2,
                all_ended: false
            }
        );
        assert_eq!(
            judge(&[consequence, failed]),
            Verdict::WorkerFailed {
                worker: 1,
                all_ended: true
            }
        );
        assert_eq!(
            judge(&[consequence, a]),
            Verdict::WorkerFailed {
                worker: 0,
                all_ended: false
            }
        );
    }

    #[test]
    fn a_worker_that_ended_while_others_call_is_a_disagreement() {
        let a = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[4])]);
        let end = Record::bare(Call::EndStep, Status::Ok);
        assert_eq!(judge(&[end, end]), Verdict::AllEnded);
        let Verdict::Disagree(text) = judge(&[a, end]) else {
            panic!("an ended worker and a calling one disagree");
        };
        assert!(text.contains("worker 1: the end of its step"), "{text}");
    }

    #[test]
    fn broadcast_receivers_agree_on_the_root_only() {
        let root = Record::of(Call::Broadcast, None, &[&t(&[2, 2])]).with_extra(3);
        let receiver = Record::bare(Call::Broadcast, Status::Ok).with_extra(3);
        assert_eq!(judge(&[receiver, root]), Verdict::Agreed);
        let other_root = Record::bare(Call::Broadcast, Status::Ok).with_extra(1);
        let Verdict::Disagree(text) = judge(&[other_root, root]) else {
            panic!("receivers naming another root disagree with the root");
        };
        assert!(text.contains("worker 0: broadcast from root 1"), "{text}");
        assert!(
            text.contains("worker 1: broadcast of a float32 [2, 2] tensor from root 3"),
            "{text}"
        );
    }

    #[test]
    fn reduce_scatter_records_read_back_and_need_the_same_rows() {
        let a = Record::of(Call::ReduceScatter, Some(ReduceOp::Sum), &[&t(&[4, 2])]);
        assert_eq!(Record::from_words(&a.words()), Some(a));
        assert_eq!(
            a.to_string(),
            "reduce_scatter(SUM) of a float32 [4, 2] tensor"
        );
        assert_eq!(judge(&[a, a]), Verdict::Agreed);
        let rows = Record::of(Call::ReduceScatter, Some(ReduceOp::Sum), &[&t(&[6, 2])]);
        assert!(matches!(judge(&[a, rows]), Verdict::Disagree(_)));
        let all_reduce = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[4, 2])]);
        assert!(matches!(judge(&[a, all_reduce]), Verdict::Disagree(_)));
    }

    #[test]
    fn a_batch_agrees_on_every_dtype_and_shape_not_just_the_element_count() {
        let f64s = Tensor::zeros("/cpu:0", DType::F64, &[2, 3]).unwrap();
        let batch = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[2, 3]), &f64s]);
        assert_eq!(batch.rows, 12);
        assert_eq!(judge(&[batch, batch]), Verdict::Agreed);
        let reshaped = Record::of(Call::AllReduce, Some(ReduceOp::Sum), &[&t(&[3, 2]), &f64s]);
        let retyped = Record::of(
            Call::AllReduce,
            Some(ReduceOp::Sum),
            &[&t(&[2, 3]), &t(&[2, 3])],
        );
        for other in [reshaped, retyped] {
            assert_eq!(other.rows, batch.rows);
            assert!(matches!(judge(&[batch, other]), Verdict::Disagree(_)));
        }
    }
}
