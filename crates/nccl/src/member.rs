//! A replica thread's NCCL handle ([`ReplicaCollectives`]): every call first agrees on its
//! agreement [`Record`] with every rank, then runs on the replica's stream (through the
//! [`Communicator`]'s methods, where every raw NCCL call is) and waits for it, polling for
//! aborts and the deadline.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cudarc::driver::CudaSlice;
use cudarc::nccl::result::NcclError;
use distribute_values::ReduceOp;

use distribute_collectives::backend::{Call, Record, Status};
use distribute_collectives::{CollectiveError, ReplicaCollectives};
use distribute_tensor::cuda::{Gpu, GpuArray, driver_error};
use distribute_tensor::kernel::check_op;
use distribute_tensor::{DType, Placement, Tensor};

use crate::communicator::{Backoff, Communicator};
use crate::shared::Shared;

/// A replica's NCCL handle: its communicator and stream.
pub(super) struct NcclMember {
    pub(super) replica: usize,
    pub(super) comm: Communicator,
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for NcclMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NcclMember(replica {}, rank {} of {}, {:?})",
            self.replica, self.comm.rank, self.comm.world, self.comm.gpu
        )
    }
}

impl NcclMember {
    fn gpu(&self) -> &Gpu {
        &self.comm.gpu
    }

    /// Fails when the backend was aborted or this communicator is dead.
    fn check_usable(&self) -> Result<(), CollectiveError> {
        if self.comm.is_aborted() {
            return Err(CollectiveError::Aborted {
                reason: "this replica's NCCL communicator was aborted after an earlier failure; \
                         NCCL cannot continue on it — build a new strategy"
                    .into(),
            });
        }
        if self.shared.aborted.load(Ordering::SeqCst) {
            return Err(self.backend_aborted());
        }
        Ok(())
    }

    /// The error of a backend another replica aborted, with its reason.
    fn backend_aborted(&self) -> CollectiveError {
        CollectiveError::Aborted {
            reason: self.shared.reason.lock().clone(),
        }
    }

    /// Queues NCCL work with `enqueue` (a [`Communicator`] call) and waits for the stream,
    /// giving up at the deadline.
    fn run(
        &self,
        what: &str,
        enqueue: impl FnOnce() -> Result<(), NcclError>,
    ) -> Result<(), CollectiveError> {
        self.check_usable()?;
        self.gpu().bind_to_thread()?;
        let stream = self.gpu().stream();
        let start = Instant::now();
        if let Err(e) = enqueue() {
            // A failed enqueue may leave the communicator half way through a call.
            self.comm.abort();
            return Err(Communicator::error(what, e).into());
        }
        // A non-blocking communicator may still be queuing the call (its first calls connect to
        // the peers, which a frozen one never answers): only once it is queued does an event
        // recorded after it mark its end.
        let stopped = || {
            self.shared
                .aborted
                .load(Ordering::SeqCst)
                .then(|| self.backend_aborted())
        };
        self.comm
            .settle(what, start, self.shared.deadline, &stopped)?;
        let done = stream.record_event(None).map_err(driver_error)?;
        let mut backoff = Backoff::default();
        loop {
            if done.try_is_complete().map_err(driver_error)? {
                return Ok(());
            }
            let failure = if let Err(e) = self.comm.in_progress() {
                Some(CollectiveError::from(Communicator::error(what, e)))
            } else if self.shared.aborted.load(Ordering::SeqCst) {
                Some(self.backend_aborted())
            } else if start.elapsed() >= self.shared.deadline {
                Some(CollectiveError::DeadlineExceeded {
                    op: format!(
                        "NCCL {what} (rank {} of {})",
                        self.comm.rank, self.comm.world
                    ),
                    missing: Vec::new(),
                    waited: start.elapsed(),
                })
            } else {
                None
            };
            if let Some(error) = failure {
                // NCCL kernels waiting for a peer never finish: aborting the communicator is
                // the only way to free the stream.
                self.comm.abort();
                return Err(error);
            }
            backoff.pause();
        }
    }

    /// Gathers every rank's agreement record and fails on every rank alike when they differ,
    /// or when any rank refused its own arguments (`local`, checked before: a rank that returned
    /// early would leave the others waiting in this very call; it sends [`Status::Failed`]).
    fn agree(
        &self,
        what: &str,
        mut mine: Record,
        local: Result<(), CollectiveError>,
    ) -> Result<Vec<Record>, CollectiveError> {
        const W: usize = Record::WORDS;
        let world = self.comm.world;
        if local.is_err() {
            mine.status = Status::Failed;
        }
        let stream = self.gpu().stream();
        let send = stream.clone_htod(&mine.words()).map_err(driver_error)?;
        let mut recv = stream.alloc_zeros::<i64>(W * world).map_err(driver_error)?;
        self.run(&format!("{what} (agreement)"), || {
            self.comm.all_gather(&send, &mut recv, W)
        })?;
        let all = stream.clone_dtoh(&recv).map_err(driver_error)?;
        local?;
        let records = all
            .chunks(W)
            .enumerate()
            .map(|(rank, words)| {
                Record::from_words(words).ok_or_else(|| {
                    CollectiveError::Invariant(format!(
                        "NCCL {what}: rank {rank} sent an agreement record this build cannot \
                         read; every rank must run the same build"
                    ))
                })
            })
            .collect::<Result<Vec<Record>, _>>()?;
        if let Some(rank) = records.iter().position(|r| r.status != Status::Ok) {
            return Err(CollectiveError::InvalidArgument(format!(
                "NCCL {what}: rank {rank} refused its arguments, so every rank fails this call"
            )));
        }
        let first = records[0];
        if let Some((other, record)) = records
            .iter()
            .enumerate()
            .find(|(_, r)| !r.agrees_with(&first))
        {
            return Err(CollectiveError::ReplicaMismatch {
                op: format!("NCCL {what}"),
                call: 0,
                first_replica: 0,
                first: first.to_string(),
                other_replica: other,
                other: record.to_string(),
            });
        }
        Ok(records)
    }

    /// The GPU storage of `tensor` on this replica's GPU.
    fn input(&self, tensor: &Tensor) -> Result<GpuArray, CollectiveError> {
        Ok(tensor.gpu_array_on(self.gpu())?)
    }

    /// A result shaped `shape`, placed like `like` (a host input gets a host result).
    fn output(
        &self,
        like: Option<&Tensor>,
        dtype: DType,
        shape: &[usize],
        bytes: CudaSlice<u8>,
    ) -> Result<Tensor, CollectiveError> {
        let array = GpuArray::new(self.gpu(), dtype, shape, bytes);
        let label = match like {
            Some(t) => t.gpu_label(self.gpu()),
            None => self.gpu().device_name().into(),
        };
        let result = Tensor::from_gpu_array(label, array);
        match like {
            Some(t) if t.placement() == Placement::Host => {
                Ok(result.to_host()?.to_device(t.device()))
            }
            _ => Ok(result),
        }
    }

    fn all_reduce_many(
        &self,
        op: ReduceOp,
        tensors: &[&Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        let local = tensors
            .iter()
            .try_for_each(|t| check_op(op, t.dtype()))
            .map_err(CollectiveError::from);
        self.agree(
            "all_reduce",
            Record::of(Call::AllReduce, Some(op), tensors),
            local,
        )?;
        let inputs = tensors
            .iter()
            .map(|t| self.input(t))
            .collect::<Result<Vec<_>, _>>()?;
        let mut outputs = inputs
            .iter()
            .map(|a| GpuArray::alloc(self.gpu(), a.dtype, &a.shape))
            .collect::<Result<Vec<_>, _>>()?;
        self.run("all_reduce", || {
            self.comm.all_reduce(op, &inputs, &mut outputs)
        })?;
        tensors
            .iter()
            .zip(inputs.iter().zip(outputs))
            .map(|(t, (input, bytes))| self.output(Some(t), input.dtype, &input.shape, bytes))
            .collect()
    }
}

impl ReplicaCollectives for NcclMember {
    fn replica(&self) -> usize {
        self.replica
    }

    fn all_reduce(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        Ok(self.all_reduce_many(op, &[tensor])?.swap_remove(0))
    }

    fn batch_all_reduce(
        &self,
        op: ReduceOp,
        tensors: &[Tensor],
    ) -> Result<Vec<Tensor>, CollectiveError> {
        if tensors.is_empty() {
            return Ok(Vec::new());
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        self.all_reduce_many(op, &refs)
    }

    fn all_gather(&self, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let local = if tensor.rank() == 0 {
            Err(CollectiveError::InvalidArgument(
                "all_gather concatenates along the first axis: a rank-0 tensor has none".into(),
            ))
        } else {
            Ok(())
        };
        let records = self.agree(
            "all_gather",
            Record::of(Call::AllGather, None, &[tensor]),
            local,
        )?;
        let rows: Vec<usize> = records.iter().map(|r| r.rows as usize).collect();
        let max_rows = rows.iter().copied().max().unwrap_or(0);
        let row_elems: usize = tensor.shape()[1..].iter().product();
        let row_bytes = row_elems * tensor.dtype().size_in_bytes();
        let input = self.input(tensor)?;
        let stream = self.gpu().stream().clone();
        // Every rank sends max_rows rows (NCCL needs equal counts): shorter inputs are padded.
        let mut send = GpuArray::alloc_bytes(self.gpu(), max_rows * row_bytes)?;
        if max_rows * row_bytes > 0 {
            stream.memset_zeros(&mut send).map_err(driver_error)?;
            let mine = rows[self.comm.rank] * row_bytes;
            if mine > 0 {
                stream
                    .memcpy_dtod(&input.bytes.slice(..mine), &mut send.slice_mut(..mine))
                    .map_err(driver_error)?;
            }
        }
        let world = self.comm.world;
        let chunk = max_rows * row_bytes;
        let mut gathered = GpuArray::alloc_bytes(self.gpu(), world * chunk)?;
        self.run("all_gather", || {
            if chunk == 0 {
                return Ok(());
            }
            self.comm.all_gather(&send, &mut gathered, chunk)
        })?;
        let total_rows: usize = rows.iter().sum();
        let mut shape = tensor.shape().to_vec();
        shape[0] = total_rows;
        let mut out = GpuArray::alloc(self.gpu(), tensor.dtype(), &shape)?;
        let mut at = 0;
        for (rank, &r) in rows.iter().enumerate() {
            let len = r * row_bytes;
            if len > 0 {
                let from = rank * chunk;
                stream
                    .memcpy_dtod(
                        &gathered.slice(from..from + len),
                        &mut out.slice_mut(at..at + len),
                    )
                    .map_err(driver_error)?;
            }
            at += len;
        }
        self.output(Some(tensor), tensor.dtype(), &shape, out)
    }

    fn reduce_scatter(&self, op: ReduceOp, tensor: &Tensor) -> Result<Tensor, CollectiveError> {
        let world = self.comm.world;
        let rows = tensor.shape().first().copied().unwrap_or(0);
        let local = check_op(op, tensor.dtype()).map_err(CollectiveError::from).and_then(|()| {
            if tensor.rank() == 0 || rows % world != 0 {
                return Err(CollectiveError::InvalidArgument(format!(
                    "reduce_scatter needs a first dimension divisible by the {world} ranks, got \
                     shape {:?}",
                    tensor.shape()
                )));
            }
            Ok(())
        });
        self.agree(
            "reduce_scatter",
            Record::of(Call::ReduceScatter, Some(op), &[tensor]),
            local,
        )?;
        let input = self.input(tensor)?;
        let mut shape = tensor.shape().to_vec();
        shape[0] = rows / world;
        let count: usize = shape.iter().product();
        let mut out = GpuArray::alloc(self.gpu(), tensor.dtype(), &shape)?;
        self.run("reduce_scatter", || {
            if count == 0 {
                return Ok(());
            }
            self.comm
                .reduce_scatter(op, tensor.dtype(), &input.bytes, &mut out, count)
        })?;
        self.output(Some(tensor), tensor.dtype(), &shape, out)
    }

    fn broadcast(&self, root: usize, tensor: Option<&Tensor>) -> Result<Tensor, CollectiveError> {
        // The root's dtype and shape go first (the others do not know them): rank, dtype, dims.
        const MAX_RANK: usize = 14;
        let world = self.comm.world;
        let is_root = self.comm.rank == root;
        let tensor = tensor.filter(|_| is_root);
        let local = if root >= world {
            Err(CollectiveError::InvalidArgument(format!(
                "broadcast root {root} is out of range for {world} ranks"
            )))
        } else if is_root && tensor.is_none() {
            Err(CollectiveError::InvalidArgument(format!(
                "broadcast: the root rank {root} passed no tensor"
            )))
        } else if tensor.is_some_and(|t| t.rank() > MAX_RANK) {
            Err(CollectiveError::InvalidArgument(format!(
                "NCCL broadcast supports tensors of rank up to {MAX_RANK}"
            )))
        } else {
            Ok(())
        };
        // Every rank must name the same root; only the root knows the tensor.
        let record = match tensor {
            Some(t) => Record::of(Call::Broadcast, None, &[t]),
            None => Record::bare(Call::Broadcast, Status::Ok),
        };
        self.agree("broadcast", record.with_extra(root as i64), local)?;
        let mut header = [0i64; MAX_RANK + 2];
        if let Some(t) = tensor {
            header[0] = t.rank() as i64;
            header[1] = t.dtype() as i64;
            for (slot, &d) in header[2..].iter_mut().zip(t.shape()) {
                *slot = d as i64;
            }
        }
        let stream = self.gpu().stream().clone();
        let mut meta = stream.clone_htod(&header).map_err(driver_error)?;
        self.run("broadcast (shape)", || {
            self.comm
                .broadcast(root, DType::I64, None, &mut meta, MAX_RANK + 2)
        })?;
        let header = stream.clone_dtoh(&meta).map_err(driver_error)?;
        let rank = usize::try_from(header[0])
            .ok()
            .filter(|&r| r <= MAX_RANK)
            .ok_or_else(|| {
                CollectiveError::Invariant(format!("broadcast header names rank {}", header[0]))
            })?;
        let dtype = DType::ALL
            .into_iter()
            .find(|d| *d as i64 == header[1])
            .ok_or_else(|| CollectiveError::Invariant("broadcast header names no dtype".into()))?;
        let shape: Vec<usize> = header[2..2 + rank].iter().map(|&d| d as usize).collect();
        let count: usize = shape.iter().product();
        let mut out = GpuArray::alloc(self.gpu(), dtype, &shape)?;
        let input = tensor.map(|t| self.input(t)).transpose()?;
        self.run("broadcast", || {
            if count == 0 {
                return Ok(());
            }
            let send = input.as_ref().map(|a| &*a.bytes);
            self.comm.broadcast(root, dtype, send, &mut out, count)
        })?;
        self.output(tensor, dtype, &shape, out)
    }
}
