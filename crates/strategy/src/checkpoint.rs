//! [`Checkpoints`]: a job's checkpoints in one directory, written by the chief every N steps
//! and restored on any number of replicas and workers, so a job that died restarts from where
//! it stopped (TF's `BackupAndRestore`).
//!
//! A checkpoint holds the variables' logical values (`DistributedVariable::save`: a mirrored
//! variable's value, a sync-on-read variable's aggregate over every replica of every worker)
//! and the input pipeline's [`InputPosition`]. The chief alone writes it, atomically: a
//! temporary file, `fsync`, `rename`, then an `fsync` of the directory, so a crash leaves either
//! the whole new file or none. A checksum over the header and the payload (64-bit FNV-1a, the
//! workspace's one FNV: no cryptography, whose guarantees against a chosen input a checkpoint
//! does not need) catches a torn or corrupted file on restore, which then falls back to the previous checkpoint with a warning.
//! Restoring, the chief reads the file and sends its bytes to every worker, so workers on other
//! machines need no shared disk.
//!
//! # File format (`ckpt-{step:010}.dst`, little-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `DSTCKPT\0` |
//! | 4 | format version, `u32` (2) |
//! | 8 | step, `u64` |
//! | 8 | payload length, `u64` |
//! | 8 | checksum, `u64`: FNV-1a of the 28 bytes above followed by the payload |
//! | … | payload |
//!
//! The payload: the input position (`epoch` and `step`, `u64` each), the variable count
//! (`u32`), then per variable its name and its value's signature (`u32` length + UTF-8 each:
//! a tensor's dtype and shape, else the Rust type) and its value (`u64` length +
//! `VariableValue::to_wire`'s bytes).

use std::any::Any;
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use distribute_input::InputPosition;
use distribute_tensor::Fnv;
use distribute_tensor::Tensor;
use distribute_values::{DistributedVariable, SavedValue, VariableAggregation, VariableValue};

use crate::{Strategy, StrategyError, StrategyExtended};

/// The first bytes of every checkpoint file.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"DSTCKPT\0";
/// The format version this crate writes and reads (1 had a SHA-256 where 2 has its checksum).
pub const CHECKPOINT_VERSION: u32 = 2;
/// Bytes before the payload: magic, version, step, payload length, checksum.
const HEADER_BYTES: usize = 8 + 4 + 8 + 8 + 8;
/// The bytes the checksum covers besides the payload: the header up to the checksum.
const HASHED_HEADER_BYTES: usize = 8 + 4 + 8 + 8;

/// How often checkpoints are written and how many are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointOptions {
    /// Write a checkpoint after every step whose number is a multiple of this (at least 1).
    pub every: u64,
    /// Keep the newest `keep` checkpoints (at least 1); older ones are deleted after a write.
    /// More than one lets a restore fall back when the newest is damaged.
    pub keep: usize,
}

impl Default for CheckpointOptions {
    /// Every 100 steps, the newest 3 kept.
    fn default() -> Self {
        CheckpointOptions {
            every: 100,
            keep: 3,
        }
    }
}

/// Where a restored job resumes: the checkpoint's step and input position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// Steps taken before the checkpoint: the next step is `step + 1` counting from 1, or
    /// `step` counting from 0.
    pub step: u64,
    /// Where the input pipeline was (give it to `DistributedDataset::resume_from`).
    pub input: InputPosition,
    /// The checkpoint file restored, as the chief named it.
    pub path: PathBuf,
    /// Newer files the chief refused (torn, corrupt, unreadable), each with why; empty on the
    /// other workers.
    pub refused: Vec<(PathBuf, String)>,
}

/// A variable a checkpoint can hold, whatever its value type: every
/// `DistributedVariable<T>` whose values travel as bytes (`VariableValue::to_wire`), so one
/// call saves variables of different types: `&[&weights, &step_count]`.
pub trait CheckpointVariable {
    /// The name the value is stored under: the variable's name.
    fn checkpoint_name(&self) -> &str;

    /// What the stored bytes must fit: a tensor's dtype and shape, else the value's Rust type.
    fn signature(&self) -> String;

    /// The logical value's bytes across every worker (sync-on-read variables aggregate over
    /// every worker's replicas). Every worker calls it for the same variables in the same
    /// order.
    fn saved_bytes(&self, extended: &dyn StrategyExtended) -> Result<Vec<u8>, StrategyError>;

    /// Restores the logical value from `bytes` on this worker's replicas (a `Sum` sync-on-read
    /// variable gets an equal share on every replica of every worker).
    fn restore_bytes(
        &self,
        extended: &dyn StrategyExtended,
        bytes: &[u8],
    ) -> Result<(), StrategyError>;
}

impl<T: VariableValue + 'static> CheckpointVariable for DistributedVariable<T> {
    fn checkpoint_name(&self) -> &str {
        self.name()
    }

    fn signature(&self) -> String {
        let value = self.save().map(SavedValue::into_value).ok();
        match value
            .as_ref()
            .and_then(|v| (v as &dyn Any).downcast_ref::<Tensor>())
        {
            Some(tensor) => format!("tensor {:?} {:?}", tensor.dtype(), tensor.shape()),
            None => std::any::type_name::<T>().to_owned(),
        }
    }

    fn saved_bytes(&self, extended: &dyn StrategyExtended) -> Result<Vec<u8>, StrategyError> {
        let untransportable = || {
            StrategyError::InvalidArgument(format!(
                "variable {}: its value type cannot be checkpointed (it has no \
                 VariableValue::to_wire); use tensors or numbers",
                self.name()
            ))
        };
        let local = self.save()?.into_value();
        let bytes = local.to_wire().ok_or_else(untransportable)?;
        let DistributedVariable::SyncOnRead(sync_on_read) = self else {
            return Ok(bytes);
        };
        let Some(every) = extended.workers().map(|w| w.exchange(&bytes)).transpose()? else {
            return Ok(bytes);
        };
        let values = every
            .iter()
            .map(|b| local.like_from_wire(b).ok_or_else(untransportable))
            .collect::<Result<Vec<T>, _>>()?;
        // Every worker has as many replicas, so the mean of the workers' means is the mean.
        let value = match sync_on_read.aggregation() {
            VariableAggregation::Sum => T::sum_all(&values)?,
            VariableAggregation::Mean => T::mean_all(&values)?,
            _ => values[0].clone(),
        };
        value.to_wire().ok_or_else(untransportable)
    }

    fn restore_bytes(
        &self,
        extended: &dyn StrategyExtended,
        bytes: &[u8],
    ) -> Result<(), StrategyError> {
        let like = self.save()?.into_value();
        let value = like.like_from_wire(bytes).ok_or_else(|| {
            StrategyError::InvalidArgument(format!(
                "variable {}: the stored value does not fit it (another dtype or shape)",
                self.name()
            ))
        })?;
        let workers = extended.total_replicas() / extended.num_replicas().max(1);
        let value = match self {
            // The local restore divides by the local replica count; the workers share the rest.
            DistributedVariable::SyncOnRead(v)
                if v.aggregation() == VariableAggregation::Sum && workers > 1 =>
            {
                value.divide_by_count(workers)?
            }
            _ => value,
        };
        self.restore(&SavedValue::new(value))?;
        Ok(())
    }
}

/// A job's checkpoints in one directory: [`save`](Self::save) every
/// [`CheckpointOptions::every`] steps, [`restore`](Self::restore) the newest good one.
///
/// ```
/// use distribute_strategy::{CheckpointOptions, Checkpoints, DefaultStrategy, Strategy, VariableOptions};
/// use distribute_input::InputPosition;
///
/// let dir = std::env::temp_dir().join(format!("distribute-doc-ckpt-{}", std::process::id()));
/// let checkpoints = Checkpoints::new(&dir, CheckpointOptions { every: 10, keep: 2 })?;
/// let strategy = DefaultStrategy::new()?;
/// let w = strategy.create_variable("w", 0.0f64, VariableOptions::default())?;
/// for step in 1..=25 {
///     strategy.cross_replica().update(&w, distribute_values::UpdateOp::AssignAdd, &distribute_values::Leaf::Same(1.0))?;
///     checkpoints.save(&strategy, step, &[&w], InputPosition::at_step(step))?;
/// }
/// // A new job: the variable starts at 0 and the newest checkpoint (step 20) restores it.
/// let again = strategy.create_variable("w", 0.0f64, VariableOptions::default())?;
/// let resume = checkpoints.restore(&strategy, &[&again])?.expect("a checkpoint");
/// assert_eq!((resume.step, strategy.cross_replica().read_var(&again)?), (20, 20.0));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), distribute_strategy::StrategyError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Checkpoints {
    dir: PathBuf,
    options: CheckpointOptions,
}

impl Checkpoints {
    /// The checkpoints of directory `dir` (created by the first save, not here).
    ///
    /// Errors: `every` or `keep` of 0.
    pub fn new(dir: impl Into<PathBuf>, options: CheckpointOptions) -> Result<Self, StrategyError> {
        if options.every == 0 || options.keep == 0 {
            return Err(StrategyError::InvalidArgument(format!(
                "checkpoint options {options:?}: `every` and `keep` must be at least 1"
            )));
        }
        Ok(Checkpoints {
            dir: dir.into(),
            options,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of the checkpoint after `step` steps.
    pub fn path_of(&self, step: u64) -> PathBuf {
        self.dir.join(format!("ckpt-{step:010}.dst"))
    }

    /// Whether [`save`](Self::save) writes after `step` steps: a multiple of `every`, above 0.
    pub fn is_due(&self, step: u64) -> bool {
        step > 0 && step.is_multiple_of(self.options.every)
    }

    /// After `step` steps, when [`is_due`](Self::is_due): saves `variables` and the input
    /// position. Every worker calls it, for the same variables in the same order (sync-on-read
    /// variables aggregate across workers); the chief alone writes, atomically, and deletes all
    /// but the newest `keep` checkpoints. Gives the file written on the chief, `None`
    /// elsewhere and when not due.
    ///
    /// Errors: two variables of one name, a value type without `VariableValue::to_wire`, and
    /// the chief's I/O errors, naming the file (the chief's alone: in a multi-worker job the
    /// chief's run then ends, and with it the job).
    pub fn save<S: Strategy + ?Sized>(
        &self,
        strategy: &S,
        step: u64,
        variables: &[&dyn CheckpointVariable],
        input: InputPosition,
    ) -> Result<Option<PathBuf>, StrategyError> {
        if !self.is_due(step) {
            return Ok(None);
        }
        let extended = strategy.extended();
        let mut names = BTreeSet::new();
        let mut payload = Vec::new();
        payload.extend(input.epoch.to_le_bytes());
        payload.extend(input.step.to_le_bytes());
        payload.extend(
            u32::try_from(variables.len())
                .unwrap_or(u32::MAX)
                .to_le_bytes(),
        );
        for variable in variables {
            let name = variable.checkpoint_name();
            if !names.insert(name) {
                return Err(StrategyError::InvalidArgument(format!(
                    "two variables named {name} in one checkpoint: give them different names"
                )));
            }
            let bytes = variable.saved_bytes(extended)?;
            put_text(&mut payload, name);
            put_text(&mut payload, &variable.signature());
            payload.extend((bytes.len() as u64).to_le_bytes());
            payload.extend(bytes);
        }
        if !extended.should_checkpoint() {
            return Ok(None);
        }
        let path = self.path_of(step);
        let io = |e: std::io::Error| checkpoint_error(&path, format!("cannot be written: {e}"));
        fs::create_dir_all(&self.dir).map_err(io)?;
        let tmp = self.dir.join(format!("ckpt-{step:010}.dst.tmp"));
        let written = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(&encode(step, &payload))?;
            file.sync_all()?;
            drop(file);
            fs::rename(&tmp, &path)?;
            sync_dir(&self.dir)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io(e));
        }
        self.prune();
        Ok(Some(path))
    }

    /// Restores `variables` from the newest good checkpoint and says where to resume; `None`
    /// when there is none (a fresh start). Every worker calls it: the chief reads the files,
    /// newest first, refusing a torn or corrupt one with a `log` warning naming it and why, and
    /// sends the good one's bytes to every worker. Restores on any number of replicas and
    /// workers.
    ///
    /// Errors (every worker gets one): a variable the checkpoint lacks or whose stored value
    /// does not fit (another dtype or shape), naming the file; the chief's failure to list the
    /// directory.
    pub fn restore<S: Strategy + ?Sized>(
        &self,
        strategy: &S,
        variables: &[&dyn CheckpointVariable],
    ) -> Result<Option<Resume>, StrategyError> {
        let extended = strategy.extended();
        let mine = if extended.should_checkpoint() {
            self.newest_good()
        } else {
            Ok(None)
        };
        // The chief's message: the path's length and the path, then the file; length first,
        // as the exchange needs the same length everywhere. u64::MAX: the chief failed.
        let (message, refused) = match &mine {
            Ok(Some((path, bytes, refused))) => {
                let mut message = Vec::new();
                put_text(&mut message, &path.to_string_lossy());
                message.extend(bytes);
                (message, refused.clone())
            }
            _ => (Vec::new(), Vec::new()),
        };
        let length: u64 = match &mine {
            Err(_) => u64::MAX,
            Ok(_) => message.len() as u64,
        };
        let length = match extended
            .workers()
            .map(|w| w.bytes_from_chief(&length.to_le_bytes()))
            .transpose()?
        {
            Some(chiefs) => u64::from_le_bytes(chiefs.try_into().map_err(|_| {
                StrategyError::Runtime("the chief's checkpoint length is not 8 bytes".into())
            })?),
            None => length,
        };
        mine?;
        if length == u64::MAX {
            return Err(checkpoint_error(
                &self.dir,
                "the chief could not read its checkpoints (its error says why)".into(),
            ));
        }
        if length == 0 {
            return Ok(None);
        }
        let own = if message.is_empty() {
            vec![
                0;
                usize::try_from(length).map_err(|_| {
                    StrategyError::Runtime(format!("a checkpoint of {length} bytes does not fit"))
                })?
            ]
        } else {
            message
        };
        let message = extended
            .workers()
            .map(|w| w.bytes_from_chief(&own))
            .transpose()?
            .unwrap_or(own);
        let mut reader = Reader::new(&message);
        let path = PathBuf::from(
            reader
                .text()
                .ok_or_else(|| checkpoint_error(&self.dir, "the chief's message is cut".into()))?,
        );
        let file = reader.rest();
        let (step, payload) = verify(file).map_err(|reason| checkpoint_error(&path, reason))?;
        let input = restore_payload(extended, payload, variables)
            .map_err(|reason| checkpoint_error(&path, reason))?;
        Ok(Some(Resume {
            step,
            input,
            path,
            refused,
        }))
    }

    /// The checkpoint files, newest first, by the step in their names.
    fn files(&self) -> std::io::Result<Vec<(u64, PathBuf)>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut files = Vec::new();
        for entry in entries {
            let path = entry?.path();
            let step = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("ckpt-")?.strip_suffix(".dst"))
                .and_then(|s| s.parse::<u64>().ok());
            if let Some(step) = step {
                files.push((step, path));
            }
        }
        files.sort_by(|a, b| b.cmp(a));
        Ok(files)
    }

    /// The newest checkpoint whose header and checksum verify, its bytes, and the newer files
    /// refused on the way.
    #[allow(clippy::type_complexity)]
    fn newest_good(
        &self,
    ) -> Result<Option<(PathBuf, Vec<u8>, Vec<(PathBuf, String)>)>, StrategyError> {
        let files = self.files().map_err(|e| {
            checkpoint_error(&self.dir, format!("the directory cannot be listed: {e}"))
        })?;
        let mut refused = Vec::new();
        for (step, path) in files {
            let checked = fs::read(&path)
                .map_err(|e| format!("cannot be read: {e}"))
                .and_then(|bytes| match verify(&bytes) {
                    Ok((found, _)) if found != step => Err(format!(
                        "its header says step {found}, its name step {step}"
                    )),
                    Ok(_) => Ok(bytes),
                    Err(reason) => Err(reason),
                });
            match checked {
                Ok(bytes) => return Ok(Some((path, bytes, refused))),
                Err(reason) => {
                    log::warn!(
                        "checkpoint {}: {reason}; refused, trying the previous one",
                        path.display()
                    );
                    refused.push((path, reason));
                }
            }
        }
        Ok(None)
    }

    /// Deletes all but the newest `keep` checkpoints, and temporary files a crash left. A
    /// failure to delete costs disk space only, so it is a warning.
    fn prune(&self) {
        let Ok(files) = self.files() else { return };
        let old = files
            .into_iter()
            .skip(self.options.keep)
            .map(|(_, path)| path);
        // Only the chief writes, one checkpoint at a time: any temporary file left is stale.
        let stale = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|entry| Some(entry.ok()?.path()))
            .filter(|path| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ckpt-") && n.ends_with(".dst.tmp"))
            });
        for path in old.chain(stale.collect::<Vec<_>>()) {
            if let Err(e) = fs::remove_file(&path) {
                log::warn!("checkpoint {}: cannot be deleted: {e}", path.display());
            }
        }
    }
}

/// A checkpoint error naming `path`.
fn checkpoint_error(path: &Path, reason: String) -> StrategyError {
    StrategyError::Checkpoint {
        path: path.to_owned(),
        reason,
    }
}

/// `text`'s length (`u32`) and UTF-8 bytes.
fn put_text(out: &mut Vec<u8>, text: &str) {
    out.extend(u32::try_from(text.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend(text.as_bytes());
}

/// The header, then `payload`.
fn encode(step: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    out.extend(CHECKPOINT_MAGIC);
    out.extend(CHECKPOINT_VERSION.to_le_bytes());
    out.extend(step.to_le_bytes());
    out.extend((payload.len() as u64).to_le_bytes());
    let checksum = checksum(&out[..HASHED_HEADER_BYTES], payload);
    out.extend(checksum.to_le_bytes());
    out.extend(payload);
    out
}

/// The checksum of a checkpoint: FNV-1a of its hashed header, then its payload.
fn checksum(header: &[u8], payload: &[u8]) -> u64 {
    Fnv::new().bytes(header).bytes(payload).0
}

/// The step and payload of a checkpoint file's bytes, or why they are not a good checkpoint.
fn verify(file: &[u8]) -> Result<(u64, &[u8]), String> {
    if file.len() < HEADER_BYTES {
        return Err(format!(
            "{} bytes, shorter than a checkpoint's {HEADER_BYTES}-byte header (a torn write?)",
            file.len()
        ));
    }
    if file[..8] != CHECKPOINT_MAGIC {
        return Err("not a distribute checkpoint (its first bytes are not DSTCKPT)".into());
    }
    let mut reader = Reader::new(&file[8..HEADER_BYTES]);
    let version = reader.u32().unwrap_or_default();
    if version != CHECKPOINT_VERSION {
        return Err(format!(
            "format version {version}, this build reads version {CHECKPOINT_VERSION}"
        ));
    }
    let step = reader.u64().unwrap_or_default();
    let length = reader.u64().unwrap_or_default();
    let payload = &file[HEADER_BYTES..];
    if payload.len() as u64 != length {
        return Err(format!(
            "its header announces {length} payload bytes, the file has {} (torn or truncated)",
            payload.len()
        ));
    }
    let stored = reader.u64().unwrap_or_default();
    if checksum(&file[..HASHED_HEADER_BYTES], payload) != stored {
        return Err("its checksum does not match its contents (corrupt)".into());
    }
    Ok((step, payload))
}

/// Restores `variables` from a verified payload; gives the input position.
fn restore_payload(
    extended: &dyn StrategyExtended,
    payload: &[u8],
    variables: &[&dyn CheckpointVariable],
) -> Result<InputPosition, String> {
    let cut = || "its payload is cut short (written by another build?)".to_owned();
    let mut reader = Reader::new(payload);
    let epoch = reader.u64().ok_or_else(cut)?;
    let step = reader.u64().ok_or_else(cut)?;
    let count = reader.u32().ok_or_else(cut)?;
    let mut stored = Vec::new();
    for _ in 0..count {
        let name = reader.text().ok_or_else(cut)?;
        let signature = reader.text().ok_or_else(cut)?;
        let length = reader.u64().ok_or_else(cut)?;
        let bytes = reader.take(length).ok_or_else(cut)?;
        stored.push((name, signature, bytes));
    }
    for variable in variables {
        let name = variable.checkpoint_name();
        let Some((_, signature, bytes)) = stored.iter().find(|(n, _, _)| *n == name) else {
            let names: Vec<&str> = stored.iter().map(|(n, _, _)| *n).collect();
            return Err(format!(
                "it has no variable {name} (it has {names:?}); restore the variables it was \
                 saved with, or start in another directory"
            ));
        };
        let expected = variable.signature();
        if *signature != expected {
            return Err(format!(
                "variable {name} was saved as {signature}, but is {expected} here"
            ));
        }
        variable
            .restore_bytes(extended, bytes)
            .map_err(|e| e.to_string())?;
    }
    for (name, _, _) in &stored {
        if !variables.iter().any(|v| v.checkpoint_name() == *name) {
            log::warn!("checkpoint: variable {name} is stored but nothing restores it");
        }
    }
    Ok(InputPosition { epoch, step })
}

/// `fsync` of a directory, so a rename in it survives a crash (Unix; elsewhere nothing).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    let _ = dir;
    Ok(())
}

/// Reads little-endian numbers and length-prefixed fields, `None` past the end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn take(&mut self, n: u64) -> Option<&'a [u8]> {
        let n = usize::try_from(n).ok()?;
        if n > self.bytes.len() {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn text(&mut self) -> Option<&'a str> {
        let n = self.u32()?;
        std::str::from_utf8(self.take(u64::from(n))?).ok()
    }

    fn rest(self) -> &'a [u8] {
        self.bytes
    }
}
