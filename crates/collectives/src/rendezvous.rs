//! [`Rendezvous`]: a reusable barrier for the N replica threads of one process, with a deadline,
//! an abort switch and knowledge of which replicas have finished their step.
//!
//! It is the one synchronisation primitive of the in-process backends: collective calls
//! ([`crate::backend::CollectiveGroup`]) and the strategy layer's `merge_call` both meet here.
//!
//! Waiting spins briefly, then yields, then sleeps on a condition variable, so two replicas on
//! two cores meet in well under a microsecond while eight replicas on two cores do not starve
//! each other. A wait ends with an error, never a hang, when the deadline passes (the group is
//! then aborted, naming the replicas that never came), when the group is aborted (a replica
//! failed), or when a replica that has not arrived has already finished its step (it never will).

use std::sync::Condvar;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use distribute_values::Lock;

use crate::CollectiveError;

/// A reusable barrier of a fixed number of replicas.
///
/// ```
/// use std::time::Duration;
/// use distribute_collectives::backend::Rendezvous;
///
/// let rendezvous = Rendezvous::new(2, Duration::from_secs(10))?;
/// let last: Vec<bool> = std::thread::scope(|s| {
///     let handles: Vec<_> = (0..2)
///         .map(|r| {
///             let rendezvous = &rendezvous;
///             s.spawn(move || {
///                 let mut was_last = false;
///                 rendezvous.arrive(r, &|| "demo".into(), || was_last = true).unwrap();
///                 was_last
///             })
///         })
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect()
/// });
/// assert_eq!(last.iter().filter(|l| **l).count(), 1, "exactly one replica arrives last");
/// # Ok::<(), distribute_collectives::CollectiveError>(())
/// ```
#[derive(Debug)]
pub struct Rendezvous {
    num_replicas: usize,
    deadline: Duration,
    /// The barrier's whole state in one word, so that arriving, completing and aborting are each
    /// one atomic step and a barrier's outcome is all-or-nothing: the replicas arrived at the
    /// current barrier (low 32 bits), the aborted flag (bit 32), and the number of completed
    /// barriers (the bits above), which waiters watch.
    state: AtomicU64,
    /// For each replica, 1 + the generation of the barrier it last arrived at, so a failure can
    /// name the replicas that never came.
    progress: Box<[AtomicU64]>,
    /// Replicas that have finished their step and will arrive at no further barrier this step.
    finished: Box<[AtomicBool]>,
    /// Why it was aborted; locked while the aborted flag is set, so anyone who sees the flag
    /// finds the reason. Only ever replaced whole, and cleared by `reset` before the next step.
    abort_reason: Lock<Option<String>>,
    /// Barriers completed, for messages.
    sleepers: AtomicUsize,
    sleep_lock: Lock<()>,
    wake: Condvar,
    /// Busy-wait only when every replica can have a core; otherwise spinning steals the core
    /// from the replica everyone waits for. Even then only briefly: the cores may be shared with
    /// the strategy's caller thread or other processes, and a peer that is not running now will
    /// not arrive until this thread yields (20 000 spins, ~0.5 ms, made a 2-replica all-reduce
    /// of 4 KiB take 0.4-0.5 ms instead of 20-30 µs on 2 loaded cores).
    ///
    /// The spin is plain loads, without the `pause` hint: in a virtual machine a run of `pause`
    /// longer than the hypervisor's pause-loop window (4096 cycles by default in KVM, a few
    /// dozen `pause`s) exits to the hypervisor, which takes the core away. On this project's
    /// 2-core VM under load, 256 spins with `pause` made a 4 KiB all-reduce 19 µs, the same spins
    /// without it 4.8 µs (`cargo xtask bench collectives`, same run).
    spin_limit: u32,
}

const ARRIVED: u64 = 0xFFFF_FFFF;
const ABORTED: u64 = 1 << 32;
const GENERATION_SHIFT: u32 = 33;

fn generation_of(state: u64) -> u64 {
    state >> GENERATION_SHIFT
}

fn arrived_of(state: u64) -> usize {
    (state & ARRIVED) as usize
}

fn is_aborted_state(state: u64) -> bool {
    state & ABORTED != 0
}

/// How a wait that could not complete ends.
enum Give {
    /// The barrier completed after all: return normally.
    Completed,
    /// This wait set the aborted flag: return its own error.
    Aborted,
    /// Someone else aborted first: return the group's abort error.
    AlreadyAborted,
    /// Every replica has arrived and the last one is finishing: keep waiting.
    Completing,
}

impl Rendezvous {
    /// A barrier of `num_replicas` (at least 1) replicas whose waits fail after `deadline`.
    pub fn new(num_replicas: usize, deadline: Duration) -> Result<Rendezvous, CollectiveError> {
        if num_replicas == 0 {
            return Err(CollectiveError::InvalidArgument(
                "a rendezvous needs at least one replica".into(),
            ));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Rendezvous {
            num_replicas,
            deadline,
            state: AtomicU64::new(0),
            progress: (0..num_replicas).map(|_| AtomicU64::new(0)).collect(),
            finished: (0..num_replicas).map(|_| AtomicBool::new(false)).collect(),
            abort_reason: Lock::new(None),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Lock::new(()),
            wake: Condvar::new(),
            spin_limit: if num_replicas <= cores { 256 } else { 64 },
        })
    }

    /// The number of replicas.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// How long a replica waits at one barrier.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Arrives at the current barrier as `replica`. The last replica to arrive runs `on_last`
    /// while every other replica waits, then releases them. `what` names the barrier in errors
    /// (it is only called on failure).
    ///
    /// Fails at once on a replica index outside the group. When `on_last` panics the barrier
    /// does not complete: the group is aborted (every waiter gets the error), the last replica
    /// gets [`CollectiveError::Aborted`] naming the panic, and [`Rendezvous::reset`] makes the
    /// rendezvous usable again.
    pub fn arrive(
        &self,
        replica: usize,
        what: &dyn Fn() -> String,
        on_last: impl FnOnce(),
    ) -> Result<(), CollectiveError> {
        self.check_replica(replica)?;
        let mut state = self.state.load(Ordering::SeqCst);
        loop {
            if is_aborted_state(state) {
                return Err(self.aborted_error());
            }
            let generation = generation_of(state);
            self.progress[replica].store(generation + 1, Ordering::SeqCst);
            match self
                .state
                .compare_exchange(state, state + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) if arrived_of(state) + 1 == self.num_replicas => {
                    let completed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(on_last));
                    if let Err(payload) = completed {
                        return Err(self.abort_completion(replica, what, payload.as_ref()));
                    }
                    // Next generation, nobody arrived; an abort that came while `on_last` ran
                    // stays set and fails the next barrier, not this completed one.
                    let _ = self
                        .state
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                            Some(((generation_of(s) + 1) << GENERATION_SHIFT) | (s & ABORTED))
                        });
                    self.wake_all();
                    return Ok(());
                }
                Ok(_) => return self.wait_for_release(generation, what),
                Err(current) => state = current,
            }
        }
    }

    /// Marks `replica` as done with its step: a barrier it has not reached fails at once
    /// instead of waiting for the deadline. [`Rendezvous::begin_step`] clears the marks.
    ///
    /// Fails on a replica index outside the group.
    pub fn finish(&self, replica: usize) -> Result<(), CollectiveError> {
        self.check_replica(replica)?;
        self.finished[replica].store(true, Ordering::SeqCst);
        self.wake_all();
        Ok(())
    }

    fn check_replica(&self, replica: usize) -> Result<(), CollectiveError> {
        if replica >= self.num_replicas {
            return Err(CollectiveError::InvalidArgument(format!(
                "replica {replica} is not in this rendezvous of {} replicas (0..{})",
                self.num_replicas, self.num_replicas
            )));
        }
        Ok(())
    }

    /// The last arrival's `on_last` panicked, so the barrier must not complete: abort it in the
    /// same atomic step that empties it, so the waiters (who see every replica arrived and wait
    /// for the release) see an aborted, not a completing, barrier and return the error.
    fn abort_completion(
        &self,
        replica: usize,
        what: &dyn Fn() -> String,
        payload: &(dyn std::any::Any + Send),
    ) -> CollectiveError {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a non-string payload".to_owned());
        let reason = format!(
            "replica {replica} panicked while completing {}: {message}",
            what()
        );
        {
            let mut current = self.abort_reason.lock();
            current.get_or_insert_with(|| reason.clone());
            let _ = self
                .state
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                    Some((generation_of(s) << GENERATION_SHIFT) | ABORTED)
                });
        }
        self.wake_all();
        CollectiveError::Aborted { reason }
    }

    /// Clears every replica's finished mark; call before the replicas start a new step.
    pub fn begin_step(&self) {
        for flag in self.finished.iter() {
            flag.store(false, Ordering::SeqCst);
        }
    }

    /// Fails every current and future wait with `reason` until [`Rendezvous::reset`]. The first
    /// reason given is kept. A barrier every replica has already reached still completes.
    pub fn abort(&self, reason: impl Into<String>) {
        {
            let mut current = self.abort_reason.lock();
            current.get_or_insert_with(|| reason.into());
            self.state.fetch_or(ABORTED, Ordering::SeqCst);
        }
        self.wake_all();
    }

    /// Why the rendezvous was aborted, if it was.
    pub fn abort_reason(&self) -> Option<String> {
        self.abort_reason.lock().clone()
    }

    /// True once aborted, until reset.
    pub fn is_aborted(&self) -> bool {
        is_aborted_state(self.state.load(Ordering::SeqCst))
    }

    /// Makes an aborted rendezvous usable again. Call it only when no replica is waiting (a
    /// strategy does, after every replica has finished its step).
    pub fn reset(&self) {
        let mut reason = self.abort_reason.lock();
        let generation = generation_of(self.state.load(Ordering::SeqCst));
        self.state
            .store(generation << GENERATION_SHIFT, Ordering::SeqCst);
        *reason = None;
        drop(reason);
        self.begin_step();
    }

    /// Ends this waiter's wait at the barrier of `generation` with `error`, unless the barrier
    /// completed or is completing (every replica arrived); setting the aborted flag in the same
    /// atomic step makes sure no late arrival can complete the barrier afterwards.
    fn give_up(&self, generation: u64, error: &CollectiveError) -> Give {
        let mut reason = self.abort_reason.lock();
        let mut state = self.state.load(Ordering::SeqCst);
        loop {
            if generation_of(state) != generation {
                return Give::Completed;
            }
            if arrived_of(state) == self.num_replicas {
                return Give::Completing;
            }
            if is_aborted_state(state) {
                return Give::AlreadyAborted;
            }
            match self.state.compare_exchange(
                state,
                state | ABORTED,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    reason.get_or_insert_with(|| error.to_string());
                    drop(reason);
                    self.wake_all();
                    return Give::Aborted;
                }
                Err(current) => state = current,
            }
        }
    }

    fn wake_all(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.sleep_lock.lock();
            self.wake.notify_all();
        }
    }

    fn aborted_error(&self) -> CollectiveError {
        CollectiveError::Aborted {
            reason: self.abort_reason().unwrap_or_else(|| "aborted".to_owned()),
        }
    }

    /// The replicas that have not arrived at the barrier of `generation`.
    fn missing(&self, generation: u64) -> Vec<usize> {
        self.progress
            .iter()
            .enumerate()
            .filter(|(_, p)| p.load(Ordering::SeqCst) != generation + 1)
            .map(|(r, _)| r)
            .collect()
    }

    fn wait_for_release(
        &self,
        generation: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), CollectiveError> {
        let released = || generation_of(self.state.load(Ordering::SeqCst)) != generation;
        for _ in 0..self.spin_limit {
            if released() {
                return Ok(());
            }
        }
        let start = Instant::now();
        loop {
            let state = self.state.load(Ordering::SeqCst);
            if generation_of(state) != generation {
                return Ok(());
            }
            let completing = arrived_of(state) == self.num_replicas;
            if is_aborted_state(state) && !completing {
                return Err(self.aborted_error());
            }
            let waited = start.elapsed();
            // Checked without allocating: this runs on every turn of the wait.
            let any_gone = || {
                (0..self.num_replicas).any(|r| {
                    self.progress[r].load(Ordering::SeqCst) != generation + 1
                        && self.finished[r].load(Ordering::SeqCst)
                })
            };
            if !completing && (waited >= self.deadline || any_gone()) {
                let missing = self.missing(generation);
                let gone: Vec<usize> = missing
                    .iter()
                    .copied()
                    .filter(|&r| self.finished[r].load(Ordering::SeqCst))
                    .collect();
                let failure = if !gone.is_empty() {
                    Some(CollectiveError::ReplicaFinished {
                        op: what(),
                        finished: gone,
                    })
                } else if waited >= self.deadline {
                    Some(CollectiveError::DeadlineExceeded {
                        op: what(),
                        missing,
                        waited,
                    })
                } else {
                    None
                };
                if let Some(error) = failure {
                    match self.give_up(generation, &error) {
                        Give::Completed => return Ok(()),
                        Give::Aborted => return Err(error),
                        Give::AlreadyAborted => return Err(self.aborted_error()),
                        Give::Completing => {}
                    }
                }
            }
            if completing || waited < Duration::from_micros(200) {
                // The peers are probably running, just not here yet (or the last one is
                // finishing the barrier).
                std::thread::yield_now();
                continue;
            }
            let guard = self.sleep_lock.lock();
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            if !released() && !self.is_aborted() {
                let nap = self
                    .deadline
                    .saturating_sub(waited)
                    .min(Duration::from_millis(10));
                let _ = self.sleep_lock.wait_timeout(guard, &self.wake, nap);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;

    use super::*;

    fn what() -> String {
        "test barrier".into()
    }

    #[test]
    fn a_replica_outside_the_group_is_an_error_not_a_panic() {
        let rendezvous = Rendezvous::new(2, Duration::from_secs(60)).unwrap();
        for replica in [2, usize::MAX] {
            let err = rendezvous.arrive(replica, &what, || {}).unwrap_err();
            assert!(
                matches!(&err, CollectiveError::InvalidArgument(m) if m.contains("not in this rendezvous of 2")),
                "{err:?}"
            );
            let err = rendezvous.finish(replica).unwrap_err();
            assert!(
                matches!(err, CollectiveError::InvalidArgument(_)),
                "{err:?}"
            );
        }
        // The refused calls changed nothing.
        assert!(!rendezvous.is_aborted());
        rendezvous.finish(1).unwrap();
    }

    /// Each replica arrives on its own thread with an `on_last` that panics; the results come
    /// back over a channel so that a barrier left "completing" forever fails the test (after a
    /// generous bound) instead of hanging it.
    fn arrive_all(rendezvous: &Arc<Rendezvous>, panic_on_last: bool) -> Vec<Result<(), String>> {
        let (send, receive) = mpsc::channel();
        for replica in 0..rendezvous.num_replicas() {
            let (rendezvous, send) = (Arc::clone(rendezvous), send.clone());
            std::thread::spawn(move || {
                let result = rendezvous.arrive(replica, &what, || {
                    if panic_on_last {
                        panic!("on_last bug");
                    }
                });
                let _ = send.send(result.map_err(|e| e.to_string()));
            });
        }
        (0..rendezvous.num_replicas())
            .map(|_| {
                receive
                    .recv_timeout(Duration::from_secs(120))
                    .expect("a replica hung at a barrier whose on_last panicked")
            })
            .collect()
    }

    #[test]
    fn a_panicking_on_last_aborts_the_barrier_and_reset_recovers() {
        let rendezvous = Arc::new(Rendezvous::new(3, Duration::from_secs(600)).unwrap());
        let results = arrive_all(&rendezvous, true);
        for result in &results {
            let message = result.as_ref().unwrap_err();
            assert!(
                message.contains("panicked while completing test barrier: on_last bug"),
                "{message}"
            );
        }
        // Still aborted (a typed error, not a hang) until reset.
        let err = rendezvous.arrive(0, &what, || {}).unwrap_err();
        assert!(matches!(err, CollectiveError::Aborted { .. }), "{err:?}");
        rendezvous.reset();
        assert!(arrive_all(&rendezvous, false).iter().all(Result::is_ok));
    }
}
