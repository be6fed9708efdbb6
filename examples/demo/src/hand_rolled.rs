//! The demo's training loop written by hand, without `distribute`: the floor that
//! `cargo xtask bench strategy` measures [`crate::mirrored::train`] against.
//!
//! It is close to the least a data-parallel step on threads can do, so its speedup from 1 to N
//! replicas is a measured reference for what this model can gain from more replicas on this
//! machine. A library that keeps TF's model (a step per `run`, an input pipeline, a
//! `merge_call` that updates every copy) does more per step than this:
//!
//! - every global batch is cut into per-replica rows before the clock starts (no input pipeline,
//!   no prefetch thread);
//! - one thread per replica for the whole run (the caller is replica 0), each running its own
//!   loop: there is no per-step dispatch and no end-of-step join;
//! - a step is the replica's gradient sums ([`ParamSlices::gradient_sums`], the kernel the
//!   strategy's step calls), a deposit in its slot, **one** barrier, then the sum of every
//!   replica's slot and the momentum update of the replica's own copy of the weights: no
//!   `merge_call`, no update of other replicas' copies, no allocation outside the gradient
//!   kernel;
//! - the barrier spins on plain loads and never yields, which only holds up while every replica
//!   has a core of its own. No `pause` hint, as in the library's rendezvous: in a virtual
//!   machine a run of them exits to the hypervisor, which takes the core away.
//!
//! The sums and the update are the mirrored step's, in the same order, so the weights it trains
//! are the same bits as [`crate::mirrored::train`]'s; the bench checks that.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Result, anyhow, ensure};
use distribute::input::split_sizes;
use distribute::values::Lock;
use ndarray::{ArrayView1, ArrayView2, s};

use crate::Config;
use crate::data::{FEATURES, WineData};
use crate::mirrored::training_batches;
use crate::model::{ParamSlices, Params};

/// What a replica whose peer failed reports: a consequence, not the cause.
const PEER_FAILED: &str = "another replica of the hand-written loop failed";

/// What a hand-written run ends with.
#[derive(Debug, Clone)]
pub struct HandRolled {
    /// Replica 0's copy of the final weights.
    pub params: Params,
    /// Steps per second of the timed loop.
    pub steps_per_s: f64,
}

/// One replica's rows of one step: features, row-major, and scores.
struct Rows {
    x: Vec<f32>,
    y: Vec<f32>,
}

/// A barrier of `n` threads that spin. `generation` counts completed barriers; `failed` ends
/// every wait, so that a replica that fails does not leave the others spinning for ever.
struct SpinBarrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    failed: AtomicBool,
}

impl SpinBarrier {
    fn new(n: usize) -> Self {
        SpinBarrier {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
        }
    }

    /// Waits for every thread; false when a thread failed instead.
    fn wait(&self) -> bool {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.store(generation + 1, Ordering::Release);
            return true;
        }
        while self.generation.load(Ordering::Acquire) == generation {
            if self.failed.load(Ordering::Relaxed) {
                return false;
            }
        }
        true
    }
}

/// Marks the barrier failed when a replica's loop panics, so that the others stop waiting for
/// it (the scope that runs them joins every thread, so one spinning for ever would hang it).
struct FailOnUnwind<'a>(&'a SpinBarrier);

impl Drop for FailOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, Ordering::Relaxed);
        }
    }
}

/// Trains the demo's model on `config.devices.len()` replicas with the loop described in the
/// module documentation. More replicas than cores would spin each other off the cores, so
/// that is refused.
pub fn train_hand_rolled(config: &Config, data: &WineData) -> Result<HandRolled> {
    let replicas = config.devices.len();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    ensure!(
        (1..=cores).contains(&replicas),
        "the hand-written loop spins, so it needs a core per replica: {replicas} replicas on \
         {cores} cores"
    );
    ensure!(
        config.steps > 0 && config.hidden > 0,
        "steps and hidden units must be positive"
    );
    // The mirrored run's global batches, cut as its input pipeline cuts them.
    let mut steps: Vec<Vec<Rows>> = Vec::with_capacity(config.steps);
    for batch in training_batches(config, &data.train, "/cpu:0")?
        .iter()
        .take(config.steps)
    {
        let (x, y) = batch?;
        let (x, y) = (
            x.view::<f32, ndarray::Ix2>()?,
            y.view::<f32, ndarray::Ix1>()?,
        );
        let mut start = 0;
        let mut per_replica = Vec::with_capacity(replicas);
        for rows in split_sizes(y.len(), replicas) {
            per_replica.push(Rows {
                x: x.slice(s![start..start + rows, ..])
                    .iter()
                    .copied()
                    .collect(),
                y: y.slice(s![start..start + rows]).to_vec(),
            });
            start += rows;
        }
        steps.push(per_replica);
    }
    ensure!(
        steps.len() == config.steps,
        "the input ended after {} steps",
        steps.len()
    );

    let mean_score = data.train.y.iter().sum::<f32>() / data.train.rows() as f32;
    let init = Params::init(config.hidden, mean_score, config.seed);
    let sums_len = init.flat().len() + 2;
    // Two sets of slots, used by alternate steps: a replica may deposit step s + 1's sums
    // while a slower one still reads step s's, never further ahead (the barrier sees to it). A
    // replica that panics mid-deposit fails the barrier, so no one reads its half-written slot.
    let slots: [Vec<Lock<Vec<f64>>>; 2] = std::array::from_fn(|_| {
        (0..replicas)
            .map(|_| Lock::new(vec![0.0; sums_len]))
            .collect()
    });
    let barrier = SpinBarrier::new(replicas);
    let run = |replica: usize| -> Result<(Params, f64)> {
        let _unwinding = FailOnUnwind(&barrier);
        let result = replica_loop(replica, config, &init, &steps, &slots, &barrier);
        if result.is_err() {
            barrier.failed.store(true, Ordering::Relaxed);
        }
        result
    };
    let results = std::thread::scope(|scope| {
        let others: Vec<_> = (1..replicas)
            .map(|replica| scope.spawn(move || run(replica)))
            .collect();
        let mut results = vec![run(0)];
        for other in others {
            results.push(other.join().unwrap_or_else(|_| {
                Err(anyhow!(
                    "a replica thread of the hand-written loop panicked"
                ))
            }));
        }
        results
    });
    let mut errors = Vec::new();
    let mut mine = None;
    for (replica, result) in results.into_iter().enumerate() {
        match result {
            Ok(done) if replica == 0 => mine = Some(done),
            Ok(_) => {}
            Err(error) => errors.push(error),
        }
    }
    if !errors.is_empty() {
        // The error of the replica that failed, not the others' PEER_FAILED.
        let cause = errors
            .iter()
            .position(|e| e.to_string() != PEER_FAILED)
            .unwrap_or(0);
        return Err(errors.swap_remove(cause));
    }
    let (params, seconds) =
        mine.ok_or_else(|| anyhow!("replica 0 of the hand-written loop reported nothing"))?;
    Ok(HandRolled {
        params,
        steps_per_s: config.steps as f64 / seconds,
    })
}

/// One replica's whole run: its final weights and the seconds its steps took.
fn replica_loop(
    replica: usize,
    config: &Config,
    init: &Params,
    steps: &[Vec<Rows>],
    slots: &[Vec<Lock<Vec<f64>>>; 2],
    barrier: &SpinBarrier,
) -> Result<(Params, f64)> {
    let hidden = config.hidden;
    let (w1_len, b_len) = (FEATURES * hidden, hidden);
    let mut weights = init.flat();
    let mut velocity = vec![0.0f32; weights.len()];
    let mut total = vec![0.0f64; weights.len() + 2];
    let (lr, momentum, batch) = (config.learning_rate, config.momentum, config.global_batch);
    // Every thread starts the clock together.
    ensure!(barrier.wait(), PEER_FAILED);
    let started = Instant::now();
    for (step, per_replica) in steps.iter().enumerate() {
        let rows = &per_replica[replica];
        let params = ParamSlices::from_flat(&weights, hidden)?;
        let x = ArrayView2::from_shape((rows.y.len(), FEATURES), &rows.x)?;
        let (grads, squared_error) = params.gradient_sums(x, ArrayView1::from(&rows.y))?;
        {
            let mut slot = slots[step % 2][replica].lock();
            let parts = [&grads.w1[..], &grads.b1, &grads.w2, &[grads.b2]];
            for (to, from) in slot.iter_mut().zip(parts.into_iter().flatten()) {
                *to = *from;
            }
            slot[w1_len + 2 * b_len + 1] = squared_error;
            slot[w1_len + 2 * b_len + 2] = rows.y.len() as f64;
        }
        ensure!(barrier.wait(), PEER_FAILED);
        // Added in replica order, as the strategy's all-reduce adds them.
        for (r, slot) in slots[step % 2].iter().enumerate() {
            let slot = slot.lock();
            if r == 0 {
                total.copy_from_slice(&slot);
            } else {
                for (t, s) in total.iter_mut().zip(slot.iter()) {
                    *t += *s;
                }
            }
        }
        let total_rows = total[weights.len() + 1];
        ensure!(
            total_rows == batch as f64,
            "the replicas' batches add up to {total_rows} rows, not {batch}"
        );
        for ((w, v), sum) in weights.iter_mut().zip(velocity.iter_mut()).zip(&total) {
            *v = *v * momentum + (sum / total_rows) as f32;
            *w -= *v * lr;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok((Params::from_flat(&weights, hidden)?, seconds))
}
