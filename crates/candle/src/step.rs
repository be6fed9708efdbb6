//! [`ReplicaStep`]: what a step function sees of its replica (its copy of the model and
//! optimizer, its device, the gradient all-reduce with clipping, the schedule, dropout).

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Optimizer;
use distribute_strategy::ReplicaContext;
use distribute_values::ReduceOp;

use crate::replica::Replica;
use crate::schedule::Schedule;
use crate::shard::{self, ShardOps};
use crate::variables::VarInfo;
use crate::{Error, clip, gradients};

/// What a step function sees of its replica: its copy of the model and optimizer, its device,
/// and the gradient all-reduce.
pub struct ReplicaStep<'a, 'c, M, O> {
    pub(crate) ctx: &'a ReplicaContext<'c>,
    pub(crate) local: usize,
    pub(crate) replica: &'a mut Replica<M, O>,
    pub(crate) manifest: &'a [VarInfo],
    pub(crate) schedule: Option<Schedule>,
    pub(crate) clip_norm: Option<f64>,
    pub(crate) seed: u64,
    /// Dropout calls so far in this step.
    pub(crate) dropouts: std::cell::Cell<u64>,
    /// The dtype the model computes in.
    pub(crate) compute_dtype: DType,
    /// With sharding, the optimizer's piece operations.
    pub(crate) shard_ops: Option<ShardOps<O>>,
}

impl<M, O: Optimizer> ReplicaStep<'_, '_, M, O> {
    /// This replica's copy of the model.
    pub fn model(&self) -> &M {
        &self.replica.model
    }

    /// This replica's copy of the model, to change (a learning-rate schedule inside it, say).
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.replica.model
    }

    /// This replica's optimizer.
    pub fn optimizer_mut(&mut self) -> &mut O {
        &mut self.replica.optimizer
    }

    /// The dtype the model computes in: its variables' (`Config::dtype`), or with mixed
    /// precision bf16 or f16. Inputs go to it before the model (`x.to_dtype(…)`); a loss is
    /// best computed in f32 from logits converted back.
    pub fn compute_dtype(&self) -> DType {
        self.compute_dtype
    }

    /// The candle device this replica's tensors live on.
    pub fn device(&self) -> &Device {
        &self.replica.device
    }

    /// This replica's global id (worker `w`'s local replica `r` is `w·R + r`).
    pub fn replica_id(&self) -> usize {
        self.ctx.replica_id()
    }

    /// This replica's index among this process's replicas (its id on this worker).
    pub fn local_replica(&self) -> usize {
        self.local
    }

    /// The replicas running the step, on every worker.
    pub fn num_replicas_in_sync(&self) -> usize {
        self.ctx.num_replicas_in_sync()
    }

    /// The strategy's replica context: other collectives, `merge_call`.
    pub fn context(&self) -> &ReplicaContext<'_> {
        self.ctx
    }

    /// The model's variables on this replica, sorted by name.
    pub fn vars(&self) -> &[Var] {
        &self.replica.vars
    }

    /// Every variable's gradient in `grads` (from `loss.backward()`) reduced with `op` across all
    /// replicas of all workers, as a `GradStore` for the optimizer. The gradients travel in one
    /// bucket per dtype, in the order of the variables' names; a variable without a gradient on
    /// this replica contributes zeros. The result is bit-identical on every replica.
    ///
    /// `Mean` divides the sum by the number of replicas; for a loss averaged over the *global*
    /// batch (each replica's summed loss divided by the global batch size, TF's
    /// `compute_average_loss`), use `Sum`. A variable that had a gradient on no replica gets
    /// none, so the optimizer leaves it alone, as candle's own step does.
    ///
    /// With one replica in sync the gradients are returned as they are (the sum or mean of one
    /// replica's, bit for bit), on its device. With more, the returned gradients are views of one
    /// buffer per dtype: candle's optimizers only read them, but an in-place candle call
    /// (`slice_set`, `inplace_op*`) on one would write into its neighbours.
    ///
    /// With [`Config::clip_norm`] the reduced gradients are clipped to that global norm
    /// ([`grad_norm`](Self::grad_norm) then says the norm before clipping).
    ///
    /// A sharded model ([`Config::sharding`]) refuses it: its optimizer updates shards, in
    /// [`backward_step`](Self::backward_step) and [`step_accumulated`](Self::step_accumulated).
    pub fn all_reduce_gradients(
        &mut self,
        grads: &GradStore,
        op: ReduceOp,
    ) -> Result<GradStore, Error> {
        if let Some(shards) = &self.replica.shards {
            return Err(Error::InvalidArgument(format!(
                "all_reduce_gradients on a sharded model (Config::sharding {}): its optimizer \
                 holds only its shard's state and cannot step whole variables; update with \
                 backward_step or step_accumulated",
                shards.sharding
            )));
        }
        let local = self.local_gradients(grads)?;
        let reduced = self
            .reduce(&local, op, false)?
            .expect("unscaled gradients are never skipped");
        Ok(gradients::into_store(&self.replica.vars, reduced))
    }

    /// `loss.backward()`, the gradients' all-reduce with `op` (clipped with
    /// [`Config::clip_norm`]), the schedule's rate set on this replica's optimizer
    /// ([`Config::schedule`]) and the optimizer's step: one training step's update. With f16
    /// mixed precision the loss is scaled before `backward` and the reduced gradients unscaled;
    /// a step whose reduced gradients overflowed is skipped, on every replica and worker alike
    /// (it applies no update and does not count in [`updates`](Self::updates)).
    pub fn backward_step(&mut self, loss: &Tensor, op: ReduceOp) -> Result<(), Error> {
        let grads = self.scaled(loss)?.backward()?;
        let local = self.local_gradients(&grads)?;
        drop(grads);
        if self.replica.shards.is_some() {
            return self.sharded_update(&local, op);
        }
        match self.reduce(&local, op, true)? {
            Some(reduced) => {
                let reduced = gradients::into_store(&self.replica.vars, reduced);
                self.update(&reduced)
            }
            None => Ok(()),
        }
    }

    /// `loss` times the loss scale (f16 mixed precision), else `loss`.
    fn scaled(&self, loss: &Tensor) -> Result<Tensor, Error> {
        Ok(match &self.replica.loss_scale {
            Some(s) => (loss * s.scale)?,
            None => loss.clone(),
        })
    }

    /// Each variable's gradient in `grads`, name order, in the dtype of the variable the
    /// optimizer updates (f32 with mixed precision: the model's half-precision gradients
    /// converted).
    fn local_gradients(&self, grads: &GradStore) -> Result<Vec<Option<Tensor>>, Error> {
        self.replica
            .compute_vars()
            .iter()
            .zip(&self.replica.vars)
            .map(|(source, master)| {
                grads
                    .get(source.as_tensor())
                    .map(|g| match g.dtype() == master.dtype() {
                        true => Ok(g.clone()),
                        false => g.to_dtype(master.dtype()).map_err(Error::from),
                    })
                    .transpose()
            })
            .collect()
    }

    /// The current loss scale of f16 mixed precision (the loss is multiplied by it before
    /// `backward`), else `None`.
    pub fn loss_scale(&self) -> Option<f64> {
        self.replica.loss_scale.map(|s| s.scale)
    }

    /// The global norm of the last reduced gradients, before clipping; `None` unless
    /// [`Config::clip_norm`] is set (only clipping takes it) or before the first update. The
    /// same on every replica and worker.
    pub fn grad_norm(&self) -> Option<f64> {
        self.replica.grad_norm
    }

    /// Updates applied to this replica's copy so far (the schedule's position).
    pub fn updates(&self) -> u64 {
        self.replica.updates
    }

    /// `xs` with each element zeroed with probability `p` and the others scaled by
    /// `1 / (1 − p)` (candle's `ops::dropout`, PyTorch's `Dropout` in training mode), with a
    /// mask that is reproducible: drawn from [`Config::seed`], this replica's global id, the
    /// updates applied so far and the number of dropout calls before this one in the step. So
    /// every replica draws its own mask, the same job twice draws the same masks, and a job
    /// resumed from a checkpoint (which restores the update count) draws the masks the
    /// uninterrupted job drew. The mask is made on the host and copied to the replica's device.
    /// In evaluation, call the model without it (candle's `ModuleT::forward_t(xs, false)`).
    ///
    /// candle's own `ops::dropout` and `Dropout` also keep the copies identical (the gradients
    /// are reduced), but draw from a thread-local generator that cannot be seeded: runs differ.
    pub fn dropout(&self, xs: &Tensor, p: f32) -> Result<Tensor, Error> {
        let key = crate::dropout::Key {
            seed: self.seed,
            replica: self.ctx.replica_id() as u64,
            update: self.replica.updates,
            call: self.dropouts.get(),
        };
        self.dropouts.set(key.call + 1);
        crate::dropout::dropout(xs, p, key, &self.replica.device)
    }

    /// The optimizer's step with `grads`, at the schedule's rate for this update.
    fn update(&mut self, grads: &GradStore) -> Result<(), Error> {
        if let Some(schedule) = &self.schedule {
            let rate = schedule.rate(self.replica.updates);
            self.replica.optimizer.set_learning_rate(rate);
        }
        self.replica.optimizer.step(grads)?;
        self.replica.updates += 1;
        self.replica.refresh_compute()
    }

    /// Adds `loss`'s gradients to this replica's accumulator, without talking to any other
    /// replica: gradient accumulation over micro-batches. [`step_accumulated`] then reduces the
    /// sums once and updates.
    ///
    /// [`step_accumulated`]: Self::step_accumulated
    pub fn accumulate(&mut self, loss: &Tensor) -> Result<(), Error> {
        let grads = self.scaled(loss)?.backward()?;
        let local = self.local_gradients(&grads)?;
        let sums = self
            .replica
            .accumulated
            .get_or_insert_with(|| vec![None; self.manifest.len()]);
        for (sum, grad) in sums.iter_mut().zip(local) {
            if let Some(grad) = grad {
                *sum = Some(match sum.take() {
                    Some(s) => s.add(&grad)?.detach(),
                    None => grad.detach(),
                });
            }
        }
        Ok(())
    }

    /// The gradients summed by [`accumulate`](Self::accumulate) since the last update, reduced
    /// with `op` across replicas (one all-reduce), applied by this replica's optimizer; the
    /// accumulator starts again empty. Every replica must call it in the same step.
    pub fn step_accumulated(&mut self, op: ReduceOp) -> Result<(), Error> {
        let sums = self
            .replica
            .accumulated
            .take()
            .unwrap_or_else(|| vec![None; self.manifest.len()]);
        if self.replica.shards.is_some() {
            return self.sharded_update(&sums, op);
        }
        match self.reduce(&sums, op, true)? {
            Some(reduced) => {
                let reduced = gradients::into_store(&self.replica.vars, reduced);
                self.update(&reduced)
            }
            None => Ok(()),
        }
    }

    /// `local` all-reduced with `op`, unscaled when `scaled` and f16 loss scaling is on (`None`:
    /// they overflowed, skip the update), clipped with [`Config::clip_norm`].
    fn reduce(
        &mut self,
        local: &[Option<Tensor>],
        op: ReduceOp,
        scaled: bool,
    ) -> Result<Option<Vec<Option<Tensor>>>, Error> {
        let mut reduced = gradients::all_reduce(
            self.ctx,
            op,
            self.manifest,
            local,
            &self.replica.device,
            &mut self.replica.buckets,
        )?;
        let mut norm = None;
        if let (true, Some(loss_scale)) = (scaled, &mut self.replica.loss_scale) {
            // A power of two: unscaling is exact. The reduced gradients are the same bits on
            // every replica and worker, so is the decision.
            reduced = clip::scale(reduced, 1.0 / loss_scale.scale)?;
            let n = clip::global_norm(self.manifest, &reduced)?;
            loss_scale.record(n.is_finite());
            if !n.is_finite() {
                return Ok(None);
            }
            norm = Some(n);
        }
        let Some(max_norm) = self.clip_norm else {
            return Ok(Some(reduced));
        };
        let norm = match norm {
            Some(n) => n,
            None => clip::global_norm(self.manifest, &reduced)?,
        };
        self.replica.grad_norm = Some(norm);
        clip::scale(reduced, clip::factor(max_norm, norm)).map(Some)
    }

    /// A sharded model's update: `local` reduced into this replica's shards, unscaled (f16: a
    /// step whose gradients overflowed is skipped everywhere) and clipped by the norm of all
    /// shards (the unsharded norm, to the bit), each shard updated with its optimizer state,
    /// and every variable set from the all-gathered shards.
    fn sharded_update(&mut self, local: &[Option<Tensor>], op: ReduceOp) -> Result<(), Error> {
        let ops = self
            .shard_ops
            .expect("a sharded replica's model has its optimizer's piece operations");
        let replica = &mut *self.replica;
        let shards = replica
            .shards
            .as_mut()
            .expect("the caller checked the replica is sharded");
        let (mut parts, present) = shard::reduce(
            self.ctx,
            op,
            self.manifest,
            shards,
            local,
            &replica.device,
            &mut replica.buckets,
        )?;
        let mut norm = None;
        if let Some(loss_scale) = &mut replica.loss_scale {
            parts = scale_parts(parts, 1.0 / loss_scale.scale)?;
            let n = shard::global_norm(self.ctx, shards, &parts)?;
            loss_scale.record(n.is_finite());
            if !n.is_finite() {
                return Ok(());
            }
            norm = Some(n);
        }
        if let Some(max_norm) = self.clip_norm {
            let norm = match norm {
                Some(n) => n,
                None => shard::global_norm(self.ctx, shards, &parts)?,
            };
            replica.grad_norm = Some(norm);
            parts = scale_parts(parts, clip::factor(max_norm, norm))?;
        }
        if let Some(schedule) = &self.schedule {
            replica
                .optimizer
                .set_learning_rate(schedule.rate(replica.updates));
        }
        shard::update(
            self.ctx,
            &ops,
            &mut replica.optimizer,
            shards,
            self.manifest,
            &replica.vars,
            &parts,
            &present,
        )?;
        replica.updates += 1;
        replica.refresh_compute()
    }
}

/// Every shard times `factor`, as [`clip::scale`] scales whole gradients (left as they are when
/// `factor` is 1 or more), so elementwise to the same bits.
fn scale_parts(parts: Vec<Tensor>, factor: f64) -> Result<Vec<Tensor>, Error> {
    if factor >= 1.0 {
        return Ok(parts);
    }
    parts
        .into_iter()
        .map(|p| (p * factor).map_err(Error::from))
        .collect()
}
