//! The crate's one error type: every way building or reading an input pipeline can fail.
//!
//! End of input is not an error: iterators return `None` there (TF's `OutOfRange`), so an `Err`
//! always means something is wrong.

use std::path::PathBuf;

use distribute_device_spec::DeviceSpecError;
use distribute_tensor::TensorError;
use distribute_values::ValuesError;
use thiserror::Error;

/// What went wrong while building or reading an input pipeline.
///
/// Each message names the offending file, element or option and says what to do instead.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum InputError {
    /// A global batch that cannot be divided evenly where an even split is required (IN-02).
    #[error(
        "the global batch size {global_batch} is not divisible by {replicas} replicas; pick a \
         multiple of {replicas}, or keep uneven batches (PartialBatch::KeepUneven)"
    )]
    IndivisibleBatch {
        /// The global batch size.
        global_batch: usize,
        /// The number of replicas (or pieces) it must split into.
        replicas: usize,
    },
    /// Distributing a dataset that has no batching step (IN-50).
    #[error(
        "the dataset has no batching step, so it cannot be split across replicas: call \
         `batch` first"
    )]
    NotBatched,
    /// A batching or sharding step that was given twice or in the wrong place.
    #[error("invalid dataset pipeline: {0}")]
    Pipeline(String),
    /// An auto-shard policy that this dataset and cluster cannot satisfy.
    #[error("auto-shard policy {policy}: {reason}")]
    Shard {
        /// The policy asked for.
        policy: &'static str,
        /// Why it cannot be applied, and what to do.
        reason: String,
    },
    /// An invalid value or combination of options (IN-18, IN-41, IN-50).
    #[error("invalid input option: {0}")]
    InvalidOption(String),
    /// Leaves of one batch whose leading (batch) dimensions differ.
    #[error(
        "{origin}: ragged batch, the leaves have different numbers of rows ({rows}); every \
         tensor of a batch needs the same leading dimension"
    )]
    RaggedBatch {
        /// Where the batch came from (a file, or `in-memory data`).
        origin: String,
        /// Each leaf's path and row count, e.g. `.0: 8, .1: 7`.
        rows: String,
    },
    /// A rank-0 tensor where a batch with a leading dimension is needed.
    #[error(
        "{origin}: element {path} is rank 0 (a scalar), but a batch needs a leading dimension; \
         give rows along the first axis (shape [n, ...])"
    )]
    NoBatchDimension {
        /// Where the element came from.
        origin: String,
        /// The leaf's path inside the structure (`the top level` for a plain tensor).
        path: String,
    },
    /// A leaf of a dataset element that is not a tensor.
    #[error(
        "{origin}: element {path} is a {found}, not a tensor; every leaf of a dataset element \
         must be a Tensor"
    )]
    NotATensor {
        /// Where the element came from, or the operation that met it.
        origin: String,
        /// The leaf's path inside the structure.
        path: String,
        /// The leaf's type.
        found: &'static str,
    },
    /// Batches of one stream that disagree in dtype or trailing shape, so they cannot be joined.
    #[error("{origin}: {detail}")]
    Mismatch {
        /// Where the batches came from.
        origin: String,
        /// What differs.
        detail: String,
    },
    /// A file that could not be opened or read.
    #[error("cannot read '{file}': {source}; check that the path exists and is readable")]
    Io {
        /// The file.
        file: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A `.npy` file that is malformed or holds a type this crate does not read.
    #[error("'{file}': not a supported .npy file: {reason}")]
    Npy {
        /// The file.
        file: PathBuf,
        /// What is wrong and what is supported.
        reason: String,
    },
    /// A CSV file with a malformed record or a value that does not parse.
    #[error("'{file}' line {line}: {reason}")]
    Csv {
        /// The file.
        file: PathBuf,
        /// The 1-based line of the record (0 when unknown).
        line: u64,
        /// What is wrong.
        reason: String,
    },
    /// The input function of one pipeline failed (from `distribute_datasets_from_function`).
    #[error("input function for pipeline {pipeline}: {source}")]
    InputFunction {
        /// The input pipeline whose dataset could not be built.
        pipeline: usize,
        /// What the function returned.
        #[source]
        source: Box<InputError>,
    },
    /// Other processes still have data for a step, but this one never produced a batch, so
    /// it cannot make empty batches of the right structure for its replicas.
    #[error(
        "this process's input pipelines produced no data while other processes still have \
         some, so the structure of an empty batch is unknown; give every process at least one \
         batch"
    )]
    NoBatchToImitate,
    /// Another process's input pipeline failed on this step, so every process stops here; the
    /// failed process returns the error itself (from `next_across_processes`).
    #[error(
        "{failed} other process(es) failed to read input on this step, so this one stops with \
         them; see the failed processes' own errors"
    )]
    OtherProcessFailed {
        /// How many processes failed on the step.
        failed: usize,
    },
    /// The exchange of `next_across_processes` returned a number that is not the sum of one
    /// report per process.
    #[error(
        "the exchange across {processes} processes returned {sum}, which is not the sum of every \
         process's report (this one's included); the callback must return the exact integer \
         sum over all processes"
    )]
    BadExchange {
        /// What the callback returned.
        sum: u64,
        /// How many processes feed each step.
        processes: usize,
    },
    /// The input pipeline panicked while making an item (in a user's source, for example);
    /// the item is lost and the pipeline ends.
    #[error("the input pipeline panicked: {0}")]
    Panicked(String),
    /// A tensor operation failed.
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// The sum across processes of a [`SumAcrossProcesses`](crate::SumAcrossProcesses) failed:
    /// the cross-process transport's own error (a worker that failed or froze, say).
    #[error(transparent)]
    AcrossProcesses(Box<dyn std::error::Error + Send + Sync>),
    /// A distributed value could not be built.
    #[error(transparent)]
    Values(#[from] ValuesError),
    /// A device name that does not parse.
    #[error(transparent)]
    Device(#[from] DeviceSpecError),
}

/// The error kinds of the reference conventions, for callers that branch on the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A bad argument or bad data (TF's `ValueError` / `InvalidArgumentError`).
    InvalidArgument,
    /// Reading the underlying data failed (TF's `NotFoundError` / `DataLossError`).
    DataLoss,
    /// Protocol or state misuse (TF's `RuntimeError`), e.g. a panicking input pipeline.
    Runtime,
}

impl InputError {
    /// The kind of error, as the reference conventions name it.
    pub fn kind(&self) -> ErrorKind {
        match self {
            InputError::Io { .. } | InputError::Npy { .. } | InputError::Csv { .. } => {
                ErrorKind::DataLoss
            }
            InputError::Panicked(_)
            | InputError::NoBatchToImitate
            | InputError::OtherProcessFailed { .. }
            | InputError::BadExchange { .. }
            | InputError::AcrossProcesses(_) => ErrorKind::Runtime,
            InputError::InputFunction { source, .. } => source.kind(),
            _ => ErrorKind::InvalidArgument,
        }
    }
}
