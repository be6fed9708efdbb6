//! The agreement every cross-worker call starts with: one all-gather of a fixed-size slot per
//! worker (the one agreement record of `distribute_collectives::backend::Record` and an inline
//! payload), judged alike on every worker, and the failed worker's message when one failed.
use crate::shared::Shared;
use distribute_collectives::CollectiveError;
use distribute_collectives::backend::{Record, Verdict, judge};
use distribute_tensor::bytes::element_bytes_mut as as_bytes_mut;

/// The payload an agreement carries: a reduction this small travels with it.
pub const INLINE_BYTES: usize = 4096;

/// Words per worker in an agreement: the record, then the inline payload.
pub(crate) const SLOT_WORDS: usize = Record::WORDS + INLINE_BYTES / 8;

// An agreement slot travels as one eager message on shared memory (see `EAGER_LIMIT_BYTES`).
const _: () = assert!(SLOT_WORDS * 8 <= crate::communicator::EAGER_LIMIT_BYTES);

/// Bytes of a failed worker's message carried to the others.
pub(crate) const MESSAGE_BYTES: usize = 512;

/// What an agreement gathered.
pub(crate) struct Gathered {
    /// Every worker's record, in worker order.
    pub(crate) records: Vec<Record>,
    pub(crate) verdict: Verdict,
    /// The worker to name and its message, when one failed.
    pub(crate) failed: Option<(usize, String)>,
    /// Every worker's slot (record and inline payload); empty with one worker.
    pub(crate) slots: Vec<i64>,
}

impl Shared {
    pub(crate) fn workers(&self) -> usize {
        self.world.size()
    }

    /// Gathers every worker's record and `inline` payload (and, when one failed, every
    /// worker's message) and judges them. Every agreement moves the same fixed-size slot per
    /// worker, whatever the worker is doing, so workers in different calls still meet in one
    /// collective; a reduction of at most [`INLINE_BYTES`] rides in the slot, so it costs one
    /// round trip in all. With one worker, judges this worker's record alone.
    pub(crate) fn agree_raw(&self, record: Record, message: &str, inline: &[u8]) -> Gathered {
        let w = self.workers();
        let (records, slots) = if w == 1 {
            (vec![record], Vec::new())
        } else {
            let mut mine = vec![0i64; SLOT_WORDS];
            mine[..Record::WORDS].copy_from_slice(&record.words());
            as_bytes_mut(&mut mine[Record::WORDS..])[..inline.len()].copy_from_slice(inline);
            let mut all = vec![0i64; SLOT_WORDS * w];
            self.world
                .all_gather(&mine[..], &mut all, self.deadline, &|| {
                    format!("the agreement on {record}")
                });
            self.world.agreement_done();
            let records = all
                .chunks(SLOT_WORDS)
                .map(|slot| {
                    Record::from_words(&slot[..Record::WORDS]).unwrap_or_else(|| {
                        self.world.abort_job(
                            "another worker sent an agreement this build cannot read (workers \
                             built from different sources?)",
                        )
                    })
                })
                .collect();
            (records, all)
        };
        let verdict = judge(&records);
        let failed = match verdict {
            Verdict::WorkerFailed { worker, .. } => Some((worker, self.messages(message, worker))),
            _ => None,
        };
        Gathered {
            records,
            verdict,
            failed,
            slots,
        }
    }

    /// The message of `worker`, gathered from every worker (each passes its own).
    pub(crate) fn messages(&self, mine: &str, worker: usize) -> String {
        let mut send = [0u8; MESSAGE_BYTES];
        let mut end = mine.len().min(MESSAGE_BYTES);
        while !mine.is_char_boundary(end) {
            end -= 1;
        }
        send[..end].copy_from_slice(&mine.as_bytes()[..end]);
        let w = self.workers();
        if w == 1 {
            return mine[..end].to_owned();
        }
        let mut all = vec![0u8; MESSAGE_BYTES * w];
        self.world
            .all_gather(&send[..], &mut all, self.deadline, &|| {
                "the failed worker's message".to_owned()
            });
        let theirs = &all[worker * MESSAGE_BYTES..(worker + 1) * MESSAGE_BYTES];
        let len = theirs.iter().position(|&b| b == 0).unwrap_or(MESSAGE_BYTES);
        String::from_utf8_lossy(&theirs[..len]).into_owned()
    }

    /// [`Shared::agree_raw`] for a call: every worker's record when they agree, else the error
    /// every worker returns alike.
    pub(crate) fn agree(
        &self,
        record: Record,
        message: &str,
    ) -> Result<Vec<Record>, CollectiveError> {
        Ok(self.agree_with(record, message, &[])?.0)
    }

    /// [`Shared::agree`] with an inline payload; also returns every worker's slot.
    pub(crate) fn agree_with(
        &self,
        record: Record,
        message: &str,
        inline: &[u8],
    ) -> Result<(Vec<Record>, Vec<i64>), CollectiveError> {
        let Gathered {
            records,
            verdict,
            failed,
            slots,
        } = self.agree_raw(record, message, inline);
        match verdict {
            Verdict::Agreed | Verdict::AllEnded => Ok((records, slots)),
            Verdict::WorkerFailed { .. } => {
                let (worker, message) = failed.expect("a failure carries its message");
                *self.remote_failure.lock() = Some(worker);
                Err(CollectiveError::WorkerFailed { worker, message })
            }
            Verdict::Disagree(description) => Err(CollectiveError::WorkersDisagree(description)),
        }
    }
}
