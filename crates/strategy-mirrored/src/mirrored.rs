//! [`MirroredStrategy`]: synchronous data parallelism over the devices of one machine, one
//! persistent thread per replica.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use distribute_collectives::{
    CrossDeviceOps, GroupConfig, ReplicaCollectives, backend::ReducePlan,
};
use distribute_device_spec::{DeviceSpecError, LocalDevices};
use distribute_strategy::{
    MergeArgs, MergeResult, ReplicaContext, RunError, Strategy, StrategyError, StrategyExtended,
};
use distribute_values::{Distributed, Lock, ReplicaDeviceMap, select_replica};

use crate::choose::choose_the_best;
use crate::first_failure::FirstFailure;
use crate::merge::MergeRendezvous;
use crate::pool::ReplicaPool;

/// Settings of a [`MirroredStrategy`].
///
/// One deadline bounds every wait of a step (merge calls and the collectives the strategy
/// builds); cross-device operations are either chosen and built by the strategy, with
/// [`CollectiveTuning`] and that deadline, or given ready-made, with their own. So a collectives
/// deadline that would be silently replaced cannot be written:
///
/// ```compile_fail,E0560
/// use distribute_mirrored::MirroredConfig;
///
/// let config = MirroredConfig {
///     collectives: distribute_collectives::GroupConfig::default(),
///     ..MirroredConfig::default()
/// };
/// ```
#[derive(Clone)]
pub struct MirroredConfig {
    /// How long a replica waits for the others at a collective or `merge_call` before the step
    /// fails with a deadline error naming the missing replicas.
    ///
    /// Most mismatches fail at once (a replica that finished its step, panicked or made another
    /// collective call than its peers); one that only the deadline catches is a replica waiting
    /// in `merge_call` while another waits in a collective.
    ///
    /// At least [`MirroredConfig::MIN_DEADLINE`]; a shorter one is refused when the strategy is
    /// built.
    pub deadline: Duration,
    /// How long idle replica threads (and the caller waiting for them) poll, yielding their core,
    /// before sleeping:
    /// longer makes back-to-back steps start faster, shorter frees the cores sooner.
    pub idle_spin: Duration,
    /// Whether the thread calling `run` runs replica 0 itself (the default), rather than handing
    /// it to a thread of its own and waiting. It does so only when replica 0's device is not a
    /// GPU and the cross-device ops' handles may move between threads; otherwise replica 0
    /// keeps its thread whatever this says. Off, every replica has its own thread, and a step
    /// may rely on running on the same thread every time.
    pub caller_runs_replica_0: bool,
    /// The cross-device operations: chosen by `choose_the_best` (the default), or given.
    pub cross_device_ops: CrossDeviceOpsChoice,
}

impl MirroredConfig {
    /// The shortest [`deadline`](Self::deadline) a strategy accepts. A wait at a barrier
    /// includes the peers' work since the previous one and their scheduling on shared cores, so
    /// a deadline of a few milliseconds or less fails healthy steps; zero fails every one.
    pub const MIN_DEADLINE: Duration = Duration::from_millis(100);
}

impl Default for MirroredConfig {
    fn default() -> Self {
        MirroredConfig {
            deadline: Duration::from_secs(300),
            idle_spin: Duration::from_micros(50),
            caller_runs_replica_0: true,
            cross_device_ops: CrossDeviceOpsChoice::default(),
        }
    }
}

impl fmt::Debug for MirroredConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MirroredConfig")
            .field("deadline", &self.deadline)
            .field("idle_spin", &self.idle_spin)
            .field("caller_runs_replica_0", &self.caller_runs_replica_0)
            .field("cross_device_ops", &self.cross_device_ops)
            .finish()
    }
}

/// Where a [`MirroredStrategy`]'s cross-device operations come from.
#[derive(Clone)]
pub enum CrossDeviceOpsChoice {
    /// `choose_the_best` picks them for the devices and builds them with these settings and the
    /// strategy's [`deadline`](MirroredConfig::deadline).
    Best(CollectiveTuning),
    /// Built by the caller for the strategy's device count; they keep the deadline they were
    /// built with (the strategy's bounds its `merge_call`s).
    Given(Arc<dyn CrossDeviceOps>),
}

impl Default for CrossDeviceOpsChoice {
    fn default() -> Self {
        CrossDeviceOpsChoice::Best(CollectiveTuning::default())
    }
}

impl fmt::Debug for CrossDeviceOpsChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CrossDeviceOpsChoice::Best(tuning) => f.debug_tuple("Best").field(tuning).finish(),
            CrossDeviceOpsChoice::Given(ops) => f.debug_tuple("Given").field(&ops.name()).finish(),
        }
    }
}

/// How the collectives a strategy builds reduce: [`GroupConfig`] without its deadline, which is
/// the strategy's.
///
/// ```
/// use std::time::Duration;
/// use distribute_mirrored::CollectiveTuning;
///
/// let tuning = CollectiveTuning { bytes_per_pack: 1 << 20, ..CollectiveTuning::default() };
/// let group = tuning.with_deadline(Duration::from_secs(5));
/// assert_eq!((group.deadline, group.bytes_per_pack), (Duration::from_secs(5), 1 << 20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveTuning {
    /// Who reduces ([`GroupConfig::plan`]).
    pub plan: ReducePlan,
    /// The size of the buckets small tensors are packed into ([`GroupConfig::bytes_per_pack`]).
    pub bytes_per_pack: usize,
}

impl Default for CollectiveTuning {
    fn default() -> Self {
        let GroupConfig {
            plan,
            bytes_per_pack,
            ..
        } = GroupConfig::default();
        CollectiveTuning {
            plan,
            bytes_per_pack,
        }
    }
}

impl CollectiveTuning {
    /// The collectives' settings with `deadline`.
    pub fn with_deadline(self, deadline: Duration) -> GroupConfig {
        GroupConfig {
            deadline,
            plan: self.plan,
            bytes_per_pack: self.bytes_per_pack,
        }
    }
}

/// Runs one step function on every device of this machine at once, each replica on its own
/// persistent thread, keeping variables mirrored (TF's `tf.distribute.MirroredStrategy`).
///
/// ```
/// use distribute_tensor::Tensor;
/// use distribute_mirrored::MirroredStrategy;
/// use distribute_strategy::Strategy;
/// use distribute_values::ReduceOp;
///
/// let strategy = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
/// // Each replica contributes its id + 1; all_reduce sums them on every replica.
/// let sums = strategy.run(
///     |ctx, ()| {
///         let mine = Tensor::scalar(ctx.device(), ctx.replica_id() as f32 + 1.0);
///         ctx.all_reduce(ReduceOp::Sum, &mine)
///     },
///     &(),
/// )?;
/// for t in sums.local_results() {
///     assert_eq!(t.to_vec::<f32>()?, [3.0]);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MirroredStrategy {
    devices: Arc<ReplicaDeviceMap>,
    local_devices: LocalDevices,
    host: String,
    ops: Arc<dyn CrossDeviceOps>,
    merge: MergeRendezvous,
    /// The replica whose failure came first in the current step: the one `run` reports.
    first_failure: Arc<FirstFailure>,
    pool: ReplicaPool,
    /// Why `ops` were chosen, for `Debug` and logs.
    ops_reason: String,
    /// One `run` at a time, so a failed step's cleanup cannot race the next step.
    running: Lock<()>,
}

impl fmt::Debug for MirroredStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MirroredStrategy")
            .field("devices", &self.devices)
            .field("cross_device_ops", &self.ops.name())
            .field("why", &self.ops_reason)
            .finish()
    }
}

impl MirroredStrategy {
    /// A strategy over `devices` with the default settings: a [`LocalDevices`] list
    /// (`LocalDevices::cpus(2)`), or device names in TF's syntax (`&["/cpu:0", "/cpu:1"]`, a
    /// `Vec<String>`), parsed and checked once.
    ///
    /// ```
    /// use distribute_device_spec::LocalDevices;
    /// use distribute_mirrored::MirroredStrategy;
    /// use distribute_strategy::Strategy;
    ///
    /// let typed = MirroredStrategy::new(LocalDevices::cpus(2))?;
    /// let named = MirroredStrategy::new(&["/cpu:0", "/cpu:1"])?;
    /// assert_eq!(typed.num_replicas_in_sync(), named.num_replicas_in_sync());
    /// # Ok::<(), distribute_strategy::StrategyError>(())
    /// ```
    pub fn new<D>(devices: D) -> Result<Self, StrategyError>
    where
        D: TryInto<LocalDevices>,
        D::Error: Into<DeviceSpecError>,
    {
        Self::with_config(devices, MirroredConfig::default())
    }

    /// A strategy over every local GPU, else the CPU (one replica). GPUs are counted with the
    /// `cuda` feature (a machine without a driver has none); without it there are none.
    pub fn with_default_devices() -> Result<Self, StrategyError> {
        #[cfg(feature = "cuda")]
        let gpus = distribute_tensor::cuda::gpu_count().unwrap_or(0);
        #[cfg(not(feature = "cuda"))]
        let gpus = 0;
        match gpus {
            0 => Self::new(LocalDevices::cpus(1)),
            n => Self::new(LocalDevices::gpus(n)),
        }
    }

    /// A strategy over `devices` with `config`.
    ///
    /// Devices are canonicalized; an empty list, a device named twice (also through different
    /// spellings such as `/gpu:0` and `/device:GPU:0`), local and remote devices mixed, or devices
    /// of several workers are refused, and so is a deadline below
    /// [`MirroredConfig::MIN_DEADLINE`]. `devices` as for [`MirroredStrategy::new`].
    pub fn with_config<D>(devices: D, config: MirroredConfig) -> Result<Self, StrategyError>
    where
        D: TryInto<LocalDevices>,
        D::Error: Into<DeviceSpecError>,
    {
        if config.deadline < MirroredConfig::MIN_DEADLINE {
            return Err(StrategyError::InvalidArgument(format!(
                "MirroredConfig.deadline of {:?} is below the minimum of {:?}: every step would \
                 miss it; give the longest time a replica may wait for its peers",
                config.deadline,
                MirroredConfig::MIN_DEADLINE
            )));
        }
        let devices: LocalDevices = devices.try_into().map_err(|e| invalid_devices(e.into()))?;
        let n = devices.len();
        let (ops, ops_reason) = match config.cross_device_ops {
            CrossDeviceOpsChoice::Given(ops) => (ops, "given in the configuration".to_owned()),
            CrossDeviceOpsChoice::Best(tuning) => {
                choose_the_best(&devices, tuning.with_deadline(config.deadline))?
            }
        };
        if let Some(built_for) = ops.num_replicas().filter(|&k| k != n) {
            return Err(StrategyError::InvalidArgument(format!(
                "the cross-device ops {} are built for {built_for} replicas but the strategy has \
                 {n} devices; build them with the device count",
                ops.name()
            )));
        }
        let pool = ReplicaPool::start(
            Arc::clone(&ops),
            &devices,
            config.idle_spin,
            config.caller_runs_replica_0,
        )?;
        log::info!("MirroredStrategy over {devices}: {ops_reason}");
        let first_failure = Arc::new(FirstFailure::new());
        Ok(MirroredStrategy {
            devices: Arc::new(ReplicaDeviceMap::new(devices.names())?),
            host: devices.host().to_owned(),
            local_devices: devices,
            merge: MergeRendezvous::new(n, config.deadline, Arc::clone(&first_failure))?,
            first_failure,
            ops,
            pool,
            ops_reason,
            running: Lock::new(()),
        })
    }

    /// Why the cross-device operations were chosen.
    pub fn cross_device_ops_reason(&self) -> &str {
        &self.ops_reason
    }
}

/// The strategy's error for a device list it cannot run on (SM-10, SM-02, SM-03, SM-11): an
/// empty or repeating list breaks the strategy's invariant of one replica per device; several
/// workers need a cross-process backend; anything else is the device list's own error.
fn invalid_devices(error: DeviceSpecError) -> StrategyError {
    match error {
        DeviceSpecError::EmptyDeviceList => {
            StrategyError::Invariant("MirroredStrategy needs at least one device".into())
        }
        DeviceSpecError::DuplicateDevice { .. } => {
            StrategyError::Invariant(format!("MirroredStrategy devices: {error}"))
        }
        DeviceSpecError::SeveralWorkers { devices } => StrategyError::Runtime(format!(
            "the devices {devices:?} belong to several workers; this MirroredStrategy runs on \
             one machine (multi-worker training needs a cross-process backend)"
        )),
        other => StrategyError::Device(other),
    }
}

impl StrategyExtended for MirroredStrategy {
    fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        &self.devices
    }

    fn local_devices(&self) -> &LocalDevices {
        &self.local_devices
    }

    fn cross_device_ops(&self) -> &dyn CrossDeviceOps {
        self.ops.as_ref()
    }

    fn host_device(&self) -> &str {
        &self.host
    }

    fn merge(
        &self,
        replica: usize,
        args: MergeArgs,
        merge: &mut dyn FnMut(Vec<MergeArgs>) -> Result<MergeResult, StrategyError>,
    ) -> Result<MergeResult, StrategyError> {
        self.merge.merge(replica, args, merge)
    }
}

impl Strategy for MirroredStrategy {
    fn extended(&self) -> &dyn StrategyExtended {
        self
    }

    fn run_each<D, T, E, F>(&self, step: F, inputs: &D) -> Result<Vec<T>, RunError<E>>
    where
        D: Distributed + Sync,
        T: Send,
        E: Send + fmt::Display,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<T, E> + Sync,
    {
        self.run_replicas(self, step, inputs)
    }
}

/// Where a replica's thread leaves its step's outcome for `run_replicas`.
type Slot<T, E> = Lock<Option<Result<T, Failed<E>>>>;

/// How one replica's step failed.
enum Failed<E> {
    /// The step returned its error.
    Step(E),
    /// The strategy failed it: its inputs did not fit, or it panicked.
    Strategy(StrategyError),
}

impl MirroredStrategy {
    /// Runs `step` once on every replica thread, each with a context over `extended` (this
    /// strategy, or a strategy built on its replica threads, such as the multi-worker strategy),
    /// and returns the replicas' outputs in replica order, or the error of the replica that
    /// failed first ([`RunError::Replica`], its id global through `extended`), or the
    /// strategy's. For authors of strategies; a user calls [`Strategy::run_each`] or
    /// [`Strategy::run`].
    pub fn run_replicas<D, T, E, F>(
        &self,
        extended: &dyn StrategyExtended,
        step: F,
        inputs: &D,
    ) -> Result<Vec<T>, RunError<E>>
    where
        D: Distributed + Sync,
        T: Send,
        E: Send,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<T, E> + Sync,
    {
        if ReplicaPool::on_replica_thread() {
            return Err(RunError::Strategy(StrategyError::Runtime(
                "run was called from inside a replica's step; use merge_call to reach \
                 cross-replica context"
                    .into(),
            )));
        }
        let _one_at_a_time = self.running.lock();
        let n = self.devices.num_replicas();
        let outputs: Vec<Slot<T, E>> = (0..n).map(|_| Lock::new(None)).collect();
        // Every replica is idle here, so the rendezvous can be cleared unconditionally: a step
        // that swallowed a collective error (which aborts the group) must not poison the next.
        self.ops.reset();
        self.ops.begin_step();
        self.merge.reset();
        self.merge.begin_step();
        self.first_failure.reset();
        let job = |replica: usize, collectives: &dyn ReplicaCollectives| {
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let input = select_replica::<D::Local>(replica, inputs)
                    .map_err(|e| Failed::Strategy(e.into()))?;
                let ctx = ReplicaContext::new(replica, extended, collectives);
                step(&ctx, input).map_err(Failed::Step)
            }))
            .unwrap_or_else(|payload| {
                Err(Failed::Strategy(StrategyError::ReplicaPanicked {
                    replica,
                    message: panic_message(payload.as_ref()),
                }))
            });
            if result.is_err() {
                // Recorded before the others are released, so the first record is a root cause.
                self.first_failure.record(replica);
                let reason = format!("replica {replica} failed");
                self.ops.abort(&reason);
                self.merge.abort(&reason);
            }
            self.ops.replica_finished(replica);
            self.merge.finish(replica);
            *outputs[replica].lock() = Some(result);
        };
        self.pool.execute(&job)?;
        let mut results: Vec<Result<T, Failed<E>>> = outputs
            .into_iter()
            .enumerate()
            .map(|(replica, slot)| {
                slot.into_inner()
                    // The job panicked after the step (in a cross-device ops hook) before storing.
                    .unwrap_or_else(|| {
                        Err(Failed::Strategy(StrategyError::ReplicaPanicked {
                            replica,
                            message: "a cross-device operations hook panicked after the step"
                                .into(),
                        }))
                    })
            })
            .collect();
        let root = self
            .first_failure
            .get()
            .or_else(|| results.iter().position(Result::is_err));
        if let Some(root) = root {
            return Err(match results.swap_remove(root) {
                Err(Failed::Step(error)) => RunError::Replica {
                    replica: extended.first_replica_id() + root,
                    error,
                },
                Err(Failed::Strategy(error)) => RunError::Strategy(error),
                Ok(_) => RunError::Strategy(StrategyError::Invariant(format!(
                    "replica {root} was recorded as failed but returned a result"
                ))),
            });
        }
        Ok(results.into_iter().filter_map(Result::ok).collect())
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned())
}
