//! [`Steps`]: the steps of all local input pipelines joined replica by replica. A pipeline
//! that runs out early keeps handing out empty batches while another still has data, so every
//! replica gets a value on every step and all of them see the end on the same step.

use std::sync::Arc;

use distribute_values::{PerReplica, ReplicaDeviceMap};

use super::pipeline::{LocalStep, Plan, zero_rows};
use crate::source::BoxIter;
use crate::{Batch, InputError, PartialBatch};

/// The steps of all local pipelines, joined replica by replica.
pub(super) struct Steps<B: Batch> {
    pub(super) pipelines: Vec<BoxIter<LocalStep<B>>>,
    pub(super) plans: Vec<Arc<Plan<B>>>,
    pub(super) ended: Vec<bool>,
    pub(super) partial: PartialBatch,
    pub(super) device_map: Arc<ReplicaDeviceMap>,
    /// Replicas of all local pipelines.
    pub(super) replicas: usize,
    /// A 0-row batch of the data's structure, once any pipeline has produced a step.
    pub(super) template: Option<Arc<B>>,
    pub(super) done: bool,
}

impl<B: Batch> Steps<B> {
    pub(super) fn next_step(&mut self) -> Option<Result<LocalStep<B>, InputError>> {
        if self.done {
            return None;
        }
        let result = self.join();
        if !matches!(result, Some(Ok(_))) {
            // Stop the prefetch threads now rather than when the iterator is dropped.
            self.stop();
        }
        result
    }

    fn join(&mut self) -> Option<Result<LocalStep<B>, InputError>> {
        if self.pipelines.len() == 1 {
            // One local pipeline, the usual case: its steps pass through as they are.
            let step = if self.ended[0] {
                None
            } else {
                self.pipelines[0].next()
            };
            return match step {
                Some(Ok(step)) => Some(self.remember_structure(&step).map(|()| step)),
                Some(Err(e)) => Some(Err(e)),
                None => {
                    self.ended[0] = true;
                    None
                }
            };
        }
        let mut parts = Vec::with_capacity(self.pipelines.len());
        for (pipeline, ended) in self.pipelines.iter_mut().zip(&mut self.ended) {
            let part = if *ended { None } else { pipeline.next() };
            match part {
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(step)) => parts.push(Some(step)),
                None => {
                    *ended = true;
                    parts.push(None);
                }
            }
        }
        if let Err(e) = self.remember_structure(parts.iter().flatten().next()?) {
            return Some(Err(e));
        }
        if parts.iter().any(Option::is_none) && self.partial == PartialBatch::DropRemainder {
            return None;
        }
        let template = self.template.as_ref()?;
        let mut step = LocalStep::with_capacity(self.replicas, self.partial);
        for (part, plan) in parts.into_iter().zip(&self.plans) {
            match part {
                Some(part) => {
                    step.batches.extend(part.batches);
                    step.real.extend(part.real);
                }
                // A pipeline that ran out while another has data: empty batches (IN-26).
                None => {
                    for device in &plan.placement {
                        if let Err(e) = step.push(&(Arc::clone(template), 0..0), plan, device) {
                            return Some(Err(e));
                        }
                    }
                }
            }
        }
        Some(Ok(step))
    }

    /// Keeps a 0-row batch of the first step's structure, for empty batches later.
    fn remember_structure(&mut self, step: &LocalStep<B>) -> Result<(), InputError> {
        if self.template.is_none()
            && let Some(first) = step.batches.first()
        {
            self.template = Some(zero_rows(first)?);
        }
        Ok(())
    }

    /// Ends the steps here and stops the prefetch threads.
    pub(super) fn stop(&mut self) {
        self.done = true;
        self.pipelines.clear();
    }

    /// Whether some step has shown the data's structure, so empty batches can be made.
    pub(super) fn has_structure(&self) -> bool {
        self.template.is_some()
    }

    /// Empty batches for every local replica, for a step that only other processes have data
    /// for.
    pub(super) fn empty_step(&self) -> Result<LocalStep<B>, InputError> {
        let template = self.template.as_ref().ok_or(InputError::NoBatchToImitate)?;
        let mut step = LocalStep::with_capacity(self.replicas, self.partial);
        for plan in &self.plans {
            for device in &plan.placement {
                step.push(&(Arc::clone(template), 0..0), plan, device)?;
            }
        }
        Ok(step)
    }

    pub(super) fn per_replica(&self, step: LocalStep<B>) -> Result<PerReplica<B>, InputError> {
        Ok(PerReplica::new(Arc::clone(&self.device_map), step.batches)?)
    }
}
