//! [`DefaultStrategy`]: one replica on the host CPU, run on the caller's thread — TF's default
//! strategy, with its identity semantics (`merge_call` runs at once, reductions of one replica
//! are the value itself).

use std::sync::Arc;

use distribute_collectives::{CrossDeviceOps, GroupConfig, ReductionToOneDevice};
use distribute_device_spec::{DEFAULT_HOST, LocalDevices};
use distribute_values::{Distributed, ReplicaDeviceMap, select_replica};

use crate::context::{MergeArgs, MergeResult, ReplicaContext, StrategyExtended};
use crate::{RunError, Strategy, StrategyError};

/// One replica on `/job:localhost/replica:0/task:0/device:CPU:0`, stepping on the caller's thread.
///
/// ```
/// use distribute_strategy::{DefaultStrategy, Strategy};
/// use distribute_values::Leaf;
///
/// let strategy = DefaultStrategy::new()?;
/// let out = strategy.run(
///     |ctx, ()| {
///         let merged: String = ctx.merge_call("bar".to_owned(), |_, s: Leaf<String>| {
///             let Leaf::Same(s) = s else { unreachable!("one replica") };
///             Ok(Leaf::Same(format!("foo_{s}")))
///         })?;
///         Ok(merged)
///     },
///     &(),
/// )?;
/// assert_eq!(out, Leaf::Same("foo_bar".to_owned()));
/// # Ok::<(), distribute_strategy::StrategyError>(())
/// ```
#[derive(Debug)]
pub struct DefaultStrategy {
    devices: Arc<ReplicaDeviceMap>,
    local_devices: LocalDevices,
    ops: ReductionToOneDevice,
}

impl DefaultStrategy {
    /// The default strategy.
    pub fn new() -> Result<Self, StrategyError> {
        Ok(DefaultStrategy {
            devices: Arc::new(ReplicaDeviceMap::new([DEFAULT_HOST])?),
            local_devices: LocalDevices::new([DEFAULT_HOST])?,
            ops: ReductionToOneDevice::new(1, GroupConfig::default())?,
        })
    }
}

impl StrategyExtended for DefaultStrategy {
    fn device_map(&self) -> &Arc<ReplicaDeviceMap> {
        &self.devices
    }

    fn local_devices(&self) -> &LocalDevices {
        &self.local_devices
    }

    fn cross_device_ops(&self) -> &dyn CrossDeviceOps {
        &self.ops
    }

    fn host_device(&self) -> &str {
        DEFAULT_HOST
    }

    fn merge(
        &self,
        _replica: usize,
        args: MergeArgs,
        merge: &mut dyn FnMut(Vec<MergeArgs>) -> Result<MergeResult, StrategyError>,
    ) -> Result<MergeResult, StrategyError> {
        merge(vec![args])
    }
}

impl Strategy for DefaultStrategy {
    fn extended(&self) -> &dyn StrategyExtended {
        self
    }

    fn run_each<D, T, E, F>(&self, step: F, inputs: &D) -> Result<Vec<T>, RunError<E>>
    where
        D: Distributed + Sync,
        T: Send,
        E: Send + std::fmt::Display,
        F: Fn(&ReplicaContext<'_>, D::Local) -> Result<T, E> + Sync,
    {
        let input = select_replica::<D::Local>(0, inputs).map_err(StrategyError::from)?;
        // The step runs on the caller's thread, so its collectives handle is made here.
        let collectives = self
            .ops
            .replica_collectives(0)
            .map_err(StrategyError::from)?;
        let ctx = ReplicaContext::new(0, self, collectives.as_ref());
        let output = step(&ctx, input).map_err(|error| RunError::Replica { replica: 0, error })?;
        Ok(vec![output])
    }
}
