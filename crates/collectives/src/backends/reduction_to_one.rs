//! [`ReductionToOneDevice`]: reduce on one device, copy the result to every destination.

use distribute_values::{Leaf, ReduceOp};

use super::{group_backed_ops, group_lifecycle};
use crate::cross_replica::reduce_and_deliver;
use crate::destinations::canonical_device;
use crate::group::{CollectiveGroup, GroupConfig, ReducePlan};
use crate::{CollectiveError, CrossDeviceOps, Destinations};
use distribute_tensor::AnyTensor;

/// Reduces on one device (the configured one, else the first destination), then copies the
/// result to every destination. TF's default for devices without NCCL.
#[derive(Debug)]
pub struct ReductionToOneDevice {
    reduce_device: Option<String>,
    group: CollectiveGroup,
}

impl ReductionToOneDevice {
    /// A backend for `num_replicas` replica threads, reducing on the first destination device.
    pub fn new(num_replicas: usize, config: GroupConfig) -> Result<Self, CollectiveError> {
        let config = GroupConfig {
            plan: ReducePlan::OneReducer,
            ..config
        };
        Ok(ReductionToOneDevice {
            reduce_device: None,
            group: CollectiveGroup::new(num_replicas, config)?,
        })
    }

    /// Always reduces on `device`.
    pub fn with_reduce_device(mut self, device: &str) -> Result<Self, CollectiveError> {
        self.reduce_device = Some(canonical_device(device)?);
        Ok(self)
    }

    /// The device reductions of `values` to `destinations` run on: the configured one, else the
    /// first destination, else the first value's.
    pub fn reduce_device_for<'a>(
        &'a self,
        values: &'a [AnyTensor],
        destinations: &'a Destinations,
    ) -> &'a str {
        self.reduce_device
            .as_deref()
            .or(destinations.as_slice().first().map(String::as_str))
            .or(values.first().map(AnyTensor::device))
            .unwrap_or_default()
    }
}

impl CrossDeviceOps for ReductionToOneDevice {
    fn name(&self) -> &'static str {
        "ReductionToOneDevice"
    }

    fn reduce(
        &self,
        op: ReduceOp,
        values: &[AnyTensor],
        destinations: &Destinations,
    ) -> Result<Leaf<AnyTensor>, CollectiveError> {
        reduce_and_deliver(
            op,
            values,
            destinations,
            Some(self.reduce_device_for(values, destinations)),
        )
    }

    group_backed_ops!();
}

group_lifecycle!(ReductionToOneDevice);
