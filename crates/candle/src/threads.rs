//! How many threads each CPU replica's candle kernels use, and on which rayon pool.
//!
//! candle's CPU backend sizes its parallelism from the environment, process-wide: its matrix
//! multiplications split work into `RAYON_NUM_THREADS` parts (one per physical core when unset)
//! on the current rayon pool, its convolutions split theirs over the current rayon pool whatever
//! the thread count, and its large element-wise kernels use one process-wide pool of
//! `CANDLE_NUM_THREADS` threads, created on first use, that callers take turns on. N replicas
//! each splitting their products for all C cores of the machine fight for those cores, and
//! their element-wise kernels wait for each other. [`CpuThreads::Auto`] gives each replica its
//! share instead: `t = max(1, C / (local CPU replicas × worker processes on this machine))`, by
//! setting both variables to `t` before the first model is built.
//!
//! "The current rayon pool" of a thread that belongs to no pool is the global one, which every
//! replica of the process would share, as they used to (issue 38): with `t = 1` its one thread
//! ran every replica's convolutions in turn, so 2 replicas of a ConvNet on 2 cores left a core
//! idle while both waited for it, where 2 processes have a pool each. So each replica's thread
//! that the strategy started gets a pool of its own on its first step ([`on_replica_pool`]):
//! `t` threads, the replica's thread being one of them, kept for the thread's life; with
//! `t = 1` that is the replica's thread alone, and every candle kernel runs on it. A replica the
//! strategy runs on the caller's thread (`MirroredStrategy`'s replica 0) does not change that
//! thread, which is the user's: its kernels run on rayon's global pool, built here with `t`
//! threads.

use std::cell::OnceCell;
use std::num::NonZeroUsize;
use std::thread::ThreadId;

use crate::Error;

/// How many threads each CPU replica's candle kernels may use (see the module docs for how).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuThreads {
    /// `max(1, cores / (local CPU replicas × worker processes on this machine))`: the cores this
    /// process may run on (its affinity mask) shared evenly. The strategy's workers say how many
    /// worker processes share this machine; they count when the process is not already bound to
    /// a subset of the cores.
    #[default]
    Auto,
    /// Exactly this many threads per replica.
    PerReplica(NonZeroUsize),
    /// Leave candle's and rayon's settings as they are (the environment decides).
    Unmanaged,
}

/// What [`CpuThreads`] resolved to for one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ThreadPlan {
    /// Threads per replica; `None` for [`CpuThreads::Unmanaged`].
    pub(crate) per_replica: Option<usize>,
}

impl CpuThreads {
    /// The threads each of `replicas` local CPU replicas gets on a process that may use `cores`
    /// cores, shared with `co_workers` worker processes (itself included).
    pub(crate) fn resolve(self, replicas: usize, cores: usize, co_workers: usize) -> ThreadPlan {
        let per_replica = match self {
            CpuThreads::Auto => Some((cores / (replicas.max(1) * co_workers.max(1))).max(1)),
            CpuThreads::PerReplica(n) => Some(n.get()),
            CpuThreads::Unmanaged => None,
        };
        ThreadPlan { per_replica }
    }
}

/// Applies `threads` for `replicas` local CPU replicas of this process, which shares the
/// machine with `on_this_host` worker processes (itself included; the strategy's workers say how
/// many); what each replica got.
pub(crate) fn apply(
    threads: CpuThreads,
    replicas: usize,
    on_this_host: usize,
) -> Result<ThreadPlan, Error> {
    if replicas == 0 {
        return Ok(ThreadPlan { per_replica: None });
    }
    let (cores, bound) = usable_cores();
    let co_workers = if bound { 1 } else { on_this_host };
    let plan = threads.resolve(replicas, cores, co_workers);
    let Some(per_replica) = plan.per_replica else {
        return Ok(plan);
    };
    let value = per_replica.to_string();
    for name in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        if std::env::var(name).ok().as_deref() != Some(value.as_str()) {
            // SAFETY: `std::env` serialises this write with every reader that goes through
            // Rust's `std::env`, which is how candle and rayon read these variables. A thread
            // reading the environment through C's `getenv` at this moment (a C library's own
            // thread) is not covered; `DataParallel::new` documents that, sets a variable only
            // when its value changes (in a program with one model: once, before its first
            // candle kernel), and `CpuThreads::Unmanaged` never writes.
            unsafe { std::env::set_var(name, &value) };
        }
    }
    // The pool of the replica run on the caller's thread (the others make their own). Fails
    // when the global pool already exists (someone used rayon first): that replica then uses
    // that pool.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(per_replica)
        .build_global();
    Ok(plan)
}

thread_local! {
    /// The rayon pool this replica thread is worker 0 of, made on its first step; dropped (its
    /// other threads stopped) when the thread ends.
    static REPLICA_POOL: OnceCell<Option<rayon::ThreadPool>> = const { OnceCell::new() };
}

/// Runs `step` of a replica on this thread, which the strategy started (it is not `caller`, the
/// thread that called `run`), with its candle kernels on the replica's own rayon pool of
/// `per_replica` threads: made on the thread's first step with the thread as its worker 0, so
/// with 1 thread every kernel runs right here. The caller's thread, a GPU replica's (`cpu`
/// false), one already in a rayon pool and [`CpuThreads::Unmanaged`] (`per_replica` `None`)
/// are left as they are. A thread keeps its pool for its life (rayon cannot take a thread out
/// of a pool): a later model on the same strategy's threads uses it, whatever its threads.
pub(crate) fn on_replica_pool<R>(
    per_replica: Option<usize>,
    caller: ThreadId,
    cpu: bool,
    step: impl FnOnce() -> R,
) -> R {
    if let Some(threads) = per_replica
        && cpu
        && std::thread::current().id() != caller
        && rayon::current_thread_index().is_none()
    {
        REPLICA_POOL.with(|pool| {
            pool.get_or_init(|| {
                // On failure (no thread could be started) the replica keeps the global pool.
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("replica-pool-{i}"))
                    .use_current_thread()
                    .build()
                    .ok()
            });
        });
    }
    step()
}

/// The cores this process may run on, and whether that is fewer than the machine's (a launcher
/// bound it).
fn usable_cores() -> (usize, bool) {
    let usable = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|list| count_cpu_list(list.trim()));
    (usable, online.is_some_and(|online| usable < online))
}

/// The number of CPUs in a Linux CPU list such as `0-3,8,10-11`.
fn count_cpu_list(list: &str) -> Option<usize> {
    list.split(',').try_fold(0, |count, part| {
        let n = match part.split_once('-') {
            Some((lo, hi)) => hi.parse::<usize>().ok()?.checked_sub(lo.parse().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
        Some(count + n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_shares_the_cores_between_replicas_and_workers() {
        let auto = CpuThreads::Auto;
        // (replicas, cores, co-workers) -> threads per replica
        for ((replicas, cores, workers), want) in [
            ((1, 2, 1), 2),
            ((2, 2, 1), 1),
            ((3, 2, 1), 1),
            ((2, 16, 1), 8),
            ((1, 16, 2), 8),
            ((2, 16, 2), 4),
            ((4, 2, 2), 1),
        ] {
            assert_eq!(
                auto.resolve(replicas, cores, workers).per_replica,
                Some(want),
                "{replicas} replicas, {cores} cores, {workers} workers"
            );
        }
        let four = CpuThreads::PerReplica(NonZeroUsize::new(4).unwrap());
        assert_eq!(four.resolve(2, 2, 1).per_replica, Some(4));
        assert_eq!(CpuThreads::Unmanaged.resolve(2, 2, 1).per_replica, None);
    }

    #[test]
    fn cpu_lists_count_ranges_and_singles() {
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3"), Some(4));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
    }
}
